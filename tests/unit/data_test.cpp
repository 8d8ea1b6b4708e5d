// Data reordering (DistTrain): synthetic size distributions, per-sample costs from the
// cost model, LPT assignment against brute force, the lcm grid, the 1F1B step-time
// recurrence against the simulator, inter-microbatch ordering against exhaustive search,
// and the step report on real plans.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "core/cost/cost_model.hpp"
#include "core/data/arrangement.hpp"
#include "core/data/dataset.hpp"
#include "core/data/microbatch_order.hpp"
#include "core/data/reorder.hpp"
#include "core/data/sample_cost.hpp"
#include "core/data/step_report.hpp"
#include "core/orchestrate/planning.hpp"
#include "core/orchestrate/program.hpp"
#include "core/pipeline/schedules.hpp"
#include "core/plan/plan_io.hpp"
#include "core/sim/simulator.hpp"
#include "tests/unit/support.hpp"

namespace braid {
namespace {

using data::PipelineTimes;
using test::expect_error;

// LLaVA-13B on 4 nodes with the given `data:` body (lines 6 on of the document).
std::string llava(const std::string& data, const std::string& training = "{global_batch: 64, microbatch: 1}") {
  return "model: ../models/llava-13b.yaml\n"
         "cluster: ../clusters/dgx-a100-80gb.yaml\n"
         "nodes: 4\n"
         "training: " +
         training +
         "\n"
         "data:\n" +
         data;
}

const std::string kSkewed =
    "  seed: 11\n"
    "  image:\n"
    "    resolution: 336\n"
    "    distribution: {kind: lognormal, median: 280, sigma: 0.5, min: 224, max: 672}\n"
    "  text:\n"
    "    tokens: 1472\n"
    "    distribution: {kind: histogram, values: [64, 256, 1024, 1472], weights: [0.5, 0.3, 0.15, 0.05]}\n";

// ---- distributions ----------------------------------------------------------------------

TEST(DataSpec, DistributionsAreDeterministicBySeedAndStep) {
  const auto run = test::parse(llava(kSkewed));
  ASSERT_TRUE(run.data.heterogeneous());
  EXPECT_EQ(run.data.seed, 11u);
  EXPECT_EQ(run.data.image.step, 14);  // the vision encoder's patch size
  const auto a = data::draw_batch(run.data, 512, 3), b = data::draw_batch(run.data, 512, 3);
  const auto other_step = data::draw_batch(run.data, 512, 4);
  auto reseeded = run.data;
  reseeded.seed = 12;
  const auto other_seed = data::draw_batch(reseeded, 512, 3);
  int same_step = 0, same_seed = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].image_resolution, b[i].image_resolution);
    EXPECT_EQ(a[i].text_tokens, b[i].text_tokens);
    same_step += a[i].image_resolution == other_step[i].image_resolution;
    same_seed += a[i].image_resolution == other_seed[i].image_resolution;
    // On the patch grid, inside the clamp.
    EXPECT_EQ(a[i].image_resolution % 14, 0);
    EXPECT_GE(a[i].image_resolution, 224);
    EXPECT_LE(a[i].image_resolution, 672);
  }
  EXPECT_LT(same_step, 200);  // 49 grid sizes: chance agreement is well under half
  EXPECT_LT(same_seed, 200);
  // A modality's draws do not depend on whether another modality varies.
  auto text_only = run.data;
  text_only.image = spec::SizeDistribution{};
  const auto c = data::draw_batch(text_only, 512, 3);
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(c[i].text_tokens, a[i].text_tokens);
    EXPECT_EQ(c[i].image_resolution, 336);
  }
}

TEST(DataSpec, LognormalHasItsMedianAndSigma) {
  spec::SizeDistribution d;
  d.kind = spec::SizeKind::lognormal;
  d.median = 1000;
  d.sigma = 0.8;
  d.min = 1;
  d.max = 1000000;  // far enough not to clamp
  data::SizeSampler sampler(d, 2048, 5, 0, 1);
  std::vector<double> logs;
  for (int i = 0; i < 20000; ++i) logs.push_back(std::log(sampler.next()));
  std::nth_element(logs.begin(), logs.begin() + 10000, logs.end());
  EXPECT_NEAR(std::exp(logs[10000]), 1000, 30);
  const double mean = std::accumulate(logs.begin(), logs.end(), 0.0) / logs.size();
  double var = 0;
  for (double x : logs) var += (x - mean) * (x - mean) / logs.size();
  EXPECT_NEAR(std::sqrt(var), 0.8, 0.02);
}

