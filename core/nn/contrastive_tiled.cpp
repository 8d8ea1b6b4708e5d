// The tiled contrastive loss (contrastive_tiled.hpp). Two layouts of the tile buffer:
//
// - general (n < N, or local and gathered rows in different memory): per tile of w columns,
//   two n x w GEMMs, image -> text (I_local T_all[tile]^T) and text -> image (T_local
//   I_all[tile]^T); each of the 2n rows keeps a running (max, sum) merged tile after tile.
//   Backward per tile: recompute, d logits = weight (P - onehot) in place, then
//   d I_local += s dA T_all[tile], d T_all[tile] = s dA^T I_local, and the same for text.
// - shared (local and gathered rows are the same memory, so n = N): one N x w GEMM
//   L[:, tile] = s I T[tile]^T serves both directions: its rows are pieces of the
//   image -> text softmaxes (merged online over tiles, O(N) state) and its columns are whole
//   text -> image softmaxes (all N rows are in the tile). Backward per tile: recompute,
//   dL = weight (P_row + P_col - 2 I), d I += s dL T[tile], d T[tile] = s dL^T I: three
//   GEMMs per tile instead of the general layout's six.
//
// The GEMMs give the logits (alpha = s) and d/ds = sum(dlogits x logits) / s; at s = 0, where
// that cannot be divided, from the embeddings' sums. Exponentials use the vectorised float
// exp of float4.hpp.
//
// Every row's, column's and tile's sums run in a fixed order over fixed blocks, and the
// tiles are visited in order, so results do not depend on the thread count.
#include "core/nn/contrastive_tiled.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/common/error.hpp"
#include "core/nn/blas.hpp"
#include "core/nn/float4.hpp"
#include "core/nn/parallel.hpp"

