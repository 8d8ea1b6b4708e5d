// The data side of the trainer (core/train): which samples each data-parallel replica takes
// (loader), the model inputs built from them (inputs) and held-out evaluation (evaluate).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <limits>
#include <mutex>
#include <numeric>
#include <random>
#include <set>

#include "core/data/reorder.hpp"
#include "core/nn/host_ops.hpp"
#include "core/nn/modules/model.hpp"
#include "core/train/evaluate.hpp"
#include "core/train/inputs.hpp"
#include "core/train/loader.hpp"
#include "core/train/prefetcher.hpp"
#include "tests/unit/support.hpp"

namespace braid {
namespace {

using train::Loader;
using train::LoaderOptions;

// Sides drawn from the 72B MLLM run's lognormal (on [16, 64] px, 4 px patches): skewed, so
// an in-order split leaves some replicas with far more patches than others.
data::ShapesDataset skewed_dataset(std::uint64_t seed = 5) {
  spec::DataSpec d = test::load("mllm-72b-1024gpu.yaml").data;
  d.seed = seed;
  return data::ShapesDataset(data::shapes_config(d, 4));
}

// The dataset `braid train` builds for a tiny run: its image encoder's 8 px patches, 16-32 px.
data::ShapesDataset tiny_dataset(const spec::RunSpec& run) {
  return data::ShapesDataset(data::shapes_config(run.data, 8, 16, 32));
}

double patches(const data::ShapesDataset& d, std::int64_t index) {
  const double per_side = d.side(index) / static_cast<double>(d.config().patch);
  return per_side * per_side;
}

double max_replica_cost(const data::ShapesDataset& d, const Loader& loader, std::int64_t step) {
  double worst = 0;
  for (int r = 0; r < loader.options().replicas; ++r) {
    double load = 0;
    for (auto i : loader.indices(step, r)) load += patches(d, i);
    worst = std::max(worst, load);
  }
  return worst;
}

// ---- loader --------------------------------------------------------------------------

TEST(Loader, BadOptionsAndArgumentsAreRefused) {
  const auto d = skewed_dataset();
  using test::expect_error;
  expect_error([&] { Loader(d, {8, 0, false}); }, Status::invalid_argument, {"replicas is 0"});
  expect_error([&] { Loader(d, {8, -2, true}); }, Status::invalid_argument, {"replicas is -2"});
  expect_error([&] { Loader(d, {0, 1, false}); }, Status::invalid_argument, {"global batch of 0", "1 data-parallel"});
  expect_error([&] { Loader(d, {3, 4, false}); }, Status::invalid_argument, {"global batch of 3", "over 4"});
  expect_error([&] { Loader(d, {10, 4, true}); }, Status::invalid_argument, {"global batch of 10", "over 4"});
  const Loader loader(d, {8, 4, true});
  expect_error([&] { loader.indices(0, 0); }, Status::invalid_argument, {"steps count from 1", "got 0"});
  expect_error([&] { loader.indices(1, 4); }, Status::invalid_argument, {"replica 4", "[0, 4)"});
  expect_error([&] { loader.indices(1, -1); }, Status::invalid_argument, {"replica -1"});
}

TEST(Loader, ReplicasPartitionEachStepsGlobalBatch) {
  const auto d = skewed_dataset();
  constexpr std::int64_t G = 24;
  for (bool reorder : {false, true}) {
    for (int R : {1, 2, 3, 4, 6, 8, 24}) {
      const Loader loader(d, {G, R, reorder});
      for (std::int64_t step : {1, 2, 7}) {
        SCOPED_TRACE(testing::Message() << "reorder " << reorder << ", " << R << " replicas, step " << step);
        std::vector<std::int64_t> all;
        for (int r = 0; r < R; ++r) {
          const auto mine = loader.indices(step, r);
          ASSERT_EQ(static_cast<std::int64_t>(mine.size()), G / R);
          EXPECT_TRUE(std::is_sorted(mine.begin(), mine.end()));
          if (!reorder) {
            for (std::int64_t k = 0; k < G / R; ++k) EXPECT_EQ(mine[k], (step - 1) * G + r * (G / R) + k);
          }
          all.insert(all.end(), mine.begin(), mine.end());
        }
        // The union is the same global batch whatever the replica count: every sample once.
        std::sort(all.begin(), all.end());
        std::vector<std::int64_t> expected(G);
        std::iota(expected.begin(), expected.end(), (step - 1) * G);
        EXPECT_EQ(all, expected);
      }
    }
  }
}

// CLIP's contrastive groups: each is split over the replicas alone, so a group holds the same
// samples (and has the same loss) on any number of replicas. One split of the whole batch
// made group 0 of two replicas samples {0..15, 32..47} where one process had {0..31}.
TEST(Loader, ContrastiveGroupsAreSplitOneByOne) {
  const auto d = skewed_dataset();
  constexpr std::int64_t G = 64, C = 32;
  const Loader two(d, {G, 2, false, 2});
  std::vector<std::int64_t> want;
  for (std::int64_t i = 0; i < 16; ++i) want.push_back(64 + i);      // step 2, group 0, replica 0
  for (std::int64_t i = 0; i < 16; ++i) want.push_back(64 + C + i);  // group 1
  EXPECT_EQ(two.indices(2, 0), want);
  for (bool reorder : {false, true}) {
    for (int R : {1, 2, 4}) {
      SCOPED_TRACE(testing::Message() << "reorder " << reorder << ", " << R << " replicas");
      const Loader loader(d, {G, R, reorder, 2});
      for (int g = 0; g < 2; ++g) {
        std::vector<std::int64_t> group;  // the g-th part of every replica's share
        for (int r = 0; r < R; ++r) {
          const auto mine = loader.indices(1, r);
          ASSERT_EQ(static_cast<std::int64_t>(mine.size()), G / R);
          EXPECT_TRUE(std::is_sorted(mine.begin(), mine.end()));
          const auto part = mine.begin() + g * (C / R);
          group.insert(group.end(), part, part + C / R);
        }
        std::sort(group.begin(), group.end());
        std::vector<std::int64_t> expected(C);
        std::iota(expected.begin(), expected.end(), g * C);
        EXPECT_EQ(group, expected) << "group " << g << " holds samples [g C, (g + 1) C)";
      }
    }
  }
  test::expect_error(
      [&] {
        Loader(d, {64, 2, false, 3});
      },
      Status::invalid_argument, {"global batch of 64", "3 contrastive groups"});
  test::expect_error(
      [&] {
        Loader(d, {64, 3, false, 2});
      },
      Status::invalid_argument, {"contrastive group of 32", "over 3"});
}

TEST(Loader, ReorderingIsTheLptAssignmentOverPatchCounts) {
  // The C ABI's intra reordering runs data::assign_lpt (through data::arrange); the loader
  // must give each replica exactly the samples that assignment gives it.
  const auto d = skewed_dataset();
  constexpr std::int64_t G = 32;
  constexpr int R = 4;
  const Loader loader(d, {G, R, true});
  for (std::int64_t step : {1, 3}) {
    std::vector<double> costs;
    for (std::int64_t i = 0; i < G; ++i) costs.push_back(patches(d, (step - 1) * G + i));
    const auto a = data::assign_lpt(costs, R);
    for (int r = 0; r < R; ++r) {
      std::vector<std::int64_t> expected;
      for (std::int64_t i = 0; i < G; ++i)
        if (a.rank[static_cast<std::size_t>(i)] == r) expected.push_back((step - 1) * G + i);
      EXPECT_EQ(loader.indices(step, r), expected) << "step " << step << ", replica " << r;
    }
  }
}

TEST(Loader, ReorderingBalancesASkewedBatch) {
  const auto d = skewed_dataset();
  constexpr std::int64_t G = 32;
  constexpr int R = 4;
  const Loader in_order(d, {G, R, false}), reordered(d, {G, R, true});
  int improved = 0;
  for (std::int64_t step = 1; step <= 20; ++step) {
    const double before = max_replica_cost(d, in_order, step), after = max_replica_cost(d, reordered, step);
    EXPECT_LE(after, before) << "step " << step;
    // LPT with equal counts: the slowest replica is within one largest sample of the mean.
    double total = 0, largest = 0;
    for (std::int64_t i = 0; i < G; ++i) {
      total += patches(d, (step - 1) * G + i);
      largest = std::max(largest, patches(d, (step - 1) * G + i));
    }
    EXPECT_LE(after, total / R + largest) << "step " << step;
    improved += after < before;
  }
  // Sides are skewed: an in-order split is uneven on most steps, and reordering fixes it.
  EXPECT_GE(improved, 15);
}

TEST(Loader, ResultsArePureFunctionsOfSeedOptionsStepAndReplica) {
  // Two processes build their own datasets and loaders: they must agree.
  const auto d1 = skewed_dataset(11), d2 = skewed_dataset(11), other = skewed_dataset(12);
  const Loader a(d1, {16, 4, true}), b(d2, {16, 4, true}), c(other, {16, 4, true});
  bool seed_matters = false;
  for (std::int64_t step = 1; step <= 4; ++step) {
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(a.indices(step, r), b.indices(step, r));
      EXPECT_EQ(a.indices(step, r), a.indices(step, r));  // no state carried between calls
      seed_matters |= a.indices(step, r) != c.indices(step, r);
    }
  }
  // The seed picks the sides, and with them the reordering.
  EXPECT_TRUE(seed_matters);
  // Asking for a later step first changes nothing.
  const Loader fresh(d1, {16, 4, true});
  const auto late = fresh.indices(4, 2);
  EXPECT_EQ(late, a.indices(4, 2));
}

TEST(Loader, SamplesAreTheRenderedIndicesInOrder) {
  const auto d = skewed_dataset();
  const Loader loader(d, {12, 3, true});
  const auto idx = loader.indices(2, 1);
  const auto samples = loader.samples(2, 1);
  ASSERT_EQ(samples.size(), idx.size());
  for (std::size_t k = 0; k < idx.size(); ++k) {
    const data::Sample expected = d.get(idx[k]);
    EXPECT_EQ(samples[k].index, idx[k]);
    EXPECT_EQ(samples[k].split, data::Split::train);
    EXPECT_EQ(samples[k].side, expected.side);
    EXPECT_EQ(samples[k].tokens, expected.tokens);
    EXPECT_EQ(samples[k].pixels, expected.pixels);
  }
}

// ---- inputs --------------------------------------------------------------------------

std::vector<data::Sample> first_samples(const data::ShapesDataset& d, std::int64_t count) {
  std::vector<data::Sample> out;
  for (std::int64_t i = 0; i < count; ++i) out.push_back(d.get(i));
  return out;
}

// --- prefetching workers (DistTrain's decoupled preprocessing) ---

int threads_of_this_process() {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) n += e.is_directory() ? 1 : 0;
  return n;
}

