// CLIP's contrastive loss (symmetric InfoNCE, learnable temperature) in the distributed
// form open_clip uses with local_loss=True and gather_with_grad=True.
//
// One rank holds n image/text pairs at rows [o, o + n) of the global batch of N. It
// all-gathers every rank's (L2-normalised) embeddings I_all, T_all (N, E) and computes only
// its own rows of the two N x N logit matrices:
//   image -> text: s * I_local T_all^T  (n x N),   text -> image: s * T_local I_all^T  (n x N),
// with s = exp(t), the label of local row i being column o + i. Its share of the loss is
//   (1 / 2N) * sum over its rows of [CE(image row) + CE(text row)],
// so the shares of all ranks add up to the single-device CLIP loss (the mean over all N
// rows of both directions). open_clip divides by n instead and lets DDP average gradients
// over the R ranks: with n = N / R that is the same gradient.
//
// Gradients: the local rows get d/d I_local and d/d T_local here; the gathered rows get
// d/d I_all and d/d T_all, which belong to the ranks that own those rows. gather_with_grad's
// backward (torch.distributed.nn.all_gather) sums them over ranks and hands each rank its
// rows; the caller does that reduce-scatter and adds the result to its local gradients.
// d/dt is a sum over ranks too. Cost per rank: two n x N x E GEMMs forward, four backward,
// instead of N x N x E each on every rank.
//
// One rank (n = N): the text -> image logits are the transpose of the image -> text ones, so
// one N x N matrix L serves both directions: a softmax over each row and one over each
// column. dL = (row softmax + column softmax - 2 I) / 2N, and the whole gradient is
// dI = s dL T, dT = s dL^T I: three GEMMs in all, as a single-device PyTorch CLIP loss runs.
// It goes to local_*; all_* stay zero (local and gathered rows are the same tensor, and the
// caller adds the two).
//
// Only L and, in place, dL are stored (n x N floats, twice for two directions when n < N).
// The exponentials use a vectorised float exp; every sum runs in a fixed order over fixed
// blocks, so results do not depend on the thread count.
//
// The temperature: logit scale s = exp(t) is capped at 100 as open_clip caps it (there by
// clamping t to [0, ln 100] after each optimizer step, see clamp_logit_scale_param); above
// the cap s is constant and d/dt is zero.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "core/common/error.hpp"
#include "core/nn/blas.hpp"
#include "core/nn/float4.hpp"
#include "core/nn/host_ops.hpp"
#include "core/nn/optim.hpp"
#include "core/nn/parallel.hpp"

