#include "core/train/trainer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <ostream>
#include <thread>
#include <utility>

#include "core/calibrate/probe.hpp"
#include "core/common/error.hpp"
#include "core/common/file.hpp"
#include "core/nn/blas.hpp"
#include "core/nn/host_memory.hpp"
#include "core/nn/host_ops.hpp"
#include "core/nn/modules/model.hpp"
#include "core/nn/timed_ops.hpp"
#include "core/plan/evaluate.hpp"
#include "core/runtime/groups.hpp"
#include "core/train/as_trained.hpp"
#include "core/train/checkpoint.hpp"
#include "core/train/evaluate.hpp"
#include "core/train/executor.hpp"
#include "core/train/host_staging.hpp"
#include "core/train/inputs.hpp"
#include "core/train/lr_schedule.hpp"
#include "core/train/run_record.hpp"
#include "core/train/sharded_state.hpp"
#include "core/train/train_device.hpp"
#include "core/train/zero.hpp"

namespace braid::train {
namespace {

// The samples the trainer trains on, for the cost model that prices its program: the dataset
// draws each image's side and caption, and a microbatch runs one pass per side with its text
// padded to the longest caption, so the program's durations come from those passes rather
// than from the run's nominal sizes (what the planner plans for; for the reference runs, the
// largest).
cost::TrainedSamples trained_samples(const data::ShapesDataset& dataset) {
  constexpr std::int64_t kSamples = 4096;
  cost::TrainedSamples trained;
  for (std::int64_t i = 0; i < kSamples; ++i) trained.samples.push_back(trained_sample(dataset.describe(i)));
  return trained;
}

// Where a tower's replica 0 lives: the lowest rank holding the module.
int owner_of(const std::vector<RankLayout>& layouts, const std::string& module) {
  for (const auto& l : layouts)
    if (const ModuleRole* r = l.find(module); r && r->held) return l.rank;
  throw Error(Status::internal, "no rank holds '" + module + "'");
}

nn::Tensor broadcast_tensor(runtime::Communicator& comm, nn::Tensor t, const nn::Shape& shape, int root) {
  if (comm.rank() != root) nn::reset(t, shape);
  comm.broadcast(std::as_writable_bytes(std::span<float>(t.data)), root);
  return t;
}

// Who runs the model in an evaluation: the ranks of the two towers' replica 0 (CLIP, each
// embeds with its tower), or rank 0 (a chain, evaluated whole).
struct Evaluators {
  int image_owner = 0, text_owner = 0;
  std::int64_t embed = 0;
  bool includes(int rank) const { return rank == image_owner || rank == text_owner; }
};

Evaluators evaluators(const spec::RunSpec& run, const nn::Model& model, const std::vector<RankLayout>& layouts) {
  Evaluators e;
  if (model.topology != spec::Topology::contrastive) return e;
  std::string image_name, text_name;
  for (const auto& s : run.model.modules) {
    if (s.role != spec::Role::encoder) continue;
    (s.modality == spec::Modality::image ? image_name : text_name) = s.name;
    e.embed = s.embed_dim;
  }
  e.image_owner = owner_of(layouts, image_name);
  e.text_owner = owner_of(layouts, text_name);
  return e;
}

EvalMetrics evaluate(const Evaluators& who, const nn::Model& model, const std::vector<data::Sample>& samples, int rank,
                     runtime::Communicator& world, nn::Ops& ops, std::int64_t step) {
  EvalMetrics m;
  m.step = step;
  if (model.topology == spec::Topology::contrastive) {
    const int image_owner = who.image_owner, text_owner = who.text_owner;
    const nn::Shape shape{static_cast<std::int64_t>(samples.size()), who.embed};
    nn::Tensor image, text;
    if (rank == image_owner) image = image_embeddings(ops, *model.clip, samples);
    if (rank == text_owner) text = text_embeddings(ops, *model.clip, samples);
    image = broadcast_tensor(world, std::move(image), shape, image_owner);
    text = broadcast_tensor(world, std::move(text), shape, text_owner);
    std::vector<std::int64_t> scenes;
    for (const auto& s : samples) scenes.push_back(data::scene_id(s.scene));
    const Retrieval r = retrieval_top1(image, text, scenes);
    m.values = {{"retrieval_top1_i2t", r.image_to_text}, {"retrieval_top1_t2i", r.text_to_image}};
  } else {
    double v[2] = {0, 0};
    if (who.includes(rank)) {  // rank 0
      const CaptionMetrics c = caption_metrics(ops, *model.chain, samples);
      v[0] = c.loss;
      v[1] = c.token_accuracy;
    }
    world.broadcast(std::as_writable_bytes(std::span<double>(v)), 0);
    m.values = {{"caption_loss", v[0]}, {"token_accuracy", v[1]}};
  }
  return m;
}

// A checkpoint's metadata, for people: "<run>; <layout>" (the run file, model and seed; the
// world, strategy and grids). A resume compares the run record (run_record.hpp), or the run part
// for a checkpoint written before braid recorded one; the layout may differ, and the state is
// then resharded on load.
std::string run_identity(const TrainOptions& o, std::uint64_t seed) {
  return "run " + o.run.source + "; model " + o.run.model.name + "; seed " + std::to_string(seed);
}

std::string layout_description(const TrainOptions& o, int world) {
  std::string layout = "world " + std::to_string(world) + "; strategy " + plan::strategy_name(o.plan.strategy) + "; " +
                       plan::describe_grids(o.plan);
  if (o.plan.virtual_stages > 1) layout += ", " + std::to_string(o.plan.virtual_stages) + " virtual stages";
  for (const auto& m : o.plan.modules) {
    if (m.layers_per_stage.size() < 2) continue;
    layout += ", " + m.name + " layers";
    for (std::size_t i = 0; i < m.layers_per_stage.size(); ++i)
      layout += (i ? "+" : " ") + std::to_string(m.layers_per_stage[i]);
  }
  return layout;
}

std::string metadata(const TrainOptions& o, std::uint64_t seed, int world) {
  return run_identity(o, seed) + "; " + layout_description(o, world);
}

// The two parts of a checkpoint's metadata (checkpoints older than the split have the same
// shape: "...; seed N; world W; strategy S").
std::pair<std::string, std::string> split_metadata(const std::string& meta) {
  const auto at = meta.find("; world ");
  if (at == std::string::npos) return {meta, ""};
  return {meta.substr(0, at), meta.substr(at + 2)};
}

// A run part with its run file as a canonical path: "configs/runs/x.yaml", "./configs/runs/x.yaml"
// and the absolute path name one run file (a relative one resolved from here).
std::string canonical_identity(const std::string& identity) {
  const auto end = identity.find("; model ");
  if (identity.rfind("run ", 0) != 0 || end == std::string::npos) return identity;
  std::error_code ec;
  const auto file = std::filesystem::weakly_canonical(std::filesystem::absolute(identity.substr(4, end - 4), ec), ec);
  return ec ? identity : "run " + file.string() + identity.substr(end);
}

void expect_same_run(const CheckpointContents& c, const RunRecord& record, const std::string& identity) {
  if (RunRecord::recorded(c)) {
    if (const std::string change = run_change(c, record); !change.empty())
      throw Error(Status::bad_config, "--resume: " + change + "; resume with the run file it was trained with");
    return;
  }
  // Written before the run record: the same run file, model and seed.
  const std::string theirs = split_metadata(c.metadata).first;
  if (canonical_identity(theirs) != canonical_identity(identity))
    throw Error(Status::bad_config,
                "checkpoint '" + c.source + "' is of another run (" + theirs + "), this one is " + identity);
}

// "world 4 (strategy megatron; tp 2, pp 1, dp 2)" from a layout part.
std::string layout_for_people(const std::string& layout) {
  const auto at = layout.find("; ");
  return at == std::string::npos ? layout : layout.substr(0, at) + " (" + layout.substr(at + 2) + ")";
}

// `schedule`, `record`: the learning rates and the run the state was trained under (checkpoints;
// null for gradient dumps).
void save(const std::string& dir, std::int64_t step, int rank, int world, const std::string& meta, Executor& executor,
          const LrSchedule* schedule, const RunRecord* record, runtime::Communicator& comm, int keep) {
  const bool with_state = schedule != nullptr;
  // Optimizer state not created yet is saved without elements (a default Tensor is a scalar's shape).
  const auto state = [](const nn::Tensor& t) { return t.data.empty() ? nn::Tensor(nn::Shape{0}) : t; };
  // ZeRO-sharded state gathered over each DP group: a checkpoint holds tensor-parallel slices.
  std::map<std::string, std::map<const nn::Parameter*, nn::Tensor>> gathered;
  for (const char* kind :
       with_state ? std::vector<const char*>{"param", "adam_m", "adam_v"} : std::vector<const char*>{"grad"})
    gathered[kind] = executor.gather_sharded(kind);
  const auto whole = [&](const char* kind, const TrainedParameter& p, const nn::Tensor& held) -> const nn::Tensor& {
    const auto& of = gathered[kind];
    const auto it = of.find(p.param);
    return it == of.end() ? held : it->second;
  };
  CheckpointContents c;
  c.metadata = meta;
  nn::Tensor scratch;  // a device's tensor copied to the host
  const auto host = [&](const nn::Tensor& t) -> const nn::Tensor& { return on_host(executor.ops(), t, scratch); };
  for (auto& p : executor.parameters()) {
    if (with_state) {
      c.add_tensor(state_name("param", *p.param), host(whole("param", p, p.param->value)));
      c.add_tensor(state_name("adam_m", *p.param), state(host(whole("adam_m", p, p.state.m))));
      c.add_tensor(state_name("adam_v", *p.param), state(host(whole("adam_v", p, p.state.v))));
      c.add_int("adam_step/" + p.param->name, p.state.step);
    } else {
      c.add_tensor(state_name("grad", *p.param), host(whole("grad", p, p.param->grad)));
    }
  }
  if (schedule) schedule->record(c);
  if (record) record->record(c);
  write_shard(dir, step, rank, world, c);
  comm.barrier();
  if (rank == 0) commit(dir, step, world, keep);
  comm.barrier();
}

// Whether `c` (this rank's shard under the same layout) holds every entry restore needs.
bool holds_all(const CheckpointContents& c, const std::vector<TrainedParameter>& params) {
  return std::all_of(params.begin(), params.end(), [&](const TrainedParameter& p) {
    return c.has_tensor(state_name("param", *p.param)) && c.has_tensor(state_name("adam_m", *p.param)) &&
           c.has_tensor(state_name("adam_v", *p.param)) && c.has_blob("adam_step/" + p.param->name);
  });
}

// The fast path: this rank's own shard, written under the same layout.
void restore(const CheckpointContents& c, std::vector<TrainedParameter>& params) {
  const auto state = [](const nn::Tensor& t) { return t.numel() == 0 ? nn::Tensor() : t; };
  for (auto& p : params) {
    const nn::Tensor& value = c.tensor(state_name("param", *p.param));
    if (value.shape != held_shape(*p.param))
      throw Error(Status::bad_config, "checkpoint '" + c.source + "': " + p.param->name + " has shape " +
                                          nn::shape_string(value.shape) + ", the model " +
                                          nn::shape_string(held_shape(*p.param)));
    nn::AdamWState adam;
    adam.m = state(c.tensor(state_name("adam_m", *p.param)));
    adam.v = state(c.tensor(state_name("adam_v", *p.param)));
    adam.step = c.get_int("adam_step/" + p.param->name);
    hold_state(p, value, std::move(adam));
  }
}

// Another layout or world wrote the checkpoint: every shard joined whole, this rank's slices cut.
void restore_resharded(const std::vector<CheckpointContents>& shards, const std::string& file,
                       std::vector<TrainedParameter>& params) {
  const WholeState whole(shards, file);
  for (auto& p : params) {
    HeldState held = whole.held_by(*p.param);
    hold_state(p, std::move(held.value), std::move(held.adam));
  }
}

// The host's speed now against its calibration (calibrate/probe.hpp): the cluster file's probe
// timed again, over its time there; 0 for a file without one. Collective.
double probe_host(const spec::ClusterSpec& cluster, runtime::Communicator& comm, const runtime::World& world,
                  int threads, const std::shared_ptr<nn::DeviceBackend>& backend) {
  if (cluster.probe.seconds <= 0) return 0;
  const calibrate::ComputeOptions o{threads, true, backend};
  const calibrate::ProbeShape shape{cluster.probe.rows, cluster.probe.width};
  return calibrate::probe_linear(comm, world.local_rank(), world.local_size(), o, shape) / cluster.probe.seconds;
}

}  // namespace

spec::RunSpec fit_cluster_to_world(const spec::RunSpec& run, int world) {
  if (world < 1) throw Error(Status::invalid_argument, "a world of " + std::to_string(world) + " processes");
  spec::RunSpec fitted = run;
  const int width = run.cluster.devices_per_node;
  if (world <= width) {
    fitted.cluster.nodes = 1;
    fitted.cluster.devices_per_node = world;
  } else if (world % width == 0) {
    fitted.cluster.nodes = world / width;
  } else {
    const std::string cluster = run.cluster.source.empty() ? "the cluster of " + run.source : run.cluster.source;
    throw Error(Status::invalid_argument, std::to_string(world) + " processes do not fill nodes of " +
                                              std::to_string(width) + " devices (" + cluster + ")");
  }
  return fitted;
}

TrainReport train(const TrainOptions& o, runtime::World& world, std::ostream& out, std::ostream& log) {
  const spec::RunSpec& run = o.run;
  const int rank = world.rank(), size = world.size();
  const std::uint64_t seed = o.seed.value_or(run.data.seed);
  const std::int64_t total = o.steps > 0 ? o.steps : run.trainer.steps;
  const LrSchedule schedule = LrSchedule::of(run.trainer, total);
  // The same on every rank: a plan this world or trainer cannot run is said once.
  runtime::Topology topology;
  std::vector<RankLayout> layouts;
  std::optional<nn::Model> built;
  std::optional<data::ShapesDataset> shapes;
  const AsTrained as_run = as_trained(run);  // what prices the program and predicts the memory
  const auto lay_out = [&] {
    topology = runtime::build_groups(run.model, o.plan, size);
    for (int r = 0; r < size; ++r) layouts.push_back(layout_for(run.model, topology, r));
    built.emplace(nn::build_model(run.model, seed));              // refuses modules the reference models do not run
    built->set_recompute(cost::recomputed(as_run.run.training));  // as the cost model prices it
    shapes.emplace(data::run_shapes_config(run, seed));           // and data they cannot take
  };
  agreed(o.agree, lay_out);

  int threads = o.threads > 0 ? o.threads : run.trainer.threads;
  if (threads <= 0)
    threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / std::max(1, world.local_size()));
  // OpenBLAS too: by default each rank would start one thread per core, and a GEMM's bits
  // can depend on the count, so --threads fixes both.
  nn::set_blas_threads(threads);
  nn::keep_freed_host_memory();  // activations are reallocated every step
  TrainDevice device;            // a device this host lacks, or a plugin that does not load: said once
  agreed(o.agree, [&] { device = open_train_device(o.device, threads, world.local_rank()); });
  // --profile-ops: every op through a timer that records inside the timed steps alone (a
  // device's stream is synchronized after each op, so the time is the op's, not its launch's;
  // those waits are the profile's, not the step's, and are left out of its host waits).
  std::uint64_t profile_waits = 0;
  std::optional<nn::TimedOps> timed_ops;
  if (o.profile_ops) {
    std::function<void()> wait;
    if (device.backend)
      wait = [backend = device.backend, &profile_waits] {
        backend->synchronize();
        ++profile_waits;
      };
    timed_ops.emplace(*device.ops, std::move(wait));
    timed_ops->set_recording(false);
  }
  nn::Ops& ops = timed_ops ? static_cast<nn::Ops&>(*timed_ops) : *device.ops;
  if (rank == 0 && device.backend) out << "device: " << device.description << "\n" << std::flush;
  std::string no_device_collectives;
  const std::unique_ptr<DeviceCollectives> collectives =
      DeviceCollectives::open(device.backend, world, no_device_collectives);
  if (rank == 0 && device.backend)
    out << "device collectives: "
        << (collectives ? collectives->description()
                        : "none (" + no_device_collectives + "): every collective through host memory and MPI")
        << "\n"
        << std::flush;
  nn::Model& model = *built;
  const data::ShapesDataset& dataset = *shapes;
  ExecutorOptions eo;
  eo.data.reorder = o.reorder;
  eo.data.prefetch.workers = o.data_workers;
  eo.data.last_step = total;
  eo.on_fatal = o.on_fatal;
  eo.schedule = o.schedule;
  eo.collectives = collectives.get();
  eo.agree = o.agree;
  if (device.backend && !device.backend->device().is_host())  // resident: cuda, emulated
    eo.device_in_use = [backend = device.backend] { return static_cast<std::size_t>(backend->memory_stats().in_use); };
  else if (device.backend)  // the host backend's pool is this process's heap
    eo.idle_heap = [backend = device.backend] {
      const nn::DeviceMemoryStats m = backend->memory_stats();
      return static_cast<std::size_t>(m.reserved - m.in_use);
    };
  const std::string meta = metadata(o, seed, size);
  const RunRecord record = RunRecord::of(run, seed);
  Executor* executor_ptr = nullptr;
  if (!o.gradients_dir.empty()) {
    agreed(o.agree, [&] {
      // Dumps are files of a checkpoint's name and format: among checkpoints a resume would
      // take the newest dump for one.
      if (!o.checkpoint_dir.empty() && same_path(o.gradients_dir, o.checkpoint_dir))
        throw Error(Status::invalid_argument, "--dump-gradients '" + o.gradients_dir +
                                                  "' is the checkpoint directory: its step files would read as "
                                                  "checkpoints; give it a directory of its own");
      if (rank == 0) create_checkpoint_dir(o.gradients_dir);
    });
    eo.after_reduce = [&](std::int64_t step) {
      world.communicator().barrier();
      save(o.gradients_dir, step, rank, size, meta, *executor_ptr, nullptr, nullptr, world.communicator(), 0);
    };
  }
  const cost::CostModel cost(as_run.run, trained_samples(dataset), cost::Kernels::reference);
  Executor executor(run, cost, o.plan, model, dataset, topology, layouts[static_cast<std::size_t>(rank)], world, ops,
                    eo);
  executor_ptr = &executor;
  runtime::Communicator& comm = executor.world_communicator();

