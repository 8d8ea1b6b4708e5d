#include "core/nn/modules/clip.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/nn/optim.hpp"

namespace braid::nn {

ClipHead::ClipHead(ParameterStore& store, std::string name, int64_t hidden, int64_t embed_dim, bool frozen)
    : Module(std::move(name), frozen),
      projection_(store, this->name(), hidden, embed_dim, false,
                  static_cast<float>(1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(hidden, 1)))), frozen) {
  adopt(projection_);
}

Tensor ClipHead::forward(Ops& ops, const Tensor& pooled, ClipHeadCache& c) const {
  c.pooled = pooled;
  c.projected = projection_.forward(ops, pooled);
  Tensor embeddings;
  ops.l2_normalize_forward(c.projected, embeddings);
  return embeddings;
}

Tensor ClipHead::backward(Ops& ops, const Tensor& d_embeddings, const ClipHeadCache& c) const {
  Tensor d_projected;
  ops.l2_normalize_backward(c.projected, d_embeddings, d_projected);
  return projection_.backward(ops, c.pooled, d_projected);
}

ContrastiveLoss::ContrastiveLoss(ParameterStore& store, std::string name)
    : Module(std::move(name), false),
      logit_scale_(&param(store, "logit_scale", {1}, Init::constant(kInitialLogitScaleParam))) {}

float ContrastiveLoss::loss(Ops& ops, const Tensor& local_image, const Tensor& local_text, const Tensor& all_image,
                            const Tensor& all_text, int64_t offset, ContrastiveGrads* grads) const {
  const float value =
      ops.contrastive_loss(local_image, local_text, all_image, all_text, offset, logit_scale_param(ops), grads);
  if (grads) ops.add(logit_scale_->grad, ops.from_host(Tensor({1}, {grads->logit_scale_param})));
  return value;
}

float ContrastiveLoss::logit_scale_param(Ops& ops) const { return ops.to_host(logit_scale_->value).data[0]; }

void ContrastiveLoss::clamp_after_step(Ops& ops) const {
  Tensor t = ops.to_host(logit_scale_->value);
  const float before = t.data[0];
  clamp_logit_scale_param(t.data[0]);
  if (t.data[0] != before) logit_scale_->value = ops.from_host(t);
}

}  // namespace braid::nn
