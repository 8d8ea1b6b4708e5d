// braid groups: the process groups a plan needs on N ranks, as a runtime builds them.
#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>

#include "core/common/error.hpp"
#include "core/cost/cost_model.hpp"
#include "core/orchestrate/planning.hpp"
#include "core/runtime/groups.hpp"
#include "core/runtime/groups_io.hpp"
#include "tools/braid/commands.hpp"
#include "tools/braid/parse_options.hpp"
#include "tools/braid/plan_options.hpp"

namespace po = boost::program_options;

namespace braid::cli {

int run_groups(const std::vector<std::string>& args) {
  PlanOptions plan_opts;
  std::string format = "text";
  int ranks = 0;
  po::options_description opts(
      "usage: braid groups --config RUN.yaml --ranks N [options]\n"
      "\n"
      "Plans the run (or reads --plan) and derives the process groups its N ranks\n"
      "need, one rank per device (rank = the device id pipeline programs use):\n"
      "  - per module a rank grid, order tp-dp-pp (tp ranks consecutive, then the DP\n"
      "    replicas of a stage, then the stages), on the module's devices;\n"
      "  - which module stage(s) each rank holds (several in colocated and monolithic\n"
      "    layouts), with its tp rank and dp replica;\n"
      "  - every tp, dp and pp group of every module, named like\n"
      "    vision.dp[pp=0,tp=1] (the coordinates it fixes);\n"
      "  - the cross-module links (encoder -> projector -> llm -> generator): which\n"
      "    replica sends its activations to which, fanning in or out when the DP\n"
      "    widths differ (replica r of A meets r/(A/B) of B < A, or r*(B/A).. of B > A);\n"
      "  - contrastive models: the batch-sync group of every tower's embedding stage.\n"
      "N must equal the plan's device count. The text summary lists the first few\n"
      "items of each kind (--all: every one); --format json prints everything.\n"
      "\n"
      "options");
  opts.add_options()("help,h", "show this help");
  plan_opts.add_to(opts);
  opts.add_options()("ranks,n", po::value(&ranks)->value_name("N"), "world size: processes, one per device (required)")(
      "format,f", po::value(&format)->value_name("FMT"), "text (default) | json")(
      "all", "text: list every rank, group and link pair instead of the first few");
  po::variables_map vm;
  try {
    po::store(parse_options(args, opts), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::fprintf(stderr, "braid groups: error: %s\n(see 'braid groups --help')\n", e.what());
    return kExitBadInput;
  }
  if (vm.count("help")) {
    std::cout
        << opts
        << "\nexample:\n  braid groups --config configs/runs/clip-vit-l14-64gpu.yaml --strategy distmm --ranks 64\n";
    return kExitOk;
  }
  std::string problem = plan_opts.problem(vm);
  if (problem.empty() && !vm.count("ranks")) problem = "--ranks N is required (the world size: one rank per device)";
  if (problem.empty() && ranks < 1) problem = "--ranks must be at least 1 (got " + std::to_string(ranks) + ")";
  if (problem.empty() && format != "text" && format != "json") {
    problem = "--format must be text or json (got '" + format + "')";
  }
  if (!problem.empty()) {
    std::fprintf(stderr, "braid groups: error: %s\n(see 'braid groups --help')\n", problem.c_str());
    return kExitBadInput;
  }

  const spec::RunSpec run = plan_opts.load_run();
  const cost::CostModel cost(run);
  const plan::Plan plan = orchestrate::make_plan(cost, plan_opts.request(run)).best;
  runtime::Topology topology;
  try {
    topology = runtime::build_groups(run.model, plan, ranks);
  } catch (const Error& e) {
    if (e.status() != Status::invalid_argument) throw;
    // Say which plan: `auto` may pick one that leaves some of the cluster's devices unused.
    if (!plan_opts.plan_file.empty())
      std::fprintf(stderr, "braid groups: error: %s (the plan of %s)\n", e.what(), plan_opts.plan_file.c_str());
    else
      std::fprintf(stderr, "braid groups: error: %s (the %s plan of %s)\n", e.what(),
                   plan::strategy_name(plan.strategy), plan_opts.config.c_str());
    return kExitBadInput;
  }
  if (format == "json") {
    std::cout << runtime::to_json(topology);
  } else {
    std::cout << "braid groups for " << run.source << ": strategy " << plan::strategy_name(plan.strategy) << " (layout "
              << plan::layout_name(plan.layout) << "), " << ranks << " ranks\n\n"
              << runtime::to_text(topology, runtime::TextOptions{vm.count("all") > 0});
  }
  return kExitOk;
}

}  // namespace braid::cli