  TrainReport report;
  report.layout = executor.layout().summary;
  std::int64_t first = 1;
  std::optional<CheckpointDirLock> checkpoint_lock;  // rank 0's, for the whole run
  agreed(o.agree, [&] {
    if (rank == 0 && !o.checkpoint_dir.empty()) {
      create_checkpoint_dir(o.checkpoint_dir);
      checkpoint_lock.emplace(o.checkpoint_dir);
      if (const auto step = o.resume ? std::nullopt : newest_checkpoint_file(o.checkpoint_dir))
        throw Error(Status::invalid_argument, "checkpoint directory '" + o.checkpoint_dir +
                                                  "' already holds checkpoints (up to " + checkpoint_file_name(*step) +
                                                  "): continue them with --resume, or give another --checkpoint-dir");
    }
    // The trace is written after the last step: refuse a path it cannot go to before training.
    if (rank == 0 && !o.trace_path.empty()) {
      if (const std::string why = unwritable_reason(o.trace_path); !why.empty())
        throw Error(Status::io, "cannot write the trace to '" + o.trace_path + "': " + why);
    }
  });
  comm.barrier();  // the directory exists before the other ranks look into it
  if (o.resume)
    agreed(o.agree, [&] {
      if (o.checkpoint_dir.empty()) throw Error(Status::invalid_argument, "--resume needs --checkpoint-dir");
      // The newest checkpoint whatever world wrote it: another layout is resharded on load.
      const CheckpointScan scan = latest_valid_any(o.checkpoint_dir);
      if (rank == 0) log << "braid train: " << describe(scan) << "\n";
      // Committed checkpoints and none usable: starting afresh would overwrite them and the
      // metrics file, which a person may still repair (or that hold a manifest's good shards).
      if (!scan.step &&
          std::any_of(scan.skipped.begin(), scan.skipped.end(), [](const SkippedCheckpoint& s) { return s.committed; }))
        throw Error(Status::bad_config, "--resume: no checkpoint in '" + o.checkpoint_dir +
                                            "' is usable (listed above); nothing was changed: move them aside to "
                                            "start afresh, or give another --checkpoint-dir");
      if (scan.step) {
        // Before anything is restored: a refusal leaves the run as it was.
        const auto same_schedule = [&](const CheckpointContents& c) {
          if (*scan.step >= total) return;  // nothing left to train
          const std::string change = schedule_change(c, schedule, *scan.step + 1);
          if (change.empty()) return;
          if (!o.override_lr_schedule)
            throw Error(Status::bad_config, "--resume: " + change +
                                                "; resume with the --steps and trainer settings it was trained with, "
                                                "or pass --override-lr-schedule to train the steps left on this run's");
          if (rank == 0)
            log << "braid train: --override-lr-schedule: " << change << "; the steps left follow this run's\n";
        };
        std::optional<CheckpointContents> own;
        if (scan.world == size) {
          own = read_shard(o.checkpoint_dir, *scan.step, rank, size);
          expect_same_run(*own, record, run_identity(o, seed));
        }
        // The same layout: this rank's own shard holds its state (unless a plan with the same
        // grids split the layers otherwise; then the whole state is cut as for another layout).
        if (own && split_metadata(own->metadata).second == layout_description(o, size) &&
            holds_all(*own, executor.parameters())) {
          same_schedule(*own);
          restore(*own, executor.parameters());
        } else {
          own.reset();
          const std::vector<CheckpointContents> shards = read_all_shards(o.checkpoint_dir, *scan.step);
          for (const auto& c : shards) expect_same_run(c, record, run_identity(o, seed));
          same_schedule(shards.front());
          if (rank == 0) {
            std::string label = checkpoint_file_name(*scan.step);  // "step-000123"
            label.erase(label.rfind('.'));
            log << "braid train: resharding checkpoint " << label << " from "
                << layout_for_people(split_metadata(shards.front().metadata).second) << " to "
                << layout_for_people(layout_description(o, size)) << "\n";
          }
          restore_resharded(shards, o.checkpoint_dir + "/" + checkpoint_file_name(*scan.step), executor.parameters());
        }
        first = *scan.step + 1;
        report.summary.checkpoint = o.checkpoint_dir + "/" + checkpoint_file_name(*scan.step);
      }
    });
  // On the device, built or restored: what this rank holds.
  place_training_state(ops, executor.held_parameters(), executor.parameters());
  std::optional<MetricsWriter> metrics;
  // Nothing to train (a finished run resumed): its metrics file stays as it is, summary included.
  if (rank == 0 && !o.metrics_path.empty() && total >= first)
    metrics.emplace(o.metrics_path, first > 1 ? std::optional<std::int64_t>(first - 1) : std::nullopt);