namespace braid::nn {
namespace {

// Four floats at a time (core/nn/float4.hpp): row tails padded, sums one partial per lane.
using namespace f4;

float max_of(const float* x, int64_t n) {
  F4 m0 = splat(kMinusInf), m1 = m0;
  int64_t j = 0;
  for (; j + 2 * kWidth <= n; j += 2 * kWidth) {
    m0 = max4(m0, load(x + j));
    m1 = max4(m1, load(x + j + kWidth));
  }
  for (; j + kWidth <= n; j += kWidth) m0 = max4(m0, load(x + j));
  if (j < n) m1 = max4(m1, load_tail(x + j, n - j, kMinusInf));
  return max_lane(max4(m0, m1));
}

float min_of(const float* x, int64_t n) {
  F4 m = splat(std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + kWidth <= n; j += kWidth) m = min4(m, load(x + j));
  if (j < n) m = min4(m, load_tail(x + j, n - j, std::numeric_limits<float>::infinity()));
  return min_lane(m);
}

// A softmax's (max, sum of exp(x - max)), merged from pieces. `max` may be any reference
// (the pieces below give some against a shared one): merge rescales by exp(reference - max).
struct SoftmaxStats {
  float max = kMinusInf;
  double sum = 0.0;
  void merge(float piece_max, double piece_sum) {
    const float m = std::max(max, piece_max);
    sum = sum * std::exp(static_cast<double>(max) - m) + piece_sum * std::exp(static_cast<double>(piece_max) - m);
    max = m;
  }
  // log of the softmax's normaliser: x - log_norm() is the log-probability of x.
  double log_norm() const { return max + std::log(sum); }
};

// One exp per element instead of one per softmax that an element belongs to: a row's and a
// column's terms are both taken against one shared reference and rescaled per row / column.
// That is exact to float rounding while the references involved lie within kSpan of each
// other (no factor overflows, and a term can underflow only when it is below e^-27 of its
// softmax's largest); each tile or row checks it and otherwise takes the two-exp path.
constexpr float kSpan = 60.0f;

// n < N: 2n rows of N logits (image rows, then text rows), each its own softmax; row r's
// target is column offset + r % n. Returns the sum of the rows' cross-entropies; with
// `grads`, replaces each row with its gradient (scaled by `share`) and adds d loss / dt
// (sum of gradient * logit: d logits / dt = logits) to *dt. Per row: its max, then
// e = exp(x - max) stored in place with sum(e) and sum(e x), then e * share / sum(e).
double local_rows(float* logits, int64_t n, int64_t total, int64_t offset, float share, bool grads, double* dt,
                  int threads) {
  std::vector<double> row_loss(static_cast<std::size_t>(2 * n)), row_dt(static_cast<std::size_t>(2 * n));
  parallel_for(threads, 2 * n, chunk_for(20.0 * static_cast<double>(total)), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* x = logits + r * total;
      const int64_t target = offset + r % n;
      const float at_target = x[target];
      const F4 m = splat(max_of(x, total));
      F4 sum = splat(0.0f), weighted = sum;
      double row_sum = 0.0, row_weighted = 0.0;
      int64_t j = 0;
      for (; j + kWidth <= total; j += kWidth) {
        const F4 v = load(x + j), e = exp4(v - m);
        sum += e;
        weighted += e * v;
        if (grads) store(x + j, e);
        if ((j + kWidth) % kFlush == 0) {
          flush(sum, row_sum);
          flush(weighted, row_weighted);
        }
      }
      if (j < total) {  // padded lanes: e = exp(-inf) = 0, weighted by 0
        const F4 e = exp4(load_tail(x + j, total - j, kMinusInf) - m);
        sum += e;
        weighted += e * load_tail(x + j, total - j, 0.0f);
        if (grads) store_tail(x + j, e, total - j);
      }
      flush(sum, row_sum);
      flush(weighted, row_weighted);
      row_loss[static_cast<std::size_t>(r)] = m[0] + std::log(row_sum) - at_target;
      if (!grads) continue;
      const F4 factor = splat(static_cast<float>(share / row_sum));
      for (j = 0; j + kWidth <= total; j += kWidth) store(x + j, load(x + j) * factor);
      if (j < total) store_tail(x + j, load_tail(x + j, total - j, 0.0f) * factor, total - j);
      x[target] -= share;
      row_dt[static_cast<std::size_t>(r)] = row_weighted * (share / row_sum) - static_cast<double>(share) * at_target;
    }
  });
  double sum = 0.0;
  for (double l : row_loss) sum += l;
  for (double d : row_dt) *dt += d;
  return sum;
}

// One row piece of a tile: returns its max and raises the columns' maxima col_max.
float tile_row_max(const float* x, int64_t w, float* col_max) {
  F4 m = splat(kMinusInf);
  int64_t j = 0;
  for (; j + kWidth <= w; j += kWidth) {
    const F4 v = load(x + j);
    m = max4(m, v);
    store(col_max + j, max4(load(col_max + j), v));
  }
  if (j < w) {
    const F4 v = load_tail(x + j, w - j, kMinusInf);
    m = max4(m, v);
    store_tail(col_max + j, max4(load_tail(col_max + j, w - j, kMinusInf), v), w - j);
  }
  return max_lane(m);
}

// Returns the sum of exp(x - row_ref) and adds exp(x - col_ref) to col_sum: with a shared
// reference (col_ref all equal to row_ref) it takes one exp per element, else two.
template <bool kShared>
double tile_row_sums(const float* x, int64_t w, float row_ref, const float* col_ref, float* col_sum) {
  const F4 rr = splat(row_ref);
  F4 s = splat(0.0f);
  auto add = [&](F4 v, F4 cr, F4 cs) {
    const F4 e = exp4(v - rr);
    s += e;
    if constexpr (kShared) return cs + e;
    return cs + exp4(v - cr);
  };
  int64_t j = 0;
  for (; j + kWidth <= w; j += kWidth)
    store(col_sum + j, add(load(x + j), kShared ? rr : load(col_ref + j), load(col_sum + j)));
  if (j < w)  // padded with -inf: exp gives 0
    store_tail(col_sum + j,
               add(load_tail(x + j, w - j, kMinusInf), kShared ? rr : load_tail(col_ref + j, w - j, 0.0f),
                   load_tail(col_sum + j, w - j, 0.0f)),
               w - j);
  return sum_lanes(s);
}

