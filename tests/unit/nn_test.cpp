// The reference ops (core/nn): finite-difference checks of every input and parameter
// gradient, forwards against direct formulas, AdamW and clipping against hand-computed
// values, the distributed contrastive loss and tensor-parallel shards against the
// single-device results, and results that do not depend on the thread count.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "core/nn/host_ops.hpp"
#include "core/nn/optim.hpp"
#include "core/nn/tensor_parallel.hpp"
#include "tests/unit/support.hpp"

namespace braid {
namespace {

using nn::Shape;
using nn::Tensor;

Tensor random_tensor(Shape shape, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  Tensor t(std::move(shape));
  std::uniform_real_distribution<float> u(lo, hi);
  for (float& x : t.data) x = u(rng);
  return t;
}

// sum(y * w) in double: a scalar whose gradient with respect to y is w.
double dot(const Tensor& y, const Tensor& w) {
  EXPECT_EQ(y.shape, w.shape);
  double s = 0.0;
  for (std::size_t i = 0; i < y.data.size(); ++i) s += static_cast<double>(y.data[i]) * w.data[i];
  return s;
}

double max_abs(const Tensor& t) {
  double m = 0.0;
  for (float x : t.data) m = std::max(m, static_cast<double>(std::abs(x)));
  return m;
}

// max |a - b| / max |b|: a relative error that tiny elements cannot inflate.
double relative_error(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape, b.shape);
  double diff = 0.0;
  for (std::size_t i = 0; i < a.data.size(); ++i)
    diff = std::max(diff, std::abs(static_cast<double>(a.data[i]) - b.data[i]));
  return diff / std::max(max_abs(b), 1e-30);
}

// Central differences of loss() (which reruns the forward) for every element of x against
// the analytic gradient. Errors are relative to max(1, |numeric|); the analytic gradient
// must not be trivially zero.
void expect_gradient(const char* what, Tensor& x, const Tensor& analytic, const std::function<double()>& loss,
                     float eps = 1e-2f, double tolerance = 1e-3) {
  ASSERT_EQ(x.shape, analytic.shape) << what;
  EXPECT_GT(max_abs(analytic), 1e-3) << what << ": the gradient is zero, the check would prove nothing";
  double worst = 0.0, worst_numeric = 0.0;
  std::size_t worst_at = 0;
  for (std::size_t i = 0; i < x.data.size(); ++i) {
    const float saved = x.data[i];
    const float up = saved + eps, down = saved - eps;
    x.data[i] = up;
    const double plus = loss();
    x.data[i] = down;
    const double minus = loss();
    x.data[i] = saved;
    const double numeric = (plus - minus) / (static_cast<double>(up) - down);
    const double error = std::abs(numeric - analytic.data[i]) / std::max(1.0, std::abs(numeric));
    if (error > worst) {
      worst = error;
      worst_numeric = numeric;
      worst_at = i;
    }
  }
  EXPECT_LE(worst, tolerance) << what << ": element " << worst_at << " analytic " << analytic.data[worst_at]
                              << " numeric " << worst_numeric;
}

TEST(NnLinear, ForwardAndGradients) {
  std::mt19937 rng(1);
  nn::HostOps ops(1);
  Tensor x = random_tensor({2, 3, 4}, rng), w = random_tensor({5, 4}, rng), b = random_tensor({5}, rng);
  Tensor y;
  ops.linear_forward(x, w, &b, y);
  ASSERT_EQ(y.shape, (Shape{2, 3, 5}));
  for (int r = 0; r < 6; ++r)
    for (int o = 0; o < 5; ++o) {
      double expect = b.data[o];
      for (int i = 0; i < 4; ++i) expect += static_cast<double>(x.data[r * 4 + i]) * w.data[o * 4 + i];
      EXPECT_NEAR(y.data[r * 5 + o], expect, 1e-5);
    }
  const Tensor dy = random_tensor(y.shape, rng);
  Tensor dx, dw(w.shape), db(b.shape);
  ops.linear_backward(x, w, dy, &dx, &dw, &db);
  auto loss = [&] {
    Tensor out;
    ops.linear_forward(x, w, &b, out);
    return dot(out, dy);
  };
  expect_gradient("linear dx", x, dx, loss);
  expect_gradient("linear dweight", w, dw, loss);
  expect_gradient("linear dbias", b, db, loss);

  // Parameter gradients add up over calls; input gradients are overwritten.
  ops.linear_backward(x, w, dy, &dx, &dw, &db);
  Tensor dw_once(w.shape);
  ops.linear_backward(x, w, dy, nullptr, &dw_once, nullptr);
  ops.scale(dw_once, 2.0f);
  EXPECT_LT(relative_error(dw, dw_once), 1e-6);

  Tensor y_no_bias;
  ops.linear_forward(x, w, nullptr, y_no_bias);
  EXPECT_NEAR(y.data[7] - y_no_bias.data[7], b.data[2], 1e-6);
  test::expect_error(
      [&] {
        ops.linear_forward(random_tensor({2, 3}, rng), w, &b, y);
      },
      Status::invalid_argument, {"linear_forward", "(2, 3)", "(5, 4)"});
}

TEST(NnLayerNorm, ForwardAndGradients) {
  std::mt19937 rng(2);
  nn::HostOps ops(1);
  Tensor x = random_tensor({3, 6}, rng, 1.0f, 4.0f);  // a large mean: the centring must matter
  Tensor gamma = random_tensor({6}, rng, 0.5f, 1.5f), beta = random_tensor({6}, rng);
  Tensor y;
  nn::LayerNormSaved saved;
  ops.layernorm_forward(x, Tensor({6}, 1.0f), Tensor({6}), 1e-5f, y, saved);
  for (int r = 0; r < 3; ++r) {
    double mean = 0.0, var = 0.0;
    for (int i = 0; i < 6; ++i) mean += y.data[r * 6 + i] / 6.0;
    for (int i = 0; i < 6; ++i) var += (y.data[r * 6 + i] - mean) * (y.data[r * 6 + i] - mean) / 6.0;
    EXPECT_NEAR(mean, 0.0, 1e-6);
    EXPECT_NEAR(var, 1.0, 1e-3);
  }
  ops.layernorm_forward(x, gamma, beta, 1e-5f, y, saved);
  const Tensor dy = random_tensor(y.shape, rng);
  Tensor dx, dgamma(gamma.shape), dbeta(beta.shape);
  ops.layernorm_backward(x, gamma, saved, dy, &dx, &dgamma, &dbeta);
  auto loss = [&] {
    Tensor out;
    nn::LayerNormSaved s;
    ops.layernorm_forward(x, gamma, beta, 1e-5f, out, s);
    return dot(out, dy);
  };
  expect_gradient("layernorm dx", x, dx, loss);
  expect_gradient("layernorm dgamma", gamma, dgamma, loss);
  expect_gradient("layernorm dbeta", beta, dbeta, loss);
}

TEST(NnL2Normalize, ForwardAndGradient) {
  std::mt19937 rng(3);
  nn::HostOps ops(1);
  Tensor x = random_tensor({3, 5}, rng), y;
  ops.l2_normalize_forward(x, y);
  for (int r = 0; r < 3; ++r) {
    double sq = 0.0;
    for (int i = 0; i < 5; ++i) sq += y.data[r * 5 + i] * y.data[r * 5 + i];
    EXPECT_NEAR(sq, 1.0, 1e-6);
  }
  const Tensor dy = random_tensor(y.shape, rng);
  Tensor dx;
  ops.l2_normalize_backward(x, dy, dx);
  expect_gradient("l2_normalize dx", x, dx, [&] {
    Tensor out;
    ops.l2_normalize_forward(x, out);
    return dot(out, dy);
  });
}

TEST(NnGelu, TanhApproximationAndGradient) {
  std::mt19937 rng(4);
  nn::HostOps ops(1);
  Tensor y;
  ops.gelu_forward(Tensor({3}, {0.0f, 1.0f, -1.0f}), y);
  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) at 0, 1, -1 (the exact GELU(1) is 0.841345).
  EXPECT_NEAR(y.data[0], 0.0, 1e-7);
  EXPECT_NEAR(y.data[1], 0.8411920, 1e-6);
  EXPECT_NEAR(y.data[2], -0.1588080, 1e-6);
  Tensor x = random_tensor({4, 5}, rng, -3.0f, 3.0f);
  const Tensor dy = random_tensor(x.shape, rng);
  Tensor dx;
  ops.gelu_backward(x, dy, dx);
  expect_gradient("gelu dx", x, dx, [&] {
    Tensor out;
    ops.gelu_forward(x, out);
    return dot(out, dy);
  });
}

