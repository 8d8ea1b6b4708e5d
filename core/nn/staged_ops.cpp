#include "core/nn/staged_ops.hpp"

#include <algorithm>

namespace braid::nn {

StagedOps::StagedOps(std::shared_ptr<DeviceBackend> backend) : device_(backend), backend_(std::move(backend)) {}

Tensor StagedOps::up(const Tensor& host) const { return backend_->upload(host); }

void StagedOps::down(const Tensor& device, Tensor& host) const {
  Tensor got = backend_->download(device);
  // Outputs are overwritten where they are, as the other Ops do: a tensor that is a slice of
  // a larger buffer (flat_parameters.hpp) stays one.
  if (host.device().is_host() && host.data.borrowed() && host.numel() == got.numel()) {
    std::copy(got.data.begin(), got.data.end(), host.data.begin());
    host.shape = got.shape;
    return;
  }
  host = std::move(got);
}

void StagedOps::linear_forward(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& y) {
  const Tensor b = bias ? up(*bias) : Tensor();
  Tensor y_d;
  device_.linear_forward(up(x), up(weight), bias ? &b : nullptr, y_d);
  down(y_d, y);
}

void StagedOps::linear_backward(const Tensor& x, const Tensor& weight, const Tensor& dy, Tensor* dx, Tensor* dweight,
                                Tensor* dbias) {
  Tensor dx_d, dw_d = dweight ? up(*dweight) : Tensor(), db_d = dbias ? up(*dbias) : Tensor();
  device_.linear_backward(up(x), up(weight), up(dy), dx ? &dx_d : nullptr, dweight ? &dw_d : nullptr,
                          dbias ? &db_d : nullptr);
  if (dx) down(dx_d, *dx);
  if (dweight) down(dw_d, *dweight);
  if (dbias) down(db_d, *dbias);
}

void StagedOps::layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                                  LayerNormSaved& saved) {
  Tensor y_d;
  LayerNormSaved saved_d;
  device_.layernorm_forward(up(x), up(gamma), up(beta), eps, y_d, saved_d);
  down(y_d, y);
  down(saved_d.mean, saved.mean);
  down(saved_d.rstd, saved.rstd);
}

void StagedOps::layernorm_backward(const Tensor& x, const Tensor& gamma, const LayerNormSaved& saved, const Tensor& dy,
                                   Tensor* dx, Tensor* dgamma, Tensor* dbeta) {
  const LayerNormSaved saved_d{up(saved.mean), up(saved.rstd)};
  Tensor dx_d, dg_d = dgamma ? up(*dgamma) : Tensor(), db_d = dbeta ? up(*dbeta) : Tensor();
  device_.layernorm_backward(up(x), up(gamma), saved_d, up(dy), dx ? &dx_d : nullptr, dgamma ? &dg_d : nullptr,
                             dbeta ? &db_d : nullptr);
  if (dx) down(dx_d, *dx);
  if (dgamma) down(dg_d, *dgamma);
  if (dbeta) down(db_d, *dbeta);
}

void StagedOps::l2_normalize_forward(const Tensor& x, Tensor& y) {
  Tensor y_d;
  device_.l2_normalize_forward(up(x), y_d);
  down(y_d, y);
}

void StagedOps::l2_normalize_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  Tensor dx_d;
  device_.l2_normalize_backward(up(x), up(dy), dx_d);
  down(dx_d, dx);
}

void StagedOps::add(Tensor& y, const Tensor& x) {
  Tensor y_d = up(y);
  device_.add(y_d, up(x));
  down(y_d, y);
}

void StagedOps::gelu_forward(const Tensor& x, Tensor& y) {
  Tensor y_d;
  device_.gelu_forward(up(x), y_d);
  down(y_d, y);
}

void StagedOps::gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  Tensor dx_d;
  device_.gelu_backward(up(x), up(dy), dx_d);
  down(dx_d, dx);
}

void StagedOps::attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                                  Tensor& out, AttentionSaved& saved) {
  Tensor out_d;
  AttentionSaved saved_d;
  device_.attention_forward(up(q), up(k), up(v), options, out_d, saved_d);
  down(out_d, out);
  down(saved_d.probs, saved.probs);
}

