// The CUDA backend's op table: each entry checks its views as the host ops do, then
// enqueues cuBLAS calls and kernels (kernels.hpp) on the given stream. Scalars the
// interface returns in host memory (losses, norms) are copied back and waited for.
//
// The contrastive loss is tiled as the host's (contrastive_tiled.cpp, both layouts): per
// tile of columns one GEMM gives the raw dot products, a row kernel merges them into each
// row's running log-sum-exp; the backward recomputes each tile. O(n * tile) scratch. When
// local and gathered rows are the same memory (one process) the shared layout computes each
// tile once for both directions: 8 N^2 E FLOPs forward and backward instead of 16.
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cuda_backend.hpp"
#include "kernels.hpp"

namespace {

using braid_cuda::data;
using braid_cuda::expect_same_shape;
using braid_cuda::expect_shape;
using braid_cuda::f32;
using braid_cuda::features;
using braid_cuda::guarded;
using braid_cuda::invalid;
using braid_cuda::numel;
using braid_cuda::on_stream;
using braid_cuda::Scratch;
using braid_cuda::Tensor;
using Stream = braid_device_stream_s*;

// Rows of x (every axis but the last) after checking x against weight (out, in).
int64_t linear_rows(const Tensor& x, const Tensor& w, const char* op) {
  if (w.rank != 2) invalid(std::string(op) + ": weight must be (out, in), got " + braid_cuda::shape_string(w));
  if (x.rank < 1 || x.shape[x.rank - 1] != w.shape[1])
    invalid(std::string(op) + ": x " + braid_cuda::shape_string(x) + " does not end in the " +
            std::to_string(w.shape[1]) + " input features of weight " + braid_cuda::shape_string(w));
  return w.shape[1] ? numel(x) / w.shape[1] : 0;
}

// x's shape with the last axis replaced.
Tensor with_last(const Tensor& x, int64_t last) {
  Tensor t = x;
  t.shape[t.rank - 1] = last;
  return t;
}

void linear_forward_on(Stream s, const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y, const char* op) {
  const int64_t rows = linear_rows(x, w, op), in = w.shape[1], out = w.shape[0];
  if (b) expect_shape(f32(b, op, "bias"), {out}, op, "bias");
  expect_same_shape(y, with_last(x, out), op, "y");
  if (b && braid_cuda::linear_gemm_bias(s, rows, out, in, data(x), data(w), data(*b), data(y))) return;
  if (b) braid_cuda::fill_rows(s->stream, data(y), data(*b), rows, out);  // the GEMM adds x W^T to it
  braid_cuda::gemm(s, false, true, rows, out, in, 1.0f, data(x), in, data(w), in, b ? 1.0f : 0.0f, data(y), out);
}

void linear_backward_on(Stream s, const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor* dw,
                        Tensor* db, const char* op) {
  const int64_t rows = linear_rows(x, w, op), in = w.shape[1], out = w.shape[0];
  expect_same_shape(dy, with_last(x, out), op, "dy");
  if (dx) expect_same_shape(f32(dx, op, "dx"), x, op, "dx");
  if (dw) expect_same_shape(f32(dw, op, "dweight"), w, op, "dweight");
  if (db) expect_shape(f32(db, op, "dbias"), {out}, op, "dbias");
  if (dx) braid_cuda::gemm(s, false, false, rows, in, out, 1.0f, data(dy), out, data(w), in, 0.0f, data(*dx), in);
  if (dw) braid_cuda::gemm(s, true, false, out, in, rows, 1.0f, data(dy), out, data(x), in, 1.0f, data(*dw), in);
  if (db) {
    Scratch partial(s, static_cast<size_t>(braid_cuda::column_sums_scratch(rows, out)) * sizeof(float));
    braid_cuda::column_sums_add(s->stream, data(*db), data(dy), rows, out, partial.f());
  }
}

int linear_forward(Stream s, const Tensor* x, const Tensor* w, const Tensor* b, Tensor* y, char* e, size_t n) {
  return on_stream(s, e, n, [&] {
    const char* op = "linear_forward";
    linear_forward_on(s, f32(x, op, "x"), f32(w, op, "weight"), b, f32(y, op, "y"), op);
  });
}

int linear_backward(Stream s, const Tensor* x, const Tensor* w, const Tensor* dy, Tensor* dx, Tensor* dw, Tensor* db,
                    char* e, size_t n) {
  return on_stream(s, e, n, [&] {
    const char* op = "linear_backward";
    linear_backward_on(s, f32(x, op, "x"), f32(w, op, "weight"), f32(dy, op, "dy"), dx, dw, db, op);
  });
}

int layernorm_forward(Stream s, const Tensor* x, const Tensor* gamma, const Tensor* beta, float eps, Tensor* y,
                      Tensor* mean, Tensor* rstd, char* e, size_t n) {
  return on_stream(s, e, n, [&] {
    const char* op = "layernorm_forward";
    const int64_t f = features(f32(x, op, "x"), op, "x"), rows = numel(*x) / f;
    expect_shape(f32(gamma, op, "gamma"), {f}, op, "gamma");
    expect_shape(f32(beta, op, "beta"), {f}, op, "beta");
    expect_same_shape(f32(y, op, "y"), *x, op, "y");
    expect_shape(f32(mean, op, "mean"), {rows}, op, "mean");
    expect_shape(f32(rstd, op, "rstd"), {rows}, op, "rstd");
    braid_cuda::layernorm_forward(s->stream, data(*x), data(*gamma), data(*beta), eps, data(*y), data(*mean),
                                  data(*rstd), rows, f);
  });
}

int layernorm_backward(Stream s, const Tensor* x, const Tensor* gamma, const Tensor* mean, const Tensor* rstd,
                       const Tensor* dy, Tensor* dx, Tensor* dgamma, Tensor* dbeta, char* e, size_t n) {
  return on_stream(s, e, n, [&] {
    const char* op = "layernorm_backward";
    const int64_t f = features(f32(x, op, "x"), op, "x"), rows = numel(*x) / f;
    expect_shape(f32(gamma, op, "gamma"), {f}, op, "gamma");
    expect_shape(f32(mean, op, "saved.mean"), {rows}, op, "saved.mean");
    expect_shape(f32(rstd, op, "saved.rstd"), {rows}, op, "saved.rstd");
    expect_same_shape(f32(dy, op, "dy"), *x, op, "dy");
    if (dx) expect_same_shape(f32(dx, op, "dx"), *x, op, "dx");
    if (dgamma) expect_shape(f32(dgamma, op, "dgamma"), {f}, op, "dgamma");
    if (dbeta) expect_shape(f32(dbeta, op, "dbeta"), {f}, op, "dbeta");
    if (dx)
      braid_cuda::layernorm_backward_dx(s->stream, data(*x), data(*gamma), data(*mean), data(*rstd), data(*dy),
                                        data(*dx), rows, f);
    if (dgamma || dbeta) {
      Scratch partial(s, static_cast<size_t>(2 * braid_cuda::column_sums_scratch(rows, f)) * sizeof(float));
      braid_cuda::layernorm_backward_params(s->stream, data(*x), data(*mean), data(*rstd), data(*dy),
                                            dgamma ? data(*dgamma) : nullptr, dbeta ? data(*dbeta) : nullptr, rows, f,
                                            partial.f());
    }
  });
}

int l2_normalize_forward(Stream s, const Tensor* x, Tensor* y, char* e, size_t n) {
  return on_stream(s, e, n, [&] {
    const char* op = "l2_normalize_forward";
    const int64_t f = features(f32(x, op, "x"), op, "x");
    expect_same_shape(f32(y, op, "y"), *x, op, "y");
    braid_cuda::l2_normalize_forward(s->stream, data(*x), data(*y), numel(*x) / f, f);
  });
}

int l2_normalize_backward(Stream s, const Tensor* x, const Tensor* dy, Tensor* dx, char* e, size_t n) {
  return on_stream(s, e, n, [&] {
    const char* op = "l2_normalize_backward";
    const int64_t f = features(f32(x, op, "x"), op, "x");
    expect_same_shape(f32(dy, op, "dy"), *x, op, "dy");
    expect_same_shape(f32(dx, op, "dx"), *x, op, "dx");
    braid_cuda::l2_normalize_backward(s->stream, data(*x), data(*dy), data(*dx), numel(*x) / f, f);
  });
}

int add(Stream s, Tensor* y, const Tensor* x, char* e, size_t n) {
  return on_stream(s, e, n, [&] {
    expect_same_shape(f32(x, "add", "x"), f32(y, "add", "y"), "add", "x");
    braid_cuda::add(s->stream, data(*y), data(*x), numel(*y));
  });
}

int gelu_forward(Stream s, const Tensor* x, Tensor* y, char* e, size_t n) {
  return on_stream(s, e, n, [&] {
    expect_same_shape(f32(y, "gelu_forward", "y"), f32(x, "gelu_forward", "x"), "gelu_forward", "y");
    braid_cuda::gelu_forward(s->stream, data(*x), data(*y), numel(*x));
  });
}

int gelu_backward(Stream s, const Tensor* x, const Tensor* dy, Tensor* dx, char* e, size_t n) {
  return on_stream(s, e, n, [&] {
    const char* op = "gelu_backward";
    expect_same_shape(f32(dy, op, "dy"), f32(x, op, "x"), op, "dy");
    expect_same_shape(f32(dx, op, "dx"), *x, op, "dx");
    braid_cuda::gelu_backward(s->stream, data(*x), data(*dy), data(*dx), numel(*x));
  });
}

// Attention's dimensions after the host op's checks (host_attention.cpp).
struct Dims {
  int64_t batch, sq, sk, width, heads, head_dim;
};

Dims attention_dims(const Tensor& q, const Tensor& k, const Tensor& v, int64_t heads, bool causal, const char* op) {
  if (q.rank != 3 || k.rank != 3)
    invalid(std::string(op) + ": q and k must be (B, S, H*D), got " + braid_cuda::shape_string(q) + " and " +
            braid_cuda::shape_string(k));
  const Dims d{q.shape[0], q.shape[1], k.shape[1], q.shape[2], heads, heads > 0 ? q.shape[2] / heads : 0};
  if (heads <= 0 || d.width % heads != 0 || d.head_dim == 0)
    invalid(std::string(op) + ": " + std::to_string(heads) + " heads do not divide the " + std::to_string(d.width) +
            " features");
  expect_shape(k, {d.batch, d.sk, d.width}, op, "k");
  expect_shape(v, {d.batch, d.sk, d.width}, op, "v");
  if (d.sq > 0 && d.sk == 0) invalid(std::string(op) + ": queries need at least one key to attend to");
  if (causal && d.sq != d.sk)
    invalid(std::string(op) + ": causal attention needs as many queries as keys, got " + std::to_string(d.sq) +
            " and " + std::to_string(d.sk));
  return d;
}

// Where operand (sample b, head h) of attention's per-head GEMMs starts: b * sample + h * head.
struct Strides {
  int64_t sample, head;
};

// Attention's per-(sample, head) GEMMs over operands named by index (their memory and
// strides, given once per op). Where both samples and heads are several, each GEMM is one
// pointer-array batched cuBLAS call over every pair, the pointers written by one kernel for
// the op's GEMMs together: a tiny model's attention is launch-bound. Otherwise (one sample,
// one head, or no queries or keys) strided-batched calls, one per head batched over the
// samples or one per sample batched over the heads, whichever are fewer.
class HeadGemms {
 public:
  HeadGemms(Stream s, const Dims& d, std::initializer_list<std::pair<float*, Strides>> operands)
      : s_(s), d_(d), over_samples_(d.heads <= d.batch) {
    if (operands.size() > static_cast<size_t>(braid_cuda::kMostHeadOperands))
      invalid("attention: more GEMM operands than the pointer kernel takes");
    for (const auto& [base, strides] : operands) {
      o_.base[o_.count] = base;
      o_.sample[o_.count] = strides.sample;
      o_.head[o_.count] = strides.head;
      ++o_.count;
    }
    if (d.heads == 1 || d.batch == 1 || d.sq == 0 || d.sk == 0) return;  // strided calls
    pointers_.emplace(s, static_cast<size_t>(o_.count * d.batch * d.heads) * sizeof(float*));
    braid_cuda::head_pointers(s->stream, o_, d.batch, d.heads, pointers_->pointers());
  }

