// The device path op by op: every nn::Ops method through a device plugin's v2 table
// (DeviceOps over DeviceBackend) against the host ops on the same random inputs — forward,
// every gradient, parameter gradients accumulated into non-zero tensors, null gradients
// skipped — plus the backend's memory accounting and errors. Runs on each backend named in
// BRAID_DEVICE_TEST_BACKENDS: the host backend in every build (bit-identical to the host
// ops: it runs them), CUDA where a GPU is present (relative error <= 1e-5 in fp32); a
// backend that cannot start is skipped with its reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/nn/contrastive_tiled.hpp"
#include "core/nn/device_ops.hpp"
#include "core/nn/flat_parameters.hpp"
#include "core/nn/host_ops.hpp"
#include "core/nn/staged_ops.hpp"
#include "tests/unit/support.hpp"

#ifndef BRAID_DEVICE_TEST_BACKENDS
#define BRAID_DEVICE_TEST_BACKENDS "host,cuda"
#endif

namespace braid {
namespace {

using nn::Shape;
using nn::Tensor;

std::vector<std::string> backends_under_test() {
  std::vector<std::string> out;
  std::stringstream in(BRAID_DEVICE_TEST_BACKENDS);
  for (std::string name; std::getline(in, name, ',');) out.push_back(name);
  return out;
}

Tensor random_tensor(Shape shape, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  Tensor t(std::move(shape));
  std::uniform_real_distribution<float> u(lo, hi);
  for (float& x : t.data) x = u(rng);
  return t;
}

// The defined part of a contrastive gradient (ops.hpp): the all_* rows with this rank's
// local_* rows added at its offset.
Tensor owned_gradient(const Tensor& local, const Tensor& all, int64_t offset) {
  Tensor sum = all;
  const auto begin = static_cast<std::size_t>(offset * local.dim(1));
  for (std::size_t i = 0; i < local.data.size(); ++i) sum.data[begin + i] += local.data[i];
  return sum;
}

class DeviceOpsTest : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    try {
      backend_ = nn::DeviceBackend::open(GetParam());
    } catch (const Error& e) {
      GTEST_SKIP() << GetParam() << " backend unavailable: " << e.what();
    }
    ops_ = std::make_unique<nn::DeviceOps>(backend_);
    exact_ = GetParam() == "host";
  }

  Tensor up(const Tensor& t) { return backend_->upload(t); }
  Tensor down(const Tensor& t) { return backend_->download(t); }

  // The device result (downloaded) against the host's: bit for bit on the host backend,
  // within 1e-5 of the largest element elsewhere.
  void expect_same(const Tensor& device, const Tensor& host, const char* what) {
    const Tensor got = device.device().is_host() ? device : down(device);
    ASSERT_EQ(got.shape, host.shape) << what;
    double diff = 0.0, scale = 0.0;
    for (std::size_t i = 0; i < host.data.size(); ++i) {
      diff = std::max(diff, std::abs(static_cast<double>(got.data[i]) - host.data[i]));
      scale = std::max(scale, std::abs(static_cast<double>(host.data[i])));
    }
    if (exact_)
      EXPECT_EQ(diff, 0.0) << what << ": the host backend runs the host ops, so results must be identical";
    else
      EXPECT_LE(diff, 1e-5 * std::max(scale, 1e-30)) << what;
  }
  void expect_same(double device, double host, const char* what) {
    if (exact_)
      EXPECT_EQ(device, host) << what;
    else
      EXPECT_NEAR(device, host, 1e-5 * std::max(std::abs(host), 1e-30)) << what;
  }

  std::shared_ptr<nn::DeviceBackend> backend_;
  std::unique_ptr<nn::DeviceOps> ops_;
  nn::HostOps host_;
  std::mt19937 rng_{7};
  bool exact_ = false;
};

// The bias gradient's column sums: a few rows, 70 columns (three of the CUDA kernel's groups of
// 32, the last one partial), and 2100 rows (past the 1024 it sums in one launch).
TEST_P(DeviceOpsTest, LinearBiasGradientsOverFewAndManyRows) {
  for (const auto& [rows, out] : {std::pair<int64_t, int64_t>{7, 70}, {2100, 5}}) {
    SCOPED_TRACE(std::to_string(rows) + " rows of " + std::to_string(out));
    const Tensor x = random_tensor({rows, 4}, rng_), w = random_tensor({out, 4}, rng_),
                 dy = random_tensor({rows, out}, rng_);
    const Tensor db0 = random_tensor({out}, rng_);
    Tensor dx, db = db0, dx_d, db_d = up(db0);
    host_.linear_backward(x, w, dy, &dx, nullptr, &db);
    ops_->linear_backward(up(x), up(w), up(dy), &dx_d, nullptr, &db_d);
    expect_same(db_d, db, "dbias added to");
  }
}

TEST_P(DeviceOpsTest, Linear) {
  const Tensor x = random_tensor({2, 3, 4}, rng_), w = random_tensor({5, 4}, rng_), b = random_tensor({5}, rng_);
  const Tensor dy = random_tensor({2, 3, 5}, rng_);
  const Tensor dw0 = random_tensor({5, 4}, rng_), db0 = random_tensor({5}, rng_);  // earlier microbatches
  Tensor y, dx, dw = dw0, db = db0;
  host_.linear_forward(x, w, &b, y);
  host_.linear_backward(x, w, dy, &dx, &dw, &db);

  Tensor x_d = up(x), w_d = up(w), b_d = up(b), dy_d = up(dy), y_d, dx_d, dw_d = up(dw0), db_d = up(db0);
  ops_->linear_forward(x_d, w_d, &b_d, y_d);
  ops_->linear_backward(x_d, w_d, dy_d, &dx_d, &dw_d, &db_d);
  expect_same(y_d, y, "y");
  expect_same(dx_d, dx, "dx");
  expect_same(dw_d, dw, "dweight added to");
  expect_same(db_d, db, "dbias added to");

  Tensor y_nobias, y_nobias_d;  // no bias; and a frozen weight: only dx
  host_.linear_forward(x, w, nullptr, y_nobias);
  ops_->linear_forward(x_d, w_d, nullptr, y_nobias_d);
  expect_same(y_nobias_d, y_nobias, "y without bias");
  Tensor dx_only_d, dw_untouched_d = up(dw0);
  ops_->linear_backward(x_d, w_d, dy_d, &dx_only_d, nullptr, nullptr);
  expect_same(dx_only_d, dx, "dx alone");
  expect_same(dw_untouched_d, dw0, "a gradient not asked for");
}