// The vectorised GELU (x * sigmoid(2u)) against the formula in double, element by element, on
// [-10, 10]: relative error within 1e-5 (float rounding of u, amplified by |2u|) even far into
// the negative tail, where 1 + tanh(u) in float cancels to nothing; and every element the same
// whatever its position or the thread count.
TEST(NnGelu, AccurateInTheTailsAndIndependentOfLayout) {
  const int64_t n = 2001;  // odd: a padded tail
  Tensor x({n});
  for (int64_t i = 0; i < n; ++i) x.data[static_cast<std::size_t>(i)] = -10.0f + 0.01f * static_cast<float>(i);
  const Tensor dy(x.shape, 1.0f);
  nn::HostOps one(1), three(3);
  Tensor y, y3, dx, dx3;
  one.gelu_forward(x, y);
  three.gelu_forward(x, y3);
  one.gelu_backward(x, dy, dx);
  three.gelu_backward(x, dy, dx3);
  const double c = std::sqrt(2.0 / 3.14159265358979323846), a = 0.044715;
  for (int64_t i = 0; i < n; ++i) {
    const auto k = static_cast<std::size_t>(i);
    // 0.5 v (1 + tanh u) = v sigmoid(2u), in double without its own cancellation.
    const double v = x.data[k], u = c * (v + a * v * v * v), e = std::exp(-2.0 * u), s = 1.0 / (1.0 + e);
    const double want_y = v * s;
    const double want_dx = s + 2.0 * v * s * (e * s) * c * (1.0 + 3.0 * a * v * v);
    EXPECT_LE(std::abs(y.data[k] - want_y), 1e-5 * std::abs(want_y) + 1e-37) << "gelu(" << v << ")";
    EXPECT_LE(std::abs(dx.data[k] - want_dx), 1e-5 * std::abs(want_dx) + 1e-6) << "gelu'(" << v << ")";
    EXPECT_EQ(y.data[k], y3.data[k]);
    EXPECT_EQ(dx.data[k], dx3.data[k]);
    Tensor alone, alone_dx;  // the element by itself, in lane 0 of a padded tail
    one.gelu_forward(Tensor({1}, {x.data[k]}), alone);
    one.gelu_backward(Tensor({1}, {x.data[k]}), Tensor({1}, {1.0f}), alone_dx);
    EXPECT_EQ(alone.data[0], y.data[k]);
    EXPECT_EQ(alone_dx.data[0], dx.data[k]);
  }
}

// Attention written out in double, one (batch, head, query) at a time.
Tensor reference_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t heads, bool causal) {
  const int64_t batch = q.dim(0), sq = q.dim(1), sk = k.dim(1), width = q.dim(2), d = width / heads;
  Tensor out(q.shape);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < sq; ++i) {
        const int64_t n = causal ? i + 1 : sk;
        std::vector<double> p(static_cast<std::size_t>(n));
        double top = -1e300, sum = 0.0;
        for (int64_t j = 0; j < n; ++j) {
          double s = 0.0;
          for (int64_t c = 0; c < d; ++c)
            s += static_cast<double>(q.data[(b * sq + i) * width + h * d + c]) *
                 k.data[(b * sk + j) * width + h * d + c];
          p[j] = s / std::sqrt(static_cast<double>(d));
          top = std::max(top, p[j]);
        }
        for (double& s : p) sum += s = std::exp(s - top);
        for (int64_t c = 0; c < d; ++c) {
          double o = 0.0;
          for (int64_t j = 0; j < n; ++j) o += p[j] / sum * v.data[(b * sk + j) * width + h * d + c];
          out.data[(b * sq + i) * width + h * d + c] = static_cast<float>(o);
        }
      }
  return out;
}

