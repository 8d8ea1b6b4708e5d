// What the opaque handles of braid.h (and braid/pipeline.h, braid/groups.h, braid/data.h,
// braid/bubble.h) hold.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/bubble/scheduler.hpp"
#include "core/cost/cost_model.hpp"
#include "core/data/batch_reorder.hpp"
#include "core/pipeline/program.hpp"
#include "core/plan/planner.hpp"
#include "core/runtime/groups.hpp"
#include "core/sim/simulator.hpp"
#include "core/spec/run.hpp"

namespace braid::capi {

// A run and its cost model (which points into `run`): immutable once made, and shared by
// the config that made it and every plan (and bubble scheduler) made from it, so that a
// plan keeps the settings it was planned with when braid_config_set_run_settings gives
// the config new ones, and a plan's option overrides change only that plan's run.
struct PricedRun {
  explicit PricedRun(spec::RunSpec r) : run(std::move(r)), cost(std::make_unique<cost::CostModel>(run)) {}
  PricedRun(const PricedRun&) = delete;
  PricedRun& operator=(const PricedRun&) = delete;

  spec::RunSpec run;
  std::unique_ptr<cost::CostModel> cost;  // created after `run`
};

}  // namespace braid::capi

struct braid_config {
  explicit braid_config(braid::spec::RunSpec run)
      : priced_(std::make_shared<const braid::capi::PricedRun>(std::move(run))) {}

  // The settings now; braid_config_set_run_settings replaces them as a whole, so a
  // reader on another thread sees the old run or the new one, never a mix.
  std::shared_ptr<const braid::capi::PricedRun> current() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return priced_;
  }
  void replace(std::shared_ptr<const braid::capi::PricedRun> priced) {
    std::lock_guard<std::mutex> lock(mutex_);
    priced_ = std::move(priced);
  }

 private:
  mutable std::mutex mutex_;
  std::shared_ptr<const braid::capi::PricedRun> priced_;
};

struct braid_plan {
  // The run it was planned with: the config's at braid_plan_create, with the plan
  // options' overrides applied. (`config->run`, `*config->cost` as before.)
  std::shared_ptr<const braid::capi::PricedRun> config;
  // braid_plan_options.schedule: what its programs run when no schedule is named.
  std::optional<braid::spec::Schedule> schedule;
  braid::plan::PlanResult result;
  braid::plan::Strategy requested;
  std::vector<std::vector<int32_t>> layers;  // per module, for braid_module_info
  std::mutex text_mutex;                     // guards the renderings below
  std::string json, yaml;                    // rendered on first request
};

struct braid_program {
  braid::pipeline::Program program;
  std::vector<std::vector<int32_t>> prev, next;  // per stage, for braid_stage_info
  // Per stage, in the ABI's module numbering (braid_plan_module indices): its module, its parts.
  std::vector<int32_t> module;
  std::vector<std::vector<braid::pipeline::StagePart>> parts;
};

namespace braid::capi {
// A program handle for `program` of `plan` (the plan may go first: the handle copies what it needs).
std::unique_ptr<braid_program> make_program(pipeline::Program program, const plan::Plan& plan);
}  // namespace braid::capi

struct braid_groups {
  braid::runtime::Topology topology;
  // Topology::modules' groups, flattened in the order braid/groups.h lists them.
  std::vector<const braid::runtime::Group*> groups;
};

struct braid_simulation {
  const braid_program* program;  // must outlive the simulation
  braid::sim::Result result;
  bool traced = false;                // simulated with record_trace
  std::mutex gantt_mutex;             // guards the renderings below
  std::map<int, std::string> gantts;  // by width; kept for the handle's life, so returned texts stay valid
};

struct braid_reorder {
  braid::data::ReorderedBatch batch;
};

struct braid_bubble_scheduler {
  std::shared_ptr<const braid::capi::PricedRun> config;  // the plan's run
  braid::plan::Plan plan;                                // a copy: the braid_plan may go first
  mutable std::mutex mutex;                              // run() may race with itself and with readers
  std::unique_ptr<braid::bubble::Schedules> schedules;   // set by a successful run
};
