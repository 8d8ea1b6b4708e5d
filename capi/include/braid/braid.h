/*
 * braid.h: the C ABI of braid, a planner and runtime for multimodal LLM training.
 *
 * Conventions (after NCCL, SQLite, zstd and libgit2):
 *  - C99; every name starts with braid_ (functions, types) or BRAID_ (macros, enum values).
 *  - Opaque handles; every _create/_load has a _destroy, and _destroy(NULL) is a no-op.
 *    A handle of another kind where one is expected (a cast) is BRAID_ERR_INVALID_ARGUMENT,
 *    _destroy included (it frees nothing).
 *  - Every function returns a braid_status and writes results through out-parameters.
 *    On failure, braid_last_error() (thread-local) holds the whole message: what went
 *    wrong, and for bad input the file, line, column and field. A successful call does
 *    not touch it: it is the message of the last call that failed on this thread.
 *  - No C++ exception, type or allocation crosses this boundary.
 *  - Structs passed across begin with `size_t struct_size`: callers set it to
 *    sizeof(the struct they were compiled with), so the structs can grow without
 *    breaking old callers. Use the _INIT macros. A struct grows in versions, fields added
 *    at its end ("Version 2:", "Added later:"); a version's size is the struct's sizeof
 *    in the headers of that version. A struct_size below the struct's first version or
 *    above BRAID_MAX_STRUCT_SIZE is refused (BRAID_ERR_INVALID_ARGUMENT, naming the
 *    struct and the size). A struct the library reads (options, settings, a batch) must
 *    also have the size of one of its versions, or at least this library's sizeof: a
 *    size in between would end inside a field, and is refused the same way, naming the
 *    sizes accepted. The library reads min(struct_size, its sizeof) of a struct it is
 *    given, and writes a struct it fills up to struct_size: fields it does not know are
 *    zeroed.
 *  - Option structs (and braid_run_settings) also carry a `version`, set by the _INIT
 *    macro to the header's *_VERSION. Version 0 is refused (BRAID_ERR_INVALID_ARGUMENT).
 *    A version newer than this library's is refused with BRAID_ERR_UNSUPPORTED (the
 *    message names the version the library knows): the library cannot honour options it
 *    does not know, so a caller built against newer headers needs a newer libbraid. An
 *    older version works: the fields it lacks take their defaults.
 *  - Every function has a pointer typedef braid_<name>_fn next to it, for dlsym users.
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
/* The largest struct_size the library accepts in any struct (no braid struct comes
 * near it): an uninitialised struct_size is refused instead of writing past the struct. */
#define BRAID_MAX_STRUCT_SIZE 4096

/* The ABI version of the loaded library; a caller compiled against another
 * BRAID_ABI_VERSION must not use it. */
BRAID_API uint32_t braid_abi_version(void);
typedef uint32_t (*braid_abi_version_fn)(void);
/* "0.1.0", static storage. */
BRAID_API const char* braid_version_string(void);
typedef const char* (*braid_version_string_fn)(void);

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
typedef const char* (*braid_status_string_fn)(braid_status);
/* The message of the last call on this thread that failed, or "" if none has failed yet.
 * Successful calls leave it as it is: check a call's status first, then read the message.
 * The text stays valid until the next failing braid call on the same thread. Never NULL. */
BRAID_API const char* braid_last_error(void);
typedef const char* (*braid_last_error_fn)(void);

/* ---- configuration --------------------------------------------------------------- */

/* A loaded and validated run: model, cluster, training settings, input sizes. */
typedef struct braid_config braid_config;

/* Loads a run file. Its `model:` and `cluster:` paths are relative to the file. */
/* BRAID_ERR_IO when the file (or a file it names) is missing, unreadable or a directory
 * (the message names the path and why); BRAID_ERR_BAD_CONFIG for invalid content. */
BRAID_API braid_status braid_config_load_file(const char* path, braid_config** out);
typedef braid_status (*braid_config_load_file_fn)(const char*, braid_config**);
/* Loads a run from YAML text. Relative `model:`/`cluster:` paths resolve against
 * `base_dir` (NULL or "" for the current directory); they may also be inline mappings. */
BRAID_API braid_status braid_config_load_string(const char* yaml, const char* base_dir, braid_config** out);
typedef braid_status (*braid_config_load_string_fn)(const char*, const char*, braid_config**);
BRAID_API braid_status braid_config_destroy(braid_config* config);
typedef braid_status (*braid_config_destroy_fn)(braid_config*);
/* Devices of the run's cluster (nodes x devices per node). */
BRAID_API braid_status braid_config_devices(const braid_config* config, int32_t* devices);
typedef braid_status (*braid_config_devices_fn)(const braid_config*, int32_t*);