void check_attention(int64_t sq, int64_t sk, bool causal, unsigned seed) {
  SCOPED_TRACE(causal ? "causal" : "bidirectional");
  std::mt19937 rng(seed);
  nn::HostOps ops(2);
  const nn::AttentionOptions options{2, causal};
  Tensor q = random_tensor({2, sq, 6}, rng, -1.5f, 1.5f), k = random_tensor({2, sk, 6}, rng, -1.5f, 1.5f),
         v = random_tensor({2, sk, 6}, rng);
  Tensor out;
  nn::AttentionSaved saved;
  ops.attention_forward(q, k, v, options, out, saved);
  EXPECT_LT(relative_error(out, reference_attention(q, k, v, 2, causal)), 1e-5);
  const Tensor dout = random_tensor(out.shape, rng);
  Tensor dq, dk, dv;
  ops.attention_backward(q, k, v, options, saved, dout, dq, dk, dv);
  auto loss = [&] {
    Tensor o;
    nn::AttentionSaved s;
    ops.attention_forward(q, k, v, options, o, s);
    return dot(o, dout);
  };
  expect_gradient("attention dq", q, dq, loss);
  expect_gradient("attention dk", k, dk, loss);
  expect_gradient("attention dv", v, dv, loss);
}

TEST(NnAttention, BidirectionalForwardAndGradients) { check_attention(4, 4, false, 5); }
TEST(NnAttention, CausalForwardAndGradients) { check_attention(4, 4, true, 6); }
TEST(NnAttention, CrossAttentionWithOtherKeyLength) { check_attention(3, 5, false, 7); }

TEST(NnAttention, CausalIgnoresLaterKeys) {
  std::mt19937 rng(8);
  nn::HostOps ops(1);
  const nn::AttentionOptions options{2, true};
  Tensor q = random_tensor({1, 4, 6}, rng), k = random_tensor({1, 4, 6}, rng), v = random_tensor({1, 4, 6}, rng);
  Tensor before, after;
  nn::AttentionSaved saved;
  ops.attention_forward(q, k, v, options, before, saved);
  for (int c = 0; c < 6; ++c) {  // move the last position's key and value
    k.data[3 * 6 + c] += 1.0f;
    v.data[3 * 6 + c] -= 1.0f;
  }
  ops.attention_forward(q, k, v, options, after, saved);
  for (int i = 0; i < 3 * 6; ++i) EXPECT_EQ(before.data[i], after.data[i]) << i;
  EXPECT_NE(before.data[3 * 6], after.data[3 * 6]);
  test::expect_error(
      [&] {
        ops.attention_forward(q, k, v, {4, false}, before, saved);
      },
      Status::invalid_argument, {"attention_forward", "4 heads", "6 features"});
}

TEST(NnEmbedding, LookupAndScatterAdd) {
  std::mt19937 rng(9);
  nn::HostOps ops(1);
  Tensor table = random_tensor({6, 4}, rng);
  const std::vector<int32_t> ids = {1, 3, 1, 5, 0};  // id 1 twice: its gradient rows add
  Tensor out;
  ops.embedding_forward(table, ids, out);
  ASSERT_EQ(out.shape, (Shape{5, 4}));
  for (int i = 0; i < 5; ++i)
    for (int c = 0; c < 4; ++c) EXPECT_EQ(out.data[i * 4 + c], table.data[ids[i] * 4 + c]);
  const Tensor dout = random_tensor({5, 4}, rng);
  Tensor dtable(table.shape);
  ops.embedding_backward(ids, dout, dtable);
  for (int c = 0; c < 4; ++c) EXPECT_FLOAT_EQ(dtable.data[1 * 4 + c], dout.data[c] + dout.data[2 * 4 + c]);
  for (int c = 0; c < 4; ++c) EXPECT_EQ(dtable.data[2 * 4 + c], 0.0f);  // unused id
  expect_gradient("embedding dtable", table, dtable, [&] {
    Tensor o;
    ops.embedding_forward(table, ids, o);
    return dot(o, dout);
  });
  const std::vector<int32_t> bad = {0, 6};
  test::expect_error([&] { ops.embedding_forward(table, bad, out); }, Status::invalid_argument,
                     {"id 6 at position 1", "vocabulary of 6"});
}

// out[b][patch][e] = bias[e] + sum_{c,i,j} weight[e][c][i][j] * image[b][c][row*P + i][col*P + j].
Tensor reference_patches(const Tensor& image, int64_t p, const Tensor& weight, const Tensor& bias) {
  const int64_t channels = image.dim(-3), height = image.dim(-2), width = image.dim(-1), e = weight.dim(0);
  const int64_t images = image.numel() / (channels * height * width), rows = height / p, cols = width / p;
  Tensor out({images, rows * cols, e});
  for (int64_t b = 0; b < images; ++b)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        for (int64_t o = 0; o < e; ++o) {
          double s = bias.data[o];
          for (int64_t ch = 0; ch < channels; ++ch)
            for (int64_t i = 0; i < p; ++i)
              for (int64_t j = 0; j < p; ++j)
                s += static_cast<double>(weight.data[((o * channels + ch) * p + i) * p + j]) *
                     image.data[((b * channels + ch) * height + r * p + i) * width + c * p + j];
          out.data[((b * rows + r) * cols + c) * e + o] = static_cast<float>(s);
        }
  return out;
}