  // C[c] = alpha op(A[a]) op(B[b]) + beta C[c] for every (sample, head).
  void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, int a, int64_t lda, int b,
            int64_t ldb, float beta, int c, int64_t ldc) const {
    if (pointers_) {
      braid_cuda::gemm_pointers(s_, trans_a, trans_b, m, n, k, alpha, of(a), lda, of(b), ldb, beta, of(c), ldc,
                                d_.batch * d_.heads);
      return;
    }
    const int64_t calls = over_samples_ ? d_.heads : d_.batch, batch = over_samples_ ? d_.batch : d_.heads;
    const auto start = [&](int j, int64_t i) { return o_.base[j] + i * (over_samples_ ? o_.head[j] : o_.sample[j]); };
    const auto stride = [&](int j) { return over_samples_ ? o_.sample[j] : o_.head[j]; };
    for (int64_t i = 0; i < calls; ++i)
      braid_cuda::gemm_batched(s_, trans_a, trans_b, m, n, k, alpha, start(a, i), lda, stride(a), start(b, i), ldb,
                               stride(b), beta, start(c, i), ldc, stride(c), batch);
  }

 private:
  float* const* of(int j) const { return pointers_->pointers() + static_cast<int64_t>(j) * d_.batch * d_.heads; }

  Stream s_;
  Dims d_;
  bool over_samples_;
  braid_cuda::HeadOperands o_{};  // the operands by index, as the pointer kernel takes them
  std::optional<Scratch> pointers_;
};

