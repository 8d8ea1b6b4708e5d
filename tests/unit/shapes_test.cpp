// The generated image-caption dataset: determinism by (seed, split, index) in any access
// order, captions that name their scene exactly (every scene round-trips), the tokenizer,
// pixels that show each object's colour where it stands, image sides that follow the run's
// distribution, a held-out split disjoint from training, and the batching helpers.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <numbers>
#include <set>
#include <thread>

#include "core/data/shapes.hpp"
#include "tests/unit/support.hpp"

namespace braid {
namespace {

using data::CaptionTokenizer;
using data::Sample;
using data::Scene;
using data::ShapesConfig;
using data::ShapesDataset;
using data::Split;

bool same_bytes(const Sample& a, const Sample& b) {
  return a.side == b.side && a.pixels.size() == b.pixels.size() &&
         std::memcmp(a.pixels.data(), b.pixels.data(), a.pixels.size() * sizeof(float)) == 0 && a.tokens == b.tokens &&
         a.caption == b.caption && a.scene == b.scene;
}

ShapesConfig config(std::uint64_t seed) {
  ShapesConfig c;
  c.seed = seed;
  c.patch = 4;
  return c;
}

// The config of the bundled 72B MLLM run: lognormal sides (median 336, sigma 0.5, in
// [224, 896] on a 14 px grid) mapped onto [16, 64] px on a 4 px grid.
ShapesConfig mllm_config() { return data::shapes_config(test::load("mllm-72b-1024gpu.yaml").data, 4); }

// ---- determinism ----------------------------------------------------------------------

TEST(Shapes, SamplesAreDeterministicBySeedSplitAndIndex) {
  const ShapesDataset a(mllm_config()), b(mllm_config());
  for (std::int64_t i : {0, 1, 17, 123456789}) {
    const auto s = a.get(i);
    EXPECT_TRUE(same_bytes(s, b.get(i))) << "index " << i;
    EXPECT_EQ(s.index, i);
    EXPECT_EQ(s.pixel_shape(), (std::vector<std::int64_t>{3, s.side, s.side}));
    EXPECT_EQ(s.pixels.size(), std::size_t(3 * s.side * s.side));
    EXPECT_FALSE(same_bytes(s, a.get(i + 1))) << "index " << i;
    EXPECT_FALSE(same_bytes(s, a.get(i, Split::heldout))) << "index " << i;
  }
  auto other = mllm_config();
  other.seed += 1;
  EXPECT_FALSE(same_bytes(a.get(3), ShapesDataset(other).get(3)));
  test::expect_error([&] { a.get(-1); }, Status::invalid_argument, {"sample index -1 is negative"});
}

TEST(Shapes, SamplesDoNotDependOnAccessOrderOrReaders) {
  const ShapesDataset ds(mllm_config());
  constexpr int kSamples = 64, kRanks = 4;
  std::vector<Sample> forward;
  for (int i = 0; i < kSamples; ++i) forward.push_back(ds.get(i));
  // Backwards, interleaved with the other split, on a second instance.
  const ShapesDataset again(mllm_config());
  for (int i = kSamples - 1; i >= 0; --i) {
    again.get(i, Split::heldout);
    EXPECT_TRUE(same_bytes(forward[std::size_t(i)], again.get(i))) << "index " << i;
  }
  // Four "ranks" on threads, each reading a strided share of the indices.
  std::vector<Sample> by_rank(kSamples);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r)
    ranks.emplace_back([&, r] {
      for (int i = r; i < kSamples; i += kRanks) by_rank[std::size_t(i)] = ds.get(i);
    });
  for (auto& t : ranks) t.join();
  for (int i = 0; i < kSamples; ++i) EXPECT_TRUE(same_bytes(forward[std::size_t(i)], by_rank[std::size_t(i)])) << i;
}

// ---- captions and tokens --------------------------------------------------------------

TEST(Shapes, EveryCaptionParsesBackToItsScene) {
  std::set<std::string> captions;
  for (std::int64_t id = 0; id < data::kSceneCount; ++id) {
    const Scene s = data::scene_from_id(id);
    ASSERT_EQ(data::scene_id(s), id);
    const auto text = data::caption(s);
    ASSERT_EQ(data::parse_caption(text), s) << text;
    captions.insert(text);
  }
  EXPECT_EQ(std::int64_t(captions.size()), data::kSceneCount);  // distinct scenes, distinct captions
  EXPECT_EQ(data::kSceneCount, 630 + 70 * 70 * 2);
  EXPECT_TRUE(captions.count("a large red circle at the top left"));
  EXPECT_TRUE(captions.count("a small blue cross left of a large white square"));
  EXPECT_TRUE(captions.count("a small green diamond above a small green diamond"));
  EXPECT_TRUE(captions.count("a large yellow triangle at the centre"));
  EXPECT_EQ(data::parse_caption("  a large cyan square   at the bottom\n"),
            data::parse_caption("a large cyan square at the bottom"));
}

TEST(Shapes, MalformedCaptionsNameTheWord) {
  using test::expect_error;
  auto parse = [](const char* text) { return [text] { data::parse_caption(text); }; };
  expect_error(parse("a small pink circle at the top"), Status::invalid_argument,
               {"caption \"a small pink circle at the top\"", "word 3 'pink'", "expected a colour (red, green"});
  expect_error(parse("a small red circle at the middle"), Status::invalid_argument,
               {"word 7 'middle'", "expected a position"});
  expect_error(parse("a small red circle"), Status::invalid_argument,
               {"ends where 'at', 'left of' or 'above' should follow"});
  expect_error(parse("a small red circle left of a large blue square please"), Status::invalid_argument,
               {"word 11 'please'", "unexpected word"});
  expect_error(parse("one small red circle at the top"), Status::invalid_argument, {"word 1 'one'", "expected 'a'"});
  expect_error([] { data::caption(Scene{}); }, Status::invalid_argument, {"got 0 objects"});
  expect_error([] { data::scene_from_id(data::kSceneCount); }, Status::invalid_argument, {"scene id 10430 outside"});
}

TEST(Shapes, TokenizerRoundTripsEveryCaption) {
  std::set<std::string> words;
  std::size_t longest = 0;
  for (std::int64_t id = 0; id < data::kSceneCount; ++id) {
    const auto text = data::caption(data::scene_from_id(id));
    const auto ids = CaptionTokenizer::encode(text);
    ASSERT_EQ(ids.front(), CaptionTokenizer::kBos);
    ASSERT_EQ(ids.back(), CaptionTokenizer::kEos);
    ASSERT_EQ(std::count(ids.begin(), ids.end(), CaptionTokenizer::kUnk), 0) << text;
    ASSERT_EQ(CaptionTokenizer::decode(ids), text);
    longest = std::max(longest, ids.size());
    for (std::size_t t = 1; t + 1 < ids.size(); ++t) words.insert(std::string(CaptionTokenizer::word(ids[t])));
  }
  EXPECT_EQ(longest, std::size_t(CaptionTokenizer::kMaxTokens));
  // The vocabulary is exactly the four specials and the words captions use.
  EXPECT_EQ(CaptionTokenizer::vocab_size(), std::int32_t(words.size() + 4));
  EXPECT_EQ(CaptionTokenizer::word(CaptionTokenizer::kPad), "<pad>");
  EXPECT_EQ(CaptionTokenizer::id("<eos>"), CaptionTokenizer::kUnk);  // specials are not words

  const auto ids = CaptionTokenizer::encode("a tiny red circle");
  EXPECT_EQ(ids, (std::vector<std::int32_t>{CaptionTokenizer::kBos, CaptionTokenizer::id("a"), CaptionTokenizer::kUnk,
                                            CaptionTokenizer::id("red"), CaptionTokenizer::id("circle"),
                                            CaptionTokenizer::kEos}));
  EXPECT_EQ(CaptionTokenizer::decode(ids), "a <unk> red circle");
  std::vector<std::int32_t> padded = {CaptionTokenizer::kBos, CaptionTokenizer::id("a"), CaptionTokenizer::kEos,
                                      CaptionTokenizer::id("red"), CaptionTokenizer::kPad};
  EXPECT_EQ(CaptionTokenizer::decode(padded), "a");  // stops at <eos>
  test::expect_error([] { CaptionTokenizer::word(28); }, Status::invalid_argument,
                     {"token id 28 outside the vocabulary [0, 28)"});
}

// ---- pixels ---------------------------------------------------------------------------

// Every channel within the noise of the colour's nominal value.
bool shows(const Sample& s, int x, int y, data::Colour colour) {
  const auto n = std::size_t(s.side * s.side), i = std::size_t(y * s.side + x);
  for (std::size_t c = 0; c < 3; ++c)
    if (std::abs(s.pixels[c * n + i] - data::colour_rgb(colour)[c]) > 0.0501f) return false;
  return true;
}

bool background(const Sample& s, int x, int y) {
  const auto n = std::size_t(s.side * s.side), i = std::size_t(y * s.side + x);
  for (std::size_t c = 0; c < 3; ++c)
    if (s.pixels[c * n + i] > 0.1301f) return false;
  return true;
}

TEST(Shapes, PixelsShowEachObjectInItsColourWhereItStands) {
  const ShapesDataset ds(mllm_config());
  int large = 0, lone = 0, pairs = 0;
  for (std::int64_t i = 0; i < 400; ++i) {
    const auto s = ds.get(i);
    ASSERT_EQ(s.placements.size(), s.scene.objects.size());
    for (float v : s.pixels) ASSERT_TRUE(v >= 0 && v <= 1);
    for (std::size_t k = 0; k < s.placements.size(); ++k) {
      const auto& o = s.scene.objects[k];
      const auto& p = s.placements[k];
      ASSERT_GT(p.x - p.half_extent, 0);
      ASSERT_LT(p.x + p.half_extent, s.side);
      ASSERT_GT(p.y - p.half_extent, 0);
      ASSERT_LT(p.y + p.half_extent, s.side);
      if (o.size == data::ObjectSize::large) {
        ++large;
        EXPECT_TRUE(shows(s, int(p.x), int(p.y), o.colour)) << s.caption << ", sample " << i;
      }
    }
    if (s.scene.relation == data::Relation::none) {
      ++lone;
      // The object's cell as a fraction of the image, and the pixel at the opposite
      // cell's centre (the object's own when it is in the middle) is background.
      const auto& o = s.scene.objects[0];
      EXPECT_EQ(int(s.placements[0].x * 3 / float(s.side)), o.col);
      EXPECT_EQ(int(s.placements[0].y * 3 / float(s.side)), o.row);
      if (o.row != 1 || o.col != 1) {
        EXPECT_TRUE(background(s, (5 - 2 * o.col) * s.side / 6, (5 - 2 * o.row) * s.side / 6)) << s.caption;
      }
    } else {
      ++pairs;
      const auto &a = s.placements[0], &b = s.placements[1];
      const bool left_of = s.scene.relation == data::Relation::left_of;
      const float along = left_of ? b.x - a.x : b.y - a.y, across = left_of ? b.y - a.y : b.x - a.x;
      EXPECT_GT(along, a.half_extent + b.half_extent) << s.caption;  // first object first, apart
      EXPECT_LT(std::abs(across), along) << s.caption;               // never looks like the other relation
      EXPECT_TRUE(background(s, int((a.x + b.x) / 2), int((a.y + b.y) / 2))) << s.caption;  // between them
    }
  }
  EXPECT_GT(large, 200);
  EXPECT_GT(lone, 100);
  EXPECT_GT(pairs, 100);
}

TEST(Shapes, AsciiThumbnailShowsTheObject) {
  const ShapesDataset ds(config(5));
  int checked = 0;
  for (std::int64_t i = 0; i < 200 && checked < 20; ++i) {
    const auto s = ds.get(i);
    if (s.scene.relation != data::Relation::none || s.scene.objects[0].size != data::ObjectSize::large) continue;
    ++checked;
    const auto art = data::ascii_thumbnail(s, 16);
    ASSERT_EQ(art.size(), std::size_t(16 * 17));
    const char initial = data::colour_name(s.scene.objects[0].colour)[0];
    const auto& p = s.placements[0];
    EXPECT_EQ(art[std::size_t(int(p.y * 16 / float(s.side)) * 17 + int(p.x * 16 / float(s.side)))], initial)
        << s.caption << "\n"
        << art;
    for (char ch : art) EXPECT_TRUE(ch == '.' || ch == '\n' || ch == initial) << s.caption << "\n" << art;
  }
  EXPECT_EQ(checked, 20);
}

// ---- sizes ----------------------------------------------------------------------------

TEST(Shapes, SidesFollowTheRunsLognormalDistribution) {
  const auto c = mllm_config();
  ASSERT_EQ(c.sides.kind, spec::SizeKind::lognormal);
  ASSERT_EQ(c.seed, 7u);
  const ShapesDataset ds(c);
  // The expected side: E over z ~ N(0, 1) of the run's draw (median * e^(sigma z) on its
  // 14 px grid within [224, 896]) scaled by 64 / 896 onto the 4 px grid within [16, 64].
  auto mapped = [&](double z) {
    const double drawn = std::clamp(std::round(c.sides.median * std::exp(c.sides.sigma * z) / 14), 16.0, 64.0) * 14;
    return std::clamp(std::round(64 * drawn / 896 / 4), 4.0, 16.0) * 4;
  };
  double expected = 0, p16 = 0;  // the mean side, the share of 16 px sides
  const int steps = 40000;
  for (int k = 0; k <= steps; ++k) {
    const double z = -8 + 16.0 * k / steps, w = (k == 0 || k == steps) ? 0.5 : 1;
    const double mass = w * std::exp(-z * z / 2) / std::sqrt(2 * std::numbers::pi) * 16.0 / steps;
    expected += mapped(z) * mass;
    p16 += mapped(z) == 16 ? mass : 0;
  }
  constexpr int kSamples = 4000;
  double sum = 0, sum2 = 0;
  std::map<int, int> counts;
  std::vector<int> sides;
  for (int i = 0; i < kSamples; ++i) {
    const int side = ds.side(i);
    sides.push_back(side);
    ASSERT_EQ(side % 4, 0);
    ASSERT_GE(side, 16);
    ASSERT_LE(side, 64);
    sum += side;
    sum2 += double(side) * side;
    ++counts[side];
  }
  const double mean = sum / kSamples, sd = std::sqrt(sum2 / kSamples - mean * mean);
  EXPECT_NEAR(mean, expected, 4 * sd / std::sqrt(double(kSamples))) << "sd " << sd;
  EXPECT_GT(sd, 3);  // skewed, not fixed
  // The median draw, 336 px, maps to 24 px; the clamp at 224 px piles a quarter of the
  // draws onto 16 px, and a tail reaches the largest sides.
  std::nth_element(sides.begin(), sides.begin() + kSamples / 2, sides.end());
  EXPECT_EQ(sides[kSamples / 2], 24);
  EXPECT_NEAR(p16, 0.264, 0.001);
  EXPECT_NEAR(counts[16], p16 * kSamples, 5 * std::sqrt(kSamples * p16 * (1 - p16)));
  EXPECT_GT(counts[64] + counts[60] + counts[56], 0);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(ds.get(i).side, ds.side(i));
}

TEST(Shapes, SidesFollowAHistogramAndFixedSizes) {
  auto c = config(9);
  c.patch = 8;
  c.sides.kind = spec::SizeKind::histogram;
  c.sides.values = {224, 448, 896};
  c.sides.weights = {0.5, 0.3, 0.2};
  c.sides.step = 14;
  const ShapesDataset ds(c);
  constexpr int kSamples = 6000;
  std::map<int, int> counts;
  for (int i = 0; i < kSamples; ++i) ++counts[ds.side(i)];
  ASSERT_EQ(counts.size(), 3u);
  const std::map<int, double> expected = {{16, 0.5}, {32, 0.3}, {64, 0.2}};
  for (const auto& [side, p] : expected) {
    const double sd = std::sqrt(kSamples * p * (1 - p));
    EXPECT_NEAR(counts[side], kSamples * p, 5 * sd) << "side " << side;
  }
  c.sides = {};  // fixed: every image at the largest side on the grid
  c.max_side = 60;
  const ShapesDataset fixed(c);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(fixed.side(i), 56);
}

// ---- splits ---------------------------------------------------------------------------

TEST(Shapes, HeldOutScenesNeverOccurInTraining) {
  const ShapesDataset ds(mllm_config());
  int held_lone = 0, held_pairs = 0;
  for (std::int64_t id = 0; id < data::kSceneCount; ++id)
    if (ds.heldout(data::scene_from_id(id))) ++(id < data::kLoneScenes ? held_lone : held_pairs);
  EXPECT_EQ(held_lone, 63);    // 10% of 630
  EXPECT_EQ(held_pairs, 980);  // 10% of 9800
  std::set<std::int64_t> train, heldout;
  for (std::int64_t i = 0; i < 3000; ++i) {
    const auto t = ds.scene(i, Split::train), h = ds.scene(i, Split::heldout);
    ASSERT_FALSE(ds.heldout(t)) << data::caption(t);
    ASSERT_TRUE(ds.heldout(h)) << data::caption(h);
    train.insert(data::scene_id(t));
    heldout.insert(data::scene_id(h));
  }
  std::vector<std::int64_t> both;
  std::set_intersection(train.begin(), train.end(), heldout.begin(), heldout.end(), std::back_inserter(both));
  EXPECT_TRUE(both.empty());
  EXPECT_GT(heldout.size(), 500u);  // the held-out split covers many scenes
  EXPECT_EQ(ds.get(4, Split::heldout).split, Split::heldout);
  // Another seed holds out other scenes.
  auto other = mllm_config();
  other.seed = 8;
  const ShapesDataset ds2(other);
  int differ = 0;
  for (std::int64_t id = 0; id < data::kSceneCount; ++id)
    differ += ds.heldout(data::scene_from_id(id)) != ds2.heldout(data::scene_from_id(id));
  EXPECT_GT(differ, 500);
}

// ---- batching and configuration -------------------------------------------------------

TEST(Shapes, BatchesPadTokensAndGroupBySide) {
  const ShapesDataset ds(mllm_config());
  std::vector<Sample> batch;
  for (int i = 0; i < 24; ++i) batch.push_back(ds.get(i));
  const auto tokens = data::pad_tokens(batch);
  std::size_t longest = 0;
  for (const auto& s : batch) longest = std::max(longest, s.tokens.size());
  ASSERT_EQ(tokens.batch, 24);
  ASSERT_EQ(tokens.length, std::int64_t(longest));
  for (std::size_t b = 0; b < batch.size(); ++b) {
    const auto row = tokens.ids.begin() + std::ptrdiff_t(b) * tokens.length;
    EXPECT_EQ(tokens.lengths[b], std::int32_t(batch[b].tokens.size()));
    EXPECT_TRUE(std::equal(batch[b].tokens.begin(), batch[b].tokens.end(), row));
    EXPECT_TRUE(std::all_of(row + tokens.lengths[b], row + tokens.length,
                            [](std::int32_t t) { return t == CaptionTokenizer::kPad; }));
  }
  EXPECT_EQ(data::pad_tokens(batch, CaptionTokenizer::kMaxTokens).length, CaptionTokenizer::kMaxTokens);
  test::expect_error([&] { data::pad_tokens(batch, 5); }, Status::invalid_argument, {"does not fit length 5"});

  const auto groups = data::group_by_side(batch);
  ASSERT_GT(groups.size(), 1u);
  std::size_t members = 0;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (g > 0) {
      EXPECT_LT(groups[g - 1].side, groups[g].side);
    }
    const auto per = std::size_t(3 * groups[g].side * groups[g].side);
    ASSERT_EQ(groups[g].pixels.size(), groups[g].members.size() * per);
    EXPECT_TRUE(std::is_sorted(groups[g].members.begin(), groups[g].members.end()));
    for (std::size_t m = 0; m < groups[g].members.size(); ++m) {
      const auto& s = batch[groups[g].members[m]];
      EXPECT_EQ(s.side, groups[g].side);
      EXPECT_TRUE(std::equal(s.pixels.begin(), s.pixels.end(), groups[g].pixels.begin() + std::ptrdiff_t(m * per)));
    }
    members += groups[g].members.size();
  }
  EXPECT_EQ(members, batch.size());