TEST(DataSpec, HistogramDrawsItsWeights) {
  spec::SizeDistribution d;
  d.kind = spec::SizeKind::histogram;
  d.values = {64, 256, 1024, 4096};
  d.weights = {4, 3, 0, 1};  // relative: 0.5, 0.375, 0, 0.125
  data::SizeSampler sampler(d, 4096, 0, 7, 1);
  std::map<int, int> count;
  const int n = 40000;
  for (int i = 0; i < n; ++i) count[sampler.next()]++;
  EXPECT_NEAR(count[64] / double(n), 0.5, 0.01);
  EXPECT_NEAR(count[256] / double(n), 0.375, 0.01);
  EXPECT_EQ(count[1024], 0);
  EXPECT_NEAR(count[4096] / double(n), 0.125, 0.01);
}

TEST(DataSpec, WithoutADistributionEverySampleIsNominal) {
  const auto run = test::parse(llava("  image: {resolution: 336}\n  text: {tokens: 1472}\n"));
  EXPECT_FALSE(run.data.heterogeneous());
  EXPECT_EQ(run.data.steps, 4);
  for (const auto& s : data::draw_batch(run.data, 64, 0)) {
    EXPECT_EQ(s.image_resolution, 336);
    EXPECT_EQ(s.text_tokens, 1472);
  }
}

// A run whose text distribution is `dist` (block style from line 10 of the document).
std::string text_distribution(const std::string& dist) {
  return llava(
      "  image: {resolution: 336}\n"
      "  text:\n"
      "    tokens: 1472\n"
      "    distribution:\n" +
      dist);
}

TEST(DataSpec, BadDistributionsNameFileLineAndColumn) {
  auto bad = [](const std::string& yaml, std::initializer_list<std::string> parts) {
    expect_error([&] { test::parse(yaml); }, Status::bad_config, parts);
  };
  bad(text_distribution("      kind: lognormla\n"),
      {"<string>:10:13: data.text.distribution.kind: 'lognormla' is not one of fixed, lognormal or histogram",
       "did you mean 'lognormal'?"});
  bad(text_distribution(
          "      kind: lognormal\n      median: 512\n      sigma: -0.5\n      min: 16\n      max: 4096\n"),
      {"<string>:12:14: data.text.distribution.sigma: must be zero or more (got -0.5)"});
  bad(text_distribution("      kind: lognormal\n      median: 512\n      sigma: 0.5\n      min: 4096\n      max: 16\n"),
      {"<string>:14:12: data.text.distribution.max: max 16 is below min 4096"});
  bad(text_distribution(
          "      kind: lognormal\n      median: 8000\n      sigma: 0.5\n      min: 16\n      max: 4096\n"),
      {"<string>:11:15: data.text.distribution.median: median 8000 lies outside [min, max] = [16, 4096]"});
  bad(text_distribution("      kind: lognormal\n      median: 512\n      sigma: 0.5\n      max: 4096\n"),
      {"<string>:10:7: data.text.distribution.min: missing required field 'min'"});
  bad(text_distribution("      kind: histogram\n      values: [64, 256, 1024]\n      weights: [1, 2]\n"),
      {"<string>:12:16: data.text.distribution.weights: 2 weights for 3 values: give one weight per value"});
  bad(text_distribution("      kind: histogram\n      values: [64, 256]\n      weights: [0, 0]\n"),
      {"<string>:12:16: data.text.distribution.weights: the weights sum to 0; at least one must be positive"});
  // Summed past the largest double, every draw landed on the last value.
  bad(text_distribution("      kind: histogram\n      values: [64, 256]\n      weights: [1e308, 1e308]\n"),
      {"<string>:12:16: data.text.distribution.weights: the weights sum to infinity in double precision"});
  bad(text_distribution("      kind: histogram\n      values: [64, 256]\n      weights: [1, -2]\n"),
      {"<string>:12:20: data.text.distribution.weights[1]: a weight must be zero or more (got -2)"});
  bad(text_distribution("      kind: fixed\n      median: 512\n"),
      {"<string>:11:15: data.text.distribution.median: does not apply to a fixed distribution"});
  bad(text_distribution("      kind: histogram\n      values: [64]\n      wieghts: [1]\n"),
      {"<string>:12:7: data.text.distribution.wieghts: unknown field 'wieghts'", "did you mean 'weights'?"});
  // Image sizes live on the encoder's patch grid.
  bad(llava("  image:\n    resolution: 336\n    distribution: {kind: histogram, values: [224, 300], weights: [1, 1]}\n"
            "  text: {tokens: 1472}\n"),
      {"<string>:8:51: data.image.distribution.values[1]: 300 is not a multiple of 14 (the patch size of 'vision')"});
  bad(llava("  steps: 0\n  text: {tokens: 1472}\n  image: {resolution: 336}\n"),
      {"<string>:6:10: data.steps: must be at least 1 (got 0)"});
}