namespace braid::nn {
namespace {

using namespace f4;

template <class T>
std::string shape_of(const RowsView<T>& v) {
  return "(" + std::to_string(v.rows) + ", " + std::to_string(v.cols) + ")";
}

[[noreturn]] void invalid(const std::string& what) {
  throw Error(Status::invalid_argument, "contrastive loss: " + what);
}

template <class T>
void check_view(const RowsView<T>& v, const char* name) {
  if (v.rows < 0 || v.cols < 0) invalid(std::string(name) + " has a negative shape " + shape_of(v));
  if (v.rows > 1 && v.stride < v.cols)
    invalid(std::string(name) + "'s row stride " + std::to_string(v.stride) + " is less than its " +
            std::to_string(v.cols) + " columns: rows would overlap");
  if (!v.data && v.rows * v.cols > 0) invalid(std::string(name) + " " + shape_of(v) + " has no data");
}

// `like`: the argument whose shape it should have ("like local_image (2, 4)").
template <class T, class U>
void expect_shape(const RowsView<T>& v, int64_t rows, int64_t cols, const char* name, const char* like,
                  const RowsView<U>* like_view = nullptr) {
  if (v.rows != rows || v.cols != cols)
    invalid(std::string(name) + " is " + shape_of(v) + "; expected (" + std::to_string(rows) + ", " +
            std::to_string(cols) + ") like " + like + (like_view ? " " + shape_of(*like_view) : ""));
}

// A softmax's (max, sum of exp(x - max)), merged from pieces: merge rescales by
// exp(reference - max), so a piece may be taken against any reference.
struct SoftmaxStats {
  float max = kMinusInf;
  double sum = 0.0;
  void merge(float piece_max, double piece_sum) {
    const float m = std::max(max, piece_max);
    sum = sum * std::exp(static_cast<double>(max) - m) + piece_sum * std::exp(static_cast<double>(piece_max) - m);
    max = m;
  }
  // x - log_norm() is the log-probability of x.
  double log_norm() const { return max + std::log(sum); }
};

// Max of a row (piece) of logits: two running maxima for two loads in flight.
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

// ---- general layout: one row piece at a time --------------------------------------------

// Sum of exp(x - ref) over a row piece of logits.
double piece_exp_sum(const float* x, int64_t w, float ref) {
  const F4 r = splat(ref);
  F4 sum = splat(0.0f);
  double total = 0.0;
  int64_t j = 0;
  for (; j + kWidth <= w; j += kWidth) {
    sum += exp4(load(x + j) - r);
    if ((j + kWidth) % kFlush == 0) flush(sum, total);
  }
  if (j < w) sum += exp4(load_tail(x + j, w - j, kMinusInf) - r);  // padded lanes: exp(-inf) = 0
  flush(sum, total);
  return total;
}

// Replaces a row piece of logits with weight * exp(x - lse) and returns sum(new x old).
double piece_gradient(float* x, int64_t w, float lse, float weight) {
  const F4 a = splat(lse), wt = splat(weight);
  F4 d = splat(0.0f);
  double total = 0.0;
  int64_t j = 0;
  for (; j + kWidth <= w; j += kWidth) {
    const F4 v = load(x + j), g = exp4(v - a) * wt;
    d += g * v;
    store(x + j, g);
    if ((j + kWidth) % kFlush == 0) flush(d, total);
  }
  if (j < w) {  // padded with 0: those lanes add g * 0
    const F4 v = load_tail(x + j, w - j, 0.0f), g = exp4(v - a) * wt;
    d += g * v;
    store_tail(x + j, g, w - j);
  }
  flush(d, total);
  return total;
}

// ---- shared layout: tiles of kTileRows rows x w columns ---------------------------------

// One exp per element instead of one per softmax an element belongs to: a row's and a
// column's terms are both taken against one shared reference and rescaled per row / column.
// That is exact to float rounding while the references involved lie within kSpan of each
// other (no factor overflows, and a term can underflow only when it is below e^-27 of its
// softmax's largest); each tile or row checks it and otherwise takes the two-exp path.
constexpr float kSpan = 60.0f;
// Rows per tile of the statistics pass, and per group: each group's column pieces are
// merged in group order, so the groups may run on any threads.
constexpr int64_t kTileRows = 16, kGroupRows = 256;

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

// Returns the sum of exp(x - row_ref) over a row piece and adds exp(x - col_ref) to col_sum:
// with a shared reference (col_ref all equal to row_ref) one exp per element, else two.
template <bool kShared>
double tile_row_sums(const float* x, int64_t w, float row_ref, const float* col_ref, float* col_sum) {
  const F4 rr = splat(row_ref);
  F4 sum = splat(0.0f);
  auto add = [&](F4 v, F4 cr, F4 cs) {
    const F4 e = exp4(v - rr);
    sum += e;
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
  return sum_lanes(sum);
}

// Columns' running (max, sum of exp(x - max)) take in a tile's (ref, tile_sum): one rescale
// per column and tile (float is enough over the rows of one group).
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

// Replaces a row piece of logits x with (exp(x - a) + exp(x - col_lse)) * weight (a: the
// row's LSE) and returns sum(new x old). Shared: exp(x - a) * (weight + weight exp(a - c)
// col_scale), col_scale = exp(c - col_lse) for c the smallest column LSE of the tile.
template <bool kShared>
double shared_gradient_row(float* x, int64_t w, float a, const float* col_lse, const float* col_scale, float c,
                           float weight) {
  const F4 ra = splat(a), wt = splat(weight);
  const F4 row_scale = kShared ? exp4(splat(a - c)) * wt : wt;
  auto grad = [&](F4 x, F4 cl, F4 cs) {
    const F4 p = exp4(x - ra);
    if constexpr (kShared) return p * (wt + row_scale * cs);
    return (p + exp4(x - cl)) * wt;
  };
  F4 d = splat(0.0f);
  double total = 0.0;
  int64_t j = 0;
  for (; j + kWidth <= w; j += kWidth) {
    const F4 v = load(x + j), g = grad(v, load(col_lse + j), load(col_scale + j));
    d += g * v;
    store(x + j, g);
    if ((j + kWidth) % kFlush == 0) flush(d, total);
  }
  if (j < w) {  // padded with 0: those lanes add g * 0 to d
    const F4 v = load_tail(x + j, w - j, 0.0f),
             g = grad(v, load_tail(col_lse + j, w - j, 0.0f), load_tail(col_scale + j, w - j, 0.0f));
    d += g * v;
    store_tail(x + j, g, w - j);
  }
  flush(d, total);
  return total;
}

// ---- the driver -------------------------------------------------------------------------

class TiledLoss {
 public:
  explicit TiledLoss(const ContrastiveProblem& p)
      : p_(with_row_strides(p)),
        n_(p.local_image.rows),
        total_(p.all_image.rows),
        e_(p.local_image.cols),
        tile_(std::max<int64_t>(1, std::min(p.tile > 0 ? p.tile : kDefaultContrastiveTile, total_))),
        threads_(p.threads > 0 ? p.threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency()))),
        shared_(n_ == total_ && p_.local_image.data == p_.all_image.data && p_.local_text.data == p_.all_text.data &&
                p_.local_image.stride == p_.all_image.stride && p_.local_text.stride == p_.all_text.stride),
        s_(p.logit_scale) {}

