#include "core/train/executor.hpp"

#include <chrono>
#include <cmath>
#include <string>

#include "core/common/error.hpp"
#include "core/nn/optim.hpp"
#include "core/pipeline/schedules.hpp"
#include "core/train/inputs.hpp"

namespace braid::train {
namespace {

using pipeline::Op;

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

[[noreturn]] void bad_split(const spec::RunSpec& run, const std::string& why) {
  throw Error(Status::bad_config, run.source + ": training: " + why);
}

void append(std::vector<nn::Parameter*>& to, const nn::Module* m) {
  if (!m) return;
  for (auto* p : m->parameters())
    if (p->trainable) to.push_back(p);
}

}  // namespace

Executor::Executor(const spec::RunSpec& run, nn::Model& model, const data::ShapesDataset& dataset, RankLayout layout,
                   runtime::World& world, nn::Ops& ops, ExecutorOptions options)
    : run_(run), model_(model), layout_(std::move(layout)), ops_(ops), options_(std::move(options)) {
  world_comm_ = &world.communicator();
  const long long global = run.training.global_batch;
  const bool contrastive = model.topology == spec::Topology::contrastive;
  std::vector<const ModuleRole*> tower_roles;  // the module whose DP group each tower reduces over
  if (contrastive) {
    const auto& m = run.model.modules;
    std::string image_name, text_name;
    for (const auto& s : m) {
      if (s.role != spec::Role::encoder) continue;
      (s.modality == spec::Modality::image ? image_name : text_name) = s.name;
    }
    towers_.resize(2);
    const ModuleRole* roles[2] = {&layout_.module(image_name), &layout_.module(text_name)};
    tower_roles = {roles[0], roles[1]};
    append(towers_[0].params, model.clip->image_encoder.get());
    append(towers_[0].params, model.clip->image_head.get());
    append(towers_[1].params, model.clip->text_encoder.get());
    append(towers_[1].params, model.clip->text_head.get());
    for (int t = 0; t < 2; ++t) {
      towers_[static_cast<std::size_t>(t)].held = roles[t]->held;
      towers_[static_cast<std::size_t>(t)].replica = roles[t]->replica;
      towers_[static_cast<std::size_t>(t)].replicas = roles[t]->replicas;
    }
    groups_ = static_cast<int>(global / run.training.contrastive_batch);
    const long long group_rows = run.training.contrastive_batch;
    rows_per_replica_ = group_rows / std::min(roles[0]->replicas, roles[1]->replicas);
    for (const auto* r : roles)
      if (group_rows % r->replicas != 0)
        bad_split(run, "the contrastive batch (" + std::to_string(group_rows) + ") does not split over the " +
                           std::to_string(r->replicas) + " replicas of '" + r->name + "'");
    logit_scale_ = model.clip->loss->parameters().front();
  } else {
    chain_ = std::make_unique<ChainPipeline>(run, model, dataset, layout_, world, options_.reorder);
    params_ = chain_->parameters();
    program_ = chain_->program();
    return;
  }

  // One replica count per rank: the program has one stage.
  int replicas = 0;
  for (const auto& t : towers_) {
    if (!t.held) continue;
    if (replicas && t.replicas != replicas)
      throw Error(Status::unsupported, "the CPU trainer runs both CLIP towers of a rank with one DP width");
    replicas = t.replicas;
  }
  const long long rows = global / (replicas ? replicas : 1);
  const long long per_group = rows / groups_;
  microbatch_ = std::min<long long>(run.training.microbatch, per_group);
  if (global % std::max(replicas, 1) != 0 || per_group % microbatch_ != 0)
    bad_split(run, "a replica's " + std::to_string(per_group) +
                       " samples per contrastive group do not split into microbatches of " +
                       std::to_string(microbatch_));
  // Groups in rank order; every rank creates the same ones in the same order.
  if (!layout_.sync_ranks.empty()) sync_.emplace(world.group(layout_.sync_ranks));
  for (std::size_t t = 0; t < towers_.size(); ++t) {
    Tower& tower = towers_[t];
    if (!tower.held) continue;
    tower.loader = std::make_unique<Loader>(
        dataset, LoaderOptions{global, tower.replicas, options_.reorder && tower.replicas > 1});
    if (tower.replicas > 1) tower.dp.emplace(world.group(tower_roles[t]->dp_ranks));
  }

  // The step's program: one stage, this rank's microbatches.
  program_.stages.resize(1);
  program_.stages[0].name = layout_.summary;
  const int k = static_cast<int>(per_group / microbatch_);
  pipeline::batch_sync(program_, groups_, k,
                       options_.distmm_pipe ? pipeline::BatchSyncKind::distmm_pipe : pipeline::BatchSyncKind::plain);
  pipeline::finish_step(program_);

  // Held parameters; each distinct tensor's gradient norm counted once (by DP replica 0).
  for (const auto& t : towers_) {
    if (!t.held) continue;
    for (auto* p : t.params) params_.push_back({p, {}, t.replica == 0});
  }
  if (logit_scale_ && sync_ && logit_scale_->trainable)
    params_.push_back({logit_scale_, {}, layout_.rank == layout_.sync_ranks.front()});
}

std::vector<data::Sample> Executor::slice(const Tower& t, int microbatch) const {
  const auto first = t.samples.begin() + static_cast<std::ptrdiff_t>(microbatch * microbatch_);
  return {first, first + static_cast<std::ptrdiff_t>(microbatch_)};
}

StepResult Executor::step(std::int64_t step, double lr) {
  const double start = now();
  StepResult r;
  r.samples = run_.training.global_batch;
  for (auto& p : params_) std::fill(p.param->grad.data.begin(), p.param->grad.data.end(), 0.0f);
  if (chain_) {
    chain_->begin_step(ops_, step, r);
    for (const auto& i : chain_->instructions()) {
      if (i.op == Op::reduce_grads || i.op == Op::optimizer_step) break;
      chain_->run(ops_, i, r);
    }
    // Ranks without an llm stage (a disaggregated encoder) run only these two.
    chain_->reduce_grads(ops_, r);
    if (options_.after_reduce) options_.after_reduce(step);
    optimizer_step(lr, r);
    r.seconds = now() - start;
    return r;
  }
  for (auto& t : towers_)
    if (t.held) t.samples = t.loader->samples(step, t.replica);
  image_mbs_.assign(towers_[0].held ? towers_[0].samples.size() / static_cast<std::size_t>(microbatch_) : 0, {});
  text_mbs_.assign(towers_[1].held ? towers_[1].samples.size() / static_cast<std::size_t>(microbatch_) : 0, {});
  loss_ = 0;
  logit_grad_ = 0;
  for (const auto& i : program_.stages[0].instructions) run_instruction(i, step, lr, r);
  r.seconds = now() - start;
  return r;
}

void Executor::run_instruction(const pipeline::Instruction& i, std::int64_t step, double lr, StepResult& r) {
  switch (i.op) {
    case Op::load_microbatch:
      return;  // the step's samples are rendered up front (Loader::samples)
    case Op::forward:
      if (towers_[0].held)
        clip_image_forward(ops_, *model_.clip, slice(towers_[0], i.microbatch),
                           image_mbs_[static_cast<std::size_t>(i.microbatch)]);
      if (towers_[1].held)
        clip_text_forward(ops_, *model_.clip, slice(towers_[1], i.microbatch),
                          text_mbs_[static_cast<std::size_t>(i.microbatch)]);
      return;
    case Op::backward:
      if (towers_[0].held) {
        auto& mb = image_mbs_[static_cast<std::size_t>(i.microbatch)];
        clip_image_backward(ops_, *model_.clip, mb);
        mb = {};
      }
      if (towers_[1].held) {
        auto& mb = text_mbs_[static_cast<std::size_t>(i.microbatch)];
        clip_text_backward(ops_, *model_.clip, mb);
        mb = {};
      }
      return;
    case Op::batch_sync: {
      // Microbatch j of group g is j in [g*K, (g+1)*K) on every tower, K its own.
      auto members = [&](std::vector<TowerMicrobatch>& mbs) {
        std::vector<TowerMicrobatch*> out;
        const std::size_t k = mbs.size() / static_cast<std::size_t>(groups_);
        for (std::size_t j = 0; j < k; ++j) out.push_back(&mbs[static_cast<std::size_t>(i.group) * k + j]);
        return out;
      };
      const auto result = batch_sync(ops_, *model_.clip, *sync_, members(image_mbs_), members(text_mbs_),
                                     towers_[0].replica, rows_per_replica_, 1.0 / groups_);
      loss_ += result.loss;
      logit_grad_ += result.logit_scale_grad;
      r.wait_seconds += result.wait_seconds;
      return;
    }
    case Op::reduce_grads:
      reduce_grads(r);
      if (options_.after_reduce) options_.after_reduce(step);
      return;
    case Op::optimizer_step:
      return optimizer_step(lr, r);
    default:
      throw Error(Status::internal, std::string("executor: a one-stage program has no ") + pipeline::op_name(i.op));
  }
}

void Executor::reduce_grads(StepResult& r) {
  for (auto& t : towers_) {
    if (!t.held || !t.dp) continue;
    std::size_t total = 0;
    for (auto* p : t.params) total += p->grad.data.size();
    std::vector<float> flat;
    flat.reserve(total);
    for (auto* p : t.params) flat.insert(flat.end(), p->grad.data.begin(), p->grad.data.end());
    auto req = t.dp->iallreduce(std::span<float>(flat));
    r.wait_seconds += req.wait();
    std::size_t at = 0;
    for (auto* p : t.params) {
      std::copy(flat.begin() + static_cast<std::ptrdiff_t>(at),
                flat.begin() + static_cast<std::ptrdiff_t>(at + p->grad.data.size()), p->grad.data.begin());
      at += p->grad.data.size();
    }
  }
  // The temperature's gradient is a share per rank, summed over the batch-sync; the loss
  // the batch-syncs summed already.
  double sum[1] = {logit_grad_};
  auto req = sync_->iallreduce(std::span<double>(sum));
  r.wait_seconds += req.wait();
  if (logit_scale_ && logit_scale_->trainable) logit_scale_->grad.data[0] = static_cast<float>(sum[0]);
  r.loss = loss_;
}

void Executor::optimizer_step(double lr, StepResult& r) {
  const auto& t = run_.trainer;
  double norm2[1] = {0};
  for (auto& p : params_)
    if (p.counted) norm2[0] += ops_.squared_norm(p.param->grad);
  auto req = world_comm_->iallreduce(std::span<double>(norm2));
  r.wait_seconds += req.wait();
  r.grad_norm = std::sqrt(norm2[0]);
  if (t.grad_clip > 0) {
    const float c = nn::clip_coefficient(r.grad_norm, static_cast<float>(t.grad_clip));
    if (c < 1.0f)
      for (auto& p : params_) ops_.scale(p.param->grad, c);
  }
  for (auto& p : params_) {
    nn::AdamWConfig config;
    config.lr = lr;
    config.beta1 = t.beta1;
    config.beta2 = t.beta2;
    config.eps = t.eps;
    config.weight_decay = p.param->decay ? t.weight_decay : 0.0;
    ops_.adamw_step(p.param->value, p.param->grad, p.state, config);
  }
  if (logit_scale_) model_.clip->loss->clamp_after_step();
}

}  // namespace braid::train
