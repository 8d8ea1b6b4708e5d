/*
 * braid/data.h: data reordering (DistTrain) for a host data loader. Included by
 * braid.h; the conventions of braid.h hold here too.
 *
 * A loader that has drawn a global batch gives braid each sample's sizes (or its
 * per-module costs) and a plan; braid returns, for every sample, the data-parallel
 * rank it goes to in each module and the microbatch it runs in:
 *
 *  - intra-microbatch: samples go to DP ranks with equal counts by longest processing
 *    time first (the costliest sample to the least loaded rank with room), so ranks
 *    finish together. When modules have different DP widths (a disaggregated encoder
 *    with DP 4 beside an llm with DP 6) the assignment is on a grid of lcm(widths)
 *    cells: cell c belongs to rank c / (cells / dp) of a module with width dp, so every
 *    module's ranks get whole runs of cells and equal counts.
 *  - inter-microbatch: each pipeline's microbatches run in the order that minimises its
 *    1F1B step time (cells that share a rank in any module form one pipeline group and
 *    share one order).
 *
 * The answer is deterministic: every rank that calls with the same batch and plan gets
 * the same assignment, without communication.
 */
/* braid.h first, before this header's guard: it includes every header, in an order where
 * each finds what it needs, whichever header a program includes first. */
#include "braid/braid.h"

#ifndef BRAID_DATA_H
#define BRAID_DATA_H