  int64_t tiles() const { return (total_ + tile_ - 1) / tile_; }
  int64_t width(int64_t t) const { return std::min(tile_, total_ - t * tile_); }

  // Forward: the statistics of every tile in order, then the LSEs and the loss.
  void start_forward() {
    rows_.assign(static_cast<std::size_t>(shared_ ? total_ : 2 * n_), SoftmaxStats{});
    target_.assign(rows_.size(), 0.0f);
    if (shared_) col_lse_.assign(static_cast<std::size_t>(total_), 0.0);
  }
  void forward_tile(int64_t t) {
    if (shared_)
      shared_forward_tile(t);
    else
      general_forward_tile(t);
  }
  double finish_forward(const ContrastiveStats& stats) const {
    double sum = 0.0;
    if (shared_) {
      for (int64_t i = 0; i < total_; ++i) {
        const double row = rows_[static_cast<std::size_t>(i)].log_norm(), col = col_lse_[static_cast<std::size_t>(i)];
        stats.image_to_text[i] = static_cast<float>(row);
        stats.text_to_image[i] = static_cast<float>(col);
        sum += row + col - 2.0 * target_[static_cast<std::size_t>(i)];
      }
      return sum;
    }
    for (int64_t r = 0; r < 2 * n_; ++r) {
      const double lse = rows_[static_cast<std::size_t>(r)].log_norm();
      (r < n_ ? stats.image_to_text[r] : stats.text_to_image[r - n_]) = static_cast<float>(lse);
      sum += lse - target_[static_cast<std::size_t>(r)];
    }
    return sum;
  }

  // Backward: d logits of every tile in place, then its gradient GEMMs.
  void start_backward(const ContrastiveGradViews& given) {
    const ContrastiveGradViews grads{with_row_stride(given.local_image), with_row_stride(given.local_text),
                                     with_row_stride(given.all_image), with_row_stride(given.all_text)};
    grads_ = grads;
    row_dt_.assign(static_cast<std::size_t>(shared_ ? total_ : 2 * n_), 0.0);
    if (shared_) {
      // The whole gradient of a modality into one of its two views; the other reads zero.
      image_grad_ = grads.local_image.data ? grads.local_image : grads.all_image;
      text_grad_ = grads.local_text.data ? grads.local_text : grads.all_text;
      if (grads.local_image.data && grads.all_image.data) zero(grads.all_image);
      if (grads.local_text.data && grads.all_text.data) zero(grads.all_text);
    }
  }
  void backward_tile(int64_t t, const ContrastiveStats& stats, double weight) {
    if (shared_)
      shared_backward_tile(t, stats, static_cast<float>(weight));
    else
      general_backward_tile(t, stats, static_cast<float>(weight));
  }

