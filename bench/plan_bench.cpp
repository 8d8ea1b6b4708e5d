// Planner benchmark: time and peak heap of `auto` planning for the 3072-GPU
// ViT-22B + GPT-175B run (goal: under 1 s and 200 MB on a 2-core machine), and the
// planner's searches against the brute-force searches they replace, side by side
// in one run on the same model at sizes where brute force finishes.
//
// usage: plan_bench [--quick] [--format table|json] [--config RUN.yaml]
#include <malloc.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "bench/quick_flag.hpp"
#include "core/orchestrate/planning.hpp"
#include "core/plan/brute_force.hpp"

// ---- heap accounting: every operator new/delete of this process --------------------
namespace {
std::atomic<long long> heap_now{0}, heap_peak{0};
void note_alloc(void* p) {
  long long now = heap_now += static_cast<long long>(malloc_usable_size(p));
  long long peak = heap_peak.load();
  while (now > peak && !heap_peak.compare_exchange_weak(peak, now)) {
  }
}
}  // namespace

void* operator new(std::size_t n) {
  void* p = std::malloc(n ? n : 1);
  if (!p) throw std::bad_alloc();
  note_alloc(p);
  return p;
}
void operator delete(void* p) noexcept {
  if (!p) return;
  heap_now -= static_cast<long long>(malloc_usable_size(p));
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept { operator delete(p); }

namespace {

using namespace braid;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Runs `fn` and returns the heap it added at its peak, in MiB.
template <class Fn>
double heap_peak_of(Fn&& fn) {
  long long before = heap_now.load();
  heap_peak = before;
  fn();
  return (heap_peak.load() - before) / 1048576.0;
}

struct Comparison {
  int devices;
  std::string strategy;
  double search_s, brute_s, search_mib, brute_mib;
  long long candidates, brute_plans;
  bool brute_finished, same_best;
};

}  // namespace

int run(int argc, char** argv) {
  constexpr const char* kUsage = "usage: plan_bench [--quick] [--format table|json] [--config RUN.yaml]\n";
  bench::exit_on_help(argc, argv, kUsage);
  std::string config = "configs/runs/vit22b-gpt175b-3072gpu.yaml", format = "table";
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick")
      quick = true;
    else if (a == "--format" && i + 1 < argc &&
             (std::string(argv[i + 1]) == "table" || std::string(argv[i + 1]) == "json"))
      format = argv[++i];
    else if (a == "--config" && i + 1 < argc)
      config = argv[++i];
    else {
      std::fprintf(stderr, "%s", kUsage);
      return 2;
    }
  }
  spec::RunSpec run = spec::load_run(config);

  // 1. auto at full size: median of several runs; heap peak of one, from a clean slate.
  std::vector<double> times;
  double best_time = 0, heap_mib = 0;
  std::string winner;
  for (int r = 0; r < (quick ? 1 : 5); ++r) {
    heap_mib = std::max(heap_mib, heap_peak_of([&] {
                          auto t = Clock::now();
                          cost::CostModel cost(run);
                          auto result = orchestrate::make_plan(cost, plan::PlanRequest{});
                          times.push_back(seconds_since(t));
                          best_time = result.best.estimate.iteration_time_s;
                          winner = plan::strategy_name(result.best.strategy);
                        }));
  }
  std::sort(times.begin(), times.end());
  double auto_s = times[times.size() / 2];
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  double rss_mib = usage.ru_maxrss / 1024.0;

  // 2. Search vs brute force on the same model at smaller sizes; at full size brute
  //    force gets a time limit and reports how far it got.
  std::vector<int> sizes = quick ? std::vector<int>{64, 128} : std::vector<int>{64, 128, 256, run.devices()};
  std::vector<Comparison> rows;
  for (int devices : sizes) {
    spec::RunSpec r = run;
    r.cluster.nodes = devices / r.cluster.devices_per_node;
    cost::CostModel cost(r);
    for (auto s :
         {plan::Strategy::megatron, plan::Strategy::distmm, plan::Strategy::disttrain, plan::Strategy::optimus}) {
      if (!plan::strategy_applies(r.model, s, nullptr)) continue;
      plan::SearchStats fast, slow;
      slow.time_limit_s = devices == run.devices() ? (quick ? 5 : 30) : 0;
      std::optional<plan::Plan> a, b;
      double search_s = 0, brute_s = 0;
      double search_mib = heap_peak_of([&] {
        auto t = Clock::now();
        a = plan::search(cost, s, plan::Constraints{}, &fast, nullptr);
        search_s = seconds_since(t);
      });
      double brute_mib = heap_peak_of([&] {
        auto t = Clock::now();
        b = plan::brute_force(cost, s, &slow);
        brute_s = seconds_since(t);
      });
      bool same =
          (!a && !b) || (a && b && std::abs(a->estimate.iteration_time_s / b->estimate.iteration_time_s - 1) < 1e-9);
      rows.push_back({devices, plan::strategy_name(s), search_s, brute_s, search_mib, brute_mib, fast.evaluated,
                      slow.evaluated, !slow.stopped, same || slow.stopped});
    }
  }

  bool all_same = std::all_of(rows.begin(), rows.end(), [](const Comparison& c) { return c.same_best; });
  if (format == "json") {
    std::printf(
        "{\"config\": \"%s\", \"devices\": %d, \"auto_plan_s\": %.6f, \"auto_heap_mib\": %.2f, "
        "\"max_rss_mib\": %.2f, \"winner\": \"%s\", \"iteration_time_s\": %.6f, \"comparisons\": [",
        config.c_str(), run.devices(), auto_s, heap_mib, rss_mib, winner.c_str(), best_time);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto& c = rows[i];
      std::printf(
          "%s{\"devices\": %d, \"strategy\": \"%s\", \"search_s\": %.6f, \"brute_force_s\": %.6f, "
          "\"search_heap_mib\": %.3f, \"brute_force_heap_mib\": %.3f, "
          "\"brute_force_finished\": %s, \"speedup\": %.2f, \"same_best\": %s}",
          i ? ", " : "", c.devices, c.strategy.c_str(), c.search_s, c.brute_s, c.search_mib, c.brute_mib,
          c.brute_finished ? "true" : "false", c.brute_s / std::max(c.search_s, 1e-9), c.same_best ? "true" : "false");
    }
    std::printf("]}\n");
  } else {
    std::printf("braid planner benchmark: %s\n\n", config.c_str());
    std::printf("auto plan on %d devices: %.3f s (median of %zu), peak heap %.1f MiB, max RSS %.1f MiB\n",
                run.devices(), auto_s, times.size(), heap_mib, rss_mib);
    std::printf("  goal: < 1 s and < 200 MB -> %s; winner %s, %.3f s per step\n\n",
                auto_s < 1 && heap_mib < 200 ? "met" : "NOT met", winner.c_str(), best_time);
    std::printf("search vs brute force (same model, cluster sizes below)\n");
    std::printf("  %7s  %-10s %10s %12s %9s %10s %10s %11s %12s  %s\n", "devices", "strategy", "search_s", "brute_s",
                "speedup", "search_MiB", "brute_MiB", "candidates", "brute_plans", "same best plan");
    for (const auto& c : rows) {
      std::printf("  %7d  %-10s %10.4f %11.3f%s %8.1fx %10.2f %10.2f %11lld %12lld  %s\n", c.devices,
                  c.strategy.c_str(), c.search_s, c.brute_s, c.brute_finished ? " " : "+",
                  c.brute_s / std::max(c.search_s, 1e-9), c.search_mib, c.brute_mib, c.candidates, c.brute_plans,
                  c.brute_finished ? (c.same_best ? "yes" : "NO") : "(brute force stopped at the limit)");
    }
    std::printf("  '+': brute force stopped at its time limit, so the ratio is a lower bound\n");
  }
  return all_same ? 0 : 1;
}

int main(int argc, char** argv) { return braid::bench::run_reporting("plan_bench", argc, argv, run); }
