#include "core/train/executor.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>

#include "core/common/error.hpp"
#include "core/train/chain_stage.hpp"
#include "core/train/clip_stage.hpp"
#include "core/train/host_staging.hpp"

namespace braid::train {

using pipeline::Instruction;
using pipeline::Op;

namespace {

// This rank's program, refused (a schedule the plan does not run) on every rank alike.
RankProgram agreed_program(const Agree& agree, const cost::CostModel& cost, const plan::Plan& plan,
                           std::optional<spec::Schedule> schedule, const runtime::Topology& topology, int rank) {
  std::optional<RankProgram> program;
  agreed(agree, [&] { program.emplace(rank_program(cost, plan, schedule, topology, rank)); });
  return std::move(*program);
}

}  // namespace

Executor::Executor(const spec::RunSpec& run, const cost::CostModel& cost, const plan::Plan& plan, nn::Model& model,
                   const data::ShapesDataset& dataset, const runtime::Topology& topology, RankLayout layout,
                   runtime::World& world, nn::Ops& ops, ExecutorOptions options)
    : run_(run),
      layout_(std::move(layout)),
      ops_(ops),
      options_(std::move(options)),
      world_comm_(&world.communicator()),
      program_(agreed_program(options_.agree, cost, plan, options_.schedule, topology, world.rank())),
      work_(model.topology == spec::Topology::contrastive
                ? std::unique_ptr<StageWork>(std::make_unique<ClipStage>(run, plan, model, dataset, layout_, program_,
                                                                         world, ops, options_.data,
                                                                         options_.collectives, options_.agree))
                : std::make_unique<ChainStage>(run, cost, plan, model, dataset, layout_, program_, world, ops,
                                               options_.data, options_.collectives, options_.agree)),
      params_(work_->parameters()) {
  work_->install(interpreter_);
  interpreter_.set(Op::optimizer_step, [this](const Instruction&) { return optimizer_step(lr_, *result_); });
  if (options_.after_reduce) {
    // The work's reduction, then the hook (tests dump the reduced gradients there).
    interpreter_.set(Op::reduce_grads, [this, reduce = interpreter_.handler(Op::reduce_grads)](const Instruction& i) {
      Pending p = reduce(i);
      const double waited = p.empty() ? 0 : p.finish();
      options_.after_reduce(step_);
      return blocked_for(waited);
    });
  }
  work_->add_memory_sources(memory_);
  if (options_.idle_heap) memory_.add_idle_heap(options_.idle_heap);
  if (options_.device_in_use) memory_.measure_activations_on_device(options_.device_in_use);
  interpreter_.after_instruction([this] { memory_.sample(); });
  // What the work books as idle itself, from inside a handler, is not that instruction's compute.
  interpreter_.count_waits_inside([this] {
    double booked = 0;
    if (result_)
      for (double s : result_->idle) booked += s;
    return booked;
  });
  const auto& list = program_.instructions();
  first_forward_ = static_cast<int>(list.size());
  for (int k = 0; k < static_cast<int>(list.size()); ++k) {
    const Op op = list[static_cast<std::size_t>(k)].op;
    // As the simulator counts: warm-up before the stage's first forward, cool-down after its last backward.
    if (op == Op::forward) first_forward_ = std::min(first_forward_, k);
    if (op == Op::backward) last_backward_ = k;
  }
}

Executor::~Executor() = default;

// Why this rank waited in instruction `index`, in the simulator's terms.
sim::Cause Executor::cause_of(int index) const {
  switch (program_.instructions()[static_cast<std::size_t>(index)].op) {
    case Op::batch_sync:
      return sim::Cause::batch_sync;
    case Op::reduce_grads:
    case Op::optimizer_step:
      return sim::Cause::dp_end;
    default:
      if (index < first_forward_) return sim::Cause::pp_warmup;
      if (index > last_backward_) return sim::Cause::pp_cooldown;
      return sim::Cause::pp_other;
  }
}

StepResult Executor::step(std::int64_t step, double lr) {
  const double start = now_seconds();
  StepResult r;
  r.samples = run_.training.global_batch;
  result_ = &r;
  step_ = step;
  lr_ = lr;
  memory_.begin_step();  // before the step's samples and activations exist
  if (nn::FlatParameters* flat = flat_parameters(true)) {
    flat->zero_grads(ops_);
  } else {
    for (auto& p : params_) {
      nn::Tensor& g = p.param->grad;
      if (!g.data.empty()) ops_.zero(g, g.shape);
    }
  }
  work_->begin_step(step, r);
  executed_ =
      interpreter_.run(program_.instructions(), program_.online() ? work_->fill_rules() : nullptr, options_.on_fatal);
  for (const auto& e : executed_) {
    r.idle[static_cast<std::size_t>(cause_of(e.index))] += e.waited;
    const pipeline::WorkKind kind = pipeline::work_kind(program_.instructions()[static_cast<std::size_t>(e.index)]);
    if (kind != pipeline::WorkKind::communication)
      r.compute[static_cast<std::size_t>(kind)] += e.end - e.start - e.waited - e.waited_inside;
  }
  for (double s : r.idle) r.wait_seconds += s;
  r.seconds = now_seconds() - start;
  work_->end_step();
  result_ = nullptr;
  return r;
}

nn::FlatParameters* Executor::flat_parameters(bool lay_out) {
  // ZeRO steps shards, not whole tensors, and frees what a rank does not keep.
  auto whole = [](const TrainedParameter& p) {
    return !p.sharded() && p.param->trainable && !p.param->grad.data.empty();
  };
  if (!std::all_of(params_.begin(), params_.end(), whole)) return nullptr;
  // Built at the start of the first step (the work has placed every tensor by then), and of
  // a step when a member of a group was given a new tensor since (a checkpoint's moments, an
  // evaluation's gathering), so that each module's all-reduce sums its gradients in place
  // again; never in between, where it would gather half-made gradients.
  if (lay_out && (!flat_ || flat_->group_apart())) {
    std::vector<nn::FlatMember> members;
    for (TrainedParameter& p : params_)
      members.push_back({&p.param->value, &p.param->grad, &p.state, p.param->decay, p.counted, p.group});
    flat_.emplace(ops_, std::move(members));
  }
  return flat_ ? &*flat_ : nullptr;
}

Pending Executor::optimizer_step(double lr, StepResult& r) {
  const auto& t = run_.trainer;
  double norm2[1] = {0};
  // Under ZeRO a rank steps its shard [begin, end) with its reduced gradient: grad_shard at
  // stages 2 and 3, that range of the whole gradient at stage 1 (copied out for the step).
  std::vector<nn::Tensor> in_place(params_.size());
  for (std::size_t k = 0; k < params_.size(); ++k) {
    TrainedParameter& p = params_[k];
    if (!p.sharded() || static_cast<std::int64_t>(p.grad_shard.data.size()) == p.end - p.begin) continue;
    nn::Tensor scratch;
    const nn::Tensor& grad = on_host(ops_, p.param->grad, scratch);
    nn::Tensor shard({p.end - p.begin});
    std::copy(grad.data.begin() + p.begin, grad.data.begin() + p.end, shard.data.begin());
    in_place[k] = ops_.from_host(std::move(shard));
  }
  auto grad_of = [&](TrainedParameter& p) -> nn::Tensor& {
    const auto k = static_cast<std::size_t>(&p - params_.data());
    if (!p.sharded()) return p.param->grad;
    return in_place[k].data.empty() ? p.grad_shard : in_place[k];
  };
  // Laid out, a call per run of gradients (on a GPU each waits for its sum); else per
  // tensor, where a shard without elements here (ZeRO) adds nothing and needs no scaling.
  nn::FlatParameters* flat = flat_parameters(false);
  if (flat) {
    norm2[0] = flat->squared_grad_norm(ops_);
  } else {
    for (auto& p : params_)
      if (p.counted && !grad_of(p).data.empty()) norm2[0] += ops_.squared_norm(grad_of(p));
  }
  auto req = world_comm_->iallreduce(std::span<double>(norm2));
  const double waited = req.wait();
  r.grad_norm = std::sqrt(norm2[0]);
  if (t.grad_clip > 0) {
    const float c = nn::clip_coefficient(r.grad_norm, static_cast<float>(t.grad_clip));
    if (nn::clip_applies(c) && flat)
      flat->scale_grads(ops_, c);
    else if (nn::clip_applies(c))
      for (auto& p : params_)
        if (!grad_of(p).data.empty()) ops_.scale(grad_of(p), c);
  }
  nn::AdamWConfig config;
  config.lr = lr;
  config.beta1 = t.beta1;
  config.beta2 = t.beta2;
  config.eps = t.eps;
  config.weight_decay = t.weight_decay;
  if (flat) {
    flat->adamw_step(ops_, config);
    work_->after_optimizer_step();
    return blocked_for(waited);
  }
  for (auto& p : params_) {
    config.weight_decay = p.param->decay ? t.weight_decay : 0.0;
    if (!p.sharded()) {
      ops_.adamw_step(p.param->value, p.param->grad, p.state, config);
    } else if (!p.value_shard.data.empty()) {  // ZeRO-3: the shard is all this rank keeps
      ops_.adamw_step(p.value_shard, grad_of(p), p.state, config);
    } else if (p.end > p.begin) {  // ZeRO-1 and 2: the shard's elements of the whole value
      edit_on_host(ops_, p.param->value, [&](nn::Tensor& value) {
        nn::Tensor shard({p.end - p.begin});
        std::copy(value.data.begin() + p.begin, value.data.begin() + p.end, shard.data.begin());
        shard = ops_.from_host(std::move(shard));
        ops_.adamw_step(shard, grad_of(p), p.state, config);
        const nn::Tensor& stepped = on_host(ops_, shard, shard);
        std::copy(stepped.data.begin(), stepped.data.end(), value.data.begin() + p.begin);
      });
    } else {
      ++p.state.step;  // a shard without elements here: the step count stays that of the others
    }
  }
  work_->after_optimizer_step();
  return blocked_for(waited);
}

void Executor::gather_parameters() { work_->gather_parameters(); }

void Executor::single_process(bool on) { work_->single_process(on); }

}  // namespace braid::train
