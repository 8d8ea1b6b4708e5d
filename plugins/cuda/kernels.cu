// The CUDA backend's kernels: the host ops' formulas (core/nn/host_*.cpp), with sums in
// double where the host sums in double, and every reduction in a fixed order (kernels.hpp).
#include <algorithm>
#include <string>
#include <type_traits>

#include "cuda_backend.hpp"
#include "kernels.hpp"

namespace braid_cuda {
namespace {

constexpr int kThreads = 256;  // every block; the reductions' trees assume it
constexpr int kGrid = 256;     // whole-tensor reductions: a fixed grid, so a fixed order

int blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 ? (b > 0 ? b : 1) : 65535);
}

void launched(const char* what) { check(cudaGetLastError(), what); }

// The block's sum of v in a fixed tree; every thread gets it.
__device__ double block_sum(double v) {
  __shared__ double buf[kThreads];
  __syncthreads();  // buf may still be read from the previous call
  buf[threadIdx.x] = v;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) buf[threadIdx.x] += buf[threadIdx.x + half];
    __syncthreads();
  }
  return buf[0];
}

__device__ float block_max(float v) {
  __shared__ float buf[kThreads];
  __syncthreads();
  buf[threadIdx.x] = v;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) buf[threadIdx.x] = fmaxf(buf[threadIdx.x], buf[threadIdx.x + half]);
    __syncthreads();
  }
  return buf[0];
}

#define GRID_LOOP(i, n) \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); i += int64_t(blockDim.x) * gridDim.x)

__global__ void fill_rows_k(float* y, const float* row, int64_t rows, int64_t cols) {
  GRID_LOOP(i, rows * cols) y[i] = row[i % cols];
}

// Column sums without atomics. Up to kOnePassRows rows, one launch: a block takes
// kBlockColumns neighbouring columns, each of its kRowLanes warps sums every kRowLanes-th row
// of them in order, then the lanes add up in lane order. More rows, two passes for more
// parallelism: a thread sums kChunkRows rows of one column in order into a partial (threads
// of a warp take neighbouring columns), then each column adds its partials in chunk order.
constexpr int64_t kChunkRows = 32;
constexpr int64_t kOnePassRows = 1024;
constexpr int kBlockColumns = 32;
constexpr int kRowLanes = kThreads / kBlockColumns;

// The blocks' groups of kBlockColumns columns, as a grid-stride loop (the same trips for
// every thread of a block: sum_over_row_lanes synchronises it); a thread's column in the
// group is c, its first row the lane.
#define COLUMN_GROUP_LOOP(c, cols)                                                                     \
  for (int64_t group_ = blockIdx.x * int64_t(kBlockColumns), c = group_ + threadIdx.x % kBlockColumns; \
       group_ < (cols); group_ += int64_t(gridDim.x) * kBlockColumns, c = group_ + threadIdx.x % kBlockColumns)
__device__ int row_lane() { return static_cast<int>(threadIdx.x / kBlockColumns); }

// Each lane's partial of its column, added over the lanes in lane order; the block's first
// kBlockColumns threads get their column's total. Every thread of the block calls it.
__device__ float sum_over_row_lanes(float partial) {
  __shared__ float buf[kThreads];
  __syncthreads();  // buf may still be read from the previous call
  buf[threadIdx.x] = partial;
  __syncthreads();
  float total = 0.0f;
  if (threadIdx.x < kBlockColumns)
    for (int lane = 0; lane < kRowLanes; ++lane) total += buf[lane * kBlockColumns + threadIdx.x];
  return total;
}

__global__ void column_sums_one_pass_k(float* out, const float* x, int64_t rows, int64_t cols) {
  COLUMN_GROUP_LOOP(c, cols) {
    float sum = 0.0f;
    if (c < cols)
      for (int64_t r = row_lane(); r < rows; r += kRowLanes) sum += x[r * cols + c];
    const float total = sum_over_row_lanes(sum);
    if (threadIdx.x < kBlockColumns && c < cols) out[c] += total;
  }
}

__global__ void column_partials_k(const float* x, int64_t rows, int64_t cols, float* partial) {
  GRID_LOOP(i, column_chunks(rows) * cols) {
    const int64_t chunk = i / cols, c = i % cols, end = min(rows, (chunk + 1) * kChunkRows);
    float sum = 0.0f;
    for (int64_t r = chunk * kChunkRows; r < end; ++r) sum += x[r * cols + c];
    partial[i] = sum;
  }
}

__global__ void add_partials_k(float* out, const float* partial, int64_t chunks, int64_t cols) {
  GRID_LOOP(c, cols) {
    float sum = 0.0f;
    for (int64_t k = 0; k < chunks; ++k) sum += partial[k * cols + c];
    out[c] += sum;
  }
}

__global__ void add_k(float* y, const float* x, int64_t n) { GRID_LOOP(i, n) y[i] += x[i]; }
__global__ void scale_k(float* t, float f, int64_t n) { GRID_LOOP(i, n) t[i] *= f; }

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

// s = sigmoid(2u) and 1 - s, as the host computes them (host_pointwise.cpp).
__device__ void gelu_sigmoid(float v, float& s, float& one_minus_s) {
  const float u = kGeluC * (v + kGeluA * v * v * v);
  // The host's exp clamps its argument to [-87, 88] (float4.hpp): e stays finite, so 1 - s
  // is about 1 rather than inf * 0 for inputs below about -10.
  const float e = expf(fminf(fmaxf(-2.0f * u, -87.0f), 88.0f));
  s = 1.0f / (1.0f + e);
  one_minus_s = e * s;
}

__global__ void gelu_forward_k(const float* x, float* y, int64_t n) {
  GRID_LOOP(i, n) {
    float s, r;
    gelu_sigmoid(x[i], s, r);
    y[i] = x[i] * s;
  }
}

__global__ void gelu_backward_k(const float* x, const float* dy, float* dx, int64_t n) {
  GRID_LOOP(i, n) {
    const float v = x[i];
    float s, r;
    gelu_sigmoid(v, s, r);
    const float du = kGeluC * (1.0f + 3.0f * kGeluA * v * v);
    dx[i] = dy[i] * (s + 2.0f * v * s * r * du);
  }
}

