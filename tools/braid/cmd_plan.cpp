// braid plan: choose a parallel plan for a run and predict its step.
#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>

#include "core/common/error.hpp"
#include "core/cost/cost_model.hpp"
#include "core/orchestrate/planning.hpp"
#include "core/plan/plan_io.hpp"
#include "tools/braid/commands.hpp"
#include "tools/braid/parse_options.hpp"
#include "tools/braid/plan_options.hpp"

namespace po = boost::program_options;

namespace braid::cli {

int run_plan(const std::vector<std::string>& args) {
  PlanOptions plan_opts;
  std::string format = "table";
  po::options_description opts(
      "usage: braid plan --config RUN.yaml [options]\n"
      "\n"
      "Chooses how to spread a multimodal model over the run's cluster (per module:\n"
      "devices, tensor, pipeline and data parallel widths) and predicts the step time,\n"
      "throughput, MFU and peak memory with braid's cost model.\n"
      "\n"
      "strategies:\n"
      "  auto       try every strategy that applies and keep the fastest (default)\n"
      "  megatron   one TP x PP x DP grid for the whole model, encoders in the first stage\n"
      "  distmm     one grid per encoder, joined by a contrastive batch-sync (CLIP-like models)\n"
      "  disttrain  encoders, llm and generator on disjoint devices, one pipeline\n"
      "  optimus    encoder and llm on every device, encoder work in llm bubbles (step: the bubble\n"
      "             scheduler's fine schedule, simulated)\n"
      "\n"
      "options");
  opts.add_options()("help,h", "show this help");
  plan_opts.add_to(opts);
  opts.add_options()("format,f", po::value(&format)->value_name("FMT"), "table (default) | json | yaml");
  po::variables_map vm;
  try {
    po::store(parse_options(args, opts), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::fprintf(stderr, "braid plan: error: %s\n(see 'braid plan --help')\n", e.what());
    return kExitBadInput;
  }
  if (vm.count("help")) {
    std::cout << opts << "\nexample:\n  braid plan --config configs/runs/clip-vit-l14-64gpu.yaml --format json\n";
    return kExitOk;
  }
  std::string problem = plan_opts.problem(vm);
  if (problem.empty() && format != "table" && format != "json" && format != "yaml") {
    problem = "--format must be table, json or yaml (got '" + format + "')";
  }
  if (!problem.empty()) {
    std::fprintf(stderr, "braid plan: error: %s\n(see 'braid plan --help')\n", problem.c_str());
    return kExitBadInput;
  }

  const spec::RunSpec run = plan_opts.load_run();
  const cost::CostModel cost(run);
  const plan::PlanRequest request = plan_opts.request(run);
  const plan::PlanResult result = orchestrate::make_plan(cost, request);
  const plan::PlanReport report = orchestrate::plan_report(cost, result, request.strategy);
  if (format == "json") {
    std::cout << plan::to_json(report);
  } else if (format == "yaml") {
    std::cout << plan::to_yaml(report);
  } else {
    std::cout << plan::to_table(report);
  }
  return kExitOk;
}

}  // namespace braid::cli
