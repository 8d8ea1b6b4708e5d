// braid_plan_*: plan a config, inspect the result, render it as text.
#include <string>

#include "capi/src/enums.hpp"
#include "capi/src/guard.hpp"
#include "capi/src/handles.hpp"
#include "core/orchestrate/planning.hpp"
#include "core/plan/plan_io.hpp"

namespace {

using braid::plan::Strategy;

// Version 1 ends at plan_yaml; version 2 adds the overrides of the run's settings.
constexpr std::size_t kPlanOptionsVersions[] = {offsetof(braid_plan_options, schedule), sizeof(braid_plan_options)};

}  // namespace

namespace braid::capi {

braid_status strategy_from_c(int s, Strategy* out) {
  switch (s) {
    case BRAID_STRATEGY_AUTO:
      *out = Strategy::automatic;
      return BRAID_OK;
    case BRAID_STRATEGY_MEGATRON:
      *out = Strategy::megatron;
      return BRAID_OK;
    case BRAID_STRATEGY_DISTMM:
      *out = Strategy::distmm;
      return BRAID_OK;
    case BRAID_STRATEGY_DISTTRAIN:
      *out = Strategy::disttrain;
      return BRAID_OK;
    case BRAID_STRATEGY_OPTIMUS:
      *out = Strategy::optimus;
      return BRAID_OK;
    case BRAID_STRATEGY_FIXED:
      *out = Strategy::fixed;
      return BRAID_OK;
  }
  return BRAID_ERR_INVALID_ARGUMENT;
}

braid_strategy strategy_to_c(Strategy s) {
  switch (s) {
    case Strategy::automatic:
      return BRAID_STRATEGY_AUTO;
    case Strategy::megatron:
      return BRAID_STRATEGY_MEGATRON;
    case Strategy::distmm:
      return BRAID_STRATEGY_DISTMM;
    case Strategy::disttrain:
      return BRAID_STRATEGY_DISTTRAIN;
    case Strategy::optimus:
      return BRAID_STRATEGY_OPTIMUS;
    case Strategy::fixed:
      return BRAID_STRATEGY_FIXED;
  }
  return BRAID_STRATEGY_AUTO;
}

}  // namespace braid::capi

namespace {

using braid::capi::strategy_from_c;
using braid::capi::strategy_to_c;

braid::plan::PlanReport report(const braid_plan* plan) {
  return braid::orchestrate::plan_report(*plan->config->cost, plan->result, plan->requested, plan->schedule);
}

}  // namespace