  const std::vector<data::Sample> heldout = heldout_samples(dataset, run.trainer.eval_samples);
  ProgressMeter meter(total);
  MeasuredSteps measured;
  if (device.backend) measured.host_waits = 0;
  // The steps the loop below times: every one after the first it runs, or that one alone.
  measured.replayed = replayed_steps(total > first ? total - first : total == first ? 1 : 0);
  bool live_line = false;  // rank 0's progress line on a terminal is open (no newline yet)
  // A live progress line stays as it stands when another line goes below it.
  const auto end_live_line = [&] {
    if (live_line) out << "\n";
    live_line = false;
  };
  report.summary.first_step = first;
  report.summary.total_steps = total;
  report.summary.last_step = first - 1;      // where the run stands when there is nothing to train
  const bool steps_to_run = total >= first;  // the same on every rank
  const double probe_before = steps_to_run ? probe_host(run.cluster, comm, world, threads, device.backend) : 0;
  const std::int64_t eval_every = run.trainer.eval_every, ckpt_every = run.trainer.checkpoint_every;
  for (std::int64_t step = first; step <= total; ++step) {
    const std::uint64_t waits_before = device.backend ? device.backend->host_waits() : 0,
                        profile_waits_before = profile_waits;
    // The first step this process runs warms up allocators and caches: it is not timed, unless it is all there is.
    const bool timed_step = step > first || total == first;
    if (timed_ops) timed_ops->set_recording(timed_step);
    const StepResult r = executor.step(step, schedule.at(step));
    if (timed_ops) timed_ops->set_recording(false);
    report.wait_seconds += r.wait_seconds;
    if (timed_step) {
      measured.add(r);
      if (device.backend)
        measured.host_waits += static_cast<std::int64_t>(device.backend->host_waits() - waits_before -
                                                         (profile_waits - profile_waits_before));
    }
    const StepMetrics sm{step, r.loss, r.seconds > 0 ? static_cast<double>(r.samples) / r.seconds : 0};
    report.steps.push_back(sm);
    report.summary.last_step = step;
    report.summary.seconds += r.seconds;
    report.summary.samples += static_cast<double>(r.samples);
    report.summary.final_loss = r.loss;
    if (!std::isfinite(r.loss))
      throw Error(Status::internal,
                  "the loss diverged at step " + std::to_string(step) + " (" + std::to_string(r.loss) + ")");
    if (rank == 0) {
      if (metrics) metrics->write(sm);
      const std::string line = meter.update(step, r.loss, sm.samples_per_s, r.seconds);
      if (o.live_progress) {
        out << "\r\033[K" << line << std::flush;  // back to the line's start, clear it, rewrite
        live_line = true;
      } else if (progress_due(step, first, total, o.progress_every)) {
        out << line << "\n" << std::flush;
      }
    }
    if ((eval_every > 0 && step % eval_every == 0) || step == total) {
      // Pipelined models are evaluated whole on one rank: tensor-parallel slices gathered whole
      // within their groups, then every parameter from the rank that trains it.
      executor.single_process(true);
      executor.gather_parameters();
      const Evaluators who = evaluators(run, model, layouts);
      if (who.includes(rank)) place_all_values(ops, model.store);  // they run the whole model
      EvalMetrics e = evaluate(who, model, heldout, rank, comm, ops, step);
      if (who.includes(rank)) release_unheld_values(ops, model.store, executor.held_parameters());
      executor.single_process(false);
      if (rank == 0) {
        end_live_line();
        if (metrics) metrics->write(e);
        std::string line = "eval at step " + std::to_string(step) + ":";
        for (const auto& [k, v] : e.values) line += " " + k + " " + std::to_string(v);
        out << line << "\n" << std::flush;
      }
      report.summary.last_eval = e;
      report.evals.push_back(std::move(e));
    }
    if (!o.checkpoint_dir.empty() && ((ckpt_every > 0 && step % ckpt_every == 0) || step == total)) {
      save(o.checkpoint_dir, step, rank, size, meta, executor, &schedule, &record, comm,
           static_cast<int>(run.trainer.keep_checkpoints));
      report.summary.checkpoint = o.checkpoint_dir + "/" + checkpoint_file_name(step);
    }
  }
  const bool trained = steps_to_run;  // a resumed run may have nothing left
  // A finished run resumed leaves its trace as it was, like its metrics file.
  if (!o.trace_path.empty() && trained)
    write_measured_trace(o.trace_path, executor.program(), executor.executed(), comm);
  // Samples made in the step's time: by the training thread itself, or by a worker that finds
  // every core of the node held by the ranks' threads.
  TrainedLoad load(cost, o.plan, executor.program(), o.data_workers == 0 || !run.cluster.spare_core_for_data());
  report.comparison = compare_with_simulation(measured, executor.program().program, comm, &load);
  report.comparison.as_trained = as_run.changed;
  if (trained) {
    report.comparison.probe_before = probe_before;
    report.comparison.probe_after = probe_host(run.cluster, comm, world, threads, device.backend);
  }
  if (trained) report.memory = compare_with_prediction(executor.memory(), run, cost, o.plan, comm);
  if (timed_ops && measured.steps > 0) report.ops = gather_op_profile(timed_ops->calls(), measured.steps, cost, comm);
  if (rank == 0) {
    end_live_line();
    if (metrics && measured.steps > 0)
      metrics->write_line(comparison_json(report.comparison, report.summary.last_step));
    if (metrics && trained) metrics->write_line(memory_json(report.memory, report.summary.last_step));
    if (metrics && report.ops) metrics->write_line(op_profile_json(*report.ops, report.summary.last_step));
    out << format_summary(report.summary);
    out << device_memory_line(device);
    if (measured.steps > 0) out << format_comparison(report.comparison);
    if (report.ops) {
      double compute = 0;
      for (double c : report.comparison.measured_compute_s) compute += c;
      out << format_op_profile(*report.ops, compute);
    }
    if (trained) out << format_memory_comparison(report.memory);
    if (!o.trace_path.empty())
      out << (trained ? "trace of the last step as measured: " : "no step ran: the trace is left as it was: ")
          << o.trace_path << "\n";
    out << std::flush;
  }
  return report;
}

}  // namespace braid::train