__global__ void adamw_k(float* p, const float* g, float* m, float* v, int64_t n, AdamWCoefficients c) {
  GRID_LOOP(i, n) {
    float pi = p[i] * c.decay;
    const float mi = c.beta1 * m[i] + c.rest1 * g[i];
    const float vi = c.beta2 * v[i] + c.rest2 * g[i] * g[i];
    pi -= c.step_size * mi / (sqrtf(vi) / c.sqrt_correction2 + c.eps);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

__global__ void partial_squares_k(const float* x, int64_t n, double* partial) {
  double sum = 0.0;
  GRID_LOOP(i, n) sum += static_cast<double>(x[i]) * x[i];
  const double total = block_sum(sum);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

__global__ void sum_doubles_k(const double* x, int64_t n, double* result) {
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += x[i];
  const double total = block_sum(sum);
  if (threadIdx.x == 0) *result = total;
}

__global__ void layernorm_forward_k(const float* x, const float* gamma, const float* beta, float eps, float* y,
                                    float* mean_out, float* rstd_out, int64_t f) {
  const int64_t r = blockIdx.x;
  const float* xr = x + r * f;
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < f; i += blockDim.x) sum += xr[i];
  const double mean = block_sum(sum) / f;
  double var = 0.0;
  for (int64_t i = threadIdx.x; i < f; i += blockDim.x) var += (xr[i] - mean) * (xr[i] - mean);
  const float rstd = static_cast<float>(1.0 / sqrt(block_sum(var) / f + eps));
  const float m = static_cast<float>(mean);
  if (threadIdx.x == 0) {
    mean_out[r] = m;
    rstd_out[r] = rstd;
  }
  for (int64_t i = threadIdx.x; i < f; i += blockDim.x) y[r * f + i] = (xr[i] - m) * rstd * gamma[i] + beta[i];
}

__global__ void layernorm_backward_dx_k(const float* x, const float* gamma, const float* mean, const float* rstd,
                                        const float* dy, float* dx, int64_t f) {
  const int64_t r = blockIdx.x;
  const float* xr = x + r * f;
  const float* dyr = dy + r * f;
  double sum_g = 0.0, sum_gx = 0.0;
  for (int64_t i = threadIdx.x; i < f; i += blockDim.x) {
    const double g = static_cast<double>(dyr[i]) * gamma[i];
    sum_g += g;
    sum_gx += g * (xr[i] - mean[r]) * rstd[r];
  }
  const auto mean_g = static_cast<float>(block_sum(sum_g) / f);
  const auto mean_gx = static_cast<float>(block_sum(sum_gx) / f);
  for (int64_t i = threadIdx.x; i < f; i += blockDim.x) {
    const float xhat = (xr[i] - mean[r]) * rstd[r];
    dx[r * f + i] = rstd[r] * (dyr[i] * gamma[i] - mean_g - xhat * mean_gx);
  }
}

// dgamma += sum_r dy (x - mean) rstd and dbeta += sum_r dy in one launch (column_sums_one_pass_k's
// order); either may be null.
__global__ void layernorm_param_sums_one_pass_k(const float* x, const float* mean, const float* rstd, const float* dy,
                                                int64_t rows, int64_t f, float* dgamma, float* dbeta) {
  COLUMN_GROUP_LOOP(i, f) {
    float dg = 0.0f, db = 0.0f;
    if (i < f)
      for (int64_t r = row_lane(); r < rows; r += kRowLanes) {
        dg += dy[r * f + i] * (x[r * f + i] - mean[r]) * rstd[r];
        db += dy[r * f + i];
      }
    const float dg_total = sum_over_row_lanes(dg), db_total = sum_over_row_lanes(db);
    if (threadIdx.x < kBlockColumns && i < f) {
      if (dgamma) dgamma[i] += dg_total;
      if (dbeta) dbeta[i] += db_total;
    }
  }
}

// The first pass of the parameters' column sums (column_partials_k's chunks).
__global__ void layernorm_param_partials_k(const float* x, const float* mean, const float* rstd, const float* dy,
                                           int64_t rows, int64_t f, float* dgamma_partial, float* dbeta_partial) {
  GRID_LOOP(at, column_chunks(rows) * f) {
    const int64_t chunk = at / f, i = at % f, end = min(rows, (chunk + 1) * kChunkRows);
    float dg = 0.0f, db = 0.0f;
    for (int64_t r = chunk * kChunkRows; r < end; ++r) {
      dg += dy[r * f + i] * (x[r * f + i] - mean[r]) * rstd[r];
      db += dy[r * f + i];
    }
    dgamma_partial[at] = dg;
    dbeta_partial[at] = db;
  }
}

constexpr double kNormEps = 1e-12;  // F.normalize's eps

__global__ void l2_forward_k(const float* x, float* y, int64_t f) {
  const int64_t r = blockIdx.x;
  double sq = 0.0;
  for (int64_t i = threadIdx.x; i < f; i += blockDim.x) sq += static_cast<double>(x[r * f + i]) * x[r * f + i];
  const auto inv = static_cast<float>(1.0 / fmax(sqrt(block_sum(sq)), kNormEps));
  for (int64_t i = threadIdx.x; i < f; i += blockDim.x) y[r * f + i] = x[r * f + i] * inv;
}

__global__ void l2_backward_k(const float* x, const float* dy, float* dx, int64_t f) {
  const int64_t r = blockIdx.x;
  double sq = 0.0, dot = 0.0;
  for (int64_t i = threadIdx.x; i < f; i += blockDim.x) {
    sq += static_cast<double>(x[r * f + i]) * x[r * f + i];
    dot += static_cast<double>(x[r * f + i]) * dy[r * f + i];
  }
  sq = block_sum(sq);
  dot = block_sum(dot);
  const double norm = sqrt(sq);
  if (norm <= kNormEps) {  // the clamped branch: y = x / eps is linear in x
    for (int64_t i = threadIdx.x; i < f; i += blockDim.x) dx[r * f + i] = static_cast<float>(dy[r * f + i] / kNormEps);
    return;
  }
  const auto inv = static_cast<float>(1.0 / norm), proj = static_cast<float>(dot / sq);
  for (int64_t i = threadIdx.x; i < f; i += blockDim.x) dx[r * f + i] = (dy[r * f + i] - x[r * f + i] * proj) * inv;
}

__global__ void softmax_rows_k(float* p, int64_t sq, int64_t sk, bool causal) {
  const int64_t r = blockIdx.x;
  float* row = p + r * sk;
  const int64_t n = causal ? (r % sq) + 1 : sk;
  float top = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) top = fmaxf(top, row[j]);
  top = block_max(top);
  double sum = 0.0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const float e = expf(row[j] - top);
    row[j] = e;
    sum += e;
  }
  const auto inv = static_cast<float>(1.0 / block_sum(sum));
  for (int64_t j = threadIdx.x; j < sk; j += blockDim.x) row[j] = j < n ? row[j] * inv : 0.0f;
}