TEST(NnPatchEmbedding, VariableResolutionForwardAndGradients) {
  std::mt19937 rng(10);
  nn::HostOps ops(1);
  Tensor weight = random_tensor({3, 2 * 2 * 2}, rng), bias = random_tensor({3}, rng);
  // The number of patches follows the image: 4x6 -> 2x3 patches, 2x2 -> 1, 6x4 -> 3x2.
  for (const Shape& shape : {Shape{2, 4, 6}, Shape{2, 2, 2}, Shape{2, 6, 4}}) {
    const Tensor image = random_tensor(shape, rng);
    Tensor out;
    ops.patch_embedding_forward(image, 2, weight, &bias, out);
    ASSERT_EQ(out.shape, (Shape{shape[1] / 2 * shape[2] / 2, 3}));
    Tensor expect = reference_patches(image, 2, weight, bias);
    expect.reshape(out.shape);
    EXPECT_LT(relative_error(out, expect), 1e-6) << nn::shape_string(shape);
  }
  Tensor batch = random_tensor({2, 2, 4, 6}, rng), out;
  ops.patch_embedding_forward(batch, 2, weight, &bias, out);
  ASSERT_EQ(out.shape, (Shape{2, 6, 3}));
  EXPECT_LT(relative_error(out, reference_patches(batch, 2, weight, bias)), 1e-6);

  Tensor image = random_tensor({2, 4, 6}, rng);
  const Tensor dout = random_tensor({6, 3}, rng);
  Tensor dimage, dweight(weight.shape), dbias(bias.shape);
  ops.patch_embedding_backward(image, 2, weight, dout, &dimage, &dweight, &dbias);
  auto loss = [&] {
    Tensor o;
    ops.patch_embedding_forward(image, 2, weight, &bias, o);
    return dot(o, dout);
  };
  expect_gradient("patch_embedding dimage", image, dimage, loss);
  expect_gradient("patch_embedding dweight", weight, dweight, loss);
  expect_gradient("patch_embedding dbias", bias, dbias, loss);
  test::expect_error([&] { ops.patch_embedding_forward(image, 3, weight, &bias, out); }, Status::invalid_argument,
                     {"patch size 3", "(2, 4, 6)"});
}

TEST(NnCrossEntropy, IgnoreIndexValueAndGradient) {
  std::mt19937 rng(11);
  nn::HostOps ops(1);
  Tensor logits = random_tensor({2, 3, 5}, rng, -2.0f, 2.0f);
  const std::vector<int32_t> targets = {0, 4, -1, 2, -1, 1};
  double expect = 0.0;
  for (int r = 0; r < 6; ++r) {
    if (targets[r] < 0) continue;
    double sum = 0.0;
    for (int j = 0; j < 5; ++j) sum += std::exp(static_cast<double>(logits.data[r * 5 + j]));
    expect += std::log(sum) - logits.data[r * 5 + targets[r]];
  }
  Tensor dlogits;
  EXPECT_NEAR(ops.cross_entropy(logits, targets, 0, &dlogits), expect / 4.0, 1e-6);  // mean over the 4 counted
  for (int c = 0; c < 5; ++c) EXPECT_EQ(dlogits.data[2 * 5 + c], 0.0f);              // an ignored row
  expect_gradient("cross_entropy dlogits", logits, dlogits,
                  [&] { return static_cast<double>(ops.cross_entropy(logits, targets, 0, nullptr)); });

  // A normalizer over several pieces: this piece's sum divided by it.
  Tensor dpiece;
  EXPECT_NEAR(ops.cross_entropy(logits, targets, 10, &dpiece), expect / 10.0, 1e-6);
  ops.scale(dpiece, 10.0f / 4.0f);
  EXPECT_LT(relative_error(dpiece, dlogits), 1e-6);

  const std::vector<int32_t> none(6, -1);
  EXPECT_EQ(ops.cross_entropy(logits, none, 0, &dlogits), 0.0f);
  EXPECT_EQ(max_abs(dlogits), 0.0);
  EXPECT_NEAR(ops.cross_entropy(Tensor({1, 7}), std::vector<int32_t>{3}, 0, nullptr), std::log(7.0), 1e-6);
  test::expect_error(
      [&] {
        ops.cross_entropy(logits, std::vector<int32_t>{0, 5, 0, 0, 0, 0}, 0, nullptr);
      },
      Status::invalid_argument, {"target 5 of row 1", "ignore index -1"});
}

// CLIP's loss written out in double: mean over rows of both directions of the cross-entropy.
double reference_clip(const Tensor& image, const Tensor& text, double t) {
  const int64_t n = image.dim(0), e = image.dim(1);
  const double s = std::exp(std::min(t, std::log(100.0)));
  double loss = 0.0;
  for (int direction = 0; direction < 2; ++direction) {
    const Tensor& a = direction == 0 ? image : text;
    const Tensor& b = direction == 0 ? text : image;
    for (int64_t i = 0; i < n; ++i) {
      double sum = 0.0, own = 0.0;
      for (int64_t j = 0; j < n; ++j) {
        double l = 0.0;
        for (int64_t c = 0; c < e; ++c) l += static_cast<double>(a.data[i * e + c]) * b.data[j * e + c];
        sum += std::exp(s * l);
        if (j == i) own = s * l;
      }
      loss += std::log(sum) - own;
    }
  }
  return loss / (2.0 * n);
}

Tensor normalized(Shape shape, std::mt19937& rng) {
  nn::HostOps ops(1);
  Tensor y;
  ops.l2_normalize_forward(random_tensor(std::move(shape), rng), y);
  return y;
}

TEST(NnContrastive, SingleRankValueAndGradients) {
  std::mt19937 rng(12);
  nn::HostOps ops(1);
  Tensor image = normalized({5, 4}, rng), text = normalized({5, 4}, rng);
  Tensor t({1}, {std::log(1.0f / 0.07f) * 0.5f});  // logit scale ~3.8: gradients of moderate size
  nn::ContrastiveGrads g;
  const float loss = ops.contrastive_loss(image, text, image, text, 0, t.data[0], &g);
  EXPECT_NEAR(loss, reference_clip(image, text, t.data[0]), 1e-5);
  // With one rank the local and the gathered rows are the same tensors: their gradients add.
  Tensor dimage = g.local_image, dtext = g.local_text;
  for (std::size_t i = 0; i < dimage.data.size(); ++i) dimage.data[i] += g.all_image.data[i];
  for (std::size_t i = 0; i < dtext.data.size(); ++i) dtext.data[i] += g.all_text.data[i];
  auto value = [&] {
    return static_cast<double>(ops.contrastive_loss(image, text, image, text, 0, t.data[0], nullptr));
  };
  expect_gradient("contrastive dimage", image, dimage, value);
  expect_gradient("contrastive dtext", text, dtext, value);
  expect_gradient("contrastive dt", t, Tensor({1}, {g.logit_scale_param}), value);

  // Above ln 100 the scale is capped: the loss is the capped one and t gets no gradient.
  const float capped = ops.contrastive_loss(image, text, image, text, 0, 6.0f, &g);
  EXPECT_NEAR(capped, reference_clip(image, text, std::log(100.0)), 1e-5);
  EXPECT_EQ(g.logit_scale_param, 0.0f);
  // At the cap as the optimizer leaves it (the float nearest ln 100, a little above it) t
  // still trains, as in open_clip, whose clamp is outside the graph: it was frozen there.
  float at_cap = 6.0f;
  nn::clamp_logit_scale_param(at_cap);
  ASSERT_GT(static_cast<double>(at_cap), nn::kMaxLogitScaleParam);
  ops.contrastive_loss(image, text, image, text, 0, at_cap, &g);
  const float there = g.logit_scale_param;
  ops.contrastive_loss(image, text, image, text, 0, at_cap - 1e-4f, &g);  // just below: the same slope
  EXPECT_NE(there, 0.0f);
  EXPECT_NEAR(there, g.logit_scale_param, 1e-3 * std::abs(g.logit_scale_param));
}

