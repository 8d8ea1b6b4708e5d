/*
 * braid_device_v2.h: version 2 of the device plugin interface: memory, copies,
 * streams and events, and a table of the reference ops (one entry per method of
 * braid's nn::Ops), each issued on a stream. Frozen: a new version gets a new
 * header and a new exported symbol, and the loader tries the newest first.
 *
 * A device plugin is a shared library libbraid-<name>.so that exports
 *   const braid_device_plugin_v2 braidDevicePlugin_v2;
 * (and may export braidDevicePlugin_v1 too, for older braids).
 *
 * Rules for every function:
 * - Returns 0 on success; on failure a non-zero code and a NUL-terminated message
 *   in `error` (at most error_size bytes). Never throws, never aborts. The code is
 *   BRAID_DEVICE_INVALID_ARGUMENT for the caller's mistakes (shapes, ids out of
 *   range, a null tensor), any other non-zero value for the device's failures.
 * - Functions that take a stream only enqueue work on it: they may return before
 *   it ran. Results written to host memory (a loss, a norm) are the exception:
 *   the call returns once they are written.
 * - Memory comes from `alloc` of the same plugin and device, except `copy`'s
 *   host side. The host backend's device memory is host memory.
 *
 * Tensors are dense, row-major views (no strides): see braid_device_tensor_v2.
 * Ops follow nn::Ops (core/nn/ops.hpp), which is the reference for shapes and
 * formulas:
 * - outputs and input gradients are overwritten; parameter gradients (dweight,
 *   dbias, dgamma, dbeta, dtable) are added to (+=) so microbatches sum up;
 * - a null gradient pointer skips that gradient, where nn::Ops takes it by pointer
 *   (attention_backward's dq, dk and dv are references there: required here too);
 * - the caller allocates every output with its shape; the plugin checks shapes
 *   and fails with a message naming the op and the argument;
 * - results do not depend on timing: no atomics in reductions, so the same
 *   inputs give the same bits on the same device.
 */
#ifndef BRAID_DEVICE_V2_H
#define BRAID_DEVICE_V2_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BRAID_DEVICE_MAX_RANK 8
#define BRAID_DEVICE_INVALID_ARGUMENT 1

typedef enum braid_device_dtype_v2 {
  BRAID_DEVICE_F32 = 0, /* float */
  BRAID_DEVICE_I32 = 1  /* int32_t: token ids, targets */
} braid_device_dtype_v2;

typedef struct braid_device_tensor_v2 {
  void* data;    /* the plugin's device memory (NULL only when an element count is 0) */
  int32_t dtype; /* braid_device_dtype_v2 */
  int32_t rank;  /* 0..BRAID_DEVICE_MAX_RANK */
  int64_t shape[BRAID_DEVICE_MAX_RANK];
} braid_device_tensor_v2;

/* Opaque, owned by the plugin. */
typedef struct braid_device_stream_s* braid_device_stream_v2;
typedef struct braid_device_event_s* braid_device_event_v2;

typedef struct braid_device_properties_v2 {
  size_t struct_size; /* set by the caller; the plugin fills what fits */
  char name[256];
  uint64_t memory_bytes;
  int32_t multiprocessors;
  int32_t compute_major, compute_minor;
  int32_t pci_bus_id;
  int32_t host_memory; /* 1 when device memory is host memory (the host backend) */
} braid_device_properties_v2;

typedef struct braid_device_memory_stats_v2 {
  size_t struct_size;   /* set by the caller */
  uint64_t in_use;      /* bytes allocated and not yet freed */
  uint64_t peak_in_use; /* the most in use at once since init */
  uint64_t reserved;    /* bytes held from the system (the caching pool's size) */
  uint64_t allocations; /* calls to alloc since init */
} braid_device_memory_stats_v2;

typedef enum braid_copy_kind_v2 {
  BRAID_COPY_HOST_TO_DEVICE = 0,
  BRAID_COPY_DEVICE_TO_HOST = 1,
  BRAID_COPY_DEVICE_TO_DEVICE = 2
} braid_copy_kind_v2;

