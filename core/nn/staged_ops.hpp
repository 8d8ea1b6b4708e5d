// The reference ops on a device for callers whose tensors live in host memory (the trainer
// today): every call copies its inputs to the device, runs the device op (DeviceOps) and
// copies its outputs back, parameter gradients included (uploaded, added to on the device,
// downloaded). Correct, with the device's numerics, and bound by the copies: it runs whole
// models on a GPU before the trainer keeps its tensors there, not fast.
#pragma once

#include <memory>

#include "core/nn/device_ops.hpp"

namespace braid::nn {

class StagedOps final : public Ops {
 public:
  explicit StagedOps(std::shared_ptr<DeviceBackend> backend);
  std::string name() const override { return device_.name() + " (staged)"; }
  DeviceBackend& backend() { return device_.backend(); }

  void linear_forward(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& y) override;
  void linear_backward(const Tensor& x, const Tensor& weight, const Tensor& dy, Tensor* dx, Tensor* dweight,
                       Tensor* dbias) override;
  void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                         LayerNormSaved& saved) override;
  void layernorm_backward(const Tensor& x, const Tensor& gamma, const LayerNormSaved& saved, const Tensor& dy,
                          Tensor* dx, Tensor* dgamma, Tensor* dbeta) override;
  void l2_normalize_forward(const Tensor& x, Tensor& y) override;
  void l2_normalize_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override;
  void add(Tensor& y, const Tensor& x) override;
  void gelu_forward(const Tensor& x, Tensor& y) override;
  void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override;
  void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                         Tensor& out, AttentionSaved& saved) override;
  void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                          const AttentionSaved& saved, const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv) override;
  void embedding_forward(const Tensor& table, std::span<const int32_t> ids, Tensor& out) override;
  void embedding_backward(std::span<const int32_t> ids, const Tensor& dout, Tensor& dtable) override;
  void patch_embedding_forward(const Tensor& image, int64_t patch, const Tensor& weight, const Tensor* bias,
                               Tensor& out) override;
  void patch_embedding_backward(const Tensor& image, int64_t patch, const Tensor& weight, const Tensor& dout,
                                Tensor* dimage, Tensor* dweight, Tensor* dbias) override;
  float cross_entropy(const Tensor& logits, std::span<const int32_t> targets, int64_t normalizer,
                      Tensor* dlogits) override;
  float contrastive_loss(const Tensor& local_image, const Tensor& local_text, const Tensor& all_image,
                         const Tensor& all_text, int64_t offset, float logit_scale_param,
                         ContrastiveGrads* grads) override;
  void adamw_step(Tensor& param, const Tensor& grad, AdamWState& state, const AdamWConfig& config) override;
  double squared_norm(const Tensor& t) override;
  void scale(Tensor& t, float factor) override;

 private:
  Tensor up(const Tensor& host) const;
  // The device result into the host tensor (its shape and elements); host tensors stay
  // host tensors, whatever they held before.
  void down(const Tensor& device, Tensor& host) const;

  DeviceOps device_;
  std::shared_ptr<DeviceBackend> backend_;
};

}  // namespace braid::nn
