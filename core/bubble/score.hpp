// How the optimus strategy scores a colocated plan: by the simulated step time of
// its fine bubble schedule, the schedule the plan runs with, instead of the closed
// form's encoder-first estimate (which is what the plain schedule costs).
#pragma once

#include <string>
#include <vector>

#include "core/bubble/scheduler.hpp"

namespace braid::bubble {

// Sets the plan's estimate from its fine schedule: step time, throughput, MFU and
// bubble fraction follow the new step time; the note says what the scheduler gained.
void apply(const Report& report, plan::Plan& plan);

// Schedules every candidate and returns the one whose fine schedule is fastest,
// its estimate set by apply(). Candidates the scheduler rejects are skipped; when
// it rejects them all, the first candidate is returned as scored by the closed form
// with a note saying why. `candidates` must not be empty.
plan::Plan best_scheduled(const cost::CostModel& cost, std::vector<plan::Plan> candidates);

}  // namespace braid::bubble
