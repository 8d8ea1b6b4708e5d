#include "core/data/shapes_scene.hpp"

#include <algorithm>
#include <array>

#include "core/common/error.hpp"

namespace braid::data {
namespace {

constexpr std::array<const char*, kShapeKinds> kShapeNames = {"circle", "square", "triangle", "cross", "diamond"};
constexpr std::array<const char*, kColours> kColourNames = {"red",    "green", "blue", "yellow",
                                                            "purple", "cyan",  "white"};
constexpr std::array<const char*, kObjectSizes> kSizeNames = {"small", "large"};
// Saturated and far apart, so that a small model tells them apart at 16 px.
constexpr float kRgb[kColours][3] = {{0.90f, 0.10f, 0.10f}, {0.10f, 0.80f, 0.15f}, {0.15f, 0.25f, 0.95f},
                                     {0.95f, 0.90f, 0.10f}, {0.60f, 0.15f, 0.80f}, {0.10f, 0.85f, 0.90f},
                                     {0.95f, 0.95f, 0.95f}};
// Grid cells by row and column: "at the top left" ... "at the centre" ... "at the bottom right".
constexpr const char* kCellNames[kGridSide][kGridSide] = {
    {"top left", "top", "top right"}, {"left", "centre", "right"}, {"bottom left", "bottom", "bottom right"}};

// The vocabulary: the specials, then every word a caption uses, each once.
constexpr std::array<const char*, 28> kVocabulary = {
    "<pad>",  "<bos>", "<eos>",  "<unk>",  "a",      "at",       "the",   "of",     "above", "left",
    "right",  "top",   "bottom", "centre", "small",  "large",    "red",   "green",  "blue",  "yellow",
    "purple", "cyan",  "white",  "circle", "square", "triangle", "cross", "diamond"};

std::int64_t object_kind(const SceneObject& o) {
  const auto shape = static_cast<int>(o.shape), colour = static_cast<int>(o.colour), size = static_cast<int>(o.size);
  if (shape >= kShapeKinds || colour >= kColours || size >= kObjectSizes)
    throw Error(Status::invalid_argument, "scene object with shape " + std::to_string(shape) + ", colour " +
                                              std::to_string(colour) + ", size " + std::to_string(size) +
                                              ": out of range");
  return (shape * kColours + colour) * kObjectSizes + size;
}

SceneObject object_of_kind(std::int64_t kind) {
  SceneObject o;
  o.size = static_cast<ObjectSize>(kind % kObjectSizes);
  o.colour = static_cast<Colour>(kind / kObjectSizes % kColours);
  o.shape = static_cast<ShapeKind>(kind / kObjectSizes / kColours);
  return o;
}

void check_scene(const Scene& s) {
  const bool lone = s.objects.size() == 1 && s.relation == Relation::none;
  const bool pair = s.objects.size() == 2 && (s.relation == Relation::left_of || s.relation == Relation::above);
  if (!lone && !pair)
    throw Error(Status::invalid_argument, "a scene has one object without a relation or two with one (got " +
                                              std::to_string(s.objects.size()) + " objects, relation " +
                                              std::to_string(static_cast<int>(s.relation)) + ")");
  for (const auto& o : s.objects) {
    object_kind(o);
    const bool centred = o.row == 1 && o.col == 1;
    if (lone ? (o.row < 0 || o.row >= kGridSide || o.col < 0 || o.col >= kGridSide) : !centred)
      throw Error(Status::invalid_argument,
                  "scene object in cell (" + std::to_string(o.row) + ", " + std::to_string(o.col) +
                      "): " + (lone ? "outside the 3 x 3 grid" : "objects of a pair have no cell"));
  }
}

std::string object_words(const SceneObject& o) {
  return std::string("a ") + size_name(o.size) + " " + colour_name(o.colour) + " " + shape_name(o.shape);
}

std::vector<std::string_view> split_words(std::string_view text) {
  std::vector<std::string_view> words;
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  for (std::size_t i = 0; i < text.size();) {
    if (space(text[i])) {
      ++i;
      continue;
    }
    const std::size_t start = i;
    while (i < text.size() && !space(text[i])) ++i;
    words.push_back(text.substr(start, i - start));
  }
  return words;
}

// Reads a caption word by word, naming the offending word on error.
class CaptionReader {
 public:
  explicit CaptionReader(std::string_view text) : text_(text), words_(split_words(text)) {}

  bool done() const { return next_ >= words_.size(); }
  std::string_view peek() const { return done() ? std::string_view() : words_[next_]; }
  std::string_view take(const char* expected) {
    if (done()) fail(std::string("ends where ") + expected + " should follow");
    return words_[next_++];
  }
  void expect(const char* word) {
    if (take(word) != word) fail(std::string("expected '") + word + "'", 1);
  }
  template <std::size_t N>
  int one_of(const std::array<const char*, N>& names, const char* what) {
    const auto w = take(what);
    for (std::size_t i = 0; i < N; ++i)
      if (w == names[i]) return static_cast<int>(i);
    std::string list;
    for (auto n : names) list += (list.empty() ? "" : ", ") + std::string(n);
    fail(std::string("expected ") + what + " (" + list + ")", 1);
  }
  [[noreturn]] void fail(const std::string& what, std::size_t back = 0) const {
    std::string where = done() && back == 0 ? ""
                                            : " at word " + std::to_string(next_ - back + 1) + " '" +
                                                  std::string(words_[next_ - back]) + "'";
    throw Error(Status::invalid_argument, "caption \"" + std::string(text_) + "\"" + where + ": " + what);
  }

