#include "core/nn/device_ops.hpp"

#include <algorithm>
#include <cmath>

#include "core/common/error.hpp"
#include "core/nn/contrastive_tiled.hpp"
#include "core/nn/op_shapes.hpp"
#include "core/nn/optim.hpp"

namespace braid::nn {
namespace {

using Desc = braid_device_tensor_v2;

Desc describe(const Tensor& t) {
  if (t.rank() > BRAID_DEVICE_MAX_RANK)
    throw Error(Status::invalid_argument, "device ops: tensors have at most " + std::to_string(BRAID_DEVICE_MAX_RANK) +
                                              " axes, got " + shape_string(t.shape));
  Desc d{};
  d.data = const_cast<float*>(t.ptr());  // the plugin writes only what the op says it writes
  d.dtype = BRAID_DEVICE_F32;
  d.rank = t.rank();
  std::copy(t.shape.begin(), t.shape.end(), d.shape);
  return d;
}

Desc describe(const DeviceIds& ids) {
  Desc d{};
  d.data = ids.data();
  d.dtype = BRAID_DEVICE_I32;
  d.rank = 1;
  d.shape[0] = ids.count;
  return d;
}

// A description for an optional tensor: `storage` holds it, the pointer is null without one.
struct OptionalDesc {
  Desc desc{};
  bool given = false;
  explicit OptionalDesc(const Tensor* t) {
    if (t) desc = describe(*t), given = true;
  }
  Desc* get() { return given ? &desc : nullptr; }
};

// Ids are checked here, on the host, once for every backend (a kernel cannot say which).
void check_ids(std::span<const int32_t> ids, int64_t rows, int32_t lowest, const char* op, const char* what) {
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < lowest || ids[i] >= rows)
      throw Error(Status::invalid_argument, std::string(op) + ": " + what + " " + std::to_string(ids[i]) +
                                                " at position " + std::to_string(i) + " is outside [" +
                                                std::to_string(lowest) + ", " + std::to_string(rows) + ")");
}

}  // namespace

DeviceOps::DeviceOps(std::shared_ptr<DeviceBackend> backend) : backend_(std::move(backend)) {
  if (!backend_) throw Error(Status::invalid_argument, "DeviceOps: no backend");
}

const braid_device_ops_v2& DeviceOps::ops_for(braid_device_op_v2 op, const char* name) const {
  if (!backend_->supports(op))
    throw Error(Status::unsupported, backend_->name() + " backend does not implement " + name);
  return *backend_->api().ops;
}

void DeviceOps::expect_here(const Tensor& t, const char* op, const char* what) const {
  if (!(t.device() == backend_->device()))
    throw Error(Status::invalid_argument, std::string(op) + ": " + what + " is on " + t.device().name() + " but the " +
                                              backend_->name() + " backend computes on " + backend_->device().name() +
                                              " (upload it first)");
}

void DeviceOps::prepare(Tensor& t, const Shape& shape) {
  const auto n = static_cast<std::size_t>(shape_numel(shape));
  if (t.device() == backend_->device() && t.data.borrowed() && t.data.size() == n) {
    t.shape = shape;
    return;
  }
  t = backend_->empty(shape);
}

void DeviceOps::check(int rc, const char* op) const {
  if (rc == 0) return;
  const std::string message = error_[0] ? error_ : "failed";
  error_[0] = '\0';
  // The interface's code 1 is the caller's mistake (shapes, ids); anything else the device's.
  throw Error(
      rc == BRAID_DEVICE_INVALID_ARGUMENT ? Status::invalid_argument : Status::plugin,
      backend_->name() + " backend: " + (message.rfind(op, 0) == 0 ? message : std::string(op) + ": " + message));
}

void DeviceOps::linear_forward(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& y) {
  const auto& o = ops_for(BRAID_OP_LINEAR_FORWARD, "linear_forward");
  expect_here(x, "linear_forward", "x");
  expect_here(weight, "linear_forward", "weight");
  if (bias) expect_here(*bias, "linear_forward", "bias");
  if (weight.rank() != 2)
    throw Error(Status::invalid_argument,
                "linear_forward: weight must be (out, in), got " + shape_string(weight.shape));
  prepare(y, linear_output_shape(x.shape, weight.shape));
  Desc dx = describe(x), dw = describe(weight), dy = describe(y);
  OptionalDesc db(bias);
  check(o.linear_forward(backend_->stream(), &dx, &dw, db.get(), &dy, error_, sizeof error_), "linear_forward");
}

