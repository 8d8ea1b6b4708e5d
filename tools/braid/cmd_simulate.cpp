// braid simulate: run a plan's pipeline program through the discrete-event
// simulator and show where every device is busy or idle.
#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/bubble/published.hpp"
#include "core/bubble/scheduler.hpp"
#include "core/common/error.hpp"
#include "core/common/text.hpp"
#include "core/orchestrate/planning.hpp"
#include "core/orchestrate/program.hpp"
#include "core/plan/plan_io.hpp"
#include "core/sim/simulator.hpp"
#include "core/sim/trace.hpp"
#include "tools/braid/commands.hpp"
#include "tools/braid/parse_options.hpp"
#include "tools/braid/plan_options.hpp"
#include "tools/braid/simulate_data.hpp"

namespace po = boost::program_options;

namespace braid::cli {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

nlohmann::ordered_json bubbles_json(const std::array<double, sim::kCauseCount>& b) {
  nlohmann::ordered_json j;
  for (int c = 0; c < sim::kCauseCount; ++c)
    j[sim::cause_name(static_cast<sim::Cause>(c))] = b[static_cast<std::size_t>(c)];
  return j;
}

std::string bubbles_text(const std::array<double, sim::kCauseCount>& b) {
  std::string out;
  for (int c = 0; c < sim::kCauseCount; ++c) {
    if (b[static_cast<std::size_t>(c)] <= 0) continue;
    out += (out.empty() ? "" : ", ") + std::string(sim::cause_name(static_cast<sim::Cause>(c))) + " " +
           seconds(b[static_cast<std::size_t>(c)]);
  }
  return out.empty() ? "none" : out;
}

nlohmann::ordered_json per_schedule_json(const bubble::PerSchedule& p) {
  return {{"colocated", p.plain}, {"coarse", p.coarse}, {"fine", p.fine}};
}

// `published`: Optimus' own shares for this run, when the paper has the run.
nlohmann::ordered_json bubble_report_json(const bubble::Report& b,
                                          const std::optional<bubble::PublishedShare>& published) {
  nlohmann::ordered_json j;
  j["step_time_s"] = {{"colocated", b.plain_step_s}, {"coarse", b.coarse_step_s}, {"fine", b.fine_step_s}};
  j["recovered_fraction"] = {{"coarse", b.recovered_coarse}, {"fine", b.recovered_fine}};
  j["llm_alone"] = {{"step_time_s", b.llm_step_s}, {"idle_s", b.llm_idle_s}};
  j["encoder_s"] = b.encoder_s;
  j["llm_bubble_filled_fraction"] = per_schedule_json(b.bubble_filled);
  j["encoder_in_bubbles_fraction"] = per_schedule_json(b.encoder_hidden);
  j["optimus_published_fraction"] =
      published ? nlohmann::ordered_json{{"coarse", published->coarse}, {"fine", published->fine}}
                : nlohmann::ordered_json(nullptr);
  j["bubbles_before"] = bubbles_json(b.bubbles_before);
  j["bubbles_after"] = bubbles_json(b.bubbles_after);
  j["scheduler_time_s"] = b.scheduler_time_s;
  j["placements_simulated"] = b.rounds;
  j["encoder_tasks_per_device"] = b.encoder_tasks;
  j["tp_bubble_tasks"] = b.tp_bubble_tasks;
  j["dp_wait_tasks"] = b.dp_wait_tasks;
  return j;
}

void print_bubble_report(const bubble::Report& b, const std::optional<bubble::PublishedShare>& published) {
  auto pct = [](double x) { return fixed(100 * x, 1) + "%"; };
  auto gain = [&](double t) { return fixed(100 * (1 - t / b.plain_step_s), 1) + "% faster"; };
  std::cout << "\nbubble scheduler (optimus): " << b.encoder_tasks << " encoder tasks per device, " << b.rounds
            << " placements simulated in " << seconds(b.scheduler_time_s) << "\n"
            << "  encoder-first      " << seconds(b.plain_step_s)
            << "   (encoder forwards before the llm, backwards after)\n"
            << "  coarse             " << seconds(b.coarse_step_s) << "   " << gain(b.coarse_step_s) << ", "
            << fixed(100 * b.recovered_coarse, 1) << "% of the idle time recovered\n"
            << "  fine               " << seconds(b.fine_step_s) << "   " << gain(b.fine_step_s) << ", "
            << fixed(100 * b.recovered_fine, 1) << "% recovered, " << b.tp_bubble_tasks << " tasks inside TP waits, "
            << b.dp_wait_tasks << " in the llm's DP waits\n"
            << "  idle before        " << bubbles_text(b.bubbles_before) << "\n"
            << "  idle after         " << bubbles_text(b.bubbles_after) << "\n"
            << "  against the llm alone (" << seconds(b.llm_step_s) << " step, " << seconds(b.llm_idle_s)
            << " idle per device; encoder work " << seconds(b.encoder_s) << " per device):\n"
            << "  " << pad("", 19) << pad("encoder-first", 14, true) << pad("coarse", 10, true) << pad("fine", 10, true)
            << "\n"
            << "  " << pad("encoder in bubbles", 19) << pad(pct(b.encoder_hidden.plain), 14, true)
            << pad(pct(b.encoder_hidden.coarse), 10, true) << pad(pct(b.encoder_hidden.fine), 10, true)
            << "   (share of the encoder work that does not lengthen the step)\n"
            << "  " << pad("llm bubble filled", 19) << pad(pct(b.bubble_filled.plain), 14, true)
            << pad(pct(b.bubble_filled.coarse), 10, true) << pad(pct(b.bubble_filled.fine), 10, true)
            << "   (share of the llm alone's idle time the encoder work fills)\n";
  if (published)
    std::cout << "  " << pad("optimus (paper)", 19) << pad("-", 14, true) << pad(pct(published->coarse), 10, true)
              << pad(pct(published->fine), 10, true) << "   (published, " << published->gpus << " GPUs, "
              << published->microbatches << " microbatches)\n";
}

}  // namespace