TEST(Prefetcher, WorkersGiveTheLoadersSamplesInOrder) {
  const data::ShapesDataset d = skewed_dataset(11);
  const Loader loader(d, LoaderOptions{64, 4, true});
  for (int workers : {0, 1, 3}) {
    SCOPED_TRACE(workers);
    train::Prefetcher prefetch(loader, 2, 3, 9, train::PrefetchOptions{workers, 2});
    for (std::int64_t step = 3; step <= 9; ++step) {
      const auto got = prefetch.take(step);
      const auto want = loader.samples(step, 2);
      ASSERT_EQ(got.size(), want.size());
      for (std::size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].index, want[i].index);
        EXPECT_EQ(got[i].pixels, want[i].pixels);
        EXPECT_EQ(got[i].tokens, want[i].tokens);
      }
    }
    test::expect_error([&] { prefetch.take(10); }, Status::invalid_argument, {"step 10 asked", "of 9"});
  }
  train::Prefetcher prefetch(loader, 0, 1, 5);
  test::expect_error([&] { prefetch.take(2); }, Status::invalid_argument, {"step 2 asked, step 1 is next"});
}

TEST(Prefetcher, WithoutPixelsGivesTheSamplesDescribed) {
  const data::ShapesDataset d = skewed_dataset(11);
  const Loader loader(d, LoaderOptions{64, 4, true});
  train::PrefetchOptions options{1, 2};
  options.pixels = false;
  train::Prefetcher prefetch(loader, 1, 1, 2, options);
  const auto got = prefetch.take(1);
  const auto want = loader.samples(1, 1);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].index, want[i].index);
    EXPECT_EQ(got[i].side, want[i].side);
    EXPECT_EQ(got[i].tokens, want[i].tokens);
    EXPECT_TRUE(got[i].pixels.empty());
    EXPECT_FALSE(want[i].pixels.empty());
  }
}