// Whether attention of heads this wide runs fused (BRAID_CUDA_FUSED_ATTENTION=1 and a head of
// at most 128 features); the saved shape follows: (B, H, Sq, d + 1) fused, else the
// probabilities (B, H, Sq, Sk).
bool fused(int64_t head_dim) {
  return braid_cuda::fused_attention_on() && braid_cuda::fused_attention_width(head_dim) > 0;
}

// The strides of queries (and outputs), keys (and values) and the (B, H, Sq, Sk) scores.
Strides query_strides(const Dims& d) { return {d.sq * d.width, d.head_dim}; }
Strides key_strides(const Dims& d) { return {d.sk * d.width, d.head_dim}; }
Strides score_strides(const Dims& d) { return {d.heads * d.sq * d.sk, d.sq * d.sk}; }

int attention_forward(Stream s, const Tensor* q, const Tensor* k, const Tensor* v, int64_t heads, int32_t causal,
                      Tensor* out, Tensor* saved, char* e, size_t n) {
  return on_stream(s, e, n, [&] {
    const char* op = "attention_forward";
    const Dims d = attention_dims(f32(q, op, "q"), f32(k, op, "k"), f32(v, op, "v"), heads, causal, op);
    expect_same_shape(f32(out, op, "out"), *q, op, "out");
    const auto scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.head_dim)));
    if (fused(d.head_dim)) {
      expect_shape(f32(saved, op, "saved"), {d.batch, d.heads, d.sq, d.head_dim + 1}, op, "saved");
      braid_cuda::fused_attention_forward(s->stream, data(*q), data(*k), data(*v), data(*out), data(*saved), d.batch,
                                          d.heads, d.sq, d.sk, d.head_dim, scale, causal != 0);
      return;
    }
    expect_shape(f32(saved, op, "saved"), {d.batch, d.heads, d.sq, d.sk}, op, "saved");
    const Strides qs = query_strides(d), ks = key_strides(d), ps = score_strides(d);
    enum { Q, K, P, V, OUT };
    const HeadGemms per_head(s, d,
                             {{data(*q), qs}, {data(*k), ks}, {data(*saved), ps}, {data(*v), ks}, {data(*out), qs}});
    // S = scale Q K^T, P = softmax(S) in place, out = P V.
    per_head.gemm(false, true, d.sq, d.sk, d.head_dim, scale, Q, d.width, K, d.width, 0.0f, P, d.sk);
    braid_cuda::softmax_rows(s->stream, data(*saved), d.batch * d.heads * d.sq, d.sq, d.sk, causal != 0);
    per_head.gemm(false, false, d.sq, d.head_dim, d.sk, 1.0f, P, d.sk, V, d.width, 0.0f, OUT, d.width);
  });
}