void DeviceOps::linear_backward(const Tensor& x, const Tensor& weight, const Tensor& dy, Tensor* dx, Tensor* dweight,
                                Tensor* dbias) {
  const auto& o = ops_for(BRAID_OP_LINEAR_BACKWARD, "linear_backward");
  for (auto [t, what] : {std::pair{&x, "x"}, {&weight, "weight"}, {&dy, "dy"}})
    expect_here(*t, "linear_backward", what);
  if (dweight) expect_here(*dweight, "linear_backward", "dweight");
  if (dbias) expect_here(*dbias, "linear_backward", "dbias");
  if (dx) prepare(*dx, x.shape);
  Desc a = describe(x), w = describe(weight), g = describe(dy);
  OptionalDesc gx(dx), gw(dweight), gb(dbias);
  check(o.linear_backward(backend_->stream(), &a, &w, &g, gx.get(), gw.get(), gb.get(), error_, sizeof error_),
        "linear_backward");
}

void DeviceOps::layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                                  LayerNormSaved& saved) {
  const auto& o = ops_for(BRAID_OP_LAYERNORM_FORWARD, "layernorm_forward");
  for (auto [t, what] : {std::pair{&x, "x"}, {&gamma, "gamma"}, {&beta, "beta"}})
    expect_here(*t, "layernorm_forward", what);
  prepare(y, x.shape);
  prepare(saved.mean, layernorm_stats_shape(x.shape));
  prepare(saved.rstd, layernorm_stats_shape(x.shape));
  Desc a = describe(x), g = describe(gamma), b = describe(beta), out = describe(y), m = describe(saved.mean),
       r = describe(saved.rstd);
  check(o.layernorm_forward(backend_->stream(), &a, &g, &b, eps, &out, &m, &r, error_, sizeof error_),
        "layernorm_forward");
}

void DeviceOps::layernorm_backward(const Tensor& x, const Tensor& gamma, const LayerNormSaved& saved, const Tensor& dy,
                                   Tensor* dx, Tensor* dgamma, Tensor* dbeta) {
  const auto& o = ops_for(BRAID_OP_LAYERNORM_BACKWARD, "layernorm_backward");
  for (auto [t, what] :
       {std::pair{&x, "x"}, {&gamma, "gamma"}, {&saved.mean, "saved.mean"}, {&saved.rstd, "saved.rstd"}, {&dy, "dy"}})
    expect_here(*t, "layernorm_backward", what);
  if (dgamma) expect_here(*dgamma, "layernorm_backward", "dgamma");
  if (dbeta) expect_here(*dbeta, "layernorm_backward", "dbeta");
  if (dx) prepare(*dx, x.shape);
  Desc a = describe(x), g = describe(gamma), m = describe(saved.mean), r = describe(saved.rstd), d = describe(dy);
  OptionalDesc gx(dx), gg(dgamma), gb(dbeta);
  check(
      o.layernorm_backward(backend_->stream(), &a, &g, &m, &r, &d, gx.get(), gg.get(), gb.get(), error_, sizeof error_),
      "layernorm_backward");
}

void DeviceOps::l2_normalize_forward(const Tensor& x, Tensor& y) {
  const auto& o = ops_for(BRAID_OP_L2_NORMALIZE_FORWARD, "l2_normalize_forward");
  expect_here(x, "l2_normalize_forward", "x");
  prepare(y, x.shape);
  Desc a = describe(x), b = describe(y);
  check(o.l2_normalize_forward(backend_->stream(), &a, &b, error_, sizeof error_), "l2_normalize_forward");
}

void DeviceOps::l2_normalize_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  const auto& o = ops_for(BRAID_OP_L2_NORMALIZE_BACKWARD, "l2_normalize_backward");
  expect_here(x, "l2_normalize_backward", "x");
  expect_here(dy, "l2_normalize_backward", "dy");
  prepare(dx, x.shape);
  Desc a = describe(x), g = describe(dy), out = describe(dx);
  check(o.l2_normalize_backward(backend_->stream(), &a, &g, &out, error_, sizeof error_), "l2_normalize_backward");
}

void DeviceOps::add(Tensor& y, const Tensor& x) {
  const auto& o = ops_for(BRAID_OP_ADD, "add");
  expect_here(y, "add", "y");
  expect_here(x, "add", "x");
  Desc a = describe(y), b = describe(x);
  check(o.add(backend_->stream(), &a, &b, error_, sizeof error_), "add");
}

