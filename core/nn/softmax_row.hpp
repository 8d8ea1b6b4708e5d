// Softmax cross-entropy of one row of logits, for the token loss (the contrastive loss has
// its own vectorised passes in host_contrastive.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace braid::nn {

// Returns -log softmax(logits)[target] (in double) and, when grad is not null, writes
// (softmax(logits) - onehot(target)) * scale into grad (which may alias nothing else).
inline double softmax_cross_entropy_row(const float* logits, int64_t n, int64_t target, float scale, float* grad) {
  const float top = *std::max_element(logits, logits + n);
  double sum = 0.0;
  for (int64_t j = 0; j < n; ++j) sum += std::exp(static_cast<double>(logits[j] - top));
  const double log_sum = std::log(sum);
  if (grad) {
    for (int64_t j = 0; j < n; ++j)
      grad[j] = static_cast<float>(std::exp(static_cast<double>(logits[j] - top) - log_sum)) * scale;
    grad[target] -= scale;
  }
  return log_sum - static_cast<double>(logits[target] - top);
}

}  // namespace braid::nn