  // General layout, all N columns in one tile, forward and backward at once: one exp per
  // logit, e = exp(x - max) kept in place and scaled to the gradient once the row's sum is
  // known. Returns the sum of the cross-entropies; the gradient GEMMs follow.
  double general_one_tile(const ContrastiveStats& stats, double weight, const ContrastiveGradViews& grads) {
    start_backward(grads);
    const int64_t w = total_;
    std::vector<double> row_loss(static_cast<std::size_t>(2 * n_));
    parallel_for(threads_, 2 * n_, chunk_for(12.0 * static_cast<double>(w)), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        float* x = buffer_.get() + r * w;
        const int64_t target = p_.row_offset + r % n_;
        const float at_target = x[target];
        const float m = max_of(x, w);
        const F4 ref = splat(m);
        F4 sum = splat(0.0f), weighted = sum;
        double row_sum = 0.0, row_weighted = 0.0;
        int64_t j = 0;
        for (; j + kWidth <= w; j += kWidth) {
          const F4 v = load(x + j), e = exp4(v - ref);
          sum += e;
          weighted += e * v;
          store(x + j, e);
          if ((j + kWidth) % kFlush == 0) {
            flush(sum, row_sum);
            flush(weighted, row_weighted);
          }
        }
        if (j < w) {  // padded lanes: e = 0, weighted by 0
          const F4 e = exp4(load_tail(x + j, w - j, kMinusInf) - ref);
          sum += e;
          weighted += e * load_tail(x + j, w - j, 0.0f);
          store_tail(x + j, e, w - j);
        }
        flush(sum, row_sum);
        flush(weighted, row_weighted);
        const double lse = m + std::log(row_sum);
        (r < n_ ? stats.image_to_text[r] : stats.text_to_image[r - n_]) = static_cast<float>(lse);
        row_loss[static_cast<std::size_t>(r)] = lse - at_target;
        const F4 factor = splat(static_cast<float>(weight / row_sum));
        for (j = 0; j + kWidth <= w; j += kWidth) store(x + j, load(x + j) * factor);
        if (j < w) store_tail(x + j, load_tail(x + j, w - j, 0.0f) * factor, w - j);
        x[target] -= static_cast<float>(weight);
        row_dt_[static_cast<std::size_t>(r)] = row_weighted * (weight / row_sum) - weight * at_target;
      }
    });
    general_grads(0);
    double sum = 0.0;
    for (double l : row_loss) sum += l;
    return sum;
  }

  bool shared() const { return shared_; }

  // d / d logit_scale = sum(d logits x logits) / s.
  double finish_backward(double weight) const {
    double d = 0.0;
    for (double x : row_dt_) d += x;
    return s_ != 0.0f ? d / s_ : zero_scale_derivative(weight);
  }

  // The tile's logits into the buffer.
  void compute_tile(int64_t t) {
    const int64_t c0 = t * tile_, w = width(t);
    if (!buffer_)  // uninitialised: every GEMM writes its whole tile (beta 0)
      buffer_.reset(new float[static_cast<std::size_t>((shared_ ? total_ : 2 * n_) * tile_)]);
    if (shared_) {
      gemm(false, true, total_, w, e_, s_, p_.all_image.data, p_.all_image.stride, row(p_.all_text, c0),
           p_.all_text.stride, 0.0f, buffer_.get(), w);
      return;
    }
    gemm(false, true, n_, w, e_, s_, p_.local_image.data, p_.local_image.stride, row(p_.all_text, c0),
         p_.all_text.stride, 0.0f, buffer_.get(), w);
    gemm(false, true, n_, w, e_, s_, p_.local_text.data, p_.local_text.stride, row(p_.all_image, c0),
         p_.all_image.stride, 0.0f, buffer_.get() + n_ * w, w);
  }

 private:
  // A view of at most one row may carry any stride (DLPack's are arbitrary there); BLAS
  // wants leading dimensions of at least the row length.
  template <class T>
  static RowsView<T> with_row_stride(RowsView<T> v) {
    if (v.rows <= 1) v.stride = std::max<int64_t>(v.cols, 1);
    return v;
  }
  static ContrastiveProblem with_row_strides(ContrastiveProblem p) {
    p.local_image = with_row_stride(p.local_image);
    p.local_text = with_row_stride(p.local_text);
    p.all_image = with_row_stride(p.all_image);
    p.all_text = with_row_stride(p.all_text);
    return p;
  }

  template <class T>
  static T* row(const RowsView<T>& v, int64_t r) {
    return v.data + r * v.stride;
  }
  static void zero(const RowsView<float>& v) {
    if (!v.data) return;
    for (int64_t r = 0; r < v.rows; ++r) std::fill(row(v, r), row(v, r) + v.cols, 0.0f);
  }

  void general_forward_tile(int64_t t) {
    const int64_t c0 = t * tile_, w = width(t);
    parallel_for(threads_, 2 * n_, chunk_for(12.0 * static_cast<double>(w)), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const float* x = buffer_.get() + r * w;
        const float m = max_of(x, w);
        rows_[static_cast<std::size_t>(r)].merge(m, piece_exp_sum(x, w, m));
        const int64_t target = p_.row_offset + r % n_ - c0;
        if (target >= 0 && target < w) target_[static_cast<std::size_t>(r)] = x[target];
      }
    });
  }

  void general_backward_tile(int64_t t, const ContrastiveStats& stats, float weight) {
    const int64_t c0 = t * tile_, w = width(t);
    parallel_for(threads_, 2 * n_, chunk_for(12.0 * static_cast<double>(w)), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        float* x = buffer_.get() + r * w;
        const float lse = r < n_ ? stats.image_to_text[r] : stats.text_to_image[r - n_];
        const int64_t target = p_.row_offset + r % n_ - c0;
        const float at_target = target >= 0 && target < w ? x[target] : 0.0f;
        double d = piece_gradient(x, w, lse, weight);
        if (target >= 0 && target < w) {
          x[target] -= weight;
          d -= static_cast<double>(weight) * at_target;
        }
        row_dt_[static_cast<std::size_t>(r)] += d;
      }
    });
    general_grads(t);
  }

  // The gradient GEMMs of a general tile whose buffer holds d logits.
  void general_grads(int64_t t) {
    const int64_t c0 = t * tile_, w = width(t);
    const float* d_i2t = buffer_.get();
    const float* d_t2i = buffer_.get() + n_ * w;
    const float s = s_, beta = t == 0 ? 0.0f : 1.0f;
    const ContrastiveGradViews& g = grads_;
    // image -> text logits = s I_local T_all^T; text -> image = s T_local I_all^T.
    if (g.local_image.data)
      gemm(false, false, n_, e_, w, s, d_i2t, w, row(p_.all_text, c0), p_.all_text.stride, beta, g.local_image.data,
           g.local_image.stride);
    if (g.all_text.data)
      gemm(true, false, w, e_, n_, s, d_i2t, w, p_.local_image.data, p_.local_image.stride, 0.0f, row(g.all_text, c0),
           g.all_text.stride);
    if (g.local_text.data)
      gemm(false, false, n_, e_, w, s, d_t2i, w, row(p_.all_image, c0), p_.all_image.stride, beta, g.local_text.data,
           g.local_text.stride);
    if (g.all_image.data)
      gemm(true, false, w, e_, n_, s, d_t2i, w, p_.local_text.data, p_.local_text.stride, 0.0f, row(g.all_image, c0),
           g.all_image.stride);
  }

  void shared_forward_tile(int64_t t) {
    const int64_t c0 = t * tile_, w = width(t);
    const int64_t groups = (total_ + kGroupRows - 1) / kGroupRows;
    col_pieces_.resize(static_cast<std::size_t>(groups * tile_));
    const float* l = buffer_.get();
    parallel_for(threads_, groups, chunk_for(12.0 * static_cast<double>(kGroupRows * w)),
                 [&](int64_t begin, int64_t end) {
                   std::vector<float> tile_max(static_cast<std::size_t>(w)), tile_sum(tile_max.size()),
                       run_max(tile_max.size()), run_sum(tile_max.size());
                   float piece[kTileRows];
                   for (int64_t g = begin; g < end; ++g) {
                     const int64_t g_end = std::min(total_, (g + 1) * kGroupRows);
                     std::fill(run_max.begin(), run_max.end(), kMinusInf);
                     std::fill(run_sum.begin(), run_sum.end(), 0.0f);
                     for (int64_t r0 = g * kGroupRows; r0 < g_end; r0 += kTileRows) {
                       const int64_t r1 = std::min(g_end, r0 + kTileRows);
                       std::fill(tile_max.begin(), tile_max.end(), kMinusInf);
                       std::fill(tile_sum.begin(), tile_sum.end(), 0.0f);
                       float low = std::numeric_limits<float>::infinity();
                       for (int64_t i = r0; i < r1; ++i) {
                         piece[i - r0] = tile_row_max(l + i * w, w, tile_max.data());
                         low = std::min(low, piece[i - r0]);
                       }
                       const float high = max_of(tile_max.data(), w);
                       if (std::min(low, min_of(tile_max.data(), w)) >= high - kSpan) {
                         for (int64_t i = r0; i < r1; ++i)
                           rows_[static_cast<std::size_t>(i)].merge(
                               high, tile_row_sums<true>(l + i * w, w, high, nullptr, tile_sum.data()));
                         std::fill(tile_max.begin(), tile_max.end(), high);  // the columns' sums are against it too
                       } else {
                         for (int64_t i = r0; i < r1; ++i)
                           rows_[static_cast<std::size_t>(i)].merge(
                               piece[i - r0],
                               tile_row_sums<false>(l + i * w, w, piece[i - r0], tile_max.data(), tile_sum.data()));
                       }
                       merge_columns(run_max.data(), run_sum.data(), tile_max.data(), tile_sum.data(), w);
                     }
                     for (int64_t j = 0; j < w; ++j)
                       col_pieces_[static_cast<std::size_t>(g * tile_ + j)] = {run_max[static_cast<std::size_t>(j)],
                                                                               run_sum[static_cast<std::size_t>(j)]};
                   }
                 });
    // Columns are whole in this tile: merge their groups in order. The diagonal is the
    // target of row c0 + j and of column c0 + j alike.
    for (int64_t j = 0; j < w; ++j) {
      SoftmaxStats col;
      for (int64_t g = 0; g < groups; ++g) {
        const SoftmaxStats& piece = col_pieces_[static_cast<std::size_t>(g * tile_ + j)];
        col.merge(piece.max, piece.sum);
      }
      col_lse_[static_cast<std::size_t>(c0 + j)] = col.log_norm();
      target_[static_cast<std::size_t>(c0 + j)] = l[(c0 + j) * w + j];
    }
  }

  void shared_backward_tile(int64_t t, const ContrastiveStats& stats, float weight) {
    const int64_t c0 = t * tile_, w = width(t);
    const float* col_lse = stats.text_to_image + c0;
    const float c = min_of(col_lse, w);
    col_scale_.resize(static_cast<std::size_t>(w));
    for (int64_t j = 0; j < w; ++j) col_scale_[static_cast<std::size_t>(j)] = exp4(splat(c - col_lse[j]))[0];
    float* l = buffer_.get();
    parallel_for(threads_, total_, chunk_for(12.0 * static_cast<double>(w)), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        float* x = l + i * w;
        const float a = stats.image_to_text[i];
        const bool diagonal = i >= c0 && i < c0 + w;
        const float at_diagonal = diagonal ? x[i - c0] : 0.0f;
        double d = a - c <= kSpan ? shared_gradient_row<true>(x, w, a, col_lse, col_scale_.data(), c, weight)
                                  : shared_gradient_row<false>(x, w, a, col_lse, col_scale_.data(), c, weight);
        if (diagonal) {
          x[i - c0] -= 2.0f * weight;
          d -= 2.0 * weight * at_diagonal;
        }
        row_dt_[static_cast<std::size_t>(i)] += d;
      }
    });
    // L = s I T^T: d I = s dL T, d T = s dL^T I.
    const float s = s_;
    if (image_grad_.data)
      gemm(false, false, total_, e_, w, s, l, w, row(p_.all_text, c0), p_.all_text.stride, t == 0 ? 0.0f : 1.0f,
           image_grad_.data, image_grad_.stride);
    if (text_grad_.data)
      gemm(true, false, w, e_, total_, s, l, w, p_.all_image.data, p_.all_image.stride, 0.0f, row(text_grad_, c0),
           text_grad_.stride);
  }

  // At s = 0 every logit is 0 and every P is 1 / N, so d/ds = weight * sum over the local rows
  // i of sum_j (1 / N - [j = target]) a_i . b_j: the gathered rows' column sums give it.
  double zero_scale_derivative(double weight) const {
    double sum = 0.0;
    for (int direction = 0; direction < 2; ++direction) {
      const RowsView<const float>& a = direction == 0 ? p_.local_image : p_.local_text;
      const RowsView<const float>& b = direction == 0 ? p_.all_text : p_.all_image;
      std::vector<double> column_sum(static_cast<std::size_t>(e_), 0.0);
      for (int64_t j = 0; j < total_; ++j)
        for (int64_t k = 0; k < e_; ++k) column_sum[static_cast<std::size_t>(k)] += row(b, j)[k];
      for (int64_t i = 0; i < n_; ++i) {
        double mean = 0.0, target = 0.0;
        for (int64_t k = 0; k < e_; ++k) {
          mean += static_cast<double>(row(a, i)[k]) * column_sum[static_cast<std::size_t>(k)];
          target += static_cast<double>(row(a, i)[k]) * row(b, p_.row_offset + i)[k];
        }
        sum += mean / static_cast<double>(total_) - target;
      }
    }
    return weight * sum;
  }

  const ContrastiveProblem p_;
  const int64_t n_, total_, e_, tile_;
  const int threads_;
  const bool shared_;
  const float s_;
  std::unique_ptr<float[]> buffer_;  // the tile: (2n or N) x w logits, then d logits
  std::vector<SoftmaxStats> rows_;
  std::vector<float> target_;             // each row's target logit
  std::vector<double> col_lse_;           // shared: each column's LSE
  std::vector<SoftmaxStats> col_pieces_;  // shared: (group, column of the tile)
  std::vector<float> col_scale_;
  std::vector<double> row_dt_;
  ContrastiveGradViews grads_;
  RowsView<float> image_grad_, text_grad_;
};