TEST(NnContrastive, LocalLossGradientsOfEveryInput) {
  std::mt19937 rng(13);
  nn::HostOps ops(1);
  // Rank 1 of 3 with 2 rows each; local and gathered rows as independent inputs.
  Tensor li = normalized({2, 4}, rng), lt = normalized({2, 4}, rng);
  Tensor ai = normalized({6, 4}, rng), at = normalized({6, 4}, rng);
  Tensor t({1}, {1.2f});
  nn::ContrastiveGrads g;
  ops.contrastive_loss(li, lt, ai, at, 2, t.data[0], &g);
  auto value = [&] { return static_cast<double>(ops.contrastive_loss(li, lt, ai, at, 2, t.data[0], nullptr)); };
  expect_gradient("local image", li, g.local_image, value);
  expect_gradient("local text", lt, g.local_text, value);
  expect_gradient("gathered image", ai, g.all_image, value);
  expect_gradient("gathered text", at, g.all_text, value);
  expect_gradient("temperature", t, Tensor({1}, {g.logit_scale_param}), value);
  test::expect_error([&] { ops.contrastive_loss(li, lt, ai, at, 5, 1.0f, nullptr); }, Status::invalid_argument,
                     {"local rows [5, 7)", "6 gathered rows"});
}

// Rows [first, first + count) of a (rows, E) tensor.
Tensor rows_of(const Tensor& t, int64_t first, int64_t count) {
  const int64_t e = t.dim(1);
  return Tensor({count, e}, std::vector<float>(t.data.begin() + first * e, t.data.begin() + (first + count) * e));
}

TEST(NnContrastive, RankPiecesSumToTheSingleRankLoss) {
  std::mt19937 rng(14);
  nn::HostOps ops(1);
  const int64_t batch = 12, e = 8;
  const Tensor image = normalized({batch, e}, rng), text = normalized({batch, e}, rng);
  const float t = std::log(1.0f / 0.07f);
  nn::ContrastiveGrads single;
  const float single_loss = ops.contrastive_loss(image, text, image, text, 0, t, &single);
  Tensor single_dimage = single.local_image, single_dtext = single.local_text;
  for (std::size_t i = 0; i < single_dimage.data.size(); ++i) single_dimage.data[i] += single.all_image.data[i];
  for (std::size_t i = 0; i < single_dtext.data.size(); ++i) single_dtext.data[i] += single.all_text.data[i];

  for (int ranks : {2, 3, 4}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    const int64_t n = batch / ranks;
    double loss = 0.0, dt = 0.0;
    Tensor dimage({batch, e}), dtext({batch, e});
    for (int r = 0; r < ranks; ++r) {
      nn::ContrastiveGrads g;
      loss += ops.contrastive_loss(rows_of(image, r * n, n), rows_of(text, r * n, n), image, text, r * n, t, &g);
      dt += g.logit_scale_param;
      // What the reduce-scatter of the gathered gradients and the local add do.
      for (int64_t i = 0; i < batch * e; ++i) {
        dimage.data[i] += g.all_image.data[i];
        dtext.data[i] += g.all_text.data[i];
      }
      for (int64_t i = 0; i < n * e; ++i) {
        dimage.data[r * n * e + i] += g.local_image.data[i];
        dtext.data[r * n * e + i] += g.local_text.data[i];
      }
    }
    EXPECT_NEAR(loss, single_loss, 1e-5 * single_loss);
    EXPECT_NEAR(dt, single.logit_scale_param, 1e-5 * std::abs(single.logit_scale_param));
    EXPECT_LT(relative_error(dimage, single_dimage), 1e-5);
    EXPECT_LT(relative_error(dtext, single_dtext), 1e-5);
  }
}

// CLIP's loss and gradients in double straight from the formula: L = s I T^T, row and
// column softmaxes P and Q, dL = (P + Q - 2 I) / 2N.
struct ClipReference {
  double loss = 0.0, dt = 0.0;
  Tensor dimage, dtext;
};

ClipReference reference_clip_gradients(const Tensor& image, const Tensor& text, double t) {
  const int64_t n = image.dim(0), e = image.dim(1);
  const bool capped = t > std::log(100.0);
  const double s = std::exp(capped ? std::log(100.0) : t);
  std::vector<double> logits(static_cast<std::size_t>(n * n)), dl(logits.size());
  auto at = [n](int64_t i, int64_t j) { return static_cast<std::size_t>(i * n + j); };
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double l = 0.0;
      for (int64_t c = 0; c < e; ++c) l += static_cast<double>(image.data[i * e + c]) * text.data[j * e + c];
      logits[at(i, j)] = s * l;
    }
  ClipReference r;
  for (int direction = 0; direction < 2; ++direction)
    for (int64_t i = 0; i < n; ++i) {  // row i of L, or column i
      auto x = [&](int64_t j) { return direction == 0 ? logits[at(i, j)] : logits[at(j, i)]; };
      double top = x(0), sum = 0.0;
      for (int64_t j = 1; j < n; ++j) top = std::max(top, x(j));
      for (int64_t j = 0; j < n; ++j) sum += std::exp(x(j) - top);
      r.loss += top + std::log(sum) - x(i);
      for (int64_t j = 0; j < n; ++j)
        dl[direction == 0 ? at(i, j) : at(j, i)] += (std::exp(x(j) - top) / sum - (j == i ? 1.0 : 0.0)) / (2.0 * n);
    }
  r.loss /= 2.0 * n;
  r.dimage = Tensor({n, e});
  r.dtext = Tensor({n, e});
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < e; ++c) {
      double di = 0.0, dx = 0.0;
      for (int64_t j = 0; j < n; ++j) {
        di += dl[at(i, j)] * text.data[j * e + c];
        dx += dl[at(j, i)] * image.data[j * e + c];
      }
      r.dimage.data[i * e + c] = static_cast<float>(s * di);
      r.dtext.data[i * e + c] = static_cast<float>(s * dx);
    }
  if (!capped)
    for (std::size_t k = 0; k < dl.size(); ++k) r.dt += dl[k] * logits[k];
  return r;
}