  // Described samples (no pixels) group the same way; rendered ones without pixels do not.
  std::vector<Sample> described;
  for (int i = 0; i < 24; ++i) described.push_back(ds.describe(i));
  const auto sides = data::sides_of(described);
  ASSERT_EQ(sides.size(), groups.size());
  for (std::size_t g = 0; g < groups.size(); ++g) {
    EXPECT_EQ(sides[g].side, groups[g].side);
    EXPECT_EQ(sides[g].members, groups[g].members);
    EXPECT_TRUE(sides[g].pixels.empty());
  }
  test::expect_error([&] { data::group_by_side(described); }, Status::invalid_argument, {"pixel values for side"});

  // A share of the batch picked by position groups as the same samples copied out would.
  const std::vector<std::size_t> picked = {17, 3, 8, 3, 20, 11};
  std::vector<Sample> copied;
  for (std::size_t i : picked) copied.push_back(batch[i]);
  const auto share = data::group_by_side(batch, picked), want = data::group_by_side(copied);
  ASSERT_EQ(share.size(), want.size());
  for (std::size_t g = 0; g < share.size(); ++g) {
    EXPECT_EQ(share[g].side, want[g].side);
    EXPECT_EQ(share[g].members, want[g].members);
    EXPECT_TRUE(share[g].pixels == want[g].pixels);
  }
  const std::vector<std::size_t> outside = {2, 24};
  test::expect_error([&] { data::group_by_side(batch, outside); }, Status::invalid_argument,
                     {"position 24 of a batch of 24 samples"});
}

