/*
 * braid.h: the C ABI of braid, a planner and runtime for multimodal LLM training.
 *
 * Conventions (after NCCL, SQLite, zstd and libgit2):
 *  - C99; every name starts with braid_ (functions, types) or BRAID_ (macros, enum values).
 *  - Opaque handles; every _create/_load has a _destroy, and _destroy(NULL) is a no-op.
 *  - Every function returns a braid_status and writes results through out-parameters.
 *    On failure, braid_last_error() (thread-local) holds the whole message: what went
 *    wrong, and for bad input the file, line, column and field.
 *  - No C++ exception, type or allocation crosses this boundary.
 *  - Structs passed across begin with `size_t struct_size`: callers set it to
 *    sizeof(the struct they were compiled with), so the structs can grow without
 *    breaking old callers. Use the _INIT macros. Option structs also carry a version.
 *  - Strings returned by the library live as long as the handle that returned them.
 *  - A shipped signature never changes; a changed call gets a new name (_v2).
 *  - Threads: any call may run on any thread. Handles may be shared between
 *    threads (several threads may plan from one braid_config at once); a handle
 *    must not be destroyed while another thread uses it, and a braid_config must
 *    outlive the plans made from it. braid_last_error() is per thread.
 */
#ifndef BRAID_BRAID_H
#define BRAID_BRAID_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define BRAID_API __declspec(dllexport)
#elif defined(__GNUC__)
#define BRAID_API __attribute__((visibility("default")))
#else
#define BRAID_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- versions ------------------------------------------------------------------ */

#define BRAID_VERSION_MAJOR 0
#define BRAID_VERSION_MINOR 1
#define BRAID_VERSION_PATCH 0
#define BRAID_VERSION_CODE (BRAID_VERSION_MAJOR * 10000 + BRAID_VERSION_MINOR * 100 + BRAID_VERSION_PATCH)
/* Bumped when a signature or struct layout changes incompatibly (never, so far). */
#define BRAID_ABI_VERSION 1

/* The ABI version of the loaded library; a caller compiled against another
 * BRAID_ABI_VERSION must not use it. */
BRAID_API uint32_t braid_abi_version(void);
/* "0.1.0", static storage. */
BRAID_API const char* braid_version_string(void);

/* ---- status and errors --------------------------------------------------------- */

typedef enum braid_status {
  BRAID_OK = 0,
  BRAID_ERR_INVALID_ARGUMENT = 1, /* NULL handle or pointer, wrong struct_size, bad option */
  BRAID_ERR_BAD_CONFIG = 2,       /* the YAML or plan given is malformed or inconsistent */
  BRAID_ERR_INFEASIBLE = 3,       /* valid input, but nothing fits (message says what would) */
  BRAID_ERR_IO = 4,               /* a file could not be read */
  BRAID_ERR_UNSUPPORTED = 5,      /* valid request this build or strategy does not handle */
  BRAID_ERR_INTERNAL = 6,         /* a bug in braid; please report the message */
  BRAID_ERR_OUT_OF_MEMORY = 7,    /* host allocation failed */
  BRAID_ERR_PLUGIN = 8            /* a plugin could not be loaded or is incompatible */
} braid_status;

/* A short constant description of a status ("bad configuration"). Never NULL. */
BRAID_API const char* braid_status_string(braid_status status);
/* The message of the last failed call on this thread, or "" if none failed yet.
 * Valid until the next braid call on the same thread. Never NULL. */
BRAID_API const char* braid_last_error(void);

/* ---- configuration --------------------------------------------------------------- */

/* A loaded and validated run: model, cluster, training settings, input sizes. */
typedef struct braid_config braid_config;

/* Loads a run file. Its `model:` and `cluster:` paths are relative to the file. */
BRAID_API braid_status braid_config_load_file(const char* path, braid_config** out);
/* Loads a run from YAML text. Relative `model:`/`cluster:` paths resolve against
 * `base_dir` (NULL or "" for the current directory); they may also be inline mappings. */
BRAID_API braid_status braid_config_load_string(const char* yaml, const char* base_dir, braid_config** out);
BRAID_API braid_status braid_config_destroy(braid_config* config);
/* Devices of the run's cluster (nodes x devices per node). */
BRAID_API braid_status braid_config_devices(const braid_config* config, int32_t* devices);

/* ---- planning -------------------------------------------------------------------- */

typedef enum braid_strategy {
  BRAID_STRATEGY_AUTO = 0,      /* run every applicable strategy, keep the fastest */
  BRAID_STRATEGY_MEGATRON = 1,  /* one TP x PP x DP grid for the whole model */
  BRAID_STRATEGY_DISTMM = 2,    /* per-encoder grids joined by a contrastive batch-sync */
  BRAID_STRATEGY_DISTTRAIN = 3, /* encoder / llm / generator on disjoint devices, one pipeline */
  BRAID_STRATEGY_OPTIMUS = 4,   /* encoder and llm on every device, encoder work in llm bubbles */
  BRAID_STRATEGY_FIXED = 5      /* evaluate the plan given in plan_yaml */
} braid_strategy;

