// The reference ops on a device backend: every nn::Ops method through the v2 plugin's op
// table on the backend's stream, with the ops' conventions (ops.hpp) kept. Tensors must be
// on the backend's device (DeviceBackend::upload); outputs are allocated there from its
// caching allocator, or reused when they already are its memory of the right size. Token ids
// and targets come as host spans, as in Ops, and are copied to the device per call.
#pragma once

#include <memory>

#include "core/nn/device_backend.hpp"
#include "core/nn/ops.hpp"

namespace braid::nn {

class DeviceOps final : public Ops {
 public:
  explicit DeviceOps(std::shared_ptr<DeviceBackend> backend);
  std::string name() const override { return backend_->name(); }
  DeviceBackend& backend() { return *backend_; }

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
  Tensor from_host(Tensor host) override;
  Tensor to_host(const Tensor& t) override;
  std::vector<Tensor> to_host_all(std::span<const Tensor> ts) override;
  void assign_from_host(Tensor& t, Tensor host) override;
  void zero(Tensor& t, const Shape& shape) override;

 private:
  // The op's table entry, or Error(unsupported) naming the backend and the op.
  const braid_device_ops_v2& ops_for(braid_device_op_v2 op, const char* name) const;
  // `t` on this backend's device, else Error(invalid_argument) naming the op and argument.
  void expect_here(const Tensor& t, const char* op, const char* what) const;
  // Makes `t` this device's memory of `shape` (reusing it when it already is, with as many
  // elements), leaving its contents to the op.
  void prepare(Tensor& t, const Shape& shape);
  void check(int rc, const char* op) const;

  std::shared_ptr<DeviceBackend> backend_;
  mutable char error_[1024] = "";  // the plugin's message of the last call (one DeviceOps per thread)
};

}  // namespace braid::nn