int attention_backward(Stream s, const Tensor* q, const Tensor* k, const Tensor* v, int64_t heads, int32_t causal,
                       const Tensor* saved, const Tensor* dout, Tensor* dq, Tensor* dk, Tensor* dv, char* e, size_t n) {
  return on_stream(s, e, n, [&] {
    const char* op = "attention_backward";
    const Dims d = attention_dims(f32(q, op, "q"), f32(k, op, "k"), f32(v, op, "v"), heads, causal, op);
    expect_same_shape(f32(dout, op, "dout"), *q, op, "dout");
    expect_same_shape(f32(dq, op, "dq"), *q, op, "dq");
    expect_same_shape(f32(dk, op, "dk"), *k, op, "dk");
    expect_same_shape(f32(dv, op, "dv"), *v, op, "dv");
    const auto scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.head_dim)));
    if (fused(d.head_dim)) {
      expect_shape(f32(saved, op, "saved"), {d.batch, d.heads, d.sq, d.head_dim + 1}, op, "saved");
      Scratch delta(s, static_cast<size_t>(std::max<int64_t>(d.batch * d.heads * d.sq, 1)) * sizeof(float));
      braid_cuda::fused_attention_backward(s->stream, data(*q), data(*k), data(*v), data(*saved), data(*dout),
                                           data(*dq), data(*dk), data(*dv), delta.f(), d.batch, d.heads, d.sq, d.sk,
                                           d.head_dim, scale, causal != 0);
      return;
    }
    expect_shape(f32(saved, op, "saved"), {d.batch, d.heads, d.sq, d.sk}, op, "saved");
    const Strides qs = query_strides(d), ks = key_strides(d), ps = score_strides(d);
    Scratch ds(s, static_cast<size_t>(d.batch * d.heads * d.sq * d.sk) * sizeof(float));  // dP, then dS
    enum { P, DOUT, DV, V, DS, K, DQ, Q, DK };
    const HeadGemms per_head(s, d,
                             {{data(*saved), ps},
                              {data(*dout), qs},
                              {data(*dv), ks},
                              {data(*v), ks},
                              {ds.f(), ps},
                              {data(*k), ks},
                              {data(*dq), qs},
                              {data(*q), qs},
                              {data(*dk), ks}});
    // out = P V: dV = P^T dout, dP = dout V^T.
    per_head.gemm(true, false, d.sk, d.head_dim, d.sq, 1.0f, P, d.sk, DOUT, d.width, 0.0f, DV, d.width);
    per_head.gemm(false, true, d.sq, d.sk, d.head_dim, 1.0f, DOUT, d.width, V, d.width, 0.0f, DS, d.sk);
    braid_cuda::softmax_backward_rows(s->stream, data(*saved), ds.f(), d.batch * d.heads * d.sq, d.sk);
    // S = scale Q K^T: dQ = scale dS K, dK = scale dS^T Q.
    per_head.gemm(false, false, d.sq, d.head_dim, d.sk, scale, DS, d.sk, K, d.width, 0.0f, DQ, d.width);
    per_head.gemm(true, false, d.sk, d.head_dim, d.sq, scale, DS, d.sk, Q, d.width, 0.0f, DK, d.width);
  });
}

const int32_t* ids_of(const Tensor* t, const char* op, const char* what) {
  if (!t || t->dtype != BRAID_DEVICE_I32 || t->rank != 1)
    invalid(std::string(op) + ": " + what + " must be an I32 vector");
  if (!t->data && t->shape[0] > 0) invalid(std::string(op) + ": " + what + " has no memory");
  return static_cast<const int32_t*>(t->data);
}

// The ids, copied back to the host (waiting for the stream), each checked to be in
// [lowest, rows): a kernel cannot say which one was out of range, and one out of range
// would read or write outside the table. Returns them.
std::vector<int32_t> check_ids(Stream s, const int32_t* ids, int64_t count, int64_t rows, int32_t lowest,
                               const char* op, const char* what) {
  std::vector<int32_t> host(static_cast<size_t>(count));
  if (count == 0) return host;
  braid_cuda::check(cudaMemcpyAsync(host.data(), ids, host.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, s->stream),
                    "cudaMemcpyAsync (ids)");
  braid_cuda::check(cudaStreamSynchronize(s->stream), "cudaStreamSynchronize");
  for (size_t i = 0; i < host.size(); ++i)
    if (host[i] < lowest || host[i] >= rows)
      invalid(std::string(op) + ": " + what + " " + std::to_string(host[i]) + " at position " + std::to_string(i) +
              " is outside [" + std::to_string(lowest) + ", " + std::to_string(rows) + ")");
  return host;
}

int embedding_forward(Stream s, const Tensor* table, const Tensor* ids, Tensor* out, char* e, size_t n) {
  return on_stream(s, e, n, [&] {
    const char* op = "embedding_forward";
    if (f32(table, op, "table").rank != 2) invalid("embedding_forward: table must be (V, E)");
    const int32_t* id = ids_of(ids, op, "ids");
    expect_shape(f32(out, op, "out"), {ids->shape[0], table->shape[1]}, op, "out");
    check_ids(s, id, ids->shape[0], table->shape[0], 0, op, "id");
    braid_cuda::embedding_forward(s->stream, data(*table), id, data(*out), ids->shape[0], table->shape[1]);
  });
}

// The layout braid_cuda::embedding_backward reads: positions grouped by id (a stable counting
// sort), each distinct id's first position in that list (and the end), then the ids.
std::vector<int32_t> positions_by_id(const std::vector<int32_t>& ids) {
  std::vector<int32_t> sorted(ids);
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  const auto distinct = static_cast<int64_t>(sorted.size()), n = static_cast<int64_t>(ids.size());
  std::vector<int32_t> groups(static_cast<size_t>(n + 2 * distinct + 1), 0);
  int32_t* starts = groups.data() + n;
  for (int32_t id : ids) {
    const auto g = std::lower_bound(sorted.begin(), sorted.end(), id) - sorted.begin();
    ++starts[g + 1];
  }
  for (int64_t g = 0; g < distinct; ++g) starts[g + 1] += starts[g];
  std::vector<int32_t> next(starts, starts + distinct);
  for (int32_t i = 0; i < static_cast<int32_t>(n); ++i) {
    const auto g = std::lower_bound(sorted.begin(), sorted.end(), ids[static_cast<size_t>(i)]) - sorted.begin();
    groups[static_cast<size_t>(next[static_cast<size_t>(g)]++)] = i;
  }
  std::copy(sorted.begin(), sorted.end(), groups.begin() + n + distinct + 1);
  return groups;
}