// 21 rows, and 1200 (past the 1024 whose parameter gradients the CUDA kernel sums in one launch).
TEST_P(DeviceOpsTest, LayerNorm) {
  for (const Shape& shape : {Shape{3, 7, 6}, Shape{2, 600, 6}}) {
    SCOPED_TRACE(nn::shape_string(shape));
    const Tensor x = random_tensor(shape, rng_, 1.0f, 4.0f), gamma = random_tensor({6}, rng_, 0.5f, 1.5f),
                 beta = random_tensor({6}, rng_), dy = random_tensor(shape, rng_);
    const Tensor dg0 = random_tensor({6}, rng_), db0 = random_tensor({6}, rng_);
    Tensor y, dx, dg = dg0, db = db0;
    nn::LayerNormSaved saved, saved_d;
    host_.layernorm_forward(x, gamma, beta, 1e-5f, y, saved);
    host_.layernorm_backward(x, gamma, saved, dy, &dx, &dg, &db);

    Tensor x_d = up(x), g_d = up(gamma), b_d = up(beta), dy_d = up(dy), y_d, dx_d, dg_d = up(dg0), db_d = up(db0);
    ops_->layernorm_forward(x_d, g_d, b_d, 1e-5f, y_d, saved_d);
    ops_->layernorm_backward(x_d, g_d, saved_d, dy_d, &dx_d, &dg_d, &db_d);
    expect_same(y_d, y, "y");
    expect_same(saved_d.mean, saved.mean, "mean");
    expect_same(saved_d.rstd, saved.rstd, "rstd");
    expect_same(dx_d, dx, "dx");
    expect_same(dg_d, dg, "dgamma added to");
    expect_same(db_d, db, "dbeta added to");
  }
}

TEST_P(DeviceOpsTest, PointwiseOps) {
  Tensor x = random_tensor({4, 9}, rng_, -3.0f, 3.0f);
  const Tensor dy = random_tensor({4, 9}, rng_);
  // GELU's tails, where exp(-2u) overflows without the host's clamp (and 1 - s became inf * 0).
  x.data[0] = -20.0f, x.data[1] = -11.0f, x.data[2] = 12.0f, x.data[3] = 40.0f;
  Tensor x_d = up(x), dy_d = up(dy);
  {
    Tensor y, dx, y_d, dx_d;
    host_.gelu_forward(x, y);
    host_.gelu_backward(x, dy, dx);
    ops_->gelu_forward(x_d, y_d);
    ops_->gelu_backward(x_d, dy_d, dx_d);
    expect_same(y_d, y, "gelu");
    expect_same(dx_d, dx, "gelu dx");
  }
  {
    Tensor y, dx, y_d, dx_d;
    host_.l2_normalize_forward(x, y);
    host_.l2_normalize_backward(x, dy, dx);
    ops_->l2_normalize_forward(x_d, y_d);
    ops_->l2_normalize_backward(x_d, dy_d, dx_d);
    expect_same(y_d, y, "l2_normalize");
    expect_same(dx_d, dx, "l2_normalize dx");
  }
  {
    Tensor sum = x, sum_d = up(x);
    host_.add(sum, dy);
    ops_->add(sum_d, dy_d);
    expect_same(sum_d, sum, "add");
    host_.scale(sum, 0.37f);
    ops_->scale(sum_d, 0.37f);
    expect_same(sum_d, sum, "scale");
    expect_same(ops_->squared_norm(sum_d), host_.squared_norm(sum), "squared_norm");
  }
}

// Small shapes, and one of 100 queries and keys over 2 heads of 40 features: more rows than a
// block of the CUDA fused kernels takes (64), more keys than a tile (32), a head narrower than
// the kernel's register rows (64). Two samples and several heads take the CUDA backend's
// pointer-array GEMMs; one head, or one sample, its strided ones.
TEST_P(DeviceOpsTest, Attention) {
  struct Case {
    int64_t sq, sk, width, heads;
    bool causal;
    int64_t batch = 2;
  };
  // Several row blocks and key tiles; Sq != Sk across tile edges; heads of 17, 40, 96 and 128
  // features (a fused kernel's widths 32, 64 and 128, padded and full).
  for (const Case& c :
       {Case{5, 7, 12, 3, false}, Case{5, 5, 12, 3, true}, Case{100, 100, 80, 2, false}, Case{100, 100, 80, 2, true},
        Case{130, 37, 34, 2, false}, Case{37, 130, 34, 2, false}, Case{40, 90, 192, 2, false},
        Case{70, 70, 256, 2, true}, Case{9, 11, 12, 1, false}, Case{9, 9, 12, 3, true, 1}}) {
    SCOPED_TRACE((c.causal ? "causal, " : "bidirectional, ") + std::to_string(c.sq) + " queries, " +
                 std::to_string(c.heads) + " heads, " + std::to_string(c.batch) + " samples");
    const int64_t sq = c.sq, sk = c.sk;
    const Tensor q = random_tensor({c.batch, sq, c.width}, rng_, -1.5f, 1.5f),
                 k = random_tensor({c.batch, sk, c.width}, rng_, -1.5f, 1.5f),
                 v = random_tensor({c.batch, sk, c.width}, rng_), dout = random_tensor({c.batch, sq, c.width}, rng_);
    const nn::AttentionOptions options{c.heads, c.causal};
    Tensor out, dq, dk, dv, out_d, dq_d, dk_d, dv_d;
    nn::AttentionSaved saved, saved_d;
    host_.attention_forward(q, k, v, options, out, saved);
    host_.attention_backward(q, k, v, options, saved, dout, dq, dk, dv);
    Tensor q_d = up(q), k_d = up(k), v_d = up(v), dout_d = up(dout);
    ops_->attention_forward(q_d, k_d, v_d, options, out_d, saved_d);
    ops_->attention_backward(q_d, k_d, v_d, options, saved_d, dout_d, dq_d, dk_d, dv_d);
    expect_same(out_d, out, "out");
    expect_same(dq_d, dq, "dq");
    expect_same(dk_d, dk, "dk");
    expect_same(dv_d, dv, "dv");
  }
}

