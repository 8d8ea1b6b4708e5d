#include "core/train/chain_stage.hpp"

#include <algorithm>
#include <deque>
#include <string>
#include <utility>

#include "core/bubble/encoder_tasks.hpp"
#include "core/common/error.hpp"
#include "core/train/host_staging.hpp"
#include "core/train/inputs.hpp"

namespace braid::train {
namespace {

using pipeline::Instruction;
using pipeline::Op;

int tag(Message kind, int microbatch, int group = 0) { return message_tag(kind, microbatch, group); }
constexpr Message kTokens = Message::encoder_tokens, kTokenGrads = Message::encoder_token_grads,
                  kHidden = Message::llm_hidden, kHiddenGrads = Message::llm_hidden_grads;

ModuleRole role_of(const RankLayout& layout, spec::Role role) {
  for (const auto& m : layout.modules)
    if (m.role == role) return m;
  return {};
}

std::span<std::byte> bytes(std::span<float> v) { return std::as_writable_bytes(v); }

}  // namespace

ChainStage::ChainStage(const spec::RunSpec& run, const cost::CostModel& cost, const plan::Plan& plan, nn::Model& model,
                       const data::ShapesDataset& dataset, const RankLayout& layout, const RankProgram& program,
                       runtime::World& world, nn::Ops& ops, const DataOptions& data,
                       const DeviceCollectives* collectives, const Agree& agree)
    : model_(model), program_(program), ops_(ops), data_(data) {
  // What this rank runs, and the layouts it cannot: checked on every rank before any group
  // is made.
  agreed(agree, [&] {
    vision_ = role_of(layout, spec::Role::encoder);
    projector_ = role_of(layout, spec::Role::projector);
    llm_ = role_of(layout, spec::Role::llm);
    const auto& chain = *model.chain;
    if (!llm_.grid) throw Error(Status::bad_config, "the plan places no llm");
    if (chain.vision && !vision_.grid) throw Error(Status::bad_config, "the plan places no image encoder");
    colocated_ = plan.layout == plan::Layout::colocated;
    // Refused before the model is touched (sliced, hooked).
    if (colocated_ && run.training.zero_stage >= 2 && vision_.replicas > 1 && chain.vision && !chain.vision->frozen())
      throw Error(Status::unsupported,
                  "the CPU trainer runs a colocated encoder's ZeRO at stage 1 only: '" + vision_.name +
                      "' is data parallel over ranks of different pipeline stages, whose programs place its "
                      "encoder tasks (and so stage " +
                      std::to_string(run.training.zero_stage) + "'s collectives) differently");
    const int llm_first = program.stage_of_rank[static_cast<std::size_t>(llm_.rank_at(0, 0, 0))];
    if (chain.vision) {
      if (vision_.stages != 1)
        throw Error(Status::unsupported, "the CPU trainer runs the encoder '" + vision_.name +
                                             "' in one pipeline stage: the plan gives it pp " +
                                             std::to_string(vision_.stages));
      const int vision_stage = program.stage_of_rank[static_cast<std::size_t>(vision_.rank_at(0, 0, 0))];
      if (plan.layout == plan::Layout::chain) encoder_stage_index_ = vision_stage;
      if (plan.layout == plan::Layout::monolithic) {
        if (vision_stage != llm_first)
          throw Error(Status::unsupported, "the CPU trainer runs the encoder '" + vision_.name +
                                               "' in the llm's first pipeline stage, where the plan does not put it");
        encodes_in_forward_ = vision_.held && llm_.held && llm_.stage == 0;
      } else if (plan.layout == plan::Layout::chain) {
        encoder_stage_ = vision_.held;
        encodes_in_forward_ = encoder_stage_;
        if (vision_.replicas % llm_.replicas != 0)
          throw Error(Status::unsupported, "the CPU trainer feeds each llm replica from whole encoder replicas: '" +
                                               vision_.name + "' has " + std::to_string(vision_.replicas) +
                                               " replicas for " + std::to_string(llm_.replicas) + " of '" + llm_.name +
                                               "'");
        fan_in_ = vision_.replicas / llm_.replicas;
      }
    }
    if (chain.projector) {
      // With the llm's first stage when its grid covers that stage's first rank, else with the encoder.
      projector_on_encoder_ = !projector_.grid->contains(llm_.rank_at(0, 0, 0));
      const bool must_hold = projector_on_encoder_ ? vision_.held : (llm_.held && llm_.stage == 0);
      if (must_hold != projector_.held)
        throw Error(Status::unsupported,
                    "the CPU trainer runs the projector '" + projector_.name + "' on every rank of " +
                        (projector_on_encoder_ ? "the encoder '" + vision_.name + "'" : "the llm's first stage") +
                        " and nowhere else; rank " + std::to_string(layout.rank) + " does not match");
    }
    const plan::ModulePlacement* llm_plan = nullptr;
    for (const auto& m : plan.modules)
      if (m.role == spec::Role::llm) llm_plan = &m;
    if (llm_plan) microbatch_ = llm_plan->microbatch_size;
    microbatches_ = program.program.microbatches;
    // The program runs the plan's microbatches of the llm, each shared by whole encoder replicas.
    const bool as_planned = llm_plan && run.training.global_batch % plan::samples_per_microbatch(*llm_plan) == 0 &&
                            plan::microbatches_per_step(run.training, *llm_plan) == microbatches_;
    if (!as_planned || microbatch_ % fan_in_ != 0)
      throw Error(Status::bad_config,
                  run.source + ": training: " + std::to_string(run.training.global_batch) + " samples over " +
                      std::to_string(llm_.replicas) + " llm replicas do not split into the program's " +
                      std::to_string(microbatches_) + " microbatches of the plan's " + std::to_string(microbatch_) +
                      " samples, shared by " + std::to_string(fan_in_) + " encoder replicas each");
    if (microbatches_ > kMaxMicrobatches)
      throw Error(Status::unsupported, "the CPU trainer runs at most " + std::to_string(kMaxMicrobatches) +
                                           " microbatches per replica (got " + std::to_string(microbatches_) + ")");
    if (llm_.held) part_ = nn::split_decoder(chain.llm->layers(), llm_.stages)[static_cast<std::size_t>(llm_.stage)];
    llm_replica_ = llm_.held ? llm_.replica : vision_.replica / fan_in_;
    encoder_part_ = encoder_stage_ ? vision_.replica % fan_in_ : 0;
    loader_ = std::make_unique<Loader>(
        dataset, LoaderOptions{run.training.global_batch, llm_.replicas, data.reorder && llm_.replicas > 1});

    if (colocated_ && chain.vision) {
      if (llm_.tp % vision_.tp != 0)
        throw Error(Status::unsupported, "the CPU trainer runs a colocated encoder whose tp divides the llm's: '" +
                                             vision_.name + "' has tp " + std::to_string(vision_.tp) + ", '" +
                                             llm_.name + "' tp " + std::to_string(llm_.tp));
      encoder_ = std::make_unique<ColocatedEncoder>(bubble::decompose(cost, plan), program.stage,
                                                    program.stage_program(), *chain.vision, ops, microbatch_,
                                                    llm_.tp_rank / vision_.tp, llm_.tp / vision_.tp);
      for (const Instruction& ins : program_.instructions()) llm_backwards_ += ins.op == Op::backward;
      // Encoder tasks and the ordering messages of the encoder's side (its tokens out, their
      // gradients in) may run ahead of a wait; they keep their order among themselves.
      fill_.movable = [this](int index) {
        const Instruction& ins = program_.instructions()[static_cast<std::size_t>(index)];
        return ins.op == Op::encoder_task ||
               ((ins.flags & pipeline::kSyncOnly) && (ins.op == Op::send_activation || ins.op == Op::recv_grad));
      };
      fill_.ready = [this](int index) {
        const Instruction& ins = program_.instructions()[static_cast<std::size_t>(index)];
        if (ins.op == Op::encoder_task) return encoder_->ready(ins);
        if (ins.op == Op::send_activation) return store_.has(ins.microbatch, encoder_->positions(), false);
        return true;
      };
    }
  });

  // Groups in one order on every rank: llm tp, encoder tp, projector tp, llm dp, encoder dp,
  // projector dp.
  comm_ = &world.communicator();
  if (llm_.held && llm_.tp > 1) llm_tp_.emplace(world.group(llm_.tp_ranks));
  if (vision_.held && vision_.tp > 1) vision_tp_.emplace(world.group(vision_.tp_ranks));
  if (projector_.held && projector_.tp > 1) projector_tp_.emplace(world.group(projector_.tp_ranks));
  if (collectives) {
    if (llm_tp_) llm_tp_device_ = collectives->group(llm_.tp_ranks);
    if (vision_tp_) vision_tp_device_ = collectives->group(vision_.tp_ranks);
    if (projector_tp_) projector_tp_device_ = collectives->group(projector_.tp_ranks);
  }
  if (llm_.held && llm_.replicas > 1) llm_dp_.emplace(world.group(llm_.dp_ranks));
  if (vision_.held && vision_.replicas > 1) vision_dp_.emplace(world.group(vision_.dp_ranks));
  if (projector_.held && projector_.replicas > 1) projector_dp_.emplace(world.group(projector_.dp_ranks));
  if (collectives && run.training.zero_stage == 0) {  // ZeRO reduces its shards itself
    if (llm_dp_) llm_dp_device_ = collectives->group(llm_.dp_ranks);
    if (vision_dp_) vision_dp_device_ = collectives->group(vision_.dp_ranks);
    if (projector_dp_) projector_dp_device_ = collectives->group(projector_.dp_ranks);
  }
  // Each module holds only its slices of what tensor parallelism splits.
  // Sequence parallelism where the run asks for it, but in a colocated encoder run kernel by
  // kernel (its tasks take the whole sequences; ImageEncoder::forward_kernel): priced so too
  // (cost::CostModel::colocated_encoder_model).
  const bool sequence_parallel = run.training.sequence_parallel;
  if (vision_tp_)
    vision_group_ =
        tensor_parallel(*vision_tp_, vision_.tp_rank, sequence_parallel && !colocated_, vision_tp_device_.get());
  if (projector_tp_)
    projector_group_ = tensor_parallel(*projector_tp_, projector_.tp_rank, false, projector_tp_device_.get());
  if (llm_tp_) llm_group_ = tensor_parallel(*llm_tp_, llm_.tp_rank, sequence_parallel, llm_tp_device_.get());
  if (encoder_ && vision_tp_) {
    // A tensor-parallel encoder's collectives must come in one order on the ranks of its group:
    // the program's, not whatever each rank found ready first.
    fill_.movable = [](int) { return false; };
  }
  set_tensor_parallel(false);
  params_ = trained_parameters(run.training.zero_stage);
  make_zero(run.training.zero_stage);
}

void ChainStage::make_zero(int stage) {
  if (stage == 0) return;
  const auto& chain = *model_.chain;
  auto in_pipeline = [this](double seconds) {
    if (result_) result_->idle[static_cast<std::size_t>(sim::Cause::dp_shard)] += seconds;
  };
  if (llm_dp_) {
    std::vector<const nn::TransformerBlock*> blocks;
    for (int l = part_.first; l < part_.last; ++l) blocks.push_back(&chain.llm->block(l));
    llm_zero_ = std::make_unique<ZeroModule>(
        llm_.name, stage, *llm_dp_, ops_, zero_units(chain.llm->part_parameters(part_), blocks), params_, in_pipeline);
    if (stage >= 2) chain.llm->set_block_hooks(llm_zero_.get());
  }
  if (vision_dp_ && !chain.vision->frozen()) {
    std::vector<const nn::TransformerBlock*> blocks;
    for (int l = 0; l < chain.vision->layers(); ++l) blocks.push_back(&chain.vision->block(l));
    vision_zero_ = std::make_unique<ZeroModule>(vision_.name, stage, *vision_dp_, ops_,
                                                zero_units(chain.vision->parameters(), blocks), params_, in_pipeline);
    if (stage >= 2) chain.vision->set_block_hooks(vision_zero_.get());
  }
  if (projector_dp_ && !chain.projector->frozen())
    projector_zero_ = std::make_unique<ZeroModule>(projector_.name, stage, *projector_dp_, ops_,
                                                   zero_units(chain.projector->parameters(), {}), params_, in_pipeline);
}

nn::TensorParallel ChainStage::tensor_parallel(runtime::Communicator& group, int rank, bool sequence_parallel,
                                               DeviceGroup* on_device) {
  return tensor_parallel_group(
      ops_, group, rank, sequence_parallel,
      [this](double waited) {
        if (result_) result_->idle[static_cast<std::size_t>(sim::Cause::tp)] += waited;
      },
      on_device);
}

void ChainStage::set_tensor_parallel(bool single_process) {
  const auto& chain = *model_.chain;
  // In one order on every rank: each change of a split module gathers over its group.
  if (vision_tp_) chain.vision->set_tensor_parallel(single_process ? nn::TensorParallel{} : vision_group_);
  if (projector_tp_) chain.projector->set_tensor_parallel(single_process ? nn::TensorParallel{} : projector_group_);
  if (llm_tp_) chain.llm->set_tensor_parallel(single_process ? nn::TensorParallel{} : llm_group_);
}

// The model outlives this stage: its TP callbacks and ZeRO hooks must not call back into it.
ChainStage::~ChainStage() {
  const auto& chain = *model_.chain;
  if (llm_zero_) chain.llm->set_block_hooks(nullptr);
  if (vision_zero_) chain.vision->set_block_hooks(nullptr);
  if (vision_tp_) chain.vision->detach_tensor_parallel();
  if (projector_tp_) chain.projector->detach_tensor_parallel();
  if (llm_tp_) chain.llm->detach_tensor_parallel();
}

std::vector<nn::Parameter*> ChainStage::held_parameters() const {
  std::vector<nn::Parameter*> out;
  const auto& chain = *model_.chain;
  auto add = [&](const std::vector<nn::Parameter*>& params) { out.insert(out.end(), params.begin(), params.end()); };
  if (vision_.held) add(chain.vision->parameters());
  if (projector_.held) add(chain.projector->parameters());
  if (llm_.held) add(chain.llm->part_parameters(part_));
  return out;
}

std::vector<TrainedParameter> ChainStage::trained_parameters(int zero_stage) const {
  std::vector<TrainedParameter> out;
  int group = 0;  // a module's gradients are reduced together (reduce())
  auto add = [&](const std::vector<nn::Parameter*>& params, const ModuleRole& role) {
    for (auto* p : params) {
      TrainedParameter t;
      t.param = p;
      t.counted = role.counts_in_norm(*p, zero_stage);
      t.group = group;
      if (p->trainable) out.push_back(std::move(t));
    }
    ++group;
  };
  const auto& chain = *model_.chain;
  if (vision_.held) add(chain.vision->parameters(), vision_);
  if (projector_.held) add(chain.projector->parameters(), projector_);
  if (llm_.held) add(chain.llm->part_parameters(part_), llm_);
  return out;
}

std::int64_t ChainStage::image_tokens(int side) const {
  const std::int64_t g = side / model_.chain->vision->shape().patch;
  return g * g;
}

std::int64_t ChainStage::token_width() const {
  const auto& chain = *model_.chain;
  return projector_on_encoder_ || !chain.projector ? chain.llm->shape().transformer.hidden
                                                   : chain.vision->shape().transformer.hidden;
}

bool ChainStage::encoder_trains() const {
  const auto& chain = *model_.chain;
  return chain.vision && (!chain.vision->frozen() || (projector_on_encoder_ && !chain.projector->frozen()));
}

std::span<const data::Sample> ChainStage::microbatch_samples(int i) const {
  return std::span<const data::Sample>(samples_).subspan(static_cast<std::size_t>(i * microbatch_),
                                                         static_cast<std::size_t>(microbatch_));
}

std::vector<std::size_t> ChainStage::all_positions() const { return fan_positions(-1); }

std::vector<std::size_t> ChainStage::fan_positions(int k) const {
  std::vector<std::size_t> out;
  for (std::int64_t q = 0; q < microbatch_; ++q)
    if (k < 0 || q % fan_in_ == k) out.push_back(static_cast<std::size_t>(q));
  return out;
}

void ChainStage::begin_step(std::int64_t step, StepResult& r) {
  result_ = &r;
  loss_ = 0;
  in_flight_.clear();
  llm_backwards_left_ = llm_backwards_;
  early_llm_reduce_ = {};
  for (ZeroModule* z : {llm_zero_.get(), vision_zero_.get(), projector_zero_.get()})
    if (z) z->begin_step();
  encoded_.clear();
  if (!prefetch_) {
    // A rank that runs no encoder reads the samples' sides and tokens, not their pixels.
    PrefetchOptions options = data_.prefetch;
    options.pixels = encodes_in_forward_ || encoder_stage_ || encoder_;
    prefetch_ = std::make_unique<Prefetcher>(*loader_, llm_replica_, step, data_.last_step, options);
  }
  samples_ = take_samples(*prefetch_, step, r);
  // The loss is a mean over the step's counted tokens: one count per llm replica.
  std::int64_t count[1] = {llm_.held && llm_.stage == 0 && llm_.tp_rank == 0 ? counted_tokens(samples_) : 0};
  auto req = comm_->iallreduce(std::span<std::int64_t>(count));
  r.idle[static_cast<std::size_t>(sim::Cause::dp_start)] += req.wait();
  normalizer_ = count[0];
  r.microbatch_samples.clear();
  r.encoder_microbatch_samples.clear();
  const auto positions = encoder_stage_ ? fan_positions(encoder_part_) : all_positions();
  for (int i = 0; i < microbatches_; ++i) {
    // A chain's encoder replica encodes its share of each microbatch; every other rank all of it.
    auto& ran = r.microbatch_samples.emplace_back();
    for (std::size_t q : positions)
      ran.push_back(trained_sample(samples_[static_cast<std::size_t>(i * microbatch_) + q]));
  }
  if (!model_.chain->vision) return;
  std::vector<std::vector<std::int64_t>> floats(static_cast<std::size_t>(microbatches_));
  for (int i = 0; i < microbatches_; ++i)
    for (const auto& s : microbatch_samples(i))
      floats[static_cast<std::size_t>(i)].push_back(image_tokens(s.side) * token_width());
  store_.reset(std::move(floats));
  if (encoder_) {
    encoder_->begin_step(samples_, store_);
    r.encoder_microbatch_samples = encoder_->microbatch_samples();
  }
}

ChainStage::Microbatch& ChainStage::prepare(int i) {
  auto [it, fresh] = in_flight_.try_emplace(i);
  Microbatch& mb = it->second;
  if (!fresh) return mb;
  const auto samples = microbatch_samples(i);
  if (model_.chain->vision) {
    for (auto& sg : data::sides_of(samples)) {  // the sides only: this stage may have no pixels
      auto& g = mb.groups.emplace_back();
      g.members = sg.members;
      g.side = sg.side;
      g.text = tokens_of(samples, g.members);
    }
  } else {
    auto& g = mb.groups.emplace_back();
    for (std::size_t q = 0; q < samples.size(); ++q) g.members.push_back(q);
    g.text = tokens_of(samples);
  }
  if (mb.groups.size() > static_cast<std::size_t>(kMaxGroups))
    throw Error(Status::unsupported, "more than 16 image sides in one microbatch");
  return mb;
}

// The encoder (and the projector, when it rides with it) over `positions` of llm microbatch
// i; each sample's tokens into the store.
void ChainStage::encode(int i, const std::vector<std::size_t>& positions) {
  const auto& chain = *model_.chain;
  Encoded& e = encoded_[i];
  e.positions = positions;
  e.groups.clear();
  auto groups = side_groups(microbatch_samples(i), positions);
  const int calls = static_cast<int>(groups.size());
  Calls vision_calls(vision_zero_.get(), calls, false);
  Calls projector_calls(projector_on_encoder_ ? projector_zero_.get() : nullptr, calls, false);
  std::vector<nn::Tensor> tokens(groups.size());
  for (std::size_t k = 0; k < groups.size(); ++k) {
    EncodedGroup& eg = e.groups.emplace_back();
    eg.members = groups[k].members;
    eg.side = groups[k].side;
    tokens[k] = within(vision_zero_.get(), [&] {
      return chain.vision->forward(ops_, ops_.from_host(std::move(groups[k].images)), eg.vision).tokens;
    });
    if (projector_on_encoder_)
      tokens[k] =
          within(projector_zero_.get(), [&] { return chain.projector->forward(ops_, tokens[k], eg.projector); });
  }
  // Into the host store, every group's at once (a device waits once).
  const std::vector<nn::Tensor> rows = ops_.to_host_all(tokens);
  for (std::size_t k = 0; k < groups.size(); ++k) {
    const EncodedGroup& eg = e.groups[k];
    const std::size_t n = static_cast<std::size_t>(rows[k].numel() / rows[k].dim(0));
    for (std::size_t m = 0; m < eg.members.size(); ++m)
      store_.tokens(i, positions[eg.members[m]])
          .assign(rows[k].data.begin() + static_cast<std::ptrdiff_t>(m * n),
                  rows[k].data.begin() + static_cast<std::ptrdiff_t>((m + 1) * n));
  }
}

void ChainStage::encode_backward(int i) {
  const auto& chain = *model_.chain;
  auto it = encoded_.find(i);
  if (it == encoded_.end()) throw Error(Status::internal, "encoder backward of a microbatch it did not encode");
  if (encoder_trains()) {
    const Encoded& e = it->second;
    const int calls = static_cast<int>(e.groups.size());
    Calls projector_calls(projector_on_encoder_ ? projector_zero_.get() : nullptr, calls, true);
    Calls vision_calls(chain.vision->frozen() ? nullptr : vision_zero_.get(), calls, true);
    for (const auto& eg : e.groups) {
      nn::Tensor d({static_cast<std::int64_t>(eg.members.size()), image_tokens(eg.side), token_width()});
      const std::size_t n = static_cast<std::size_t>(d.numel() / d.dim(0));
      for (std::size_t m = 0; m < eg.members.size(); ++m) {
        const auto& rows = store_.grads(i, e.positions[eg.members[m]]);
        std::copy(rows.begin(), rows.end(), d.data.begin() + static_cast<std::ptrdiff_t>(m * n));
      }
      d = ops_.from_host(std::move(d));
      if (projector_on_encoder_)
        d = within(projector_zero_.get(),
                   [&] { return chain.projector->backward(ops_, d, eg.projector, !chain.vision->frozen()); });
      if (!chain.vision->frozen())
        within(vision_zero_.get(), [&] { chain.vision->backward(ops_, &d, nullptr, eg.vision); });
    }
  }
  encoded_.erase(it);
}

// Optimus with the encoder sharded over the llm's TP ranks: each has encoded its share of
// its own lane's microbatch; the first stage's TP ranks need every sample's tokens.
void ChainStage::share_tokens_within_tp(int i) {
  const int shares = llm_.tp / vision_.tp, mine = llm_.tp_rank / vision_.tp;
  auto positions = [&](int c) { return share_positions(c); };
  std::vector<runtime::Request> requests;
  std::vector<std::vector<float>> inbox(static_cast<std::size_t>(shares));
  if (llm_.tp_rank % vision_.tp == 0) {
    for (int t = 0; t < llm_.tp; ++t)
      if (t / vision_.tp != mine)
        sends_.isend(*comm_, store_.pack(i, positions(mine), false),
                     program_.rank_of(program_.stage, program_.replica, t), tag(kTokens, i));
  }
  for (int c = 0; c < shares; ++c) {
    if (c == mine) continue;
    inbox[static_cast<std::size_t>(c)] = store_.buffer(i, positions(c));
    requests.push_back(comm_->irecv(bytes(inbox[static_cast<std::size_t>(c)]),
                                    program_.rank_of(program_.stage, program_.replica, c * vision_.tp),
                                    tag(kTokens, i)));
  }
  double waited = 0;
  for (auto& r : requests) waited += r.wait();
  result_->idle[static_cast<std::size_t>(sim::Cause::tp)] += waited;
  for (int c = 0; c < shares; ++c)
    if (c != mine) store_.unpack(i, positions(c), inbox[static_cast<std::size_t>(c)], false);
}

void ChainStage::install(Interpreter& in) {
  in.set(Op::load_microbatch, [this](const Instruction& i) {
    if (llm_.held) prepare(i.microbatch);
    return Pending{};
  });
  in.set(Op::forward, [this](const Instruction& i) { return forward(i); });
  in.set(Op::backward, [this](const Instruction& i) { return backward(i); });
  install_messages(
      in, [this](const Instruction& i) { return receive(i); }, [this](const Instruction& i) { send(i); });
  in.set(Op::reduce_grads, [this](const Instruction&) { return reduce(); });
  if (encoder_)
    in.set(Op::encoder_task, [this](const Instruction& i) {
      if ((i.flags & pipeline::kInDpWait) && (i.flags & pipeline::kBackwardTask)) post_llm_reduce_early();
      encoder_->run(i);
      // Drives the reduction along between tasks: ZeRO-1 posts its next unit as one completes.
      if (!early_llm_reduce_.empty()) early_llm_reduce_.test();
      return Pending{};
    });
}

Pending ChainStage::forward(const Instruction& ins) {
  const auto& chain = *model_.chain;
  const int i = ins.microbatch;
  if (encoder_stage_) {
    encode(i, fan_positions(encoder_part_));
    return {};
  }
  Microbatch& mb = prepare(i);
  const bool first = llm_.stage == 0, last = llm_.stage + 1 == llm_.stages;
  if (first && chain.vision) {
    if (encodes_in_forward_) encode(i, all_positions());
    if (encoder_ && llm_.tp > vision_.tp) {
      const auto& lane = encoder_->lane();
      if (std::find(lane.begin(), lane.end(), i) != lane.end()) share_tokens_within_tp(i);
    }
    // Each side group's prefix: its samples' tokens, through the projector when it is here.
    const std::int64_t width = token_width();
    Calls projector_calls(chain.projector && !projector_on_encoder_ ? projector_zero_.get() : nullptr,
                          static_cast<int>(mb.groups.size()), false);
    for (auto& g : mb.groups) {
      const std::int64_t n = image_tokens(g.side) * width;
      nn::Tensor prefix({static_cast<std::int64_t>(g.members.size()), image_tokens(g.side), width});
      for (std::size_t m = 0; m < g.members.size(); ++m) {
        const auto& rows = store_.tokens(i, g.members[m]);
        if (static_cast<std::int64_t>(rows.size()) != n)
          throw Error(Status::internal, "the llm's forward of microbatch " + std::to_string(i) +
                                            " found no image tokens for sample " + std::to_string(g.members[m]));
        std::copy(rows.begin(), rows.end(), prefix.data.begin() + static_cast<std::ptrdiff_t>(m * n));
      }
      prefix = ops_.from_host(std::move(prefix));
      if (chain.projector && !projector_on_encoder_) {
        g.encoder_tokens = std::move(prefix);
        g.input = within(projector_zero_.get(),
                         [&] { return chain.projector->forward(ops_, g.encoder_tokens, g.projector); });
      } else {
        g.input = std::move(prefix);
      }
    }
  }
  Calls llm_calls(llm_zero_.get(), static_cast<int>(mb.groups.size()), false);
  for (auto& g : mb.groups) {
    const nn::Tensor* input = g.input.data.empty() ? nullptr : &g.input;
    g.output = within(llm_zero_.get(), [&] { return chain.llm->forward_part(ops_, part_, input, g.text, g.cache); });
    if (last) {
      const float share = chain.llm->loss(ops_, g.output, g.text, normalizer_, &g.d_output);
      if (llm_.tp_rank == 0) loss_ += share;
      g.output = {};
    }
    g.input = {};
  }
  return {};
}

Pending ChainStage::backward(const Instruction& ins) {
  const auto& chain = *model_.chain;
  const int i = ins.microbatch;
  if (encoder_stage_) {
    encode_backward(i);
    return {};
  }
  --llm_backwards_left_;  // the handler finishes it: its gradients are in when it returns
  Microbatch& mb = in_flight_.at(i);
  Calls llm_calls(llm_zero_.get(), static_cast<int>(mb.groups.size()), true);
  for (auto& g : mb.groups) {
    g.d_input = within(llm_zero_.get(), [&] { return chain.llm->backward_part(ops_, part_, g.d_output, g.cache); });
    g.d_output = {};
    g.cache = {};
  }
  const bool projector_here = chain.projector && !projector_on_encoder_;
  if (llm_.stage == 0 && chain.vision && (encoder_trains() || (projector_here && !chain.projector->frozen()))) {
    // The prefix's gradient, through the projector when it is here, into the store.
    Calls projector_calls(projector_here ? projector_zero_.get() : nullptr, static_cast<int>(mb.groups.size()), true);
    for (auto& g : mb.groups) {
      nn::Tensor d = std::move(g.d_input);
      if (projector_here)
        d = within(projector_zero_.get(),
                   [&] { return chain.projector->backward(ops_, d, g.projector, encoder_trains()); });
      if (!encoder_trains()) continue;
      nn::Tensor scratch;
      const nn::Tensor& rows = on_host(ops_, d, scratch);
      const std::size_t n = static_cast<std::size_t>(rows.numel() / rows.dim(0));
      for (std::size_t m = 0; m < g.members.size(); ++m)
        store_.grads(i, g.members[m])
            .assign(rows.data.begin() + static_cast<std::ptrdiff_t>(m * n),
                    rows.data.begin() + static_cast<std::ptrdiff_t>((m + 1) * n));
    }
    if (encodes_in_forward_) encode_backward(i);
  }
  if (program_.stage_program().prev.empty()) in_flight_.erase(i);  // else send_grad needs it
  return {};
}

std::vector<std::size_t> ChainStage::share_positions(int share) const {
  const int shares = llm_.tp / vision_.tp;
  std::vector<std::size_t> out;
  for (std::int64_t q = share; q < microbatch_; q += shares) out.push_back(static_cast<std::size_t>(q));
  return out;
}

bool ChainStage::token_traffic(const Instruction& ins) const {
  return (ins.flags & pipeline::kSyncOnly) || encoder_stage_ ||
         (encoder_stage_index_ >= 0 && ins.peer == encoder_stage_index_);
}

Pending ChainStage::receive(const Instruction& ins) {
  const int i = ins.microbatch;
  const bool forward = ins.op == Op::recv_activation;
  std::vector<runtime::Request> requests;
  if (token_traffic(ins)) {
    // Image tokens (forward) or their gradients, into the store.
    if (!forward && !encoder_trains()) return {};
    if (forward) prepare(i);
    // A deque: its elements stay where they are while later receives are added.
    auto inbox = std::make_shared<std::deque<std::pair<std::vector<std::size_t>, std::vector<float>>>>();
    auto rows_from = [&](int from, std::vector<std::size_t> positions) {
      auto& [where, buffer] = inbox->emplace_back(std::move(positions), std::vector<float>());
      buffer = store_.buffer(i, where);
      requests.push_back(comm_->irecv(bytes(buffer), from, tag(forward ? kTokens : kTokenGrads, i)));
    };
    if (ins.flags & pipeline::kSyncOnly) {  // Optimus: another stage's lane and this stage's replica
      if (forward) {
        for (int c = 0; c < llm_.tp / vision_.tp; ++c)
          rows_from(program_.rank_of(ins.peer, program_.replica, c * vision_.tp), share_positions(c));
      } else {
        rows_from(program_.rank_of(ins.peer, program_.replica, program_.tp_rank), encoder_->positions());
      }
    } else if (forward) {  // DistTrain: the llm's first stage from each encoder replica that feeds it
      for (int k = 0; k < fan_in_; ++k)
        rows_from(program_.rank_of(ins.peer, llm_replica_ * fan_in_ + k, 0), fan_positions(k));
    } else {
      rows_from(program_.rank_of(ins.peer, llm_replica_, 0), fan_positions(encoder_part_));
    }
    return pending_requests(std::move(requests), [this, i, forward, inbox] {
      for (auto& [where, buffer] : *inbox) store_.unpack(i, where, buffer, !forward);
    });
  }
  // Hidden states of the llm (or their gradients), one message per side group.
  const int from = program_.rank_of(ins.peer, program_.replica, program_.tp_rank);
  const std::int64_t hidden = model_.chain->llm->shape().transformer.hidden;
  Microbatch& mb = forward ? prepare(i) : in_flight_.at(i);
  for (std::size_t g = 0; g < mb.groups.size(); ++g) {
    auto& grp = mb.groups[g];
    const std::int64_t seq = (model_.chain->vision ? image_tokens(grp.side) : 0) + grp.text.length;
    nn::Tensor& into = forward ? grp.input : grp.d_output;
    nn::reset(into, {grp.text.batch, seq, hidden});
    requests.push_back(
        comm_->irecv(bytes(into.data), from, tag(forward ? kHidden : kHiddenGrads, i, static_cast<int>(g))));
  }
  // Received in host memory; on to where the ops keep tensors.
  return pending_requests(std::move(requests), [this, &mb, forward] {
    for (auto& grp : mb.groups) {
      nn::Tensor& into = forward ? grp.input : grp.d_output;
      into = ops_.from_host(std::move(into));
    }
  });
}

void ChainStage::send(const Instruction& ins) {
  const int i = ins.microbatch;
  const bool forward = ins.op == Op::send_activation;
  if (token_traffic(ins)) {
    if (!forward && !encoder_trains()) {
      in_flight_.erase(i);
      return;
    }
    const int t = tag(forward ? kTokens : kTokenGrads, i);
    if (ins.flags & pipeline::kSyncOnly) {  // Optimus: between this stage's lane and the first stage
      if (forward) {
        if (program_.tp_rank % vision_.tp == 0)
          for (int to = 0; to < llm_.tp; ++to)
            sends_.isend(*comm_, store_.pack(i, encoder_->positions(), false),
                         program_.rank_of(ins.peer, program_.replica, to), t);
      } else {
        sends_.isend(*comm_, store_.pack(i, share_positions(program_.tp_rank / vision_.tp), true),
                     program_.rank_of(ins.peer, program_.replica, program_.tp_rank), t);
      }
      return;
    }
    if (forward) {  // DistTrain: an encoder replica to every tp rank of the llm replica it feeds
      if (vision_.tp_rank == 0)
        for (int to = 0; to < llm_.tp; ++to)
          sends_.isend(*comm_, store_.pack(i, fan_positions(encoder_part_), false),
                       program_.rank_of(ins.peer, llm_replica_, to), t);
      return;
    }
    if (llm_.tp_rank == 0)
      for (int k = 0; k < fan_in_; ++k)
        for (int to = 0; to < vision_.tp; ++to)
          sends_.isend(*comm_, store_.pack(i, fan_positions(k), true),
                       program_.rank_of(ins.peer, llm_replica_ * fan_in_ + k, to), t);
    in_flight_.erase(i);
    return;
  }
  Microbatch& mb = in_flight_.at(i);
  const int to = program_.rank_of(ins.peer, program_.replica, program_.tp_rank);
  for (std::size_t g = 0; g < mb.groups.size(); ++g) {
    auto& grp = mb.groups[g];
    sends_.isend(*comm_, release_to_host(ops_, forward ? grp.output : grp.d_input), to,
                 tag(forward ? kHidden : kHiddenGrads, i, static_cast<int>(g)));
  }
  if (!forward) in_flight_.erase(i);
}

Pending ChainStage::reduce() {
  const auto& chain = *model_.chain;
  double waited = sends_.wait_all();
  // Per module in one order on every rank: ZeRO's reduce-scatter, or an all-reduce (ZeRO
  // exists only over a DP group).
  if (!early_llm_reduce_.empty())
    waited += std::exchange(early_llm_reduce_, {}).finish();
  else if (llm_dp_)
    waited += reduce_module_gradients(ops_, llm_zero_.get(), llm_dp_device_.get(), *llm_dp_,
                                      chain.llm->part_parameters(part_), reduction_bytes_);
  if (vision_dp_)
    waited += reduce_module_gradients(ops_, vision_zero_.get(), vision_dp_device_.get(), *vision_dp_,
                                      chain.vision->parameters(), reduction_bytes_);
  if (projector_dp_)
    waited += reduce_module_gradients(ops_, projector_zero_.get(), projector_dp_device_.get(), *projector_dp_,
                                      chain.projector->parameters(), reduction_bytes_);
  double loss[1] = {loss_};
  auto req = comm_->iallreduce(std::span<double>(loss));
  waited += req.wait();
  result_->loss = loss[0];
  return blocked_for(waited);
}

void ChainStage::post_llm_reduce_early() {
  // Every replica posts at the same point of its llm DP group's collectives: the group has
  // this one per step. Under online filling a task may come up before the last llm backward.
  // ZeRO-2 and 3 reduce-scattered as the backwards went: they post nothing.
  if (!early_llm_reduce_.empty() || llm_backwards_left_ > 0 || !llm_dp_) return;
  const auto params = model_.chain->llm->part_parameters(part_);
  early_llm_reduce_ = llm_zero_        ? llm_zero_->post_reduce()
                      : llm_dp_device_ ? llm_dp_device_->post_allreduce_gradients(params, reduction_bytes_)
                                       : post_allreduce_gradients(ops_, *llm_dp_, params, reduction_bytes_);
}

void ChainStage::gather_parameters() {
  const auto& chain = *model_.chain;
  auto share = [&](const std::vector<nn::Parameter*>& params, int owner) {
    for (auto* p : params) broadcast(ops_, *comm_, p->value, owner);
  };
  if (chain.vision) share(chain.vision->parameters(), vision_.rank_at(0, 0, 0));
  if (chain.projector) share(chain.projector->parameters(), projector_.rank_at(0, 0, 0));
  const auto parts = nn::split_decoder(chain.llm->layers(), llm_.stages);
  for (int s = 0; s < llm_.stages; ++s)
    share(chain.llm->part_parameters(parts[static_cast<std::size_t>(s)]), llm_.rank_at(s, 0, 0));
}

void ChainStage::single_process(bool on) {
  // ZeRO-3's shards gathered into the tensor-parallel slices, then those gathered whole; back
  // the other way. In one order on every rank. The ZeRO hooks are off meanwhile: one process
  // runs the model outside the program.
  const auto& chain = *model_.chain;
  std::vector<ZeroModule*> zero;
  for (ZeroModule* z : {llm_zero_.get(), vision_zero_.get(), projector_zero_.get()})
    if (z) zero.push_back(z);
  if (on)
    for (ZeroModule* z : zero) z->materialize(true);
  set_tensor_parallel(on);
  if (!on)
    for (ZeroModule* z : zero) z->materialize(false);
  if (llm_zero_ && llm_zero_->stage() >= 2) chain.llm->set_block_hooks(on ? nullptr : llm_zero_.get());
  if (vision_zero_ && vision_zero_->stage() >= 2) chain.vision->set_block_hooks(on ? nullptr : vision_zero_.get());
}

std::map<const nn::Parameter*, nn::Tensor> ChainStage::gather_sharded(const std::string& kind) {
  return train::gather_sharded({llm_zero_.get(), vision_zero_.get(), projector_zero_.get()}, kind);
}

void ChainStage::after_optimizer_step() {
  double waited = 0;
  for (ZeroModule* z : {llm_zero_.get(), vision_zero_.get(), projector_zero_.get()})
    if (z) waited += z->after_step();
  if (result_) result_->idle[static_cast<std::size_t>(sim::Cause::dp_end)] += waited;
}

}  // namespace braid::train