int embedding_backward(Stream s, const Tensor* ids, const Tensor* dout, Tensor* dtable, char* e, size_t n) {
  return on_stream(s, e, n, [&] {
    const char* op = "embedding_backward";
    const int32_t* id = ids_of(ids, op, "ids");
    if (f32(dtable, op, "dtable").rank != 2) invalid("embedding_backward: dtable must be (V, E)");
    if (numel(f32(dout, op, "dout")) != ids->shape[0] * dtable->shape[1] || dout->rank < 1 ||
        dout->shape[dout->rank - 1] != dtable->shape[1])
      invalid("embedding_backward: dout " + braid_cuda::shape_string(*dout) + " is not " +
              std::to_string(ids->shape[0]) + " rows of " + std::to_string(dtable->shape[1]));
    const std::vector<int32_t> groups = positions_by_id(check_ids(s, id, ids->shape[0], dtable->shape[0], 0, op, "id"));
    const int64_t count = ids->shape[0], distinct = (static_cast<int64_t>(groups.size()) - count - 1) / 2;
    Scratch on_device(s, groups.size() * sizeof(int32_t));
    // From pageable memory: the call returns once `groups` is staged, so it may go out of scope.
    braid_cuda::check(cudaMemcpyAsync(on_device.f(), groups.data(), groups.size() * sizeof(int32_t),
                                      cudaMemcpyHostToDevice, s->stream),
                      "cudaMemcpyAsync (embedding groups)");
    braid_cuda::embedding_backward(s->stream, static_cast<const int32_t*>(static_cast<void*>(on_device.f())), distinct,
                                   count, data(*dout), data(*dtable), dtable->shape[1]);
  });
}

// An image batch's grid: images, channels, height, width; P must divide H and W.
struct Grid {
  int64_t images, c, h, w, p;
  int64_t patches() const { return (h / p) * (w / p); }
};

Grid patch_grid(const Tensor& image, int64_t patch, const Tensor& w, const char* op) {
  if (image.rank != 3 && image.rank != 4)
    invalid(std::string(op) + ": image must be (C, H, W) or (B, C, H, W), got " + braid_cuda::shape_string(image));
  const int64_t* s = image.shape + (image.rank - 3);
  const Grid g{image.rank == 4 ? image.shape[0] : 1, s[0], s[1], s[2], patch};
  if (patch <= 0 || g.h == 0 || g.w == 0 || g.h % patch != 0 || g.w % patch != 0)
    invalid(std::string(op) + ": patch size " + std::to_string(patch) + " does not divide the image " +
            braid_cuda::shape_string(image));
  if (w.rank != 2 || w.shape[1] != g.c * patch * patch)
    invalid(std::string(op) + ": weight must be (E, C*P*P) = (E, " + std::to_string(g.c * patch * patch) + "), got " +
            braid_cuda::shape_string(w));
  return g;
}

// The patch rows as a (rows, C*P*P) view over scratch memory.
Tensor rows_view(float* memory, const Grid& g) {
  Tensor t{};
  t.data = memory;
  t.dtype = BRAID_DEVICE_F32;
  t.rank = 2;
  t.shape[0] = g.images * g.patches();
  t.shape[1] = g.c * g.p * g.p;
  return t;
}

Tensor reshaped(const Tensor& t, int64_t rows, int64_t cols) {
  Tensor r = t;
  r.rank = 2;
  r.shape[0] = rows;
  r.shape[1] = cols;
  return r;
}

int patch_embedding_forward(Stream s, const Tensor* image, int64_t patch, const Tensor* w, const Tensor* b, Tensor* out,
                            char* e, size_t n) {
  return on_stream(s, e, n, [&] {
    const char* op = "patch_embedding_forward";
    const Grid g = patch_grid(f32(image, op, "image"), patch, f32(w, op, "weight"), op);
    const int64_t emb = w->shape[0];
    if (image->rank == 4)
      expect_shape(f32(out, op, "out"), {g.images, g.patches(), emb}, op, "out");
    else
      expect_shape(f32(out, op, "out"), {g.patches(), emb}, op, "out");
    Scratch cols(s, static_cast<size_t>(numel(*image)) * sizeof(float));
    braid_cuda::patchify(s->stream, data(*image), cols.f(), g.images, g.c, g.h, g.w, g.p);
    Tensor y = reshaped(*out, g.images * g.patches(), emb);
    linear_forward_on(s, rows_view(cols.f(), g), *w, b, y, op);
  });
}

int patch_embedding_backward(Stream s, const Tensor* image, int64_t patch, const Tensor* w, const Tensor* dout,
                             Tensor* dimage, Tensor* dw, Tensor* db, char* e, size_t n) {
  return on_stream(s, e, n, [&] {
    const char* op = "patch_embedding_backward";
    const Grid g = patch_grid(f32(image, op, "image"), patch, f32(w, op, "weight"), op);
    const int64_t emb = w->shape[0], rows = g.images * g.patches();
    if (image->rank == 4)
      expect_shape(f32(dout, op, "dout"), {g.images, g.patches(), emb}, op, "dout");
    else
      expect_shape(f32(dout, op, "dout"), {g.patches(), emb}, op, "dout");
    if (dimage) expect_same_shape(f32(dimage, op, "dimage"), *image, op, "dimage");
    const size_t bytes = static_cast<size_t>(numel(*image)) * sizeof(float);
    Scratch cols(s, bytes), dcols(s, dimage ? bytes : 0);
    braid_cuda::patchify(s->stream, data(*image), cols.f(), g.images, g.c, g.h, g.w, g.p);
    Tensor dcols_view = rows_view(dcols.f(), g);
    linear_backward_on(s, rows_view(cols.f(), g), *w, reshaped(*dout, rows, emb), dimage ? &dcols_view : nullptr, dw,
                       db, op);
    if (dimage) braid_cuda::unpatchify(s->stream, dcols.f(), data(*dimage), g.images, g.c, g.h, g.w, g.p);
  });
}

// Copies a device value to the host and waits for it.
template <typename T>
T fetch(Stream s, const T* device) {
  T host{};
  braid_cuda::check(cudaMemcpyAsync(&host, device, sizeof(T), cudaMemcpyDeviceToHost, s->stream), "cudaMemcpyAsync");
  braid_cuda::check(cudaStreamSynchronize(s->stream), "cudaStreamSynchronize");
  return host;
}

