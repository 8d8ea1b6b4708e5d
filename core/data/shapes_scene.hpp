// The language of the generated image-caption dataset: scenes of one or two coloured
// shapes, their captions, the caption parser and the word-level tokenizer of the closed
// vocabulary. A caption names every attribute the renderer draws, so distinct scenes have
// distinct captions (parse_caption(caption(s)) == s for every scene) and the image is
// determined by its caption up to pixel noise and a small position jitter.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace braid::data {

enum class ShapeKind : std::uint8_t { circle, square, triangle, cross, diamond };
enum class Colour : std::uint8_t { red, green, blue, yellow, purple, cyan, white };
enum class ObjectSize : std::uint8_t { small, large };
// Two objects stand side by side ("left of") or one over the other ("above"); the reverse
// relations would describe the same images twice, so captions always name the left (top)
// object first.
enum class Relation : std::uint8_t { none, left_of, above };

constexpr int kShapeKinds = 5, kColours = 7, kObjectSizes = 2;
constexpr int kGridSide = 3;  // a lone object sits in a cell of a 3 x 3 grid

struct SceneObject {
  ShapeKind shape = ShapeKind::circle;
  Colour colour = Colour::red;
  ObjectSize size = ObjectSize::small;
  int row = 1, col = 1;  // grid cell, 0 = top / left; used by lone objects only (1, 1 in pairs)

  bool operator==(const SceneObject&) const = default;
};

// One object (relation none), or two with a relation.
struct Scene {
  std::vector<SceneObject> objects;
  Relation relation = Relation::none;

  bool operator==(const Scene&) const = default;
};

const char* shape_name(ShapeKind s);
const char* colour_name(Colour c);
const char* size_name(ObjectSize s);
// Nominal RGB of a colour, in [0, 1].
const float* colour_rgb(Colour c);

// Scenes are numbered 0 .. kSceneCount-1: lone objects first, then pairs. The id names a
// scene compactly (held-out split, duplicate detection in a retrieval batch).
constexpr std::int64_t kObjectKinds = kShapeKinds * kColours * kObjectSizes;
constexpr std::int64_t kLoneScenes = kObjectKinds * kGridSide * kGridSide;
constexpr std::int64_t kSceneCount = kLoneScenes + kObjectKinds * kObjectKinds * 2;
std::int64_t scene_id(const Scene& scene);
Scene scene_from_id(std::int64_t id);  // throws Error(invalid_argument) outside [0, kSceneCount)

// "a large red circle at the top left", "a small blue cross left of a large white square".
std::string caption(const Scene& scene);
// The scene a caption describes; throws Error(invalid_argument) naming the word that does
// not fit the grammar.
Scene parse_caption(std::string_view text);

// Word-level tokenizer of the caption vocabulary. Ids 0..3 are the specials.
struct CaptionTokenizer {
  static constexpr std::int32_t kPad = 0, kBos = 1, kEos = 2, kUnk = 3;
  // Longest caption in tokens, <bos> and <eos> included.
  static constexpr int kMaxTokens = 12;

  static std::int32_t vocab_size();
  // The id of a word (kUnk for a word outside the vocabulary).
  static std::int32_t id(std::string_view word);
  // The word of an id ("<pad>", "<bos>", ...); throws Error(invalid_argument) out of range.
  static std::string_view word(std::int32_t id);
  // <bos> + one id per whitespace-separated word + <eos>.
  static std::vector<std::int32_t> encode(std::string_view text);
  // Words joined by single spaces; <pad> and <bos> are skipped, decoding stops at <eos>,
  // unknown words come back as "<unk>".
  static std::string decode(std::span<const std::int32_t> ids);
};

}  // namespace braid::data