// ---- per-sample costs ---------------------------------------------------------------------

TEST(SampleCost, MatchesTheCostModelAtGridSizesAndInterpolatesBetween) {
  const auto run =
      test::parse(llava("  image:\n    resolution: 336\n"
                        "    distribution: {kind: lognormal, median: 280, sigma: 0.5, min: 224, max: 672}\n"
                        "  text:\n    tokens: 1472\n"
                        "    distribution: {kind: lognormal, median: 512, sigma: 1, min: 16, max: 4096}\n"));
  const data::SampleCost pricing(run);
  const int llm = run.model.index_of("llm"), vision = run.model.index_of("vision");
  // The exact cost model for one sample of the given sizes.
  auto exact = [&](int image, int text, int m) {
    spec::RunSpec copy = run;
    copy.data.image_resolution = image;
    copy.data.text_tokens = text;
    const cost::CostModel cost(copy);
    const auto& c = cost.module(m, 1, 1);
    const auto all = c.stage(c.layers, true, true);
    return all.forward_time() + all.backward_time();
  };
  const auto nominal = data::nominal_sizes(run.data);
  EXPECT_DOUBLE_EQ(pricing.module_seconds(llm, nominal), exact(336, 1472, llm));
  EXPECT_DOUBLE_EQ(pricing.nominal_seconds(vision), exact(336, 1472, vision));
  // Every image size is on the grid (49 patch multiples): exact.
  data::SampleSizes s = nominal;
  s.image_resolution = 490;
  EXPECT_NEAR(pricing.module_seconds(vision, s) / exact(490, 1472, vision), 1, 1e-12);
  // The llm sees text + image tokens at once; text lengths between grid points.
  for (int text : {17, 333, 1000, 2999, 4096}) {
    s.text_tokens = text;
    EXPECT_NEAR(pricing.module_seconds(llm, s) / exact(490, text, llm), 1, 0.01) << text;
  }
  // Larger samples cost more.
  data::SampleSizes small = nominal, large = nominal;
  small.text_tokens = 64;
  large.text_tokens = 4096;
  EXPECT_LT(pricing.module_seconds(llm, small), pricing.module_seconds(llm, nominal));
  EXPECT_GT(pricing.module_seconds(llm, large), pricing.module_seconds(llm, nominal));
  EXPECT_EQ(pricing.module_seconds(vision, small), pricing.module_seconds(vision, large));
}

// ---- intra-microbatch: LPT ---------------------------------------------------------------

// The optimum max load over every assignment with equal counts, by enumeration.
double best_max_load(const std::vector<double>& costs, int ranks) {
  const int n = static_cast<int>(costs.size()), room = n / ranks;
  std::vector<double> load(ranks, 0);
  std::vector<int> count(ranks, 0);
  double best = 1e300;
  std::function<void(int, int)> place = [&](int i, int used) {
    if (i == n) {
      best = std::min(best, *std::max_element(load.begin(), load.end()));
      return;
    }
    for (int r = 0; r < std::min(used + 1, ranks); ++r) {  // ranks are interchangeable: open them in order
      if (count[r] == room || load[r] + costs[i] >= best) continue;
      load[r] += costs[i];
      ++count[r];
      place(i + 1, std::max(used, r + 1));
      load[r] -= costs[i];
      --count[r];
    }
  };
  place(0, 0);
  return best;
}