TEST_P(DeviceOpsTest, Embeddings) {
  const Tensor table = random_tensor({6, 4}, rng_), dout = random_tensor({2, 3, 4}, rng_);
  const std::vector<int32_t> ids = {1, 5, 1, 0, 3, 1};  // repeats: their gradients add up
  const Tensor dtable0 = random_tensor({6, 4}, rng_);
  Tensor out, dtable = dtable0, out_d, dtable_d = up(dtable0), table_d = up(table);
  host_.embedding_forward(table, ids, out);
  host_.embedding_backward(ids, dout, dtable);
  ops_->embedding_forward(table_d, ids, out_d);
  ops_->embedding_backward(ids, up(dout), dtable_d);
  expect_same(out_d, out, "embedding");
  expect_same(dtable_d, dtable, "dtable added to");

  for (const Shape& shape : {Shape{2, 4, 6}, Shape{3, 2, 4, 6}}) {
    SCOPED_TRACE(nn::shape_string(shape));
    const Tensor image = random_tensor(shape, rng_), w = random_tensor({3, 2 * 2 * 2}, rng_),
                 b = random_tensor({3}, rng_);
    Tensor p, p_d;
    host_.patch_embedding_forward(image, 2, w, &b, p);
    Tensor image_d = up(image), w_d = up(w), b_d = up(b);
    ops_->patch_embedding_forward(image_d, 2, w_d, &b_d, p_d);
    expect_same(p_d, p, "patches");
    const Tensor dp = random_tensor(p.shape, rng_), dw0 = random_tensor(w.shape, rng_), db0 = random_tensor({3}, rng_);
    Tensor dimage, dw = dw0, db = db0, dimage_d, dw_d = up(dw0), db_d = up(db0);
    host_.patch_embedding_backward(image, 2, w, dp, &dimage, &dw, &db);
    ops_->patch_embedding_backward(image_d, 2, w_d, up(dp), &dimage_d, &dw_d, &db_d);
    expect_same(dimage_d, dimage, "dimage");
    expect_same(dw_d, dw, "patch dweight added to");
    expect_same(db_d, db, "patch dbias added to");
  }
}

TEST_P(DeviceOpsTest, CrossEntropy) {
  const Tensor logits = random_tensor({2, 3, 11}, rng_, -2.0f, 2.0f);
  const std::vector<int32_t> targets = {4, -1, 10, 0, -1, 7};
  Tensor dlogits, dlogits_d;
  const float loss = host_.cross_entropy(logits, targets, 9, &dlogits);
  Tensor logits_d = up(logits);
  expect_same(ops_->cross_entropy(logits_d, targets, 9, &dlogits_d), loss, "cross-entropy");
  expect_same(dlogits_d, dlogits, "dlogits");
  expect_same(ops_->cross_entropy(logits_d, targets, 0, nullptr), host_.cross_entropy(logits, targets, 0, nullptr),
              "cross-entropy without a gradient");
}

TEST_P(DeviceOpsTest, ContrastiveLoss) {
  // A rank's share of a batch of 8 spread over 4 ranks (offset 2, 2 rows), and one rank.
  Tensor all_image, all_text;
  host_.l2_normalize_forward(random_tensor({8, 6}, rng_), all_image);
  host_.l2_normalize_forward(random_tensor({8, 6}, rng_), all_text);
  Tensor local_image({2, 6}, std::vector<float>(all_image.data.begin() + 12, all_image.data.begin() + 24));
  Tensor local_text({2, 6}, std::vector<float>(all_text.data.begin() + 12, all_text.data.begin() + 24));
  const Tensor all_image_d = up(all_image), all_text_d = up(all_text), local_image_d = up(local_image),
               local_text_d = up(local_text);
  for (const bool one_rank : {false, true}) {
    SCOPED_TRACE(one_rank ? "one rank" : "rank 1 of 4");
    // One rank passes the same tensors as local and all, on the host and on the device.
    const Tensor& li = one_rank ? all_image : local_image;
    const Tensor& lt = one_rank ? all_text : local_text;
    const Tensor& li_d = one_rank ? all_image_d : local_image_d;
    const Tensor& lt_d = one_rank ? all_text_d : local_text_d;
    const int64_t offset = one_rank ? 0 : 2;
    nn::ContrastiveGrads g, g_d;
    const float l = host_.contrastive_loss(li, lt, all_image, all_text, offset, 2.3f, &g);
    const float l_d = ops_->contrastive_loss(li_d, lt_d, all_image_d, all_text_d, offset, 2.3f, &g_d);
    expect_same(l_d, l, "contrastive loss");
    expect_same(g_d.logit_scale_param, g.logit_scale_param, "d logit scale");
    expect_same(owned_gradient(down(g_d.local_image), down(g_d.all_image), offset),
                owned_gradient(g.local_image, g.all_image, offset), "d image");
    expect_same(owned_gradient(down(g_d.local_text), down(g_d.all_text), offset),
                owned_gradient(g.local_text, g.all_text, offset), "d text");
    expect_same(ops_->contrastive_loss(li_d, lt_d, all_image_d, all_text_d, offset, 2.3f, nullptr), l,
                "contrastive loss without gradients");
  }
}

