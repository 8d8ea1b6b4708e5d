// The reference ops, each with its forward and backward, behind one interface so a
// device implementation (CUDA) can replace the host one under the same modules.
//
// Conventions for every op:
// - float32, row-major; "(..., F)" is any leading shape with F features last.
// - Outputs and input gradients are overwritten (given their shape).
// - Parameter gradients (dweight, dbias, dgamma, dbeta, dtable) are added (+=) to tensors
//   that already have the parameter's shape, so microbatches and tied weights sum up.
// - A null gradient pointer skips that gradient (frozen weights, inputs that need none).
// - Backward takes the forward's inputs again plus what the forward saved; no tape.
// - Results do not depend on the number of threads.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/nn/tensor.hpp"

namespace braid::nn {

// Per row of a layer norm: what backward needs besides the input.
struct LayerNormSaved {
  Tensor mean;  // (rows)
  Tensor rstd;  // (rows): 1 / sqrt(var + eps)
};

struct AttentionOptions {
  int64_t heads = 1;
  bool causal = false;  // query i sees keys 0..i (needs equal query and key lengths)
};

struct AttentionSaved {
  Tensor probs;  // (B, H, Sq, Sk): the softmax of the scaled scores
};

// Gradients of the distributed contrastive loss (all overwritten). The caller adds
// `all_image`/`all_text` rows back to the ranks that own them (a reduce-scatter of sums),
// then adds its own rows to `local_image`/`local_text`. Only that sum is defined: with one
// rank (n = N) an implementation may put the whole gradient in local_* and zeros in all_*.
struct ContrastiveGrads {
  Tensor local_image;              // (n, E)
  Tensor local_text;               // (n, E)
  Tensor all_image;                // (N, E)
  Tensor all_text;                 // (N, E)
  float logit_scale_param = 0.0f;  // d loss / d t, summed over ranks by the caller
};

// Hyperparameters in double, as PyTorch takes them: 1 - beta2 in float would be 1e-5 off.
struct AdamWConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // decoupled: p -= lr * weight_decay * p, before the Adam step
};

// Per parameter; empty moments are created (zero) on the first step.
struct AdamWState {
  Tensor m;
  Tensor v;
  int64_t step = 0;  // steps taken, for the bias correction
};

class Ops {
 public:
  virtual ~Ops() = default;
  virtual std::string name() const = 0;

  // y = x W^T + b. x (..., in), weight (out, in), bias (out) or null; y (..., out).
  virtual void linear_forward(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& y) = 0;
  virtual void linear_backward(const Tensor& x, const Tensor& weight, const Tensor& dy, Tensor* dx, Tensor* dweight,
                               Tensor* dbias) = 0;

