#include "core/train/executor.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include "core/common/error.hpp"
#include "core/nn/optim.hpp"
#include "core/pipeline/schedules.hpp"
#include "core/train/inputs.hpp"
#include "core/train/messages.hpp"

namespace braid::train {
namespace {

using pipeline::Op;

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

[[noreturn]] void bad_split(const spec::RunSpec& run, const std::string& why) {
  throw Error(Status::bad_config, run.source + ": training: " + why);
}

void add_trainable(std::vector<nn::Parameter*>& to, nn::Parameter* p) {
  if (p->trainable) to.push_back(p);
}

void append(std::vector<nn::Parameter*>& to, const nn::Module* m) {
  for (auto* p : m->parameters()) add_trainable(to, p);
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
    const int layers[2] = {model.clip->image_encoder->layers(), model.clip->text_encoder->layers()};
    for (int t = 0; t < 2; ++t) {
      Tower& tower = towers_[static_cast<std::size_t>(t)];
      const ModuleRole& role = *roles[t];
      tower.held = role.held;
      tower.replica = role.replica;
      tower.replicas = role.replicas;
      tower.stage = role.stage;
      tower.stages = role.stages;
      tower.role = &role;
      tower.part = nn::split_encoder(layers[t], role.stages)[static_cast<std::size_t>(role.held ? role.stage : 0)];
    }
    // The part's blocks, and the projection head with the last part.
    for (auto* p : model.clip->image_encoder->part_parameters(towers_[0].part)) add_trainable(towers_[0].params, p);
    for (auto* p : model.clip->text_encoder->part_parameters(towers_[1].part)) add_trainable(towers_[1].params, p);
    if (towers_[0].stage + 1 == towers_[0].stages) append(towers_[0].params, model.clip->image_head.get());
    if (towers_[1].stage + 1 == towers_[1].stages) append(towers_[1].params, model.clip->text_head.get());
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

  // One program per rank: the towers it holds share their DP width and pipeline depth.
  int replicas = 0, stages = 0, stage = 0;
  for (const auto& t : towers_) {
    if (!t.held) continue;
    if (replicas && (t.replicas != replicas || t.stages != stages || t.stage != stage))
      throw Error(Status::unsupported,
                  "the CPU trainer runs both CLIP towers of a rank with one DP width and one pipeline stage");
    replicas = t.replicas;
    stages = t.stages;
    stage = t.stage;
  }
  stage_ = stage;
  const long long rows = global / (replicas ? replicas : 1);
  const long long per_group = rows / groups_;
  microbatch_ = std::min<long long>(run.training.microbatch, per_group);
  if (global % std::max(replicas, 1) != 0 || per_group % microbatch_ != 0)
    bad_split(run, "a replica's " + std::to_string(per_group) +
                       " samples per contrastive group do not split into microbatches of " +
                       std::to_string(microbatch_));
  // Groups in one order on every rank; only their members create them.
  const auto& sync = layout_.sync_ranks;
  if (std::find(sync.begin(), sync.end(), layout_.rank) != sync.end()) sync_.emplace(world.group(sync));
  for (std::size_t t = 0; t < towers_.size(); ++t) {
    Tower& tower = towers_[t];
    if (!tower.held) continue;
    tower.loader = std::make_unique<Loader>(
        dataset, LoaderOptions{global, tower.replicas, options_.reorder && tower.replicas > 1});
    if (tower.replicas > 1) tower.dp.emplace(world.group(tower_roles[t]->dp_ranks));
  }

  // The step's program: the towers' stages in a line, the batch-sync after the last.
  program_.stages.resize(static_cast<std::size_t>(std::max(stages, 1)));
  for (int st = 0; st < stages; ++st) {
    auto& ps = program_.stages[static_cast<std::size_t>(st)];
    ps.name = "stage " + std::to_string(st);
    ps.depth = st;
    if (st > 0) ps.prev = {st - 1};
    if (st + 1 < stages) ps.next = {st + 1};
  }
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
    params_.push_back({logit_scale_, {}, layout_.rank == sync.front()});
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
  for (const auto& i : program_.stages[static_cast<std::size_t>(stage_)].instructions) run_instruction(i, step, lr, r);
  r.seconds = now() - start;
  return r;
}

void Executor::run_instruction(const pipeline::Instruction& i, std::int64_t step, double lr, StepResult& r) {
  switch (i.op) {
    case Op::load_microbatch:
      return;  // the step's samples are rendered up front (Loader::samples)
    case Op::recv_activation:
    case Op::recv_grad:
      for (int t = 0; t < 2; ++t) receive(t, i, r);
      return;
    case Op::send_activation:
    case Op::send_grad:
      for (int t = 0; t < 2; ++t) send(t, i);
      if (i.op == Op::send_grad) release(i.microbatch);  // a later stage is done with it
      return;
    case Op::forward:
      if (towers_[0].held)
        clip_image_forward(ops_, *model_.clip, towers_[0].part, slice(towers_[0], i.microbatch),
                           image_mbs_[static_cast<std::size_t>(i.microbatch)]);
      if (towers_[1].held)
        clip_text_forward(ops_, *model_.clip, towers_[1].part, slice(towers_[1], i.microbatch),
                          text_mbs_[static_cast<std::size_t>(i.microbatch)]);
      return;
    case Op::backward:
      if (towers_[0].held)
        clip_image_backward(ops_, *model_.clip, towers_[0].part, image_mbs_[static_cast<std::size_t>(i.microbatch)]);
      if (towers_[1].held)
        clip_text_backward(ops_, *model_.clip, towers_[1].part, text_mbs_[static_cast<std::size_t>(i.microbatch)]);
      if (stage_ == 0) release(i.microbatch);
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
      throw Error(Status::internal, std::string("executor: a contrastive program has no ") + pipeline::op_name(i.op));
  }
}

void Executor::gather_parameters() {
  if (chain_) return chain_->gather_parameters();
  const nn::ClipModel& clip = *model_.clip;
  const int layers[2] = {clip.image_encoder->layers(), clip.text_encoder->layers()};
  const nn::ClipHead* heads[2] = {clip.image_head.get(), clip.text_head.get()};
  for (int t = 0; t < 2; ++t) {
    const Tower& tower = towers_[static_cast<std::size_t>(t)];
    if (tower.stages == 1) continue;  // replica 0 of a whole tower has it all
    const auto parts = nn::split_encoder(layers[t], tower.stages);
    for (int st = 0; st < tower.stages; ++st) {
      auto params = t == 0 ? clip.image_encoder->part_parameters(parts[static_cast<std::size_t>(st)])
                           : clip.text_encoder->part_parameters(parts[static_cast<std::size_t>(st)]);
      if (st + 1 == tower.stages)
        params.insert(params.end(), heads[t]->parameters().begin(), heads[t]->parameters().end());
      const int owner = tower.role->rank_at(st, 0, 0);
      for (auto* p : params) world_comm_->broadcast(std::as_writable_bytes(std::span<float>(p->value.data)), owner);
    }
  }
}

std::vector<TowerMicrobatch>& Executor::microbatches(int tower) { return tower == 0 ? image_mbs_ : text_mbs_; }

void Executor::release(int microbatch) {
  for (int t = 0; t < 2; ++t)
    if (towers_[static_cast<std::size_t>(t)].held) microbatches(t)[static_cast<std::size_t>(microbatch)] = {};
}

// Hidden states (forward) or their gradients (backward) of one microbatch from the
// neighbouring stage of the same replica: one message per image side.
void Executor::receive(int t, const pipeline::Instruction& i, StepResult& r) {
  Tower& tower = towers_[static_cast<std::size_t>(t)];
  if (!tower.held) return;
  const bool forward = i.op == Op::recv_activation;
  auto& mb = microbatches(t)[static_cast<std::size_t>(i.microbatch)];
  const auto samples = slice(tower, i.microbatch);
  const auto shapes =
      t == 0 ? clip_image_hidden_shapes(*model_.clip, samples, mb) : clip_text_hidden_shapes(*model_.clip, samples, mb);
  auto& into = forward ? mb.hidden : mb.d_hidden;
  into.assign(shapes.size(), {});
  const int peer = tower.role->rank_at(tower.stage + (forward ? -1 : 1), 0, tower.replica);
  const Message kind = forward ? (t == 0 ? Message::image_hidden : Message::text_hidden)
                               : (t == 0 ? Message::image_hidden_grads : Message::text_hidden_grads);
  for (std::size_t g = 0; g < shapes.size(); ++g) {
    nn::reset(into[g], shapes[g]);
    auto req = world_comm_->irecv(std::as_writable_bytes(std::span<float>(into[g].data)), peer,
                                  message_tag(kind, i.microbatch, static_cast<int>(g)));
    r.wait_seconds += req.wait();
  }
}

void Executor::send(int t, const pipeline::Instruction& i) {
  Tower& tower = towers_[static_cast<std::size_t>(t)];
  if (!tower.held) return;
  const bool forward = i.op == Op::send_activation;
  auto& mb = microbatches(t)[static_cast<std::size_t>(i.microbatch)];
  auto& from = forward ? mb.hidden : mb.d_hidden;
  const int peer = tower.role->rank_at(tower.stage + (forward ? 1 : -1), 0, tower.replica);
  const Message kind = forward ? (t == 0 ? Message::image_hidden : Message::text_hidden)
                               : (t == 0 ? Message::image_hidden_grads : Message::text_hidden_grads);
  for (std::size_t g = 0; g < from.size(); ++g)
    sends_.isend(*world_comm_, std::move(from[g].data), peer, message_tag(kind, i.microbatch, static_cast<int>(g)));
  from.clear();
}

void Executor::reduce_grads(StepResult& r) {
  r.wait_seconds += sends_.wait_all();
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
  // the batch-syncs summed already, on the ranks of the towers' last stages.
  if (sync_) {
    double sum[1] = {logit_grad_};
    auto req = sync_->iallreduce(std::span<double>(sum));
    r.wait_seconds += req.wait();
    if (logit_scale_ && logit_scale_->trainable) logit_scale_->grad.data[0] = static_cast<float>(sum[0]);
  }
  double loss[1] = {layout_.rank == layout_.sync_ranks.front() ? loss_ : 0.0};
  auto req = world_comm_->iallreduce(std::span<double>(loss));
  r.wait_seconds += req.wait();
  r.loss = loss[0];
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