// The C ABI's halves: forward, then backward from its stats, over several tiles (the last
// one partial): a rank's rows of a gathered batch (the general layout), and one process
// passing the same memory as local and gathered rows (the shared layout, each tile serving
// both directions; the whole gradient of each modality then goes to its local view). The
// last case has more rows than the CUDA column statistics take in one piece (128).
TEST_P(DeviceOpsTest, ContrastiveHalvesOverTiles) {
  struct Case {
    int64_t total, e, tile;
    bool one_process;
  };
  for (const Case& k : {Case{8, 5, 3, false}, Case{8, 5, 3, true}, Case{300, 16, 128, true}}) {
    const int64_t total = k.total, e = k.e, tile = k.tile;
    const bool one_process = k.one_process;
    SCOPED_TRACE((one_process ? "one process (shared layout), " : "rows 2-4 (general layout), ") +
                 std::to_string(total) + " rows");
    Tensor all_image, all_text;
    host_.l2_normalize_forward(random_tensor({total, e}, rng_), all_image);
    host_.l2_normalize_forward(random_tensor({total, e}, rng_), all_text);
    const int64_t n = one_process ? total : 3, offset = one_process ? 0 : 2;
    Tensor local_image(
        {n, e}, std::vector<float>(all_image.data.begin() + offset * e, all_image.data.begin() + (offset + n) * e));
    Tensor local_text({n, e},
                      std::vector<float>(all_text.data.begin() + offset * e, all_text.data.begin() + (offset + n) * e));
    const Tensor& li_host = one_process ? all_image : local_image;  // the same memory when one process
    const Tensor& lt_host = one_process ? all_text : local_text;
    const float scale = 7.5f;
    const double weight = 0.3;
    auto rows = [](const Tensor& t) { return nn::RowsView<const float>{t.ptr(), t.dim(0), t.dim(1), t.dim(1)}; };
    auto rows_w = [](Tensor& t) { return nn::RowsView<float>{t.ptr(), t.dim(0), t.dim(1), t.dim(1)}; };
    nn::ContrastiveProblem p{rows(li_host), rows(lt_host), rows(all_image), rows(all_text), offset, scale, tile, 1};
    Tensor stats({2, n}), gli({n, e}), glt({n, e}), gai({total, e}), gat({total, e});
    const double sum = nn::contrastive_tiled_forward(p, {stats.ptr(), stats.ptr() + n});
    const double d_scale = nn::contrastive_tiled_backward(p, {stats.ptr(), stats.ptr() + n}, weight,
                                                          {rows_w(gli), rows_w(glt), rows_w(gai), rows_w(gat)});

    auto desc = [](const Tensor& t) {
      braid_device_tensor_v2 d{};
      d.data = const_cast<float*>(t.ptr());
      d.dtype = BRAID_DEVICE_F32;
      d.rank = t.rank();
      std::copy(t.shape.begin(), t.shape.end(), d.shape);
      return d;
    };
    const Tensor ai = up(all_image), at = up(all_text), li_own = up(local_image), lt_own = up(local_text);
    const Tensor& li = one_process ? ai : li_own;  // one process: the same device memory
    const Tensor& lt = one_process ? at : lt_own;
    Tensor stats_d = backend_->empty({2, n}), gli_d = backend_->empty({n, e}), glt_d = backend_->empty({n, e}),
           gai_d = backend_->empty({total, e}), gat_d = backend_->empty({total, e});
    braid_device_tensor_v2 a = desc(li), b = desc(lt), c = desc(ai), d = desc(at), s = desc(stats_d), g1 = desc(gli_d),
                           g2 = desc(glt_d), g3 = desc(gai_d), g4 = desc(gat_d);
    char error[512] = "";
    double sum_d = 0, d_scale_d = 0;
    const auto& ops = *backend_->api().ops;
    ASSERT_EQ(ops.contrastive_forward(backend_->stream(), &a, &b, &c, &d, offset, scale, tile, &s, &sum_d, error,
                                      sizeof error),
              0)
        << error;
    ASSERT_EQ(ops.contrastive_backward(backend_->stream(), &a, &b, &c, &d, offset, scale, tile, &s, weight, &g1, &g2,
                                       &g3, &g4, &d_scale_d, error, sizeof error),
              0)
        << error;
    expect_same(sum_d, sum, "sum of cross-entropies");
    expect_same(stats_d, stats, "log-sum-exps");
    expect_same(d_scale_d, d_scale, "d / d scale");
    if (one_process) {  // the shared layout's split is defined too
      expect_same(gli_d, gli, "d local image");
      expect_same(glt_d, glt, "d local text");
      expect_same(gai_d, gai, "d all image (zero)");
      expect_same(gat_d, gat, "d all text (zero)");
    }
    expect_same(owned_gradient(down(gli_d), down(gai_d), offset), owned_gradient(gli, gai, offset), "d image");
    expect_same(owned_gradient(down(glt_d), down(gat_d), offset), owned_gradient(glt, gat, offset), "d text");
    if (one_process) {
      // Without the local views (null), the whole gradient goes to the gathered ones.
      ASSERT_EQ(ops.contrastive_backward(backend_->stream(), &a, &b, &c, &d, offset, scale, tile, &s, weight, nullptr,
                                         nullptr, &g3, &g4, &d_scale_d, error, sizeof error),
                0)
          << error;
      expect_same(gai_d, gli, "d all image, no local view");
      expect_same(gat_d, glt, "d all text, no local view");
    }
    // A wrong stats shape is the caller's mistake, named.
    s.shape[1] = n + 1;
    EXPECT_EQ(ops.contrastive_forward(backend_->stream(), &a, &b, &c, &d, offset, scale, tile, &s, &sum_d, error,
                                      sizeof error),
              BRAID_DEVICE_INVALID_ARGUMENT);
    EXPECT_NE(std::string(error).find("stats"), std::string::npos) << error;
  }
}

TEST_P(DeviceOpsTest, AdamWThreeSteps) {
  Tensor param = random_tensor({4, 5}, rng_), param_d = up(param);
  nn::AdamWState state, state_d;
  const nn::AdamWConfig config{1e-2, 0.9, 0.999, 1e-8, 0.1};
  for (int step = 0; step < 3; ++step) {
    const Tensor grad = random_tensor({4, 5}, rng_);
    host_.adamw_step(param, grad, state, config);
    ops_->adamw_step(param_d, up(grad), state_d, config);
  }
  EXPECT_EQ(state_d.step, 3);
  expect_same(param_d, param, "param after 3 steps");
  expect_same(state_d.m, state.m, "first moment");
  expect_same(state_d.v, state.v, "second moment");
}