/* The training settings and nominal input sizes of a run, typed: what the run file's
 * `training:` section and the sizes of its `data:` section say (each field names its
 * run-file key). */
typedef enum braid_precision {
  BRAID_PRECISION_BF16 = 0, /* "bf16" (the default) */
  BRAID_PRECISION_FP16 = 1, /* "fp16" */
  BRAID_PRECISION_FP32 = 2  /* "fp32" */
} braid_precision;

typedef enum braid_recompute {
  BRAID_RECOMPUTE_NONE = 0,      /* "none": keep every activation */
  BRAID_RECOMPUTE_SELECTIVE = 1, /* "selective" (the default): recompute the attention scores (standard attention) */
  BRAID_RECOMPUTE_FULL = 2       /* "full": keep each layer's input, recompute the layer before its backward */
} braid_recompute;

typedef enum braid_attention {
  BRAID_ATTENTION_FLASH = 0,   /* "flash" (the default): no score matrix kept */
  BRAID_ATTENTION_STANDARD = 1 /* "standard": scores materialised */
} braid_attention;

typedef struct braid_run_settings {
  size_t struct_size;      /* sizeof(braid_run_settings) */
  uint32_t version;        /* BRAID_RUN_SETTINGS_VERSION; braid_config_run_settings leaves it as it is */
  int64_t global_batch;    /* training.global_batch: samples per optimizer step, >= 1 */
  int32_t microbatch_size; /* training.microbatch: samples per microbatch and DP replica; divides global_batch */
  /* training.contrastive_batch: samples per contrastive loss, dividing global_batch and a
   * multiple of microbatch_size; 0 = the global batch (and read back as 0 then). 0 for
   * models without a contrastive loss. */
  int64_t contrastive_batch;
  braid_precision precision; /* training.precision */
  int32_t zero_stage;        /* training.zero_stage: 0 (none), 1 (optimizer state), 2 (+ gradients), 3 (+ weights) */
  braid_recompute recompute; /* training.recompute */
  braid_attention attention; /* training.attention */
  int32_t sequence_parallel; /* training.sequence_parallel: 0 or 1 */
  /* training.schedule: "1f1b", "interleaved" or "gpipe" (the pipeline order megatron plans
   * with). Read: static storage. Set: NULL or "" keeps the current one. */
  const char* schedule;
  int32_t virtual_stages;      /* training.virtual_stages: 1, or >= 2 with "interleaved" (which needs them) */
  int32_t overlap_grad_reduce; /* training.overlap_grad_reduce: 0 or 1 */
  /* Nominal input sizes (data:); 0 for an input the model does not take, >= 1 for one it takes. */
  int32_t image_resolution;           /* data.image.resolution: pixels per side, a multiple of the patch size */
  int32_t text_tokens;                /* data.text.tokens */
  int32_t audio_tokens;               /* data.audio.tokens */
  int32_t generated_image_resolution; /* data.generated_image.resolution: a multiple of latent downsample x patch */
  /* Version 2: Megatron-Core / TransformerEngine settings (docs/planner.md), each 0 or 1. */
  int32_t overlap_param_gather; /* training.overlap_param_gather: needs zero_stage 1 or 2 and overlap_grad_reduce */
  int32_t tp_comm_overlap;      /* training.tp_comm_overlap: needs sequence_parallel */
  int32_t fused_kernels;        /* training.fused_kernels (1 by default) */
  int32_t fp8;                  /* training.fp8: needs precision bf16 or fp16 and a cluster with an FP8 peak */
} braid_run_settings;

#define BRAID_RUN_SETTINGS_VERSION 2
#define BRAID_RUN_SETTINGS_INIT                                                                 \
  {                                                                                             \
    sizeof(braid_run_settings), BRAID_RUN_SETTINGS_VERSION, 0, 0, 0, BRAID_PRECISION_BF16, 0,   \
        BRAID_RECOMPUTE_SELECTIVE, BRAID_ATTENTION_FLASH, 0, NULL, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0 \
  }

/* Reads the config's settings into `settings` (initialised with BRAID_RUN_SETTINGS_INIT;
 * fields up to its struct_size are written, its version is kept). */
BRAID_API braid_status braid_config_run_settings(const braid_config* config, braid_run_settings* settings);
typedef braid_status (*braid_config_run_settings_fn)(const braid_config*, braid_run_settings*);
/* Gives the config new settings: typically braid_config_run_settings, some fields
 * changed, then this. Fields beyond the caller's struct_size keep their current values.
 * Checked as the run file's fields are, with the same messages: BRAID_ERR_INVALID_ARGUMENT
 * names the struct field, its run-file key and what is wrong ("settings->microbatch_size
 * (training.microbatch): must be at least 1 (got 0)"), and leaves the config unchanged.
 * Plans made from the config before keep the settings they were planned with; plans made
 * after use the new ones. Safe while other threads plan from the config. */