TEST(Shapes, DescribedSamplesAreTheRenderedOnesWithoutTheImage) {
  const ShapesDataset ds(mllm_config());
  for (const auto split : {data::Split::train, data::Split::heldout}) {
    for (std::int64_t i : {0, 1, 17, 4095}) {
      const Sample rendered = ds.get(i, split), described = ds.describe(i, split);
      EXPECT_EQ(described.index, rendered.index);
      EXPECT_EQ(described.split, rendered.split);
      EXPECT_EQ(data::scene_id(described.scene), data::scene_id(rendered.scene));
      EXPECT_EQ(described.side, rendered.side);
      EXPECT_EQ(described.caption, rendered.caption);
      EXPECT_EQ(described.tokens, rendered.tokens);
      EXPECT_TRUE(described.pixels.empty());
      EXPECT_TRUE(described.placements.empty());
      EXPECT_EQ(rendered.pixels.size(), std::size_t(3 * rendered.side * rendered.side));
    }
  }
}

TEST(Shapes, RejectsBadConfigurations) {
  using test::expect_error;
  auto make = [](auto edit) {
    return [edit] {
      auto c = config(1);
      edit(c);
      ShapesDataset ds(c);
    };
  };
  expect_error(make([](ShapesConfig& c) { c.patch = 0; }), Status::invalid_argument,
               {"shapes dataset: patch 0 must be >= 1"});
  expect_error(make([](ShapesConfig& c) { c.patch = 8, c.min_side = 17, c.max_side = 23; }), Status::invalid_argument,
               {"no multiple of the patch 8 in [17, 23]"});
  // min_side + patch - 1 overflowed here, and the dataset drew images of 0 px.
  expect_error(make([](ShapesConfig& c) { c.patch = std::numeric_limits<int>::max(); }), Status::invalid_argument,
               {"no multiple of the patch 2147483647 in [16, 64]"});
  expect_error(make([](ShapesConfig& c) { c.heldout_fraction = 0.9; }), Status::invalid_argument,
               {"heldout_fraction 0.9", "outside [0.01, 0.5]"});
  expect_error(make([](ShapesConfig& c) {
                 c.sides.kind = spec::SizeKind::histogram;
                 c.sides.values = {224};
               }),
               Status::invalid_argument, {"as many weights as values"});
}

}  // namespace
}  // namespace braid