__global__ void softmax_backward_rows_k(const float* p, float* ds, int64_t sk) {
  const int64_t r = blockIdx.x;
  double dot = 0.0;
  for (int64_t j = threadIdx.x; j < sk; j += blockDim.x) dot += static_cast<double>(p[r * sk + j]) * ds[r * sk + j];
  const auto d = static_cast<float>(block_sum(dot));
  for (int64_t j = threadIdx.x; j < sk; j += blockDim.x) ds[r * sk + j] = p[r * sk + j] * (ds[r * sk + j] - d);
}

__global__ void embedding_forward_k(const float* table, const int32_t* ids, float* out, int64_t n, int64_t e) {
  GRID_LOOP(i, n * e) out[i] = table[int64_t(ids[i / e]) * e + i % e];
}

// One thread per (distinct id, feature): the id's positions in order, as the host adds them.
__global__ void embedding_backward_k(const int32_t* groups, int64_t distinct, int64_t n, const float* dout,
                                     float* dtable, int64_t e) {
  const int32_t *positions = groups, *starts = groups + n, *ids = starts + distinct + 1;
  GRID_LOOP(at, distinct * e) {
    const int64_t g = at / e, c = at % e;
    float* cell = dtable + int64_t(ids[g]) * e + c;
    float sum = *cell;
    for (int32_t k = starts[g]; k < starts[g + 1]; ++k) sum += dout[int64_t(positions[k]) * e + c];
    *cell = sum;
  }
}

// One element of the patch rows per index: (image b, patch (py, px), channel, i, j).
__device__ int64_t image_index(int64_t at, int64_t c, int64_t h, int64_t w, int64_t p) {
  const int64_t width = c * p * p, gw = w / p, patches = (h / p) * gw;
  const int64_t row = at / width, col = at % width;
  const int64_t b = row / patches, patch = row % patches, py = patch / gw, px = patch % gw;
  const int64_t ch = col / (p * p), i = (col / p) % p, j = col % p;
  return ((b * c + ch) * h + py * p + i) * w + px * p + j;
}

__global__ void patchify_k(const float* image, float* cols, int64_t total, int64_t c, int64_t h, int64_t w, int64_t p) {
  GRID_LOOP(at, total) cols[at] = image[image_index(at, c, h, w, p)];
}

__global__ void unpatchify_k(const float* cols, float* image, int64_t total, int64_t c, int64_t h, int64_t w,
                             int64_t p) {
  GRID_LOOP(at, total) image[image_index(at, c, h, w, p)] = cols[at];  // patches do not overlap
}

__global__ void cross_entropy_rows_k(const float* logits, const int32_t* targets, int64_t classes, float scale,
                                     float* dlogits, double* row_loss) {
  const int64_t r = blockIdx.x;
  const float* row = logits + r * classes;
  const int32_t t = targets[r];
  if (t == -1) {
    if (dlogits)
      for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) dlogits[r * classes + j] = 0.0f;
    if (threadIdx.x == 0) row_loss[r] = 0.0;
    return;
  }
  float top = -INFINITY;
  for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) top = fmaxf(top, row[j]);
  top = block_max(top);
  double sum = 0.0;
  for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) sum += exp(static_cast<double>(row[j] - top));
  const double log_sum = log(block_sum(sum));
  if (dlogits)
    for (int64_t j = threadIdx.x; j < classes; j += blockDim.x)
      dlogits[r * classes + j] =
          static_cast<float>(exp(static_cast<double>(row[j] - top) - log_sum)) * scale - (j == t ? scale : 0.0f);
  if (threadIdx.x == 0) row_loss[r] = log_sum - static_cast<double>(row[t] - top);
}

__global__ void contrastive_tile_stats_k(const float* raw, int64_t w, float scale, int64_t col0, int64_t label_offset,
                                         bool first, float* row_max, double* row_sum, float* label_logit) {
  const int64_t r = blockIdx.x;
  const float* row = raw + r * w;
  float top = -INFINITY;
  for (int64_t j = threadIdx.x; j < w; j += blockDim.x) top = fmaxf(top, scale * row[j]);
  top = block_max(top);
  double sum = 0.0;
  for (int64_t j = threadIdx.x; j < w; j += blockDim.x) sum += exp(static_cast<double>(scale * row[j] - top));
  sum = block_sum(sum);
  if (threadIdx.x != 0) return;
  if (first) {
    row_max[r] = top;
    row_sum[r] = sum;
  } else {  // merge with the earlier tiles: rescale whichever maximum is smaller
    const float m = fmaxf(row_max[r], top);
    row_sum[r] = row_sum[r] * exp(static_cast<double>(row_max[r] - m)) + sum * exp(static_cast<double>(top - m));
    row_max[r] = m;
  }
  const int64_t label = label_offset + r - col0;
  if (label >= 0 && label < w) label_logit[r] = scale * row[label];
}

