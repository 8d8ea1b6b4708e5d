// Softmax cross-entropy over logits with integer targets; -1 marks a row to ignore
// (padding, prompt tokens), as PyTorch's ignore_index.
#include <vector>

#include "core/common/error.hpp"
#include "core/nn/host_ops.hpp"
#include "core/nn/parallel.hpp"
#include "core/nn/softmax_row.hpp"

namespace braid::nn {

float HostOps::cross_entropy(const Tensor& logits, std::span<const int32_t> targets, int64_t normalizer,
                             Tensor* dlogits) {
  if (logits.rank() < 1 || logits.dim(-1) == 0)
    throw Error(Status::invalid_argument,
                "cross_entropy: logits must be (..., V) with V > 0, got " + shape_string(logits.shape));
  const int64_t classes = logits.dim(-1), rows = logits.numel() / classes;
  if (static_cast<int64_t>(targets.size()) != rows)
    throw Error(Status::invalid_argument, "cross_entropy: " + std::to_string(targets.size()) + " targets for " +
                                              std::to_string(rows) + " rows of logits " + shape_string(logits.shape));
  int64_t counted = 0;
  for (std::size_t r = 0; r < targets.size(); ++r) {
    if (targets[r] == -1) continue;
    if (targets[r] < 0 || targets[r] >= classes)
      throw Error(Status::invalid_argument, "cross_entropy: target " + std::to_string(targets[r]) + " of row " +
                                                std::to_string(r) + " is outside [0, " + std::to_string(classes) +
                                                ") and is not the ignore index -1");
    ++counted;
  }
  if (normalizer < 0) throw Error(Status::invalid_argument, "cross_entropy: negative normalizer");
  const int64_t divide_by = normalizer > 0 ? normalizer : counted;
  if (dlogits) reset(*dlogits, logits.shape);
  if (divide_by == 0) return 0.0f;  // every row ignored: no loss, no gradient (PyTorch gives NaN)
  const auto scale = static_cast<float>(1.0 / static_cast<double>(divide_by));
  std::vector<double> row_loss(static_cast<std::size_t>(rows), 0.0);
  parallel_for(threads_, rows, chunk_for(20.0 * classes), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int32_t t = targets[static_cast<std::size_t>(r)];
      if (t == -1) continue;
      row_loss[static_cast<std::size_t>(r)] = softmax_cross_entropy_row(
          logits.ptr() + r * classes, classes, t, scale, dlogits ? dlogits->ptr() + r * classes : nullptr);
    }
  });
  double sum = 0.0;  // rows in order, whatever thread computed them
  for (double l : row_loss) sum += l;
  return static_cast<float>(sum / static_cast<double>(divide_by));
}

}  // namespace braid::nn