TEST(Prefetcher, AWorkersFailureNamesTheSampleAndNoThreadIsLeftBehind) {
  const data::ShapesDataset d = skewed_dataset(12);
  const Loader loader(d, LoaderOptions{16, 2, false});
  const int before = threads_of_this_process();
  // Sample 37 (step 3, replica 0 takes 32..39) cannot be rendered.
  auto render = [&](std::int64_t i) {
    if (i == 37) throw Error(Status::io, "cannot decode the image");
    return d.get(i);
  };
  for (int workers : {0, 2}) {
    SCOPED_TRACE(workers);
    {
      train::Prefetcher prefetch(loader, 0, 1, 6, train::PrefetchOptions{workers, 3}, render);
      EXPECT_EQ(prefetch.take(1).size(), 8u);
      EXPECT_EQ(prefetch.take(2).size(), 8u);
      test::expect_error([&] { prefetch.take(3); }, Status::io,
                         {"data worker: sample 37 of step 3", "cannot decode the image"});
    }
    EXPECT_EQ(threads_of_this_process(), before);
  }
}

TEST(Prefetcher, EveryWorkerHasAStepInFlightAndDescribingTakesOne) {
  const data::ShapesDataset d = skewed_dataset(13);
  const Loader loader(d, LoaderOptions{16, 2, false});
  // Each render waits (once, a few seconds at most) for four renders at once: with the steps
  // ahead capped at 2, two of four workers only waited.
  std::mutex mutex;
  std::condition_variable changed;
  int active = 0, most = 0;
  bool released = false;
  auto render = [&](std::int64_t i) {
    std::unique_lock lock(mutex);
    most = std::max(most, ++active);
    changed.notify_all();
    if (!released) released = changed.wait_for(lock, std::chrono::seconds(5), [&] { return active == 4; });
    released = true;
    --active;
    lock.unlock();
    return d.get(i);
  };
  {
    train::Prefetcher prefetch(loader, 0, 1, 6, train::PrefetchOptions{4, 2}, render);
    for (std::int64_t step = 1; step <= 6; ++step) EXPECT_EQ(prefetch.take(step).size(), 8u);
  }
  EXPECT_EQ(most, 4);
  // Describing is a lookup: one worker, however many are asked for.
  const int before = threads_of_this_process();
  train::PrefetchOptions described{4, 2};
  described.pixels = false;
  train::Prefetcher prefetch(loader, 0, 1, 6, described);
  EXPECT_EQ(threads_of_this_process(), before + 1);
  EXPECT_EQ(prefetch.take(1).size(), 8u);
}

