// The CUDA backend's kernels (kernels.cu), as launchers: each enqueues on `stream` and
// checks the launch. No reduction uses atomics: a row is reduced by one block in a fixed
// tree, a column by lanes (or chunks) of rows and then those in order, a whole tensor by a
// fixed grid then one block, so the same inputs give the same bits on the same GPU.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace braid_cuda {

struct AdamWCoefficients {
  float decay, beta1, rest1, beta2, rest2, step_size, sqrt_correction2, eps;
};

void fill_rows(cudaStream_t s, float* y, const float* row, int64_t rows, int64_t cols);  // y[r] = row
// Column sums run in one launch up to 1024 rows, else in two passes (chunks of rows, then the
// chunks in order) whose scratch holds column_sums_scratch(rows, cols) floats (0: none needed).
__host__ __device__ int64_t column_chunks(int64_t rows);
int64_t column_sums_scratch(int64_t rows, int64_t cols);
void column_sums_add(cudaStream_t s, float* out, const float* x, int64_t rows, int64_t cols,
                     float* scratch);  // out += sum_r x[r]
void add(cudaStream_t s, float* y, const float* x, int64_t n);
void scale(cudaStream_t s, float* t, float factor, int64_t n);
void gelu_forward(cudaStream_t s, const float* x, float* y, int64_t n);
void gelu_backward(cudaStream_t s, const float* x, const float* dy, float* dx, int64_t n);
void adamw(cudaStream_t s, float* p, const float* g, float* m, float* v, int64_t n, const AdamWCoefficients& c);
// *result (device) = sum of x[i]^2 in double; partial: kSquaresPartials doubles of scratch.
inline constexpr int kSquaresPartials = 256;
void sum_squares(cudaStream_t s, const float* x, int64_t n, double* partial, double* result);
// *result (device) = sum of x[i] in double, in index order's fixed tree.
void sum_doubles(cudaStream_t s, const double* x, int64_t n, double* result);

void layernorm_forward(cudaStream_t s, const float* x, const float* gamma, const float* beta, float eps, float* y,
                       float* mean, float* rstd, int64_t rows, int64_t f);
void layernorm_backward_dx(cudaStream_t s, const float* x, const float* gamma, const float* mean, const float* rstd,
                           const float* dy, float* dx, int64_t rows, int64_t f);
// dgamma += sum_r dy (x - mean) rstd, dbeta += sum_r dy (either may be null); scratch:
// 2 * column_sums_scratch(rows, f) floats.
void layernorm_backward_params(cudaStream_t s, const float* x, const float* mean, const float* rstd, const float* dy,
                               float* dgamma, float* dbeta, int64_t rows, int64_t f, float* scratch);
void l2_normalize_forward(cudaStream_t s, const float* x, float* y, int64_t rows, int64_t f);
void l2_normalize_backward(cudaStream_t s, const float* x, const float* dy, float* dx, int64_t rows, int64_t f);

// Rows of `sk` scaled scores, in blocks of `sq` query rows: softmax in place; with causal,
// row i of a block sees keys 0..i and the rest become exactly 0.
void softmax_rows(cudaStream_t s, float* p, int64_t rows, int64_t sq, int64_t sk, bool causal);
// ds = p * (ds - sum_j p ds), per row.
void softmax_backward_rows(cudaStream_t s, const float* p, float* ds, int64_t rows, int64_t sk);

void embedding_forward(cudaStream_t s, const float* table, const int32_t* ids, float* out, int64_t n, int64_t e);
// dtable[ids[i]] += dout[i], positions in order per feature. groups (device) lists the n
// positions grouped by id (in order within an id), then where each of the `distinct` ids'
// positions start (distinct + 1 offsets), then the ids.
void embedding_backward(cudaStream_t s, const int32_t* groups, int64_t distinct, int64_t n, const float* dout,
                        float* dtable, int64_t e);

// images (B, C, H, W) <-> patch rows (B * (H/P) * (W/P), C*P*P), each flattened (c, i, j).
void patchify(cudaStream_t s, const float* image, float* cols, int64_t images, int64_t c, int64_t h, int64_t w,
              int64_t p);
void unpatchify(cudaStream_t s, const float* cols, float* image, int64_t images, int64_t c, int64_t h, int64_t w,
                int64_t p);

