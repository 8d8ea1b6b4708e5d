// Optimizer helpers built on Ops: global-norm gradient clipping and open_clip's cap on
// the contrastive logit scale.
#pragma once

#include <span>

#include "core/nn/ops.hpp"

namespace braid::nn {

// ln(100): the logit scale exp(t) never exceeds 100 (open_clip).
inline constexpr double kMaxLogitScaleParam = 4.605170185988092;

// The factor torch.nn.utils.clip_grad_norm_ applies: min(1, max_norm / (total_norm + 1e-6)).
float clip_coefficient(double total_norm, float max_norm);

// Scales every gradient so their joint L2 norm is at most max_norm; returns the norm before
// clipping. Over several ranks, sum Ops::squared_norm everywhere (all-reduce), then use
// clip_coefficient and Ops::scale instead.
double clip_grad_norm(Ops& ops, std::span<Tensor* const> grads, float max_norm);

// After each optimizer step, as open_clip: t = clamp(t, 0, ln 100).
void clamp_logit_scale_param(float& t);

}  // namespace braid::nn
