#include "core/train/evaluate.hpp"

#include <cstring>
#include <string>

#include "core/common/error.hpp"
#include "core/train/host_staging.hpp"
#include "core/train/inputs.hpp"

namespace braid::train {
namespace {

// Rank i of `query` against every row of `keys`: the index of the best dot product.
std::int64_t best_match(const nn::Tensor& query, std::int64_t i, const nn::Tensor& keys) {
  const std::int64_t n = keys.dim(0), e = keys.dim(1);
  const float* q = query.ptr() + i * e;
  std::int64_t best = 0;
  double best_score = -1e300;
  for (std::int64_t j = 0; j < n; ++j) {
    const float* k = keys.ptr() + j * e;
    double s = 0;
    for (std::int64_t c = 0; c < e; ++c) s += static_cast<double>(q[c]) * k[c];
    if (s > best_score) {
      best_score = s;
      best = j;
    }
  }
  return best;
}

}  // namespace

std::vector<data::Sample> heldout_samples(const data::ShapesDataset& dataset, std::int64_t count) {
  if (count < 0)
    throw Error(Status::invalid_argument, "held-out samples: count is " + std::to_string(count) + "; use 0 or more");
  std::vector<data::Sample> out;
  out.reserve(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) out.push_back(dataset.get(i, data::Split::heldout));
  return out;
}

Retrieval retrieval_top1(const nn::Tensor& image, const nn::Tensor& text, std::span<const std::int64_t> scene_ids) {
  if (image.rank() != 2 || image.shape != text.shape || image.dim(0) != static_cast<std::int64_t>(scene_ids.size()))
    throw Error(Status::invalid_argument, "retrieval: image embeddings " + nn::shape_string(image.shape) + ", text " +
                                              nn::shape_string(text.shape) + ", " + std::to_string(scene_ids.size()) +
                                              " scene ids");
  const std::int64_t n = image.dim(0);
  if (n == 0) throw Error(Status::invalid_argument, "retrieval: no embeddings to rank");
  std::int64_t i2t = 0, t2i = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const auto id = scene_ids[static_cast<std::size_t>(i)];
    i2t += scene_ids[static_cast<std::size_t>(best_match(image, i, text))] == id;
    t2i += scene_ids[static_cast<std::size_t>(best_match(text, i, image))] == id;
  }
  return {static_cast<double>(i2t) / static_cast<double>(n), static_cast<double>(t2i) / static_cast<double>(n)};
}

nn::Tensor image_embeddings(nn::Ops& ops, const nn::ClipModel& clip, std::span<const data::Sample> samples) {
  nn::Tensor out;
  for (auto& g : side_groups(samples)) {
    nn::ImageEncoderCache cache;
    nn::ClipHeadCache head;
    const nn::Tensor emb = host_tensor(
        ops, clip.image_head->forward(
                 ops, clip.image_encoder->forward(ops, ops.from_host(std::move(g.images)), cache).pooled, head));
    const std::int64_t e = emb.dim(1);
    if (out.data.empty()) nn::reset(out, {static_cast<std::int64_t>(samples.size()), e});
    for (std::size_t m = 0; m < g.members.size(); ++m)
      std::memcpy(out.ptr() + g.members[m] * static_cast<std::size_t>(e), emb.ptr() + m * static_cast<std::size_t>(e),
                  static_cast<std::size_t>(e) * sizeof(float));
  }
  return out;
}

nn::Tensor text_embeddings(nn::Ops& ops, const nn::ClipModel& clip, std::span<const data::Sample> samples) {
  nn::TextEncoderCache cache;
  nn::ClipHeadCache head;
  return host_tensor(
      ops, clip.text_head->forward(ops, clip.text_encoder->forward(ops, tokens_of(samples), cache).pooled, head));
}

CaptionMetrics caption_metrics(nn::Ops& ops, const nn::ChainModel& chain, std::span<const data::Sample> samples) {
  CaptionMetrics m;
  double loss_sum = 0;
  std::int64_t correct = 0;
  auto run = [&](const nn::Tensor* images, const nn::Tokens& text) {
    nn::ImageEncoderCache vision;
    nn::ProjectorCache projector;
    nn::DecoderCache llm;
    nn::Tensor prefix;
    if (images) {
      prefix = chain.vision->forward(ops, ops.from_host(*images), vision).tokens;
      if (chain.projector) prefix = chain.projector->forward(ops, prefix, projector);
    }
    nn::Tensor logits = chain.llm->forward(ops, images ? &prefix : nullptr, text, llm);
    const auto targets = nn::next_token_targets(text);
    std::int64_t counted = 0;
    for (auto t : targets) counted += t >= 0;
    if (counted == 0) return;
    // lm_loss with normalizer 1 gives the sum over counted positions.
    loss_sum += nn::lm_loss(ops, logits, text, 1, nullptr);
    logits = host_tensor(ops, std::move(logits));
    const std::int64_t vocab = logits.dim(2);
    for (std::size_t p = 0; p < targets.size(); ++p) {
      if (targets[p] < 0) continue;
      const float* row = logits.ptr() + p * static_cast<std::size_t>(vocab);
      std::int64_t arg = 0;
      for (std::int64_t v = 1; v < vocab; ++v)
        if (row[v] > row[arg]) arg = v;
      correct += arg == targets[p];
    }
    m.tokens += counted;
  };
  if (!chain.vision) {
    run(nullptr, tokens_of(samples));
  } else {
    for (const auto& g : side_groups(samples)) run(&g.images, tokens_of(samples, g.members));
  }
  if (m.tokens > 0) {
    m.loss = loss_sum / static_cast<double>(m.tokens);
    m.token_accuracy = static_cast<double>(correct) / static_cast<double>(m.tokens);
  }
  return m;
}

}  // namespace braid::train
