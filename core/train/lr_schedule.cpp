#include "core/train/lr_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace braid::train {

namespace {

constexpr double kPi = 3.14159265358979323846;

std::string number(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", v);
  return text;
}

}  // namespace

LrSchedule LrSchedule::of(const spec::TrainerSpec& t, std::int64_t total_steps) {
  return {t.learning_rate, t.warmup_steps, t.min_lr_ratio, total_steps};
}

double LrSchedule::at(std::int64_t step) const {
  if (warmup_steps > 0 && step <= warmup_steps)
    return peak * static_cast<double>(step) / static_cast<double>(warmup_steps);
  const double span = static_cast<double>(std::max<std::int64_t>(1, total_steps - warmup_steps));
  const double progress = std::clamp(static_cast<double>(step - warmup_steps) / span, 0.0, 1.0);
  const double floor = min_ratio * peak;
  return floor + (peak - floor) * 0.5 * (1.0 + std::cos(kPi * progress));
}

std::string LrSchedule::describe() const {
  return std::to_string(total_steps) + " steps (peak " + number(peak) + ", warm-up " + std::to_string(warmup_steps) +
         (warmup_steps == 1 ? " step, floor " : " steps, floor ") + number(min_ratio) + " of the peak)";
}

void LrSchedule::record(CheckpointContents& c) const {
  c.add_double("lr_schedule/peak", peak);
  c.add_int("lr_schedule/warmup_steps", warmup_steps);
  c.add_double("lr_schedule/min_ratio", min_ratio);
  c.add_int("lr_schedule/total_steps", total_steps);
}

std::optional<LrSchedule> LrSchedule::recorded(const CheckpointContents& c) {
  if (!c.has_blob("lr_schedule/total_steps")) return std::nullopt;
  return LrSchedule{c.get_double("lr_schedule/peak"), c.get_int("lr_schedule/warmup_steps"),
                    c.get_double("lr_schedule/min_ratio"), c.get_int("lr_schedule/total_steps")};
}

std::string schedule_change(const CheckpointContents& c, const LrSchedule& now, std::int64_t next_step) {
  const std::optional<LrSchedule> then = LrSchedule::recorded(c);
  if (!then || *then == now) return "";
  // Resuming is this run only if the checkpoint's steps trained at this run's rates: a longer
  // run still in its warm-up, say, agrees on every step so far.
  for (std::int64_t step = 1; step < next_step; ++step) {
    const double was = then->at(step), would = now.at(step);
    if (std::abs(was - would) <= 1e-12 * std::abs(would)) continue;
    return "checkpoint '" + c.source + "' was trained under a learning-rate schedule of " + then->describe() +
           ", this run's is of " + now.describe() + ": its step " + std::to_string(step) + " trained at " +
           number(was) + " where this run's schedule gives " + number(would);
  }
  return "";
}

}  // namespace braid::train
