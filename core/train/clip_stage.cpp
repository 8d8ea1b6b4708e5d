#include "core/train/clip_stage.hpp"

#include <algorithm>
#include <string>

#include "core/common/error.hpp"
#include "core/train/host_staging.hpp"
#include "core/train/inputs.hpp"

namespace braid::train {
namespace {

using pipeline::Instruction;
using pipeline::Op;

[[noreturn]] void bad_split(const spec::RunSpec& run, const std::string& why) {
  throw Error(Status::bad_config, run.source + ": training: " + why);
}

Message hidden_message(int tower, bool forward) {
  if (forward) return tower == 0 ? Message::image_hidden : Message::text_hidden;
  return tower == 0 ? Message::image_hidden_grads : Message::text_hidden_grads;
}

}  // namespace

ClipStage::ClipStage(const spec::RunSpec& run, const plan::Plan& plan, nn::Model& model,
                     const data::ShapesDataset& dataset, const RankLayout& layout, const RankProgram& program,
                     runtime::World& world, nn::Ops& ops, const DataOptions& data, const DeviceCollectives* collectives,
                     const Agree& agree)
    : model_(model), layout_(layout), program_(program), ops_(ops), data_(data) {
  // What this rank runs, and the layouts it cannot: checked on every rank before any group
  // is made.
  agreed(agree, [&] {
    world_ = &world.communicator();
    const auto& clip = *model.clip;
    const long long global = run.training.global_batch, group_rows = run.training.contrastive_batch;
    groups_ = plan::contrastive_groups(run.training);
    std::string names[2];
    for (const auto& s : run.model.modules)
      if (s.role == spec::Role::encoder) names[s.modality == spec::Modality::image ? 0 : 1] = s.name;
    const int layers[2] = {clip.image_encoder->layers(), clip.text_encoder->layers()};
    const auto& stage = program.stage_program();
    const int per_group = stage.microbatches_per_group(program.program.group_microbatches);
    int min_replicas = 0;
    for (int t = 0; t < 2; ++t) {
      Tower& tower = towers_[t];
      const ModuleRole& role = layout.module(names[t]);
      tower.role = &role;
      min_replicas = min_replicas ? std::min(min_replicas, role.replicas) : role.replicas;
      if (group_rows % role.replicas != 0)
        bad_split(run, "the contrastive batch (" + std::to_string(group_rows) + ") does not split over the " +
                           std::to_string(role.replicas) + " replicas of '" + role.name + "'");
      // The module stage this rank's program stage runs of the tower, if any.
      tower.here = role.held;
      if (!tower.here) continue;
      tower.part = nn::split_encoder(layers[t], role.stages)[static_cast<std::size_t>(role.stage)];
      const long long rows = group_rows / role.replicas;
      const plan::ModulePlacement* placed = nullptr;
      for (const auto& m : plan.modules)
        if (m.name == role.name) placed = &m;
      const int planned = placed ? placed->microbatch_size : 0;
      tower.microbatch = planned;
      // The program runs the plan's microbatches per group, of the plan's size.
      if (!placed || group_rows % plan::samples_per_microbatch(*placed) != 0 ||
          plan::microbatches_per_group(run.training, *placed) != per_group)
        bad_split(run, "a replica of '" + role.name + "' holds " + std::to_string(rows) +
                           " samples per contrastive group, which the program's " + std::to_string(per_group) +
                           " microbatches do not split into the plan's microbatches of " + std::to_string(planned));
      tower.loader = std::make_unique<Loader>(
          dataset, LoaderOptions{global, role.replicas, data.reorder && role.replicas > 1, static_cast<int>(groups_)});
      // The part's blocks, and the projection head with the last part.
      const auto params =
          t == 0 ? clip.image_encoder->part_parameters(tower.part) : clip.text_encoder->part_parameters(tower.part);
      for (auto* p : params)
        if (p->trainable) tower.params.push_back(p);
      if (role.stage + 1 == role.stages) {
        const nn::ClipHead& head = t == 0 ? *clip.image_head : *clip.text_head;
        for (auto* p : head.parameters())
          if (p->trainable) tower.params.push_back(p);
      }
    }
    rows_per_replica_ = group_rows / min_replicas;
    if (static_cast<long long>(groups_) * per_group > kMaxMicrobatches)
      throw Error(Status::unsupported, "the CPU trainer runs at most " + std::to_string(kMaxMicrobatches) +
                                           " microbatches per replica (got " +
                                           std::to_string(static_cast<long long>(groups_) * per_group) + ")");
    logit_scale_ = clip.loss->parameters().front();
    const ModuleRole& image = *towers_[0].role;
    const ModuleRole& text = *towers_[1].role;
    if (image.tp != text.tp)
      throw Error(Status::unsupported, "the CPU trainer runs CLIP towers of one tensor-parallel width: '" + image.name +
                                           "' has tp " + std::to_string(image.tp) + ", '" + text.name + "' tp " +
                                           std::to_string(text.tp) +
                                           " (each TP rank's batch-sync pairs it with the same TP rank of the other "
                                           "tower)");
    // Hidden states travel between the stages of one tower; a program that chains the towers'
    // stages (one tower a stage, the other the next) has nothing to send between them.
    for (const pipeline::Instruction& ins : program.instructions()) {
      if (ins.op != Op::send_activation && ins.op != Op::recv_activation) continue;
      const int peer = program.rank_of(ins.peer, 0, 0);
      for (const Tower& t : towers_)
        if (t.here && !t.role->grid->contains(peer))
          throw Error(Status::unsupported,
                      "the CPU trainer pipelines a CLIP tower over stages that each hold a part of it: the program "
                      "sends stage " +
                          std::to_string(program.stage) + "'s activations to stage " + std::to_string(ins.peer) +
                          ", which does not hold '" + t.role->name +
                          "' (plan the towers side by side, --strategy distmm, or split each over the stages)");
    }
  });

  // The batch-sync of this rank's TP index: every tower replica's rank of that index (with
  // tp 1 the plan's whole batch-sync group). Each TP index computes the same loss.
  const ModuleRole& image = *towers_[0].role;
  const ModuleRole& text = *towers_[1].role;
  tp_index_ = towers_[0].here ? image.tp_rank : text.tp_rank;
  std::vector<int> sync;
  for (int r : layout.sync_ranks) {
    const ModuleRole& holder = image.grid && image.grid->contains(r) ? image : text;
    if (holder.grid->coords(r)[static_cast<std::size_t>(runtime::Axis::tp)] == tp_index_) sync.push_back(r);
  }

  // Groups in one order on every rank; only their members create them.
  for (auto& t : towers_) {
    if (t.here && t.role->tp > 1) t.tp.emplace(world.group(t.role->tp_ranks));
    if (t.tp && collectives) t.tp_device = collectives->group(t.role->tp_ranks);
  }
  if (std::find(sync.begin(), sync.end(), layout.rank) != sync.end()) {
    sync_.emplace(world.group(sync));
    sync_front_ = sync.front();
  }
  for (auto& t : towers_) {
    if (t.here && t.role->replicas > 1) t.dp.emplace(world.group(t.role->dp_ranks));
    if (t.dp && collectives && run.training.zero_stage == 0) t.dp_device = collectives->group(t.role->dp_ranks);
  }
  for (auto& t : towers_)
    if (t.tp)
      t.tp_group = tensor_parallel_group(
          ops_, *t.tp, t.role->tp_rank, run.training.sequence_parallel,
          [this](double waited) {
            if (result_) result_->idle[static_cast<std::size_t>(sim::Cause::tp)] += waited;
          },
          t.tp_device.get());
  set_tensor_parallel(false);

  // Each distinct tensor's gradient norm counted once: by DP replica 0, or under ZeRO by the
  // replica holding the shard.
  const int zero = run.training.zero_stage;
  int group = 0;  // a tower's gradients are reduced together
  for (const auto& t : towers_) {
    if (t.here)
      for (auto* p : t.params) {
        TrainedParameter trained;
        trained.param = p;
        trained.counted = t.role->counts_in_norm(*p, zero);
        trained.group = group;
        params_.push_back(std::move(trained));
      }
    ++group;
  }
  if (logit_scale_ && sync_ && logit_scale_->trainable) {
    TrainedParameter trained;
    trained.param = logit_scale_;
    trained.counted = layout_.rank == sync_front_ && tp_index_ == 0;
    trained.group = group;
    params_.push_back(std::move(trained));
  }
  if (zero > 0) make_zero(zero);
}

void ClipStage::make_zero(int stage) {
  const auto& clip = *model_.clip;
  auto in_pipeline = [this](double seconds) {
    if (result_) result_->idle[static_cast<std::size_t>(sim::Cause::dp_shard)] += seconds;
  };
  for (int t = 0; t < 2; ++t) {
    Tower& tower = towers_[t];
    if (!tower.dp) continue;
    // Each block of the part a unit; the rest (embeddings, final norm, head) one more.
    std::vector<const nn::TransformerBlock*> blocks;
    for (int l = tower.part.first; l < tower.part.last; ++l)
      blocks.push_back(t == 0 ? &clip.image_encoder->block(l) : &clip.text_encoder->block(l));
    tower.zero = std::make_unique<ZeroModule>(tower.role->name, stage, *tower.dp, ops_,
                                              zero_units(tower.params, blocks), params_, in_pipeline);
    if (stage >= 2) {
      if (t == 0)
        clip.image_encoder->set_block_hooks(tower.zero.get());
      else
        clip.text_encoder->set_block_hooks(tower.zero.get());
    }
  }
}

ClipStage::~ClipStage() {
  // The model outlives this stage: its TP callbacks and ZeRO hooks must not call back into it.
  auto& clip = *model_.clip;
  if (towers_[0].zero) clip.image_encoder->set_block_hooks(nullptr);
  if (towers_[1].zero) clip.text_encoder->set_block_hooks(nullptr);
  if (towers_[0].tp) clip.image_encoder->detach_tensor_parallel();
  if (towers_[1].tp) clip.text_encoder->detach_tensor_parallel();
}

void ClipStage::set_tensor_parallel(bool single_process) {
  // In one order on every rank: each change of a split tower gathers over its group.
  auto& clip = *model_.clip;
  if (towers_[0].tp)
    clip.image_encoder->set_tensor_parallel(single_process ? nn::TensorParallel{} : towers_[0].tp_group);
  if (towers_[1].tp)
    clip.text_encoder->set_tensor_parallel(single_process ? nn::TensorParallel{} : towers_[1].tp_group);
}

void ClipStage::single_process(bool on) {
  // ZeRO-3's shards gathered into the tensor-parallel slices, then those gathered whole; back
  // the other way. The ZeRO hooks are off meanwhile: one process runs the model outside the
  // program.
  if (on)
    for (auto& t : towers_)
      if (t.zero) t.zero->materialize(true);
  set_tensor_parallel(on);
  for (int t = 0; t < 2; ++t) {
    ZeroModule* z = towers_[t].zero.get();
    if (!z) continue;
    if (!on) z->materialize(false);
    if (z->stage() < 2) continue;
    if (t == 0)
      model_.clip->image_encoder->set_block_hooks(on ? nullptr : z);
    else
      model_.clip->text_encoder->set_block_hooks(on ? nullptr : z);
  }
}

std::map<const nn::Parameter*, nn::Tensor> ClipStage::gather_sharded(const std::string& kind) {
  return train::gather_sharded({towers_[0].zero.get(), towers_[1].zero.get()}, kind);
}

int ClipStage::tower_calls(int tower, std::span<const data::Sample> samples) {
  // The image tower runs its encoder once per image side (clip_work.hpp), the text tower once.
  return tower == 0 ? static_cast<int>(data::sides_of(samples).size()) : 1;
}

void ClipStage::begin_step(std::int64_t step, StepResult& r) {
  result_ = &r;
  loss_ = logit_grad_ = 0;
  for (int tower = 0; tower < 2; ++tower) {
    Tower& t = towers_[tower];
    if (!t.here) continue;
    if (t.zero) t.zero->begin_step();
    if (!t.prefetch) {
      // Only the image tower's first stage reads pixels: the others get the samples described
      // (sides, captions, tokens), so no rank renders an image it does not encode.
      PrefetchOptions options = data_.prefetch;
      options.pixels = tower == 0 && t.part.first == 0;
      t.prefetch = std::make_unique<Prefetcher>(*t.loader, t.role->replica, step, data_.last_step, options);
    }
    t.samples = take_samples(*t.prefetch, step, r);
    t.mbs.assign(t.samples.size() / static_cast<std::size_t>(t.microbatch), {});
    t.kept.assign(t.mbs.size(), {});
  }
  // Both towers of a rank run the same samples; the image tower's sides set its work.
  const Tower& sized = towers_[0].here ? towers_[0] : towers_[1];
  r.microbatch_samples.clear();
  for (std::size_t k = 0; k < sized.mbs.size(); ++k) {
    auto& ran = r.microbatch_samples.emplace_back();
    for (std::size_t q = 0; q < static_cast<std::size_t>(sized.microbatch); ++q)
      ran.push_back(trained_sample(sized.samples[k * static_cast<std::size_t>(sized.microbatch) + q]));
  }
}

std::span<const data::Sample> ClipStage::slice(const Tower& t, int microbatch) const {
  return std::span<const data::Sample>(t.samples).subspan(static_cast<std::size_t>(microbatch * t.microbatch),
                                                          static_cast<std::size_t>(t.microbatch));
}

void ClipStage::install(Interpreter& in) {
  in.set(Op::load_microbatch, [](const Instruction&) { return Pending{}; });  // rendered in begin_step
  in.set(Op::forward, [this](const Instruction& i) {
    for (int t = 0; t < 2; ++t)
      if (towers_[t].here) forward(towers_[t], t, i);
    return Pending{};
  });
  in.set(Op::backward, [this](const Instruction& i) {
    for (int t = 0; t < 2; ++t)
      if (towers_[t].here) backward(towers_[t], t, i.microbatch);
    return Pending{};
  });
  install_messages(
      in, [this](const Instruction& i) { return receive(i); }, [this](const Instruction& i) { send(i); });
  in.set(Op::batch_sync, [this](const Instruction& i) { return sync(i); });
  in.set(Op::reduce_grads, [this](const Instruction&) { return reduce(); });
}

void ClipStage::forward(Tower& t, int tower, const Instruction& i) {
  const auto& clip = *model_.clip;
  auto& mb = t.mbs[static_cast<std::size_t>(i.microbatch)];
  auto& kept = t.kept[static_cast<std::size_t>(i.microbatch)];
  const bool first = t.part.first == 0;
  const bool last = t.role->stage + 1 == t.role->stages;
  if (i.flags & pipeline::kRecompute) {
    if (!first) mb.hidden = std::move(kept);  // the input the no-store forward kept
  } else if ((i.flags & pipeline::kNoStore) && !first) {
    kept = mb.hidden;
  }
  const auto samples = slice(t, i.microbatch);
  Calls calls(t.zero.get(), tower_calls(tower, samples), 1, false);
  within(t.zero.get(), [&] {
    if (tower == 0)
      clip_image_forward(ops_, clip, t.part, samples, mb);
    else
      clip_text_forward(ops_, clip, t.part, samples, mb);
  });
  if (i.flags & pipeline::kNoStore) {  // two-phase: the outputs go on, the activations do not stay
    mb.image_caches.clear();
    mb.image_head_caches.clear();
    mb.text_cache = {};
    mb.text_head_cache = {};
  }
  if ((i.flags & pipeline::kRecompute) && !last) mb.hidden.clear();  // already sent by the first forward
}

void ClipStage::backward(Tower& t, int tower, int microbatch) {
  auto& mb = t.mbs[static_cast<std::size_t>(microbatch)];
  Calls calls(t.zero.get(), tower_calls(tower, slice(t, microbatch)), 1, true);
  within(t.zero.get(), [&] {
    if (tower == 0)
      clip_image_backward(ops_, *model_.clip, t.part, mb);
    else
      clip_text_backward(ops_, *model_.clip, t.part, mb);
  });
  if (t.part.first == 0) mb = {};  // nothing goes further back: free the microbatch
}

// Hidden states (forward) or their gradients (backward) of one microbatch from the same
// replica of the neighbouring stage: one message per image side, per tower.
Pending ClipStage::receive(const Instruction& i) {
  const bool forward = i.op == Op::recv_activation;
  const int peer = program_.rank_of(i.peer, program_.replica, program_.tp_rank);
  std::vector<runtime::Request> requests;
  for (int t = 0; t < 2; ++t) {
    Tower& tower = towers_[t];
    if (!tower.here) continue;
    auto& mb = tower.mbs[static_cast<std::size_t>(i.microbatch)];
    const auto samples = slice(tower, i.microbatch);
    const auto shapes = t == 0 ? clip_image_hidden_shapes(*model_.clip, samples, mb)
                               : clip_text_hidden_shapes(*model_.clip, samples, mb);
    auto& into = forward ? mb.hidden : mb.d_hidden;
    into.assign(shapes.size(), {});
    for (std::size_t g = 0; g < shapes.size(); ++g) {
      nn::reset(into[g], shapes[g]);
      requests.push_back(world_->irecv(std::as_writable_bytes(std::span<float>(into[g].data)), peer,
                                       message_tag(hidden_message(t, forward), i.microbatch, static_cast<int>(g))));
    }
  }
  // Received in host memory; on to where the ops keep tensors.
  return pending_requests(std::move(requests), [this, forward, microbatch = i.microbatch] {
    for (Tower& tower : towers_) {
      if (!tower.here) continue;
      auto& mb = tower.mbs[static_cast<std::size_t>(microbatch)];
      for (nn::Tensor& t : forward ? mb.hidden : mb.d_hidden) t = ops_.from_host(std::move(t));
    }
  });
}

void ClipStage::send(const Instruction& i) {
  const bool forward = i.op == Op::send_activation;
  const int peer = program_.rank_of(i.peer, program_.replica, program_.tp_rank);
  for (int t = 0; t < 2; ++t) {
    Tower& tower = towers_[t];
    if (!tower.here) continue;
    auto& mb = tower.mbs[static_cast<std::size_t>(i.microbatch)];
    auto& from = forward ? mb.hidden : mb.d_hidden;
    for (std::size_t g = 0; g < from.size(); ++g)
      sends_.isend(*world_, release_to_host(ops_, from[g]), peer,
                   message_tag(hidden_message(t, forward), i.microbatch, static_cast<int>(g)));
    from.clear();
    if (!forward) mb = {};  // a later stage is done with it
  }
}

Pending ClipStage::sync(const Instruction& i) {
  if (!sync_) throw Error(Status::internal, "batch_sync on a rank outside the batch-sync group");
  // Microbatch j of group g is g K + j on every tower, K its own.
  auto members = [&](Tower& t) {
    std::vector<TowerMicrobatch*> out;
    if (!t.here) return out;
    const std::size_t k = t.mbs.size() / static_cast<std::size_t>(groups_);
    for (std::size_t j = 0; j < k; ++j) out.push_back(&t.mbs[static_cast<std::size_t>(i.group) * k + j]);
    return out;
  };
  const auto result = batch_sync(ops_, *model_.clip, *sync_, members(towers_[0]), members(towers_[1]),
                                 towers_[0].here ? towers_[0].role->replica : 0, rows_per_replica_, 1.0 / groups_);
  loss_ += result.loss;
  logit_grad_ += result.logit_scale_grad;
  return blocked_for(result.wait_seconds);
}

Pending ClipStage::reduce() {
  double waited = sends_.wait_all();
  for (auto& t : towers_)
    if (t.dp)  // ZeRO exists only over a DP group
      waited += reduce_module_gradients(ops_, t.zero.get(), t.dp_device.get(), *t.dp, t.params, reduction_bytes_);
  // The temperature's gradient is a share per rank, summed over the batch-sync; the loss
  // the batch-syncs summed already, on the ranks of the towers' last stages.
  if (sync_) {
    double sum[1] = {logit_grad_};
    auto req = sync_->iallreduce(std::span<double>(sum));
    waited += req.wait();
    if (logit_scale_->trainable) logit_scale_->grad = ops_.from_host(nn::Tensor({1}, {static_cast<float>(sum[0])}));
  }
  double loss[1] = {layout_.rank == sync_front_ && tp_index_ == 0 ? loss_ : 0.0};
  auto req = world_->iallreduce(std::span<double>(loss));
  waited += req.wait();
  result_->loss = loss[0];
  return blocked_for(waited);
}

void ClipStage::after_optimizer_step() {
  double waited = 0;
  for (auto& t : towers_)
    if (t.zero) waited += t.zero->after_step();
  if (result_) result_->idle[static_cast<std::size_t>(sim::Cause::dp_end)] += waited;
  model_.clip->loss->clamp_after_step(ops_);
}

std::vector<nn::Parameter*> ClipStage::held_parameters() const {
  const nn::ClipModel& clip = *model_.clip;
  std::vector<nn::Parameter*> out;
  auto add = [&](const std::vector<nn::Parameter*>& params) { out.insert(out.end(), params.begin(), params.end()); };
  for (int t = 0; t < 2; ++t) {
    const Tower& tower = towers_[t];
    if (!tower.here) continue;
    add(t == 0 ? clip.image_encoder->part_parameters(tower.part) : clip.text_encoder->part_parameters(tower.part));
    if (tower.role->stage + 1 == tower.role->stages)
      add(t == 0 ? clip.image_head->parameters() : clip.text_head->parameters());
  }
  if (sync_) out.push_back(logit_scale_);  // the batch-sync reads the temperature
  return out;
}

void ClipStage::gather_parameters() {
  const nn::ClipModel& clip = *model_.clip;
  const int layers[2] = {clip.image_encoder->layers(), clip.text_encoder->layers()};
  const nn::ClipHead* heads[2] = {clip.image_head.get(), clip.text_head.get()};
  for (int t = 0; t < 2; ++t) {
    const ModuleRole& role = *towers_[t].role;
    if (role.stages == 1) continue;  // replica 0 of a whole tower has it all (evaluate asks it)
    const auto parts = nn::split_encoder(layers[t], role.stages);
    for (int st = 0; st < role.stages; ++st) {
      auto params = t == 0 ? clip.image_encoder->part_parameters(parts[static_cast<std::size_t>(st)])
                           : clip.text_encoder->part_parameters(parts[static_cast<std::size_t>(st)]);
      if (st + 1 == role.stages)
        params.insert(params.end(), heads[t]->parameters().begin(), heads[t]->parameters().end());
      const int owner = role.rank_at(st, 0, 0);
      for (auto* p : params) broadcast(ops_, *world_, p->value, owner);
    }
  }
}

}  // namespace braid::train