int run_simulate(const std::vector<std::string>& args) {
  PlanOptions plan_opts;
  std::string format = "table", schedule, trace;
  int trace_replicas = 1;
  po::options_description opts(
      "usage: braid simulate --config RUN.yaml [options]\n"
      "\n"
      "Builds the per-stage instruction programs of a plan (the chosen or given one)\n"
      "and simulates one training step, event by event: compute and communication\n"
      "streams per device, collectives synchronising their groups. Reports the step\n"
      "time, where each device is idle and why, peak memory and MFU.\n"
      "\n"
      "options");
  opts.add_options()("help,h", "show this help");
  plan_opts.add_to(opts);
  opts.add_options()("schedule", po::value(&schedule)->value_name("NAME"),
                     "gpipe | 1f1b | interleaved | batch-sync | distmm-pipe | two-phase; colocated (optimus) plans: "
                     "optimus-fine | optimus-coarse | encoder-first | optimus-online (default: the plan's; optimus: "
                     "optimus-fine)")("trace", po::value(&trace)->value_name("FILE"),
                                      "write a Chrome trace (open in ui.perfetto.dev or chrome://tracing)")(
      "trace-replicas", po::value(&trace_replicas)->value_name("N"),
      "DP replicas per stage in the trace (default 1; -1: all)")(
      "gantt", "print a text Gantt chart of each stage's first replica")(
      "data", "report data reordering over the run's sample-size distributions (data: in the run file)")(
      "format,f", po::value(&format)->value_name("FMT"), "table (default) | json");
  po::variables_map vm;
  try {
    po::store(parse_options(args, opts), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::fprintf(stderr, "braid simulate: error: %s\n(see 'braid simulate --help')\n", e.what());
    return kExitBadInput;
  }
  if (vm.count("help")) {
    std::cout << opts
              << "\nexample:\n  braid simulate --config configs/runs/llava-13b-256gpu.yaml --strategy megatron --pp 4 "
                 "--gantt --trace step.json\n";
    return kExitOk;
  }
  std::string problem = plan_opts.problem(vm);
  if (problem.empty() && format != "table" && format != "json") problem = "--format must be table or json";
  if (problem.empty()) problem = empty_file_option(vm, {"trace"});
  // A trace of no replica would draw every stage idle.
  if (problem.empty() && (trace_replicas < -1 || trace_replicas == 0))
    problem = "--trace-replicas must be -1 (all) or at least 1";
  if (!problem.empty()) {
    std::fprintf(stderr, "braid simulate: error: %s\n(see 'braid simulate --help')\n", problem.c_str());
    return kExitBadInput;
  }

  const spec::RunSpec run = plan_opts.load_run();
  const cost::CostModel cost(run);
  const plan::PlanRequest request = plan_opts.request(run);
  const plan::PlanResult result = orchestrate::make_plan(cost, request);
  const plan::Plan& chosen = result.best;
  const auto allowed = orchestrate::schedules_for(cost, chosen);
  // Colocated plans: the bubble scheduler makes all of their programs at once, with its report.
  std::optional<bubble::Schedules> scheduled;
  std::optional<spec::Schedule> requested;
  if (chosen.layout == plan::Layout::colocated) {
    requested = spec::parse_schedule(schedule);
    if (!schedule.empty() && (!requested || std::find(allowed.begin(), allowed.end(), *requested) == allowed.end())) {
      std::fprintf(stderr, "braid simulate: error: a colocated plan runs %s, not '%s'\n",
                   join_choices(spec::schedule_names(allowed)).c_str(), schedule.c_str());
      return kExitBadInput;
    }
    scheduled = bubble::schedule(cost, chosen);
  } else {
    requested = orchestrate::parse_schedule_for(cost, chosen, schedule);
  }
  const pipeline::Program program = scheduled ? bubble::program_named(*scheduled, requested.value_or(allowed.front()))
                                              : orchestrate::build_program(cost, chosen, requested);
  sim::Options sim_opts;
  sim_opts.trace = !trace.empty() || vm.count("gantt");
  sim_opts.trace_replicas = trace.empty() ? 1 : trace_replicas;  // the Gantt alone draws each stage's first
  const auto start = std::chrono::steady_clock::now();
  const sim::Result r = sim::simulate(program, sim_opts);
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::optional<data::DataReport> data_report;
  if (vm.count("data")) data_report = simulate_data(cost, chosen, program);
  // Written once everything the command refuses has been refused: a failing run keeps the old trace.
  if (!trace.empty()) sim::write_chrome_trace(trace, program, r);

  const double estimate = chosen.estimate.iteration_time_s;
  const auto published = bubble::optimus_published(run.model.name, run.devices(), run.training.global_batch);
  if (format == "json") {
    nlohmann::ordered_json j;
    j["strategy"] = plan::strategy_name(chosen.strategy);
    j["layout"] = plan::layout_name(chosen.layout);
    j["schedule"] = spec::schedule_name(program.schedule);
    j["device_count"] = r.devices;
    j["step_time_s"] = r.step_time_s;
    j["estimate_iteration_time_s"] = estimate;
    j["bubble_fraction"] = r.bubble_fraction;
    j["bubbles"] = bubbles_json(r.bubbles);
    j["peak_memory_gib"] = r.peak_memory_gib;
    j["mfu"] = r.mfu;
    nlohmann::ordered_json stages = nlohmann::ordered_json::array();
    for (const auto& s : r.stages) {
      stages.push_back({{"name", s.name},
                        {"replicas", s.replicas},
                        {"devices_per_replica", s.devices_per_replica},
                        {"busy_s", s.busy_s},
                        {"idle_s", s.idle_s},
                        {"peak_memory_gib", s.peak_memory_bytes / kGiB},
                        {"bubbles", bubbles_json(s.bubbles)}});
    }
    j["devices"] = stages;  // busy/idle per stage (each stage's replicas are alike; means over them)
    j["ranks"] = r.ranks;
    j["events"] = r.events;
    j["simulation_s"] = elapsed;
    if (!trace.empty()) j["trace"] = trace;
    if (scheduled) j["bubble_report"] = bubble_report_json(scheduled->report, published);
    if (data_report) j["data_report"] = data_report_json(*data_report);
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  std::cout << "braid simulate: " << run.source << "\n"
            << "strategy " << plan::strategy_name(chosen.strategy) << " (layout " << plan::layout_name(chosen.layout)
            << "), schedule " << spec::schedule_name(program.schedule) << ", " << r.devices << " devices as " << r.ranks
            << " simulated ranks (DP replicas of each stage)\n\n";
  const spec::Schedule scored = allowed.front();
  // Optimus' estimate is the bubble scheduler's fine schedule, itself simulated.
  const char* scored_by =
      chosen.layout == plan::Layout::colocated ? "planner's estimate, the fine schedule" : "planner's closed form";
  std::cout << "  step time          " << seconds(r.step_time_s) << "   (" << scored_by
            << (program.schedule == scored ? "" : std::string(" for ") + spec::schedule_name(scored)) << ": "
            << seconds(estimate) << ", " << (r.step_time_s >= estimate ? "+" : "")
            << fixed(100 * (r.step_time_s / estimate - 1), 1) << "%)\n"
            << "  bubble fraction    " << fixed(100 * r.bubble_fraction, 1) << "%   MFU " << fixed(100 * r.mfu, 1)
            << "%   peak memory " << fixed(r.peak_memory_gib, 1) << " GiB\n"
            << "  idle per device    " << bubbles_text(r.bubbles) << "\n\n";
  std::cout << "  " << pad("stage", 34) << pad("replicas", 9, true) << pad("busy", 12, true) << pad("idle", 12, true)
            << pad("peak GiB", 10, true) << "  idle by cause\n";
  for (const auto& s : r.stages) {
    std::cout << "  " << pad(s.name, 34)
              << pad(std::to_string(s.replicas) + "x" + std::to_string(s.devices_per_replica), 9, true)
              << pad(seconds(s.busy_s), 12, true) << pad(seconds(s.idle_s), 12, true)
              << pad(fixed(s.peak_memory_bytes / kGiB, 1), 10, true) << "  " << bubbles_text(s.bubbles) << "\n";
  }
  if (scheduled) print_bubble_report(scheduled->report, published);
  if (data_report) print_data_report(std::cout, *data_report);
  if (vm.count("gantt")) std::cout << "\n" << sim::gantt(program, r);
  std::cout << "\nsimulated " << r.events << " instructions in " << seconds(elapsed) << " ("
            << fixed(r.events / std::max(elapsed, 1e-9) / 1e6, 2) << " M events/s)";
  if (!trace.empty())
    std::cout << "; trace written to " << trace << " (open it in ui.perfetto.dev or chrome://tracing)";
  std::cout << "\n";
  return kExitOk;
}

}  // namespace braid::cli
