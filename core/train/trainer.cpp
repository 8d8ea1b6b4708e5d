#include "core/train/trainer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <ostream>
#include <thread>

#include "core/common/error.hpp"
#include "core/nn/host_memory.hpp"
#include "core/nn/host_ops.hpp"
#include "core/nn/modules/model.hpp"
#include "core/runtime/groups.hpp"
#include "core/train/checkpoint.hpp"
#include "core/train/evaluate.hpp"
#include "core/train/executor.hpp"

namespace braid::train {
namespace {

constexpr double kPi = 3.14159265358979323846;

const spec::ModuleSpec& image_encoder_spec(const spec::ModelSpec& model) {
  for (const auto& m : model.modules)
    if (m.role == spec::Role::encoder && m.modality == spec::Modality::image) return m;
  throw Error(Status::unsupported, "model " + model.name + ": the trainer's dataset needs an image encoder");
}

data::ShapesDataset make_dataset(const spec::RunSpec& run, std::uint64_t seed) {
  const auto& encoder = image_encoder_spec(run.model);
  spec::DataSpec data = run.data;
  data.seed = seed;
  const int min_side = std::max(encoder.patch_size, data.image.kind == spec::SizeKind::fixed ? 16 : data.image.min);
  return data::ShapesDataset(
      data::shapes_config(data, encoder.patch_size, std::max(8, min_side), encoder.max_image_size));
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

EvalMetrics evaluate(const spec::RunSpec& run, const nn::Model& model, const std::vector<data::Sample>& samples,
                     const std::vector<RankLayout>& layouts, int rank, runtime::Communicator& world, nn::Ops& ops,
                     std::int64_t step) {
  EvalMetrics m;
  m.step = step;
  if (model.topology == spec::Topology::contrastive) {
    std::string image_name, text_name;
    std::int64_t embed = 0;
    for (const auto& s : run.model.modules) {
      if (s.role != spec::Role::encoder) continue;
      (s.modality == spec::Modality::image ? image_name : text_name) = s.name;
      embed = s.embed_dim;
    }
    const int image_owner = owner_of(layouts, image_name), text_owner = owner_of(layouts, text_name);
    const nn::Shape shape{static_cast<std::int64_t>(samples.size()), embed};
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
    if (rank == 0) {
      const CaptionMetrics c = caption_metrics(ops, *model.chain, samples);
      v[0] = c.loss;
      v[1] = c.token_accuracy;
    }
    world.broadcast(std::as_writable_bytes(std::span<double>(v)), 0);
    m.values = {{"caption_loss", v[0]}, {"token_accuracy", v[1]}};
  }
  return m;
}

std::string metadata(const TrainOptions& o, std::uint64_t seed, int world) {
  return "run " + o.run.source + "; model " + o.run.model.name + "; seed " + std::to_string(seed) + "; world " +
         std::to_string(world) + "; strategy " + plan::strategy_name(o.plan.strategy);
}

void save(const std::string& dir, std::int64_t step, int rank, int world, const std::string& meta,
          std::vector<TrainedParameter>& params, bool with_state, runtime::Communicator& comm, int keep) {
  CheckpointContents c;
  c.metadata = meta;
  for (auto& p : params) {
    if (with_state) {
      c.add_tensor("param/" + p.param->name, p.param->value);
      c.add_tensor("adam_m/" + p.param->name, p.state.m);
      c.add_tensor("adam_v/" + p.param->name, p.state.v);
      c.add_int("adam_step/" + p.param->name, p.state.step);
    } else {
      c.add_tensor("grad/" + p.param->name, p.param->grad);
    }
  }
  write_shard(dir, step, rank, world, c);
  comm.barrier();
  if (rank == 0) commit(dir, step, world, keep);
  comm.barrier();
}

void restore(const CheckpointContents& c, std::vector<TrainedParameter>& params) {
  for (auto& p : params) {
    const nn::Tensor& value = c.tensor("param/" + p.param->name);
    if (value.shape != p.param->value.shape)
      throw Error(Status::bad_config, "checkpoint '" + c.source + "': " + p.param->name + " has shape " +
                                          nn::shape_string(value.shape) + ", the model " +
                                          nn::shape_string(p.param->value.shape));
    p.param->value = value;
    p.state.m = c.tensor("adam_m/" + p.param->name);
    p.state.v = c.tensor("adam_v/" + p.param->name);
    p.state.step = c.get_int("adam_step/" + p.param->name);
  }
}

}  // namespace

double learning_rate(const spec::TrainerSpec& t, std::int64_t step, std::int64_t total) {
  if (t.warmup_steps > 0 && step <= t.warmup_steps)
    return t.learning_rate * static_cast<double>(step) / static_cast<double>(t.warmup_steps);
  const double span = static_cast<double>(std::max<std::int64_t>(1, total - t.warmup_steps));
  const double progress = std::clamp(static_cast<double>(step - t.warmup_steps) / span, 0.0, 1.0);
  const double floor = t.min_lr_ratio * t.learning_rate;
  return floor + (t.learning_rate - floor) * 0.5 * (1.0 + std::cos(kPi * progress));
}

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
    throw Error(Status::invalid_argument, std::to_string(world) + " processes do not fill nodes of " +
                                              std::to_string(width) + " devices (cluster of " + run.source + ")");
  }
  return fitted;
}