TEST(Reorder, LptGivesEqualCountsAndIsDeterministic) {
  std::mt19937_64 rng(1);
  std::lognormal_distribution<double> size(0, 1);
  std::vector<double> costs(1200);
  for (auto& c : costs) c = size(rng);
  for (int ranks : {1, 4, 12, 100}) {
    const auto a = data::assign_lpt(costs, ranks), b = data::assign_lpt(costs, ranks);
    EXPECT_EQ(a.rank, b.rank);
    std::vector<int> count(ranks, 0);
    for (int r : a.rank) ++count[r];
    for (int c : count) EXPECT_EQ(c, 1200 / ranks);
    const auto before = data::straggler(data::assign_in_order(costs, ranks).load);
    const auto after = data::straggler(a.load);
    EXPECT_LE(after.ratio, before.ratio);
    if (ranks > 1 && ranks < 100) {
      EXPECT_LT(after.ratio, 1.01) << ranks;
    }
  }
  // Ties: by sample index, then by rank index; equal costs deal round robin.
  const std::vector<double> equal(6, 1.0);
  EXPECT_EQ(data::assign_lpt(equal, 3).rank, (std::vector<int>{0, 1, 2, 0, 1, 2}));
  EXPECT_EQ(data::assign_in_order(equal, 3).rank, (std::vector<int>{0, 0, 1, 1, 2, 2}));
  expect_error([&] { data::assign_lpt(equal, 4); }, Status::invalid_argument,
               {"6 samples do not split equally over 4 ranks"});
  expect_error(
      [&] {
        data::assign_lpt(std::vector<double>{1, NAN}, 2);
      },
      Status::invalid_argument, {"sample 1 is not a finite non-negative number"});
}

TEST(Reorder, LptIsWithinFourThirdsOfTheOptimum) {
  std::mt19937_64 rng(2);
  std::lognormal_distribution<double> heavy(0, 1.2);
  std::uniform_real_distribution<double> flat(1, 10);
  double worst = 1;
  int cases = 0;
  for (auto [n, ranks] : {std::pair{8, 2}, {8, 4}, {9, 3}, {12, 3}, {12, 4}}) {
    for (int trial = 0; trial < 60; ++trial) {
      std::vector<double> costs(n);
      for (auto& c : costs) c = trial % 2 ? heavy(rng) : flat(rng);
      const auto lpt = data::assign_lpt(costs, ranks);
      const double ratio = *std::max_element(lpt.load.begin(), lpt.load.end()) / best_max_load(costs, ranks);
      EXPECT_LE(ratio, 4.0 / 3.0 + 1e-12) << n << " samples on " << ranks << " ranks, trial " << trial;
      worst = std::max(worst, ratio);
      ++cases;
    }
  }
  RecordProperty("worst_lpt_over_optimum", std::to_string(worst));
  std::printf("LPT vs brute force over %d cases: worst max load %.4f x the optimum\n", cases, worst);
}

TEST(Reorder, UnequalWidthsShareTheLcmGrid) {
  // Encoder DP 4, llm DP 6: 12 cells; encoder ranks take 3 consecutive cells, llm ranks 2.
  const std::vector<int> widths{4, 6};
  const auto grid = data::cell_grid(widths);
  EXPECT_EQ(grid.cells, 12);
  EXPECT_EQ(grid.groups, 2);
  EXPECT_EQ(grid.rank_of(5, 4), 1);
  EXPECT_EQ(grid.rank_of(5, 6), 2);
  EXPECT_EQ(grid.group_of(5), 0);
  EXPECT_EQ(grid.group_of(6), 1);
  std::mt19937_64 rng(3);
  std::lognormal_distribution<double> size(0, 1);
  std::vector<double> costs(240);
  for (auto& c : costs) c = size(rng);
  const auto cells = data::assign_lpt(costs, grid.cells);
  for (int dp : widths) {
    std::vector<int> count(dp, 0);
    std::vector<double> load(dp, 0), before(dp, 0);
    for (std::size_t i = 0; i < costs.size(); ++i) {
      ++count[grid.rank_of(cells.rank[i], dp)];
      load[grid.rank_of(cells.rank[i], dp)] += costs[i];
      before[static_cast<int>(i) / (240 / dp)] += costs[i];
    }
    for (int c : count) EXPECT_EQ(c, 240 / dp);
    EXPECT_LT(data::straggler(load).ratio, data::straggler(before).ratio);
    EXPECT_LT(data::straggler(load).ratio, 1.02);
  }
  expect_error(
      [&] {
        data::cell_grid(std::vector<int>{4, 0});
      },
      Status::invalid_argument, {"a data-parallel width must be at least 1"});
}