// nn::FlatParameters against one call per parameter, on `ops` (`up` puts a host tensor where
// it keeps tensors, `down` brings one back): zeroing and AdamW are elementwise, so the bits
// are the same, also for a member given a new gradient tensor after the layout (it is then
// stepped on its own).
void expect_flat_steps_as_each_alone(nn::Ops& ops, const std::function<Tensor(const Tensor&)>& up,
                                     const std::function<Tensor(const Tensor&)>& down, std::mt19937& rng) {
  const std::vector<std::pair<Shape, bool>> specs{
      {{4, 5}, true}, {{5}, false}, {{3, 7}, true}, {{7}, false}, {{2, 2}, true}};
  const std::size_t n = specs.size();
  std::vector<Tensor> alone(n), flat_values(n), alone_grads(n), flat_grads(n);
  std::vector<nn::AdamWState> alone_states(n), flat_states(n);
  std::vector<nn::FlatMember> members;
  for (std::size_t k = 0; k < n; ++k) {
    const Tensor v = random_tensor(specs[k].first, rng);
    alone[k] = up(v);
    flat_values[k] = up(v);
    ops.zero(alone_grads[k], v.shape);
    ops.zero(flat_grads[k], v.shape);
    members.push_back({&flat_values[k], &flat_grads[k], &flat_states[k], specs[k].second, k != 2});
  }
  nn::FlatParameters flat(ops, members);
  EXPECT_EQ(flat.slices(), n);
  const nn::AdamWConfig config{1e-2, 0.9, 0.999, 1e-8, 0.1};
  for (int step = 0; step < 3; ++step) {
    if (step == 1) flat_grads[1] = up(Tensor(specs[1].first, 5.0f));  // no longer a slice; zeroed below
    flat.zero_grads(ops);
    for (std::size_t k = 0; k < n; ++k) {
      ops.zero(alone_grads[k], specs[k].first);
      const Tensor g = up(random_tensor(specs[k].first, rng));
      ops.add(alone_grads[k], g);
      ops.add(flat_grads[k], g);
    }
    // Clipping: the norm of the members in it (not member 2), then every gradient scaled.
    double alone_norm = 0;
    for (std::size_t k = 0; k < n; ++k)
      if (k != 2) alone_norm += ops.squared_norm(alone_grads[k]);
    EXPECT_NEAR(flat.squared_grad_norm(ops), alone_norm, 1e-12 * alone_norm) << "step " << step;
    const float factor = 0.5f + 0.25f * static_cast<float>(step);
    flat.scale_grads(ops, factor);
    for (std::size_t k = 0; k < n; ++k) {
      ops.scale(alone_grads[k], factor);
      nn::AdamWConfig c = config;
      c.weight_decay = specs[k].second ? config.weight_decay : 0.0;
      ops.adamw_step(alone[k], alone_grads[k], alone_states[k], c);
    }
    flat.adamw_step(ops, config);
  }
  EXPECT_EQ(flat.slices(), n - 1);
  for (std::size_t k = 0; k < n; ++k) {
    SCOPED_TRACE("member " + std::to_string(k));
    EXPECT_EQ(flat_values[k].shape, specs[k].first);
    EXPECT_EQ(down(flat_values[k]).data, down(alone[k]).data);
    EXPECT_EQ(down(flat_states[k].m).data, down(alone_states[k].m).data);
    EXPECT_EQ(down(flat_states[k].v).data, down(alone_states[k].v).data);
    EXPECT_EQ(flat_states[k].step, 3);
  }
}

TEST_P(DeviceOpsTest, FlatParametersStepAsEachParameterAlone) {
  expect_flat_steps_as_each_alone(
      *ops_, [&](const Tensor& t) { return up(t); }, [&](const Tensor& t) { return down(t); }, rng_);
}

TEST_P(DeviceOpsTest, FlatParametersThroughStagedOps) {
  // StagedOps copies each op's outputs back: into the slices, not into new tensors.
  nn::StagedOps staged(backend_);
  auto same = [](const Tensor& t) { return t; };
  expect_flat_steps_as_each_alone(staged, same, same, rng_);
}

TEST(FlatParameters, HostOpsStepAsEachParameterAlone) {
  nn::HostOps ops;
  std::mt19937 rng(3);
  auto same = [](const Tensor& t) { return t; };
  expect_flat_steps_as_each_alone(ops, same, same, rng);
}

TEST(FlatParameters, EachGroupLiesEndToEndInLayoutOrder) {
  // Two modules' parameters, interleaved as given and mixed in weight decay: laid out, each
  // module's gradients are one span in nn::layout_order (decayed first), which its
  // data-parallel all-reduce then sums in place; apart again after a member is given a new
  // tensor, until laid out anew. A member alone in its group does not count.
  nn::HostOps ops;
  std::vector<nn::Parameter> params(7);
  std::vector<nn::AdamWState> states(params.size());
  const bool decay[] = {true, false, true, true, false, false, true};
  const int group[] = {0, 1, 0, 1, 0, 1, 2};
  std::vector<nn::FlatMember> members;
  for (std::size_t k = 0; k < params.size(); ++k) {
    params[k].decay = decay[k];
    params[k].trainable = true;
    params[k].value = Tensor({static_cast<int64_t>(k + 2)});
    params[k].grad = Tensor({static_cast<int64_t>(k + 2)});
    members.push_back({&params[k].value, &params[k].grad, &states[k], decay[k], true, group[k]});
  }
  nn::FlatParameters flat(ops, members);
  auto of_group = [&](int g) {
    std::vector<nn::Parameter*> out;
    for (std::size_t k = 0; k < params.size(); ++k)
      if (group[k] == g) out.push_back(&params[k]);
    return nn::layout_order(out);
  };
  const std::vector<nn::Parameter*> first = of_group(0), second = of_group(1);
  ASSERT_EQ(second.size(), 3u);
  // Decayed first, then as given.
  EXPECT_EQ(second, (std::vector<nn::Parameter*>{&params[3], &params[1], &params[5]}));
  EXPECT_EQ(nn::end_to_end_gradients(first, nn::Device{}), first.front()->grad.ptr());
  EXPECT_EQ(nn::end_to_end_gradients(second, nn::Device{}), second.front()->grad.ptr());
  EXPECT_EQ(nn::end_to_end_gradients(second, nn::Device{nn::DeviceType::emulated, 0}), nullptr);  // not there
  // Not the given order: its members are not end to end.
  EXPECT_EQ(nn::end_to_end_gradients({&params[1], &params[3], &params[5]}, nn::Device{}), nullptr);
  EXPECT_FALSE(flat.group_apart());
  params[6].grad = Tensor({8});  // alone in group 2: still together
  EXPECT_FALSE(flat.group_apart());
  params[3].grad = Tensor({5});
  EXPECT_TRUE(flat.group_apart());
  EXPECT_EQ(nn::end_to_end_gradients(second, nn::Device{}), nullptr);
  EXPECT_NE(nn::end_to_end_gradients(first, nn::Device{}), nullptr);
}

