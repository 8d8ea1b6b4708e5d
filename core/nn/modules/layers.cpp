#include "core/nn/modules/layers.hpp"

#include <cstdint>
#include <string>
#include <utility>

#include "core/common/error.hpp"

namespace braid::nn {

Linear::Linear(ParameterStore& store, std::string name, int64_t in, int64_t out, bool bias, float init_std, bool frozen)
    : Module(std::move(name), frozen) {
  weight_ = &param(store, "weight", {out, in}, Init::normal(init_std));
  if (bias) bias_ = &param(store, "bias", {out}, Init::constant(0.0f));
}

Tensor Linear::forward(Ops& ops, const Tensor& x) const {
  Tensor y;
  ops.linear_forward(x, weight_->value, bias_ ? &bias_->value : nullptr, y);
  return y;
}

Tensor Linear::backward(Ops& ops, const Tensor& x, const Tensor& dy, bool want_dx) const {
  Tensor dx;
  ops.linear_backward(x, weight_->value, dy, want_dx ? &dx : nullptr, weight_->grad_or_null(),
                      bias_ ? bias_->grad_or_null() : nullptr);
  return dx;
}

LayerNorm::LayerNorm(ParameterStore& store, std::string name, int64_t features, bool frozen)
    : Module(std::move(name), frozen) {
  gamma_ = &param(store, "weight", {features}, Init::constant(1.0f));
  beta_ = &param(store, "bias", {features}, Init::constant(0.0f));
}

Tensor LayerNorm::forward(Ops& ops, const Tensor& x, LayerNormSaved& saved) const {
  Tensor y;
  ops.layernorm_forward(x, gamma_->value, beta_->value, kLayerNormEps, y, saved);
  return y;
}

Tensor LayerNorm::backward(Ops& ops, const Tensor& x, const LayerNormSaved& saved, const Tensor& dy) const {
  Tensor dx;
  ops.layernorm_backward(x, gamma_->value, saved, dy, &dx, gamma_->grad_or_null(), beta_->grad_or_null());
  return dx;
}

Tensor gather_rows(Ops& ops, const Tensor& table, std::span<const int32_t> rows) {
  Tensor out;
  ops.embedding_forward(table, rows, out);
  return out;
}

Tensor zeros(Ops& ops, const Shape& shape) {
  Tensor t;
  ops.zero(t, shape);
  return t;
}

void scatter_add_rows(Ops& ops, std::span<const int32_t> rows, const Tensor& src, Tensor& dst) {
  ops.embedding_backward(rows, src, dst);
}

void Tokens::check(const std::string& who) const {
  if (batch < 0 || length < 1 || static_cast<int64_t>(ids.size()) != batch * length ||
      static_cast<int64_t>(lengths.size()) != batch)
    throw Error(Status::invalid_argument,
                who + ": tokens of batch " + std::to_string(batch) + " and length " + std::to_string(length) +
                    " need batch x length ids and batch lengths, got " + std::to_string(ids.size()) + " ids and " +
                    std::to_string(lengths.size()) + " lengths");
  for (std::size_t b = 0; b < lengths.size(); ++b)
    if (lengths[b] < 1 || lengths[b] > length)
      throw Error(Status::invalid_argument, who + ": sample " + std::to_string(b) + " has " +
                                                std::to_string(lengths[b]) + " tokens, outside [1, " +
                                                std::to_string(length) + "]");
}

int32_t row_id(int64_t row) {
  if (row < 0 || row > INT32_MAX)
    throw Error(Status::invalid_argument, "row index " + std::to_string(row) + " does not fit the 32-bit row ids");
  return static_cast<int32_t>(row);
}

Tensor reshaped(const Tensor& t, const Shape& shape) { return reshaped(Tensor(t), shape); }

Tensor reshaped(Tensor&& t, const Shape& shape) {
  t.reshape(shape);
  return std::move(t);
}

Tensor reshaped_view(const Tensor& t, const Shape& shape) { return reshaped(Tensor(t.shape, t.data.view()), shape); }

}  // namespace braid::nn