/* The ops, for supports(): one per entry of braid_device_ops_v2, in its order. */
typedef enum braid_device_op_v2 {
  BRAID_OP_LINEAR_FORWARD = 0,
  BRAID_OP_LINEAR_BACKWARD,
  BRAID_OP_LAYERNORM_FORWARD,
  BRAID_OP_LAYERNORM_BACKWARD,
  BRAID_OP_L2_NORMALIZE_FORWARD,
  BRAID_OP_L2_NORMALIZE_BACKWARD,
  BRAID_OP_ADD,
  BRAID_OP_GELU_FORWARD,
  BRAID_OP_GELU_BACKWARD,
  BRAID_OP_ATTENTION_FORWARD,
  BRAID_OP_ATTENTION_BACKWARD,
  BRAID_OP_EMBEDDING_FORWARD,
  BRAID_OP_EMBEDDING_BACKWARD,
  BRAID_OP_PATCH_EMBEDDING_FORWARD,
  BRAID_OP_PATCH_EMBEDDING_BACKWARD,
  BRAID_OP_CROSS_ENTROPY,
  BRAID_OP_CONTRASTIVE_FORWARD,
  BRAID_OP_CONTRASTIVE_BACKWARD,
  BRAID_OP_CONTRASTIVE_LOSS,
  BRAID_OP_ADAMW_STEP,
  BRAID_OP_SQUARED_NORM,
  BRAID_OP_SCALE,
  BRAID_OP_COUNT_V2
} braid_device_op_v2;

typedef struct braid_adamw_config_v2 {
  double lr, beta1, beta2, eps, weight_decay;
} braid_adamw_config_v2;

typedef braid_device_tensor_v2 braid_dt; /* shorthand for the table below */
typedef braid_device_stream_v2 braid_ds;

/* One entry per nn::Ops method (the contrastive loss as its tiled forward and backward);
 * an entry is NULL exactly when supports() says 0. */