// Columns' running (max, sum of exp(x - max)) take in a tile's (ref, tile_sum): one rescale
// per column and tile, vectorised (float is enough over the rows of one group).
void merge_columns(float* run_max, float* run_sum, const float* tile_ref, const float* tile_sum, int64_t w) {
  auto merge = [](F4 m, F4 s, F4 tm, F4 ts, F4* out_m, F4* out_s) {
    *out_m = max4(m, tm);
    *out_s = s * exp4(m - *out_m) + ts * exp4(tm - *out_m);
  };
  int64_t j = 0;
  F4 m, s;
  for (; j + kWidth <= w; j += kWidth) {
    merge(load(run_max + j), load(run_sum + j), load(tile_ref + j), load(tile_sum + j), &m, &s);
    store(run_max + j, m);
    store(run_sum + j, s);
  }
  if (j < w) {  // padded lanes are computed and dropped
    merge(load_tail(run_max + j, w - j, 0.0f), load_tail(run_sum + j, w - j, 0.0f),
          load_tail(tile_ref + j, w - j, 0.0f), load_tail(tile_sum + j, w - j, 0.0f), &m, &s);
    store_tail(run_max + j, m, w - j);
    store_tail(run_sum + j, s, w - j);
  }
}

// Replaces a row x of the square matrix with its softmax gradients, (exp(x - a) +
// exp(x - col_norm)) * share (a: the row's log-normaliser), and returns sum_j (new x_j) *
// (old x_j). Shared: exp(x - a) * (share + share exp(a - c) exp(c - col_norm)), where
// col_scale = exp(c - col_norm) for c the smallest column normaliser.
template <bool kShared>
double square_gradient_row(float* x, int64_t n, float a, const float* col_norm, const float* col_scale, float c,
                           float share) {
  const F4 ra = splat(a), sh = splat(share);
  const F4 row_scale = kShared ? exp4(splat(a - c)) * sh : sh;
  auto grad = [&](F4 v, F4 cn, F4 cs) {
    const F4 p = exp4(v - ra);
    if constexpr (kShared) return p * (sh + row_scale * cs);
    return (p + exp4(v - cn)) * sh;
  };
  F4 d = splat(0.0f);
  double dt = 0.0;
  int64_t j = 0;
  for (; j + kWidth <= n; j += kWidth) {
    const F4 v = load(x + j), g = grad(v, load(col_norm + j), load(col_scale + j));
    d += g * v;
    store(x + j, g);
    if ((j + kWidth) % kFlush == 0) flush(d, dt);
  }
  if (j < n) {  // padded with 0: those lanes add 0 * g to d
    const F4 v = load_tail(x + j, n - j, 0.0f),
             g = grad(v, load_tail(col_norm + j, n - j, 0.0f), load_tail(col_scale + j, n - j, 0.0f));
    d += g * v;
    store_tail(x + j, g, n - j);
  }
  flush(d, dt);
  return dt;
}

// n = N: the softmaxes of every row and every column of one N x N matrix. Statistics come
// from tiles of kTileRows x kTileCols: each row piece of a tile and each column piece of a
// group of kGroupRows rows has its own (max, sum), merged in a fixed order afterwards, so
// one read of the matrix from memory serves both directions (the tile stays in cache).
constexpr int64_t kTileCols = 1024, kTileRows = 16, kGroupRows = 1024;