void check_stats(const ContrastiveStats& stats, int64_t n) {
  if (n > 0 && (!stats.image_to_text || !stats.text_to_image)) invalid("stats have no data");
}

void check_grads(const ContrastiveProblem& p, const ContrastiveGradViews& g) {
  const int64_t n = p.local_image.rows, total = p.all_image.rows, e = p.local_image.cols;
  const struct {
    const RowsView<float>& view;
    const char* name;
    int64_t rows;
    const char* like;
  } all[] = {{g.local_image, "grad_local_image", n, "local_image"},
             {g.local_text, "grad_local_text", n, "local_text"},
             {g.all_image, "grad_all_image", total, "all_image"},
             {g.all_text, "grad_all_text", total, "all_text"}};
  for (const auto& v : all) {
    if (!v.view.data) continue;
    check_view(v.view, v.name);
    expect_shape<float, float>(v.view, v.rows, e, v.name, v.like);
  }
}

}  // namespace

void check_contrastive_problem(const ContrastiveProblem& p) {
  check_view(p.local_image, "local_image");
  check_view(p.local_text, "local_text");
  check_view(p.all_image, "all_image");
  check_view(p.all_text, "all_text");
  const int64_t n = p.local_image.rows, total = p.all_image.rows, e = p.local_image.cols;
  expect_shape(p.local_text, n, e, "local_text", "local_image", &p.local_image);
  if (p.all_image.cols != e)
    invalid("all_image is " + shape_of(p.all_image) + " but local_image is " + shape_of(p.local_image) +
            ": both need the same embedding size E");
  expect_shape(p.all_text, total, e, "all_text", "all_image", &p.all_image);
  if (n > total)
    invalid("local_image has " + std::to_string(n) + " rows, more than the " + std::to_string(total) +
            " gathered rows of all_image " + shape_of(p.all_image));
  if (p.row_offset < 0 || p.row_offset > total - n) {
    // The end in unsigned arithmetic where row_offset + n would overflow (0 <= n, row_offset <= INT64_MAX).
    const std::string end = p.row_offset < 0
                                ? std::to_string(p.row_offset + n)
                                : std::to_string(static_cast<uint64_t>(p.row_offset) + static_cast<uint64_t>(n));
    invalid("row_offset " + std::to_string(p.row_offset) + " puts the " + std::to_string(n) + " local rows at [" +
            std::to_string(p.row_offset) + ", " + end + "), outside the " + std::to_string(total) +
            " gathered rows of all_image " + shape_of(p.all_image));
  }
  if (p.tile < 0) invalid("tile is " + std::to_string(p.tile) + "; use 0 (default) or a positive column count");
  if (!std::isfinite(p.logit_scale)) invalid("logit_scale is " + std::to_string(p.logit_scale) + ", not finite");
}

