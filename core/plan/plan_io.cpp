#include "core/plan/plan_io.hpp"

#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/common/error.hpp"
#include "core/common/text.hpp"
#include "core/plan/evaluate.hpp"
#include "core/plan/stage_load.hpp"

namespace braid::plan {
namespace {

using nlohmann::ordered_json;

// 197.20B, 124.44M, or every digit of a tiny model's (220225): never "0.00B".
std::string parameter_count(double n) {
  if (n >= 1e9) return fixed(n / 1e9, 2) + "B";
  if (n >= 1e6) return fixed(n / 1e6, 2) + "M";
  return std::to_string(static_cast<long long>(n));
}

// Towers on their own devices each split the batch over their own replicas.
std::string microbatches_label(const Plan& plan, const spec::RunSpec& run) {
  if (plan.layout != Layout::branches) return std::to_string(plan.microbatches) + " microbatches per pipeline";
  std::string out = "microbatches per replica:";
  for (std::size_t i = 0; i < plan.modules.size(); ++i) {
    out += (i ? ", " : " ") + plan.modules[i].name + " " +
           std::to_string(microbatches_per_step(run.training, plan.modules[i]));
  }
  return out;
}

ordered_json module_json(const ModulePlacement& p) {
  return ordered_json{{"name", p.name},
                      {"role", spec::role_name(p.role)},
                      {"devices", p.devices},
                      {"tp", p.tp},
                      {"pp", p.pp},
                      {"dp", p.dp},
                      {"first_device", p.first_device},
                      {"first_stage", p.first_stage},
                      {"layers_per_stage", p.layers_per_stage},
                      {"microbatch_size", p.microbatch_size}};
}

ordered_json estimate_json(const Estimate& e) {
  return ordered_json{{"iteration_time_s", e.iteration_time_s},
                      {"samples_per_s", e.samples_per_s},
                      {"tflops_per_device", e.tflops_per_device},
                      {"mfu", e.mfu},
                      {"peak_memory_gib", e.peak_memory_gib},
                      {"bubble_fraction", e.bubble_fraction},
                      {"peak_memory_at", e.peak_memory_at},
                      {"breakdown_s",
                       {{"compute", e.compute_s},
                        {"pipeline_bubble", e.pipeline_bubble_s},
                        {"tp_comm", e.tp_comm_s},
                        {"dp_comm", e.dp_comm_s},
                        {"p2p", e.p2p_s},
                        {"batch_sync", e.sync_s},
                        {"optimizer", e.optimizer_s},
                        {"encoder_exposed", e.encoder_exposed_s}}},
                      {"memory_gib",
                       {{"weights", e.memory.weights / kGiB},
                        {"gradients", e.memory.gradients / kGiB},
                        {"optimizer", e.memory.optimizer / kGiB},
                        {"activations", e.memory.activations / kGiB},
                        {"collective_buffers", e.memory.communication() / kGiB},
                        {"reserved", e.memory.reserved / kGiB}}}};
}

std::string join(const std::vector<int>& v) {
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(v[i]);
  }
  return out;
}

}  // namespace

std::string to_json(const PlanReport& r) {
  const auto& run = r.cost->run();
  const Plan& plan = r.result->best;
  ordered_json j;
  j["strategy"] = strategy_name(plan.strategy);
  j["requested_strategy"] = strategy_name(r.requested);
  j["layout"] = layout_name(plan.layout);
  j["devices"] = plan.devices;
  j["cluster_devices"] = run.devices();
  j["device"] = run.cluster.device_name;
  j["model"] = run.model.name;
  j["run"] = run.source;
  j["schedule"] = r.schedule;
  j["microbatches"] = plan.microbatches;
  j["virtual_stages"] = plan.virtual_stages;
  j["global_batch"] = run.training.global_batch;
  ordered_json modules = ordered_json::array();
  for (const auto& p : plan.modules) {
    modules.push_back(module_json(p));
    modules.back()["microbatches"] = microbatches_per_step(run.training, p);  // per replica and step
  }
  j["modules"] = modules;
  j["estimate"] = estimate_json(plan.estimate);
  if (r.simulated_step_s > 0) j["estimate"]["simulated_iteration_time_s"] = r.simulated_step_s;
  if (!r.simulation_error.empty()) j["estimate"]["simulation_error"] = r.simulation_error;
  j["notes"] = plan.notes;
  if (!r.result->alternatives.empty()) {
    ordered_json alts = ordered_json::array();
    for (const auto& a : r.result->alternatives) {
      ordered_json x{{"strategy", strategy_name(a.strategy)}, {"feasible", a.feasible}};
      x["iteration_time_s"] = a.feasible ? ordered_json(a.iteration_time_s) : ordered_json(nullptr);
      x["reason"] = a.reason;
      alts.push_back(x);
    }
    j["alternatives"] = alts;
  }
  return j.dump(2) + "\n";
}