double square_rows_and_columns(float* logits, int64_t total, float share, bool grads, double* dt, int threads) {
  const int64_t col_blocks = (total + kTileCols - 1) / kTileCols;
  const int64_t row_groups = (total + kGroupRows - 1) / kGroupRows;
  const auto at = [total](int64_t block, int64_t i) { return static_cast<std::size_t>(block * total + i); };
  // Pieces: row i in column block b at at(b, i); column j in row group g at at(g, j).
  std::vector<SoftmaxStats> row_pieces(static_cast<std::size_t>(col_blocks * total));
  std::vector<SoftmaxStats> col_pieces(static_cast<std::size_t>(row_groups * total));
  const float* l = logits;
  const double tile_work = 20.0 * static_cast<double>(std::min(total, kTileCols) * std::min(total, kGroupRows));
  parallel_for(threads, col_blocks * row_groups, chunk_for(tile_work), [&](int64_t begin, int64_t end) {
    std::vector<float> tile_max(kTileCols), tile_sum(kTileCols), run_max(kTileCols), run_sum(kTileCols);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task % col_blocks, g = task / col_blocks;
      const int64_t c0 = b * kTileCols, w = std::min(kTileCols, total - c0);
      const int64_t g_end = std::min(total, (g + 1) * kGroupRows);
      std::fill(run_max.begin(), run_max.begin() + w, kMinusInf);
      std::fill(run_sum.begin(), run_sum.begin() + w, 0.0f);
      for (int64_t r0 = g * kGroupRows; r0 < g_end; r0 += kTileRows) {
        const int64_t r1 = std::min(g_end, r0 + kTileRows);
        std::fill(tile_max.begin(), tile_max.begin() + w, kMinusInf);
        std::fill(tile_sum.begin(), tile_sum.begin() + w, 0.0f);
        float low = std::numeric_limits<float>::infinity();
        for (int64_t i = r0; i < r1; ++i) {
          row_pieces[at(b, i)].max = tile_row_max(l + i * total + c0, w, tile_max.data());
          low = std::min(low, row_pieces[at(b, i)].max);
        }
        const float high = max_of(tile_max.data(), w);
        if (std::min(low, min_of(tile_max.data(), w)) >= high - kSpan) {
          for (int64_t i = r0; i < r1; ++i)
            row_pieces[at(b, i)] = {high, tile_row_sums<true>(l + i * total + c0, w, high, nullptr, tile_sum.data())};
          std::fill(tile_max.begin(), tile_max.begin() + w, high);  // the columns' sums are against it too
        } else {
          for (int64_t i = r0; i < r1; ++i)
            row_pieces[at(b, i)].sum =
                tile_row_sums<false>(l + i * total + c0, w, row_pieces[at(b, i)].max, tile_max.data(), tile_sum.data());
        }
        merge_columns(run_max.data(), run_sum.data(), tile_max.data(), tile_sum.data(), w);
      }
      for (int64_t j = 0; j < w; ++j) col_pieces[at(g, c0 + j)] = {run_max[j], run_sum[j]};
    }
  });

  // Merge the pieces in order; the loss: sum of the log-normalisers minus the diagonal, twice.
  std::vector<float> row_norm(static_cast<std::size_t>(total)), col_norm(static_cast<std::size_t>(total));
  double sum = 0.0;
  for (int64_t i = 0; i < total; ++i) {
    SoftmaxStats row, col;
    for (int64_t b = 0; b < col_blocks; ++b) row.merge(row_pieces[at(b, i)].max, row_pieces[at(b, i)].sum);
    for (int64_t g = 0; g < row_groups; ++g) col.merge(col_pieces[at(g, i)].max, col_pieces[at(g, i)].sum);
    row_norm[static_cast<std::size_t>(i)] = static_cast<float>(row.log_norm());
    col_norm[static_cast<std::size_t>(i)] = static_cast<float>(col.log_norm());
    sum += row.log_norm() + col.log_norm() - 2.0 * l[i * total + i];
  }
  if (!grads) return sum;

  // dL_ij = (exp(L_ij - row_norm_i) + exp(L_ij - col_norm_j)) * share, minus 2 share on the
  // diagonal, in place, row by row.
  const float c = min_of(col_norm.data(), total);
  std::vector<float> col_scale(static_cast<std::size_t>(total));
  for (int64_t j = 0; j < total; ++j) col_scale[static_cast<std::size_t>(j)] = exp4(splat(c - col_norm[j]))[0];
  std::vector<double> row_dt(static_cast<std::size_t>(total));
  parallel_for(threads, total, chunk_for(20.0 * static_cast<double>(total)), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float* x = logits + i * total;
      const float diagonal = x[i], a = row_norm[static_cast<std::size_t>(i)];
      const double d = a - c <= kSpan
                           ? square_gradient_row<true>(x, total, a, col_norm.data(), col_scale.data(), c, share)
                           : square_gradient_row<false>(x, total, a, col_norm.data(), col_scale.data(), c, share);
      x[i] -= 2.0f * share;
      row_dt[static_cast<std::size_t>(i)] = d - 2.0 * share * diagonal;
    }
  });
  for (double d : row_dt) *dt += d;
  return sum;
}

}  // namespace

