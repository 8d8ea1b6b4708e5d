#include "core/train/colocated_encoder.hpp"

#include <algorithm>
#include <string>

#include "core/common/error.hpp"
#include "core/train/host_staging.hpp"
#include "core/train/inputs.hpp"

namespace braid::train {
namespace {

using pipeline::UnitKind;

}  // namespace

ColocatedEncoder::ColocatedEncoder(const bubble::Colocated& layout, int stage, const pipeline::StageProgram& program,
                                   const nn::ImageEncoder& vision, nn::Ops& ops, std::int64_t llm_microbatch, int share,
                                   int shares)
    : program_(program), vision_(vision), ops_(ops), llm_microbatch_(llm_microbatch) {
  if (layout.encoders.size() != 1)
    throw Error(Status::unsupported, "the CPU trainer runs one colocated encoder (the plan has " +
                                         std::to_string(layout.encoders.size()) + ")");
  const bubble::Encoder& enc = layout.encoders.front();
  if (enc.stages != 1)
    throw Error(Status::unsupported, "the CPU trainer runs the colocated encoder '" + enc.name +
                                         "' whole on every device: the plan gives it pp " + std::to_string(enc.stages));
  const bubble::Host& host = layout.hosts[static_cast<std::size_t>(stage)].front();
  lane_ = layout.lane_list(0, host.lane);
  microbatches_ = enc.microbatches;
  if (llm_microbatch % shares != 0)
    throw Error(Status::unsupported, "llm microbatches of " + std::to_string(llm_microbatch) +
                                         " samples do not split over the " + std::to_string(shares) + " replicas of '" +
                                         enc.name + "' in one llm tensor-parallel group");
  for (std::int64_t q = share; q < llm_microbatch; q += shares) positions_.push_back(static_cast<std::size_t>(q));
  const std::int64_t mine = static_cast<std::int64_t>(lane_.size() * positions_.size());
  if (layout.microbatches % enc.span != 0 || mine % microbatches_ != 0)
    throw Error(Status::unsupported, "the " + std::to_string(layout.microbatches) +
                                         " llm microbatches do not split over the " + std::to_string(enc.span) +
                                         " lanes of '" + enc.name + "' into " + std::to_string(microbatches_) +
                                         " encoder microbatches per device");
  for (const auto& t : host.forward)
    if (program.units[static_cast<std::size_t>(t.unit)].kind == UnitKind::encoder_head) has_head_ = true;
}

std::vector<std::vector<cost::TrainedSample>> ColocatedEncoder::microbatch_samples() const {
  std::vector<std::vector<cost::TrainedSample>> out;
  for (const auto& mb : mbs_) {
    auto& ran = out.emplace_back();
    for (const auto& [i, q] : mb.entries)
      ran.push_back(trained_sample(samples_[static_cast<std::size_t>(i * llm_microbatch_) + q]));
  }
  return out;
}

void ColocatedEncoder::begin_step(std::span<const data::Sample> llm_samples, TokenStore& store) {
  store_ = &store;
  samples_ = llm_samples;
  std::vector<std::pair<int, std::size_t>> entries;
  for (int i : lane_)
    for (std::size_t q : positions_) entries.emplace_back(i, q);
  const std::size_t per = entries.size() / static_cast<std::size_t>(microbatches_);
  mbs_.assign(static_cast<std::size_t>(microbatches_), {});
  for (std::size_t j = 0; j < mbs_.size(); ++j)
    mbs_[j].entries.assign(entries.begin() + static_cast<std::ptrdiff_t>(j * per),
                           entries.begin() + static_cast<std::ptrdiff_t>((j + 1) * per));
}

bool ColocatedEncoder::ready(const pipeline::Instruction& task) const {
  const Microbatch& mb = mbs_.at(static_cast<std::size_t>(task.microbatch));
  return !(task.flags & pipeline::kBackwardTask) || mb.backward_started || vision_.frozen() || grads_ready(mb);
}

bool ColocatedEncoder::grads_ready(const Microbatch& mb) const {
  for (const auto& [i, q] : mb.entries)
    if (store_->grads(i, q).empty()) return false;
  return true;
}

void ColocatedEncoder::run(const pipeline::Instruction& task) {
  Microbatch& mb = mbs_.at(static_cast<std::size_t>(task.microbatch));
  const pipeline::WorkUnit& unit = program_.units.at(static_cast<std::size_t>(task.unit));
  const bool backward = task.flags & pipeline::kBackwardTask;
  const int last_layer = vision_.layers() - 1, last_kernel = nn::TransformerBlock::kKernels - 1;
  if (!backward) {
    switch (unit.kind) {
      case UnitKind::encoder_embedding: {
        std::vector<std::size_t> picked;
        for (const auto& [i, q] : mb.entries) picked.push_back(static_cast<std::size_t>(i * llm_microbatch_) + q);
        mb.groups.clear();
        for (auto& g : side_groups(samples_, picked)) {
          Group& group = mb.groups.emplace_back();
          group.side = g.side;
          group.members = std::move(g.members);
          vision_.forward_embed(ops_, ops_.from_host(std::move(g.images)), group.steps);
        }
        return;
      }
      case UnitKind::encoder_kernel:
        for (auto& g : mb.groups) vision_.forward_kernel(ops_, task.chunk, unit.kernel, g.steps);
        if (!has_head_ && task.chunk == last_layer && unit.kernel == last_kernel) finish(mb);
        return;
      case UnitKind::encoder_head:
        finish(mb);
        return;
      case UnitKind::encoder_transfer:  // the ordering messages carry the tokens
      case UnitKind::encoder_shard:     // no ZeRO in the reference trainer
        return;
      case UnitKind::model:
        break;
    }
  } else if (!vision_.frozen()) {
    switch (unit.kind) {
      case UnitKind::encoder_head:
        start_backward(mb);
        return;
      case UnitKind::encoder_kernel:
        if (!mb.backward_started) start_backward(mb);
        for (auto& g : mb.groups) vision_.backward_kernel(ops_, task.chunk, unit.kernel, g.steps);
        return;
      case UnitKind::encoder_embedding:
        for (auto& g : mb.groups) vision_.backward_embed(ops_, g.steps);
        mb.groups.clear();
        return;
      case UnitKind::encoder_transfer:
      case UnitKind::encoder_shard:
        return;
      case UnitKind::model:
        break;
    }
  } else {
    return;
  }
  throw Error(Status::internal, "an encoder task runs unit '" + unit.label + "', which is not encoder work");
}

// The final norm; each sample's tokens into the store.
void ColocatedEncoder::finish(Microbatch& mb) {
  for (auto& g : mb.groups) {
    const nn::EncoderOutput out = vision_.forward_finish(ops_, g.steps);
    nn::Tensor scratch;
    const nn::Tensor& tokens = on_host(ops_, out.tokens, scratch);
    const std::size_t n = static_cast<std::size_t>(tokens.numel() / tokens.dim(0));
    for (std::size_t m = 0; m < g.members.size(); ++m) {
      const auto [i, q] = mb.entries[g.members[m]];
      store_->tokens(i, q).assign(tokens.data.begin() + static_cast<std::ptrdiff_t>(m * n),
                                  tokens.data.begin() + static_cast<std::ptrdiff_t>((m + 1) * n));
    }
  }
}

// The tokens' gradients from the store into the final norm's backward.
void ColocatedEncoder::start_backward(Microbatch& mb) {
  if (!grads_ready(mb))
    throw Error(Status::internal, "an encoder backward ran before the llm returned its tokens' gradients");
  for (auto& g : mb.groups) {
    const auto& tokens = g.steps.cache;
    nn::Tensor d({tokens.batch, tokens.patches, vision_.shape().transformer.hidden});
    const std::size_t n = static_cast<std::size_t>(d.numel() / d.dim(0));
    for (std::size_t m = 0; m < g.members.size(); ++m) {
      const auto [i, q] = mb.entries[g.members[m]];
      const auto& rows = store_->grads(i, q);
      std::copy(rows.begin(), rows.end(), d.data.begin() + static_cast<std::ptrdiff_t>(m * n));
    }
    d = ops_.from_host(std::move(d));
    vision_.backward_start(ops_, &d, nullptr, g.steps);
  }
  mb.backward_started = true;
}

}  // namespace braid::train
