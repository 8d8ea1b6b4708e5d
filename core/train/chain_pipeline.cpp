#include "core/train/chain_pipeline.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/common/error.hpp"
#include "core/pipeline/schedules.hpp"
#include "core/train/executor.hpp"
#include "core/train/inputs.hpp"
#include "core/train/messages.hpp"

namespace braid::train {
namespace {

int tag(Message kind, int microbatch, int group = 0) { return message_tag(kind, microbatch, group); }
constexpr Message kTokens = Message::encoder_tokens, kTokenGrads = Message::encoder_token_grads,
                  kHidden = Message::llm_hidden, kHiddenGrads = Message::llm_hidden_grads;

ModuleRole role_of(const RankLayout& layout, spec::Role role) {
  for (const auto& m : layout.modules)
    if (m.role == role) return m;
  return {};
}

std::span<std::byte> bytes(std::vector<float>& v) { return std::as_writable_bytes(std::span<float>(v)); }

}  // namespace

// An encoder replica's share of one llm microbatch: the samples at positions i % f == k.
struct ChainPipeline::Slice {
  std::vector<std::size_t> positions;  // in the microbatch, ascending
  std::vector<SideGroup> groups;       // side groups of the slice's samples (members: slice indices)
  std::vector<nn::ImageEncoderCache> vision;
  std::vector<nn::ProjectorCache> projector;
};

struct ChainPipeline::Microbatch {
  std::vector<data::Sample> samples;
  struct Group {
    std::vector<std::size_t> members;  // positions in the microbatch
    int side = 0;
    nn::Tokens text;
    nn::Tensor input;   // prefix (stage 0, after the projector) or the previous stage's hidden
    nn::Tensor output;  // hidden, or logits on the last stage
    nn::Tensor d_output, d_input;
    nn::DecoderCache cache;
    nn::ProjectorCache projector;
    nn::Tensor encoder_tokens;  // stage 0 with the projector: its input
  };
  std::vector<Group> groups;
};

ChainPipeline::ChainPipeline(const spec::RunSpec& run, nn::Model& model, const data::ShapesDataset& dataset,
                             const RankLayout& layout, runtime::World& world, bool reorder)
    : run_(run), model_(model), layout_(layout), world_(world) {
  vision_ = role_of(layout, spec::Role::encoder);
  projector_ = role_of(layout, spec::Role::projector);
  llm_ = role_of(layout, spec::Role::llm);
  const auto& chain = *model.chain;
  if (!llm_.grid) throw Error(Status::bad_config, "the plan places no llm");
  if (chain.vision && !vision_.grid) throw Error(Status::bad_config, "the plan places no image encoder");
  const int replicas = llm_.replicas;
  if (chain.vision) {
    if (vision_.replicas % replicas != 0)
      throw Error(Status::unsupported, "the CPU trainer feeds each llm replica from whole encoder replicas: '" +
                                           vision_.name + "' has " + std::to_string(vision_.replicas) +
                                           " replicas for " + std::to_string(replicas) + " of '" + llm_.name + "'");
    fan_in_ = vision_.replicas / replicas;
  }
  if (chain.projector) {
    // With the llm's first stage when its grid covers that stage's first rank, else with the encoder.
    const int stage0 = llm_.rank_at(0, 0, 0);
    projector_with_vision_ = !projector_.grid->contains(stage0);
    const bool must_hold = projector_with_vision_ ? vision_.held : (llm_.held && llm_.stage == 0);
    if (must_hold != projector_.held)
      throw Error(Status::unsupported,
                  "the CPU trainer runs the projector '" + projector_.name + "' on every rank of " +
                      (projector_with_vision_ ? "the encoder '" + vision_.name + "'" : "the llm's first stage") +
                      " and nowhere else; rank " + std::to_string(layout.rank) + " does not match");
  }
  const long long rows = run.training.global_batch / replicas;
  microbatch_ = std::min<long long>(run.training.microbatch, rows);
  if (run.training.global_batch % replicas != 0 || rows % microbatch_ != 0 || microbatch_ % fan_in_ != 0)
    throw Error(Status::bad_config,
                run.source + ": training: " + std::to_string(run.training.global_batch) + " samples over " +
                    std::to_string(replicas) + " llm replicas do not split into microbatches of " +
                    std::to_string(microbatch_) + " shared by " + std::to_string(fan_in_) + " encoder replicas each");
  microbatches_ = static_cast<int>(rows / microbatch_);
  if (microbatches_ > kMaxMicrobatches)
    throw Error(Status::unsupported, "the CPU trainer runs at most " + std::to_string(kMaxMicrobatches) +
                                         " microbatches per replica (got " + std::to_string(microbatches_) + ")");
  const auto parts = nn::split_decoder(chain.llm->layers(), llm_.stages);
  if (llm_.held) part_ = parts[static_cast<std::size_t>(llm_.stage)];
  loader_ =
      std::make_unique<Loader>(dataset, LoaderOptions{run.training.global_batch, replicas, reorder && replicas > 1});

  // The llm's program: a linear pipeline of its stages, 1F1B.
  program_.stages.resize(static_cast<std::size_t>(llm_.stages));
  for (int s = 0; s < llm_.stages; ++s) {
    auto& st = program_.stages[static_cast<std::size_t>(s)];
    st.name = llm_.name + " stage " + std::to_string(s);
    st.depth = s;
    if (s > 0) st.prev = {s - 1};
    if (s + 1 < llm_.stages) st.next = {s + 1};
  }
  pipeline::one_f_one_b(program_, microbatches_);
  pipeline::finish_step(program_);

  // Groups in one order on every rank: llm tp, llm dp, encoder dp, projector dp.
  comm_ = &world.communicator();
  if (llm_.held && llm_.tp > 1) tp_comm_.emplace(world.group(llm_.tp_ranks));
  if (llm_.held && llm_.replicas > 1) llm_dp_.emplace(world.group(llm_.dp_ranks));
  if (vision_.held && vision_.replicas > 1) vision_dp_.emplace(world.group(vision_.dp_ranks));
  if (projector_.held && projector_.replicas > 1) projector_dp_.emplace(world.group(projector_.dp_ranks));
  if (tp_comm_) {
    tp_.rank = llm_.tp_rank;
    tp_.size = llm_.tp;
    tp_.allreduce_sum = [this](nn::Tensor& t) { tp_comm_->allreduce(std::span<float>(t.data)); };
    model.chain->llm->set_tensor_parallel(tp_);
  }
}

ChainPipeline::~ChainPipeline() = default;

const std::vector<pipeline::Instruction>& ChainPipeline::instructions() const {
  static const std::vector<pipeline::Instruction> none;
  return llm_.held ? program_.stages[static_cast<std::size_t>(llm_.stage)].instructions : none;
}

std::vector<TrainedParameter> ChainPipeline::parameters() const {
  std::vector<TrainedParameter> out;
  auto add = [&](const std::vector<nn::Parameter*>& params, const ModuleRole& role) {
    for (auto* p : params)
      if (p->trainable) out.push_back({p, {}, role.replica == 0 && role.tp_rank == 0});
  };
  const auto& chain = *model_.chain;
  if (vision_.held) add(chain.vision->parameters(), vision_);
  if (projector_.held) add(chain.projector->parameters(), projector_);
  if (llm_.held) add(chain.llm->part_parameters(part_), llm_);
  return out;
}

std::int64_t ChainPipeline::image_tokens(int side) const {
  if (!model_.chain->vision) return 0;
  const std::int64_t g = side / model_.chain->vision->shape().patch;
  return g * g;
}

std::int64_t ChainPipeline::encoder_width() const {
  const auto& chain = *model_.chain;
  return projector_with_vision_ || !chain.projector ? chain.llm->shape().transformer.hidden
                                                    : chain.vision->shape().transformer.hidden;
}

bool ChainPipeline::encoder_trains() const {
  const auto& chain = *model_.chain;
  return chain.vision && (!chain.vision->frozen() || (projector_with_vision_ && !chain.projector->frozen()));
}

std::vector<data::Sample> ChainPipeline::microbatch_samples(const std::vector<data::Sample>& all, int j) const {
  const auto first = all.begin() + static_cast<std::ptrdiff_t>(j * microbatch_);
  return {first, first + static_cast<std::ptrdiff_t>(microbatch_)};
}

void ChainPipeline::isend(std::vector<float> data, int peer, int t) { sends_.isend(*comm_, std::move(data), peer, t); }

void ChainPipeline::wait_sends(StepResult& r) { r.wait_seconds += sends_.wait_all(); }

void ChainPipeline::begin_step(nn::Ops& ops, std::int64_t step, StepResult& r) {
  const auto& chain = *model_.chain;
  loss_ = 0;
  in_flight_.clear();
  if (llm_.held) llm_samples_ = loader_->samples(step, llm_.replica);
  // The loss is a mean over the step's counted tokens: one count per llm replica.
  std::int64_t count[1] = {llm_.held && llm_.stage == 0 && llm_.tp_rank == 0 ? counted_tokens(llm_samples_) : 0};
  auto req = comm_->iallreduce(std::span<std::int64_t>(count));
  r.wait_seconds += req.wait();
  normalizer_ = count[0];

  slices_.clear();
  if (!vision_.held) return;
  const int served = vision_.replica / fan_in_, part = vision_.replica % fan_in_;
  vision_samples_ = llm_.held && llm_.replica == served ? llm_samples_ : loader_->samples(step, served);
  const std::int64_t width = encoder_width();
  for (int j = 0; j < microbatches_; ++j) {
    Slice& s = slices_.emplace_back();
    const auto mb = microbatch_samples(vision_samples_, j);
    std::vector<data::Sample> mine;
    for (std::size_t i = static_cast<std::size_t>(part); i < mb.size(); i += static_cast<std::size_t>(fan_in_)) {
      s.positions.push_back(i);
      mine.push_back(mb[i]);
    }
    s.groups = side_groups(mine);
    s.vision.resize(s.groups.size());
    s.projector.resize(s.groups.size());
    std::vector<float> message;
    std::vector<nn::Tensor> outputs;
    for (std::size_t g = 0; g < s.groups.size(); ++g) {
      nn::Tensor tokens = chain.vision->forward(ops, s.groups[g].images, s.vision[g]).tokens;
      if (projector_with_vision_) tokens = chain.projector->forward(ops, tokens, s.projector[g]);
      outputs.push_back(std::move(tokens));
    }
    if (vision_.tp_rank != 0) continue;  // its tp peers send the same tokens
    // The slice's samples in order, each its image tokens (N x width).
    for (std::size_t q = 0; q < mine.size(); ++q)
      for (std::size_t g = 0; g < s.groups.size(); ++g) {
        const auto& members = s.groups[g].members;
        const auto at = std::find(members.begin(), members.end(), q);
        if (at == members.end()) continue;
        const std::int64_t n = image_tokens(s.groups[g].side) * width;
        const float* row = outputs[g].ptr() + (at - members.begin()) * n;
        message.insert(message.end(), row, row + n);
      }
    for (int t = 0; t < llm_.tp; ++t) isend(message, llm_.rank_at(0, t, served), tag(kTokens, j));
  }
}

ChainPipeline::Microbatch& ChainPipeline::prepare(int j) {
  auto [it, fresh] = in_flight_.try_emplace(j);
  Microbatch& mb = it->second;
  if (!fresh) return mb;
  mb.samples = microbatch_samples(llm_samples_, j);
  if (model_.chain->vision) {
    for (auto& sg : side_groups(mb.samples)) {
      auto& g = mb.groups.emplace_back();
      g.members = sg.members;
      g.side = sg.side;
      g.text = tokens_of(mb.samples, g.members);
    }
  } else {
    auto& g = mb.groups.emplace_back();
    for (std::size_t i = 0; i < mb.samples.size(); ++i) g.members.push_back(i);
    g.text = tokens_of(mb.samples);
  }
  if (mb.groups.size() > static_cast<std::size_t>(kMaxGroups))
    throw Error(Status::unsupported, "more than 16 image sides in one microbatch");
  return mb;
}

void ChainPipeline::run(nn::Ops& ops, const pipeline::Instruction& i, StepResult& r) {
  const auto& chain = *model_.chain;
  const int j = i.microbatch, s = llm_.stage, t = llm_.tp_rank, d = llm_.replica;
  const std::int64_t hidden = chain.llm->shape().transformer.hidden;
  switch (i.op) {
    case pipeline::Op::load_microbatch: {
      Microbatch& mb = prepare(j);
      if (!chain.vision) return;
      // Every encoder replica's slice of this microbatch, then the prefix of each side group.
      const std::int64_t width = encoder_width();
      std::vector<std::vector<float>> rows_of(mb.samples.size());
      for (int k = 0; k < fan_in_; ++k) {
        std::int64_t total = 0;
        for (std::size_t q = static_cast<std::size_t>(k); q < mb.samples.size(); q += static_cast<std::size_t>(fan_in_))
          total += image_tokens(mb.samples[q].side) * width;
        std::vector<float> message(static_cast<std::size_t>(total));
        auto req = comm_->irecv(bytes(message), vision_.rank_at(0, 0, d * fan_in_ + k), tag(kTokens, j));
        r.wait_seconds += req.wait();
        std::size_t at = 0;
        for (std::size_t q = static_cast<std::size_t>(k); q < mb.samples.size();
             q += static_cast<std::size_t>(fan_in_)) {
          const auto n = static_cast<std::size_t>(image_tokens(mb.samples[q].side) * width);
          rows_of[q].assign(message.begin() + static_cast<std::ptrdiff_t>(at),
                            message.begin() + static_cast<std::ptrdiff_t>(at + n));
          at += n;
        }
      }
      for (auto& g : mb.groups) {
        const std::int64_t n = image_tokens(g.side);
        nn::Tensor prefix({static_cast<std::int64_t>(g.members.size()), n, width});
        for (std::size_t m = 0; m < g.members.size(); ++m)
          std::copy(rows_of[g.members[m]].begin(), rows_of[g.members[m]].end(),
                    prefix.data.begin() + static_cast<std::ptrdiff_t>(m * static_cast<std::size_t>(n * width)));
        if (chain.projector && !projector_with_vision_) {
          g.encoder_tokens = std::move(prefix);
          g.input = chain.projector->forward(ops, g.encoder_tokens, g.projector);
        } else {
          g.input = std::move(prefix);
        }
      }
      return;
    }
    case pipeline::Op::recv_activation: {
      Microbatch& mb = prepare(j);
      for (std::size_t g = 0; g < mb.groups.size(); ++g) {
        auto& grp = mb.groups[g];
        const std::int64_t seq = image_tokens(grp.side) + grp.text.length;
        nn::reset(grp.input, {grp.text.batch, seq, hidden});
        auto req = comm_->irecv(bytes(grp.input.data), llm_.rank_at(s - 1, t, d), tag(kHidden, j, static_cast<int>(g)));
        r.wait_seconds += req.wait();
      }
      return;
    }
    case pipeline::Op::forward: {
      Microbatch& mb = prepare(j);
      const bool last = s + 1 == llm_.stages;
      for (auto& g : mb.groups) {
        const nn::Tensor* input = g.input.data.empty() ? nullptr : &g.input;
        g.output = chain.llm->forward_part(ops, part_, input, g.text, g.cache);
        if (last) {
          const float share = nn::lm_loss(ops, g.output, g.text, normalizer_, &g.d_output);
          if (t == 0) loss_ += share;
          g.output = {};
        }
        g.input = {};
      }
      return;
    }
    case pipeline::Op::send_activation: {
      Microbatch& mb = in_flight_.at(j);
      for (std::size_t g = 0; g < mb.groups.size(); ++g)
        isend(std::move(mb.groups[g].output.data), llm_.rank_at(s + 1, t, d), tag(kHidden, j, static_cast<int>(g)));
      return;
    }
    case pipeline::Op::recv_grad: {
      Microbatch& mb = in_flight_.at(j);
      for (std::size_t g = 0; g < mb.groups.size(); ++g) {
        auto& grp = mb.groups[g];
        const std::int64_t seq = image_tokens(grp.side) + grp.text.length;
        nn::reset(grp.d_output, {grp.text.batch, seq, hidden});
        auto req = comm_->irecv(bytes(grp.d_output.data), llm_.rank_at(s + 1, t, d),
                                tag(kHiddenGrads, j, static_cast<int>(g)));
        r.wait_seconds += req.wait();
      }
      return;
    }
    case pipeline::Op::backward: {
      Microbatch& mb = in_flight_.at(j);
      for (auto& g : mb.groups) {
        g.d_input = chain.llm->backward_part(ops, part_, g.d_output, g.cache);
        g.d_output = {};
        g.cache = {};
      }
      const bool projector_here = chain.projector && !projector_with_vision_;
      const bool vision_trains = chain.vision && !chain.vision->frozen();
      if (s > 0 || !chain.vision || !(encoder_trains() || (projector_here && !chain.projector->frozen()))) {
        if (s == 0) in_flight_.erase(j);
        return;
      }
      // Stage 0: the prefix's gradient, through the projector when it is here, back to the encoders.
      const std::int64_t width = encoder_width();
      std::vector<std::vector<float>> rows_of(mb.samples.size());
      for (auto& g : mb.groups) {
        nn::Tensor d = std::move(g.d_input);
        if (projector_here) d = chain.projector->backward(ops, d, g.projector, vision_trains);
        if (!encoder_trains()) continue;
        const std::int64_t n = image_tokens(g.side) * width;
        for (std::size_t m = 0; m < g.members.size(); ++m)
          rows_of[g.members[m]].assign(
              d.data.begin() + static_cast<std::ptrdiff_t>(m * static_cast<std::size_t>(n)),
              d.data.begin() + static_cast<std::ptrdiff_t>((m + 1) * static_cast<std::size_t>(n)));
      }
      if (t == 0 && encoder_trains())
        for (int k = 0; k < fan_in_; ++k) {
          std::vector<float> message;
          for (std::size_t q = static_cast<std::size_t>(k); q < mb.samples.size();
               q += static_cast<std::size_t>(fan_in_))
            message.insert(message.end(), rows_of[q].begin(), rows_of[q].end());
          for (int tv = 0; tv < vision_.tp; ++tv)
            isend(message, vision_.rank_at(0, tv, d * fan_in_ + k), tag(kTokenGrads, j));
        }
      in_flight_.erase(j);
      return;
    }
    case pipeline::Op::send_grad: {
      Microbatch& mb = in_flight_.at(j);
      for (std::size_t g = 0; g < mb.groups.size(); ++g)
        isend(std::move(mb.groups[g].d_input.data), llm_.rank_at(s - 1, t, d),
              tag(kHiddenGrads, j, static_cast<int>(g)));
      in_flight_.erase(j);
      return;
    }
    default:
      throw Error(Status::internal, std::string("chain pipeline: unexpected ") + pipeline::op_name(i.op));
  }
}

void ChainPipeline::reduce_grads(nn::Ops& ops, StepResult& r) {
  const auto& chain = *model_.chain;
  // Encoder backwards, encoder-first order: after the llm's pipeline.
  if (vision_.held && encoder_trains()) {
    const std::int64_t width = encoder_width();
    const int served = vision_.replica / fan_in_;
    for (int j = 0; j < microbatches_; ++j) {
      Slice& s = slices_[static_cast<std::size_t>(j)];
      std::int64_t total = 0;
      for (const auto& g : s.groups)
        total += static_cast<std::int64_t>(g.members.size()) * image_tokens(g.side) * width;
      std::vector<float> message(static_cast<std::size_t>(total));
      auto req = comm_->irecv(bytes(message), llm_.rank_at(0, 0, served), tag(kTokenGrads, j));
      r.wait_seconds += req.wait();
      // The message is in slice order; each group's rows are its members'.
      std::vector<std::size_t> offset(s.positions.size());
      std::size_t at = 0;
      for (std::size_t q = 0; q < s.positions.size(); ++q) {
        offset[q] = at;
        for (const auto& g : s.groups)
          if (std::find(g.members.begin(), g.members.end(), q) != g.members.end())
            at += static_cast<std::size_t>(image_tokens(g.side) * width);
      }
      for (std::size_t g = 0; g < s.groups.size(); ++g) {
        const auto& grp = s.groups[g];
        const std::int64_t n = image_tokens(grp.side);
        nn::Tensor d({static_cast<std::int64_t>(grp.members.size()), n, width});
        for (std::size_t m = 0; m < grp.members.size(); ++m)
          std::copy(message.begin() + static_cast<std::ptrdiff_t>(offset[grp.members[m]]),
                    message.begin() +
                        static_cast<std::ptrdiff_t>(offset[grp.members[m]] + static_cast<std::size_t>(n * width)),
                    d.data.begin() + static_cast<std::ptrdiff_t>(m * static_cast<std::size_t>(n * width)));
        if (projector_with_vision_) d = chain.projector->backward(ops, d, s.projector[g], !chain.vision->frozen());
        if (!chain.vision->frozen()) chain.vision->backward(ops, &d, nullptr, s.vision[g]);
      }
    }
  }
  slices_.clear();
  wait_sends(r);

  auto allreduce = [&](runtime::Communicator& comm, const std::vector<nn::Parameter*>& params) {
    std::vector<float> flat;
    for (auto* p : params)
      if (p->trainable) flat.insert(flat.end(), p->grad.data.begin(), p->grad.data.end());
    auto req = comm.iallreduce(std::span<float>(flat));
    r.wait_seconds += req.wait();
    std::size_t at = 0;
    for (auto* p : params) {
      if (!p->trainable) continue;
      std::copy(flat.begin() + static_cast<std::ptrdiff_t>(at),
                flat.begin() + static_cast<std::ptrdiff_t>(at + p->grad.data.size()), p->grad.data.begin());
      at += p->grad.data.size();
    }
  };
  // Each tp rank holds its shard's slice of a sharded gradient: their sum is the whole.
  if (tp_comm_) allreduce(*tp_comm_, chain.llm->tp_sharded_parameters(part_));
  if (llm_dp_) allreduce(*llm_dp_, chain.llm->part_parameters(part_));
  if (vision_dp_) allreduce(*vision_dp_, chain.vision->parameters());
  if (projector_dp_) allreduce(*projector_dp_, chain.projector->parameters());
  double loss[1] = {loss_};
  auto req = comm_->iallreduce(std::span<double>(loss));
  r.wait_seconds += req.wait();
  r.loss = loss[0];
}

void ChainPipeline::gather_parameters() {
  const auto& chain = *model_.chain;
  auto share = [&](const std::vector<nn::Parameter*>& params, int owner) {
    for (auto* p : params) comm_->broadcast(std::as_writable_bytes(std::span<float>(p->value.data)), owner);
  };
  if (chain.vision) share(chain.vision->parameters(), vision_.rank_at(0, 0, 0));
  if (chain.projector) share(chain.projector->parameters(), projector_.rank_at(0, 0, 0));
  const auto parts = nn::split_decoder(chain.llm->layers(), llm_.stages);
  for (int s = 0; s < llm_.stages; ++s)
    share(chain.llm->part_parameters(parts[static_cast<std::size_t>(s)]), llm_.rank_at(s, 0, 0));
}

void ChainPipeline::single_process(bool on) {
  if (tp_comm_) model_.chain->llm->set_tensor_parallel(on ? nn::TensorParallel{} : tp_);
}

}  // namespace braid::train