TEST(FlatParameters, ACollectiveInPlaceKeepsTheLayoutAlive) {
  // A posted all-reduce sums the laid-out gradients in place and holds their keeper: a new
  // layout (or the parameters' new tensors) cannot free that memory under it.
  nn::HostOps ops;
  std::vector<nn::Parameter> params(2);
  std::vector<nn::AdamWState> states(2);
  std::vector<nn::Parameter*> pointers;
  for (auto& p : params) {
    p.value = Tensor({3});
    p.grad = Tensor({3});
    pointers.push_back(&p);
  }
  std::optional<nn::FlatParameters> flat(std::in_place, ops, nn::trainable_members(pointers, states));
  float* at = nn::end_to_end_gradients(nn::layout_order(pointers), nn::Device{});
  ASSERT_NE(at, nullptr);
  std::vector<std::shared_ptr<void>> keep = nn::gradient_keepers(pointers);
  ASSERT_EQ(keep.size(), 1u);  // one buffer holds both
  flat.reset();
  for (auto& p : params) p.grad = p.value = Tensor({3});
  for (auto& s : states) s = nn::AdamWState{};
  EXPECT_EQ(keep[0].use_count(), 1);  // the last owner
  at[5] = 2.5f;                       // still memory (ASan would say otherwise)
  EXPECT_EQ(at[5], 2.5f);
  EXPECT_TRUE(nn::gradient_keepers(pointers).empty());  // owned tensors keep themselves
}

TEST(FlatParameters, AMemberWithoutAGradientIsRefused) {
  nn::HostOps ops;
  Tensor value({3}), grad({2});
  nn::AdamWState state;
  auto lay_out = [&](std::vector<nn::FlatMember> members) { nn::FlatParameters(ops, std::move(members)); };
  test::expect_error(
      [&] {
        lay_out({{&value, &grad, &state, true}});
      },
      Status::invalid_argument, {"member 0", "has 3 values but 2 gradients"});
  test::expect_error(
      [&] {
        lay_out({{&value, nullptr, &state, true}});
      },
      Status::invalid_argument, {"member 0", "lacks a value, a gradient"});
  // Numbered as given, though decayed members are laid out first.
  Tensor bias({2}), bias_grad({2});
  nn::AdamWState moments{Tensor({4}), Tensor({3}), 1};
  test::expect_error(
      [&] {
        lay_out({{&bias, &bias_grad, &state, false}, {&value, &value, &moments, true}});
      },
      Status::invalid_argument, {"member 1", "has 3 values but 4 first moments"});
}

TEST_P(DeviceOpsTest, MemoryComesBackToThePool) {
  const Tensor x = random_tensor({64, 32}, rng_), w = random_tensor({16, 32}, rng_);
  const nn::DeviceMemoryStats before = backend_->memory_stats();
  uint64_t reserved_after_first = 0;
  for (int step = 0; step < 3; ++step) {
    Tensor x_d = up(x), w_d = up(w), y_d;
    ops_->linear_forward(x_d, w_d, nullptr, y_d);
    const nn::DeviceMemoryStats during = backend_->memory_stats();
    EXPECT_GE(during.in_use - before.in_use, (64 * 32 + 16 * 32 + 64 * 16) * sizeof(float));
    if (step == 0) reserved_after_first = backend_->memory_stats().reserved;
    backend_->synchronize();
  }
  const nn::DeviceMemoryStats after = backend_->memory_stats();
  EXPECT_EQ(after.in_use, before.in_use) << "every tensor gave its memory back";
  EXPECT_EQ(after.reserved, reserved_after_first) << "steps after the first are served from the cache";
  EXPECT_GE(after.allocations - before.allocations, 9u);
  EXPECT_GE(after.peak_in_use, (64 * 32 + 16 * 32 + 64 * 16) * sizeof(float));
}

TEST_P(DeviceOpsTest, FreeingTwiceIsAnError) {
  const auto& api = backend_->api();
  char error[512] = "";
  void* p = nullptr;
  ASSERT_EQ(api.alloc(0, 1000, backend_->stream(), &p, error, sizeof error), 0) << error;
  ASSERT_EQ(api.free(0, p, backend_->stream(), error, sizeof error), 0) << error;
  EXPECT_NE(api.free(0, p, backend_->stream(), error, sizeof error), 0);
  EXPECT_NE(std::string(error).find("did not allocate"), std::string::npos) << error;
  EXPECT_EQ(api.free(0, nullptr, backend_->stream(), error, sizeof error), 0) << "free(NULL) does nothing";
}

