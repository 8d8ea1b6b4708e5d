// The small parts the reference modules are built from: a linear layer, a layer norm, and
// row moves (gather, scatter-add) expressed with the Ops interface only, so a device
// implementation of Ops runs the modules unchanged.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/nn/modules/parameter.hpp"
#include "core/nn/ops.hpp"

namespace braid::nn {

// Shapes a module derives from the model file.
struct TransformerShape {
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t ffn = 0;
  int64_t layers = 0;
  bool causal = false;
};

// A batch of token sequences padded to one length: ids[b * length + t]; sample b's tokens
// are positions [0, lengths[b]), the rest is padding (any id inside the vocabulary).
struct Tokens {
  int64_t batch = 0, length = 0;
  std::vector<int32_t> ids;
  std::vector<int32_t> lengths;

  // Throws Error(invalid_argument) naming `who` unless the sizes agree and every length is
  // in [1, length].
  void check(const std::string& who) const;
};

// What a sequence encoder hands on: every position's final hidden state, and one pooled
// vector per sample.
struct EncoderOutput {
  Tensor tokens;  // (B, S, hidden)
  Tensor pooled;  // (B, hidden)
};

inline constexpr float kInitStd = 0.02f;  // GPT-2 / CLIP: weights ~ normal(0, 0.02)
inline constexpr float kLayerNormEps = 1e-5f;

// y = x W^T + b; weight (out, in) ~ normal(0, init_std), bias (out) zero.
class Linear : public Module {
 public:
  Linear(ParameterStore& store, std::string name, int64_t in, int64_t out, bool bias, float init_std, bool frozen);
  int64_t in() const { return weight_->full_shape[1]; }  // of the whole weight, sliced or not
  int64_t out() const { return weight_->full_shape[0]; }
  const Parameter& weight() const { return *weight_; }
  // The parameters themselves, for the tensor-parallel forms (tensor_parallel_group.hpp); the
  // bias is null without one.
  Parameter* weight_param() const { return weight_; }
  Parameter* bias_param() const { return bias_; }

  // x (..., in) -> (..., out).
  Tensor forward(Ops& ops, const Tensor& x) const;
  // Adds the weight and bias gradients; returns dx (x's shape) when `want_dx`, else empty.
  Tensor backward(Ops& ops, const Tensor& x, const Tensor& dy, bool want_dx = true) const;

 private:
  Parameter* weight_;
  Parameter* bias_ = nullptr;
};

// Layer norm over the last axis, gamma one and beta zero at the start.
class LayerNorm : public Module {
 public:
  LayerNorm(ParameterStore& store, std::string name, int64_t features, bool frozen);
  Tensor forward(Ops& ops, const Tensor& x, LayerNormSaved& saved) const;
  Tensor backward(Ops& ops, const Tensor& x, const LayerNormSaved& saved, const Tensor& dy) const;
  Parameter* gamma_param() const { return gamma_; }
  Parameter* beta_param() const { return beta_; }

 private:
  Parameter* gamma_;
  Parameter* beta_;
};

// out (n, E) = rows `rows` of `table` (R, E): Ops::embedding_forward is exactly a row gather.
Tensor gather_rows(Ops& ops, const Tensor& table, std::span<const int32_t> rows);
// A zero tensor where `ops` keeps its tensors (what scatter_add_rows adds into).
Tensor zeros(Ops& ops, const Shape& shape);
// Adds the n rows of `src` (n*E elements, any shape) into rows `rows` of `dst` (R, E): the
// embedding backward, a scatter-add. With distinct rows into a zero `dst`, a scatter.
void scatter_add_rows(Ops& ops, std::span<const int32_t> rows, const Tensor& src, Tensor& dst);

// A row index for the two functions above; throws Error(invalid_argument) past int32.
int32_t row_id(int64_t row);

// The same tensor under another shape: a copy, or the tensor itself when the caller hands
// it over (a temporary: on a device, a copy is a launch and an allocation).
Tensor reshaped(const Tensor& t, const Shape& shape);
Tensor reshaped(Tensor&& t, const Shape& shape);
// A view of t's elements under another shape, valid while t keeps them.
Tensor reshaped_view(const Tensor& t, const Shape& shape);

}  // namespace braid::nn