TEST(Inputs, SideGroupsPutEachSamplesPixelsInItsRow) {
  const auto d = skewed_dataset();
  const auto samples = first_samples(d, 20);
  const auto groups = train::side_groups(samples);
  ASSERT_GE(groups.size(), 2u) << "the batch should mix sides";
  std::vector<int> seen(samples.size(), 0);
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const auto& group = groups[g];
    if (g > 0) {
      EXPECT_LT(groups[g - 1].side, group.side);
    }
    EXPECT_TRUE(std::is_sorted(group.members.begin(), group.members.end()));
    const auto n = static_cast<std::int64_t>(group.members.size());
    ASSERT_EQ(group.images.shape, (nn::Shape{n, 3, group.side, group.side}));
    const std::size_t row = 3 * static_cast<std::size_t>(group.side) * static_cast<std::size_t>(group.side);
    for (std::size_t k = 0; k < group.members.size(); ++k) {
      const data::Sample& s = samples[group.members[k]];
      ++seen[group.members[k]];
      EXPECT_EQ(s.side, group.side);
      EXPECT_EQ(std::memcmp(group.images.ptr() + k * row, s.pixels.data(), row * sizeof(float)), 0)
          << "row " << k << " of side " << group.side;
    }
  }
  EXPECT_EQ(seen, std::vector<int>(samples.size(), 1));
}

TEST(Inputs, TokensArePaddedAfterEachCaption) {
  const auto d = skewed_dataset();
  const auto samples = first_samples(d, 12);
  std::size_t longest = 0, shortest = 100;
  for (const auto& s : samples) {
    longest = std::max(longest, s.tokens.size());
    shortest = std::min(shortest, s.tokens.size());
  }
  ASSERT_LT(shortest, longest) << "the batch should mix caption lengths";
  auto check = [&](const nn::Tokens& t, const std::vector<std::size_t>& rows, std::int64_t length) {
    ASSERT_EQ(t.batch, static_cast<std::int64_t>(rows.size()));
    ASSERT_EQ(t.length, length);
    ASSERT_EQ(t.ids.size(), rows.size() * static_cast<std::size_t>(length));
    t.check("tokens_of");
    for (std::size_t b = 0; b < rows.size(); ++b) {
      const auto& tokens = samples[rows[b]].tokens;
      EXPECT_EQ(t.lengths[b], static_cast<std::int32_t>(tokens.size()));
      for (std::int64_t p = 0; p < length; ++p) {
        const auto want = p < static_cast<std::int64_t>(tokens.size()) ? tokens[static_cast<std::size_t>(p)]
                                                                       : data::CaptionTokenizer::kPad;
        EXPECT_EQ(t.ids[b * static_cast<std::size_t>(length) + static_cast<std::size_t>(p)], want)
            << "sample " << rows[b] << ", position " << p;
      }
    }
  };
  std::vector<std::size_t> all(samples.size());
  std::iota(all.begin(), all.end(), 0);
  check(train::tokens_of(samples), all, static_cast<std::int64_t>(longest));
  check(train::tokens_of(samples, 16), all, 16);
  // Members of a side group: their tokens, in the members' order, padded to their own longest.
  for (const auto& g : train::side_groups(samples)) {
    std::size_t group_longest = 0;
    for (auto m : g.members) group_longest = std::max(group_longest, samples[m].tokens.size());
    check(train::tokens_of(samples, g.members), g.members, static_cast<std::int64_t>(group_longest));
    check(train::tokens_of(samples, g.members, 14), g.members, 14);
  }
  test::expect_error([&] { train::tokens_of(samples, static_cast<std::int64_t>(longest) - 1); },
                     Status::invalid_argument, {"does not fit length"});
  const std::vector<std::size_t> outside = {0, samples.size()};
  test::expect_error([&] { train::tokens_of(samples, outside); }, Status::invalid_argument,
                     {"member 12", "batch of 12"});
}

TEST(Inputs, CountedTokensAreTheLmLossTargets) {
  const auto d = skewed_dataset();
  const auto samples = first_samples(d, 9);
  std::int64_t expected = 0;
  for (const auto& s : samples) expected += static_cast<std::int64_t>(s.tokens.size()) - 1;
  EXPECT_EQ(train::counted_tokens(samples), expected);
  const auto targets = nn::next_token_targets(train::tokens_of(samples, 16));
  EXPECT_EQ(std::count_if(targets.begin(), targets.end(), [](std::int32_t t) { return t >= 0; }), expected);
  EXPECT_EQ(train::counted_tokens({}), 0);
}

// ---- retrieval -----------------------------------------------------------------------

nn::Tensor rows(std::int64_t e, std::vector<std::vector<float>> values) {
  std::vector<float> flat;
  for (auto& r : values) {
    EXPECT_EQ(static_cast<std::int64_t>(r.size()), e);
    flat.insert(flat.end(), r.begin(), r.end());
  }
  return nn::Tensor({static_cast<std::int64_t>(values.size()), e}, flat);
}

TEST(Retrieval, PerfectEmbeddingsScoreOne) {
  const nn::Tensor id = rows(3, {{1, 0, 0}, {0, 1, 0}, {0, 0, 1}});
  const std::vector<std::int64_t> scenes = {4, 5, 6};
  const auto r = train::retrieval_top1(id, id, scenes);
  EXPECT_EQ(r.image_to_text, 1.0);
  EXPECT_EQ(r.text_to_image, 1.0);
}

