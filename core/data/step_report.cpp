#include "core/data/step_report.hpp"

#include <chrono>
#include <cmath>

#include "core/common/error.hpp"
#include "core/common/text.hpp"
#include "core/data/dataset.hpp"
#include "core/data/sample_cost.hpp"
#include "core/sim/simulator.hpp"

namespace braid::data {

namespace {

// The simulator takes a microbatch's work up to 1e9 times the nominal one; sizes drawn far past
// the nominal ones (a histogram value of 64000 px on a 32 px run) are the run file's to mend.
void expect_simulable(const std::vector<double>& scales, const std::string& stage, int step) {
  for (double scale : scales)
    if (!(scale < pipeline::kMaxWorkScale))
      throw Error(Status::bad_config,
                  "data: step " + std::to_string(step) + " draws a microbatch that stage '" + stage + "' would run " +
                      (std::isfinite(scale) ? fixed(scale, 0) + " times"
                       : std::isnan(scale)  ? "an undefined number of times"
                                            : "infinitely many times") +
                      " as long as a nominal one: the distributions' sizes (max, values) lie too far past the "
                      "nominal sizes of data: to simulate; narrow them or raise the nominal size");
}

}  // namespace

DataReport data_report(const cost::CostModel& cost, const plan::Plan& plan, const pipeline::Program& program,
                       const std::function<void(int, int)>& progress) {
  const auto start = std::chrono::steady_clock::now();
  const spec::RunSpec& run = cost.run();
  const long long n = run.training.global_batch;
  const BatchLayout layout = batch_layout(run, plan, program, n);
  const SampleCost pricing(run);
  std::vector<double> nominal;  // a load of 1: what the planner assumed
  for (int m = 0; m < pricing.modules(); ++m) nominal.push_back(pricing.nominal_seconds(m));

  DataReport rep;
  rep.heterogeneous = run.data.heterogeneous();
  rep.seed = run.data.seed;
  rep.samples = n;
  rep.cells = layout.grid.cells;
  rep.groups = layout.grid.groups;
  rep.microbatches = layout.slots;
  rep.inter_ordered = layout.orderable;
  rep.cost_models = pricing.cost_models_built();
  rep.nominal_step_time_s = sim::simulate(program).step_time_s;
  for (const auto& st : program.stages) rep.stage_names.push_back(st.name);
  if (!rep.heterogeneous) rep.notes.push_back("no size distribution in data: every sample has its nominal size");
  if (!layout.orderable) rep.notes.push_back(layout.unordered_why);
  if (plan.layout == plan::Layout::colocated) rep.notes.push_back("colocated encoder tasks keep their nominal work");

  pipeline::Program scaled = program;
  const int steps = run.data.steps;
  for (int k = 0; k < steps; ++k) {
    const auto batch = draw_batch(run.data, n, k);
    const auto costs = pricing.batch_costs(batch);
    StepData step;
    step.step = k;
    for (int v = 0; v < 3; ++v) {
      const Arrangement a = arrange(layout, program, costs, nominal, static_cast<Reordering>(v));
      rep.evaluations += a.evaluations;
      const auto scales = work_scales(layout, program, costs, nominal, a);
      for (std::size_t s = 0; s < scaled.stages.size(); ++s) {
        expect_simulable(scales[s], program.stages[s].name, k);
        scaled.stages[s].work_scale = scales[s];
      }
      step.step_time_s[v] = sim::simulate(scaled).step_time_s;
      step.straggler[v] = worst_stage(program, scales);
    }
    rep.steps.push_back(step);
    if (progress) progress(k + 1, steps);
  }
  for (int v = 0; v < 3; ++v) {
    rep.mean.straggler[v].straggler = Straggler{0, 0};
    for (const auto& s : rep.steps) {
      rep.mean.step_time_s[v] += s.step_time_s[v] / steps;
      rep.mean.straggler[v].straggler.ratio += s.straggler[v].straggler.ratio / steps;
      rep.mean.straggler[v].straggler.time += s.straggler[v].straggler.time / steps;
    }
  }
  rep.mean.step = -1;
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return rep;
}

}  // namespace braid::data
