#include "core/nn/timed_ops.hpp"

#include <chrono>

namespace braid::nn {

namespace {

int64_t last_dim(const Tensor& t) { return t.shape.empty() ? 1 : t.shape.back(); }
int64_t rows_of(const Tensor& t) {
  const int64_t width = last_dim(t);
  return width > 0 ? t.numel() / width : 0;
}
OpCall elements(std::string_view op, const Tensor& t) { return {op, {t.numel()}}; }
OpCall linear(std::string_view op, const Tensor& x, const Tensor& w, int64_t which = 0) {
  return {op, {rows_of(x), w.shape.empty() ? 0 : w.shape.front(), last_dim(w), which}};
}
OpCall attention(std::string_view op, const Tensor& q, const Tensor& k, const AttentionOptions& o) {
  const int64_t batch = q.shape.empty() ? 0 : q.shape.front();
  const int64_t heads = o.heads > 0 ? o.heads : 1;
  return {op,
          {batch * heads, q.shape.size() > 1 ? q.shape[1] : 0, k.shape.size() > 1 ? k.shape[1] : 0, last_dim(q) / heads,
           o.causal ? 1 : 0}};
}
OpCall patches(std::string_view op, const Tensor& image, const Tensor& w, int64_t with_dw) {
  const int64_t per_patch = last_dim(w);  // C * P * P: every pixel is in one patch
  return {op,
          {per_patch > 0 ? image.numel() / per_patch : 0, w.shape.empty() ? 0 : w.shape.front(), per_patch, with_dw}};
}

}  // namespace

std::map<std::string, OpTimes> TimedOps::by_op() const {
  std::map<std::string, OpTimes> out;
  for (const auto& [call, t] : calls_) {
    OpTimes& sum = out[std::string(call.op)];
    sum.seconds += t.seconds;
    sum.calls += t.calls;
  }
  return out;
}

template <typename F>
void TimedOps::timed(const OpCall& call, F&& run) {
  if (!recording_) return run();
  const auto t0 = std::chrono::steady_clock::now();
  run();
  if (wait_) wait_();
  OpTimes& t = calls_[call];
  t.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++t.calls;
}

void TimedOps::linear_forward(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) {
  timed(linear("linear_forward", x, w), [&] { inner_.linear_forward(x, w, b, y); });
}
void TimedOps::linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor* dw, Tensor* db) {
  timed(linear("linear_backward", x, w, (dx ? 1 : 0) + (dw ? 2 : 0)),
        [&] { inner_.linear_backward(x, w, dy, dx, dw, db); });
}
void TimedOps::layernorm_forward(const Tensor& x, const Tensor& g, const Tensor& b, float eps, Tensor& y,
                                 LayerNormSaved& s) {
  timed(elements("layernorm_forward", x), [&] { inner_.layernorm_forward(x, g, b, eps, y, s); });
}
void TimedOps::layernorm_backward(const Tensor& x, const Tensor& g, const LayerNormSaved& s, const Tensor& dy,
                                  Tensor* dx, Tensor* dg, Tensor* db) {
  timed(elements("layernorm_backward", x), [&] { inner_.layernorm_backward(x, g, s, dy, dx, dg, db); });
}
void TimedOps::l2_normalize_forward(const Tensor& x, Tensor& y) {
  timed(elements("l2_normalize_forward", x), [&] { inner_.l2_normalize_forward(x, y); });
}
void TimedOps::l2_normalize_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  timed(elements("l2_normalize_backward", x), [&] { inner_.l2_normalize_backward(x, dy, dx); });
}
void TimedOps::add(Tensor& y, const Tensor& x) {
  timed(elements("add", x), [&] { inner_.add(y, x); });
}
void TimedOps::gelu_forward(const Tensor& x, Tensor& y) {
  timed(elements("gelu_forward", x), [&] { inner_.gelu_forward(x, y); });
}
void TimedOps::gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  timed(elements("gelu_backward", x), [&] { inner_.gelu_backward(x, dy, dx); });
}
void TimedOps::attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o,
                                 Tensor& out, AttentionSaved& s) {
  timed(attention("attention_forward", q, k, o), [&] { inner_.attention_forward(q, k, v, o, out, s); });
}
void TimedOps::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o,
                                  const AttentionSaved& s, const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv) {
  timed(attention("attention_backward", q, k, o), [&] { inner_.attention_backward(q, k, v, o, s, dout, dq, dk, dv); });
}
void TimedOps::embedding_forward(const Tensor& table, std::span<const int32_t> ids, Tensor& out) {
  timed({"embedding_forward", {static_cast<int64_t>(ids.size()), last_dim(table)}},
        [&] { inner_.embedding_forward(table, ids, out); });
}
void TimedOps::embedding_backward(std::span<const int32_t> ids, const Tensor& dout, Tensor& dtable) {
  timed({"embedding_backward", {static_cast<int64_t>(ids.size()), last_dim(dtable)}},
        [&] { inner_.embedding_backward(ids, dout, dtable); });
}
void TimedOps::patch_embedding_forward(const Tensor& image, int64_t patch, const Tensor& w, const Tensor* b,
                                       Tensor& out) {
  timed(patches("patch_embedding_forward", image, w, 0),
        [&] { inner_.patch_embedding_forward(image, patch, w, b, out); });
}
void TimedOps::patch_embedding_backward(const Tensor& image, int64_t patch, const Tensor& w, const Tensor& dout,
                                        Tensor* dimage, Tensor* dw, Tensor* db) {
  timed(patches("patch_embedding_backward", image, w, dw ? 1 : 0),
        [&] { inner_.patch_embedding_backward(image, patch, w, dout, dimage, dw, db); });
}
float TimedOps::cross_entropy(const Tensor& logits, std::span<const int32_t> targets, int64_t normalizer,
                              Tensor* dlogits) {
  float r = 0.0f;
  timed({"cross_entropy", {rows_of(logits), last_dim(logits), dlogits ? 1 : 0}},
        [&] { r = inner_.cross_entropy(logits, targets, normalizer, dlogits); });
  return r;
}
float TimedOps::contrastive_loss(const Tensor& li, const Tensor& lt, const Tensor& ai, const Tensor& at, int64_t offset,
                                 float t, ContrastiveGrads* grads) {
  float r = 0.0f;
  timed({"contrastive_loss", {rows_of(li), rows_of(ai), last_dim(li), grads ? 1 : 0}},
        [&] { r = inner_.contrastive_loss(li, lt, ai, at, offset, t, grads); });
  return r;
}
void TimedOps::adamw_step(Tensor& p, const Tensor& g, AdamWState& s, const AdamWConfig& c) {
  timed(elements("adamw_step", p), [&] { inner_.adamw_step(p, g, s, c); });
}
double TimedOps::squared_norm(const Tensor& t) {
  double r = 0.0;
  timed(elements("squared_norm", t), [&] { r = inner_.squared_norm(t); });
  return r;
}
void TimedOps::scale(Tensor& t, float factor) {
  timed(elements("scale", t), [&] { inner_.scale(t, factor); });
}
Tensor TimedOps::from_host(Tensor host) {
  Tensor r;
  timed(elements("copy to device", host), [&] { r = inner_.from_host(std::move(host)); });
  return r;
}
Tensor TimedOps::to_host(const Tensor& t) {
  Tensor r;
  timed(elements("copy to host", t), [&] { r = inner_.to_host(t); });
  return r;
}
std::vector<Tensor> TimedOps::to_host_all(std::span<const Tensor> ts) {
  int64_t n = 0;
  for (const Tensor& t : ts) n += t.numel();
  std::vector<Tensor> r;
  timed({"copy to host", {n}}, [&] { r = inner_.to_host_all(ts); });
  return r;
}
void TimedOps::assign_from_host(Tensor& t, Tensor host) {
  timed(elements("copy to device", host), [&] { inner_.assign_from_host(t, std::move(host)); });
}
void TimedOps::zero(Tensor& t, const Shape& shape) {
  timed({"zero", {shape_numel(shape)}}, [&] { inner_.zero(t, shape); });
}

}  // namespace braid::nn