 private:
  std::string_view text_;
  std::vector<std::string_view> words_;
  std::size_t next_ = 0;
};

SceneObject read_object(CaptionReader& r) {
  r.expect("a");
  SceneObject o;
  o.size = static_cast<ObjectSize>(r.one_of(kSizeNames, "a size"));
  o.colour = static_cast<Colour>(r.one_of(kColourNames, "a colour"));
  o.shape = static_cast<ShapeKind>(r.one_of(kShapeNames, "a shape"));
  return o;
}

}  // namespace

const char* shape_name(ShapeKind s) { return kShapeNames.at(static_cast<std::size_t>(s)); }
const char* colour_name(Colour c) { return kColourNames.at(static_cast<std::size_t>(c)); }
const char* size_name(ObjectSize s) { return kSizeNames.at(static_cast<std::size_t>(s)); }
const float* colour_rgb(Colour c) { return kRgb[std::min<std::size_t>(static_cast<std::size_t>(c), kColours - 1)]; }

std::int64_t scene_id(const Scene& scene) {
  check_scene(scene);
  const auto& a = scene.objects[0];
  if (scene.relation == Relation::none) return (object_kind(a) * kGridSide + a.row) * kGridSide + a.col;
  const std::int64_t pair = object_kind(a) * kObjectKinds + object_kind(scene.objects[1]);
  return kLoneScenes + pair * 2 + (scene.relation == Relation::above ? 1 : 0);
}

Scene scene_from_id(std::int64_t id) {
  if (id < 0 || id >= kSceneCount)
    throw Error(Status::invalid_argument,
                "scene id " + std::to_string(id) + " outside [0, " + std::to_string(kSceneCount) + ")");
  Scene s;
  if (id < kLoneScenes) {
    SceneObject o = object_of_kind(id / (kGridSide * kGridSide));
    o.row = static_cast<int>(id / kGridSide % kGridSide);
    o.col = static_cast<int>(id % kGridSide);
    s.objects = {o};
    return s;
  }
  const std::int64_t pair = (id - kLoneScenes) / 2;
  s.relation = (id - kLoneScenes) % 2 ? Relation::above : Relation::left_of;
  s.objects = {object_of_kind(pair / kObjectKinds), object_of_kind(pair % kObjectKinds)};
  return s;
}

std::string caption(const Scene& scene) {
  check_scene(scene);
  const auto& a = scene.objects[0];
  if (scene.relation == Relation::none) return object_words(a) + " at the " + kCellNames[a.row][a.col];
  return object_words(a) + (scene.relation == Relation::left_of ? " left of " : " above ") +
         object_words(scene.objects[1]);
}

Scene parse_caption(std::string_view text) {
  CaptionReader r(text);
  Scene s;
  s.objects.push_back(read_object(r));
  if (r.peek() == "at") {
    r.expect("at");
    r.expect("the");
    // A cell is one or two words: a row word (top/bottom), a column word (left/right), or
    // both in that order; "centre" alone is the middle cell.
    auto& o = s.objects[0];
    const auto first = r.take("a position");
    if (first == "centre") {
      o.row = o.col = 1;
    } else if (first == "top" || first == "bottom") {
      o.row = first == "top" ? 0 : 2;
      o.col = 1;
      if (r.peek() == "left" || r.peek() == "right") o.col = r.take("a column") == "left" ? 0 : 2;
    } else if (first == "left" || first == "right") {
      o.row = 1;
      o.col = first == "left" ? 0 : 2;
    } else {
      r.fail("expected a position (top, bottom, left, right, centre)", 1);
    }
  } else {
    const auto rel = r.take("'at', 'left of' or 'above'");
    if (rel == "left") {
      r.expect("of");
      s.relation = Relation::left_of;
    } else if (rel == "above") {
      s.relation = Relation::above;
    } else {
      r.fail("expected 'at', 'left of' or 'above'", 1);
    }
    s.objects.push_back(read_object(r));
  }
  if (!r.done()) {
    r.take("");
    r.fail("unexpected word after the end of the caption", 1);
  }
  return s;
}

std::int32_t CaptionTokenizer::vocab_size() { return static_cast<std::int32_t>(kVocabulary.size()); }

std::int32_t CaptionTokenizer::id(std::string_view word) {
  for (std::size_t i = kUnk + 1; i < kVocabulary.size(); ++i)
    if (word == kVocabulary[i]) return static_cast<std::int32_t>(i);
  return kUnk;
}

std::string_view CaptionTokenizer::word(std::int32_t id) {
  if (id < 0 || id >= vocab_size())
    throw Error(Status::invalid_argument,
                "token id " + std::to_string(id) + " outside the vocabulary [0, " + std::to_string(vocab_size()) + ")");
  return kVocabulary[static_cast<std::size_t>(id)];
}

std::vector<std::int32_t> CaptionTokenizer::encode(std::string_view text) {
  std::vector<std::int32_t> ids{kBos};
  for (auto w : split_words(text)) ids.push_back(id(w));
  ids.push_back(kEos);
  return ids;
}

std::string CaptionTokenizer::decode(std::span<const std::int32_t> ids) {
  std::string text;
  for (auto t : ids) {
    if (t == kEos) break;
    if (t == kPad || t == kBos) continue;
    if (!text.empty()) text += ' ';
    text += word(t);
  }
  return text;
}

}  // namespace braid::data