typedef struct braid_plan_options {
  size_t struct_size; /* sizeof(braid_plan_options) */
  uint32_t version;   /* BRAID_PLAN_OPTIONS_VERSION */
  braid_strategy strategy;
  /* Constraints, 0 = free. Megatron applies them to its one grid; the other
   * strategies to the llm (distmm: to the largest encoder). */
  int32_t tp, pp, dp;
  /* With BRAID_STRATEGY_FIXED: a plan as braid_plan_to_yaml() prints it. */
  const char* plan_yaml;
} braid_plan_options;

#define BRAID_PLAN_OPTIONS_VERSION 1
#define BRAID_PLAN_OPTIONS_INIT \
  { sizeof(braid_plan_options), BRAID_PLAN_OPTIONS_VERSION, BRAID_STRATEGY_AUTO, 0, 0, 0, NULL }

/* A plan: per-module placement and the cost model's estimate. */
typedef struct braid_plan braid_plan;

/* Plans `config` (which must outlive the plan). `options` may be NULL (auto).
 * BRAID_ERR_INFEASIBLE when no layout fits; the message says why and what would. */
BRAID_API braid_status braid_plan_create(const braid_config* config, const braid_plan_options* options,
                                         braid_plan** out);
BRAID_API braid_status braid_plan_destroy(braid_plan* plan);
/* The strategy that produced the plan (for auto: the winner). */
BRAID_API braid_status braid_plan_strategy(const braid_plan* plan, braid_strategy* strategy);
BRAID_API braid_status braid_plan_module_count(const braid_plan* plan, size_t* count);

typedef struct braid_module_info {
  size_t struct_size; /* set by the caller: sizeof(braid_module_info) */
  const char* name;   /* module name from the model file */
  const char* role;   /* "encoder", "projector", "llm", "generator" */
  int32_t devices;    /* devices that hold this module */
  int32_t tp, pp, dp;
  int32_t first_device;
  int32_t first_stage; /* monolithic plans: the global pipeline stage where it starts */
  int32_t microbatch_size;
  int32_t stage_count;             /* == pp */
  const int32_t* layers_per_stage; /* stage_count entries */
} braid_module_info;

#define BRAID_MODULE_INFO_INIT \
  { sizeof(braid_module_info), NULL, NULL, 0, 0, 0, 0, 0, 0, 0, 0, NULL }

/* Module `index` (0-based, < braid_plan_module_count) of the plan. */
BRAID_API braid_status braid_plan_module(const braid_plan* plan, size_t index, braid_module_info* info);

typedef struct braid_estimate {
  size_t struct_size; /* set by the caller: sizeof(braid_estimate) */
  double iteration_time_s;
  double samples_per_s;
  double tflops_per_device; /* hardware FLOP/s per device, recomputation included */
  double mfu;               /* model FLOPs utilisation, recomputation excluded */
  double peak_memory_gib;
  double bubble_fraction; /* share of device time without compute */
  int32_t devices;        /* devices the plan uses */
} braid_estimate;

#define BRAID_ESTIMATE_INIT \
  { sizeof(braid_estimate), 0, 0, 0, 0, 0, 0, 0 }

BRAID_API braid_status braid_plan_estimate(const braid_plan* plan, braid_estimate* estimate);

/* The plan as text: JSON (as `braid plan --format json`) or YAML (as --format yaml,
 * which BRAID_STRATEGY_FIXED reads back). The text lives as long as the plan. */
BRAID_API braid_status braid_plan_to_json(const braid_plan* plan, const char** text);
BRAID_API braid_status braid_plan_to_yaml(const braid_plan* plan, const char** text);

/* With BRAID_STRATEGY_AUTO: every strategy tried, ranked (0 = the winner). */
typedef struct braid_alternative {
  size_t struct_size; /* set by the caller: sizeof(braid_alternative) */
  braid_strategy strategy;
  int32_t feasible;        /* 1 if it produced a plan */
  double iteration_time_s; /* 0 when not feasible */
  const char* reason;      /* why it lost, or why it cannot run */
} braid_alternative;

#define BRAID_ALTERNATIVE_INIT \
  { sizeof(braid_alternative), BRAID_STRATEGY_AUTO, 0, 0, NULL }

BRAID_API braid_status braid_plan_alternative_count(const braid_plan* plan, size_t* count);
BRAID_API braid_status braid_plan_alternative(const braid_plan* plan, size_t index, braid_alternative* alternative);

#ifdef __cplusplus
} /* extern "C" */
#endif

/* Pipeline programs and their simulation. */
#include "braid/pipeline.h"
/* Data reordering for host data loaders. */
#include "braid/data.h"
/* The Optimus bubble scheduler of colocated plans. */
#include "braid/bubble.h"

#endif /* BRAID_BRAID_H */
