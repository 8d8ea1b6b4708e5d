// The schedules a pipeline program runs: one enumeration for the planner, the program
// generators, the bubble scheduler, the simulator and the runtime. Their names are what
// people write and read (run and plan files, --schedule, the C ABI, JSON, traces); a
// string becomes a Schedule only where it enters braid (parse_schedule).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace braid::spec {

enum class Schedule {
  one_f_one_b,     // 1f1b: Megatron's warm-up, one forward one backward, cool-down
  interleaved,     // interleaved: 1F1B over virtual stages (model chunks per device)
  gpipe,           // gpipe: every forward, then every backward
  batch_sync,      // batch-sync: per contrastive group K forwards, BatchSync, K backwards
  distmm_pipe,     // distmm-pipe: group g+1's forwards interleave with group g's backwards
  two_phase,       // two-phase: forwards without activations, BatchSync, recompute + backward
  optimus_fine,    // optimus-fine: encoder kernels in every llm bubble, TP waits included
  optimus_coarse,  // optimus-coarse: encoder work in the llm's warm-up and cool-down bubbles
  encoder_first,   // encoder-first: encoder forwards before the llm, backwards after
  optimus_online,  // optimus-online: the fine program, waits also filled online
};

// Every schedule, in declaration order.
const std::vector<Schedule>& all_schedules();
// Its name ("1f1b", "distmm-pipe", ...); static storage, so the pointer stays valid.
const char* schedule_name(Schedule s);
// The schedule a name names, or nullopt.
std::optional<Schedule> parse_schedule(std::string_view name);
// The names of `schedules`, in order (for messages: join_choices).
std::vector<std::string> schedule_names(const std::vector<Schedule>& schedules);
// The schedule `name` names; throws Error(Status::invalid_argument) for a name that is no
// schedule: "unknown schedule 'zigzag' (did you mean ...?); braid's schedules are ...".
// (A known schedule that a plan cannot run is Status::unsupported, where that is known.)
Schedule schedule_named(std::string_view name);

}  // namespace braid::spec
