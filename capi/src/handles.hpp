// What the opaque handles of braid.h (and braid/pipeline.h, braid/data.h, braid/bubble.h) hold.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/bubble/scheduler.hpp"
#include "core/cost/cost_model.hpp"
#include "core/data/batch_reorder.hpp"
#include "core/pipeline/program.hpp"
#include "core/plan/planner.hpp"
#include "core/sim/simulator.hpp"
#include "core/spec/run.hpp"

struct braid_config {
  braid::spec::RunSpec run;
  std::unique_ptr<braid::cost::CostModel> cost;  // points into `run`: created after it
};

struct braid_plan {
  const braid_config* config;
  braid::plan::PlanResult result;
  braid::plan::Strategy requested;
  std::vector<std::vector<int32_t>> layers;  // per module, for braid_module_info
  std::mutex text_mutex;                     // guards the renderings below
  std::string json, yaml;                    // rendered on first request
};

struct braid_program {
  braid::pipeline::Program program;
  std::vector<std::vector<int32_t>> prev, next;  // per stage, for braid_stage_info
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
  const braid_config* config;                           // must outlive the scheduler
  braid::plan::Plan plan;                               // a copy: the braid_plan may go first
  mutable std::mutex mutex;                             // run() may race with itself and with readers
  std::unique_ptr<braid::bubble::Schedules> schedules;  // set by a successful run
};