TEST(Reorder, MicrobatchesSplitEachRankInSampleOrder) {
  data::RankAssignment a;
  a.ranks = 2;
  a.rank = {1, 0, 0, 1, 1, 0, 0, 1};
  EXPECT_EQ(data::split_microbatches(a, 2), (std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1}));
  expect_error([&] { data::split_microbatches(a, 3); }, Status::invalid_argument,
               {"the 4 samples of a rank do not split into 3 equal microbatches"});
}

// ---- inter-microbatch: the 1F1B recurrence and the order search ------------------------------

PipelineTimes random_pipeline(std::mt19937_64& rng, int stages, int m, bool sends) {
  std::lognormal_distribution<double> size(0, 0.6);
  std::uniform_real_distribution<double> stage_weight(0.5, 1.5), send(0, 0.1);
  PipelineTimes t;
  t.stages = stages;
  t.microbatches = m;
  std::vector<double> mb(m), encoder(m);
  for (auto& x : mb) x = size(rng);
  for (auto& x : encoder) x = size(rng);
  for (int s = 0; s < stages; ++s) {
    const double w = stage_weight(rng);
    for (int k = 0; k < m; ++k) {
      // The first stage prices a different modality than the rest (an encoder).
      const double load = s == 0 ? encoder[k] : mb[k];
      t.forward.push_back(w * load);
      t.backward.push_back(2 * w * load);
    }
    t.send_activation.push_back(sends ? send(rng) : 0);
    t.send_grad.push_back(sends ? send(rng) : 0);
    t.tail.push_back(sends ? 3 * send(rng) : 0);  // a gradient reduction and optimizer step
  }
  return t;
}

// The same pipeline as a program: one work unit per microbatch, 1F1B, through the simulator.
double simulated_step(const PipelineTimes& t, const std::vector<int>& order) {
  pipeline::Program p;
  for (int s = 0; s < t.stages; ++s) {
    pipeline::StageProgram st;
    st.name = "stage " + std::to_string(s);
    st.depth = s;
    st.send_activation_s = t.send_activation[s];
    st.send_grad_s = t.send_grad[s];
    st.optimizer_s = t.tail.empty() ? 0 : t.tail[s];
    for (int k = 0; k < t.microbatches; ++k) {
      pipeline::WorkUnit u;
      u.forward_s = t.f(s, order[k]);
      u.backward_s = t.b(s, order[k]);
      st.units.push_back(u);
    }
    if (s > 0) st.prev.push_back(s - 1);
    if (s + 1 < t.stages) st.next.push_back(s + 1);
    p.stages.push_back(st);
  }
  pipeline::one_f_one_b(p, t.microbatches);
  pipeline::finish_step(p);  // each stage's gradient reduction and optimizer step: its tail
  for (auto& st : p.stages) {
    for (auto& i : st.instructions) {
      if (i.op == pipeline::Op::forward || i.op == pipeline::Op::backward) i.unit = i.microbatch;
    }
  }
  return sim::simulate(p).step_time_s;
}

