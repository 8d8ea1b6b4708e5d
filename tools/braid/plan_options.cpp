#include "tools/braid/plan_options.hpp"

#include "core/common/error.hpp"
#include "core/common/text.hpp"
#include "core/plan/plan_io.hpp"
#include "tools/braid/parse_options.hpp"

namespace po = boost::program_options;

namespace braid::cli {

void PlanOptions::add_to(po::options_description& opts) {
  opts.add_options()("config,c", po::value(&config)->value_name("RUN.yaml"),
                     "run file: model, cluster, training settings (required)")(
      "cluster", po::value(&cluster_file)->value_name("FILE"),
      "price the run on this cluster file instead of the run's own (e.g. one `braid calibrate` wrote); the "
      "run's node count is kept")("strategy,s", po::value(&strategy)->value_name("NAME"),
                                  "auto | megatron | distmm | disttrain | optimus")(
      "tp", po::value(&tp)->value_name("N"),
      "tensor-parallel width (megatron: the whole model; disttrain, optimus: the llm; distmm: the largest encoder)")(
      "pp", po::value(&pp)->value_name("N"), "pipeline stages (same scope as --tp)")(
      "dp", po::value(&dp)->value_name("N"), "data-parallel width (same scope as --tp)")(
      "plan", po::value(&plan_file)->value_name("FILE"),
      "use this plan (YAML, as `braid plan --format yaml` prints) instead of searching");
}

std::string PlanOptions::problem(const po::variables_map& vm) const {
  if (const std::string empty = empty_file_option(vm, {"config", "plan", "cluster"}); !empty.empty()) return empty;
  if (config.empty()) return "--config RUN.yaml is required";
  // 0 is the unset default here, so a given 0 is refused by its presence, not its value.
  for (const char* axis : {"tp", "pp", "dp"}) {
    if (vm.count(axis) && vm[axis].as<int>() < 1) return "--tp, --pp and --dp must be positive";
  }
  auto parsed = plan::parse_strategy(strategy);
  if (!parsed || *parsed == plan::Strategy::fixed) {
    std::string guess = closest_match(strategy, {"auto", "megatron", "distmm", "disttrain", "optimus"});
    return "unknown strategy '" + strategy + "'" + (guess.empty() ? "" : " (did you mean '" + guess + "'?)") +
           "; choose auto, megatron, distmm, disttrain or optimus";
  }
  if (!plan_file.empty() && vm.count("strategy")) return "--plan evaluates a given plan; it does not take --strategy";
  if (!plan_file.empty() && (tp || pp || dp)) return "--plan evaluates a given plan; it does not take --tp/--pp/--dp";
  return "";
}

spec::RunSpec PlanOptions::load_run() const {
  spec::RunSpec run = spec::load_run(config);
  if (!cluster_file.empty()) {
    const int nodes = run.cluster.nodes;
    run.cluster = spec::load_cluster(cluster_file);
    run.cluster.nodes = nodes;
    // What the run file's training needs of its cluster, asked again of this one.
    if (auto problem = spec::check_training_on(run.training, run.cluster))
      throw Error(Status::bad_config, run.source + ": " + problem->field + ": " + problem->message +
                                          " (the cluster of --cluster '" + cluster_file + "')");
  }
  return run;
}

plan::PlanRequest PlanOptions::request(const spec::RunSpec& run) const {
  plan::PlanRequest r;
  r.strategy = *plan::parse_strategy(strategy);
  r.constraints = plan::Constraints{tp, pp, dp};
  if (!plan_file.empty()) {
    r.strategy = plan::Strategy::fixed;
    r.fixed = plan::load_plan(plan_file, run);
  }
  return r;
}

}  // namespace braid::cli