extern "C" {

BRAID_API braid_status braid_plan_create(const braid_config* config, const braid_plan_options* options,
                                         braid_plan** out) {
  BRAID_API_BEGIN
  BRAID_REQUIRE(out, "out is NULL");
  *out = nullptr;
  BRAID_REQUIRE_HANDLE(config, braid_config);
  braid_plan_options opts = BRAID_PLAN_OPTIONS_INIT;
  if (options)
    BRAID_READ_OPTIONS(options, braid_plan_options, kPlanOptionsVersions, BRAID_PLAN_OPTIONS_VERSION,
                       BRAID_PLAN_OPTIONS_INIT, &opts);
  braid::plan::PlanRequest request;
  int raw_strategy = 0;
  static_assert(sizeof raw_strategy == sizeof opts.strategy);
  std::memcpy(&raw_strategy, &opts.strategy, sizeof raw_strategy);
  BRAID_REQUIRE(strategy_from_c(raw_strategy, &request.strategy) == BRAID_OK,
                "options->strategy " + std::to_string(raw_strategy) + " is not a braid_strategy");
  BRAID_REQUIRE(opts.tp >= 0 && opts.pp >= 0 && opts.dp >= 0, "tp, pp and dp constraints must be 0 (free) or positive");
  request.constraints = braid::plan::Constraints{opts.tp, opts.pp, opts.dp};
  // Version 2: overrides of the run's settings for this plan only.
  braid::orchestrate::PlanOverrides overrides;
  overrides.schedule = opts.schedule ? opts.schedule : "";
  overrides.virtual_stages = opts.virtual_stages;
  overrides.microbatch_size = opts.microbatch_size;
  auto priced = config->current();
  if (!overrides.schedule.empty() || overrides.virtual_stages != 0 || overrides.microbatch_size != 0) {
    try {
      priced =
          std::make_shared<const braid::capi::PricedRun>(braid::orchestrate::overridden_run(priced->run, overrides));
    } catch (const braid::Error& e) {
      if (e.status() != braid::Status::invalid_argument) throw;
      return braid::capi::fail(BRAID_ERR_INVALID_ARGUMENT, std::string(__func__) + ": options->" + e.what());
    }
  }
  if (request.strategy == Strategy::fixed) {
    BRAID_REQUIRE(opts.plan_yaml, "BRAID_STRATEGY_FIXED needs options->plan_yaml");
    request.fixed = braid::plan::parse_plan_text(opts.plan_yaml, priced->run, "<plan_yaml>");
  }
  auto plan = std::make_unique<braid_plan>();
  plan->config = priced;
  plan->requested = request.strategy;
  plan->result = braid::orchestrate::make_plan(*priced->cost, request);
  plan->schedule = braid::orchestrate::planned_schedule(*priced->cost, plan->result.best, overrides);
  for (const auto& m : plan->result.best.modules)
    plan->layers.emplace_back(m.layers_per_stage.begin(), m.layers_per_stage.end());
  *out = plan.release();
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_plan_destroy(braid_plan* plan) {
  return braid::capi::destroy_handle(plan, __func__, "braid_plan");
}

BRAID_API braid_status braid_plan_strategy(const braid_plan* plan, braid_strategy* strategy) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(plan, braid_plan);
  BRAID_REQUIRE(strategy, "strategy is NULL");
  *strategy = strategy_to_c(plan->result.best.strategy);
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_plan_module_count(const braid_plan* plan, size_t* count) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(plan, braid_plan);
  BRAID_REQUIRE(count, "count is NULL");
  *count = plan->result.best.modules.size();
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_plan_module(const braid_plan* plan, size_t index, braid_module_info* info) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(plan, braid_plan);
  BRAID_REQUIRE_STRUCT(info, braid_module_info, sizeof(braid_module_info));
  const auto& modules = plan->result.best.modules;
  BRAID_REQUIRE(index < modules.size(), "index " + std::to_string(index) + " is out of range (the plan has " +
                                            std::to_string(modules.size()) + " modules)");
  const auto& m = modules[index];
  braid_module_info v = BRAID_MODULE_INFO_INIT;
  v.name = m.name.c_str();
  v.role = braid::spec::role_name(m.role);
  v.devices = m.devices;
  v.tp = m.tp;
  v.pp = m.pp;
  v.dp = m.dp;
  v.first_device = m.first_device;
  v.first_stage = m.first_stage;
  v.microbatch_size = m.microbatch_size;
  v.stage_count = static_cast<int32_t>(plan->layers[index].size());
  v.layers_per_stage = plan->layers[index].data();
  braid::capi::copy_out(v, info);
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_plan_estimate(const braid_plan* plan, braid_estimate* estimate) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(plan, braid_plan);
  BRAID_REQUIRE_STRUCT(estimate, braid_estimate, sizeof(braid_estimate));
  const auto& e = plan->result.best.estimate;
  braid_estimate v = BRAID_ESTIMATE_INIT;
  v.iteration_time_s = e.iteration_time_s;
  v.samples_per_s = e.samples_per_s;
  v.tflops_per_device = e.tflops_per_device;
  v.mfu = e.mfu;
  v.peak_memory_gib = e.peak_memory_gib;
  v.bubble_fraction = e.bubble_fraction;
  v.devices = plan->result.best.devices;
  braid::capi::copy_out(v, estimate);
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_plan_to_json(const braid_plan* plan, const char** text) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(plan, braid_plan);
  BRAID_REQUIRE(text, "text is NULL");
  auto* p = const_cast<braid_plan*>(plan);  // the rendering is a cache owned by the handle
  std::lock_guard<std::mutex> lock(p->text_mutex);
  if (p->json.empty()) p->json = braid::plan::to_json(report(plan));
  *text = p->json.c_str();
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_plan_to_yaml(const braid_plan* plan, const char** text) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(plan, braid_plan);
  BRAID_REQUIRE(text, "text is NULL");
  auto* p = const_cast<braid_plan*>(plan);
  std::lock_guard<std::mutex> lock(p->text_mutex);
  if (p->yaml.empty()) p->yaml = braid::plan::to_yaml(report(plan));
  *text = p->yaml.c_str();
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_plan_alternative_count(const braid_plan* plan, size_t* count) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(plan, braid_plan);
  BRAID_REQUIRE(count, "count is NULL");
  *count = plan->result.alternatives.size();
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_plan_alternative(const braid_plan* plan, size_t index, braid_alternative* alternative) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(plan, braid_plan);
  BRAID_REQUIRE_STRUCT(alternative, braid_alternative, sizeof(braid_alternative));
  const auto& alts = plan->result.alternatives;
  BRAID_REQUIRE(index < alts.size(), "index " + std::to_string(index) + " is out of range (" +
                                         std::to_string(alts.size()) + " alternatives)");
  const auto& a = alts[index];
  braid_alternative v = BRAID_ALTERNATIVE_INIT;
  v.strategy = strategy_to_c(a.strategy);
  v.feasible = a.feasible ? 1 : 0;
  v.iteration_time_s = a.feasible ? a.iteration_time_s : 0.0;
  v.reason = a.reason.c_str();
  braid::capi::copy_out(v, alternative);
  return BRAID_OK;
  BRAID_API_END
}

}  // extern "C"