// The raw interface refuses what it cannot do with a code and a message, never a crash: sizes
// past the address space, NULL outputs, pointers its pool did not hand out, shapes whose
// element count overflows; and an op refused for an output's shape has written nothing.
TEST_P(DeviceOpsTest, BadArgumentsAreRefusedAndChangeNothing) {
  const auto& api = backend_->api();
  braid_device_stream_v2 s = backend_->stream();
  char error[512] = "";
  const uint64_t in_use = backend_->memory_stats().in_use;
  void* p = nullptr;
  EXPECT_NE(api.alloc(0, SIZE_MAX, s, &p, error, sizeof error), 0) << "the host pool's rounding overflowed to 64 bytes";
  EXPECT_EQ(backend_->memory_stats().in_use, in_use);
  EXPECT_EQ(api.alloc(0, 16, s, nullptr, error, sizeof error), BRAID_DEVICE_INVALID_ARGUMENT);
  EXPECT_NE(std::string(error).find("alloc: ptr is NULL"), std::string::npos) << error;
  EXPECT_EQ(api.device_count(nullptr, error, sizeof error), BRAID_DEVICE_INVALID_ARGUMENT);
  EXPECT_EQ(api.copy(nullptr, error, 16, BRAID_COPY_HOST_TO_DEVICE, s, error, sizeof error),
            BRAID_DEVICE_INVALID_ARGUMENT);
  EXPECT_EQ(api.memset_zero(nullptr, 16, s, error, sizeof error), BRAID_DEVICE_INVALID_ARGUMENT);
  EXPECT_EQ(api.stream_create(0, nullptr, error, sizeof error), BRAID_DEVICE_INVALID_ARGUMENT);
  EXPECT_EQ(api.event_create(0, nullptr, error, sizeof error), BRAID_DEVICE_INVALID_ARGUMENT);
  // Pointers the pool did not hand out: the host pool read a header before any of them.
  int local = 0;
  EXPECT_NE(api.free(0, &local, s, error, sizeof error), 0);
  ASSERT_EQ(api.alloc(0, 256, s, &p, error, sizeof error), 0) << error;
  EXPECT_EQ(backend_->memory_stats().in_use, in_use + 256) << "in use counts the bytes asked for";
  EXPECT_NE(api.free(0, static_cast<char*>(p) + 64, s, error, sizeof error), 0);
  EXPECT_EQ(api.free(0, p, s, error, sizeof error), 0) << error;
  EXPECT_EQ(backend_->memory_stats().in_use, in_use);
  test::expect_error([&] { backend_->empty({int64_t{1} << 62}); }, Status::invalid_argument, {"more bytes than fit"});
  test::expect_error(
      [&] {
        backend_->empty({int64_t{1} << 40, int64_t{1} << 40});
      },
      Status::invalid_argument, {"more elements than 2^63"});
  // linear_backward with dx of another shape than x: refused before dweight is added to.
  Tensor x_d = up(random_tensor({2, 3}, rng_)), w_d = up(random_tensor({2, 3}, rng_));
  Tensor dy_d = up(random_tensor({2, 2}, rng_)), dx_d = backend_->empty({3, 2});
  Tensor dw_d = up(Tensor(Shape{2, 3}, 1.0f));
  const auto view = [](Tensor& t) {
    braid_device_tensor_v2 v{t.ptr(), BRAID_DEVICE_F32, static_cast<int32_t>(t.shape.size()), {}};
    std::copy(t.shape.begin(), t.shape.end(), v.shape);
    return v;
  };
  braid_device_tensor_v2 x = view(x_d), w = view(w_d), dy = view(dy_d), dx = view(dx_d), dw = view(dw_d);
  EXPECT_EQ(api.ops->linear_backward(s, &x, &w, &dy, &dx, &dw, nullptr, error, sizeof error),
            BRAID_DEVICE_INVALID_ARGUMENT);
  EXPECT_NE(std::string(error).find("dx"), std::string::npos) << error;
  backend_->synchronize();
  EXPECT_EQ(down(dw_d).data, std::vector<float>(6, 1.0f)) << "dweight was added to by a refused call";
  // Outputs of the right size but another shape: refused before anything is written (the host
  // plugin wrote them, then refused).
  Tensor wide_d = up(Tensor(Shape{3, 2}, 7.0f)), flat_d = up(Tensor(Shape{4}, 7.0f));
  braid_device_tensor_v2 wide = view(wide_d), flat = view(flat_d);
  const std::vector<int32_t> targets = {0, 1};
  braid_device_tensor_v2 t{nullptr, BRAID_DEVICE_I32, 1, {2}};
  const nn::DeviceIds targets_d = backend_->upload_ids(targets);
  t.data = targets_d.data();
  float loss = 0;
  for (const auto& [name, rc] :
       {std::pair{"gelu_forward y", api.ops->gelu_forward(s, &x, &wide, error, sizeof error)},
        std::pair{"linear_forward y", api.ops->linear_forward(s, &x, &w, nullptr, &flat, error, sizeof error)},
        std::pair{"cross_entropy dlogits", api.ops->cross_entropy(s, &x, &t, 2, &wide, &loss, error, sizeof error)}}) {
    EXPECT_EQ(rc, BRAID_DEVICE_INVALID_ARGUMENT) << name;
    backend_->synchronize();
    EXPECT_EQ(down(wide_d).data, std::vector<float>(6, 7.0f)) << name << " wrote into an output it refused";
    EXPECT_EQ(down(flat_d).data, std::vector<float>(4, 7.0f)) << name << " wrote into an output it refused";
  }
}

TEST_P(DeviceOpsTest, OutputsAreReusedAndCopiesAreExplicit) {
  const Tensor x = random_tensor({8, 4}, rng_), w = random_tensor({3, 4}, rng_);
  Tensor x_d = up(x), w_d = up(w), y_d;
  ops_->linear_forward(x_d, w_d, nullptr, y_d);
  const float* first = y_d.ptr();
  ops_->linear_forward(x_d, w_d, nullptr, y_d);
  EXPECT_EQ(y_d.ptr(), first) << "an output already on the device with the right size is written in place";
  EXPECT_EQ(y_d.device(), backend_->device());
  if (!backend_->device().is_host()) {
    test::expect_error(
        [&] {
          Tensor y;
          ops_->linear_forward(x, w_d, nullptr, y);
        },
        Status::invalid_argument, {"linear_forward: x is on host", "upload it first"});
    // A copy is made on the device, by the backend that holds the original.
    const Tensor copy = y_d;
    EXPECT_NE(copy.ptr(), y_d.ptr());
    EXPECT_EQ(copy.device(), y_d.device());
    expect_same(copy, down(y_d), "the copy");
  }
}

TEST_P(DeviceOpsTest, BadShapesNameTheOpAndTheArgument) {
  Tensor x_d = up(random_tensor({2, 4}, rng_)), w_d = up(random_tensor({3, 5}, rng_)), y_d;
  test::expect_error([&] { ops_->linear_forward(x_d, w_d, nullptr, y_d); }, Status::invalid_argument,
                     {backend_->name() + " backend", "linear_forward", "x"});
  Tensor table_d = up(random_tensor({4, 2}, rng_)), out_d;
  const std::vector<int32_t> ids = {0, 4};
  test::expect_error([&] { ops_->embedding_forward(table_d, ids, out_d); }, Status::invalid_argument,
                     {"embedding_forward", "4"});
}

TEST_P(DeviceOpsTest, StreamsAndEventsOrderWork) {
  const auto& api = backend_->api();
  char error[512] = "";
  braid_device_stream_v2 other = nullptr;
  braid_device_event_v2 done = nullptr;
  ASSERT_EQ(api.stream_create(0, &other, error, sizeof error), 0) << error;
  ASSERT_EQ(api.event_create(0, &done, error, sizeof error), 0) << error;
  const Tensor x = random_tensor({256}, rng_);
  Tensor a = up(x), b = backend_->empty({256});
  // Copy a -> b on the backend's stream, then make `other` wait for it and read b there.
  backend_->copy(b, a);
  ASSERT_EQ(api.event_record(done, backend_->stream(), error, sizeof error), 0) << error;
  ASSERT_EQ(api.stream_wait_event(other, done, error, sizeof error), 0) << error;
  Tensor back(Shape{256});
  ASSERT_EQ(api.copy(back.ptr(), b.ptr(), 256 * sizeof(float), BRAID_COPY_DEVICE_TO_HOST, other, error, sizeof error),
            0)
      << error;
  ASSERT_EQ(api.stream_synchronize(other, error, sizeof error), 0) << error;
  ASSERT_EQ(api.event_synchronize(done, error, sizeof error), 0) << error;
  EXPECT_EQ(back.data, x.data);
  EXPECT_EQ(api.event_destroy(done, error, sizeof error), 0) << error;
  EXPECT_EQ(api.stream_destroy(other, error, sizeof error), 0) << error;
}