void DeviceOps::gelu_forward(const Tensor& x, Tensor& y) {
  const auto& o = ops_for(BRAID_OP_GELU_FORWARD, "gelu_forward");
  expect_here(x, "gelu_forward", "x");
  prepare(y, x.shape);
  Desc a = describe(x), b = describe(y);
  check(o.gelu_forward(backend_->stream(), &a, &b, error_, sizeof error_), "gelu_forward");
}

void DeviceOps::gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  const auto& o = ops_for(BRAID_OP_GELU_BACKWARD, "gelu_backward");
  expect_here(x, "gelu_backward", "x");
  expect_here(dy, "gelu_backward", "dy");
  prepare(dx, x.shape);
  Desc a = describe(x), g = describe(dy), out = describe(dx);
  check(o.gelu_backward(backend_->stream(), &a, &g, &out, error_, sizeof error_), "gelu_backward");
}

void DeviceOps::attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                                  Tensor& out, AttentionSaved& saved) {
  const auto& o = ops_for(BRAID_OP_ATTENTION_FORWARD, "attention_forward");
  for (auto [t, what] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}}) expect_here(*t, "attention_forward", what);
  Desc a = describe(q), b = describe(k), c = describe(v), s{};
  check(backend_->api().attention_saved_shape(&a, &b, options.heads, options.causal, &s, error_, sizeof error_),
        "attention_forward");
  prepare(out, q.shape);
  prepare(saved.probs, Shape(s.shape, s.shape + s.rank));
  Desc d = describe(out), p = describe(saved.probs);
  check(
      o.attention_forward(backend_->stream(), &a, &b, &c, options.heads, options.causal, &d, &p, error_, sizeof error_),
      "attention_forward");
}

void DeviceOps::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                                   const AttentionSaved& saved, const Tensor& dout, Tensor& dq, Tensor& dk,
                                   Tensor& dv) {
  const auto& o = ops_for(BRAID_OP_ATTENTION_BACKWARD, "attention_backward");
  for (auto [t, what] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}, {&saved.probs, "saved"}, {&dout, "dout"}})
    expect_here(*t, "attention_backward", what);
  prepare(dq, q.shape);
  prepare(dk, k.shape);
  prepare(dv, v.shape);
  Desc a = describe(q), b = describe(k), c = describe(v), s = describe(saved.probs), g = describe(dout),
       gq = describe(dq), gk = describe(dk), gv = describe(dv);
  check(o.attention_backward(backend_->stream(), &a, &b, &c, options.heads, options.causal, &s, &g, &gq, &gk, &gv,
                             error_, sizeof error_),
        "attention_backward");
}

void DeviceOps::embedding_forward(const Tensor& table, std::span<const int32_t> ids, Tensor& out) {
  const auto& o = ops_for(BRAID_OP_EMBEDDING_FORWARD, "embedding_forward");
  expect_here(table, "embedding_forward", "table");
  if (table.rank() != 2)
    throw Error(Status::invalid_argument, "embedding_forward: table must be (V, E), got " + shape_string(table.shape));
  check_ids(ids, table.dim(0), 0, "embedding_forward", "id");
  prepare(out, embedding_output_shape(static_cast<int64_t>(ids.size()), table.shape));
  const DeviceIds on_device = backend_->upload_ids(ids);
  Desc t = describe(table), i = describe(on_device), d = describe(out);
  // No wait: the ids' device copy goes back to the pool in stream order.
  check(o.embedding_forward(backend_->stream(), &t, &i, &d, error_, sizeof error_), "embedding_forward");
}

void DeviceOps::embedding_backward(std::span<const int32_t> ids, const Tensor& dout, Tensor& dtable) {
  const auto& o = ops_for(BRAID_OP_EMBEDDING_BACKWARD, "embedding_backward");
  expect_here(dout, "embedding_backward", "dout");
  expect_here(dtable, "embedding_backward", "dtable");
  if (dtable.rank() == 2) check_ids(ids, dtable.dim(0), 0, "embedding_backward", "id");
  const DeviceIds on_device = backend_->upload_ids(ids);
  Desc i = describe(on_device), g = describe(dout), t = describe(dtable);
  check(o.embedding_backward(backend_->stream(), &i, &g, &t, error_, sizeof error_), "embedding_backward");
}