TEST(Retrieval, AShuffledCaseWithAKnownAnswer) {
  // Texts 0-2 are a 3-cycle of images 0-2; sample 3 matches itself.
  const nn::Tensor image = rows(4, {{1, 0, 0, 0}, {0, 1, 0, 0}, {0, 0, 1, 0}, {0, 0, 0, 1}});
  const nn::Tensor text = rows(4, {{0, 1, 0, 0}, {0, 0, 1, 0}, {1, 0, 0, 0}, {0, 0, 0, 1}});
  const std::vector<std::int64_t> distinct = {10, 11, 12, 13};
  auto r = train::retrieval_top1(image, text, distinct);
  EXPECT_EQ(r.image_to_text, 0.25);
  EXPECT_EQ(r.text_to_image, 0.25);
  // Samples 0-2 of one scene share a caption: any of them is a correct answer.
  const std::vector<std::int64_t> duplicates = {7, 7, 7, 9};
  r = train::retrieval_top1(image, text, duplicates);
  EXPECT_EQ(r.image_to_text, 1.0);
  EXPECT_EQ(r.text_to_image, 1.0);
  // Only samples 0 and 1 share a scene: image 1 -> text 0 and text 0 -> image 1 become correct.
  const std::vector<std::int64_t> one_pair = {7, 7, 12, 13};
  r = train::retrieval_top1(image, text, one_pair);
  EXPECT_EQ(r.image_to_text, 0.5);
  EXPECT_EQ(r.text_to_image, 0.5);
}

TEST(Retrieval, DirectionsAreScoredSeparately) {
  const float h = 1.0f / std::sqrt(2.0f);
  // Image 1 sits between texts 0 and 1 (a tie goes to text 0: wrong); both texts pick right.
  const nn::Tensor image = rows(2, {{1, 0}, {h, h}});
  const nn::Tensor text = rows(2, {{1, 0}, {0, 1}});
  const std::vector<std::int64_t> scenes = {1, 2};
  const auto r = train::retrieval_top1(image, text, scenes);
  EXPECT_EQ(r.image_to_text, 0.5);
  EXPECT_EQ(r.text_to_image, 1.0);
}

TEST(Retrieval, MismatchedInputsAreRefused) {
  const nn::Tensor a = rows(2, {{1, 0}, {0, 1}});
  const nn::Tensor b = rows(2, {{1, 0}});
  const std::vector<std::int64_t> two = {1, 2}, three = {1, 2, 3};
  test::expect_error([&] { train::retrieval_top1(a, b, two); }, Status::invalid_argument, {"(2, 2)", "(1, 2)"});
  test::expect_error([&] { train::retrieval_top1(a, a, three); }, Status::invalid_argument, {"3 scene ids"});
  const nn::Tensor none({0, 2});
  test::expect_error([&] { train::retrieval_top1(none, none, {}); }, Status::invalid_argument, {"no embeddings"});
}

// The exhaustive scan best_matches must equal: every key, scores summed in double in column
// order, ties to the lower index.
std::vector<std::int64_t> reference_matches(const nn::Tensor& queries, const nn::Tensor& keys) {
  const std::int64_t nq = queries.dim(0), n = keys.dim(0), e = keys.dim(1);
  std::vector<std::int64_t> out;
  for (std::int64_t i = 0; i < nq; ++i) {
    std::int64_t best = 0;
    double best_score = -1e300;
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (std::int64_t c = 0; c < e; ++c) s += static_cast<double>(queries.ptr()[i * e + c]) * keys.ptr()[j * e + c];
      if (s > best_score) {
        best_score = s;
        best = j;
      }
    }
    out.push_back(best);
  }
  return out;
}

// n unit-norm rows of width e from a normal; with `coarse`, entries in {-1, 0, 1} before
// normalizing (many exactly equal scores).
nn::Tensor random_rows(std::mt19937_64& rng, std::int64_t n, std::int64_t e, bool coarse = false) {
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> trit(-1, 1);
  nn::Tensor t({n, e});
  for (std::int64_t i = 0; i < n; ++i) {
    float* r = t.ptr() + i * e;
    double norm = 0;
    for (std::int64_t c = 0; c < e; ++c) {
      r[c] = coarse ? static_cast<float>(trit(rng)) : normal(rng);
      norm += static_cast<double>(r[c]) * r[c];
    }
    if (norm == 0) r[0] = 1, norm = 1;
    for (std::int64_t c = 0; c < e; ++c) r[c] = static_cast<float>(r[c] / std::sqrt(norm));
  }
  return t;
}

void copy_row(nn::Tensor& t, std::int64_t from, std::int64_t to) {
  const std::int64_t e = t.dim(1);
  std::memcpy(t.ptr() + to * e, t.ptr() + from * e, static_cast<std::size_t>(e) * sizeof(float));
}

void expect_matches_reference(const nn::Tensor& queries, const nn::Tensor& keys, const char* what) {
  const auto got = train::best_matches(queries, keys), want = reference_matches(queries, keys);
  ASSERT_EQ(got.size(), want.size()) << what;
  std::int64_t differ = 0;
  for (std::size_t i = 0; i < got.size(); ++i) differ += got[i] != want[i];
  EXPECT_EQ(differ, 0) << what << ": rows whose best match differs from the exhaustive double scan";
}

