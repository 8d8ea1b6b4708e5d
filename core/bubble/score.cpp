#include "core/bubble/score.hpp"

#include <algorithm>
#include <cstdio>

#include "core/common/error.hpp"
#include "core/plan/strategies.hpp"

namespace braid::bubble {

void apply(const Report& report, plan::Plan& plan) {
  auto& e = plan.estimate;
  const double before = e.iteration_time_s, after = report.fine_step_s;
  if (before <= 0 || after <= 0) return;
  const double speedup = before / after;
  // The work is the same; only the time it takes changes.
  e.samples_per_s *= speedup;
  e.tflops_per_device *= speedup;
  e.mfu *= speedup;
  e.bubble_fraction = std::max(0.0, 1 - (1 - e.bubble_fraction) * speedup);  // busy / (D T): T shrinks
  e.encoder_exposed_s = std::max(0.0, e.encoder_exposed_s - (before - after));
  e.iteration_time_s = after;
  char note[320];
  std::snprintf(note, sizeof note,
                "optimus step time is the bubble scheduler's fine schedule (simulated): %.4f s; encoder-first %.4f s, "
                "coarse %.4f s; %.0f%% of the encoder-first idle time recovered",
                report.fine_step_s, report.plain_step_s, report.coarse_step_s, 100 * report.recovered_fine);
  plan.notes.push_back(note);
}

plan::Plan best_scheduled(const cost::CostModel& cost, std::vector<plan::Plan> candidates) {
  if (candidates.empty()) throw Error(Status::internal, "bubble::best_scheduled: no candidates");
  int best = -1;
  std::string first_reason;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    try {
      apply(schedule(cost, candidates[i]).report, candidates[i]);
    } catch (const Error& e) {
      if (first_reason.empty()) first_reason = e.what();
      continue;
    }
    if (best < 0 || plan::better(candidates[i], candidates[static_cast<std::size_t>(best)])) {
      best = static_cast<int>(i);
    }
  }
  if (best < 0) {
    plan::Plan plan = std::move(candidates.front());
    plan.notes.push_back(
        "optimus step time is the closed form's encoder-first estimate: the bubble scheduler "
        "could not schedule the plan (" +
        first_reason + ")");
    return plan;
  }
  return std::move(candidates[static_cast<std::size_t>(best)]);
}

}  // namespace braid::bubble