TrainReport train(const TrainOptions& o, runtime::World& world, std::ostream& out, std::ostream& log) {
  const spec::RunSpec& run = o.run;
  const int rank = world.rank(), size = world.size();
  const std::uint64_t seed = o.seed.value_or(run.data.seed);
  const std::int64_t total = o.steps > 0 ? o.steps : run.trainer.steps;
  const runtime::Topology topology = runtime::build_groups(run.model, o.plan, size);
  std::vector<RankLayout> layouts;
  for (int r = 0; r < size; ++r) layouts.push_back(layout_for(run.model, topology, r));

  int threads = o.threads > 0 ? o.threads : run.trainer.threads;
  if (threads <= 0)
    threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / std::max(1, world.local_size()));
  nn::keep_freed_host_memory();  // activations are reallocated every step
  nn::HostOps ops(threads);
  nn::Model model = nn::build_model(run.model, seed);
  const data::ShapesDataset dataset = make_dataset(run, seed);
  ExecutorOptions eo;
  eo.data.reorder = o.reorder;
  eo.data.prefetch.workers = o.data_workers;
  eo.data.last_step = total;
  eo.on_fatal = o.on_fatal;
  eo.schedule = o.schedule;
  const std::string meta = metadata(o, seed, size);
  Executor* executor_ptr = nullptr;
  if (!o.gradients_dir.empty()) {
    if (rank == 0) create_checkpoint_dir(o.gradients_dir);
    eo.after_reduce = [&](std::int64_t step) {
      world.communicator().barrier();
      save(o.gradients_dir, step, rank, size, meta, executor_ptr->parameters(), false, world.communicator(), 0);
    };
  }
  const cost::CostModel cost(run);
  Executor executor(run, cost, o.plan, model, dataset, topology, layouts[static_cast<std::size_t>(rank)], world, ops,
                    eo);
  executor_ptr = &executor;
  runtime::Communicator& comm = executor.world_communicator();

  TrainReport report;
  report.layout = executor.layout().summary;
  std::int64_t first = 1;
  if (!o.checkpoint_dir.empty()) {
    if (rank == 0) create_checkpoint_dir(o.checkpoint_dir);
    comm.barrier();
  }
  if (o.resume) {
    if (o.checkpoint_dir.empty()) throw Error(Status::invalid_argument, "--resume needs --checkpoint-dir");
    const CheckpointScan scan = latest_valid(o.checkpoint_dir, size);
    if (rank == 0) log << "braid train: " << describe(scan) << "\n";
    if (scan.step) {
      const CheckpointContents c = read_shard(o.checkpoint_dir, *scan.step, rank, size);
      if (c.metadata != meta)
        throw Error(Status::bad_config,
                    "checkpoint '" + c.source + "' is of another run (" + c.metadata + "), this one is " + meta);
      restore(c, executor.parameters());
      first = *scan.step + 1;
      report.summary.checkpoint = o.checkpoint_dir + "/" + checkpoint_file_name(*scan.step);
    }
  }
  std::optional<MetricsWriter> metrics;
  if (rank == 0 && !o.metrics_path.empty())
    metrics.emplace(o.metrics_path, first > 1 ? std::optional<std::int64_t>(first - 1) : std::nullopt);

  const std::vector<data::Sample> heldout = heldout_samples(dataset, run.trainer.eval_samples);
  ProgressMeter meter(total);
  MeasuredSteps measured;
  bool live_line = false;  // rank 0's progress line on a terminal is open (no newline yet)
  // A live progress line stays as it stands when another line goes below it.
  const auto end_live_line = [&] {
    if (live_line) out << "\n";
    live_line = false;
  };
  report.summary.first_step = first;
  report.summary.total_steps = total;
  const std::int64_t eval_every = run.trainer.eval_every, ckpt_every = run.trainer.checkpoint_every;
  for (std::int64_t step = first; step <= total; ++step) {
    const StepResult r = executor.step(step, learning_rate(run.trainer, step, total));
    report.wait_seconds += r.wait_seconds;
    // The first step this process runs warms up allocators and caches: it is not timed, unless it is all there is.
    if (step > first || total == first) measured.add(r);
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
      // Pipelined models are evaluated whole on one rank: every parameter from the rank that trains it.
      executor.gather_parameters();
      executor.single_process(true);
      EvalMetrics e = evaluate(run, model, heldout, layouts, rank, comm, ops, step);
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
      save(o.checkpoint_dir, step, rank, size, meta, executor.parameters(), true, comm,
           static_cast<int>(run.trainer.keep_checkpoints));
      report.summary.checkpoint = o.checkpoint_dir + "/" + checkpoint_file_name(step);
    }
  }
  if (!o.trace_path.empty()) write_measured_trace(o.trace_path, executor.program(), executor.executed(), comm);
  report.comparison = compare_with_simulation(measured, executor.program().program, comm);
  if (rank == 0) {
    end_live_line();
    if (metrics && measured.steps > 0)
      metrics->write_line(comparison_json(report.comparison, report.summary.last_step));
    out << format_summary(report.summary);
    if (measured.steps > 0) out << format_comparison(report.comparison);
    if (!o.trace_path.empty()) out << "trace of the last step as measured: " << o.trace_path << "\n";
    out << std::flush;
  }
  return report;
}

}  // namespace braid::train
