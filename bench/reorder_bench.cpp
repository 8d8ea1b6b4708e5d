// Data-reordering benchmark (DistTrain):
//  1. intra-microbatch reordering (LPT with equal counts) of 1M samples over 1024 DP
//     ranks, priced by the cost model from the 72B MLLM run's skewed size
//     distributions: its run time against the goal (under 1 s) and against a plain
//     sort of the same costs (the bound any LPT pays), and the straggler it removes;
//  2. the disttrain plan of the 72B MLLM run simulated step by step with no
//     reordering, intra only, and intra + inter (what `braid simulate --data` reports).
//
// usage: reorder_bench [--quick]   (quick: 64k samples, and the 72B report's first steps)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/quick_flag.hpp"
#include "core/data/dataset.hpp"
#include "core/data/reorder.hpp"
#include "core/data/sample_cost.hpp"
#include "core/data/step_report.hpp"
#include "core/orchestrate/planning.hpp"
#include "core/orchestrate/program.hpp"

namespace {

using namespace braid;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Each sample's cost summed over the modules: one DP rank runs all of them.
std::vector<double> total_costs(const spec::RunSpec& run, long long samples) {
  const auto sizes = data::draw_batch(run.data, samples, 0);
  spec::RunSpec priced = run;
  priced.data = data::covering(run.data, sizes);
  const data::SampleCost pricing(priced);
  const auto per_module = pricing.batch_costs(sizes);
  const auto M = static_cast<std::size_t>(pricing.modules());
  std::vector<double> out(sizes.size(), 0);
  for (std::size_t i = 0; i < out.size(); ++i) {
    for (std::size_t m = 0; m < M; ++m) out[i] += per_module[i * M + m];
  }
  return out;
}

bool lpt_figures(const spec::RunSpec& run, long long samples, int ranks) {
  const auto costs = total_costs(run, samples);
  auto t0 = std::chrono::steady_clock::now();
  const auto lpt = data::assign_lpt(costs, ranks);
  const auto microbatch = data::split_microbatches(lpt, static_cast<int>(samples / ranks));
  const double took = seconds_since(t0);
  std::vector<double> sorted = costs;
  t0 = std::chrono::steady_clock::now();
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  const double sort_s = seconds_since(t0);
  const auto in_order = data::assign_in_order(costs, ranks);
  const auto before = data::straggler(in_order.load), after = data::straggler(lpt.load);
  std::printf("intra-microbatch reordering: %lld samples over %d DP ranks (%zu microbatch slots)\n", samples, ranks,
              microbatch.size() / static_cast<std::size_t>(ranks));
  std::printf("  LPT assignment    %8.3f s   goal < 1 s: %s\n", took, took < 1 ? "met" : "MISSED");
  std::printf("  sort of the costs %8.3f s   LPT / sort = %.1fx\n", sort_s, took / sort_s);
  std::printf("  straggler (max/mean rank load): dataset order %.3fx, LPT %.4fx\n\n", before.ratio, after.ratio);
  return took < 1;
}

void disttrain_figures(const spec::RunSpec& run, bool quick) {
  spec::RunSpec r = run;
  if (quick) r.data.steps = std::min<long long>(r.data.steps, 2);
  const cost::CostModel cost(r);
  plan::PlanRequest req;
  req.strategy = plan::Strategy::disttrain;
  const plan::Plan plan = orchestrate::make_plan(cost, req).best;
  const auto program = orchestrate::build_program(cost, plan);
  const auto report = data::data_report(cost, plan, program);
  std::printf("disttrain on %d devices, %lld samples per step, %zu steps (simulated step, s)\n", plan.devices,
              report.samples, report.steps.size());
  std::printf("  %-6s %10s %10s %12s %16s %16s\n", "step", "none", "intra", "intra+inter", "intra/none",
              "intra+inter/none");
  auto row = [](const char* name, const data::StepData& s) {
    std::printf("  %-6s %10.3f %10.3f %12.3f %15.3fx %15.3fx\n", name, s.step_time_s[0], s.step_time_s[1],
                s.step_time_s[2], s.step_time_s[1] / s.step_time_s[0], s.step_time_s[2] / s.step_time_s[0]);
  };
  for (const auto& s : report.steps) row(std::to_string(s.step).c_str(), s);
  row("mean", report.mean);
  std::printf("  nominal sizes (the planner's assumption): %.3f s; report took %.2f s\n\n", report.nominal_step_time_s,
              report.seconds);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = bench::quick_flag(argc, argv, "reorder_bench");
  try {
    const spec::RunSpec run = spec::load_run("configs/runs/mllm-72b-1024gpu.yaml");
    std::printf("braid data-reordering benchmark (configs/runs/mllm-72b-1024gpu.yaml sizes)\n\n");
    const bool met = lpt_figures(run, quick ? 1LL << 16 : 1LL << 20, 1024);
    disttrain_figures(run, quick);
    return met || quick ? 0 : 1;  // the quick ctest entry asserts no wall-clock bound
  } catch (const std::exception& e) {
    std::fprintf(stderr, "reorder_bench: %s\n", e.what());
    return 1;
  }
}
