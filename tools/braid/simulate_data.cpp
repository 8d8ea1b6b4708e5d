#include "tools/braid/simulate_data.hpp"

#include <chrono>
#include <cstdio>

#include "core/common/text.hpp"

namespace braid::cli {
namespace {

constexpr const char* kVariants[] = {"none", "intra", "intra_inter"};

nlohmann::ordered_json straggler_json(const data::StageStraggler& s, const data::DataReport& r, bool with_stage) {
  nlohmann::ordered_json j{{"ratio", s.straggler.ratio}, {"time_s", s.straggler.time}};
  if (with_stage) j["stage"] = s.stage >= 0 ? r.stage_names[static_cast<std::size_t>(s.stage)] : "";
  return j;
}

nlohmann::ordered_json step_json(const data::StepData& s, const data::DataReport& r, bool per_step) {
  nlohmann::ordered_json j;
  if (per_step) j["step"] = s.step;
  nlohmann::ordered_json times, stragglers;
  for (int v = 0; v < 3; ++v) {
    times[kVariants[v]] = s.step_time_s[v];
    stragglers[kVariants[v]] = straggler_json(s.straggler[v], r, per_step);
  }
  j["step_time_s"] = times;
  j["straggler"] = stragglers;
  return j;
}

std::string straggler_text(const data::StageStraggler& s) {
  return fixed(s.straggler.ratio, 2) + "x +" + seconds(s.straggler.time);
}

}  // namespace

data::DataReport simulate_data(const cost::CostModel& cost, const plan::Plan& plan, const pipeline::Program& program) {
  const auto start = std::chrono::steady_clock::now();
  bool shown = false;
  auto report = data::data_report(cost, plan, program, [&](int done, int total) {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (elapsed < 1 && !shown) return;
    shown = true;
    std::fprintf(stderr, "\rbraid simulate: data report, step %d of %d (%s)", done, total, seconds(elapsed).c_str());
    if (done == total) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  });
  return report;
}

nlohmann::ordered_json data_report_json(const data::DataReport& r) {
  nlohmann::ordered_json j;
  j["heterogeneous"] = r.heterogeneous;
  j["seed"] = r.seed;
  j["samples_per_step"] = r.samples;
  j["steps"] = r.steps.size();
  j["dp_cells"] = r.cells;
  j["pipeline_groups"] = r.groups;
  j["microbatches"] = r.microbatches;
  j["inter_ordered"] = r.inter_ordered;
  j["nominal_step_time_s"] = r.nominal_step_time_s;
  j["mean"] = step_json(r.mean, r, false);
  nlohmann::ordered_json steps = nlohmann::ordered_json::array();
  for (const auto& s : r.steps) steps.push_back(step_json(s, r, true));
  j["per_step"] = steps;
  j["search_evaluations"] = r.evaluations;
  j["cost_models"] = r.cost_models;
  j["report_s"] = r.seconds;
  j["notes"] = r.notes;
  return j;
}

void print_data_report(std::ostream& out, const data::DataReport& r) {
  out << "\ndata reordering: " << r.steps.size() << " steps of " << r.samples << " samples (seed " << r.seed << "), "
      << r.cells << " DP cells, " << r.groups << " pipeline group" << (r.groups == 1 ? "" : "s") << " of "
      << r.microbatches << " microbatches; every sample at its nominal size: " << seconds(r.nominal_step_time_s)
      << "\n";
  for (const auto& note : r.notes) out << "  note: " << note << "\n";
  out << "  " << pad("step", 6) << pad("straggler none", 22, true) << pad("intra", 22, true)
      << pad("step none", 12, true) << pad("intra", 12, true) << pad("intra+inter", 13, true) << "\n";
  auto row = [&](const std::string& label, const data::StepData& s) {
    out << "  " << pad(label, 6) << pad(straggler_text(s.straggler[0]), 22, true)
        << pad(straggler_text(s.straggler[1]), 22, true) << pad(seconds(s.step_time_s[0]), 12, true)
        << pad(seconds(s.step_time_s[1]), 12, true) << pad(seconds(s.step_time_s[2]), 13, true) << "\n";
  };
  for (const auto& s : r.steps) row(std::to_string(s.step), s);
  row("mean", r.mean);
  const double none = r.mean.step_time_s[0];
  if (none > 0) {
    out << "  intra saves " << fixed(100 * (1 - r.mean.step_time_s[1] / none), 1) << "%, intra+inter "
        << fixed(100 * (1 - r.mean.step_time_s[2] / none), 1) << "% of the step without reordering; straggler: "
        << "slowest DP replica's compute / the mean, on the stage where it lags most (+ the lag)\n";
  }
}

}  // namespace braid::cli
