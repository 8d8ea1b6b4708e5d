/*
 * braid/tensor.h: borrowed tensor views, and the ops that take them: CLIP's contrastive
 * loss in its distributed local-loss form, tiled after Inf-CL (arXiv 2410.17243). Included
 * by braid.h; the conventions of braid.h hold here too.
 *
 * A braid_tensor has the layout of DLPack's DLTensor (v0.8: data, device {type, id}, ndim,
 * dtype {code, bits, lanes}, shape, strides, byte_offset), so a DLPack bridge is a cast and
 * the constants below are DLPack's. braid reads and writes through the view during the
 * call only: it never frees one, and keeps no pointer into it after returning.
 *
 * Supported: float32 tensors, 2-D, each row contiguous (strides NULL, or strides[1] == 1
 * with any row stride strides[0] >= shape[1]), in CPU memory, or in CUDA memory with dense
 * rows (row stride == shape[1]). Every tensor of a call is on one device (local_image's);
 * anything else is an error that says what is supported. Every op takes a stream: for CUDA
 * tensors the cudaStream_t its work is ordered on (NULL: the device's default stream), run
 * by the CUDA plugin (libbraid-cuda.so, loaded on first use; BRAID_ERR_PLUGIN when it
 * cannot run); the call returns once the loss or d logit_scale is on the host, the
 * gradients may still be in flight on the stream. For CPU tensors the stream is ignored
 * and the call returns when the work is done.
 *
 * The distributed contrastive loss, one call per rank and step:
 *
 *   gather every rank's L2-normalised embeddings: all_image, all_text (N, E), this rank's
 *   n rows at row_offset (rank r of R with equal shares: n = N / R, row_offset = r * n)
 *   braid_contrastive_options o = BRAID_CONTRASTIVE_OPTIONS_INIT;
 *   o.row_offset = r * n;
 *   braid_contrastive_forward(&local_image, &local_text, &all_image, &all_text, s, &o,
 *                             &stats, &loss, NULL);
 *   ... later, with d total / d loss = grad_loss:
 *   braid_contrastive_backward(..., &stats, grad_loss, &d_local_image, &d_local_text,
 *                              &d_all_image, &d_all_text, &d_s, NULL);
 *   reduce-scatter (sum) d_all_* to the rows' owners and add this rank's share to
 *   d_local_* (open_clip's gather_with_grad); d_s joins the host's data-parallel gradient
 *   reduction like any parameter's gradient.
 *
 * The loss is open_clip's ClipLoss(local_loss=True, gather_with_grad=True), whose average
 * over the ranks is the single-process CLIP loss of the N pairs. Memory besides the
 * inputs and gradients: O(n * tile + N) floats, never an n x N matrix; the backward
 * recomputes each tile's logits. Results do not depend on the number of threads.
 */
/* braid.h first, before this header's guard: it includes every header, in an order where
 * each finds what it needs, whichever header a program includes first. */
#include "braid/braid.h"

#ifndef BRAID_TENSOR_H
#define BRAID_TENSOR_H