__global__ void contrastive_finish_k(const float* row_max, const double* row_sum, const float* label_logit,
                                     int64_t rows, float* lse, double* row_loss) {
  GRID_LOOP(r, rows) {
    const double l = static_cast<double>(row_max[r]) + log(row_sum[r]);
    lse[r] = static_cast<float>(l);
    row_loss[r] = l - static_cast<double>(label_logit[r]);
  }
}

__global__ void contrastive_tile_grad_k(float* raw, int64_t w, float scale, int64_t col0, int64_t label_offset,
                                        const float* lse, double weight, bool first, double* d_scale_rows) {
  const int64_t r = blockIdx.x;
  float* row = raw + r * w;
  const int64_t label = label_offset + r - col0;
  double ds = 0.0;
  for (int64_t j = threadIdx.x; j < w; j += blockDim.x) {
    const double p = exp(static_cast<double>(scale * row[j]) - static_cast<double>(lse[r]));
    const auto d = static_cast<float>(weight * (p - (j == label ? 1.0 : 0.0)));
    ds += static_cast<double>(d) * row[j];
    row[j] = d;
  }
  ds = block_sum(ds);
  if (threadIdx.x == 0) d_scale_rows[r] = first ? ds : d_scale_rows[r] + ds;
}

// Shared layout (every row in the tile, so each column of R is a whole text -> image
// softmax): a column's (max, sum of exponentials) over kColumnStatRows rows at a time, in
// row order (threads of a warp take neighbouring columns), then the chunks merged in order.
constexpr int64_t kColumnStatRows = 128;

__global__ void contrastive_column_partials_k(const float* raw, int64_t rows, int64_t w, float scale, float* part_max,
                                              double* part_sum) {
  GRID_LOOP(i, contrastive_column_chunks(rows) * w) {
    const int64_t chunk = i / w, c = i % w, end = min(rows, (chunk + 1) * kColumnStatRows);
    float m = -INFINITY;
    double sum = 0.0;
    for (int64_t r = chunk * kColumnStatRows; r < end; ++r) {
      const float v = scale * raw[r * w + c];
      if (v > m) {  // a new maximum: rescale what was summed against the old one
        sum = sum * exp(static_cast<double>(m - v)) + 1.0;
        m = v;
      } else {
        sum += exp(static_cast<double>(v - m));
      }
    }
    part_max[i] = m;
    part_sum[i] = sum;
  }
}

__global__ void contrastive_column_merge_k(const float* raw, const float* part_max, const double* part_sum,
                                           int64_t chunks, int64_t w, float scale, int64_t col0, float* col_max,
                                           double* col_sum, float* label_logit) {
  GRID_LOOP(c, w) {
    float m = -INFINITY;
    double sum = 0.0;
    for (int64_t k = 0; k < chunks; ++k) {
      const float pm = part_max[k * w + c];
      const float top = fmaxf(m, pm);
      sum = sum * exp(static_cast<double>(m - top)) + part_sum[k * w + c] * exp(static_cast<double>(pm - top));
      m = top;
    }
    col_max[c] = m;
    col_sum[c] = sum;
    label_logit[c] = scale * raw[(col0 + c) * w + c];  // the diagonal: text col0 + c's own image
  }
}

// Shared layout: d logits = weight (exp(s R - row lse) + exp(s R - column lse) - 2 onehot).
__global__ void contrastive_shared_tile_grad_k(float* raw, int64_t w, float scale, int64_t col0, const float* row_lse,
                                               const float* col_lse, double weight, bool first, double* d_scale_rows) {
  const int64_t r = blockIdx.x;
  float* row = raw + r * w;
  const int64_t label = r - col0;
  const double a = row_lse[r];
  double ds = 0.0;
  for (int64_t j = threadIdx.x; j < w; j += blockDim.x) {
    const double x = static_cast<double>(scale * row[j]);
    const double p = exp(x - a) + exp(x - static_cast<double>(col_lse[j]));
    const auto d = static_cast<float>(weight * (p - (j == label ? 2.0 : 0.0)));
    ds += static_cast<double>(d) * row[j];
    row[j] = d;
  }
  ds = block_sum(ds);
  if (threadIdx.x == 0) d_scale_rows[r] = first ? ds : d_scale_rows[r] + ds;
}

// ---- fused attention: a thread per query (or key) row, keys (or queries) in shared tiles ----
// Operands are (B, S, H * d) rows; head h of row i of sample b starts at (b S + i) W + h d.
// Each thread keeps its row in registers (MaxD floats, zero past d) and walks the other side
// in order, so its sums run in a fixed order: no atomics, the same bits each run.
constexpr int kFusedRows = 64;  // threads (rows) per block
constexpr int kFusedTile = 32;  // rows of the other side per shared tile

__device__ inline int64_t head_at(int64_t b, int64_t s, int64_t i, int64_t width, int64_t h, int d) {
  return (b * s + i) * width + h * d;
}

// Rows [first, first + n) of operands a (and c, if given) of head (b, h) into shared tiles.
template <int MaxD>
__device__ void load_tile(float (*ta)[MaxD], float (*tc)[MaxD], const float* a, const float* c, int64_t b, int64_t s,
                          int64_t first, int n, int64_t width, int64_t h, int d) {
  for (int e = threadIdx.x; e < kFusedTile * MaxD; e += blockDim.x) {
    const int r = e / MaxD, col = e % MaxD;
    const bool in = r < n && col < d;
    const int64_t at = head_at(b, s, first + r, width, h, d) + col;
    ta[r][col] = in ? a[at] : 0.0f;
    if (tc) tc[r][col] = in ? c[at] : 0.0f;
  }
}

template <int MaxD>
__device__ void load_row(float (&row)[MaxD], const float* x, int64_t at, int d, bool active) {
  for (int t = 0; t < MaxD; ++t) row[t] = active && t < d ? x[at + t] : 0.0f;
}

template <int MaxD>
__device__ float dot_row(const float (&row)[MaxD], const float* tile_row) {
  float sum = 0.0f;
  for (int t = 0; t < MaxD; ++t) sum += row[t] * tile_row[t];
  return sum;
}