void DeviceOps::patch_embedding_forward(const Tensor& image, int64_t patch, const Tensor& weight, const Tensor* bias,
                                        Tensor& out) {
  const auto& o = ops_for(BRAID_OP_PATCH_EMBEDDING_FORWARD, "patch_embedding_forward");
  expect_here(image, "patch_embedding_forward", "image");
  expect_here(weight, "patch_embedding_forward", "weight");
  if (bias) expect_here(*bias, "patch_embedding_forward", "bias");
  if ((image.rank() != 3 && image.rank() != 4) || patch <= 0 || weight.rank() != 2)
    throw Error(Status::invalid_argument,
                "patch_embedding_forward: image must be (C, H, W) or (B, C, H, W), patch "
                "positive and weight (E, C*P*P); got image " +
                    shape_string(image.shape) + ", patch " + std::to_string(patch) + ", weight " +
                    shape_string(weight.shape));
  prepare(out, patch_embedding_output_shape(image.shape, patch, weight.shape));
  Desc a = describe(image), w = describe(weight), d = describe(out);
  OptionalDesc b(bias);
  check(o.patch_embedding_forward(backend_->stream(), &a, patch, &w, b.get(), &d, error_, sizeof error_),
        "patch_embedding_forward");
}

void DeviceOps::patch_embedding_backward(const Tensor& image, int64_t patch, const Tensor& weight, const Tensor& dout,
                                         Tensor* dimage, Tensor* dweight, Tensor* dbias) {
  const auto& o = ops_for(BRAID_OP_PATCH_EMBEDDING_BACKWARD, "patch_embedding_backward");
  for (auto [t, what] : {std::pair{&image, "image"}, {&weight, "weight"}, {&dout, "dout"}})
    expect_here(*t, "patch_embedding_backward", what);
  if (dweight) expect_here(*dweight, "patch_embedding_backward", "dweight");
  if (dbias) expect_here(*dbias, "patch_embedding_backward", "dbias");
  if (dimage) prepare(*dimage, image.shape);
  Desc a = describe(image), w = describe(weight), g = describe(dout);
  OptionalDesc gi(dimage), gw(dweight), gb(dbias);
  check(o.patch_embedding_backward(backend_->stream(), &a, patch, &w, &g, gi.get(), gw.get(), gb.get(), error_,
                                   sizeof error_),
        "patch_embedding_backward");
}

float DeviceOps::cross_entropy(const Tensor& logits, std::span<const int32_t> targets, int64_t normalizer,
                               Tensor* dlogits) {
  const auto& o = ops_for(BRAID_OP_CROSS_ENTROPY, "cross_entropy");
  expect_here(logits, "cross_entropy", "logits");
  if (logits.rank() >= 1) check_ids(targets, logits.dim(-1), -1, "cross_entropy", "target");
  if (dlogits) prepare(*dlogits, logits.shape);
  const DeviceIds on_device = backend_->upload_ids(targets);
  Desc l = describe(logits), t = describe(on_device);
  OptionalDesc g(dlogits);
  float loss = 0.0f;
  check(o.cross_entropy(backend_->stream(), &l, &t, normalizer, g.get(), &loss, error_, sizeof error_),
        "cross_entropy");
  backend_->count_host_wait();  // the result came back to the host
  return loss;
}

float DeviceOps::contrastive_loss(const Tensor& local_image, const Tensor& local_text, const Tensor& all_image,
                                  const Tensor& all_text, int64_t offset, float logit_scale_param,
                                  ContrastiveGrads* grads) {
  // HostOps::contrastive_loss's formula (host_contrastive.cpp) on the backend's tiled loss
  // (forward alone without gradients): this rank's share 1 / 2N of its rows'
  // cross-entropies, the scale capped.
  const auto& o = ops_for(grads ? BRAID_OP_CONTRASTIVE_LOSS : BRAID_OP_CONTRASTIVE_FORWARD, "contrastive_loss");
  for (auto [t, what] : {std::pair{&local_image, "local_image"},
                         {&local_text, "local_text"},
                         {&all_image, "all_image"},
                         {&all_text, "all_text"}})
    expect_here(*t, "contrastive_loss", what);
  if (local_image.rank() != 2 || all_image.rank() != 2)
    throw Error(Status::invalid_argument, "contrastive_loss: embeddings must be (rows, E), got " +
                                              shape_string(local_image.shape) + " and " +
                                              shape_string(all_image.shape));
  const int64_t n = local_image.dim(0), total = all_image.dim(0);
  if (grads) {
    prepare(grads->local_image, local_image.shape);
    prepare(grads->local_text, local_text.shape);
    prepare(grads->all_image, all_image.shape);
    prepare(grads->all_text, all_text.shape);
    grads->logit_scale_param = 0.0f;
  }
  Desc li = describe(local_image), lt = describe(local_text), ai = describe(all_image), at = describe(all_text);
  if (n == 0) {  // no rows: no loss, zero gradients
    if (grads)
      for (Tensor* g : {&grads->local_image, &grads->local_text, &grads->all_image, &grads->all_text})
        backend_->zero(*g);
    return 0.0f;
  }
  const bool capped = logit_scale_capped(logit_scale_param);
  const auto scale = static_cast<float>(std::exp(capped ? kMaxLogitScaleParam : logit_scale_param));
  const int64_t tile = trainer_contrastive_tile(n, total);
  const double share = 1.0 / (2.0 * static_cast<double>(total));
  Tensor stats = backend_->empty({2, n});
  Desc st = describe(stats);
  double sum = 0.0;
  if (!grads) {
    check(o.contrastive_forward(backend_->stream(), &li, &lt, &ai, &at, offset, scale, tile, &st, &sum, error_,
                                sizeof error_),
          "contrastive_loss");
    backend_->count_host_wait();  // the result came back to the host
    return static_cast<float>(sum * share);
  }
  Desc gli = describe(grads->local_image), glt = describe(grads->local_text), gai = describe(grads->all_image),
       gat = describe(grads->all_text);
  double d_scale = 0.0;
  check(o.contrastive_loss(backend_->stream(), &li, &lt, &ai, &at, offset, scale, tile, &st, share, &sum, &gli, &glt,
                           &gai, &gat, &d_scale, error_, sizeof error_),
        "contrastive_loss");
  backend_->count_host_wait();  // the result came back to the host
  if (!capped) grads->logit_scale_param = static_cast<float>(d_scale * scale);
  return static_cast<float>(sum * share);
}

