// What the opaque handles of braid.h (and braid/pipeline.h, braid/groups.h, braid/data.h,
// braid/bubble.h) hold.
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "capi/src/guard.hpp"
#include "core/bubble/scheduler.hpp"
#include "core/cost/cost_model.hpp"
#include "core/data/batch_reorder.hpp"
#include "core/pipeline/program.hpp"
#include "core/plan/planner.hpp"
#include "core/runtime/groups.hpp"
#include "core/sim/simulator.hpp"
#include "core/spec/run.hpp"

namespace braid::capi {

// Every handle begins with the tag of its kind (its first eight bytes), so that a handle of
// another kind passed where this one belongs (a cast in the C caller, arguments swapped) is
// refused with a status and a message instead of being read as this kind. The handles are
// opaque, so the tag changes no ABI. A pointer that is no handle at all is still the caller's
// undefined behaviour.
constexpr std::uint64_t handle_tag(const char (&name)[9]) {
  std::uint64_t tag = 0;
  for (int i = 0; i < 8; ++i) tag = tag << 8 | static_cast<unsigned char>(name[i]);
  return tag;
}
template <std::uint64_t Tag>
struct Tagged {
  static constexpr std::uint64_t kTag = Tag;
  std::uint64_t tag = Tag;
};
// Whether `h` (not NULL) begins with the tag of H's kind.
template <class H>
bool is_handle(const H* h) {
  std::uint64_t tag = 0;
  std::memcpy(&tag, static_cast<const void*>(h), sizeof tag);
  return tag == H::kTag;
}

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

namespace braid::capi {
// braid_*_destroy: NULL is a no-op; a handle of another kind is refused, not freed as this kind.
template <class H>
braid_status destroy_handle(H* h, const char* function, const char* type) {
  if (h && !is_handle(h))
    return fail(BRAID_ERR_INVALID_ARGUMENT, std::string(function) + ": the handle is not a " + type +
                                                " (a handle of another kind); nothing was destroyed");
  delete h;
  return BRAID_OK;
}
}  // namespace braid::capi

// A handle argument: not NULL, and of its kind.
#define BRAID_REQUIRE_HANDLE(h, type) \
  BRAID_REQUIRE(h, #h " is NULL");    \
  BRAID_REQUIRE(::braid::capi::is_handle(h), #h " is not a " #type " (a handle of another kind)")

struct braid_config : braid::capi::Tagged<braid::capi::handle_tag("braidcfg")> {
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

struct braid_plan : braid::capi::Tagged<braid::capi::handle_tag("braidpln")> {
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

struct braid_program : braid::capi::Tagged<braid::capi::handle_tag("braidprg")> {
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

struct braid_groups : braid::capi::Tagged<braid::capi::handle_tag("braidgrp")> {
  braid::runtime::Topology topology;
  // Topology::modules' groups, flattened in the order braid/groups.h lists them.
  std::vector<const braid::runtime::Group*> groups;
};

struct braid_simulation : braid::capi::Tagged<braid::capi::handle_tag("braidsim")> {
  const braid_program* program;  // must outlive the simulation
  braid::sim::Result result;
  bool traced = false;                // simulated with record_trace
  std::mutex gantt_mutex;             // guards the renderings below
  std::map<int, std::string> gantts;  // by width; kept for the handle's life, so returned texts stay valid
};

struct braid_reorder : braid::capi::Tagged<braid::capi::handle_tag("braidreo")> {
  braid::data::ReorderedBatch batch;
};

struct braid_bubble_scheduler : braid::capi::Tagged<braid::capi::handle_tag("braidbub")> {
  std::shared_ptr<const braid::capi::PricedRun> config;  // the plan's run
  braid::plan::Plan plan;                                // a copy: the braid_plan may go first
  mutable std::mutex mutex;                              // run() may race with itself and with readers
  std::unique_ptr<braid::bubble::Schedules> schedules;   // set by a successful run
};