// out = softmax(scale Q K^T) V per head, online over key tiles; saved row (b, h, i) holds the
// output row (d floats) and the log-sum-exp of its scores.
template <int MaxD>
__global__ void fused_attention_forward_k(const float* q, const float* k, const float* v, float* out, float* saved,
                                          int64_t heads, int64_t sq, int64_t sk, int64_t width, int d, float scale,
                                          bool causal) {
  __shared__ float ks[kFusedTile][MaxD];
  __shared__ float vs[kFusedTile][MaxD];
  const int64_t bh = blockIdx.x, b = bh / heads, h = bh % heads;
  const int64_t i = int64_t(blockIdx.y) * kFusedRows + threadIdx.x;
  const bool active = i < sq;
  float qr[MaxD], acc[MaxD];
  load_row(qr, q, head_at(b, sq, i, width, h, d), d, active);
  for (int t = 0; t < MaxD; ++t) acc[t] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  // Causal: no row of this block sees a key past its last row.
  const int64_t keys = causal ? min(sq, int64_t(blockIdx.y + 1) * kFusedRows) : sk;
  for (int64_t k0 = 0; k0 < keys; k0 += kFusedTile) {
    const int n = static_cast<int>(min(int64_t(kFusedTile), keys - k0));
    __syncthreads();  // the previous tile is read
    load_tile<MaxD>(ks, vs, k, v, b, sk, k0, n, width, h, d);
    __syncthreads();
    if (!active) continue;
    float s[kFusedTile];
    float top = m;
    for (int j = 0; j < n; ++j) {
      s[j] = causal && k0 + j > i ? -INFINITY : scale * dot_row(qr, ks[j]);
      top = fmaxf(top, s[j]);
    }
    // Every key of the tile masked for this row: decided by the mask, not by `top`, which
    // fmaxf keeps at -inf over a tile of NaN scores (those must reach the output, as on the host).
    if (causal && k0 > i) continue;
    const float rescale = expf(m - top);  // 0 on the first tile (m = -inf)
    l *= rescale;
    for (int t = 0; t < MaxD; ++t) acc[t] *= rescale;
    for (int j = 0; j < n; ++j) {
      const float p = expf(s[j] - top);  // masked keys: exp(-inf) = 0
      l += p;
      for (int t = 0; t < MaxD; ++t) acc[t] += p * vs[j][t];
    }
    m = top;
  }
  if (!active) return;
  float* row_saved = saved + (bh * sq + i) * (d + 1);
  for (int t = 0; t < d && t < MaxD; ++t) {
    const float o = acc[t] / l;
    out[head_at(b, sq, i, width, h, d) + t] = o;
    row_saved[t] = o;
  }
  row_saved[d] = m + logf(l);
}

// delta[(b, h, i)] = dout row . out row (the saved output): the softmax backward's row term.
__global__ void fused_attention_delta_k(const float* saved, const float* dout, float* delta, int64_t heads, int64_t sq,
                                        int64_t width, int d, int64_t rows) {
  GRID_LOOP(r, rows) {
    const int64_t bh = r / sq, i = r % sq, b = bh / heads, h = bh % heads;
    const float* o = saved + r * (d + 1);
    const float* g = dout + head_at(b, sq, i, width, h, d);
    float sum = 0.0f;
    for (int t = 0; t < d; ++t) sum += g[t] * o[t];
    delta[r] = sum;
  }
}

// dq = scale sum_j P_ij (dP_ij - delta_i) k_j, P recomputed from the saved log-sum-exp.
template <int MaxD>
__global__ void fused_attention_dq_k(const float* q, const float* k, const float* v, const float* saved,
                                     const float* dout, const float* delta, float* dq, int64_t heads, int64_t sq,
                                     int64_t sk, int64_t width, int d, float scale, bool causal) {
  __shared__ float ks[kFusedTile][MaxD];
  __shared__ float vs[kFusedTile][MaxD];
  const int64_t bh = blockIdx.x, b = bh / heads, h = bh % heads;
  const int64_t i = int64_t(blockIdx.y) * kFusedRows + threadIdx.x;
  const bool active = i < sq;
  float qr[MaxD], gr[MaxD], acc[MaxD];
  load_row(qr, q, head_at(b, sq, i, width, h, d), d, active);
  load_row(gr, dout, head_at(b, sq, i, width, h, d), d, active);
  for (int t = 0; t < MaxD; ++t) acc[t] = 0.0f;
  const float lse = active ? saved[(bh * sq + i) * (d + 1) + d] : 0.0f;
  const float di = active ? delta[bh * sq + i] : 0.0f;
  const int64_t keys = causal ? min(sq, int64_t(blockIdx.y + 1) * kFusedRows) : sk;
  for (int64_t k0 = 0; k0 < keys; k0 += kFusedTile) {
    const int n = static_cast<int>(min(int64_t(kFusedTile), keys - k0));
    __syncthreads();
    load_tile<MaxD>(ks, vs, k, v, b, sk, k0, n, width, h, d);
    __syncthreads();
    if (!active) continue;
    for (int j = 0; j < n; ++j) {
      if (causal && k0 + j > i) break;  // keys only grow along the tile
      const float p = expf(scale * dot_row(qr, ks[j]) - lse);
      const float ds = p * (dot_row(gr, vs[j]) - di);
      for (int t = 0; t < MaxD; ++t) acc[t] += ds * ks[j][t];
    }
  }
  if (!active) return;
  for (int t = 0; t < d && t < MaxD; ++t) dq[head_at(b, sq, i, width, h, d) + t] = scale * acc[t];
}