TEST(Retrieval, BestMatchesEqualAnExhaustiveDoubleScan) {
  std::mt19937_64 rng(11);
  // Over one block of 256 queries and not a multiple of it; widths below and above the
  // GEMM kernels' unrolling.
  for (const std::int64_t e : {1, 7, 32}) {
    for (const std::int64_t n : {1, 5, 300, 600}) {
      SCOPED_TRACE("n " + std::to_string(n) + ", e " + std::to_string(e));
      nn::Tensor image = random_rows(rng, n, e), text = random_rows(rng, n, e);
      expect_matches_reference(image, text, "random");
      expect_matches_reference(text, image, "random, text to image");
      if (n < 5) continue;
      // Exact duplicate rows (one caption for two samples of a scene): equal scores, the lower
      // index wins, wherever the duplicates sit in GEMM tiles.
      std::uniform_int_distribution<std::int64_t> row(0, n - 1);
      for (std::int64_t k = 0; k < n / 3; ++k) {
        copy_row(text, row(rng), row(rng));
        copy_row(image, row(rng), row(rng));
      }
      copy_row(text, 0, n - 1);
      copy_row(image, n - 1, 0);
      expect_matches_reference(image, text, "duplicates");
      expect_matches_reference(text, image, "duplicates, text to image");
      // Near ties: copies one float step apart in one entry, closer than float GEMM resolves.
      for (std::int64_t k = 0; k < n / 4; ++k) {
        const std::int64_t from = row(rng), to = row(rng);
        copy_row(text, from, to);
        float& x = text.ptr()[to * e + k % e];
        x = std::nextafter(x, k % 2 ? 1.0f : -1.0f);
      }
      expect_matches_reference(image, text, "near ties");
      expect_matches_reference(text, image, "near ties, text to image");
      // Coarse rows: many exactly equal scores between different keys.
      const nn::Tensor a = random_rows(rng, n, e, true), b = random_rows(rng, n, e, true);
      expect_matches_reference(a, b, "coarse");
      // Every key alike: all scores tie, so every query takes key 0.
      nn::Tensor same({n, e});
      for (std::int64_t j = 0; j < n; ++j) std::memcpy(same.ptr() + j * e, a.ptr(), static_cast<std::size_t>(e) * 4);
      expect_matches_reference(b, same, "all tied");
    }
  }
}

TEST(Retrieval, BestMatchesOfUnnormalizedAndNonFiniteRows) {
  std::mt19937_64 rng(12);
  nn::Tensor q = random_rows(rng, 40, 6), k = random_rows(rng, 300, 6);
  for (std::int64_t i = 0; i < 40 * 6; ++i) q.ptr()[i] *= 1e-30f;  // products below the float range
  for (std::int64_t i = 0; i < 300 * 6; ++i) k.ptr()[i] *= 1e-12f;
  expect_matches_reference(q, k, "tiny");
  for (std::int64_t i = 0; i < 300 * 6; ++i) k.ptr()[i] *= 1e30f;  // scores near the float range
  for (std::int64_t i = 0; i < 40 * 6; ++i) q.ptr()[i] *= 1e30f;
  expect_matches_reference(q, k, "large");
  for (std::int64_t i = 0; i < 40 * 6; ++i) q.ptr()[i] *= 1e19f;
  expect_matches_reference(q, k, "huge");
  nn::Tensor nan_rows = random_rows(rng, 300, 6);
  nan_rows.ptr()[7 * 6 + 2] = std::numeric_limits<float>::quiet_NaN();
  nan_rows.ptr()[9 * 6] = std::numeric_limits<float>::infinity();
  const nn::Tensor p = random_rows(rng, 40, 6);
  expect_matches_reference(p, nan_rows, "non-finite keys");
  expect_matches_reference(nan_rows, p, "non-finite queries");
  test::expect_error([&] { train::best_matches(p, nn::Tensor({3, 5})); }, Status::invalid_argument, {"(3, 5)"});
}

TEST(Retrieval, ScoresOverBlocksWithDuplicateCaptions) {
  // retrieval_top1 on many rows with shared captions agrees with the reference's counts.
  std::mt19937_64 rng(13);
  const std::int64_t n = 700, e = 16;
  nn::Tensor image = random_rows(rng, n, e), text = random_rows(rng, n, e);
  std::vector<std::int64_t> scenes(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    scenes[static_cast<std::size_t>(i)] = i % 500;
    if (i >= 500) copy_row(text, i % 500, i);  // one caption per scene
    if (i % 3 == 0) {                          // an image close to its caption
      for (std::int64_t c = 0; c < e; ++c) image.ptr()[i * e + c] += 2 * text.ptr()[i * e + c];
    }
  }
  const auto r = train::retrieval_top1(image, text, scenes);
  const auto to_text = reference_matches(image, text), to_image = reference_matches(text, image);
  std::int64_t i2t = 0, t2i = 0;
  for (std::size_t i = 0; i < scenes.size(); ++i) {
    i2t += scenes[static_cast<std::size_t>(to_text[i])] == scenes[i];
    t2i += scenes[static_cast<std::size_t>(to_image[i])] == scenes[i];
  }
  EXPECT_GT(i2t, n / 4);
  EXPECT_EQ(r.image_to_text, static_cast<double>(i2t) / n);
  EXPECT_EQ(r.text_to_image, static_cast<double>(t2i) / n);
}