int cross_entropy(Stream s, const Tensor* logits, const Tensor* targets, int64_t normalizer, Tensor* dlogits,
                  float* loss, char* e, size_t n) {
  return on_stream(s, e, n, [&] {
    const char* op = "cross_entropy";
    if (!loss) invalid("cross_entropy: loss is null");
    const int64_t classes = features(f32(logits, op, "logits"), op, "logits"), rows = numel(*logits) / classes;
    const int32_t* t = ids_of(targets, op, "targets");
    if (targets->shape[0] != rows)
      invalid("cross_entropy: " + std::to_string(targets->shape[0]) + " targets for " + std::to_string(rows) +
              " rows of logits " + braid_cuda::shape_string(*logits));
    if (normalizer < 0) invalid("cross_entropy: negative normalizer");
    if (dlogits) expect_same_shape(f32(dlogits, op, "dlogits"), *logits, op, "dlogits");
    // The targets come back to count the rows and check them, as the host op does.
    int64_t counted = 0;
    for (int32_t target : check_ids(s, t, rows, classes, -1, op, "target"))
      if (target != -1) ++counted;
    const int64_t divide_by = normalizer > 0 ? normalizer : counted;
    if (divide_by == 0) {  // every row ignored: no loss, no gradient
      if (dlogits)
        braid_cuda::check(
            cudaMemsetAsync(dlogits->data, 0, static_cast<size_t>(numel(*dlogits)) * sizeof(float), s->stream),
            "cudaMemsetAsync");
      *loss = 0.0f;
      return;
    }
    const auto scale = static_cast<float>(1.0 / static_cast<double>(divide_by));
    Scratch row_loss(s, static_cast<size_t>(rows + 1) * sizeof(double));
    braid_cuda::cross_entropy_rows(s->stream, data(*logits), t, rows, classes, scale,
                                   dlogits ? data(*dlogits) : nullptr, row_loss.d());
    braid_cuda::sum_doubles(s->stream, row_loss.d(), rows, row_loss.d() + rows);
    *loss = static_cast<float>(fetch(s, row_loss.d() + rows) / static_cast<double>(divide_by));
  });
}

// The contrastive problem's sizes after the host op's checks (check_contrastive_problem).
struct Contrastive {
  int64_t n, total, e, offset, tile;
  bool shared;  // the host's shared layout: local and gathered rows are the same memory
};

Contrastive contrastive_dims(const Tensor* li, const Tensor* lt, const Tensor* ai, const Tensor* at, int64_t offset,
                             float scale, int64_t tile, const char* op) {
  const Tensor& image = f32(li, op, "local_image");
  const Tensor& all = f32(ai, op, "all_image");
  if (image.rank != 2 || all.rank != 2)
    invalid(std::string(op) + ": embeddings must be (rows, E), got " + braid_cuda::shape_string(image) + " and " +
            braid_cuda::shape_string(all));
  const Contrastive c{image.shape[0], all.shape[0], image.shape[1], offset, 0, false};
  expect_shape(f32(lt, op, "local_text"), {c.n, c.e}, op, "local_text");
  expect_shape(all, {c.total, c.e}, op, "all_image");
  expect_shape(f32(at, op, "all_text"), {c.total, c.e}, op, "all_text");
  if (offset < 0 || offset + c.n > c.total)
    invalid(std::string(op) + ": local rows [" + std::to_string(offset) + ", " + std::to_string(offset + c.n) +
            ") are not inside the " + std::to_string(c.total) + " gathered rows");
  if (!std::isfinite(scale)) invalid(std::string(op) + ": the logit scale must be finite");
  if (tile < 0) invalid(std::string(op) + ": negative tile");
  constexpr int64_t kDefaultTile = 512;
  Contrastive out = c;
  out.tile = std::min(tile > 0 ? tile : kDefaultTile, std::max<int64_t>(c.total, 1));
  out.shared = c.n == c.total && li->data == ai->data && lt->data == at->data;
  return out;
}

// The two directions: image -> text (local images against gathered texts) and back.
struct Direction {
  const float* local;
  const float* gathered;
  float* d_local;     // may be null
  float* d_gathered;  // may be null
};