// A thread per key row j: dv = sum_i P_ij dout_i, dk = scale sum_i P_ij (dP_ij - delta_i) q_i.
template <int MaxD>
__global__ void fused_attention_dkv_k(const float* q, const float* k, const float* v, const float* saved,
                                      const float* dout, const float* delta, float* dk, float* dv, int64_t heads,
                                      int64_t sq, int64_t sk, int64_t width, int d, float scale, bool causal) {
  __shared__ float qs[kFusedTile][MaxD];
  __shared__ float gs[kFusedTile][MaxD];
  __shared__ float lse_s[kFusedTile];
  __shared__ float delta_s[kFusedTile];
  const int64_t bh = blockIdx.x, b = bh / heads, h = bh % heads;
  const int64_t j = int64_t(blockIdx.y) * kFusedRows + threadIdx.x;
  const bool active = j < sk;
  float kr[MaxD], vr[MaxD], dk_acc[MaxD], dv_acc[MaxD];
  load_row(kr, k, head_at(b, sk, j, width, h, d), d, active);
  load_row(vr, v, head_at(b, sk, j, width, h, d), d, active);
  for (int t = 0; t < MaxD; ++t) dk_acc[t] = dv_acc[t] = 0.0f;
  // Causal: no query before this block's first key sees any of its keys.
  const int64_t first = causal ? int64_t(blockIdx.y) * kFusedRows : 0;
  for (int64_t i0 = first; i0 < sq; i0 += kFusedTile) {
    const int n = static_cast<int>(min(int64_t(kFusedTile), sq - i0));
    __syncthreads();
    load_tile<MaxD>(qs, gs, q, dout, b, sq, i0, n, width, h, d);
    for (int r = threadIdx.x; r < kFusedTile; r += blockDim.x) {
      lse_s[r] = r < n ? saved[(bh * sq + i0 + r) * (d + 1) + d] : 0.0f;
      delta_s[r] = r < n ? delta[bh * sq + i0 + r] : 0.0f;
    }
    __syncthreads();
    if (!active) continue;
    for (int r = 0; r < n; ++r) {
      if (causal && i0 + r < j) continue;
      const float p = expf(scale * dot_row(kr, qs[r]) - lse_s[r]);
      const float ds = p * (dot_row(vr, gs[r]) - delta_s[r]);
      for (int t = 0; t < MaxD; ++t) {
        dv_acc[t] += p * gs[r][t];
        dk_acc[t] += ds * qs[r][t];
      }
    }
  }
  if (!active) return;
  for (int t = 0; t < d && t < MaxD; ++t) {
    dk[head_at(b, sk, j, width, h, d) + t] = scale * dk_acc[t];
    dv[head_at(b, sk, j, width, h, d) + t] = dv_acc[t];
  }
}

// x: one (batch, head) per block column (up to 2^31 - 1, as many as the unfused path takes);
// y: blocks of kFusedRows rows (up to 65535: 4.19M rows).
dim3 fused_grid(int64_t rows, int64_t batch_heads, const char* what) {
  const int64_t blocks = (rows + kFusedRows - 1) / kFusedRows;
  if (blocks > 65535 || batch_heads > INT32_MAX) invalid(std::string(what) + ": too many rows or heads for one launch");
  return dim3(static_cast<unsigned>(batch_heads), static_cast<unsigned>(std::max<int64_t>(blocks, 1)));
}

int rows_grid(int64_t rows, const char* what) {
  if (rows > INT32_MAX) invalid(std::string(what) + ": too many rows for one launch");
  return static_cast<int>(rows);
}

}  // namespace

void fill_rows(cudaStream_t s, float* y, const float* row, int64_t rows, int64_t cols) {
  fill_rows_k<<<blocks_for(rows * cols), kThreads, 0, s>>>(y, row, rows, cols);
  launched("fill_rows");
}
__host__ __device__ int64_t column_chunks(int64_t rows) { return rows > 0 ? (rows + kChunkRows - 1) / kChunkRows : 1; }
int64_t column_sums_scratch(int64_t rows, int64_t cols) {
  return rows <= kOnePassRows ? 0 : column_chunks(rows) * cols;
}

namespace {
int column_blocks(int64_t cols) { return blocks_for(cols * kRowLanes); }  // kBlockColumns columns a block
}  // namespace