BRAID_API braid_status braid_config_set_run_settings(braid_config* config, const braid_run_settings* settings);
typedef braid_status (*braid_config_set_run_settings_fn)(braid_config*, const braid_run_settings*);

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
  /* Version 2: this plan's overrides of the run's settings (NULL / 0: the run's own),
   * checked as the run file's training fields are (BRAID_ERR_INVALID_ARGUMENT names the
   * option and the rule it breaks).
   * schedule: any schedule braid_program_create takes. The run file's own ("1f1b",
   *   "interleaved", "gpipe") set training.schedule, which megatron plans with ("1f1b" and
   *   "gpipe" also set virtual_stages to 1 unless it is given). The plan must run it
   *   (BRAID_ERR_UNSUPPORTED otherwise, naming those it runs), and its programs run it
   *   when braid_program_create is given no name. An unknown name is
   *   BRAID_ERR_INVALID_ARGUMENT with the closest names.
   * virtual_stages: training.virtual_stages (>= 2 needs the "interleaved" schedule).
   * microbatch_size: training.microbatch (samples per microbatch and DP replica). */
  const char* schedule;
  int32_t virtual_stages;
  int32_t microbatch_size;
} braid_plan_options;

/* 1: up to plan_yaml; 2: schedule, virtual_stages, microbatch_size. */
#define BRAID_PLAN_OPTIONS_VERSION 2
#define BRAID_PLAN_OPTIONS_INIT \
  { sizeof(braid_plan_options), BRAID_PLAN_OPTIONS_VERSION, BRAID_STRATEGY_AUTO, 0, 0, 0, NULL, NULL, 0, 0 }

/* A plan: per-module placement and the cost model's estimate. */
typedef struct braid_plan braid_plan;

/* Plans `config` (which must outlive the plan). `options` may be NULL (auto).
 * BRAID_ERR_INFEASIBLE when no layout fits; the message says why and what would. */
BRAID_API braid_status braid_plan_create(const braid_config* config, const braid_plan_options* options,
                                         braid_plan** out);
typedef braid_status (*braid_plan_create_fn)(const braid_config*, const braid_plan_options*, braid_plan**);
BRAID_API braid_status braid_plan_destroy(braid_plan* plan);
typedef braid_status (*braid_plan_destroy_fn)(braid_plan*);
/* The strategy that produced the plan (for auto: the winner). */
BRAID_API braid_status braid_plan_strategy(const braid_plan* plan, braid_strategy* strategy);
typedef braid_status (*braid_plan_strategy_fn)(const braid_plan*, braid_strategy*);
BRAID_API braid_status braid_plan_module_count(const braid_plan* plan, size_t* count);
typedef braid_status (*braid_plan_module_count_fn)(const braid_plan*, size_t*);

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
typedef braid_status (*braid_plan_module_fn)(const braid_plan*, size_t, braid_module_info*);

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
typedef braid_status (*braid_plan_estimate_fn)(const braid_plan*, braid_estimate*);

/* The plan as text: JSON (as `braid plan --format json`) or YAML (as --format yaml,
 * which BRAID_STRATEGY_FIXED reads back). The text lives as long as the plan. */
BRAID_API braid_status braid_plan_to_json(const braid_plan* plan, const char** text);
typedef braid_status (*braid_plan_to_json_fn)(const braid_plan*, const char**);
BRAID_API braid_status braid_plan_to_yaml(const braid_plan* plan, const char** text);
typedef braid_status (*braid_plan_to_yaml_fn)(const braid_plan*, const char**);

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
typedef braid_status (*braid_plan_alternative_count_fn)(const braid_plan*, size_t*);
BRAID_API braid_status braid_plan_alternative(const braid_plan* plan, size_t index, braid_alternative* alternative);
typedef braid_status (*braid_plan_alternative_fn)(const braid_plan*, size_t, braid_alternative*);

#ifdef __cplusplus
} /* extern "C" */
#endif

/* Pipeline programs and their simulation. */
#include "braid/pipeline.h"
/* Process groups: per-module tp/dp/pp groups, cross-module links, batch-sync groups. */
#include "braid/groups.h"
/* Data reordering for host data loaders. */
#include "braid/data.h"
/* The Optimus bubble scheduler of colocated plans. */
#include "braid/bubble.h"
/* Tensor views (DLPack's layout) and the tiled distributed contrastive loss. */
#include "braid/tensor.h"
/* The names of the enums and schedules, for bindings. */
#include "braid/vocabulary.h"

#endif /* BRAID_BRAID_H */