typedef struct braid_device_ops_v2 {
  int (*linear_forward)(braid_ds, const braid_dt* x, const braid_dt* weight, const braid_dt* bias, braid_dt* y,
                        char* error, size_t error_size);
  int (*linear_backward)(braid_ds, const braid_dt* x, const braid_dt* weight, const braid_dt* dy, braid_dt* dx,
                         braid_dt* dweight, braid_dt* dbias, char* error, size_t error_size);
  /* mean and rstd: (rows) floats, written by forward, read by backward. */
  int (*layernorm_forward)(braid_ds, const braid_dt* x, const braid_dt* gamma, const braid_dt* beta, float eps,
                           braid_dt* y, braid_dt* mean, braid_dt* rstd, char* error, size_t error_size);
  int (*layernorm_backward)(braid_ds, const braid_dt* x, const braid_dt* gamma, const braid_dt* mean,
                            const braid_dt* rstd, const braid_dt* dy, braid_dt* dx, braid_dt* dgamma, braid_dt* dbeta,
                            char* error, size_t error_size);
  int (*l2_normalize_forward)(braid_ds, const braid_dt* x, braid_dt* y, char* error, size_t error_size);
  int (*l2_normalize_backward)(braid_ds, const braid_dt* x, const braid_dt* dy, braid_dt* dx, char* error,
                               size_t error_size);
  int (*add)(braid_ds, braid_dt* y, const braid_dt* x, char* error, size_t error_size);
  int (*gelu_forward)(braid_ds, const braid_dt* x, braid_dt* y, char* error, size_t error_size);
  int (*gelu_backward)(braid_ds, const braid_dt* x, const braid_dt* dy, braid_dt* dx, char* error, size_t error_size);
  /* saved: what backward needs, in the shape attention_saved_shape gives (the host
   * backend saves the softmax probabilities (B, H, Sq, Sk); a fused kernel may save less). */
  int (*attention_forward)(braid_ds, const braid_dt* q, const braid_dt* k, const braid_dt* v, int64_t heads,
                           int32_t causal, braid_dt* out, braid_dt* saved, char* error, size_t error_size);
  int (*attention_backward)(braid_ds, const braid_dt* q, const braid_dt* k, const braid_dt* v, int64_t heads,
                            int32_t causal, const braid_dt* saved, const braid_dt* dout, braid_dt* dq, braid_dt* dk,
                            braid_dt* dv, char* error, size_t error_size);
  /* ids: I32 (n). */
  int (*embedding_forward)(braid_ds, const braid_dt* table, const braid_dt* ids, braid_dt* out, char* error,
                           size_t error_size);
  int (*embedding_backward)(braid_ds, const braid_dt* ids, const braid_dt* dout, braid_dt* dtable, char* error,
                            size_t error_size);
  int (*patch_embedding_forward)(braid_ds, const braid_dt* image, int64_t patch, const braid_dt* weight,
                                 const braid_dt* bias, braid_dt* out, char* error, size_t error_size);
  int (*patch_embedding_backward)(braid_ds, const braid_dt* image, int64_t patch, const braid_dt* weight,
                                  const braid_dt* dout, braid_dt* dimage, braid_dt* dweight, braid_dt* dbias,
                                  char* error, size_t error_size);
  /* targets: I32 (rows), -1 ignored. *loss is host memory, written before the call returns. */
  int (*cross_entropy)(braid_ds, const braid_dt* logits, const braid_dt* targets, int64_t normalizer, braid_dt* dlogits,
                       float* loss, char* error, size_t error_size);
  /* CLIP's contrastive loss, tiled (Inf-CL): local_* (n, E) this rank's L2-normalised
   * embeddings, all_* (N, E) every rank's with this rank's at rows [row_offset, row_offset
   * + n); logits = logit_scale * I T^T, never stored whole: `tile` columns at a time (0: the
   * backend's default), O(n * tile) working memory.
   * forward: *sum (host) = sum over the n local rows of both directions' cross-entropies
   * (label: column row_offset + i); stats F32 (2, n): the log-sum-exp of each local row,
   * image -> text then text -> image, for the backward.
   * backward: the gradients of weight * sum, overwritten (NULL: not computed), and *d_scale
   * (host) = d (weight * sum) / d logit_scale. all_* rows' gradients belong to the ranks that
   * own those rows (the caller reduce-scatters them); only the sum of local_* and all_*
   * gradients of the same rows is defined.
   * loss: both at once (the trainer's nn::Ops::contrastive_loss), free to keep the logits
   * between the two when one tile spans all N columns; stats is scratch here. The C ABI's
   * braid_contrastive_forward/backward call the two halves. */
  int (*contrastive_forward)(braid_ds, const braid_dt* local_image, const braid_dt* local_text,
                             const braid_dt* all_image, const braid_dt* all_text, int64_t row_offset, float logit_scale,
                             int64_t tile, braid_dt* stats, double* sum, char* error, size_t error_size);
  int (*contrastive_backward)(braid_ds, const braid_dt* local_image, const braid_dt* local_text,
                              const braid_dt* all_image, const braid_dt* all_text, int64_t row_offset,
                              float logit_scale, int64_t tile, const braid_dt* stats, double weight,
                              braid_dt* d_local_image, braid_dt* d_local_text, braid_dt* d_all_image,
                              braid_dt* d_all_text, double* d_scale, char* error, size_t error_size);
  int (*contrastive_loss)(braid_ds, const braid_dt* local_image, const braid_dt* local_text, const braid_dt* all_image,
                          const braid_dt* all_text, int64_t row_offset, float logit_scale, int64_t tile,
                          braid_dt* stats, double weight, double* sum, braid_dt* d_local_image, braid_dt* d_local_text,
                          braid_dt* d_all_image, braid_dt* d_all_text, double* d_scale, char* error, size_t error_size);
  /* step: the steps taken including this one (1 on the first); m and v start at zero. */
  int (*adamw_step)(braid_ds, braid_dt* param, const braid_dt* grad, braid_dt* m, braid_dt* v, int64_t step,
                    const braid_adamw_config_v2* config, char* error, size_t error_size);
  /* *result (host) = the sum of squares, accumulated in double. */
  int (*squared_norm)(braid_ds, const braid_dt* t, double* result, char* error, size_t error_size);
  int (*scale)(braid_ds, braid_dt* t, float factor, char* error, size_t error_size);
} braid_device_ops_v2;

