// Optimizer helpers built on Ops: global-norm gradient clipping and open_clip's cap on
// the contrastive logit scale.
#pragma once

#include <span>

#include "core/nn/ops.hpp"

namespace braid::nn {

// ln(100): the logit scale exp(t) never exceeds 100 (open_clip).
inline constexpr double kMaxLogitScaleParam = 4.605170185988092;

// The factor torch.nn.utils.clip_grad_norm_ applies: min(1, max_norm / (total_norm + 1e-6)),
// NaN for a NaN norm (the gradients then turn NaN, as torch's do, and the loss says so).
float clip_coefficient(double total_norm, float max_norm);
// Whether the gradients are scaled by `coefficient`: below 1, or NaN.
inline bool clip_applies(float coefficient) { return !(coefficient >= 1.0f); }

// Scales every gradient so their joint L2 norm is at most max_norm; returns the norm before
// clipping. Over several ranks, sum Ops::squared_norm everywhere (all-reduce), then use
// clip_coefficient and Ops::scale instead.
double clip_grad_norm(Ops& ops, std::span<Tensor* const> grads, float max_norm);

// After each optimizer step, as open_clip: t = clamp(t, 0, ln 100).
void clamp_logit_scale_param(float& t);
// Whether the loss caps t (exp(t) taken as 100, no gradient): above what clamp_logit_scale_param
// leaves, the float nearest ln 100, which is itself a little above ln 100 and still trains (it
// was taken as capped, and t never came down from the cap).
inline bool logit_scale_capped(float t) { return t > static_cast<float>(kMaxLogitScaleParam); }

}  // namespace braid::nn