// ---- embeddings and caption metrics on the shipped tiny models ------------------------

void expect_rows_near(const nn::Tensor& batch, std::int64_t row, const nn::Tensor& alone, const char* what) {
  ASSERT_EQ(alone.dim(0), 1);
  const std::int64_t e = alone.dim(1);
  double scale = 0;
  for (std::int64_t c = 0; c < e; ++c) scale = std::max(scale, std::fabs(static_cast<double>(alone.ptr()[c])));
  for (std::int64_t c = 0; c < e; ++c)
    EXPECT_NEAR(batch.ptr()[row * e + c], alone.ptr()[c], 1e-5 * scale) << what << " of sample " << row << ", " << c;
}

TEST(Evaluate, ClipEmbeddingsOfABatchMatchEachSampleAlone) {
  const spec::RunSpec run = test::load("tiny-clip.yaml");
  const nn::Model model = nn::build_model(run.model, 3);
  const nn::ClipModel& clip = *model.clip;
  nn::HostOps ops(1);
  const auto d = tiny_dataset(run);
  const auto samples = first_samples(d, 10);
  std::set<int> sides;
  for (const auto& s : samples) sides.insert(s.side);
  ASSERT_GE(sides.size(), 2u) << "the batch should mix sides, so grouping reorders it";

  const nn::Tensor images = train::image_embeddings(ops, clip, samples);
  const nn::Tensor texts = train::text_embeddings(ops, clip, samples);
  ASSERT_EQ(images.shape, (nn::Shape{10, run.model.modules[0].embed_dim}));
  ASSERT_EQ(texts.shape, images.shape);
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const data::Sample& s = samples[i];
    nn::Shape shape = s.pixel_shape();
    shape.insert(shape.begin(), 1);
    nn::ImageEncoderCache ic;
    nn::ClipHeadCache ih;
    const nn::Tensor img =
        clip.image_head->forward(ops, clip.image_encoder->forward(ops, nn::Tensor(shape, s.pixels), ic).pooled, ih);
    expect_rows_near(images, static_cast<std::int64_t>(i), img, "image embedding");

    nn::Tokens tokens;
    tokens.batch = 1;
    tokens.length = static_cast<std::int64_t>(s.tokens.size());
    tokens.ids = s.tokens;
    tokens.lengths = {static_cast<std::int32_t>(s.tokens.size())};
    nn::TextEncoderCache tc;
    nn::ClipHeadCache th;
    const nn::Tensor txt = clip.text_head->forward(ops, clip.text_encoder->forward(ops, tokens, tc).pooled, th);
    expect_rows_near(texts, static_cast<std::int64_t>(i), txt, "text embedding");
  }
}

// The largest difference between two tensors of one shape.
double max_abs_diff(const nn::Tensor& a, const nn::Tensor& b) {
  EXPECT_EQ(a.shape, b.shape);
  double d = 0;
  for (std::size_t i = 0; i < std::min(a.data.size(), b.data.size()); ++i)
    d = std::max(d, std::fabs(static_cast<double>(a.data[i]) - b.data[i]));
  return d;
}