TEST_P(DeviceOpsTest, SupportsEveryOp) {
  const char* names[BRAID_OP_COUNT_V2] = {"linear_forward",
                                          "linear_backward",
                                          "layernorm_forward",
                                          "layernorm_backward",
                                          "l2_normalize_forward",
                                          "l2_normalize_backward",
                                          "add",
                                          "gelu_forward",
                                          "gelu_backward",
                                          "attention_forward",
                                          "attention_backward",
                                          "embedding_forward",
                                          "embedding_backward",
                                          "patch_embedding_forward",
                                          "patch_embedding_backward",
                                          "cross_entropy",
                                          "contrastive_loss",
                                          "adamw_step",
                                          "squared_norm",
                                          "scale"};
  for (int op = 0; op < BRAID_OP_COUNT_V2; ++op)
    EXPECT_TRUE(backend_->supports(static_cast<braid_device_op_v2>(op))) << names[op];
  EXPECT_FALSE(backend_->api().supports(BRAID_OP_COUNT_V2));
  EXPECT_NO_THROW(backend_->plugin().self_test(0));
}

TEST(Storage, ViewsKeepTheirSizeAndSharedHostMemoryIsLetGo) {
  std::vector<float> buffer = {1, 2, 3, 4};
  Tensor view;
  view.shape = {4};
  view.data = nn::Storage::borrow(buffer.data(), 4, nn::Device{});
  nn::reset(view, {2, 2});  // the same count: zeroed in place
  EXPECT_EQ(buffer, std::vector<float>(4, 0.0f));
  test::expect_error([&] { nn::reset(view, {3}); }, Status::invalid_argument, {"holds 4 elements", "cannot hold 3"});

  auto memory = std::make_shared<std::vector<float>>(4, 1.0f);
  Tensor shared;
  shared.data = nn::Storage::borrow(memory->data(), 4, nn::Device{}, memory);
  nn::reset(shared, {6});  // another size: a vector of its own, the shared memory untouched
  EXPECT_FALSE(shared.data.borrowed());
  EXPECT_EQ(shared.numel(), 6);
  EXPECT_EQ(*memory, std::vector<float>(4, 1.0f));

  Tensor grown;  // resizing keeps what fits, as a vector does
  grown.data = nn::Storage::borrow(memory->data(), 4, nn::Device{}, memory);
  grown.data.resize(6, 5.0f);
  EXPECT_EQ(std::vector<float>(grown.data.begin(), grown.data.end()), (std::vector<float>{1, 1, 1, 1, 5, 5}));

  Tensor copy;
  copy.data = nn::Storage::borrow(buffer.data(), 4, nn::Device{});
  Tensor deep = copy;  // host memory copies into a vector
  EXPECT_FALSE(deep.data.borrowed());
  Tensor moved = std::move(copy);
  EXPECT_TRUE(moved.data.borrowed());
  EXPECT_TRUE(copy.data.empty());  // NOLINT: the moved-from storage is empty, host

  float device_memory[2] = {0, 0};  // stands for GPU memory: never read from the host
  Tensor on_gpu;
  on_gpu.data = nn::Storage::borrow(device_memory, 2, nn::Device{nn::DeviceType::cuda, 1});
  EXPECT_EQ(on_gpu.device().name(), "cuda:1");
  test::expect_error([&] { Tensor c = on_gpu; }, Status::invalid_argument, {"cuda:1", "copy it with its backend"});
  test::expect_error([&] { nn::reset(on_gpu, {2}); }, Status::invalid_argument, {"cannot fill memory on cuda:1"});
}

TEST(Storage, OutputsWrittenWholeKeepTheirMemoryAndAreNotZeroed) {
  Tensor out({2, 3}, 7.0f);
  const float* memory = out.ptr();
  nn::prepare_output(out, {3, 2});  // the same count: the same memory, the shape changed
  EXPECT_EQ(out.ptr(), memory);
  EXPECT_EQ(out.shape, (nn::Shape{3, 2}));
#ifdef NDEBUG
  EXPECT_EQ(out.data[0], 7.0f);  // not zeroed: the op writes every element
#else
  EXPECT_TRUE(std::isnan(out.data[5]));  // debug builds: a read before the write shows
#endif
  nn::prepare_output(out, {4, 4});
  EXPECT_EQ(out.numel(), 16);
  nn::prepare_output(out, {2});  // smaller: kept in the same buffer
  EXPECT_EQ(out.numel(), 2);
  // Views keep their size; reset still zeroes, and a grown vector still fills what it adds.
  std::vector<float> buffer(4, 1.0f);
  Tensor view;
  view.data = nn::Storage::borrow(buffer.data(), 4, nn::Device{});
  test::expect_error([&] { nn::prepare_output(view, {3}); }, Status::invalid_argument, {"cannot hold 3"});
  nn::reset(out, {5});
  EXPECT_EQ(std::vector<float>(out.data.begin(), out.data.end()), std::vector<float>(5, 0.0f));
  out.data.resize(7, 2.0f);
  EXPECT_EQ(out.data[6], 2.0f);
  // A linear layer's output over a buffer that held other values is the product alone.
  nn::HostOps ops(1);
  const Tensor x({1, 2}, std::vector<float>{1, 2}), w({2, 2}, std::vector<float>{1, 0, 0, 1});
  Tensor y({1, 2}, 9.0f);
  ops.linear_forward(x, w, nullptr, y);
  EXPECT_EQ(std::vector<float>(y.data.begin(), y.data.end()), (std::vector<float>{1, 2}));
}

INSTANTIATE_TEST_SUITE_P(Backends, DeviceOpsTest, testing::ValuesIn(backends_under_test()),
                         [](const testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace braid
