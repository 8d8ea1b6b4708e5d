// An Ops that forwards every call to another and adds up the wall time of each op by the
// sizes it ran on: the breakdown of a training step by op (`braid train --profile-ops`,
// `train_bench --profile`; perf is not always there), which the cost model can price call
// by call. On a device whose ops run asynchronously, `wait` (the stream's synchronize) ends
// each op's timing, so the time is the op's and not its launch's.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/nn/ops.hpp"

namespace braid::nn {

// One kind of call: the op and the sizes it ran on. `dims` per op:
//   linear_forward              rows, out features, in features
//   linear_backward             the same, then 1 for dx + 2 for dweight (what it computed)
//   attention_forward/backward  batch x heads, query length, key length, head size, 1 if causal
//   patch_embedding_*           patches, out features, features of a patch, 1 for dweight
//   embedding_*                 rows, width
//   cross_entropy               rows, vocabulary, 1 with the gradient
//   contrastive_loss            local rows, all rows, embedding width, 1 with gradients
//   every other op              elements
struct OpCall {
  std::string_view op;  // a name with static storage
  std::array<int64_t, 5> dims{};
  bool operator<(const OpCall& o) const { return op != o.op ? op < o.op : dims < o.dims; }
};

// Every op name TimedOps records, for code that lays them out alike on every rank.
inline constexpr std::array<std::string_view, 23> kTimedOps = {"linear_forward",
                                                               "linear_backward",
                                                               "layernorm_forward",
                                                               "layernorm_backward",
                                                               "gelu_forward",
                                                               "gelu_backward",
                                                               "add",
                                                               "attention_forward",
                                                               "attention_backward",
                                                               "embedding_forward",
                                                               "embedding_backward",
                                                               "patch_embedding_forward",
                                                               "patch_embedding_backward",
                                                               "cross_entropy",
                                                               "contrastive_loss",
                                                               "l2_normalize_forward",
                                                               "l2_normalize_backward",
                                                               "adamw_step",
                                                               "squared_norm",
                                                               "scale",
                                                               "zero",
                                                               "copy to device",
                                                               "copy to host"};

struct OpTimes {
  double seconds = 0;
  long calls = 0;
};

class TimedOps final : public Ops {
 public:
  explicit TimedOps(Ops& inner, std::function<void()> wait = {}) : inner_(inner), wait_(std::move(wait)) {}
  std::string name() const override { return "timed " + inner_.name(); }
  // Seconds and calls since construction, by call, and summed by op. While `recording` is
  // off, calls go through untimed.
  const std::map<OpCall, OpTimes>& calls() const { return calls_; }
  std::map<std::string, OpTimes> by_op() const;
  void set_recording(bool on) { recording_ = on; }

  void linear_forward(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) override;
  void linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor* dw, Tensor* db) override;
  void layernorm_forward(const Tensor& x, const Tensor& g, const Tensor& b, float eps, Tensor& y,
                         LayerNormSaved& s) override;
  void layernorm_backward(const Tensor& x, const Tensor& g, const LayerNormSaved& s, const Tensor& dy, Tensor* dx,
                          Tensor* dg, Tensor* db) override;
  void l2_normalize_forward(const Tensor& x, Tensor& y) override;
  void l2_normalize_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override;
  void add(Tensor& y, const Tensor& x) override;
  void gelu_forward(const Tensor& x, Tensor& y) override;
  void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override;
  void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o, Tensor& out,
                         AttentionSaved& s) override;
  void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o,
                          const AttentionSaved& s, const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv) override;
  void embedding_forward(const Tensor& table, std::span<const int32_t> ids, Tensor& out) override;
  void embedding_backward(std::span<const int32_t> ids, const Tensor& dout, Tensor& dtable) override;
  void patch_embedding_forward(const Tensor& image, int64_t patch, const Tensor& w, const Tensor* b,
                               Tensor& out) override;
  void patch_embedding_backward(const Tensor& image, int64_t patch, const Tensor& w, const Tensor& dout, Tensor* dimage,
                                Tensor* dw, Tensor* db) override;
  float cross_entropy(const Tensor& logits, std::span<const int32_t> targets, int64_t normalizer,
                      Tensor* dlogits) override;
  float contrastive_loss(const Tensor& li, const Tensor& lt, const Tensor& ai, const Tensor& at, int64_t offset,
                         float t, ContrastiveGrads* grads) override;
  void adamw_step(Tensor& p, const Tensor& g, AdamWState& s, const AdamWConfig& c) override;
  double squared_norm(const Tensor& t) override;
  void scale(Tensor& t, float factor) override;
  Tensor from_host(Tensor host) override;
  Tensor to_host(const Tensor& t) override;
  std::vector<Tensor> to_host_all(std::span<const Tensor> ts) override;
  void assign_from_host(Tensor& t, Tensor host) override;
  void zero(Tensor& t, const Shape& shape) override;

 private:
  template <typename F>
  void timed(const OpCall& call, F&& run);

  Ops& inner_;
  std::function<void()> wait_;
  std::map<OpCall, OpTimes> calls_;
  bool recording_ = true;
};

}  // namespace braid::nn