TEST(Evaluate, ChunkedForwardsEqualOneWholeBatchForward) {
  // Over 256 samples, so the encoders run in several chunks (and the last one partial); a
  // sample's embedding and logits depend on the other samples of its forward pass only in
  // float rounding.
  const spec::RunSpec run = test::load("tiny-clip.yaml");
  const nn::Model model = nn::build_model(run.model, 3);
  const nn::ClipModel& clip = *model.clip;
  nn::HostOps ops(2);
  const auto d = tiny_dataset(run);
  const auto samples = train::heldout_samples(d, 300);
  const nn::Tensor images = train::image_embeddings(ops, clip, samples);
  const nn::Tensor texts = train::text_embeddings(ops, clip, samples);

  // One forward per side group over every sample, and one for every caption.
  nn::Tensor whole_images(images.shape);
  const std::int64_t e = images.dim(1);
  for (auto& g : train::side_groups(samples)) {
    nn::ImageEncoderCache ic;
    nn::ClipHeadCache ih;
    const nn::Tensor emb = clip.image_head->forward(ops, clip.image_encoder->forward(ops, g.images, ic).pooled, ih);
    for (std::size_t m = 0; m < g.members.size(); ++m)
      std::memcpy(whole_images.ptr() + static_cast<std::int64_t>(g.members[m]) * e,
                  emb.ptr() + static_cast<std::int64_t>(m) * e, static_cast<std::size_t>(e) * sizeof(float));
  }
  nn::TextEncoderCache tc;
  nn::ClipHeadCache th;
  const nn::Tensor whole_texts =
      clip.text_head->forward(ops, clip.text_encoder->forward(ops, train::tokens_of(samples), tc).pooled, th);
  // Not bitwise: BLAS kernels round a row's sums differently as the row count changes (about
  // 2e-7 here, on unit-norm embeddings), as the whole batch does against each sample alone.
  EXPECT_LE(max_abs_diff(images, whole_images), 1e-6);
  EXPECT_LE(max_abs_diff(texts, whole_texts), 1e-6);

  // Caption metrics: the same counts; the loss sums per-chunk float losses, so it may differ
  // in float rounding only.
  const spec::RunSpec mllm_run = test::load("tiny-mllm.yaml");
  const nn::Model mllm = nn::build_model(mllm_run.model, 4);
  const auto mllm_samples = train::heldout_samples(tiny_dataset(mllm_run), 300);
  const train::CaptionMetrics m = train::caption_metrics(ops, *mllm.chain, mllm_samples);
  double loss = 0;
  std::int64_t correct = 0;
  for (const auto& g : train::side_groups(mllm_samples)) {
    const nn::Tokens text = train::tokens_of(mllm_samples, g.members);
    nn::ImageEncoderCache vision;
    nn::ProjectorCache projector;
    nn::DecoderCache llm;
    nn::Tensor prefix = mllm.chain->vision->forward(ops, g.images, vision).tokens;
    if (mllm.chain->projector) prefix = mllm.chain->projector->forward(ops, prefix, projector);
    const nn::Tensor logits = mllm.chain->llm->forward(ops, &prefix, text, llm);
    loss += nn::lm_loss(ops, logits, text, 1, nullptr);
    const auto targets = nn::next_token_targets(text);
    const std::int64_t vocab = logits.dim(2);
    for (std::size_t p = 0; p < targets.size(); ++p) {
      if (targets[p] < 0) continue;
      const float* row = logits.ptr() + static_cast<std::int64_t>(p) * vocab;
      correct += std::max_element(row, row + vocab) - row == targets[p];
    }
  }
  EXPECT_EQ(m.tokens, train::counted_tokens(mllm_samples));
  EXPECT_EQ(m.token_accuracy, static_cast<double>(correct) / static_cast<double>(m.tokens));
  EXPECT_NEAR(m.loss, loss / static_cast<double>(m.tokens), 1e-6 * m.loss);
}

TEST(Evaluate, HeldoutSamplesAreTheFirstOfTheHeldoutSplit) {
  const spec::RunSpec run = test::load("tiny-clip.yaml");
  const auto d = tiny_dataset(run);
  const auto h = train::heldout_samples(d, 5);
  ASSERT_EQ(h.size(), 5u);
  for (std::int64_t i = 0; i < 5; ++i) {
    EXPECT_EQ(h[static_cast<std::size_t>(i)].index, i);
    EXPECT_EQ(h[static_cast<std::size_t>(i)].split, data::Split::heldout);
    EXPECT_TRUE(d.heldout(h[static_cast<std::size_t>(i)].scene));
    EXPECT_EQ(h[static_cast<std::size_t>(i)].pixels, d.get(i, data::Split::heldout).pixels);
  }
  EXPECT_TRUE(train::heldout_samples(d, 0).empty());
  test::expect_error([&] { train::heldout_samples(d, -1); }, Status::invalid_argument, {"count is -1"});
}

TEST(Evaluate, CaptionMetricsOfTheTinyMllmAtInit) {
  const spec::RunSpec run = test::load("tiny-mllm.yaml");
  const nn::Model model = nn::build_model(run.model, 4);
  const nn::ChainModel& chain = *model.chain;
  nn::HostOps ops(1);
  const auto d = tiny_dataset(run);
  const auto samples = train::heldout_samples(d, 12);
  const auto groups = train::side_groups(samples);
  ASSERT_GE(groups.size(), 2u) << "the batch should mix sides (prefix lengths)";

  const train::CaptionMetrics m = train::caption_metrics(ops, chain, samples);
  EXPECT_EQ(m.tokens, train::counted_tokens(samples));
  ASSERT_TRUE(std::isfinite(m.loss));
  const double vocab = static_cast<double>(run.model.modules.back().vocab);
  EXPECT_NEAR(m.loss, std::log(vocab), 0.3);  // about uniform over the vocabulary at init
  EXPECT_GE(m.token_accuracy, 0.0);
  EXPECT_LE(m.token_accuracy, 1.0);

  // The loss is the sum of the model's own per-group LM loss over all counted positions.
  double sum = 0;
  for (const auto& g : groups) sum += chain.step(ops, &g.images, train::tokens_of(samples, g.members), 1, false);
  EXPECT_NEAR(m.loss, sum / static_cast<double>(m.tokens), 1e-5 * std::log(vocab));

  // Per-sample metrics, weighted by their counted tokens, give the batch's.
  double loss = 0;
  std::int64_t tokens = 0;
  for (const auto& s : samples) {
    const auto one = train::caption_metrics(ops, chain, std::span<const data::Sample>(&s, 1));
    loss += one.loss * static_cast<double>(one.tokens);
    tokens += one.tokens;
  }
  EXPECT_EQ(tokens, m.tokens);
  EXPECT_NEAR(m.loss, loss / static_cast<double>(tokens), 1e-4);
}

}  // namespace
}  // namespace braid