TEST(MicrobatchOrder, StepRecurrenceEqualsTheSimulator) {
  std::mt19937_64 rng(4);
  for (int trial = 0; trial < 40; ++trial) {
    const int stages = 1 + trial % 6, m = 1 + (trial * 7) % 12;
    const auto t = random_pipeline(rng, stages, m, trial % 3 != 0);
    std::vector<int> order(m);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    const double mine = data::one_f_one_b_step(t, order), sim = simulated_step(t, order);
    EXPECT_NEAR(mine, sim, 1e-9 * sim) << stages << " stages, " << m << " microbatches";
  }
  // A stage's tail ends the step when it is the last to finish: the order search must see it
  // (it kept a microbatch order that finished the llm later to finish the encoder earlier).
  PipelineTimes tails{2, 2, {1.0, 1.0, 1.0, 1.0}, {2.0, 2.0, 2.0, 2.0}, {0.0, 0.0}, {0.0, 0.0}, {0.0, 5.0}};
  EXPECT_DOUBLE_EQ(data::one_f_one_b_step(tails, std::vector<int>{0, 1}), simulated_step(tails, {0, 1}));
  // Uniform stages without sends: the closed form (m + p - 1)(f + b).
  PipelineTimes u{4, 8, std::vector<double>(32, 1.0), std::vector<double>(32, 2.0), {}, {}, {}};
  std::vector<int> order(8);
  std::iota(order.begin(), order.end(), 0);
  EXPECT_DOUBLE_EQ(data::one_f_one_b_step(u, order), (8 + 4 - 1) * 3.0);
  expect_error(
      [&] {
        data::one_f_one_b_step(u, std::vector<int>{0, 1, 2});
      },
      Status::invalid_argument, {"an order must list each of the 8 microbatches once"});
}

TEST(MicrobatchOrder, SearchIsNearExhaustiveAndNeverWorseThanTheInput) {
  std::mt19937_64 rng(5);
  double worst_gap = 0, sum_gap = 0, sum_gain = 0;
  int cases = 0;
  for (int m = 3; m <= 7; ++m) {
    for (int stages : {2, 4, 6}) {
      for (int trial = 0; trial < 4; ++trial) {
        const auto t = random_pipeline(rng, stages, m, trial % 2 == 1);
        const auto best = data::best_order_exhaustive(t);
        const auto found = data::order_microbatches(t);
        EXPECT_LE(found.step_s, found.input_step_s);
        EXPECT_DOUBLE_EQ(found.step_s, data::one_f_one_b_step(t, found.order));
        EXPECT_GE(found.step_s, best.step_s * (1 - 1e-12));
        const double gap = found.step_s / best.step_s - 1;
        EXPECT_LE(gap, 0.02) << m << " microbatches, " << stages << " stages";
        worst_gap = std::max(worst_gap, gap);
        sum_gap += gap;
        sum_gain += 1 - found.step_s / found.input_step_s;
        ++cases;
      }
    }
  }
  RecordProperty("worst_gap", std::to_string(worst_gap));
  std::printf(
      "inter order vs exhaustive over %d cases (m <= 7): mean gap %.3f%%, worst %.3f%%; mean gain over "
      "the input order %.2f%%\n",
      cases, 100 * sum_gap / cases, 100 * worst_gap, 100 * sum_gain / cases);
}

// ---- on plans ----------------------------------------------------------------------------------

TEST(DataReport, HomogeneousRunsAreEqualInEveryVariant) {
  const auto run = test::parse(llava("  image: {resolution: 336}\n  text: {tokens: 1472}\n  steps: 2\n"));
  const cost::CostModel cost(run);
  const auto plan = orchestrate::make_plan(cost, plan::PlanRequest{plan::Strategy::disttrain, {}, {}}).best;
  const auto rep = data::data_report(cost, plan, orchestrate::build_program(cost, plan));
  EXPECT_FALSE(rep.heterogeneous);
  ASSERT_EQ(rep.steps.size(), 2u);
  for (int v = 0; v < 3; ++v) {
    EXPECT_NEAR(rep.mean.step_time_s[v], rep.nominal_step_time_s, 1e-9 * rep.nominal_step_time_s);
    EXPECT_NEAR(rep.mean.straggler[v].straggler.ratio, 1, 1e-12);
  }
}

TEST(DataReport, ReorderingShortensSkewedSteps) {
  for (auto strategy : {plan::Strategy::disttrain, plan::Strategy::megatron}) {
    SCOPED_TRACE(plan::strategy_name(strategy));
    const auto run = test::parse(llava(kSkewed + "  steps: 3\n"));
    const cost::CostModel cost(run);
    const auto plan = orchestrate::make_plan(cost, plan::PlanRequest{strategy, {}, {}}).best;
    int calls = 0;
    const auto rep = data::data_report(cost, plan, orchestrate::build_program(cost, plan), [&](int done, int total) {
      EXPECT_EQ(done, ++calls);
      EXPECT_EQ(total, 3);
    });
    EXPECT_EQ(calls, 3);
    EXPECT_TRUE(rep.heterogeneous);
    EXPECT_TRUE(rep.inter_ordered);
    EXPECT_LT(rep.mean.straggler[1].straggler.ratio, rep.mean.straggler[0].straggler.ratio);
    EXPECT_LT(rep.mean.step_time_s[1], rep.mean.step_time_s[0]);
    EXPECT_LE(rep.mean.step_time_s[2], rep.mean.step_time_s[1] * (1 + 1e-3));
    for (const auto& s : rep.steps) EXPECT_LE(s.step_time_s[2], s.step_time_s[0]);
  }
}