std::string to_yaml(const PlanReport& r) {
  const auto& run = r.cost->run();
  const Plan& plan = r.result->best;
  YAML::Emitter out;
  out << YAML::Comment("braid plan for " + run.source + "; evaluate it with: braid plan --config " + run.source +
                       " --plan FILE");
  out << YAML::BeginMap;
  out << YAML::Key << "strategy" << YAML::Value << strategy_name(plan.strategy);
  out << YAML::Key << "layout" << YAML::Value << layout_name(plan.layout);
  out << YAML::Key << "devices" << YAML::Value << plan.devices;
  // Contrastive plans run batch-sync whatever the run file's schedule says.
  out << YAML::Key << "schedule" << YAML::Value
      << spec::schedule_name(run.model.topology == spec::Topology::contrastive ? spec::Schedule::batch_sync
                                                                               : plan.schedule);
  out << YAML::Key << "virtual_stages" << YAML::Value << plan.virtual_stages;
  out << YAML::Key << "modules" << YAML::Value << YAML::BeginSeq;
  for (const auto& p : plan.modules) {
    out << YAML::BeginMap;
    out << YAML::Key << "name" << YAML::Value << p.name;
    out << YAML::Key << "role" << YAML::Value << spec::role_name(p.role);
    out << YAML::Key << "tp" << YAML::Value << p.tp;
    out << YAML::Key << "pp" << YAML::Value << p.pp;
    out << YAML::Key << "dp" << YAML::Value << p.dp;
    out << YAML::Key << "first_device" << YAML::Value << p.first_device;
    out << YAML::Key << "devices" << YAML::Value << p.devices;
    out << YAML::Key << "first_stage" << YAML::Value << p.first_stage;
    out << YAML::Key << "microbatch_size" << YAML::Value << p.microbatch_size;
    out << YAML::Key << "layers_per_stage" << YAML::Value << YAML::Flow << p.layers_per_stage;
    out << YAML::EndMap;
  }
  out << YAML::EndSeq;
  // Informative only: read back, a plan is evaluated afresh.
  const Estimate& e = plan.estimate;
  out << YAML::Key << "estimate" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "iteration_time_s" << YAML::Value << e.iteration_time_s;
  out << YAML::Key << "samples_per_s" << YAML::Value << e.samples_per_s;
  out << YAML::Key << "tflops_per_device" << YAML::Value << e.tflops_per_device;
  out << YAML::Key << "mfu" << YAML::Value << e.mfu;
  out << YAML::Key << "peak_memory_gib" << YAML::Value << e.peak_memory_gib;
  out << YAML::Key << "bubble_fraction" << YAML::Value << e.bubble_fraction;
  out << YAML::EndMap;
  if (!plan.notes.empty()) out << YAML::Key << "notes" << YAML::Value << plan.notes;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

std::string to_table(const PlanReport& r) {
  const auto& run = r.cost->run();
  const Plan& plan = r.result->best;
  const Estimate& e = plan.estimate;
  std::ostringstream s;
  s << "braid plan for " << run.source << "\n";
  s << "model " << run.model.name << " (" << spec::topology_name(run.model.topology) << ", "
    << parameter_count(spec::model_parameters(run.model)) << " parameters) on " << run.devices() << " x "
    << run.cluster.device_name << " (" << run.cluster.nodes << (run.cluster.nodes == 1 ? " node)\n" : " nodes)\n");
  s << "strategy " << strategy_name(plan.strategy) << " (layout " << layout_name(plan.layout) << ", schedule "
    << r.schedule << "), " << plan.devices << " devices, global batch " << run.training.global_batch << ", "
    << microbatches_label(plan, run) << "\n\n";
  s << pad("module", 18) << pad("role", 11) << pad("devices", 8, true) << pad("first", 7, true) << pad("tp", 4, true)
    << pad("pp", 4, true) << pad("dp", 6, true) << pad("mb", 5, true) << "  layers per stage\n";
  for (const auto& p : plan.modules) {
    s << pad(p.name, 18) << pad(spec::role_name(p.role), 11) << pad(std::to_string(p.devices), 8, true)
      << pad(std::to_string(p.first_device), 7, true) << pad(std::to_string(p.tp), 4, true)
      << pad(std::to_string(p.pp), 4, true) << pad(std::to_string(p.dp), 6, true)
      << pad(std::to_string(p.microbatch_size), 5, true) << "  " << join(p.layers_per_stage);
    if (plan.layout == Layout::monolithic && p.first_stage > 0) s << " (from stage " << p.first_stage << ")";
    s << "\n";
  }
  s << "\nestimate\n";
  s << "  iteration time       " << seconds(e.iteration_time_s) << "   (" << fixed(e.samples_per_s, 1)
    << " samples/s)\n";
  if (!r.simulation_error.empty()) s << "  simulated step       unavailable: " << r.simulation_error << "\n";
  if (r.simulated_step_s > 0) {
    s << "  simulated step       " << seconds(r.simulated_step_s) << "   (its pipeline program run event by event, "
      << (r.simulated_step_s >= e.iteration_time_s ? "+" : "")
      << fixed(100 * (r.simulated_step_s / e.iteration_time_s - 1), 1) << "%)\n";
  }
  s << "  per device           " << fixed(e.tflops_per_device, 1) << " TFLOP/s, MFU " << fixed(100 * e.mfu, 1) << "%\n";
  s << "  peak memory          " << fixed(e.peak_memory_gib, 1) << " GiB on " << e.peak_memory_at << " (weights "
    << fixed(e.memory.weights / kGiB, 1) << ", gradients " << fixed(e.memory.gradients / kGiB, 1) << ", optimizer "
    << fixed(e.memory.optimizer / kGiB, 1) << ", activations " << fixed(e.memory.activations / kGiB, 1)
    << (e.memory.communication() > 0 ? ", collective buffers " + fixed(e.memory.communication() / kGiB, 1) : "")
    << ", reserved " << fixed(e.memory.reserved / kGiB, 1) << ")\n";
  s << "  bubble fraction      " << fixed(100 * e.bubble_fraction, 1) << "%\n";
  s << "  critical path        compute " << seconds(e.compute_s) << ", pipeline fill/drain "
    << seconds(e.pipeline_bubble_s) << ", TP comm " << seconds(e.tp_comm_s) << ", DP comm " << seconds(e.dp_comm_s)
    << ", p2p " << seconds(e.p2p_s);
  if (e.sync_s > 0) s << ", batch-sync " << seconds(e.sync_s);
  if (e.encoder_exposed_s > 0) s << ", exposed encoder " << seconds(e.encoder_exposed_s);
  s << ", optimizer " << seconds(e.optimizer_s) << "\n";
  if (!r.result->alternatives.empty()) {
    s << "\nstrategies compared (auto)\n";
    int rank = 0;
    for (const auto& a : r.result->alternatives) {
      s << "  " << pad(a.feasible ? std::to_string(++rank) : "-", 3) << pad(strategy_name(a.strategy), 11)
        << pad(a.feasible ? seconds(a.iteration_time_s) : "-", 12, true) << "  " << a.reason << "\n";
    }
  }
  if (!plan.notes.empty()) {
    s << "\nnotes\n";
    for (const auto& n : plan.notes) s << "  - " << n << "\n";
  }
  return s.str();
}

Plan parse_plan(const spec::Node& root, const spec::RunSpec& run) {
  root.expect_keys({"strategy", "layout", "devices", "schedule", "virtual_stages", "modules", "estimate", "notes"});
  Plan plan;
  plan.strategy = Strategy::fixed;
  plan.source.file = root.where();
  if (auto d = root.find("devices")) {
    plan.source.devices_where = d->where() + ": devices";
    plan.source.devices = static_cast<int>(d->as_int_at_least(1));
  }
  plan.layout = *parse_layout(root.at("layout").as_choice({"monolithic", "branches", "chain", "colocated"}));
  plan.cluster_devices = run.devices();
  plan.schedule = run.training.schedule;
  if (auto s = root.find("schedule")) {
    const spec::Schedule v = *spec::parse_schedule(s->as_choice({"1f1b", "interleaved", "gpipe", "batch-sync"}));
    const bool batch_sync = v == spec::Schedule::batch_sync;
    if (batch_sync != (run.model.topology == spec::Topology::contrastive)) {
      s->fail(batch_sync ? "batch-sync is the schedule of contrastive models only"
                         : "a contrastive model runs the batch-sync schedule");
    }
    // A contrastive plan's program is chosen by its topology; its pipeline order stays 1f1b.
    plan.schedule = batch_sync ? spec::Schedule::one_f_one_b : v;
  }
  if (auto v = root.find("virtual_stages")) plan.virtual_stages = static_cast<int>(v->as_int_at_least(1));
  if (auto s = root.find("strategy")) {
    s->as_choice({"megatron", "distmm", "disttrain", "optimus", "fixed", "auto"});  // informative; checked for typos
  }
  for (const auto& item : root.at("modules").items()) {
    item.expect_keys({"name", "role", "tp", "pp", "dp", "first_device", "devices", "first_stage", "microbatch_size",
                      "layers_per_stage"});
    ModulePlacement p;
    p.name = item.at("name").as_string();
    p.module = run.model.index_of(p.name);
    if (p.module < 0) item.at("name").fail("the model has no module '" + p.name + "'");
    const auto& spec = run.model.modules[static_cast<std::size_t>(p.module)];
    p.role = spec.role;
    if (auto role = item.find("role"); role && role->as_string() != spec::role_name(spec.role)) {
      role->fail("module '" + p.name + "' is a " + spec::role_name(spec.role) + " in the model");
    }
    p.tp = static_cast<int>(item.at("tp").as_int_at_least(1));
    p.pp = static_cast<int>(item.at("pp").as_int_at_least(1));
    p.dp = static_cast<int>(item.at("dp").as_int_at_least(1));
    p.first_device = item.has("first_device") ? static_cast<int>(item.at("first_device").as_int_at_least(0)) : 0;
    p.first_stage = item.has("first_stage") ? static_cast<int>(item.at("first_stage").as_int_at_least(0)) : 0;
    p.microbatch_size = item.has("microbatch_size") ? static_cast<int>(item.at("microbatch_size").as_int_at_least(1))
                                                    : run.training.microbatch;
    // Each replica's share of a (contrastive) batch must split into whole microbatches.
    const bool contrastive = run.model.topology == spec::Topology::contrastive;
    const long long batch = contrastive ? run.training.contrastive_batch : run.training.global_batch;
    if (batch % samples_per_microbatch(p) != 0) {
      const std::string what = "microbatches of " + std::to_string(p.microbatch_size) + " on " + std::to_string(p.dp) +
                               " DP replicas do not split the " + (contrastive ? "contrastive batch" : "global batch") +
                               " of " + std::to_string(batch) + " (training." +
                               (contrastive ? "contrastive_batch" : "global_batch") + " of " + run.source + ")";
      (item.has("microbatch_size") ? item.at("microbatch_size") : item).fail(what);
    }
    if (auto layers = item.find("layers_per_stage")) {
      for (const auto& n : layers->items()) p.layers_per_stage.push_back(static_cast<int>(n.as_int_at_least(0)));
    } else {
      p.layers_per_stage = even_split(spec.layers, p.pp);
    }
    const long long devices = static_cast<long long>(p.tp) * p.pp * p.dp;
    if (devices > std::numeric_limits<int>::max()) item.fail("tp x pp x dp is larger than any cluster");
    p.devices = static_cast<int>(devices);
    if (auto d = item.find("devices"); d && d->as_int() != p.devices) {
      d->fail("devices " + d->as_string() + " do not match tp x pp x dp = " + std::to_string(p.devices));
    }
    plan.modules.push_back(std::move(p));
    plan.source.modules.push_back(item.where() + ": " + item.path());
  }
  if (plan.modules.empty()) root.at("modules").fail("a plan places at least one module");
  return plan;
}

Plan load_plan(const std::string& path, const spec::RunSpec& run) { return parse_plan(spec::load_document(path), run); }

Plan parse_plan_text(const std::string& text, const spec::RunSpec& run, const std::string& source) {
  return parse_plan(spec::parse_document(text, source), run);
}

}  // namespace braid::plan
