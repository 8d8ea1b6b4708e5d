// Simulation benchmark: one full training step of every strategy's plan for the
// 3072-GPU ViT-22B + GPT-175B run, all devices (each simulated rank is a DP replica
// of a stage; its TP devices run in lock step). Goal: under 1 s per simulation on a
// 2-core machine; prints events per second and the simulated step time against the
// planner's closed form.
//
// usage: simulate_bench [--quick] [--config RUN.yaml]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/quick_flag.hpp"
#include "core/orchestrate/planning.hpp"
#include "core/orchestrate/program.hpp"
#include "core/sim/simulator.hpp"

int run(int argc, char** argv) {
  using namespace braid;
  constexpr const char* kUsage = "usage: simulate_bench [--quick] [--config RUN.yaml]\n";
  bench::exit_on_help(argc, argv, kUsage);
  std::string config = "configs/runs/vit22b-gpt175b-3072gpu.yaml";
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
    } else if (a == "--config" && i + 1 < argc) {
      config = argv[++i];
    } else {
      std::fprintf(stderr, "%s", kUsage);
      return 2;
    }
  }
  const spec::RunSpec run = spec::load_run(config);
  const cost::CostModel cost(run);
  std::printf("braid simulation benchmark: %s (%d devices)\n\n", config.c_str(), run.devices());
  std::printf("  %-10s %-12s %7s %9s %10s %10s %12s %11s %9s\n", "strategy", "schedule", "ranks", "events", "build_s",
              "simulate_s", "events/s", "step_s", "vs plan");
  bool met = true;
  for (auto s :
       {plan::Strategy::megatron, plan::Strategy::disttrain, plan::Strategy::optimus, plan::Strategy::distmm}) {
    if (!plan::strategy_applies(run.model, s, nullptr)) continue;
    auto result = orchestrate::make_plan(cost, plan::PlanRequest{s, {}, {}});
    std::vector<double> build, simulate;
    sim::Result r;
    pipeline::Program program;
    for (int rep = 0; rep < (quick ? 1 : 5); ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      program = orchestrate::build_program(cost, result.best);
      auto t1 = std::chrono::steady_clock::now();
      r = sim::simulate(program);
      auto t2 = std::chrono::steady_clock::now();
      build.push_back(std::chrono::duration<double>(t1 - t0).count());
      simulate.push_back(std::chrono::duration<double>(t2 - t1).count());
    }
    std::sort(build.begin(), build.end());
    std::sort(simulate.begin(), simulate.end());
    const double b = build[build.size() / 2], t = simulate[simulate.size() / 2];
    met = met && b + t < 1.0;
    std::printf("  %-10s %-12s %7d %9lld %10.4f %10.4f %12.3g %11.3f %+8.2f%%\n", plan::strategy_name(s),
                spec::schedule_name(program.schedule), r.ranks, r.events, b, t, r.events / std::max(t, 1e-9),
                r.step_time_s, 100 * (r.step_time_s / result.best.estimate.iteration_time_s - 1));
  }
  std::printf("\n  medians of %d runs; goal: build + simulate under 1 s -> %s\n", quick ? 1 : 5,
              met ? "met" : "NOT met");
  return 0;
}

int main(int argc, char** argv) { return braid::bench::run_reporting("simulate_bench", argc, argv, run); }