TEST(DataReport, ArrangementsKeepEveryRanksShareAndPermuteOnlyWithinAGroup) {
  // A chain whose encoder has twice the llm's DP width: 8 cells, 4 pipeline groups.
  const auto run = test::parse(llava(kSkewed, "{global_batch: 64, microbatch: 2}"));
  const cost::CostModel cost(run);
  const auto fixed = plan::parse_plan_text(
      "layout: chain\nmodules:\n"
      "  - {name: vision, tp: 1, pp: 1, dp: 8, first_device: 16, microbatch_size: 1}\n"
      "  - {name: projector, tp: 1, pp: 1, dp: 8, first_device: 16, microbatch_size: 1}\n"
      "  - {name: llm, tp: 2, pp: 2, dp: 4, first_device: 0, microbatch_size: 2}\n",
      run);
  const auto plan = orchestrate::make_plan(cost, plan::PlanRequest{plan::Strategy::fixed, {}, fixed}).best;
  const auto program = orchestrate::build_program(cost, plan);
  const auto layout = data::batch_layout(run, plan, program, 64);
  EXPECT_EQ(layout.grid.cells, 8);
  EXPECT_EQ(layout.grid.groups, 4);
  EXPECT_EQ(layout.slots, 8);
  EXPECT_EQ(layout.cell_slot, 1);
  const data::SampleCost pricing(run);
  const auto batch = data::draw_batch(run.data, 64, 0);
  const auto costs = pricing.batch_costs(batch);
  std::vector<double> nominal;
  for (int m = 0; m < pricing.modules(); ++m) nominal.push_back(pricing.nominal_seconds(m));
  const auto intra = data::arrange(layout, program, costs, nominal, data::Reordering::intra);
  const auto inter = data::arrange(layout, program, costs, nominal, data::Reordering::intra_inter);
  EXPECT_EQ(intra.cell, inter.cell);
  // Each (cell, slot) holds one sample; an llm replica's slot k joins its two cells' slot k.
  std::set<std::pair<int, int>> seen;
  for (std::size_t i = 0; i < 64; ++i) EXPECT_TRUE(seen.emplace(inter.cell[i], inter.slot[i]).second);
  for (std::size_t g = 0; g < inter.orders.size(); ++g) {
    auto sorted = inter.orders[g];
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  }
  // The loads the simulator sees: vision replicas (8) and llm replicas (4), 8 slots each.
  const auto scales = data::work_scales(layout, program, costs, nominal, inter);
  for (std::size_t s = 0; s < program.stages.size(); ++s)
    EXPECT_EQ(scales[s].size(), std::size_t(program.stages[s].replicas * 8)) << program.stages[s].name;
  auto scaled = program;
  for (std::size_t s = 0; s < scaled.stages.size(); ++s) scaled.stages[s].work_scale = scales[s];
  const auto ordered = sim::simulate(scaled);
  EXPECT_GT(ordered.step_time_s, 0);
  // Inter ordering only permutes each pipeline's microbatches: every stage does the same
  // work as with intra alone, so whatever it saves is idle time.
  const auto intra_scales = data::work_scales(layout, program, costs, nominal, intra);
  for (std::size_t s = 0; s < scaled.stages.size(); ++s) scaled.stages[s].work_scale = intra_scales[s];
  const auto unordered = sim::simulate(scaled);
  ASSERT_EQ(ordered.stages.size(), unordered.stages.size());
  for (std::size_t s = 0; s < ordered.stages.size(); ++s) {
    EXPECT_NEAR(ordered.stages[s].busy_s, unordered.stages[s].busy_s, 1e-9 * unordered.stages[s].busy_s)
        << ordered.stages[s].name;
  }
}

}  // namespace
}  // namespace braid