void column_sums_add(cudaStream_t s, float* out, const float* x, int64_t rows, int64_t cols, float* scratch) {
  if (rows == 0 || cols == 0) return;
  if (rows <= kOnePassRows) {
    column_sums_one_pass_k<<<column_blocks(cols), kThreads, 0, s>>>(out, x, rows, cols);
    launched("column_sums_add");
    return;
  }
  column_partials_k<<<blocks_for(column_chunks(rows) * cols), kThreads, 0, s>>>(x, rows, cols, scratch);
  launched("column_sums_add (partials)");
  add_partials_k<<<blocks_for(cols), kThreads, 0, s>>>(out, scratch, column_chunks(rows), cols);
  launched("column_sums_add");
}
void add(cudaStream_t s, float* y, const float* x, int64_t n) {
  add_k<<<blocks_for(n), kThreads, 0, s>>>(y, x, n);
  launched("add");
}
void scale(cudaStream_t s, float* t, float factor, int64_t n) {
  scale_k<<<blocks_for(n), kThreads, 0, s>>>(t, factor, n);
  launched("scale");
}
void gelu_forward(cudaStream_t s, const float* x, float* y, int64_t n) {
  gelu_forward_k<<<blocks_for(n), kThreads, 0, s>>>(x, y, n);
  launched("gelu_forward");
}
void gelu_backward(cudaStream_t s, const float* x, const float* dy, float* dx, int64_t n) {
  gelu_backward_k<<<blocks_for(n), kThreads, 0, s>>>(x, dy, dx, n);
  launched("gelu_backward");
}
void adamw(cudaStream_t s, float* p, const float* g, float* m, float* v, int64_t n, const AdamWCoefficients& c) {
  adamw_k<<<blocks_for(n), kThreads, 0, s>>>(p, g, m, v, n, c);
  launched("adamw_step");
}
void sum_squares(cudaStream_t s, const float* x, int64_t n, double* partial, double* result) {
  static_assert(kGrid == kSquaresPartials, "one partial sum per block");
  partial_squares_k<<<kGrid, kThreads, 0, s>>>(x, n, partial);
  launched("squared_norm");
  sum_doubles_k<<<1, kThreads, 0, s>>>(partial, kGrid, result);
  launched("squared_norm (final sum)");
}
void sum_doubles(cudaStream_t s, const double* x, int64_t n, double* result) {
  sum_doubles_k<<<1, kThreads, 0, s>>>(x, n, result);
  launched("sum");
}
void layernorm_forward(cudaStream_t s, const float* x, const float* gamma, const float* beta, float eps, float* y,
                       float* mean, float* rstd, int64_t rows, int64_t f) {
  if (rows == 0) return;
  layernorm_forward_k<<<rows_grid(rows, "layernorm_forward"), kThreads, 0, s>>>(x, gamma, beta, eps, y, mean, rstd, f);
  launched("layernorm_forward");
}
void layernorm_backward_dx(cudaStream_t s, const float* x, const float* gamma, const float* mean, const float* rstd,
                           const float* dy, float* dx, int64_t rows, int64_t f) {
  if (rows == 0) return;
  layernorm_backward_dx_k<<<rows_grid(rows, "layernorm_backward"), kThreads, 0, s>>>(x, gamma, mean, rstd, dy, dx, f);
  launched("layernorm_backward");
}
void layernorm_backward_params(cudaStream_t s, const float* x, const float* mean, const float* rstd, const float* dy,
                               float* dgamma, float* dbeta, int64_t rows, int64_t f, float* scratch) {
  if (rows == 0 || f == 0) return;
  if (rows <= kOnePassRows) {
    layernorm_param_sums_one_pass_k<<<column_blocks(f), kThreads, 0, s>>>(x, mean, rstd, dy, rows, f, dgamma, dbeta);
    launched("layernorm_backward (parameters)");
    return;
  }
  const int64_t chunks = column_chunks(rows);
  float *dgamma_partial = scratch, *dbeta_partial = scratch + chunks * f;
  layernorm_param_partials_k<<<blocks_for(chunks * f), kThreads, 0, s>>>(x, mean, rstd, dy, rows, f, dgamma_partial,
                                                                         dbeta_partial);
  launched("layernorm_backward (parameter partials)");
  if (dgamma) add_partials_k<<<blocks_for(f), kThreads, 0, s>>>(dgamma, dgamma_partial, chunks, f);
  if (dbeta) add_partials_k<<<blocks_for(f), kThreads, 0, s>>>(dbeta, dbeta_partial, chunks, f);
  launched("layernorm_backward (parameters)");
}
void l2_normalize_forward(cudaStream_t s, const float* x, float* y, int64_t rows, int64_t f) {
  if (rows == 0) return;
  l2_forward_k<<<rows_grid(rows, "l2_normalize_forward"), kThreads, 0, s>>>(x, y, f);
  launched("l2_normalize_forward");
}
void l2_normalize_backward(cudaStream_t s, const float* x, const float* dy, float* dx, int64_t rows, int64_t f) {
  if (rows == 0) return;
  l2_backward_k<<<rows_grid(rows, "l2_normalize_backward"), kThreads, 0, s>>>(x, dy, dx, f);
  launched("l2_normalize_backward");
}
void softmax_rows(cudaStream_t s, float* p, int64_t rows, int64_t sq, int64_t sk, bool causal) {
  if (rows == 0) return;
  softmax_rows_k<<<rows_grid(rows, "attention softmax"), kThreads, 0, s>>>(p, sq, sk, causal);
  launched("attention softmax");
}
void softmax_backward_rows(cudaStream_t s, const float* p, float* ds, int64_t rows, int64_t sk) {
  if (rows == 0) return;
  softmax_backward_rows_k<<<rows_grid(rows, "attention softmax backward"), kThreads, 0, s>>>(p, ds, sk);
  launched("attention softmax backward");
}
void embedding_forward(cudaStream_t s, const float* table, const int32_t* ids, float* out, int64_t n, int64_t e) {
  embedding_forward_k<<<blocks_for(n * e), kThreads, 0, s>>>(table, ids, out, n, e);
  launched("embedding_forward");
}
void embedding_backward(cudaStream_t s, const int32_t* groups, int64_t distinct, int64_t n, const float* dout,
                        float* dtable, int64_t e) {
  if (distinct == 0 || e == 0) return;
  embedding_backward_k<<<blocks_for(distinct * e), kThreads, 0, s>>>(groups, distinct, n, dout, dtable, e);
  launched("embedding_backward");
}
void patchify(cudaStream_t s, const float* image, float* cols, int64_t images, int64_t c, int64_t h, int64_t w,
              int64_t p) {
  const int64_t total = images * c * h * w;
  patchify_k<<<blocks_for(total), kThreads, 0, s>>>(image, cols, total, c, h, w, p);
  launched("patchify");
}
void unpatchify(cudaStream_t s, const float* cols, float* image, int64_t images, int64_t c, int64_t h, int64_t w,
                int64_t p) {
  const int64_t total = images * c * h * w;
  unpatchify_k<<<blocks_for(total), kThreads, 0, s>>>(cols, image, total, c, h, w, p);
  launched("unpatchify");
}
void cross_entropy_rows(cudaStream_t s, const float* logits, const int32_t* targets, int64_t rows, int64_t classes,
                        float scale, float* dlogits, double* row_loss) {
  if (rows == 0) return;
  cross_entropy_rows_k<<<rows_grid(rows, "cross_entropy"), kThreads, 0, s>>>(logits, targets, classes, scale, dlogits,
                                                                             row_loss);
  launched("cross_entropy");
}