void StagedOps::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                                   const AttentionSaved& saved, const Tensor& dout, Tensor& dq, Tensor& dk,
                                   Tensor& dv) {
  const AttentionSaved saved_d{up(saved.probs)};
  Tensor dq_d, dk_d, dv_d;
  device_.attention_backward(up(q), up(k), up(v), options, saved_d, up(dout), dq_d, dk_d, dv_d);
  down(dq_d, dq);
  down(dk_d, dk);
  down(dv_d, dv);
}

void StagedOps::embedding_forward(const Tensor& table, std::span<const int32_t> ids, Tensor& out) {
  Tensor out_d;
  device_.embedding_forward(up(table), ids, out_d);
  down(out_d, out);
}

void StagedOps::embedding_backward(std::span<const int32_t> ids, const Tensor& dout, Tensor& dtable) {
  Tensor dtable_d = up(dtable);
  device_.embedding_backward(ids, up(dout), dtable_d);
  down(dtable_d, dtable);
}

void StagedOps::patch_embedding_forward(const Tensor& image, int64_t patch, const Tensor& weight, const Tensor* bias,
                                        Tensor& out) {
  const Tensor b = bias ? up(*bias) : Tensor();
  Tensor out_d;
  device_.patch_embedding_forward(up(image), patch, up(weight), bias ? &b : nullptr, out_d);
  down(out_d, out);
}

void StagedOps::patch_embedding_backward(const Tensor& image, int64_t patch, const Tensor& weight, const Tensor& dout,
                                         Tensor* dimage, Tensor* dweight, Tensor* dbias) {
  Tensor di_d, dw_d = dweight ? up(*dweight) : Tensor(), db_d = dbias ? up(*dbias) : Tensor();
  device_.patch_embedding_backward(up(image), patch, up(weight), up(dout), dimage ? &di_d : nullptr,
                                   dweight ? &dw_d : nullptr, dbias ? &db_d : nullptr);
  if (dimage) down(di_d, *dimage);
  if (dweight) down(dw_d, *dweight);
  if (dbias) down(db_d, *dbias);
}

float StagedOps::cross_entropy(const Tensor& logits, std::span<const int32_t> targets, int64_t normalizer,
                               Tensor* dlogits) {
  Tensor dl_d;
  const float loss = device_.cross_entropy(up(logits), targets, normalizer, dlogits ? &dl_d : nullptr);
  if (dlogits) down(dl_d, *dlogits);
  return loss;
}

float StagedOps::contrastive_loss(const Tensor& local_image, const Tensor& local_text, const Tensor& all_image,
                                  const Tensor& all_text, int64_t offset, float logit_scale_param,
                                  ContrastiveGrads* grads) {
  // One process passes the same tensors as local and all: so does the device call, so that
  // the backend sees what the host op would (its one-process path is chosen by identity).
  const Tensor li = up(local_image), lt = up(local_text);
  const bool same_image = local_image.ptr() == all_image.ptr(), same_text = local_text.ptr() == all_text.ptr();
  const Tensor ai = same_image ? Tensor() : up(all_image), at = same_text ? Tensor() : up(all_text);
  ContrastiveGrads g;
  const float loss = device_.contrastive_loss(li, lt, same_image ? li : ai, same_text ? lt : at, offset,
                                              logit_scale_param, grads ? &g : nullptr);
  if (grads) {
    down(g.local_image, grads->local_image);
    down(g.local_text, grads->local_text);
    down(g.all_image, grads->all_image);
    down(g.all_text, grads->all_text);
    grads->logit_scale_param = g.logit_scale_param;
  }
  return loss;
}

void StagedOps::adamw_step(Tensor& param, const Tensor& grad, AdamWState& state, const AdamWConfig& config) {
  Tensor param_d = up(param);
  AdamWState state_d;
  state_d.step = state.step;
  if (!state.m.data.empty() || !state.v.data.empty()) {
    state_d.m = up(state.m);
    state_d.v = up(state.v);
  }
  device_.adamw_step(param_d, up(grad), state_d, config);
  down(param_d, param);
  down(state_d.m, state.m);
  down(state_d.v, state.v);
  state.step = state_d.step;
}

double StagedOps::squared_norm(const Tensor& t) { return device_.squared_norm(up(t)); }

void StagedOps::scale(Tensor& t, float factor) {
  Tensor t_d = up(t);
  device_.scale(t_d, factor);
  down(t_d, t);
}

}  // namespace braid::nn
