// The C ABI's contrastive loss on CUDA memory: the CUDA plugin's tiled op (device interface
// v2), loaded once per process, ordered on the caller's stream (wrapped, never owned). The
// views were checked by the caller (tensor.cpp): dense rows on one CUDA device.
#pragma once

#include <cstdint>

#include "core/nn/contrastive_tiled.hpp"

namespace braid::capi {

// The sum over the local rows of both directions' cross-entropies; stats written. Waits for
// the stream (the sum comes back to the host). Error(plugin) when libbraid-cuda.so cannot
// run (not found, no driver, no such device), Error(invalid_argument) for what it refuses.
double cuda_contrastive_forward(const nn::ContrastiveProblem& problem, const nn::ContrastiveStats& stats,
                                int32_t device, void* stream);
// The gradients of weight * that sum (views with null data are not computed); returns d / d scale.
double cuda_contrastive_backward(const nn::ContrastiveProblem& problem, const nn::ContrastiveStats& stats,
                                 double weight, const nn::ContrastiveGradViews& grads, int32_t device, void* stream);

}  // namespace braid::capi