int contrastive_forward(Stream s, const Tensor* li, const Tensor* lt, const Tensor* ai, const Tensor* at,
                        int64_t offset, float scale, int64_t tile, Tensor* stats, double* sum, char* e, size_t n) {
  return on_stream(s, e, n, [&] {
    const char* op = "contrastive_forward";
    const Contrastive c = contrastive_dims(li, lt, ai, at, offset, scale, tile, op);
    expect_shape(f32(stats, op, "stats"), {2, c.n}, op, "stats");
    if (!sum) invalid("contrastive_forward: sum is null");
    *sum = 0.0;
    if (c.n == 0) return;
    const Direction dirs[2] = {{data(*li), data(*at), nullptr, nullptr}, {data(*lt), data(*ai), nullptr, nullptr}};
    Scratch raw(s, static_cast<size_t>(c.n * c.tile) * sizeof(float));
    Scratch row_max(s, static_cast<size_t>(2 * c.n) * sizeof(float));
    Scratch label(s, static_cast<size_t>(2 * c.n) * sizeof(float));
    Scratch row_sum(s, static_cast<size_t>(2 * c.n + 1) * sizeof(double));
    Scratch row_loss(s, static_cast<size_t>(2 * c.n + 1) * sizeof(double));
    if (c.shared) {
      // Rows are image -> text pieces, merged over the tiles; columns whole text -> image rows.
      const size_t pieces = static_cast<size_t>(braid_cuda::contrastive_column_chunks(c.n) * c.tile);
      Scratch part_max(s, pieces * sizeof(float)), part_sum(s, pieces * sizeof(double));
      for (int64_t c0 = 0; c0 < c.total; c0 += c.tile) {
        const int64_t w = std::min(c.tile, c.total - c0);
        braid_cuda::gemm(s, false, true, c.n, w, c.e, 1.0f, data(*li), c.e, data(*at) + c0 * c.e, c.e, 0.0f, raw.f(),
                         w);
        braid_cuda::contrastive_tile_stats(s->stream, raw.f(), c.n, w, scale, c0, 0, c0 == 0, row_max.f(), row_sum.d(),
                                           label.f());
        braid_cuda::contrastive_column_stats(s->stream, raw.f(), c.n, w, scale, c0, part_max.f(), part_sum.d(),
                                             row_max.f() + c.n + c0, row_sum.d() + c.n + c0, label.f() + c.n + c0);
      }
    } else {
      for (int d = 0; d < 2; ++d)
        for (int64_t c0 = 0; c0 < c.total; c0 += c.tile) {
          const int64_t w = std::min(c.tile, c.total - c0);
          braid_cuda::gemm(s, false, true, c.n, w, c.e, 1.0f, dirs[d].local, c.e, dirs[d].gathered + c0 * c.e, c.e,
                           0.0f, raw.f(), w);
          braid_cuda::contrastive_tile_stats(s->stream, raw.f(), c.n, w, scale, c0, c.offset, c0 == 0,
                                             row_max.f() + d * c.n, row_sum.d() + d * c.n, label.f() + d * c.n);
        }
    }
    braid_cuda::contrastive_finish(s->stream, row_max.f(), row_sum.d(), label.f(), 2 * c.n, data(*stats), row_loss.d());
    braid_cuda::sum_doubles(s->stream, row_loss.d(), 2 * c.n, row_loss.d() + 2 * c.n);
    *sum = fetch(s, row_loss.d() + 2 * c.n);
  });
}

int contrastive_backward(Stream s, const Tensor* li, const Tensor* lt, const Tensor* ai, const Tensor* at,
                         int64_t offset, float scale, int64_t tile, const Tensor* stats, double weight, Tensor* dli,
                         Tensor* dlt, Tensor* dai, Tensor* dat, double* d_scale, char* e, size_t n) {
  return on_stream(s, e, n, [&] {
    const char* op = "contrastive_backward";
    const Contrastive c = contrastive_dims(li, lt, ai, at, offset, scale, tile, op);
    expect_shape(f32(stats, op, "stats"), {2, c.n}, op, "stats");
    if (dli) expect_same_shape(f32(dli, op, "d_local_image"), *li, op, "d_local_image");
    if (dlt) expect_same_shape(f32(dlt, op, "d_local_text"), *lt, op, "d_local_text");
    if (dai) expect_same_shape(f32(dai, op, "d_all_image"), *ai, op, "d_all_image");
    if (dat) expect_same_shape(f32(dat, op, "d_all_text"), *at, op, "d_all_text");
    // Local gradients add up over the tiles; gathered rows are written once, by their tile.
    for (Tensor* g : {dli, dlt, dai, dat})
      if (g && numel(*g) > 0)
        braid_cuda::check(cudaMemsetAsync(g->data, 0, static_cast<size_t>(numel(*g)) * sizeof(float), s->stream),
                          "cudaMemsetAsync");
    if (!d_scale) invalid("contrastive_backward: d_scale is null");
    *d_scale = 0.0;
    if (c.n == 0) return;
    const Direction dirs[2] = {{data(*li), data(*at), dli ? data(*dli) : nullptr, dat ? data(*dat) : nullptr},
                               {data(*lt), data(*ai), dlt ? data(*dlt) : nullptr, dai ? data(*dai) : nullptr}};
    Scratch raw(s, static_cast<size_t>(c.n * c.tile) * sizeof(float));
    Scratch d_scale_rows(s, static_cast<size_t>(2 * c.n + 1) * sizeof(double));
    const int64_t rows_of_d_scale = c.shared ? c.n : 2 * c.n;  // shared: one d logits per tile
    if (c.shared) {
      // d L = weight (P_row + P_col - 2 I) per tile, then d I += s dL T[tile], d T[tile] = s
      // dL^T I: each modality's whole gradient into its local view, else its gathered one
      // (the other was zeroed above), as the host's shared layout does.
      float* d_image = dli ? data(*dli) : dai ? data(*dai) : nullptr;
      float* d_text = dlt ? data(*dlt) : dat ? data(*dat) : nullptr;
      for (int64_t c0 = 0; c0 < c.total; c0 += c.tile) {
        const int64_t w = std::min(c.tile, c.total - c0);
        braid_cuda::gemm(s, false, true, c.n, w, c.e, 1.0f, data(*li), c.e, data(*at) + c0 * c.e, c.e, 0.0f, raw.f(),
                         w);
        braid_cuda::contrastive_shared_tile_grad(s->stream, raw.f(), c.n, w, scale, c0, data(*stats),
                                                 data(*stats) + c.n + c0, weight, c0 == 0, d_scale_rows.d());
        if (d_image)
          braid_cuda::gemm(s, false, false, c.n, c.e, w, scale, raw.f(), w, data(*at) + c0 * c.e, c.e, 1.0f, d_image,
                           c.e);
        if (d_text)
          braid_cuda::gemm(s, true, false, w, c.e, c.n, scale, raw.f(), w, data(*li), c.e, 0.0f, d_text + c0 * c.e,
                           c.e);
      }
    } else {
      for (int d = 0; d < 2; ++d)
        for (int64_t c0 = 0; c0 < c.total; c0 += c.tile) {
          const int64_t w = std::min(c.tile, c.total - c0);
          const Direction& dir = dirs[d];
          braid_cuda::gemm(s, false, true, c.n, w, c.e, 1.0f, dir.local, c.e, dir.gathered + c0 * c.e, c.e, 0.0f,
                           raw.f(), w);
          braid_cuda::contrastive_tile_grad(s->stream, raw.f(), c.n, w, scale, c0, c.offset, data(*stats) + d * c.n,
                                            weight, c0 == 0, d_scale_rows.d() + d * c.n);
          // logits = s R: d local += s dL gathered[tile], d gathered[tile] = s dL^T local.
          if (dir.d_local)
            braid_cuda::gemm(s, false, false, c.n, c.e, w, scale, raw.f(), w, dir.gathered + c0 * c.e, c.e, 1.0f,
                             dir.d_local, c.e);
          if (dir.d_gathered)
            braid_cuda::gemm(s, true, false, w, c.e, c.n, scale, raw.f(), w, dir.local, c.e, 0.0f,
                             dir.d_gathered + c0 * c.e, c.e);
        }
    }
    braid_cuda::sum_doubles(s->stream, d_scale_rows.d(), rows_of_d_scale, d_scale_rows.d() + rows_of_d_scale);
    *d_scale = fetch(s, d_scale_rows.d() + rows_of_d_scale);
  });
}

