// braid train: trains a reference model (core/nn) on the generated shapes dataset, on one
// process or on every process of an mpiexec launch, with the layout a plan gives.
#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>

#include "core/common/error.hpp"
#include "core/common/file.hpp"
#include "core/cost/cost_model.hpp"
#include "core/orchestrate/planning.hpp"
#include "core/runtime/world.hpp"
#include "core/spec/run.hpp"
#include "core/train/layout.hpp"
#include "core/train/rank_program.hpp"
#include "core/train/train_device.hpp"
#include "core/train/trainer.hpp"
#include "tools/braid/commands.hpp"
#include "tools/braid/parse_options.hpp"
#include "tools/braid/plan_options.hpp"
#include "tools/braid/rank_error.hpp"
#include "tools/braid/same_command.hpp"

namespace po = boost::program_options;

namespace braid::cli {
namespace {

const char* kTrainUsage =
    "usage: braid train --config RUN.yaml [options]\n"
    "       mpiexec -n N braid train --config RUN.yaml [options]\n"
    "\n"
    "Trains the run's model (the reference CLIP or MLLM of core/nn, float32 on the host)\n"
    "on braid's generated image-caption dataset, on this process or on every process of\n"
    "an MPI launch (one rank per device of the plan; the run's cluster is sized to the\n"
    "world). The plan decides which rank holds which module: by default every module on\n"
    "every rank, data parallel (megatron with --tp 1 --pp 1); --strategy distmm puts the\n"
    "image and text towers of a CLIP on disjoint ranks joined by the batch-sync; --pp and\n"
    "--tp split the modules into pipeline stages and tensor-parallel shards (a rank holds\n"
    "only its slices of the split weights, gradients and optimizer state), and the run's\n"
    "training.zero_stage shards optimizer state (1), gradients (2) and weights (3) over\n"
    "each module's data-parallel group. Layouts the reference modules cannot run are\n"
    "refused with the module and the reason. --resume loads a checkpoint written under\n"
    "any layout and world size.\n"
    "\n"
    "Rank 0 prints a progress line (step, loss, samples/s, ETA) every N steps (on a\n"
    "terminal and in one process, one line rewritten after each step), an evaluation every\n"
    "trainer.eval_every steps and at the end (CLIP: top-1 image->text and text->image\n"
    "retrieval on held-out scenes; MLLM: caption loss and token accuracy), and a summary.\n"
    "The same run file and seed give the same data, weights and losses on any number of\n"
    "ranks (up to float summation order). Optimizer, steps, evaluation and checkpoint\n"
    "cadence come from the run file's optional `trainer:` section. The summary ends with\n"
    "the measured step against the simulated one (the same program, replayed on the images\n"
    "the steps trained), idle and compute time per rank (compute by kind: forward,\n"
    "backward, other), measured and simulated, and each rank's peak memory by kind\n"
    "(weights, gradients, optimizer, activations, communication) next to the planner's\n"
    "prediction for the same plan.\n"
    "\n"
    "options";

// The plan braid train runs on `run` (its cluster fitted to the world).
plan::Plan train_plan(const PlanOptions& plan_opts, const spec::RunSpec& run) {
  const cost::CostModel cost(run);
  plan::PlanRequest request = plan_opts.request(run);
  request.constraints = train::trainable(run.model, request.constraints);
  return orchestrate::make_plan(cost, request).best;
}

// "; it plans on 2 or 4 processes": the nearest process counts (up to twice `world`) where
// the same command finds a plan, or "" when none does.
std::string process_counts_that_plan(const PlanOptions& plan_opts, const spec::RunSpec& run, int world) {
  std::vector<int> found;
  for (int step = 1; step < 2 * world && found.size() < 2; ++step)
    for (int n : {world - step, world + step}) {
      if (n < 1 || n > 2 * world || found.size() >= 2) continue;
      try {
        train_plan(plan_opts, train::fit_cluster_to_world(run, n));
        found.push_back(n);
      } catch (const Error&) {  // no plan there either (or no such world): look further
      }
    }
  if (found.empty()) return "";
  std::sort(found.begin(), found.end());
  std::string counts = std::to_string(found[0]);
  if (found.size() > 1) counts += " or " + std::to_string(found[1]);
  return "; it plans on " + counts + " process" + (found.size() > 1 || found[0] > 1 ? "es" : "");
}

}  // namespace

int run_train(const std::vector<std::string>& args) {
  PlanOptions plan_opts;
  plan_opts.strategy = "megatron";
  long long steps = 0, seed = -1, progress_every = 0;
  int threads = 0, data_workers = 1;
  std::string device = "auto";
  std::string metrics, checkpoint_dir, gradients_dir, schedule, trace;
  po::options_description opts(kTrainUsage);
  opts.add_options()("help,h", "show this help");
  plan_opts.add_to(opts);
  opts.add_options()("steps", po::value(&steps)->value_name("N"), "steps to train (default: trainer.steps of the run)")(
      "seed", po::value(&seed)->value_name("N"), "seed of the weights and the data (default: the run's data.seed)")(
      "metrics", po::value(&metrics)->value_name("FILE"),
      "write JSON lines: {step, loss, samples_per_s} per step, {eval: true, step, ...} per evaluation")(
      "checkpoint-dir", po::value(&checkpoint_dir)->value_name("DIR"),
      "write checkpoints here every trainer.checkpoint_every steps and at the end")(
      "resume",
      "continue from the newest valid checkpoint in --checkpoint-dir (a corrupted one is reported and skipped)")(
      "override-lr-schedule",
      "with --resume: train the steps left on this run's learning-rate schedule when the checkpoint was trained "
      "under another (another --steps, or the run file's learning_rate, warmup_steps or min_lr_ratio changed); "
      "without it such a resume is refused")(
      "schedule", po::value(&schedule)->value_name("S"),
      "the program to run, one the plan allows (default: the plan's first): 1f1b | gpipe (llm pipelines); "
      "batch-sync | distmm-pipe | two-phase (contrastive models); optimus-fine | optimus-coarse | encoder-first | "
      "optimus-online (colocated plans: the bubble scheduler's programs; online also fills waits with ready "
      "encoder tasks)")("trace", po::value(&trace)->value_name("FILE"),
                        "write the last step, as every rank executed it, as a Chrome trace (the format of braid "
                        "simulate --trace)")(
      "profile-ops",
      "time every op of the timed steps (forward, backward and optimizer; a GPU waits for each) and print them "
      "by op against what the cost model charges for the same calls on the cluster file (with --cluster, a "
      "calibrated one): which kernels a step measured off its simulation misprices; slows the steps a little")(
      "no-reorder", "keep the loader's sample order (no DistTrain reordering over DP replicas)")(
      "data-workers", po::value(&data_workers)->value_name("N"),
      "threads rendering the next steps' samples ahead of training (default 1; 0: render them in the training "
      "loop)")("threads", po::value(&threads)->value_name("N"),
               "host threads per process, braid's and OpenBLAS's (default: trainer.threads, else the node's cores / "
               "processes on it)")(
      "device", po::value(&device)->value_name("D"),
      "what runs the ops: auto (default: braid's host ops, called directly), host (the host backend "
      "libbraid-host.so through the device interface: same results bit for bit), host-staged (the same, each op "
      "copying its inputs in and outputs out as on a GPU), emulated (the host backend as a device whose memory is "
      "not the host's: the trainer's tensors stay in it and cross to the host only to be sent, reduced, "
      "checkpointed or evaluated; what cuda does, testable without a GPU), cuda (the CUDA backend, GPU local-rank "
      "modulo the node's GPUs, tensors resident as emulated). On a device, DP and TP all-reduces run through "
      "its communication plugin (NCCL, or MPI's v2 for emulated) unless BRAID_DEVICE_COLLECTIVES=host stages "
      "them through host memory and MPI")(
      "dump-gradients", po::value(&gradients_dir)->value_name("DIR"),
      "write each step's reduced gradients as checkpoint shards (for layout-equivalence checks)")(
      "progress-every", po::value(&progress_every)->value_name("N"),
      "a progress line every N steps (default: a round N giving at most 20 lines; in one process on a terminal, one "
      "line "
      "rewritten after every step)")("quiet,q", "no progress lines (evaluations and the summary still print)");
  po::variables_map vm;
  try {
    po::store(parse_options(args, opts), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::fprintf(stderr, "braid train: error: %s\n(see 'braid train --help')\n", e.what());
    return kExitBadInput;
  }
  if (vm.count("help")) {
    std::cout << opts
              << "\nexamples:\n  braid train --config configs/runs/tiny-clip.yaml\n"
                 "  mpiexec -n 2 braid train --config configs/runs/tiny-clip.yaml --strategy distmm --metrics m.jsonl\n"
                 "  braid train --config configs/runs/tiny-mllm.yaml --checkpoint-dir ckpt --resume\n";
    return kExitOk;
  }
  std::string problem = plan_opts.problem(vm);
  if (problem.empty() && vm.count("steps") && steps < 1) problem = "--steps must be at least 1";
  if (problem.empty() && vm.count("seed") && seed < 0) problem = "--seed must be >= 0";
  if (problem.empty() && vm.count("resume") && checkpoint_dir.empty()) problem = "--resume needs --checkpoint-dir DIR";
  if (problem.empty() && vm.count("override-lr-schedule") && !vm.count("resume"))
    problem = "--override-lr-schedule needs --resume";
  if (problem.empty() && !spec::host_threads_problem(threads).empty())
    problem = "--threads " + spec::host_threads_problem(threads);
  if (problem.empty()) problem = train::train_device_problem(device);
  if (problem.empty() && !spec::host_threads_problem(data_workers).empty())
    problem = "--data-workers " + spec::host_threads_problem(data_workers);
  if (problem.empty() && vm.count("progress-every") && progress_every < 1) problem = "--progress-every must be >= 1";
  if (problem.empty() && vm.count("progress-every") && vm.count("quiet"))
    problem = "--progress-every and --quiet contradict each other: give one";
  if (problem.empty()) problem = empty_file_option(vm, {"metrics", "trace", "checkpoint-dir", "dump-gradients"});
  // An output written over an input, or over the other output, loses it.
  const std::pair<const char*, std::string> outputs[] = {{"--metrics", metrics}, {"--trace", trace}};
  const std::pair<const char*, std::string> inputs[] = {
      {"--config", plan_opts.config}, {"--cluster", plan_opts.cluster_file}, {"--plan", plan_opts.plan_file}};
  for (const auto& [option, path] : outputs) {
    if (path.empty() || !problem.empty()) continue;
    for (const auto& [input, read] : inputs)
      if (!read.empty() && same_path(path, read))
        problem = std::string(option) + " '" + path + "' is the file of " + input + ": it would be written over";
  }
  if (problem.empty() && !metrics.empty() && !trace.empty() && same_path(metrics, trace))
    problem = "--metrics and --trace name one file, '" + metrics + "': give each its own";
  if (!problem.empty()) {
    std::fprintf(stderr, "braid train: error: %s\n(see 'braid train --help')\n", problem.c_str());
    return kExitBadInput;
  }
  // Only plans of whole modules run here: tp 1, pp 1 unless asked otherwise.
  const bool whole_modules = plan_opts.plan_file.empty() && (!plan_opts.tp || !plan_opts.pp);
  if (plan_opts.plan_file.empty()) {
    if (!plan_opts.tp) plan_opts.tp = 1;
    if (!plan_opts.pp) plan_opts.pp = 1;
  }

  runtime::World world = runtime::World::from_plugin("mpi");
  const int rank = world.rank();
  const auto fail = [&](const std::exception_ptr& error) { return fail_rank(world, error); };
  // Set-up: every rank runs one command on the same files (checked first), then reads them,
  // plans and takes the options alike, so an error here is said once and ends every rank.
  train::TrainOptions o;
  std::int64_t total = 0;
  spec::Schedule runs{};
  const int setup = agree_on_setup(world, [&] {
    require_same_command(world, args, {plan_opts.config, plan_opts.plan_file, plan_opts.cluster_file});
    const spec::RunSpec asked = plan_opts.load_run();
    o.run = train::fit_cluster_to_world(asked, world.size());
    const cost::CostModel cost(o.run);
    try {
      o.plan = train_plan(plan_opts, o.run);
    } catch (const Error& e) {
      if (e.status() != Status::infeasible || !whole_modules) throw;
      throw Error(Status::infeasible,
                  std::string(e.what()) + "\n  braid train plans tp 1 and pp 1 where --tp and --pp " +
                      "do not say otherwise" + process_counts_that_plan(plan_opts, asked, world.size()));
    }
    o.steps = steps;
    if (seed >= 0) o.seed = static_cast<std::uint64_t>(seed);
    o.metrics_path = metrics;
    o.checkpoint_dir = checkpoint_dir;
    o.resume = vm.count("resume") > 0;
    o.override_lr_schedule = vm.count("override-lr-schedule") > 0;
    o.gradients_dir = gradients_dir;
    o.reorder = !vm.count("no-reorder");
    o.data_workers = data_workers;
    o.trace_path = trace;
    o.profile_ops = vm.count("profile-ops") > 0;
    o.threads = threads;
    o.device = device;
    total = o.steps ? o.steps : o.run.trainer.steps;
    o.progress_every = vm.count("quiet")            ? 0
                       : vm.count("progress-every") ? progress_every
                                                    : train::default_progress_interval(total);
    // mpiexec gives its ranks a pseudo-terminal even when its own output goes to a file: a live
    // line only for a single process on a terminal.
    o.live_progress = o.progress_every > 0 && !vm.count("progress-every") && world.size() == 1 && isatty(STDOUT_FILENO);
    try {
      o.schedule = train::executed_schedule(cost, o.plan, schedule);
    } catch (const Error& e) {
      throw Error(Status::invalid_argument, std::string("--schedule: ") + e.what());  // an option the plan does not run
    }
    runs = *o.schedule;
  });
  if (setup != kExitOk) return setup;
  // Inside a step, before its pending messages are torn down (they would wait for peers
  // that wait for this rank). One process returns from it, and the error then reaches the
  // catch below: said there already, not again.
  int fatal = kExitOk;
  o.on_fatal = [&](const std::exception_ptr& error) { fatal = fail(error); };
  o.agree = [&](const std::function<void()>& checks) {
    fatal = agree_on_setup(world, checks);
    if (fatal != kExitOk) throw Error(Status::bad_config, "set-up failed on some rank (said above)");
  };
  try {
    if (rank == 0) {
      std::cout << "braid train: " << o.run.model.name << " on " << world.size() << " process"
                << (world.size() > 1 ? "es" : "") << ", strategy " << plan::strategy_name(o.plan.strategy)
                << ", schedule " << spec::schedule_name(runs) << ", " << total << " steps of "
                << o.run.training.global_batch << " samples\n"
                << std::flush;
    }
    train::train(o, world, std::cout, std::cerr);
    return kExitOk;
  } catch (const std::exception&) {
    return fatal != kExitOk ? fatal : fail(std::current_exception());
  }
}

}  // namespace braid::cli