#ifdef __cplusplus
extern "C" {
#endif

/* ---- tensor views ---------------------------------------------------------------- */

/* braid_device.type: DLPack's DLDeviceType values. */
typedef enum braid_device_type {
  BRAID_DEVICE_CPU = 1, /* kDLCPU: host memory */
  BRAID_DEVICE_CUDA = 2 /* kDLCUDA: CUDA device memory, index = the CUDA device ordinal */
} braid_device_type;

typedef struct braid_device {
  int32_t type;  /* a braid_device_type */
  int32_t index; /* device ordinal; 0 for the CPU */
} braid_device;

/* braid_dtype.code: DLPack's DLDataTypeCode values. */
typedef enum braid_dtype_code {
  BRAID_DTYPE_INT = 0,   /* kDLInt */
  BRAID_DTYPE_UINT = 1,  /* kDLUInt */
  BRAID_DTYPE_FLOAT = 2, /* kDLFloat: IEEE float, bits 16, 32 or 64 */
  BRAID_DTYPE_BFLOAT = 4 /* kDLBfloat: bfloat16 */
} braid_dtype_code;

typedef struct braid_dtype {
  uint8_t code;   /* a braid_dtype_code */
  uint8_t bits;   /* bits per lane: float32 is {BRAID_DTYPE_FLOAT, 32, 1} */
  uint16_t lanes; /* 1 for scalars */
} braid_dtype;

/* A borrowed view of someone else's memory; braid never frees or keeps it. */
typedef struct braid_tensor {
  void* data; /* the buffer's start; the first element is at data + byte_offset */
  braid_device device;
  int32_t ndim;
  braid_dtype dtype;
  const int64_t* shape;   /* ndim extents */
  const int64_t* strides; /* ndim strides in elements; NULL: row-major contiguous */
  uint64_t byte_offset;
} braid_tensor;

/* ---- the distributed contrastive loss (CLIP) -------------------------------------- */

typedef struct braid_contrastive_options {
  size_t struct_size; /* sizeof(braid_contrastive_options) */
  uint32_t version;   /* BRAID_CONTRASTIVE_OPTIONS_VERSION */
  int64_t row_offset; /* the local rows' first row in the gathered batch */
  /* Gathered rows (logit columns) per tile, 0: default (512). Each tile holds n x tile
   * logits per direction (n x tile in all when local and all are the same memory). */
  int32_t tile;
} braid_contrastive_options;

#define BRAID_CONTRASTIVE_OPTIONS_VERSION 1
#define BRAID_CONTRASTIVE_OPTIONS_INIT \
  { sizeof(braid_contrastive_options), BRAID_CONTRASTIVE_OPTIONS_VERSION, 0, 0 }

/* Forward. local_image, local_text: (n, E), this rank's L2-normalised embeddings;
 * all_image, all_text: (N, E), every rank's, gathered by the host, this rank's at rows
 * [row_offset, row_offset + n). logit_scale: the exponentiated scale s (finite). options:
 * NULL for row_offset 0 and the default tile.
 * Writes *loss = (1 / 2n) * sum over the n local rows i of
 *   [CE(s * I_local[i] T_all^T, label row_offset + i) + CE(s * T_local[i] I_all^T, label row_offset + i)]
 * (0 when n is 0), and stats (float32, (2, n), caller-allocated): row 0 the log-sum-exp of
 * each local image -> text logit row, row 1 of each text -> image row, for the backward.
 * When local and all view the same memory (one process: n == N, row_offset 0), one GEMM
 * per tile serves both directions.
 * BRAID_ERR_INVALID_ARGUMENT (naming the argument and the shapes) for a NULL pointer,
 * E that differs between the tensors, n > N, rows outside [0, N), a negative tile, a
 * non-finite scale or a too small options->struct_size; BRAID_ERR_UNSUPPORTED for a
 * tensor this build does not handle (see above). */
BRAID_API braid_status braid_contrastive_forward(const braid_tensor* local_image, const braid_tensor* local_text,
                                                 const braid_tensor* all_image, const braid_tensor* all_text,
                                                 float logit_scale, const braid_contrastive_options* options,
                                                 braid_tensor* stats, float* loss, void* stream);
typedef braid_status (*braid_contrastive_forward_fn)(const braid_tensor*, const braid_tensor*, const braid_tensor*,
                                                     const braid_tensor*, float, const braid_contrastive_options*,
                                                     braid_tensor*, float*, void*);

/* Backward of grad_loss * loss, given the forward's inputs and stats. Overwrites
 * grad_local_image, grad_local_text (n, E), the local rows' gradients; grad_all_image,
 * grad_all_text (N, E), the gathered rows' gradients, which the host reduce-scatters (sum)
 * to their owners, each adding its share to its grad_local_*; and *grad_logit_scale
 * (d / d logit_scale of this rank's grad_loss * loss). Any of them may be NULL when not
 * wanted. The gradient tensors must not overlap the inputs or each other.
 * Only grad_local_* plus the owner's share of grad_all_* is defined: when local and all
 * view the same memory, each modality's whole gradient goes to grad_local_* (to
 * grad_all_* if grad_local_* is NULL) and the other one is zeroed. */
BRAID_API braid_status braid_contrastive_backward(const braid_tensor* local_image, const braid_tensor* local_text,
                                                  const braid_tensor* all_image, const braid_tensor* all_text,
                                                  float logit_scale, const braid_contrastive_options* options,
                                                  const braid_tensor* stats, float grad_loss,
                                                  braid_tensor* grad_local_image, braid_tensor* grad_local_text,
                                                  braid_tensor* grad_all_image, braid_tensor* grad_all_text,
                                                  float* grad_logit_scale, void* stream);
typedef braid_status (*braid_contrastive_backward_fn)(const braid_tensor*, const braid_tensor*, const braid_tensor*,
                                                      const braid_tensor*, float, const braid_contrastive_options*,
                                                      const braid_tensor*, float, braid_tensor*, braid_tensor*,
                                                      braid_tensor*, braid_tensor*, float*, void*);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* BRAID_TENSOR_H */