#ifdef __cplusplus
extern "C" {
#endif

/* One global batch, described per sample. Either sizes (each array `samples` long, or
 * NULL where every sample has the run's nominal size; arrays for inputs the model does
 * not have are ignored), priced by braid's cost model; or module_costs, which then
 * take precedence over the sizes. */
typedef struct braid_sample_batch {
  size_t struct_size; /* sizeof(braid_sample_batch) */
  /* A multiple of (DP cells x microbatches), see braid_reorder_info; at most 2^24
   * (16777216): more is BRAID_ERR_INVALID_ARGUMENT, before any array is read. */
  size_t samples;
  const int32_t* image_resolution;           /* pixels per side of the encoder's input image */
  const int32_t* text_tokens;                /* text tokens */
  const int32_t* audio_tokens;               /* audio frames */
  const int32_t* generated_image_resolution; /* pixels per side of the generated image */
  /* Or: samples x braid_plan_module_count costs, row-major ([i * modules + m] for
   * module m of braid_plan_module), in any one unit (seconds, FLOPs, tokens): only their
   * ratios matter. Finite and not negative. */
  const double* module_costs;
} braid_sample_batch;

#define BRAID_SAMPLE_BATCH_INIT \
  { sizeof(braid_sample_batch), 0, NULL, NULL, NULL, NULL, NULL }

typedef enum braid_reordering {
  BRAID_REORDER_NONE = 0,       /* dataset order: rank r takes the r-th slice of the batch */
  BRAID_REORDER_INTRA = 1,      /* LPT over the ranks; microbatches in sample order */
  BRAID_REORDER_INTRA_INTER = 2 /* and each pipeline's microbatches in their best 1F1B order */
} braid_reordering;

typedef struct braid_reorder_options {
  size_t struct_size; /* sizeof(braid_reorder_options) */
  uint32_t version;   /* BRAID_REORDER_OPTIONS_VERSION */
  braid_reordering reordering;
  /* inter search: 1F1B step times per pipeline group (0: braid's default, 2000). The search
   * times each of its starting orders (the input order and a few heuristic ones) even past
   * it: a budget below their count gives their best (braid_reorder_info.evaluations says). */
  int64_t max_evaluations;
} braid_reorder_options;

#define BRAID_REORDER_OPTIONS_VERSION 1
#define BRAID_REORDER_OPTIONS_INIT \
  { sizeof(braid_reorder_options), BRAID_REORDER_OPTIONS_VERSION, BRAID_REORDER_INTRA_INTER, 0 }

/* The assignment of one batch to a plan's ranks and microbatches. */
typedef struct braid_reorder braid_reorder;

/* Assigns `batch` to the ranks of `plan`; the result does not refer to the plan or the
 * batch afterwards. `options` may be NULL (intra + inter). BRAID_ERR_INVALID_ARGUMENT for
 * a batch that does not split into whole microbatches of every cell, or a size or cost
 * that is not valid (the message names the sample); BRAID_ERR_UNSUPPORTED for plans
 * whose schedule groups microbatches for a contrastive batch-sync. */
BRAID_API braid_status braid_reorder_create(const braid_plan* plan, const braid_sample_batch* batch,
                                            const braid_reorder_options* options, braid_reorder** out);
typedef braid_status (*braid_reorder_create_fn)(const braid_plan*, const braid_sample_batch*,
                                                const braid_reorder_options*, braid_reorder**);
BRAID_API braid_status braid_reorder_destroy(braid_reorder* reorder);
typedef braid_status (*braid_reorder_destroy_fn)(braid_reorder*);

typedef struct braid_reorder_info {
  size_t struct_size; /* set by the caller: sizeof(braid_reorder_info) */
  size_t samples;
  int32_t cells;           /* DP grid cells: lcm of the DP widths of the plan's pipeline stages */
  int32_t pipeline_groups; /* gcd of those widths: groups of cells with one microbatch order each */
  int32_t microbatches;    /* per pipeline and step */
  int32_t cell_microbatch; /* samples per cell and microbatch */
  double straggler_before; /* max / mean cell load (summed over modules) in dataset order (1: balanced) */
  double straggler_after;  /* the same with this assignment */
  int64_t evaluations;     /* 1F1B step times the inter search computed */
} braid_reorder_info;

#define BRAID_REORDER_INFO_INIT \
  { sizeof(braid_reorder_info), 0, 0, 0, 0, 0, 0, 0, 0 }

BRAID_API braid_status braid_reorder_info_get(const braid_reorder* reorder, braid_reorder_info* info);
typedef braid_status (*braid_reorder_info_get_fn)(const braid_reorder*, braid_reorder_info*);

/* Writes, for each of the `count` (== samples) samples, its DP rank in module `module`
 * (an index of braid_plan_module). BRAID_ERR_UNSUPPORTED for a module off the grid (the
 * encoders of a colocated plan, which run as encoder tasks on the llm's devices). */
BRAID_API braid_status braid_reorder_ranks(const braid_reorder* reorder, size_t module, int32_t* ranks, size_t count);
typedef braid_status (*braid_reorder_ranks_fn)(const braid_reorder*, size_t, int32_t*, size_t);
/* Writes, for each sample, its grid cell (0 .. cells-1). */
BRAID_API braid_status braid_reorder_cells(const braid_reorder* reorder, int32_t* cells, size_t count);
typedef braid_status (*braid_reorder_cells_fn)(const braid_reorder*, int32_t*, size_t);
/* Writes, for each sample, the microbatch it runs in on its pipeline: the position in
 * the schedule (0 first), after the inter order. A rank's microbatch k holds its
 * samples with microbatch k, in sample order. */
BRAID_API braid_status braid_reorder_microbatches(const braid_reorder* reorder, int32_t* microbatches, size_t count);
typedef braid_status (*braid_reorder_microbatches_fn)(const braid_reorder*, int32_t*, size_t);
/* Writes the inter order of pipeline group `group` (< pipeline_groups): order[k] is the
 * microbatch (numbered in sample order within each rank, before reordering) run k-th.
 * `count` == microbatches. The identity without BRAID_REORDER_INTRA_INTER. */
BRAID_API braid_status braid_reorder_order(const braid_reorder* reorder, size_t group, int32_t* order, size_t count);
typedef braid_status (*braid_reorder_order_fn)(const braid_reorder*, size_t, int32_t*, size_t);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* BRAID_DATA_H */