void contrastive_tile_stats(cudaStream_t s, const float* raw, int64_t rows, int64_t w, float scale, int64_t col0,
                            int64_t label_offset, bool first, float* row_max, double* row_sum, float* label_logit) {
  if (rows == 0 || w == 0) return;
  contrastive_tile_stats_k<<<rows_grid(rows, "contrastive_forward"), kThreads, 0, s>>>(
      raw, w, scale, col0, label_offset, first, row_max, row_sum, label_logit);
  launched("contrastive_forward (tile)");
}
void contrastive_finish(cudaStream_t s, const float* row_max, const double* row_sum, const float* label_logit,
                        int64_t rows, float* lse, double* row_loss) {
  contrastive_finish_k<<<blocks_for(rows), kThreads, 0, s>>>(row_max, row_sum, label_logit, rows, lse, row_loss);
  launched("contrastive_forward (finish)");
}
void contrastive_tile_grad(cudaStream_t s, float* raw, int64_t rows, int64_t w, float scale, int64_t col0,
                           int64_t label_offset, const float* lse, double weight, bool first, double* d_scale_rows) {
  if (rows == 0 || w == 0) return;
  contrastive_tile_grad_k<<<rows_grid(rows, "contrastive_backward"), kThreads, 0, s>>>(
      raw, w, scale, col0, label_offset, lse, weight, first, d_scale_rows);
  launched("contrastive_backward (tile)");
}

__host__ __device__ int64_t contrastive_column_chunks(int64_t rows) {
  return rows > 0 ? (rows + kColumnStatRows - 1) / kColumnStatRows : 1;
}
void contrastive_column_stats(cudaStream_t s, const float* raw, int64_t rows, int64_t w, float scale, int64_t col0,
                              float* part_max, double* part_sum, float* col_max, double* col_sum, float* label_logit) {
  if (rows == 0 || w == 0) return;
  const int64_t chunks = contrastive_column_chunks(rows);
  contrastive_column_partials_k<<<blocks_for(chunks * w), kThreads, 0, s>>>(raw, rows, w, scale, part_max, part_sum);
  launched("contrastive_forward (column pieces)");
  contrastive_column_merge_k<<<blocks_for(w), kThreads, 0, s>>>(raw, part_max, part_sum, chunks, w, scale, col0,
                                                                col_max, col_sum, label_logit);
  launched("contrastive_forward (columns)");
}
void contrastive_shared_tile_grad(cudaStream_t s, float* raw, int64_t rows, int64_t w, float scale, int64_t col0,
                                  const float* row_lse, const float* col_lse, double weight, bool first,
                                  double* d_scale_rows) {
  if (rows == 0 || w == 0) return;
  contrastive_shared_tile_grad_k<<<rows_grid(rows, "contrastive_backward"), kThreads, 0, s>>>(
      raw, w, scale, col0, row_lse, col_lse, weight, first, d_scale_rows);
  launched("contrastive_backward (shared tile)");
}

namespace {
__global__ void head_pointers_k(HeadOperands o, int64_t batch, int64_t heads, float** pointers) {
  GRID_LOOP(i, o.count * batch * heads) {
    const int64_t j = i / (batch * heads), b = i % (batch * heads) / heads, h = i % heads;
    pointers[i] = o.base[j] + b * o.sample[j] + h * o.head[j];
  }
}
}  // namespace

void head_pointers(cudaStream_t s, const HeadOperands& operands, int64_t batch, int64_t heads, float** pointers) {
  if (operands.count == 0 || batch * heads == 0) return;
  head_pointers_k<<<blocks_for(operands.count * batch * heads), kThreads, 0, s>>>(operands, batch, heads, pointers);
  launched("attention (operand pointers)");
}

int fused_attention_width(int64_t head_dim) {
  for (int w : {16, 32, 64, 128})
    if (head_dim <= w) return w;
  return 0;
}

// One instance per register width; `Launch` gets the kernel's width as a constant.
template <class Launch>
void with_width(int64_t head_dim, const char* what, Launch launch) {
  switch (fused_attention_width(head_dim)) {
    case 16:
      return launch(std::integral_constant<int, 16>{});
    case 32:
      return launch(std::integral_constant<int, 32>{});
    case 64:
      return launch(std::integral_constant<int, 64>{});
    case 128:
      return launch(std::integral_constant<int, 128>{});
    default:
      invalid(std::string(what) + ": the fused kernels take heads of at most 128 features");
  }
}

void fused_attention_forward(cudaStream_t s, const float* q, const float* k, const float* v, float* out, float* saved,
                             int64_t batch, int64_t heads, int64_t sq, int64_t sk, int64_t head_dim, float scale,
                             bool causal) {
  if (batch == 0 || sq == 0) return;
  const int d = static_cast<int>(head_dim);
  with_width(head_dim, "attention_forward", [&](auto width) {
    fused_attention_forward_k<decltype(width)::value>
        <<<fused_grid(sq, batch * heads, "attention_forward"), kFusedRows, 0, s>>>(q, k, v, out, saved, heads, sq, sk,
                                                                                   heads * head_dim, d, scale, causal);
  });
  launched("attention_forward (fused)");
}

void fused_attention_backward(cudaStream_t s, const float* q, const float* k, const float* v, const float* saved,
                              const float* dout, float* dq, float* dk, float* dv, float* delta, int64_t batch,
                              int64_t heads, int64_t sq, int64_t sk, int64_t head_dim, float scale, bool causal) {
  if (batch == 0 || sk == 0) return;  // with no queries, the dk dv kernel writes zeros
  const int d = static_cast<int>(head_dim);
  const int64_t width = heads * head_dim, rows = batch * heads * sq;
  fused_attention_delta_k<<<blocks_for(rows), kThreads, 0, s>>>(saved, dout, delta, heads, sq, width, d, rows);
  launched("attention_backward (fused, delta)");
  with_width(head_dim, "attention_backward", [&](auto w) {
    fused_attention_dq_k<decltype(w)::value><<<fused_grid(sq, batch * heads, "attention_backward"), kFusedRows, 0, s>>>(
        q, k, v, saved, dout, delta, dq, heads, sq, sk, width, d, scale, causal);
    launched("attention_backward (fused, dq)");
    fused_attention_dkv_k<decltype(w)::value>
        <<<fused_grid(sk, batch * heads, "attention_backward"), kFusedRows, 0, s>>>(
            q, k, v, saved, dout, delta, dk, dv, heads, sq, sk, width, d, scale, causal);
    launched("attention_backward (fused, dk dv)");
  });
}

}  // namespace braid_cuda
