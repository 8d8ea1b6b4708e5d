// braid_bubble_scheduler_*: the Optimus bubble scheduler of a colocated plan, its
// report, and its scheduled programs as braid_program handles.
#include <algorithm>
#include <array>
#include <cstddef>
#include <memory>
#include <string>

#include "capi/src/guard.hpp"
#include "capi/src/handles.hpp"

namespace {

std::string schedule_choices() {
  std::string out;
  for (auto s : braid::bubble::colocated_schedules())
    out += (out.empty() ? "'" : ", '") + std::string(braid::spec::schedule_name(s)) + "'";
  return out;
}

void copy_bubbles(const std::array<double, braid::sim::kCauseCount>& from, double (&to)[BRAID_BUBBLE_COUNT]) {
  static_assert(BRAID_BUBBLE_COUNT == braid::sim::kCauseCount);  // same order: checked in pipeline.cpp
  for (std::size_t c = 0; c < from.size(); ++c) to[c] = from[c];
}

}  // namespace

extern "C" {

BRAID_API braid_status braid_bubble_scheduler_create(const braid_plan* plan, braid_bubble_scheduler** out) {
  BRAID_API_BEGIN
  BRAID_REQUIRE(out, "out is NULL");
  *out = nullptr;
  BRAID_REQUIRE_HANDLE(plan, braid_plan);
  const auto& chosen = plan->result.best;
  if (chosen.layout != braid::plan::Layout::colocated) {
    throw braid::Error(braid::Status::unsupported,
                       std::string("the bubble scheduler takes a colocated plan (strategy optimus); this plan is ") +
                           braid::plan::layout_name(chosen.layout) + " (strategy " +
                           braid::plan::strategy_name(chosen.strategy) + ")");
  }
  auto scheduler = std::make_unique<braid_bubble_scheduler>();
  scheduler->config = plan->config;
  scheduler->plan = chosen;
  *out = scheduler.release();
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_bubble_scheduler_destroy(braid_bubble_scheduler* scheduler) {
  return braid::capi::destroy_handle(scheduler, __func__, "braid_bubble_scheduler");
}

BRAID_API braid_status braid_bubble_scheduler_run(braid_bubble_scheduler* scheduler) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(scheduler, braid_bubble_scheduler);
  std::lock_guard<std::mutex> lock(scheduler->mutex);
  if (scheduler->schedules) return BRAID_OK;
  scheduler->schedules =
      std::make_unique<braid::bubble::Schedules>(braid::bubble::schedule(*scheduler->config->cost, scheduler->plan));
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_bubble_scheduler_report(const braid_bubble_scheduler* scheduler,
                                                     braid_bubble_report* report) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(scheduler, braid_bubble_scheduler);
  // Version 1 ends before the fields "Added later".
  BRAID_REQUIRE_STRUCT(report, braid_bubble_report, offsetof(braid_bubble_report, llm_step_s));
  std::lock_guard<std::mutex> lock(scheduler->mutex);
  BRAID_REQUIRE(scheduler->schedules, "the scheduler has not run yet; call braid_bubble_scheduler_run first");
  const auto& r = scheduler->schedules->report;
  braid_bubble_report v = BRAID_BUBBLE_REPORT_INIT;
  v.plain_step_s = r.plain_step_s;
  v.coarse_step_s = r.coarse_step_s;
  v.fine_step_s = r.fine_step_s;
  v.recovered_coarse = r.recovered_coarse;
  v.recovered_fine = r.recovered_fine;
  copy_bubbles(r.bubbles_before, v.bubbles_before_s);
  copy_bubbles(r.bubbles_after, v.bubbles_after_s);
  v.scheduler_time_s = r.scheduler_time_s;
  v.placements = r.rounds;
  v.encoder_tasks = r.encoder_tasks;
  v.tp_bubble_tasks = r.tp_bubble_tasks;
  v.dp_wait_tasks = r.dp_wait_tasks;
  v.llm_step_s = r.llm_step_s;
  v.llm_idle_s = r.llm_idle_s;
  v.encoder_s = r.encoder_s;
  for (const auto& [share, out] :
       {std::pair{&r.bubble_filled, v.bubble_filled}, {&r.encoder_hidden, v.encoder_hidden}}) {
    out[0] = share->plain;
    out[1] = share->coarse;
    out[2] = share->fine;
  }
  braid::capi::copy_out(v, report);
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_bubble_scheduler_program(const braid_bubble_scheduler* scheduler, const char* schedule,
                                                      braid_program** out) {
  BRAID_API_BEGIN
  BRAID_REQUIRE(out, "out is NULL");
  *out = nullptr;
  BRAID_REQUIRE_HANDLE(scheduler, braid_bubble_scheduler);
  const auto schedules = braid::bubble::colocated_schedules();
  const std::string name = schedule && *schedule ? schedule : braid::spec::schedule_name(schedules.front());
  const auto parsed = braid::spec::parse_schedule(name);
  BRAID_REQUIRE(parsed && std::find(schedules.begin(), schedules.end(), *parsed) != schedules.end(),
                "schedule '" + name + "' is not one of the bubble scheduler's: " + schedule_choices());
  std::lock_guard<std::mutex> lock(scheduler->mutex);
  BRAID_REQUIRE(scheduler->schedules, "the scheduler has not run yet; call braid_bubble_scheduler_run first");
  *out = braid::capi::make_program(braid::bubble::program_named(*scheduler->schedules, *parsed), scheduler->plan)
             .release();
  return BRAID_OK;
  BRAID_API_END
}

}  // extern "C"