  // Over the last axis: y = (x - mean) / sqrt(var + eps) * gamma + beta, biased variance.
  // x (..., F), gamma and beta (F).
  virtual void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                                 LayerNormSaved& saved) = 0;
  virtual void layernorm_backward(const Tensor& x, const Tensor& gamma, const LayerNormSaved& saved, const Tensor& dy,
                                  Tensor* dx, Tensor* dgamma, Tensor* dbeta) = 0;

  // Over the last axis: y = x / max(|x|, 1e-12), as torch.nn.functional.normalize.
  virtual void l2_normalize_forward(const Tensor& x, Tensor& y) = 0;
  virtual void l2_normalize_backward(const Tensor& x, const Tensor& dy, Tensor& dx) = 0;

  // y += x, element-wise, same shapes: residual connections, and gradients that flow into
  // one tensor along several paths.
  virtual void add(Tensor& y, const Tensor& x) = 0;

  // GELU, tanh approximation (GPT-2; PyTorch approximate="tanh"):
  // y = x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))).
  virtual void gelu_forward(const Tensor& x, Tensor& y) = 0;
  virtual void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) = 0;

  // Multi-head softmax attention, scores scaled by 1/sqrt(D): q (B, Sq, H*D),
  // k and v (B, Sk, H*D), out (B, Sq, H*D); head h is features [h*D, (h+1)*D).
  virtual void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                                 Tensor& out, AttentionSaved& saved) = 0;
  virtual void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                                  const AttentionSaved& saved, const Tensor& dout, Tensor& dq, Tensor& dk,
                                  Tensor& dv) = 0;

  // out[i] = table[ids[i]]: table (V, E), out (n, E). Backward adds dout rows into dtable
  // (dout may have any shape of n*E elements, e.g. (B, S, E)).
  virtual void embedding_forward(const Tensor& table, std::span<const int32_t> ids, Tensor& out) = 0;
  virtual void embedding_backward(std::span<const int32_t> ids, const Tensor& dout, Tensor& dtable) = 0;

  // Image (C, H, W) or (B, C, H, W) cut into P x P patches, row-major over the patch grid,
  // each flattened as (c, i, j) and projected: weight (E, C*P*P) — a Conv2d(C, E, P, stride P)
  // weight flattened — and bias (E) or null. out (N, E) or (B, N, E), N = (H/P) * (W/P): the
  // number of patches follows the image, so every resolution that P divides works.
  virtual void patch_embedding_forward(const Tensor& image, int64_t patch, const Tensor& weight, const Tensor* bias,
                                       Tensor& out) = 0;
  virtual void patch_embedding_backward(const Tensor& image, int64_t patch, const Tensor& weight, const Tensor& dout,
                                        Tensor* dimage, Tensor* dweight, Tensor* dbias) = 0;

  // Softmax cross-entropy of logits (..., V) against one target per row (-1: ignored).
  // Returns sum over counted rows / normalizer, where normalizer 0 means the number of
  // counted rows here (the mean; 0 when every row is ignored). Pass the count over all
  // microbatches or ranks to get their mean by summing the pieces. Writes the gradient of
  // the returned value into dlogits unless it is null.
  virtual float cross_entropy(const Tensor& logits, std::span<const int32_t> targets, int64_t normalizer,
                              Tensor* dlogits) = 0;

  // CLIP's symmetric InfoNCE loss in its distributed local-loss form (see host_contrastive.cpp).
  // local_* (n, E): this rank's L2-normalised embeddings; all_* (N, E): every rank's, in
  // order, this rank's at rows [offset, offset + n). Logit scale = exp(min(t, ln 100)).
  // Returns this rank's share of the global loss: the shares of all ranks sum to it, and
  // with one rank (local = all, offset 0) it is the ordinary CLIP loss.
  virtual float contrastive_loss(const Tensor& local_image, const Tensor& local_text, const Tensor& all_image,
                                 const Tensor& all_text, int64_t offset, float logit_scale_param,
                                 ContrastiveGrads* grads) = 0;

  // One AdamW step (PyTorch's torch.optim.AdamW formula, bias-corrected) of param with grad.
  virtual void adamw_step(Tensor& param, const Tensor& grad, AdamWState& state, const AdamWConfig& config) = 0;
  // Sum of squares (double), for the global gradient norm; and t *= factor.
  virtual double squared_norm(const Tensor& t) = 0;
  virtual void scale(Tensor& t, float factor) = 0;

  // Where this Ops keeps its tensors, for code that runs on any Ops: copies from and to host
  // memory, and zero-filled tensors. The host ops keep them in host memory, so a copy is a
  // plain copy; a device's Ops copies through its backend.
  virtual Tensor from_host(Tensor host) { return host; }  // moved in where it stays host memory
  virtual Tensor to_host(const Tensor& t) { return t; }
  // Each of `ts` on the host, in order: a device waits once for them all, not once each.
  virtual std::vector<Tensor> to_host_all(std::span<const Tensor> ts) {
    std::vector<Tensor> out;
    for (const Tensor& t : ts) out.push_back(to_host(t));
    return out;
  }
  // `host`'s elements into `t`, in its memory where it holds as many (a slice of a larger
  // buffer stays one: flat_parameters.hpp), else as a new tensor.
  virtual void assign_from_host(Tensor& t, Tensor host) { t = from_host(std::move(host)); }
  virtual void zero(Tensor& t, const Shape& shape) { reset(t, shape); }
};

// `t` itself when it is host memory; else its copy on the host (through `ops`), kept in
// `scratch`: for code that reads elements on the host whichever Ops keeps `t`.
inline const Tensor& on_host(Ops& ops, const Tensor& t, Tensor& scratch) {
  if (t.device().is_host()) return t;
  scratch = ops.to_host(t);
  return scratch;
}

}  // namespace braid::nn