TEST(NnContrastive, LargeBatchAgainstTheFormulaOnAnyThreadCount) {
  // 1030 rows: the single-rank op's tiles (1024 columns, groups of 1024 rows), its 4-wide
  // loops and the 2 x 515 local rows all end ragged. Two regimes of its one-exp shortcut:
  // scale 14.3 on random embeddings takes it everywhere; scale 100 on images clustered around
  // one direction with text row 0 opposite to it spreads the logits over +-100, so tiles and
  // rows fall back to one exp per softmax.
  std::mt19937 rng(17);
  const int64_t batch = 1030, e = 8, half = batch / 2;
  const Tensor image = normalized({batch, e}, rng), text = normalized({batch, e}, rng);
  Tensor clustered = random_tensor({batch, e}, rng), opposed = text;
  for (int64_t i = 0; i < batch; ++i) clustered.data[i * e] += 3.0f;
  for (int64_t c = 0; c < e; ++c) opposed.data[c] = c == 0 ? -1.0f : 0.0f;
  Tensor clustered_image;
  nn::HostOps(1).l2_normalize_forward(clustered, clustered_image);
  struct Case {
    const Tensor& image;
    const Tensor& text;
    float t;
  };
  nn::HostOps one(1), three(3);
  for (const Case& c : {Case{image, text, std::log(1.0f / 0.07f)}, Case{clustered_image, opposed, 6.0f}}) {
    SCOPED_TRACE("t = " + std::to_string(c.t));
    const ClipReference ref = reference_clip_gradients(c.image, c.text, c.t);
    nn::ContrastiveGrads a, b;
    const float loss = one.contrastive_loss(c.image, c.text, c.image, c.text, 0, c.t, &a);
    EXPECT_EQ(three.contrastive_loss(c.image, c.text, c.image, c.text, 0, c.t, &b), loss);
    EXPECT_EQ(a.local_image.data, b.local_image.data);
    EXPECT_EQ(a.local_text.data, b.local_text.data);
    EXPECT_EQ(a.logit_scale_param, b.logit_scale_param);
    EXPECT_NEAR(loss, ref.loss, 1e-5 * ref.loss);
    EXPECT_NEAR(a.logit_scale_param, ref.dt, 1e-4 * std::abs(ref.dt));
    Tensor dimage = a.local_image, dtext = a.local_text;
    one.add(dimage, a.all_image);
    one.add(dtext, a.all_text);
    EXPECT_LT(relative_error(dimage, ref.dimage), 1e-4);
    EXPECT_LT(relative_error(dtext, ref.dtext), 1e-4);

    // The same from two ranks' local losses.
    double pieces = 0.0, dt = 0.0;
    Tensor dimage2({batch, e}), dtext2({batch, e});
    for (int64_t r = 0; r < 2; ++r) {
      nn::ContrastiveGrads g;
      pieces += three.contrastive_loss(rows_of(c.image, r * half, half), rows_of(c.text, r * half, half), c.image,
                                       c.text, r * half, c.t, &g);
      dt += g.logit_scale_param;
      three.add(dimage2, g.all_image);
      three.add(dtext2, g.all_text);
      for (int64_t i = 0; i < half * e; ++i) {
        dimage2.data[r * half * e + i] += g.local_image.data[i];
        dtext2.data[r * half * e + i] += g.local_text.data[i];
      }
    }
    EXPECT_NEAR(pieces, ref.loss, 1e-5 * ref.loss);
    EXPECT_NEAR(dt, ref.dt, 1e-4 * std::abs(ref.dt));
    EXPECT_LT(relative_error(dimage2, ref.dimage), 1e-4);
    EXPECT_LT(relative_error(dtext2, ref.dtext), 1e-4);
  }
}

TEST(NnOptim, AdamWTwoStepsByHand) {
  nn::HostOps ops(1);
  nn::AdamWConfig config;
  config.lr = 0.1;
  config.weight_decay = 0.01;
  Tensor param({2}, {1.0f, -2.0f});
  nn::AdamWState state;
  ops.adamw_step(param, Tensor({2}, {0.5f, 0.1f}), state, config);
  // Element 0, step 1: p = 1 * (1 - 0.1*0.01) = 0.999; m = 0.05, v = 0.00025;
  // m^ = 0.05/0.1 = 0.5, v^ = 0.00025/0.001 = 0.25; p -= 0.1 * 0.5 / (0.5 + 1e-8) -> 0.899000002.
  EXPECT_NEAR(param.data[0], 0.899000002, 1e-6);
  EXPECT_NEAR(param.data[1], -2.097999990, 1e-6);
  ops.adamw_step(param, Tensor({2}, {-0.25f, 0.3f}), state, config);
  // Step 2: p = 0.899000002 * 0.999; m = 0.9*0.05 - 0.1*0.25 = 0.02, v = 0.999*0.00025 + 0.001*0.0625
  // = 0.00031225; m^ = 0.02/0.19, v^ = 0.00031225/0.001999; p -= 0.1 m^ / (sqrt(v^) + 1e-8) -> 0.871467299.
  EXPECT_NEAR(param.data[0], 0.871467299, 1e-6);
  EXPECT_NEAR(param.data[1], -2.187680098, 1e-6);
  EXPECT_EQ(state.step, 2);
  EXPECT_NEAR(state.m.data[0], 0.02, 1e-8);
  EXPECT_NEAR(state.v.data[0], 0.00031225, 1e-9);
}

