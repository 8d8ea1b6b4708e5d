// An Ops that forwards every call to another and adds up the wall time per op name: the
// breakdown of a training step by op, for `train_bench --profile` (perf is not always there).
// On a device whose ops run asynchronously, `wait` (the stream's synchronize) ends each op's
// timing, so the time is the op's and not its launch's.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <utility>

#include "core/nn/ops.hpp"

namespace braid::bench {

class TimedOps final : public nn::Ops {
 public:
  explicit TimedOps(nn::Ops& inner, std::function<void()> wait = {}) : inner_(inner), wait_(std::move(wait)) {}
  std::string name() const override { return "timed " + inner_.name(); }
  // Seconds and calls per op since construction.
  const std::map<std::string, std::pair<double, long>>& totals() const { return totals_; }

  void linear_forward(const nn::Tensor& x, const nn::Tensor& w, const nn::Tensor* b, nn::Tensor& y) override {
    timed("linear_forward", [&] { inner_.linear_forward(x, w, b, y); });
  }
  void linear_backward(const nn::Tensor& x, const nn::Tensor& w, const nn::Tensor& dy, nn::Tensor* dx, nn::Tensor* dw,
                       nn::Tensor* db) override {
    timed("linear_backward", [&] { inner_.linear_backward(x, w, dy, dx, dw, db); });
  }
  void layernorm_forward(const nn::Tensor& x, const nn::Tensor& g, const nn::Tensor& b, float eps, nn::Tensor& y,
                         nn::LayerNormSaved& s) override {
    timed("layernorm_forward", [&] { inner_.layernorm_forward(x, g, b, eps, y, s); });
  }
  void layernorm_backward(const nn::Tensor& x, const nn::Tensor& g, const nn::LayerNormSaved& s, const nn::Tensor& dy,
                          nn::Tensor* dx, nn::Tensor* dg, nn::Tensor* db) override {
    timed("layernorm_backward", [&] { inner_.layernorm_backward(x, g, s, dy, dx, dg, db); });
  }
  void l2_normalize_forward(const nn::Tensor& x, nn::Tensor& y) override {
    timed("l2_normalize", [&] { inner_.l2_normalize_forward(x, y); });
  }
  void l2_normalize_backward(const nn::Tensor& x, const nn::Tensor& dy, nn::Tensor& dx) override {
    timed("l2_normalize", [&] { inner_.l2_normalize_backward(x, dy, dx); });
  }
  void add(nn::Tensor& y, const nn::Tensor& x) override {
    timed("add", [&] { inner_.add(y, x); });
  }
  void gelu_forward(const nn::Tensor& x, nn::Tensor& y) override {
    timed("gelu_forward", [&] { inner_.gelu_forward(x, y); });
  }
  void gelu_backward(const nn::Tensor& x, const nn::Tensor& dy, nn::Tensor& dx) override {
    timed("gelu_backward", [&] { inner_.gelu_backward(x, dy, dx); });
  }
  void attention_forward(const nn::Tensor& q, const nn::Tensor& k, const nn::Tensor& v, const nn::AttentionOptions& o,
                         nn::Tensor& out, nn::AttentionSaved& s) override {
    timed("attention_forward", [&] { inner_.attention_forward(q, k, v, o, out, s); });
  }
  void attention_backward(const nn::Tensor& q, const nn::Tensor& k, const nn::Tensor& v, const nn::AttentionOptions& o,
                          const nn::AttentionSaved& s, const nn::Tensor& dout, nn::Tensor& dq, nn::Tensor& dk,
                          nn::Tensor& dv) override {
    timed("attention_backward", [&] { inner_.attention_backward(q, k, v, o, s, dout, dq, dk, dv); });
  }
  void embedding_forward(const nn::Tensor& table, std::span<const int32_t> ids, nn::Tensor& out) override {
    timed("embedding (row gather)", [&] { inner_.embedding_forward(table, ids, out); });
  }
  void embedding_backward(std::span<const int32_t> ids, const nn::Tensor& dout, nn::Tensor& dtable) override {
    timed("embedding (row scatter-add)", [&] { inner_.embedding_backward(ids, dout, dtable); });
  }
  void patch_embedding_forward(const nn::Tensor& image, int64_t patch, const nn::Tensor& w, const nn::Tensor* b,
                               nn::Tensor& out) override {
    timed("patch_embedding_forward", [&] { inner_.patch_embedding_forward(image, patch, w, b, out); });
  }
  void patch_embedding_backward(const nn::Tensor& image, int64_t patch, const nn::Tensor& w, const nn::Tensor& dout,
                                nn::Tensor* dimage, nn::Tensor* dw, nn::Tensor* db) override {
    timed("patch_embedding_backward", [&] { inner_.patch_embedding_backward(image, patch, w, dout, dimage, dw, db); });
  }
  float cross_entropy(const nn::Tensor& logits, std::span<const int32_t> targets, int64_t normalizer,
                      nn::Tensor* dlogits) override {
    float r = 0.0f;
    timed("cross_entropy", [&] { r = inner_.cross_entropy(logits, targets, normalizer, dlogits); });
    return r;
  }
  float contrastive_loss(const nn::Tensor& li, const nn::Tensor& lt, const nn::Tensor& ai, const nn::Tensor& at,
                         int64_t offset, float t, nn::ContrastiveGrads* grads) override {
    float r = 0.0f;
    timed("contrastive_loss", [&] { r = inner_.contrastive_loss(li, lt, ai, at, offset, t, grads); });
    return r;
  }
  void adamw_step(nn::Tensor& p, const nn::Tensor& g, nn::AdamWState& s, const nn::AdamWConfig& c) override {
    timed("adamw_step", [&] { inner_.adamw_step(p, g, s, c); });
  }
  double squared_norm(const nn::Tensor& t) override {
    double r = 0.0;
    timed("squared_norm", [&] { r = inner_.squared_norm(t); });
    return r;
  }
  void scale(nn::Tensor& t, float factor) override {
    timed("scale", [&] { inner_.scale(t, factor); });
  }
  nn::Tensor from_host(nn::Tensor host) override {
    nn::Tensor r;
    timed("copy to device", [&] { r = inner_.from_host(std::move(host)); });
    return r;
  }
  nn::Tensor to_host(const nn::Tensor& t) override {
    nn::Tensor r;
    timed("copy to host", [&] { r = inner_.to_host(t); });
    return r;
  }
  void zero(nn::Tensor& t, const nn::Shape& shape) override {
    timed("zero", [&] { inner_.zero(t, shape); });
  }

 private:
  template <typename F>
  void timed(const char* op, F&& call) {
    const auto t0 = std::chrono::steady_clock::now();
    call();
    if (wait_) wait_();
    auto& [seconds, calls] = totals_[op];
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++calls;
  }

  nn::Ops& inner_;
  std::function<void()> wait_;
  std::map<std::string, std::pair<double, long>> totals_;
};

}  // namespace braid::bench