// Per row: row_loss[r] = -log softmax(logits[r])[target] (0 for target -1) and, with
// dlogits, (softmax - onehot) * scale (zero rows for ignored targets).
void cross_entropy_rows(cudaStream_t s, const float* logits, const int32_t* targets, int64_t rows, int64_t classes,
                        float scale, float* dlogits, double* row_loss);

// The tiled contrastive loss, per tile of w columns of raw dot products R (rows x w, logits
// s R), row r's label at column label_offset + r:
// stats merges the tile's max and sum of exponentials into row r's running (max, sum)
// (first: starts them) and keeps the label's logit when its column is in the tile;
void contrastive_tile_stats(cudaStream_t s, const float* raw, int64_t rows, int64_t w, float scale, int64_t col0,
                            int64_t label_offset, bool first, float* row_max, double* row_sum, float* label_logit);
// finish: lse[r] = max + log(sum), row_loss[r] = lse[r] - label logit;
void contrastive_finish(cudaStream_t s, const float* row_max, const double* row_sum, const float* label_logit,
                        int64_t rows, float* lse, double* row_loss);
// grad: R becomes d logits = weight (exp(s R - lse) - onehot) in place, and d_scale_rows[r]
// (first: =, else +=) the sum of d logits x R over the tile's columns.
void contrastive_tile_grad(cudaStream_t s, float* raw, int64_t rows, int64_t w, float scale, int64_t col0,
                           int64_t label_offset, const float* lse, double weight, bool first, double* d_scale_rows);

// The shared layout (one process: local and gathered rows the same, label_offset 0, every
// row in the tile): R's columns are whole text -> image softmaxes.
// column stats: column c's (max, sum) and its label logit (row col0 + c) into col_max[c],
// col_sum[c], label_logit[c], complete in one tile; scratch: contrastive_column_chunks(rows)
// x w of each part_*.
__host__ __device__ int64_t contrastive_column_chunks(int64_t rows);
void contrastive_column_stats(cudaStream_t s, const float* raw, int64_t rows, int64_t w, float scale, int64_t col0,
                              float* part_max, double* part_sum, float* col_max, double* col_sum, float* label_logit);
// shared grad: R becomes d logits = weight (exp(s R - row_lse) + exp(s R - col_lse) - 2
// onehot) in place, both directions' gradient in one buffer; d_scale_rows as tile_grad.
void contrastive_shared_tile_grad(cudaStream_t s, float* raw, int64_t rows, int64_t w, float scale, int64_t col0,
                                  const float* row_lse, const float* col_lse, double weight, bool first,
                                  double* d_scale_rows);

// Attention's operands per (sample, head): pointers[j * batch * heads + b * heads + h] =
// operands.base[j] + b * sample[j] + h * head[j], for the pointer-array batched GEMMs.
inline constexpr int kMostHeadOperands = 9;
struct HeadOperands {
  float* base[kMostHeadOperands];
  int64_t sample[kMostHeadOperands], head[kMostHeadOperands];
  int count;
};
void head_pointers(cudaStream_t s, const HeadOperands& operands, int64_t batch, int64_t heads, float** pointers);

// Fused attention (BRAID_CUDA_FUSED_ATTENTION=1): no (Sq, Sk) scores in memory. Forward
// writes out and saved (B, H, Sq, head_dim + 1): each query row's output and log-sum-exp.
// Backward recomputes the probabilities from them; delta: B * H * Sq floats of scratch.
// fused_attention_width: the kernels' register width for a head (16, 32, 64 or 128), 0 past 128.
int fused_attention_width(int64_t head_dim);
void fused_attention_forward(cudaStream_t s, const float* q, const float* k, const float* v, float* out, float* saved,
                             int64_t batch, int64_t heads, int64_t sq, int64_t sk, int64_t head_dim, float scale,
                             bool causal);
void fused_attention_backward(cudaStream_t s, const float* q, const float* k, const float* v, const float* saved,
                              const float* dout, float* dq, float* dk, float* dv, float* delta, int64_t batch,
                              int64_t heads, int64_t sq, int64_t sk, int64_t head_dim, float scale, bool causal);

}  // namespace braid_cuda
