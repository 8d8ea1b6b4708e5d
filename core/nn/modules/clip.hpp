// CLIP's heads: each encoder's pooled output projected into the shared embedding and
// L2-normalised, and the contrastive loss with its learnable temperature t (logit scale
// exp(t), capped at 100; see Ops::contrastive_loss and clamp_logit_scale_param).
#pragma once

#include <cstdint>
#include <string>

#include "core/nn/modules/layers.hpp"

namespace braid::nn {

// CLIP's temperature starts at 0.07: t = ln(1 / 0.07) (Radford et al. 2021, sec. 2.5).
inline constexpr float kInitialLogitScaleParam = 2.6592600369327779f;

struct ClipHeadCache {
  Tensor pooled;     // (B, hidden)
  Tensor projected;  // (B, embed_dim), before normalisation
};

class ClipHead : public Module {
 public:
  // projection (embed_dim, hidden) ~ normal(0, hidden^-1/2), no bias, as open_clip's `proj`.
  ClipHead(ParameterStore& store, std::string name, int64_t hidden, int64_t embed_dim, bool frozen);
  // pooled (B, hidden) -> unit-norm embeddings (B, embed_dim).
  Tensor forward(Ops& ops, const Tensor& pooled, ClipHeadCache& cache) const;
  // Adds the projection's gradient; returns d pooled.
  Tensor backward(Ops& ops, const Tensor& d_embeddings, const ClipHeadCache& cache) const;

 private:
  Linear projection_;
};

class ContrastiveLoss : public Module {
 public:
  ContrastiveLoss(ParameterStore& store, std::string name);
  // The temperature's parameter t, read wherever `ops` keeps it.
  float logit_scale_param(Ops& ops) const;

  // Ops::contrastive_loss with this module's temperature; adds d loss / d t to its gradient.
  // One process: local = all, offset 0.
  float loss(Ops& ops, const Tensor& local_image, const Tensor& local_text, const Tensor& all_image,
             const Tensor& all_text, int64_t offset, ContrastiveGrads* grads) const;
  // After each optimizer step, as open_clip: t = clamp(t, 0, ln 100).
  void clamp_after_step(Ops& ops) const;

 private:
  Parameter* logit_scale_;
};

}  // namespace braid::nn