typedef struct braid_device_plugin_v2 {
  uint32_t interface_version; /* 2 */
  const char* name;           /* "host", "cuda" */
  /* Prepares the plugin; reports why devices are unusable (no driver...). */
  int (*init)(char* error, size_t error_size);
  int (*device_count)(int32_t* count, char* error, size_t error_size);
  int (*device_properties)(int32_t device, braid_device_properties_v2* properties, char* error, size_t error_size);
  /* Runs a kernel on the device and checks its result: the device computes. */
  int (*self_test)(int32_t device, char* error, size_t error_size);

  /* Memory: stream-ordered, from the plugin's caching pool (no system allocation per
   * call once the pool is warm). free(NULL) does nothing. */
  int (*alloc)(int32_t device, size_t bytes, braid_device_stream_v2 stream, void** ptr, char* error, size_t error_size);
  int (*free)(int32_t device, void* ptr, braid_device_stream_v2 stream, char* error, size_t error_size);
  int (*memory_stats)(int32_t device, braid_device_memory_stats_v2* stats, char* error, size_t error_size);
  /* Host memory given to a copy must stay valid until the stream has run it. */
  int (*copy)(void* dst, const void* src, size_t bytes, int32_t kind, braid_device_stream_v2 stream, char* error,
              size_t error_size);
  int (*memset_zero)(void* dst, size_t bytes, braid_device_stream_v2 stream, char* error, size_t error_size);

  /* Streams and events. */
  int (*stream_create)(int32_t device, braid_device_stream_v2* stream, char* error, size_t error_size);
  int (*stream_destroy)(braid_device_stream_v2 stream, char* error, size_t error_size);
  /* A stream object over the caller's own native stream (a cudaStream_t; NULL: the
   * device's default stream), for hosts that order work on their streams: stream_destroy
   * then releases the object only, never the native stream. */
  int (*stream_wrap)(int32_t device, void* native, braid_device_stream_v2* stream, char* error, size_t error_size);
  int (*stream_synchronize)(braid_device_stream_v2 stream, char* error, size_t error_size);
  int (*event_create)(int32_t device, braid_device_event_v2* event, char* error, size_t error_size);
  int (*event_destroy)(braid_device_event_v2 event, char* error, size_t error_size);
  int (*event_record)(braid_device_event_v2 event, braid_device_stream_v2 stream, char* error, size_t error_size);
  /* Work enqueued on `stream` after this call waits for the event. */
  int (*stream_wait_event)(braid_device_stream_v2 stream, braid_device_event_v2 event, char* error, size_t error_size);
  int (*event_synchronize)(braid_device_event_v2 event, char* error, size_t error_size);

  /* Ops: supports(op) is 1 when ops has that entry, else 0. attention_saved_shape
   * fills saved's dtype, rank and shape for attention_forward of q (B, Sq, H*D) and
   * k (B, Sk, H*D). */
  int (*supports)(int32_t op);
  int (*attention_saved_shape)(const braid_device_tensor_v2* q, const braid_device_tensor_v2* k, int64_t heads,
                               int32_t causal, braid_device_tensor_v2* saved, char* error, size_t error_size);
  const braid_device_ops_v2* ops;

  void (*finalize)(void);
} braid_device_plugin_v2;

#define BRAID_DEVICE_PLUGIN_SYMBOL_V2 "braidDevicePlugin_v2"

#ifdef __cplusplus
}
#endif

#endif /* BRAID_DEVICE_V2_H */
