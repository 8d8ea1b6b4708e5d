// The tiled contrastive loss (core/nn/contrastive_tiled) on what the C test
// (tests/capi/test_tensor.c) cannot reach through the ABI: results bit for bit the same on
// any thread count, for both tile layouts and with several tiles and row groups; logits
// spread over +-100, where the shared layout's one-exp shortcut gives way to two exps per
// logit, against the formula in double; the two layouts and every tile width agreeing;
// forward + backward in one call equal to the two calls; and the errors it raises.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/nn/contrastive_tiled.hpp"
#include "tests/unit/support.hpp"

extern "C" {  // braid_nn links OpenBLAS
void openblas_set_num_threads(int);
int openblas_get_num_threads(void);
}

namespace braid {
namespace {

using nn::ContrastiveGradViews;
using nn::ContrastiveProblem;
using nn::ContrastiveStats;

using Matrix = std::vector<float>;  // rows x E, row-major

Matrix normalized(int64_t rows, int64_t e, std::mt19937& rng, float shift = 0.0f) {
  std::normal_distribution<float> d;
  Matrix m(static_cast<std::size_t>(rows * e));
  for (int64_t r = 0; r < rows; ++r) {
    double norm = 0.0;
    for (int64_t c = 0; c < e; ++c) {
      float& x = m[static_cast<std::size_t>(r * e + c)];
      x = d(rng) + (c == 0 ? shift : 0.0f);
      norm += static_cast<double>(x) * x;
    }
    for (int64_t c = 0; c < e; ++c) m[static_cast<std::size_t>(r * e + c)] /= static_cast<float>(std::sqrt(norm));
  }
  return m;
}

nn::RowsView<const float> in(const Matrix& m, int64_t rows, int64_t e) { return {m.data(), rows, e, e}; }
nn::RowsView<float> out(Matrix& m, int64_t rows, int64_t e) { return {m.data(), rows, e, e}; }

// Everything one forward + backward gives, gradients already summed per gathered row
// (local rows added at their offset), as the host's reduce-scatter and add would.
struct Outcome {
  double loss = 0.0, d_scale = 0.0;
  std::vector<float> lse;
  Matrix d_local_image, d_local_text, d_all_image, d_all_text;
};

struct Case {
  Matrix image, text;  // the gathered rows (N x E)
  int64_t total = 0, e = 0;
};

// Rows [offset, offset + n) as local rows: the gathered memory itself (shared) or a copy.
Outcome run(const Case& c, int64_t offset, int64_t n, bool shared, int64_t tile, int threads, float s, bool fused) {
  Matrix local_image(c.image.begin() + offset * c.e, c.image.begin() + (offset + n) * c.e);
  Matrix local_text(c.text.begin() + offset * c.e, c.text.begin() + (offset + n) * c.e);
  ContrastiveProblem p;
  p.local_image = shared ? in(c.image, n, c.e) : in(local_image, n, c.e);
  p.local_text = shared ? in(c.text, n, c.e) : in(local_text, n, c.e);
  p.all_image = in(c.image, c.total, c.e);
  p.all_text = in(c.text, c.total, c.e);
  p.row_offset = offset;
  p.logit_scale = s;
  p.tile = tile;
  p.threads = threads;
  Outcome o;  // lse: only from the forward of two calls (the fused one keeps its own)
  if (!fused) o.lse.assign(static_cast<std::size_t>(2 * n), 0.0f);
  o.d_local_image.assign(static_cast<std::size_t>(n * c.e), NAN);
  o.d_local_text = o.d_local_image;
  o.d_all_image.assign(static_cast<std::size_t>(c.total * c.e), NAN);
  o.d_all_text = o.d_all_image;
  const ContrastiveGradViews grads{out(o.d_local_image, n, c.e), out(o.d_local_text, n, c.e),
                                   out(o.d_all_image, c.total, c.e), out(o.d_all_text, c.total, c.e)};
  const double weight = 1.0 / (2.0 * static_cast<double>(n));
  if (fused) {
    o.loss = nn::contrastive_tiled_loss(p, weight, grads, &o.d_scale) * weight;
  } else {
    const ContrastiveStats stats{o.lse.data(), o.lse.data() + n};
    o.loss = nn::contrastive_tiled_forward(p, stats) * weight;
    o.d_scale = nn::contrastive_tiled_backward(p, stats, weight, grads);
  }
  return o;
}

// The image and text gradients of the gathered rows: all_* plus local_* at the offset.
std::pair<Matrix, Matrix> summed(const Outcome& o, int64_t offset, int64_t e) {
  Matrix image = o.d_all_image, text = o.d_all_text;
  for (std::size_t i = 0; i < o.d_local_image.size(); ++i) {
    image[static_cast<std::size_t>(offset * e) + i] += o.d_local_image[i];
    text[static_cast<std::size_t>(offset * e) + i] += o.d_local_text[i];
  }
  return {image, text};
}

double relative(const std::vector<float>& a, const std::vector<double>& b) {
  double diff = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = std::abs(a[i] - b[i]);
    diff = std::isnan(d) ? INFINITY : std::max(diff, d);
    scale = std::max(scale, std::abs(b[i]));
  }
  return diff / std::max(scale, 1e-30);
}

std::vector<double> widen(const Matrix& m) { return {m.begin(), m.end()}; }

// The formula in double for local rows [offset, offset + n): loss (1 / 2n), d/ds, and the
// summed gradients of the gathered rows.
struct Reference {
  double loss = 0.0, d_scale = 0.0;
  std::vector<double> d_image, d_text;
};

Reference reference(const Case& c, int64_t offset, int64_t n, double s) {
  const int64_t N = c.total, e = c.e;
  auto dot = [&](const Matrix& a, int64_t i, const Matrix& b, int64_t j) {
    double d = 0.0;
    for (int64_t k = 0; k < e; ++k) d += static_cast<double>(a[i * e + k]) * b[j * e + k];
    return d;
  };
  Reference r;
  r.d_image.assign(static_cast<std::size_t>(N * e), 0.0);
  r.d_text = r.d_image;
  const double weight = 1.0 / (2.0 * static_cast<double>(n));
  std::vector<double> x(static_cast<std::size_t>(N));
  for (int direction = 0; direction < 2; ++direction) {
    const Matrix& a = direction == 0 ? c.image : c.text;  // the local row's modality
    const Matrix& b = direction == 0 ? c.text : c.image;
    std::vector<double>& da = direction == 0 ? r.d_image : r.d_text;
    std::vector<double>& db = direction == 0 ? r.d_text : r.d_image;
    for (int64_t i = offset; i < offset + n; ++i) {
      double top = -INFINITY, sum = 0.0;
      for (int64_t j = 0; j < N; ++j) top = std::max(top, x[j] = s * dot(a, i, b, j));
      for (int64_t j = 0; j < N; ++j) sum += std::exp(x[j] - top);
      const double lse = top + std::log(sum);
      r.loss += (lse - x[i]) * weight;
      for (int64_t j = 0; j < N; ++j) {
        const double g = (std::exp(x[j] - lse) - (j == i ? 1.0 : 0.0)) * weight;
        r.d_scale += g * x[j] / s;
        for (int64_t k = 0; k < e; ++k) {
          da[i * e + k] += s * g * b[j * e + k];
          db[j * e + k] += s * g * a[i * e + k];
        }
      }
    }
  }
  return r;
}

void expect_same_bits(const Outcome& a, const Outcome& b) {
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(a.d_scale, b.d_scale);
  if (!a.lse.empty() && !b.lse.empty()) {
    EXPECT_EQ(a.lse, b.lse);
  }
  EXPECT_EQ(a.d_local_image, b.d_local_image);
  EXPECT_EQ(a.d_local_text, b.d_local_text);
  EXPECT_EQ(a.d_all_image, b.d_all_image);
  EXPECT_EQ(a.d_all_text, b.d_all_text);
}

Case random_case(int64_t total, int64_t e, uint32_t seed) {
  std::mt19937 rng(seed);
  Case c;
  c.total = total;
  c.e = e;
  c.image = normalized(total, e, rng);
  c.text = normalized(total, e, rng);
  return c;
}

TEST(ContrastiveTiled, ResultsDoNotDependOnTheThreadCount) {
  // 300 rows: two row groups of the shared layout's statistics, ragged tiles of 64 and 7;
  // the passes' threads vary, with OpenBLAS on one thread. OpenBLAS's own threads are not
  // varied: on its Haswell kernels (which the Debian 0.3.21 build runs on an AMD EPYC with
  // AVX-512, too) a GEMM's bits change with how its threads split the output, so the same bits need
  // the same OpenBLAS thread count (braid train sets it from --threads: blas.hpp).
  const Case c = random_case(300, 32, 21);
  const float s = 1.0f / 0.07f;
  const int blas_threads = openblas_get_num_threads();
  openblas_set_num_threads(1);
  for (int64_t tile : {64, 7, 0}) {
    SCOPED_TRACE("tile " + std::to_string(tile));
    const Outcome shared = run(c, 0, 300, true, tile, 1, s, false), rank = run(c, 100, 50, false, tile, 1, s, false),
                  fused = run(c, 100, 50, false, tile, 1, s, true);
    expect_same_bits(shared, run(c, 0, 300, true, tile, 3, s, false));
    expect_same_bits(rank, run(c, 100, 50, false, tile, 3, s, false));
    expect_same_bits(fused, run(c, 100, 50, false, tile, 4, s, true));
  }
  openblas_set_num_threads(blas_threads);
}

TEST(ContrastiveTiled, WideLogitRangeAgainstTheFormula) {
  // Images clustered around one direction, text row 0 opposite it, scale 100: logits spread
  // over +-100, so tiles and rows fall back from one shared exp to one per softmax.
  std::mt19937 rng(22);
  Case c;
  c.total = 300;
  c.e = 8;
  c.image = normalized(c.total, c.e, rng, 3.0f);
  c.text = normalized(c.total, c.e, rng);
  for (int64_t k = 0; k < c.e; ++k) c.text[static_cast<std::size_t>(k)] = k == 0 ? -1.0f : 0.0f;
  const Reference single = reference(c, 0, c.total, 100.0);
  const Reference rank = reference(c, 120, 60, 100.0);
  for (int64_t tile : {16, 300}) {
    SCOPED_TRACE("tile " + std::to_string(tile));
    for (bool shared : {true, false}) {
      const Outcome o = run(c, 0, c.total, shared, tile, 2, 100.0f, false);
      const auto [d_image, d_text] = summed(o, 0, c.e);
      EXPECT_NEAR(o.loss, single.loss, 1e-5 * single.loss) << (shared ? "shared" : "general");
      EXPECT_NEAR(o.d_scale, single.d_scale, 1e-4 * std::abs(single.d_scale));
      EXPECT_LT(relative(d_image, single.d_image), 1e-4);
      EXPECT_LT(relative(d_text, single.d_text), 1e-4);
    }
    const Outcome o = run(c, 120, 60, false, tile, 2, 100.0f, false);
    const auto [d_image, d_text] = summed(o, 120, c.e);
    EXPECT_NEAR(o.loss, rank.loss, 1e-5 * rank.loss);
    EXPECT_NEAR(o.d_scale, rank.d_scale, 1e-4 * std::abs(rank.d_scale));
    EXPECT_LT(relative(d_image, rank.d_image), 1e-4);
    EXPECT_LT(relative(d_text, rank.d_text), 1e-4);
  }
}

TEST(ContrastiveTiled, LayoutsTileWidthsAndFusedCallsAgree) {
  const Case c = random_case(150, 16, 23);
  const float s = 20.0f;
  const Outcome base = run(c, 0, 150, true, 150, 2, s, false);
  const auto [base_image, base_text] = summed(base, 0, c.e);
  for (int64_t tile : {1, 9, 64, 149, 150, 1000}) {
    SCOPED_TRACE("tile " + std::to_string(tile));
    for (bool shared : {true, false}) {
      const Outcome o = run(c, 0, 150, shared, tile, 2, s, false);
      const auto [d_image, d_text] = summed(o, 0, c.e);
      EXPECT_NEAR(o.loss, base.loss, 1e-6 * base.loss);
      EXPECT_NEAR(o.d_scale, base.d_scale, 1e-5 * std::abs(base.d_scale));
      EXPECT_LT(relative(o.lse, widen(base.lse)), 1e-6);
      EXPECT_LT(relative(d_image, widen(base_image)), 1e-5);
      EXPECT_LT(relative(d_text, widen(base_text)), 1e-5);
      // Several tiles: the fused call runs the same passes as forward then backward.
      const Outcome fused = run(c, 0, 150, shared, tile, 2, s, true);
      if (tile < 150 || shared) {
        expect_same_bits(fused, o);
      } else {  // one general tile: one exp per logit instead of two
        EXPECT_NEAR(fused.loss, o.loss, 1e-6 * o.loss);
        EXPECT_NEAR(fused.d_scale, o.d_scale, 1e-5 * std::abs(o.d_scale));
        EXPECT_LT(relative(fused.d_local_image, widen(o.d_local_image)), 1e-5);
        EXPECT_LT(relative(fused.d_all_text, widen(o.d_all_text)), 1e-5);
      }
    }
  }
  // One process, shared memory: the whole gradient in local_*, all_* zeroed (no NaN left).
  EXPECT_TRUE(std::all_of(base.d_all_image.begin(), base.d_all_image.end(), [](float x) { return x == 0.0f; }));
  EXPECT_TRUE(std::all_of(base.d_all_text.begin(), base.d_all_text.end(), [](float x) { return x == 0.0f; }));
}

TEST(ContrastiveTiled, RejectsMalformedProblems) {
  const Case c = random_case(6, 4, 24);
  Matrix narrow(6 * 3, 0.0f), lse(4, 0.0f), grad(5 * 4, 0.0f);
  ContrastiveProblem p;
  p.local_image = in(c.image, 2, 4);
  p.local_text = in(c.text, 2, 4);
  p.all_image = in(c.image, 6, 4);
  p.all_text = in(c.text, 6, 4);
  const ContrastiveStats stats{lse.data(), lse.data() + 2};
  p.row_offset = 5;
  test::expect_error([&] { nn::contrastive_tiled_forward(p, stats); }, Status::invalid_argument,
                     {"row_offset 5", "[5, 7)", "6 gathered rows", "(6, 4)"});
  p.row_offset = 0;
  p.all_text = in(narrow, 6, 3);
  test::expect_error([&] { nn::contrastive_tiled_forward(p, stats); }, Status::invalid_argument,
                     {"all_text is (6, 3)", "expected (6, 4)"});
  p.all_text = in(c.text, 6, 4);
  p.local_image = in(c.image, 6, 4);
  p.all_image = in(c.image, 2, 4);
  test::expect_error([&] { nn::contrastive_tiled_forward(p, stats); }, Status::invalid_argument,
                     {"local_text is (2, 4); expected (6, 4)"});
  p.local_image = in(c.image, 2, 4);
  p.all_image = in(c.image, 6, 4);
  p.all_image.stride = 2;
  test::expect_error([&] { nn::contrastive_tiled_forward(p, stats); }, Status::invalid_argument,
                     {"all_image's row stride 2", "overlap"});
  p.all_image.stride = 4;
  ContrastiveGradViews grads;
  grads.all_image = out(grad, 5, 4);
  test::expect_error([&] { nn::contrastive_tiled_backward(p, stats, 1.0, grads); }, Status::invalid_argument,
                     {"grad_all_image is (5, 4); expected (6, 4)"});
}

}  // namespace
}  // namespace braid