double contrastive_tiled_forward(const ContrastiveProblem& problem, const ContrastiveStats& stats) {
  check_contrastive_problem(problem);
  check_stats(stats, problem.local_image.rows);
  TiledLoss loss(problem);
  loss.start_forward();
  for (int64_t t = 0; t < loss.tiles(); ++t) {
    loss.compute_tile(t);
    loss.forward_tile(t);
  }
  return loss.finish_forward(stats);
}

double contrastive_tiled_backward(const ContrastiveProblem& problem, const ContrastiveStats& stats, double weight,
                                  const ContrastiveGradViews& grads) {
  check_contrastive_problem(problem);
  check_stats(stats, problem.local_image.rows);
  check_grads(problem, grads);
  TiledLoss loss(problem);
  loss.start_backward(grads);
  for (int64_t t = 0; t < loss.tiles(); ++t) {
    loss.compute_tile(t);
    loss.backward_tile(t, stats, weight);
  }
  return loss.finish_backward(weight);
}

double contrastive_tiled_loss(const ContrastiveProblem& problem, double weight, const ContrastiveGradViews& grads,
                              double* d_scale) {
  check_contrastive_problem(problem);
  check_grads(problem, grads);
  const int64_t n = problem.local_image.rows;
  std::vector<float> lse(static_cast<std::size_t>(2 * n));
  const ContrastiveStats stats{lse.data(), lse.data() + n};
  TiledLoss loss(problem);
  const int64_t tiles = loss.tiles();
  if (tiles == 1 && !loss.shared()) {
    loss.compute_tile(0);
    const double sum = loss.general_one_tile(stats, weight, grads);
    if (d_scale) *d_scale = loss.finish_backward(weight);
    return sum;
  }
  loss.start_forward();
  for (int64_t t = 0; t < tiles; ++t) {
    loss.compute_tile(t);
    loss.forward_tile(t);
  }
  const double sum = loss.finish_forward(stats);
  loss.start_backward(grads);
  for (int64_t t = 0; t < tiles; ++t) {
    if (tiles > 1) loss.compute_tile(t);  // one tile: still in the buffer from the forward
    loss.backward_tile(t, stats, weight);
  }
  if (d_scale) *d_scale = loss.finish_backward(weight);
  return sum;
}

double contrastive_local_mean_forward(const ContrastiveProblem& problem, const ContrastiveStats& stats) {
  const double rows = 2.0 * static_cast<double>(problem.local_image.rows);
  const double sum = contrastive_tiled_forward(problem, stats);
  return rows > 0 ? sum / rows : 0.0;
}

double contrastive_local_mean_backward(const ContrastiveProblem& problem, const ContrastiveStats& stats,
                                       double grad_loss, const ContrastiveGradViews& grads) {
  const double rows = 2.0 * static_cast<double>(problem.local_image.rows);
  return contrastive_tiled_backward(problem, stats, rows > 0 ? grad_loss / rows : 0.0, grads);
}

}  // namespace braid::nn
