// The generated image-caption dataset the reference models train on, with no download:
// scenes of one or two coloured shapes (core/data/shapes_scene.hpp), rendered into RGB
// images whose side varies per sample like web data (drawn from the run file's image-size
// distribution), with their captions and tokens.
//
// Sample i of a split is a pure function of (seed, split, i): a counter-based generator
// seeded from those, no shared state, so any rank reads any sample in any order and gets
// the same bytes.
//
// Retrieval: the scene space is finite (kSceneCount), so a batch can hold two samples of
// the same scene, whose captions are identical and whose images differ only by noise and
// jitter. Count a retrieval as correct when the retrieved sample has the query's scene_id;
// matching by sample index would penalise a choice nothing can make.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/common/host_buffer.hpp"
#include "core/data/shapes_scene.hpp"
#include "core/spec/run.hpp"

namespace braid::data {

// Train and held-out samples come from disjoint sets of scenes (a hash of the scene id
// picks the held-out ones), so evaluation captions never occur in training.
enum class Split : std::uint8_t { train, heldout };
const char* split_name(Split s);

inline constexpr int kMaxImageSide = 1024;  // the largest side the dataset renders, in pixels

struct ShapesConfig {
  std::uint64_t seed = 0;
  int patch = 4;                     // image sides are multiples of this (the encoder's patch size)
  int min_side = 16, max_side = 64;  // pixels
  // Image sides in the run's unit. Each draw keeps its ratio to the largest side the
  // distribution can draw: side = max_side * drawn / largest, on the patch grid, clamped to
  // [min_side, max_side]. Fixed: every image at the largest side on the grid.
  spec::SizeDistribution sides;
  double pair_fraction = 0.5;     // share of scenes with two objects
  double heldout_fraction = 0.1;  // share of scenes reserved for evaluation, in [0.01, 0.5]
};

// The dataset for a run: its data seed and its image-size distribution, on a `patch` grid.
ShapesConfig shapes_config(const spec::DataSpec& data, int patch, int min_side = 16, int max_side = 64);
// The dataset braid train draws a run's samples from, with `seed`: the run's image sizes on
// its image encoder's patch grid, up to the encoder's largest image. Status::unsupported for
// a model without an image encoder.
ShapesConfig run_shapes_config(const spec::RunSpec& run, std::uint64_t seed);

// Where an object was drawn, in pixels from the top-left corner (for tests and displays).
struct Placement {
  float x = 0, y = 0;     // centre
  float half_extent = 0;  // half the object's width
};

struct Sample {
  std::int64_t index = 0;
  Split split = Split::train;
  Scene scene;
  std::vector<Placement> placements;  // one per scene object
  int side = 0;                       // the image is side x side pixels
  std::vector<float> pixels;          // (3, side, side), row-major RGB in [0, 1]
  std::string caption;
  std::vector<std::int32_t> tokens;  // CaptionTokenizer::encode(caption): <bos> ... <eos>

  // (3, side, side): nn::Tensor(sample.pixel_shape(), sample.pixels) wraps it.
  std::vector<std::int64_t> pixel_shape() const { return {3, side, side}; }
};

class ShapesDataset {
 public:
  // Throws Error(invalid_argument) naming the bad field of `config`.
  explicit ShapesDataset(ShapesConfig config);

  const ShapesConfig& config() const { return config_; }

  // Sample `index` (>= 0) of `split`, rendered.
  Sample get(std::int64_t index, Split split = Split::train) const;
  // The same sample without its image (no placements, no pixels): its scene, side, caption
  // and tokens, for a rank that needs the batch's sizes and captions but not its pixels
  // (a text tower, a later pipeline stage).
  Sample describe(std::int64_t index, Split split = Split::train) const;
  // Its scene and its image side, without rendering (cheap: for grouping or sorting a
  // batch by size before rendering it).
  Scene scene(std::int64_t index, Split split = Split::train) const;
  int side(std::int64_t index, Split split = Split::train) const;
  // The smallest and largest side a sample can have, on the patch grid (fixed: the largest).
  int smallest_side() const;
  int largest_side() const { return config_.max_side / config_.patch * config_.patch; }
  // Whether `scene` belongs to the held-out split.
  bool heldout(const Scene& scene) const;

 private:
  ShapesConfig config_;
  int largest_ = 0;                    // the largest side `config_.sides` can draw, in its unit
  std::vector<std::uint8_t> heldout_;  // by scene id
  // Scene ids of each split: [0] lone objects, [1] pairs.
  std::vector<std::int64_t> train_ids_[2], heldout_ids_[2];
};

// Tokens of a batch, padded with kPad to a common length: ids[b * length + t].
struct TokenBatch {
  std::int64_t batch = 0, length = 0;
  std::vector<std::int32_t> ids;
  std::vector<std::int32_t> lengths;  // tokens of each sample before padding
};
// Pads to the longest sample, or to `length` when it is > 0 (throws Error(invalid_argument)
// when a sample is longer).
TokenBatch pad_tokens(std::span<const Sample> batch, std::int64_t length = 0);

// Samples of a batch with one image side, stacked: pixels (members, 3, side, side).
struct ImageGroup {
  int side = 0;
  std::vector<std::size_t> members;  // positions in the batch, ascending
  HostBuffer pixels;                 // becomes the group's tensor without a copy
};
// One group per distinct side, by ascending side: an encoder runs each group as one
// dense batch, since patch sequences of different lengths do not stack.
std::vector<ImageGroup> group_by_side(std::span<const Sample> batch);
// The groups of the samples batch[picked[k]], their members positions k in `picked` (a share
// of a batch, stacked without copying its samples first). Throws Error(invalid_argument) for a
// position outside the batch.
std::vector<ImageGroup> group_by_side(std::span<const Sample> batch, std::span<const std::size_t> picked);
// The same groups' sides and members without their pixels (described samples will do).
std::vector<ImageGroup> sides_of(std::span<const Sample> batch);

// A text thumbnail of a sample's image, `columns` characters wide (and as many rows): per
// cell the initial of the colour most of its pixels are closest to (r g b y p c w), or '.'
// for background.
std::string ascii_thumbnail(const Sample& sample, int columns = 16);

}  // namespace braid::data
