// Ops on the host: OpenBLAS for the GEMMs (threaded by OpenBLAS itself), std::threads over
// independent rows or (batch, head) pairs elsewhere. Each output element is computed by one
// thread in a fixed order, so results are bit-identical for any thread count.
#pragma once

#include "core/nn/ops.hpp"

namespace braid::nn {

class HostOps final : public Ops {
 public:
  // threads <= 0: one per hardware thread.
  explicit HostOps(int threads = 0);
  int threads() const { return threads_; }
  std::string name() const override { return "host"; }

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
  int threads_;
};

}  // namespace braid::nn
