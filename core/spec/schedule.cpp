#include "core/spec/schedule.hpp"

#include "core/common/error.hpp"
#include "core/common/text.hpp"

namespace braid::spec {

const std::vector<Schedule>& all_schedules() {
  static const std::vector<Schedule> all = {Schedule::one_f_one_b,   Schedule::interleaved,    Schedule::gpipe,
                                            Schedule::batch_sync,    Schedule::distmm_pipe,    Schedule::two_phase,
                                            Schedule::optimus_fine,  Schedule::optimus_coarse, Schedule::encoder_first,
                                            Schedule::optimus_online};
  return all;
}

const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::one_f_one_b:
      return "1f1b";
    case Schedule::interleaved:
      return "interleaved";
    case Schedule::gpipe:
      return "gpipe";
    case Schedule::batch_sync:
      return "batch-sync";
    case Schedule::distmm_pipe:
      return "distmm-pipe";
    case Schedule::two_phase:
      return "two-phase";
    case Schedule::optimus_fine:
      return "optimus-fine";
    case Schedule::optimus_coarse:
      return "optimus-coarse";
    case Schedule::encoder_first:
      return "encoder-first";
    case Schedule::optimus_online:
      return "optimus-online";
  }
  return "?";
}

std::optional<Schedule> parse_schedule(std::string_view name) {
  for (Schedule s : all_schedules()) {
    if (name == schedule_name(s)) return s;
  }
  return std::nullopt;
}

std::vector<std::string> schedule_names(const std::vector<Schedule>& schedules) {
  std::vector<std::string> out;
  out.reserve(schedules.size());
  for (Schedule s : schedules) out.emplace_back(schedule_name(s));
  return out;
}

Schedule schedule_named(std::string_view name) {
  if (auto s = parse_schedule(name)) return *s;
  const auto names = schedule_names(all_schedules());
  const std::string guess = closest_match(name, names);
  throw Error(Status::invalid_argument, "unknown schedule '" + std::string(name) + "'" +
                                            (guess.empty() ? "" : " (did you mean '" + guess + "'?)") +
                                            "; braid's schedules are " + join_choices(names));
}

}  // namespace braid::spec