// Both halves in turn: the backward recomputes the tiles (no n x N buffer is kept).
int contrastive_loss(Stream s, const Tensor* li, const Tensor* lt, const Tensor* ai, const Tensor* at, int64_t offset,
                     float scale, int64_t tile, Tensor* stats, double weight, double* sum, Tensor* dli, Tensor* dlt,
                     Tensor* dai, Tensor* dat, double* d_scale, char* e, size_t n) {
  if (int rc = contrastive_forward(s, li, lt, ai, at, offset, scale, tile, stats, sum, e, n)) return rc;
  return contrastive_backward(s, li, lt, ai, at, offset, scale, tile, stats, weight, dli, dlt, dai, dat, d_scale, e, n);
}

int adamw_step(Stream s, Tensor* param, const Tensor* grad, Tensor* m, Tensor* v, int64_t step,
               const braid_adamw_config_v2* c, char* e, size_t n) {
  return on_stream(s, e, n, [&] {
    const char* op = "adamw_step";
    if (step < 1 || !c) invalid("adamw_step: step must be at least 1 and config given");
    expect_same_shape(f32(grad, op, "grad"), f32(param, op, "param"), op, "grad");
    expect_same_shape(f32(m, op, "state.m"), *param, op, "state.m");
    expect_same_shape(f32(v, op, "state.v"), *param, op, "state.v");
    // Every coefficient in double, then once to float, as the host op (and torch.optim.AdamW).
    const double correction1 = 1.0 - std::pow(c->beta1, static_cast<double>(step));
    const double correction2 = 1.0 - std::pow(c->beta2, static_cast<double>(step));
    const braid_cuda::AdamWCoefficients k{static_cast<float>(1.0 - c->lr * c->weight_decay),
                                          static_cast<float>(c->beta1),
                                          static_cast<float>(1.0 - c->beta1),
                                          static_cast<float>(c->beta2),
                                          static_cast<float>(1.0 - c->beta2),
                                          static_cast<float>(c->lr / correction1),
                                          static_cast<float>(std::sqrt(correction2)),
                                          static_cast<float>(c->eps)};
    braid_cuda::adamw(s->stream, data(*param), data(*grad), data(*m), data(*v), numel(*param), k);
  });
}

int squared_norm(Stream s, const Tensor* t, double* result, char* e, size_t n) {
  return on_stream(s, e, n, [&] {
    const Tensor& v = f32(t, "squared_norm", "t");  // checked before anything reads it
    if (!result) invalid("squared_norm: result is null");
    Scratch sums(s, (braid_cuda::kSquaresPartials + 1) * sizeof(double));
    braid_cuda::sum_squares(s->stream, data(v), numel(v), sums.d(), sums.d() + braid_cuda::kSquaresPartials);
    *result = fetch(s, sums.d() + braid_cuda::kSquaresPartials);
  });
}

int scale(Stream s, Tensor* t, float factor, char* e, size_t n) {
  return on_stream(s, e, n, [&] {
    const Tensor& v = f32(t, "scale", "t");  // checked before anything reads it
    braid_cuda::scale(s->stream, data(v), factor, numel(v));
  });
}

}  // namespace

const braid_device_ops_v2 braid_cuda_ops = {linear_forward,
                                            linear_backward,
                                            layernorm_forward,
                                            layernorm_backward,
                                            l2_normalize_forward,
                                            l2_normalize_backward,
                                            add,
                                            gelu_forward,
                                            gelu_backward,
                                            attention_forward,
                                            attention_backward,
                                            embedding_forward,
                                            embedding_backward,
                                            patch_embedding_forward,
                                            patch_embedding_backward,
                                            cross_entropy,
                                            contrastive_forward,
                                            contrastive_backward,
                                            contrastive_loss,
                                            adamw_step,
                                            squared_norm,
                                            scale};

int braid_cuda_supports(int32_t op) { return op >= 0 && op < BRAID_OP_COUNT_V2 ? 1 : 0; }

int braid_cuda_attention_saved_shape(const braid_device_tensor_v2* q, const braid_device_tensor_v2* k, int64_t heads,
                                     int32_t, braid_device_tensor_v2* saved, char* error, size_t size) {
  return guarded(error, size, [&] {
    if (!q || !k || !saved || q->rank != 3 || k->rank != 3 || heads <= 0)
      invalid("attention_saved_shape: q and k must be (B, S, H*D) and heads positive");
    if (q->shape[2] % heads != 0)
      invalid("attention_saved_shape: " + std::to_string(heads) + " heads do not divide the width " +
              std::to_string(q->shape[2]));
    saved->dtype = BRAID_DEVICE_F32;
    saved->rank = 4;
    saved->shape[0] = q->shape[0];
    saved->shape[1] = heads;
    saved->shape[2] = q->shape[1];
    saved->shape[3] = fused(q->shape[2] / heads) ? q->shape[2] / heads + 1 : k->shape[1];
  });
}
