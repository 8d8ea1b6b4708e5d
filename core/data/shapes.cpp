#include "core/data/shapes.hpp"

#include <algorithm>
#include <cmath>

#include "core/common/error.hpp"
#include "core/data/dataset.hpp"
#include "core/data/shapes_scene.hpp"

namespace braid::data {
namespace {

// SplitMix64: a counter-based stream. Each sample seeds its own streams from (seed,
// split, index), so no draw depends on another sample's.
std::uint64_t finalise(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

class Stream {
 public:
  explicit Stream(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() { return finalise(state_ += 0x9e3779b97f4a7c15ULL); }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  double between(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  std::size_t below(std::size_t n) { return std::min(n - 1, static_cast<std::size_t>(uniform() * double(n))); }

 private:
  std::uint64_t state_;
};

// The streams of one sample: the scene, its placement on the image, the pixel noise. The
// side comes from SizeSampler (the run's distributions) with its own stream number.
enum StreamTag : std::uint64_t { kSceneStream = 1, kLayoutStream = 2, kNoiseStream = 3 };
constexpr int kSideStream = 16;  // SizeSampler streams 0-3 are the run's modalities

std::uint64_t sample_key(std::uint64_t seed, Split split, std::int64_t index) {
  const auto s = static_cast<std::uint64_t>(split) + 1;
  return finalise(finalise(finalise(seed) ^ s) ^ static_cast<std::uint64_t>(index));
}

// Layout, in units of the image side: lone objects sit at the centre of their grid cell,
// pairs at a quarter and three quarters of the image along their relation's axis. The
// jitter keeps every object inside the image and a pair's objects apart, and never makes
// "left of" look like "above".
constexpr double kLargeExtent = 0.13, kSmallExtent = 0.08;  // half-widths
constexpr double kCellJitter = 0.025, kAlongJitter = 0.03, kAcrossJitter = 0.08;
constexpr float kBackground = 0.08f, kNoise = 0.05f;  // background level; noise in [-kNoise, kNoise]

bool inside(ShapeKind shape, double u, double v) {  // (u, v): offset from the centre / half-extent, v down
  switch (shape) {
    case ShapeKind::circle:
      return u * u + v * v <= 1;
    case ShapeKind::square:
      return std::abs(u) <= 0.85 && std::abs(v) <= 0.85;
    case ShapeKind::triangle:  // apex up: (0, -1), (-1, 0.8), (1, 0.8)
      return v <= 0.8 && std::abs(u) <= (v + 1) / 1.8;
    case ShapeKind::cross:
      return (std::abs(u) <= 0.34 && std::abs(v) <= 1) || (std::abs(v) <= 0.34 && std::abs(u) <= 1);
    case ShapeKind::diamond:
      return std::abs(u) + std::abs(v) <= 1;
  }
  return false;
}

std::vector<Placement> place(const Scene& scene, int side, Stream& r) {
  const double w = side;
  std::vector<Placement> out;
  for (std::size_t k = 0; k < scene.objects.size(); ++k) {
    const auto& o = scene.objects[k];
    Placement p;
    p.half_extent = static_cast<float>((o.size == ObjectSize::large ? kLargeExtent : kSmallExtent) * w);
    if (scene.relation == Relation::none) {
      p.x = static_cast<float>(((o.col + 0.5) / kGridSide + r.between(-kCellJitter, kCellJitter)) * w);
      p.y = static_cast<float>(((o.row + 0.5) / kGridSide + r.between(-kCellJitter, kCellJitter)) * w);
    } else {
      const double along = (k == 0 ? 0.25 : 0.75) + r.between(-kAlongJitter, kAlongJitter);
      const double across = 0.5 + r.between(-kAcrossJitter, kAcrossJitter);
      const bool horizontal = scene.relation == Relation::left_of;
      p.x = static_cast<float>((horizontal ? along : across) * w);
      p.y = static_cast<float>((horizontal ? across : along) * w);
    }
    out.push_back(p);
  }
  return out;
}

std::vector<float> render(const Scene& scene, const std::vector<Placement>& placements, int side, Stream& noise) {
  const auto n = static_cast<std::size_t>(side) * static_cast<std::size_t>(side);
  // Which colour covers each pixel (0: background, c + 1: colour c), then colour + noise.
  std::vector<std::uint8_t> paint(n, 0);
  for (std::size_t k = 0; k < scene.objects.size(); ++k) {
    const auto& o = scene.objects[k];
    const auto& p = placements[k];
    const int x0 = std::max(0, static_cast<int>(std::floor(p.x - p.half_extent)));
    const int x1 = std::min(side - 1, static_cast<int>(std::ceil(p.x + p.half_extent)));
    const int y0 = std::max(0, static_cast<int>(std::floor(p.y - p.half_extent)));
    const int y1 = std::min(side - 1, static_cast<int>(std::ceil(p.y + p.half_extent)));
    for (int y = y0; y <= y1; ++y)
      for (int x = x0; x <= x1; ++x)
        if (inside(o.shape, (x + 0.5 - p.x) / p.half_extent, (y + 0.5 - p.y) / p.half_extent))
          paint[static_cast<std::size_t>(y) * static_cast<std::size_t>(side) + static_cast<std::size_t>(x)] =
              static_cast<std::uint8_t>(static_cast<int>(o.colour) + 1);
  }
  std::vector<float> pixels(3 * n);
  constexpr float kScale = 2 * kNoise / float(1 << 21);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint64_t bits = noise.next();  // 21 bits of noise per channel
    for (std::size_t c = 0; c < 3; ++c, bits >>= 21) {
      const float base = paint[i] ? colour_rgb(static_cast<Colour>(paint[i] - 1))[c] : kBackground;
      const float v = base + static_cast<float>(bits & 0x1fffff) * kScale - kNoise;
      pixels[c * n + i] = std::clamp(v, 0.0f, 1.0f);
    }
  }
  return pixels;
}

void check(bool ok, const std::string& what) {
  if (!ok) throw Error(Status::invalid_argument, "shapes dataset: " + what);
}

void check_sides(const spec::SizeDistribution& d) {
  switch (d.kind) {
    case spec::SizeKind::fixed:
      return;
    case spec::SizeKind::lognormal:
      check(d.step >= 1, "sides.step " + std::to_string(d.step) + " must be >= 1");
      check(d.median > 0 && d.sigma >= 0, "sides: a lognormal needs median > 0 and sigma >= 0");
      check(d.min > 0 && d.max / d.step * d.step >= std::max(d.min, d.step),
            "sides: no multiple of " + std::to_string(d.step) + " in [" + std::to_string(d.min) + ", " +
                std::to_string(d.max) + "]");
      return;
    case spec::SizeKind::histogram: {
      check(!d.values.empty() && d.values.size() == d.weights.size(),
            "sides: a histogram needs as many weights as values, at least one");
      double sum = 0;
      for (std::size_t i = 0; i < d.values.size(); ++i) {
        check(d.values[i] > 0 && d.weights[i] >= 0,
              "sides: histogram value " + std::to_string(d.values[i]) + " with weight " + std::to_string(d.weights[i]));
        sum += d.weights[i];
      }
      check(sum > 0, "sides: the histogram weights sum to 0");
      return;
    }
  }
  check(false, "sides: unknown distribution kind " + std::to_string(static_cast<int>(d.kind)));
}

}  // namespace

const char* split_name(Split s) { return s == Split::train ? "train" : "heldout"; }

ShapesConfig shapes_config(const spec::DataSpec& data, int patch, int min_side, int max_side) {
  ShapesConfig c;
  c.seed = data.seed;
  c.patch = patch;
  c.min_side = min_side;
  c.max_side = max_side;
  c.sides = data.image_resolution > 0 ? data.image : spec::SizeDistribution{};
  return c;
}

namespace {

// The captions' tokens fit the text tables of the modules that read them: every id below the
// vocabulary, every sequence within the position table (the llm's after the largest image's
// tokens, one per patch). Said when the run is set up, naming the module and the field, not
// from inside an op of the first step that draws a long caption.
void check_caption_tables(const spec::RunSpec& run, const spec::ModuleSpec& image_encoder) {
  const int ids = CaptionTokenizer::vocab_size(), longest = CaptionTokenizer::kMaxTokens;
  const long long grid = image_encoder.max_image_size / image_encoder.patch_size;
  for (const auto& m : run.model.modules) {
    const bool text = m.role == spec::Role::encoder && m.modality == spec::Modality::text;
    if (!text && m.role != spec::Role::llm) continue;
    const std::string field = "model " + run.model.name + " (" + run.model.source + "): module '" + m.name + "' ";
    if (m.vocab < ids)
      throw Error(Status::unsupported, field + "has vocab " + std::to_string(m.vocab) +
                                           "; braid train's captions use " + std::to_string(ids) + " token ids");
    const long long needed = text ? longest : grid * grid + longest;
    if (m.max_positions < needed)
      throw Error(Status::unsupported,
                  field + "has max_positions " + std::to_string(m.max_positions) + "; braid train's " +
                      (text ? "captions run to " + std::to_string(longest) + " tokens"
                            : "sequences run to " + std::to_string(needed) + " (" + std::to_string(grid * grid) +
                                  " tokens of a " + std::to_string(image_encoder.max_image_size) + " px image, " +
                                  std::to_string(longest) + " of a caption)"));
  }
}

}  // namespace

ShapesConfig run_shapes_config(const spec::RunSpec& run, std::uint64_t seed) {
  const spec::ModuleSpec* encoder = nullptr;
  for (const auto& m : run.model.modules)
    if (!encoder && m.role == spec::Role::encoder && m.modality == spec::Modality::image) encoder = &m;
  if (!encoder)
    throw Error(Status::unsupported, "model " + run.model.name + ": the trainer's dataset needs an image encoder");
  if (encoder->max_image_size <= 0)
    throw Error(Status::unsupported, "model " + run.model.name +
                                         ": braid train draws images up to the image encoder's " +
                                         "max_image_size, which '" + encoder->name +
                                         "' does not set (braid's reference runs do: configs/runs/tiny-*.yaml)");
  const std::string field =
      "model " + run.model.name + " (" + run.model.source + "): image encoder '" + encoder->name + "' ";
  if (encoder->max_image_size > kMaxImageSide)
    throw Error(Status::unsupported, field + "has max_image_size " + std::to_string(encoder->max_image_size) +
                                         "; braid train's generated images are at most " +
                                         std::to_string(kMaxImageSide) + " px a side");
  spec::DataSpec data = run.data;
  data.seed = seed;
  // The smallest side drawn, in pixels. A lognormal's draws are scaled so that its largest
  // maps to max_image_size, its min with them (the run file's unit need not be pixels: a
  // distribution of 224-896 maps onto 8-32 px). A fixed distribution draws the largest only.
  const spec::SizeDistribution& sides = data.image;
  int drawn_min = sides.kind == spec::SizeKind::fixed ? encoder->max_image_size : sides.min;
  if (sides.kind == spec::SizeKind::lognormal) {
    const int largest = sides.step > 0 ? sides.max / sides.step * sides.step : sides.max;
    if (largest > 0)
      drawn_min = static_cast<int>(static_cast<long long>(encoder->max_image_size) * sides.min / largest);
  }
  const int min_side = std::max(encoder->patch_size, drawn_min);
  if (min_side > encoder->max_image_size)
    throw Error(Status::unsupported, field + "has max_image_size " + std::to_string(encoder->max_image_size) +
                                         ", below its patch size " + std::to_string(encoder->patch_size));
  check_caption_tables(run, *encoder);
  return shapes_config(data, encoder->patch_size, std::max(8, min_side), encoder->max_image_size);
}

int ShapesDataset::smallest_side() const {
  if (config_.sides.kind == spec::SizeKind::fixed) return largest_side();
  return ((config_.min_side - 1) / config_.patch + 1) * config_.patch;
}

ShapesDataset::ShapesDataset(ShapesConfig config) : config_(std::move(config)) {
  const auto& c = config_;
  check(c.patch >= 1, "patch " + std::to_string(c.patch) + " must be >= 1");
  check(c.min_side >= 8 && c.min_side <= c.max_side && c.max_side <= kMaxImageSide,
        "sides [" + std::to_string(c.min_side) + ", " + std::to_string(c.max_side) +
            "] must satisfy 8 <= min_side <= max_side <= " + std::to_string(kMaxImageSide));
  check((c.min_side - 1) / c.patch + 1 <= c.max_side / c.patch,  // no overflow at a patch near INT_MAX
        "no multiple of the patch " + std::to_string(c.patch) + " in [" + std::to_string(c.min_side) + ", " +
            std::to_string(c.max_side) + "]");
  check(c.pair_fraction >= 0 && c.pair_fraction <= 1,
        "pair_fraction " + std::to_string(c.pair_fraction) + " outside [0, 1]");
  check(c.heldout_fraction >= 0.01 && c.heldout_fraction <= 0.5,
        "heldout_fraction " + std::to_string(c.heldout_fraction) + " outside [0.01, 0.5]");
  check_sides(c.sides);
  if (c.sides.kind == spec::SizeKind::lognormal) largest_ = c.sides.max / c.sides.step * c.sides.step;
  if (c.sides.kind == spec::SizeKind::histogram)
    largest_ = *std::max_element(c.sides.values.begin(), c.sides.values.end());

  // Held out: the given share of lone scenes and of pair scenes, those whose hash (by the
  // seed) is smallest. Exact shares, so neither split ever lacks either kind of scene.
  heldout_.assign(static_cast<std::size_t>(kSceneCount), 0);
  const std::uint64_t salt = finalise(c.seed ^ 0x68656c646f7574ULL);
  for (const auto& [first, count] :
       {std::pair{std::int64_t{0}, kLoneScenes}, std::pair{kLoneScenes, kSceneCount - kLoneScenes}}) {
    std::vector<std::pair<std::uint64_t, std::int64_t>> ranked;
    for (std::int64_t id = first; id < first + count; ++id)
      ranked.emplace_back(finalise(salt ^ static_cast<std::uint64_t>(id)), id);
    std::sort(ranked.begin(), ranked.end());
    const auto held = std::max<std::int64_t>(1, std::llround(c.heldout_fraction * static_cast<double>(count)));
    for (std::int64_t k = 0; k < count; ++k) {
      const auto id = ranked[static_cast<std::size_t>(k)].second;
      heldout_[static_cast<std::size_t>(id)] = k < held;
      (k < held ? heldout_ids_ : train_ids_)[first == 0 ? 0 : 1].push_back(id);
    }
  }
}

bool ShapesDataset::heldout(const Scene& scene) const { return heldout_[static_cast<std::size_t>(scene_id(scene))]; }

Scene ShapesDataset::scene(std::int64_t index, Split split) const {
  check(index >= 0, "sample index " + std::to_string(index) + " is negative");
  Stream r(finalise(sample_key(config_.seed, split, index) ^ kSceneStream));
  const auto& ids = split == Split::train ? train_ids_ : heldout_ids_;
  const bool pair = r.uniform() < config_.pair_fraction;
  const auto& pool = ids[pair ? 1 : 0];
  return scene_from_id(pool[r.below(pool.size())]);
}

int ShapesDataset::side(std::int64_t index, Split split) const {
  check(index >= 0, "sample index " + std::to_string(index) + " is negative");
  const auto& c = config_;
  const int lo = (c.min_side + c.patch - 1) / c.patch, hi = c.max_side / c.patch;  // in patches
  if (c.sides.kind == spec::SizeKind::fixed) return hi * c.patch;
  SizeSampler sampler(c.sides, largest_, c.seed, index, kSideStream + static_cast<int>(split));
  const double patches = static_cast<double>(c.max_side) * sampler.next() / largest_ / c.patch;
  return static_cast<int>(std::clamp<long long>(std::llround(patches), lo, hi)) * c.patch;
}

Sample ShapesDataset::describe(std::int64_t index, Split split) const {
  Sample s;
  s.index = index;
  s.split = split;
  s.scene = scene(index, split);
  s.side = side(index, split);
  s.caption = caption(s.scene);
  s.tokens = CaptionTokenizer::encode(s.caption);
  return s;
}

Sample ShapesDataset::get(std::int64_t index, Split split) const {
  Sample s = describe(index, split);
  const std::uint64_t key = sample_key(config_.seed, split, index);
  Stream layout(finalise(key ^ kLayoutStream)), noise(finalise(key ^ kNoiseStream));
  s.placements = place(s.scene, s.side, layout);
  s.pixels = render(s.scene, s.placements, s.side, noise);
  return s;
}

TokenBatch pad_tokens(std::span<const Sample> batch, std::int64_t length) {
  TokenBatch t;
  t.batch = static_cast<std::int64_t>(batch.size());
  std::int64_t longest = 0;
  for (const auto& s : batch) longest = std::max(longest, static_cast<std::int64_t>(s.tokens.size()));
  if (length > 0 && longest > length)
    throw Error(Status::invalid_argument, "pad_tokens: a caption of " + std::to_string(longest) +
                                              " tokens does not fit length " + std::to_string(length));
  t.length = length > 0 ? length : longest;
  t.ids.assign(static_cast<std::size_t>(t.batch * t.length), CaptionTokenizer::kPad);
  for (std::size_t b = 0; b < batch.size(); ++b) {
    std::copy(batch[b].tokens.begin(), batch[b].tokens.end(),
              t.ids.begin() + static_cast<std::ptrdiff_t>(b * static_cast<std::size_t>(t.length)));
    t.lengths.push_back(static_cast<std::int32_t>(batch[b].tokens.size()));
  }
  return t;
}

namespace {

// Groups positions 0 .. count - 1 by the side `side_of` gives each, by ascending side.
template <class SideOf>
std::vector<ImageGroup> groups_by(std::size_t count, const SideOf& side_of) {
  std::vector<ImageGroup> groups;
  std::vector<std::size_t> order(count);
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) { return side_of(a) < side_of(b); });
  for (auto i : order) {
    if (groups.empty() || groups.back().side != side_of(i)) groups.push_back(ImageGroup{side_of(i), {}, {}});
    groups.back().members.push_back(i);
  }
  return groups;
}

}  // namespace

std::vector<ImageGroup> sides_of(std::span<const Sample> batch) {
  return groups_by(batch.size(), [&](std::size_t i) { return batch[i].side; });
}

std::vector<ImageGroup> group_by_side(std::span<const Sample> batch) {
  std::vector<std::size_t> all(batch.size());
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
  return group_by_side(batch, all);
}

std::vector<ImageGroup> group_by_side(std::span<const Sample> batch, std::span<const std::size_t> picked) {
  for (std::size_t i : picked)
    if (i >= batch.size())
      throw Error(Status::invalid_argument, "group_by_side: position " + std::to_string(i) + " of a batch of " +
                                                std::to_string(batch.size()) + " samples");
  std::vector<ImageGroup> groups = groups_by(picked.size(), [&](std::size_t k) { return batch[picked[k]].side; });
  for (auto& g : groups) {
    g.pixels.reserve(g.members.size() * 3 * static_cast<std::size_t>(g.side) * static_cast<std::size_t>(g.side));
    for (std::size_t k : g.members) {
      const auto& s = batch[picked[k]];
      if (s.pixels.size() != 3 * static_cast<std::size_t>(s.side) * static_cast<std::size_t>(s.side))
        throw Error(Status::invalid_argument, "group_by_side: sample " + std::to_string(s.index) + " has " +
                                                  std::to_string(s.pixels.size()) + " pixel values for side " +
                                                  std::to_string(s.side));
      g.pixels.insert(g.pixels.end(), s.pixels.begin(), s.pixels.end());
    }
  }
  return groups;
}

std::string ascii_thumbnail(const Sample& sample, int columns) {
  static constexpr char kInitials[] = ".rgbypcw";  // background, then the colours in order
  const int side = sample.side;
  if (columns < 1 || side < 1 || sample.pixels.size() != 3 * static_cast<std::size_t>(side * side))
    throw Error(Status::invalid_argument, "ascii_thumbnail: " + std::to_string(columns) + " columns of a side-" +
                                              std::to_string(side) + " image with " +
                                              std::to_string(sample.pixels.size()) + " values");
  const auto n = static_cast<std::size_t>(side) * static_cast<std::size_t>(side);
  auto nearest = [&](std::size_t i) {  // 0: background, c + 1: colour c
    auto distance = [&](const float* rgb) {
      float d = 0;
      for (std::size_t k = 0; k < 3; ++k)
        d += (sample.pixels[k * n + i] - rgb[k]) * (sample.pixels[k * n + i] - rgb[k]);
      return d;
    };
    const float background[3] = {kBackground, kBackground, kBackground};
    int best = 0;
    float best_d = distance(background);
    for (int c = 0; c < kColours; ++c)
      if (const float d = distance(colour_rgb(static_cast<Colour>(c))); d < best_d) best = c + 1, best_d = d;
    return best;
  };
  std::string out;
  for (int row = 0; row < columns; ++row) {
    const int y0 = row * side / columns, y1 = std::max(y0 + 1, (row + 1) * side / columns);
    for (int col = 0; col < columns; ++col) {
      const int x0 = col * side / columns, x1 = std::max(x0 + 1, (col + 1) * side / columns);
      int votes[kColours + 1] = {};
      for (int y = y0; y < y1; ++y)
        for (int x = x0; x < x1; ++x) ++votes[nearest(static_cast<std::size_t>(y * side + x))];
      // A colour shows when it covers a quarter of the cell, so small objects stay visible.
      const int cell = (y1 - y0) * (x1 - x0);
      int shown = 0, most = 0;
      for (int c = 1; c <= kColours; ++c)
        if (votes[c] > most) shown = c, most = votes[c];
      if (4 * most < cell) shown = 0;
      out += kInitials[shown];
    }
    out += '\n';
  }
  return out;
}

}  // namespace braid::data