TEST(NnOptim, ClipGlobalNormAndLogitScaleCap) {
  nn::HostOps ops(1);
  Tensor a({1}, {3.0f}), b({2}, {0.0f, 4.0f});
  std::vector<Tensor*> grads = {&a, &b};
  EXPECT_NEAR(nn::clip_grad_norm(ops, grads, 10.0f), 5.0, 1e-9);  // below the limit: untouched
  EXPECT_EQ(a.data[0], 3.0f);
  EXPECT_NEAR(nn::clip_grad_norm(ops, grads, 1.0f), 5.0, 1e-9);
  EXPECT_NEAR(a.data[0], 3.0 / (5.0 + 1e-6), 1e-6);  // torch's max_norm / (norm + 1e-6)
  EXPECT_NEAR(b.data[1], 4.0 / (5.0 + 1e-6), 1e-6);
  EXPECT_NEAR(std::sqrt(ops.squared_norm(a) + ops.squared_norm(b)), 1.0, 1e-6);
  test::expect_error([&] { nn::clip_grad_norm(ops, grads, 0.0f); }, Status::invalid_argument, {"max_norm"});
  // A NaN norm: every gradient NaN, as torch leaves them (large finite ones were left unclipped).
  b.data[0] = std::nanf("");
  b.data[1] = 1e6f;
  EXPECT_TRUE(std::isnan(nn::clip_grad_norm(ops, grads, 1.0f)));
  for (const Tensor* g : grads)
    for (float v : g->data) EXPECT_TRUE(std::isnan(v));

  float t = 6.0f;
  nn::clamp_logit_scale_param(t);
  EXPECT_NEAR(std::exp(t), 100.0, 1e-4);
  t = -1.0f;
  nn::clamp_logit_scale_param(t);
  EXPECT_EQ(t, 0.0f);
}

// The streaming ops (and the sums over rows of the bias and norm gradients) run four elements
// at a time and the rest one by one: every length up to past four groups gives each element
// exactly what its scalar definition gives it.
TEST(NnHostOps, StreamingOpsEqualTheirScalarDefinitionAtEveryLength) {
  std::mt19937 rng(21);
  nn::HostOps ops(1);
  nn::AdamWConfig config;
  config.lr = 0.01;
  config.weight_decay = 0.1;
  for (int64_t n = 1; n <= 19; ++n) {
    SCOPED_TRACE("length " + std::to_string(n));
    const Tensor x = random_tensor({n}, rng), y0 = random_tensor({n}, rng);
    Tensor y = y0;
    ops.add(y, x);
    Tensor scaled = x;
    ops.scale(scaled, 0.37f);
    double squares = 0.0;  // lane l sums the elements at l modulo 8, the lanes in order
    std::vector<double> lanes(8, 0.0);
    for (int64_t i = 0; i < n; ++i) lanes[i % 8] += static_cast<double>(x.data[i]) * x.data[i];
    for (double lane : lanes) squares += lane;
    EXPECT_EQ(ops.squared_norm(x), squares);

    Tensor param = y0, m({n}), v({n});
    nn::AdamWState state;
    for (int step = 1; step <= 2; ++step) ops.adamw_step(param, x, state, config);
    Tensor by_hand = y0;
    for (int step = 1; step <= 2; ++step) {
      const auto rest2 = static_cast<float>(1.0 - config.beta2);
      const auto step_size = static_cast<float>(config.lr / (1.0 - std::pow(config.beta1, step)));
      const auto sqrt_correction2 = static_cast<float>(std::sqrt(1.0 - std::pow(config.beta2, step)));
      for (int64_t i = 0; i < n; ++i) {
        const float g = x.data[i];
        by_hand.data[i] *= static_cast<float>(1.0 - config.lr * config.weight_decay);
        m.data[i] = static_cast<float>(config.beta1) * m.data[i] + static_cast<float>(1.0 - config.beta1) * g;
        v.data[i] = static_cast<float>(config.beta2) * v.data[i] + rest2 * g * g;
        by_hand.data[i] -=
            step_size * m.data[i] / (std::sqrt(v.data[i]) / sqrt_correction2 + static_cast<float>(config.eps));
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(y.data[i], y0.data[i] + x.data[i]);
      EXPECT_EQ(scaled.data[i], x.data[i] * 0.37f);
      EXPECT_EQ(param.data[i], by_hand.data[i]);
      EXPECT_EQ(state.m.data[i], m.data[i]);
      EXPECT_EQ(state.v.data[i], v.data[i]);
    }
    // Zeroing writes +0 over whatever was there, in owned and in borrowed memory alike.
    Tensor owned = x, borrowed({n}, nn::Storage::borrow(y.ptr(), y.data.size(), nn::Device{}));
    ops.zero(owned, {n});
    ops.zero(borrowed, {n});
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(owned.data[i], 0.0f);
      EXPECT_FALSE(std::signbit(y.data[i]));
      EXPECT_EQ(y.data[i], 0.0f);
    }
    EXPECT_TRUE(std::signbit(Tensor({n}, -0.0f).data[n - 1]));  // a fill of -0 keeps its sign
    EXPECT_EQ(Tensor({n}, 2.5f).data[n - 1], 2.5f);

    // Sums over rows, added to what the gradients held: a bias's, and a norm's gamma and beta.
    const int64_t rows = 3;
    const Tensor w = random_tensor({n, 2}, rng), in = random_tensor({rows, 2}, rng), dy = random_tensor({rows, n}, rng);
    const Tensor held = random_tensor({n}, rng);
    Tensor dbias = held;
    ops.linear_backward(in, w, dy, nullptr, nullptr, &dbias);
    const Tensor rows_x = random_tensor({rows, n}, rng);
    Tensor normed, dgamma = held, dbeta = held;
    nn::LayerNormSaved saved;
    ops.layernorm_forward(rows_x, Tensor({n}, 1.0f), Tensor({n}), 1e-5f, normed, saved);
    ops.layernorm_backward(rows_x, Tensor({n}, 1.0f), saved, dy, nullptr, &dgamma, &dbeta);
    for (int64_t i = 0; i < n; ++i) {
      float bias_sum = held.data[i], gamma_sum = held.data[i];
      for (int64_t r = 0; r < rows; ++r) {
        bias_sum += dy.data[r * n + i];
        gamma_sum += dy.data[r * n + i] * (rows_x.data[r * n + i] - saved.mean.data[r]) * saved.rstd.data[r];
      }
      EXPECT_EQ(dbias.data[i], bias_sum);
      EXPECT_EQ(dbeta.data[i], bias_sum);
      EXPECT_EQ(dgamma.data[i], gamma_sum);
    }
  }
}