void DeviceOps::adamw_step(Tensor& param, const Tensor& grad, AdamWState& state, const AdamWConfig& config) {
  const auto& o = ops_for(BRAID_OP_ADAMW_STEP, "adamw_step");
  expect_here(param, "adamw_step", "param");
  expect_here(grad, "adamw_step", "grad");
  if (state.m.data.empty() && state.v.data.empty() && state.step == 0) {
    state.m = backend_->zeros(param.shape);
    state.v = backend_->zeros(param.shape);
  }
  expect_here(state.m, "adamw_step", "state.m");
  expect_here(state.v, "adamw_step", "state.v");
  Desc p = describe(param), g = describe(grad), m = describe(state.m), v = describe(state.v);
  const braid_adamw_config_v2 c{config.lr, config.beta1, config.beta2, config.eps, config.weight_decay};
  check(o.adamw_step(backend_->stream(), &p, &g, &m, &v, state.step + 1, &c, error_, sizeof error_), "adamw_step");
  ++state.step;
}

double DeviceOps::squared_norm(const Tensor& t) {
  const auto& o = ops_for(BRAID_OP_SQUARED_NORM, "squared_norm");
  expect_here(t, "squared_norm", "t");
  Desc d = describe(t);
  double result = 0.0;
  check(o.squared_norm(backend_->stream(), &d, &result, error_, sizeof error_), "squared_norm");
  backend_->count_host_wait();  // the result came back to the host
  return result;
}

void DeviceOps::scale(Tensor& t, float factor) {
  const auto& o = ops_for(BRAID_OP_SCALE, "scale");
  expect_here(t, "scale", "t");
  Desc d = describe(t);
  check(o.scale(backend_->stream(), &d, factor, error_, sizeof error_), "scale");
}

Tensor DeviceOps::from_host(Tensor host) {
  if (host.device() == backend_->device()) return host;  // moved, not copied
  return backend_->upload_owned(std::move(host));
}

Tensor DeviceOps::to_host(const Tensor& t) { return t.device().is_host() ? t : backend_->download(t); }

std::vector<Tensor> DeviceOps::to_host_all(std::span<const Tensor> ts) {
  std::vector<const Tensor*> on_device;
  for (const Tensor& t : ts)
    if (!t.device().is_host()) on_device.push_back(&t);
  std::vector<Tensor> downloaded = backend_->download_all(on_device);
  std::vector<Tensor> out;
  std::size_t next = 0;
  for (const Tensor& t : ts) out.push_back(t.device().is_host() ? t : std::move(downloaded[next++]));
  return out;
}

void DeviceOps::assign_from_host(Tensor& t, Tensor host) {
  if (!(t.device() == backend_->device()) || !t.data.borrowed() || t.data.size() != host.data.size() ||
      host.device() == backend_->device()) {
    t = from_host(std::move(host));
    return;
  }
  backend_->upload_into(t, host);
  t.shape = host.shape;
}

void DeviceOps::zero(Tensor& t, const Shape& shape) {
  prepare(t, shape);
  backend_->zero(t);
}

}  // namespace braid::nn