float HostOps::contrastive_loss(const Tensor& local_image, const Tensor& local_text, const Tensor& all_image,
                                const Tensor& all_text, int64_t offset, float logit_scale_param,
                                ContrastiveGrads* grads) {
  if (local_image.rank() != 2 || all_image.rank() != 2)
    throw Error(Status::invalid_argument, "contrastive_loss: embeddings must be (rows, E), got " +
                                              shape_string(local_image.shape) + " and " +
                                              shape_string(all_image.shape));
  const int64_t n = local_image.dim(0), total = all_image.dim(0), e = local_image.dim(1);
  expect_shape(local_text, {n, e}, "contrastive_loss", "local_text");
  expect_shape(all_image, {total, e}, "contrastive_loss", "all_image");
  expect_shape(all_text, {total, e}, "contrastive_loss", "all_text");
  if (offset < 0 || offset + n > total)
    throw Error(Status::invalid_argument, "contrastive_loss: local rows [" + std::to_string(offset) + ", " +
                                              std::to_string(offset + n) + ") are not inside the " +
                                              std::to_string(total) + " gathered rows");
  if (grads) {
    reset(grads->local_image, {n, e});
    reset(grads->local_text, {n, e});
    reset(grads->all_image, {total, e});
    reset(grads->all_text, {total, e});
    grads->logit_scale_param = 0.0f;
  }
  if (n == 0) return 0.0f;

  const bool capped = logit_scale_param > kMaxLogitScaleParam;
  const auto s = static_cast<float>(std::exp(capped ? kMaxLogitScaleParam : logit_scale_param));
  const auto share = static_cast<float>(1.0 / (2.0 * static_cast<double>(total)));
  double sum = 0.0, dt = 0.0;
  // logits = s * A B^T, so dA = s dL B, dB = s dL^T A, and d/dt = sum(dL * logits)
  // because d logits / dt = logits (s = exp(t)).
  if (n == total) {
    const std::unique_ptr<float[]> logits(new float[static_cast<std::size_t>(total * total)]);
    gemm(false, true, total, total, e, s, local_image.ptr(), e, all_text.ptr(), e, 0.0f, logits.get(), total);
    sum = square_rows_and_columns(logits.get(), total, share, grads != nullptr, &dt, threads_);
    if (grads) {
      gemm(false, false, total, e, total, s, logits.get(), total, all_text.ptr(), e, 0.0f, grads->local_image.ptr(), e);
      gemm(true, false, total, e, total, s, logits.get(), total, all_image.ptr(), e, 0.0f, grads->local_text.ptr(), e);
    }
  } else {
    // Rows 0..n-1: image -> text logits; rows n..2n-1: text -> image.
    const std::unique_ptr<float[]> logits(new float[static_cast<std::size_t>(2 * n * total)]);
    gemm(false, true, n, total, e, s, local_image.ptr(), e, all_text.ptr(), e, 0.0f, logits.get(), total);
    gemm(false, true, n, total, e, s, local_text.ptr(), e, all_image.ptr(), e, 0.0f, logits.get() + n * total, total);
    sum = local_rows(logits.get(), n, total, offset, share, grads != nullptr, &dt, threads_);
    if (grads) {
      const float* d_i2t = logits.get();
      const float* d_t2i = logits.get() + n * total;
      gemm(false, false, n, e, total, s, d_i2t, total, all_text.ptr(), e, 0.0f, grads->local_image.ptr(), e);
      gemm(true, false, total, e, n, s, d_i2t, total, local_image.ptr(), e, 0.0f, grads->all_text.ptr(), e);
      gemm(false, false, n, e, total, s, d_t2i, total, all_image.ptr(), e, 0.0f, grads->local_text.ptr(), e);
      gemm(true, false, total, e, n, s, d_t2i, total, local_text.ptr(), e, 0.0f, grads->all_image.ptr(), e);
    }
  }
  if (grads && !capped) grads->logit_scale_param = static_cast<float>(dt);
  return static_cast<float>(sum * share);
}

}  // namespace braid::nn