TEST(NnTensorParallel, MlpShardsEqualUnsharded) {
  std::mt19937 rng(15);
  nn::HostOps host(1);
  nn::Ops& ops = host;  // through the interface a device implementation provides too
  const Tensor x = random_tensor({3, 8}, rng);
  const Tensor w1 = random_tensor({16, 8}, rng), b1 = random_tensor({16}, rng);
  const Tensor w2 = random_tensor({6, 16}, rng), b2 = random_tensor({6}, rng);
  const Tensor dy = random_tensor({3, 6}, rng);
  // Unsharded: y = gelu(x W1^T + b1) W2^T + b2, and its backward.
  Tensor h, a, y;
  ops.linear_forward(x, w1, &b1, h);
  ops.gelu_forward(h, a);
  ops.linear_forward(a, w2, &b2, y);
  Tensor da, dh, dx, dw1(w1.shape), db1(b1.shape), dw2(w2.shape);
  ops.linear_backward(a, w2, dy, &da, &dw2, nullptr);
  ops.gelu_backward(h, da, dh);
  ops.linear_backward(x, w1, dh, &dx, &dw1, &db1);

  for (int shards : {2, 4}) {
    SCOPED_TRACE(std::to_string(shards) + " shards");
    Tensor y_sum({3, 6}), dx_sum({3, 8});
    for (int s = 0; s < shards; ++s) {
      const Tensor w1s = nn::column_parallel_shard(w1, s, shards), b1s = nn::column_parallel_shard(b1, s, shards);
      const Tensor w2s = nn::row_parallel_shard(w2, s, shards);
      Tensor hs, as, ys;
      ops.linear_forward(x, w1s, &b1s, hs);
      ops.gelu_forward(hs, as);
      ops.linear_forward(as, w2s, nullptr, ys);  // the bias comes once, after the all-reduce
      for (std::size_t i = 0; i < ys.data.size(); ++i) y_sum.data[i] += ys.data[i];
      Tensor das, dhs, dxs, dw1s(w1s.shape), db1s(b1s.shape), dw2s(w2s.shape);
      ops.linear_backward(as, w2s, dy, &das, &dw2s, nullptr);
      ops.gelu_backward(hs, das, dhs);
      ops.linear_backward(x, w1s, dhs, &dxs, &dw1s, &db1s);
      for (std::size_t i = 0; i < dxs.data.size(); ++i) dx_sum.data[i] += dxs.data[i];
      EXPECT_LT(relative_error(dw1s, nn::column_parallel_shard(dw1, s, shards)), 1e-6);
      EXPECT_LT(relative_error(db1s, nn::column_parallel_shard(db1, s, shards)), 1e-6);
      EXPECT_LT(relative_error(dw2s, nn::row_parallel_shard(dw2, s, shards)), 1e-6);
    }
    for (int r = 0; r < 3; ++r)
      for (int o = 0; o < 6; ++o) y_sum.data[r * 6 + o] += b2.data[o];
    EXPECT_LT(relative_error(y_sum, y), 1e-5);
    EXPECT_LT(relative_error(dx_sum, dx), 1e-5);
  }
  test::expect_error([&] { nn::column_parallel_shard(w1, 0, 3); }, Status::invalid_argument,
                     {"3 shards do not divide", "(16, 8)"});
  test::expect_error([&] { nn::row_parallel_shard(w2, 4, 4); }, Status::invalid_argument, {"shard 4 of 4"});
}

TEST(NnHostOps, ResultsDoNotDependOnThreads) {
  std::mt19937 rng(16);
  nn::HostOps one(1), three(3);
  // Sizes large enough that three threads are really used.
  const Tensor q = random_tensor({2, 32, 64}, rng), k = random_tensor({2, 32, 64}, rng),
               v = random_tensor({2, 32, 64}, rng), dout = random_tensor({2, 32, 64}, rng);
  const Tensor logits = random_tensor({64, 1000}, rng);
  std::vector<int32_t> targets(64);
  for (int i = 0; i < 64; ++i) targets[i] = i % 3 == 0 ? -1 : (i * 37) % 1000;
  const Tensor x = random_tensor({2048, 64}, rng), gamma = random_tensor({64}, rng), beta = random_tensor({64}, rng);
  const Tensor image = normalized({128, 16}, rng), text = normalized({128, 16}, rng);

  struct Results {
    Tensor out, dq, dk, dv, dlogits, y, dx;
    nn::ContrastiveGrads contrastive;
    float loss = 0.0f, clip = 0.0f;
  };
  auto run = [&](nn::HostOps& ops) {
    Results r;
    nn::AttentionSaved saved;
    ops.attention_forward(q, k, v, {4, true}, r.out, saved);
    ops.attention_backward(q, k, v, {4, true}, saved, dout, r.dq, r.dk, r.dv);
    r.loss = ops.cross_entropy(logits, targets, 0, &r.dlogits);
    nn::LayerNormSaved ln;
    ops.layernorm_forward(x, gamma, beta, 1e-5f, r.y, ln);
    ops.layernorm_backward(x, gamma, ln, r.y, &r.dx, nullptr, nullptr);
    r.clip = ops.contrastive_loss(image, text, image, text, 0, 2.0f, &r.contrastive);
    return r;
  };
  const Results a = run(one), b = run(three);
  EXPECT_EQ(a.out.data, b.out.data);
  EXPECT_EQ(a.dq.data, b.dq.data);
  EXPECT_EQ(a.dk.data, b.dk.data);
  EXPECT_EQ(a.dv.data, b.dv.data);
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(a.dlogits.data, b.dlogits.data);
  EXPECT_EQ(a.y.data, b.y.data);
  EXPECT_EQ(a.dx.data, b.dx.data);
  EXPECT_EQ(a.clip, b.clip);
  EXPECT_EQ(a.contrastive.local_image.data, b.contrastive.local_image.data);
  EXPECT_EQ(a.contrastive.all_text.data, b.contrastive.all_text.data);
}

}  // namespace
}  // namespace braid
