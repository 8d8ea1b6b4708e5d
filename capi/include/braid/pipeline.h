/*
 * braid/pipeline.h: pipeline programs and their simulation. Included by braid.h;
 * the conventions of braid.h hold here too.
 *
 * A program is what a plan's devices execute in one training step: per stage (one
 * pipeline stage of a module grid, run by each of its data-parallel replicas), an
 * ordered list of instructions. Host frameworks that drive their own pipeline
 * engines execute these instructions in order on every device of the stage:
 *
 *   LOAD_MICROBATCH  take the inputs of `microbatch` (stages with no predecessor)
 *   RECV_ACTIVATION  receive the activations of `microbatch` (chunk `chunk`) from stage `peer`
 *   FORWARD          run the forward of `microbatch` through model chunk `chunk` (work unit `unit`)
 *   SEND_ACTIVATION  send its output to stage `peer` (non-blocking)
 *   RECV_GRAD        receive the gradients of its output from stage `peer`
 *   BACKWARD         run its backward (recomputing first when the run recomputes)
 *   SEND_GRAD        send the input gradients to stage `peer` (non-blocking)
 *   BATCH_SYNC       contrastive group `group`: all-gather the group's embeddings
 *                    over every branch and DP replica, compute the loss and the
 *                    embedding gradients once, keep this stage's share
 *   REDUCE_GRADS     reduce this stage's gradients over its DP replicas
 *   OPTIMIZER_STEP   update the stage's parameters
 *   ENCODER_TASK     colocated layouts: run encoder work unit `unit` for
 *                    `microbatch` (forward, or backward with BRAID_FLAG_BACKWARD_TASK)
 *
 * Messages between two stages match in order per (sender, receiver, kind,
 * microbatch). When the stages have different DP widths, replica r of a stage with
 * A replicas exchanges with replica r/(A/B) of a stage with B < A replicas (fan-in),
 * or with replicas r*(B/A) .. r*(B/A)+B/A-1 when B > A (fan-out).
 */
#ifndef BRAID_PIPELINE_H
#define BRAID_PIPELINE_H

#include "braid/braid.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- programs ------------------------------------------------------------------- */

typedef enum braid_opcode {
  BRAID_OP_LOAD_MICROBATCH = 0,
  BRAID_OP_FORWARD = 1,
  BRAID_OP_BACKWARD = 2,
  BRAID_OP_SEND_ACTIVATION = 3,
  BRAID_OP_RECV_ACTIVATION = 4,
  BRAID_OP_SEND_GRAD = 5,
  BRAID_OP_RECV_GRAD = 6,
  BRAID_OP_BATCH_SYNC = 7,
  BRAID_OP_REDUCE_GRADS = 8,
  BRAID_OP_OPTIMIZER_STEP = 9,
  BRAID_OP_ENCODER_TASK = 10
} braid_opcode;

/* braid_instruction.flags */
#define BRAID_FLAG_NO_STORE 1u      /* two-phase batch-sync: a forward that keeps no activations */
#define BRAID_FLAG_RECOMPUTE 2u     /* two-phase batch-sync: the forward re-run before its backward */
#define BRAID_FLAG_BACKWARD_TASK 4u /* ENCODER_TASK: a backward task */
#define BRAID_FLAG_SYNC_ONLY 8u     /* a send/receive that only orders work (its transfer is inside that work) */

typedef struct braid_program braid_program;

/* Builds the program `plan` runs with `schedule`: "gpipe", "1f1b", "interleaved",
 * "batch-sync", "distmm-pipe" or "two-phase"; a colocated plan's are the bubble
 * scheduler's "optimus-fine", "optimus-coarse", "encoder-first" and "optimus-online"
 * (the fine program, which an executor also fills online) (NULL or "": the plan's own).
 * BRAID_ERR_UNSUPPORTED when the plan's layout cannot run that schedule. The program
 * is self-contained: it may outlive the plan. */
BRAID_API braid_status braid_program_create(const braid_plan* plan, const char* schedule, braid_program** out);
BRAID_API braid_status braid_program_destroy(braid_program* program);
/* The schedule's name; lives as long as the program. */
BRAID_API braid_status braid_program_schedule(const braid_program* program, const char** schedule);
BRAID_API braid_status braid_program_stage_count(const braid_program* program, size_t* count);

typedef struct braid_stage_info {
  size_t struct_size;          /* set by the caller: sizeof(braid_stage_info) */
  const char* name;            /* "llm stage 3" */
  int32_t module;              /* index of the module in the model file, or -1 when the stage holds several */
  int32_t replicas;            /* data-parallel replicas running this stage's program */
  int32_t devices_per_replica; /* tensor-parallel width */
  int32_t first_device; /* replica r holds devices first_device + r*device_stride ... + devices_per_replica - 1 */
  int32_t device_stride;
  int32_t depth; /* position in the pipeline, 0 first */
  size_t instruction_count;
  size_t prev_count; /* stages this one receives activations from */
  const int32_t* prev;
  size_t next_count; /* stages this one sends activations to */
  const int32_t* next;
} braid_stage_info;

#define BRAID_STAGE_INFO_INIT \
  { sizeof(braid_stage_info), NULL, 0, 0, 0, 0, 0, 0, 0, 0, NULL, 0, NULL }

BRAID_API braid_status braid_program_stage(const braid_program* program, size_t stage, braid_stage_info* info);

typedef struct braid_instruction {
  size_t struct_size; /* set by the caller: sizeof(braid_instruction) */
  braid_opcode opcode;
  int32_t microbatch; /* -1 where not per microbatch */
  int32_t chunk;      /* model chunk (interleaved schedules), else 0 */
  int32_t peer;       /* the other stage of a send or receive, else -1 */
  int32_t group;      /* BATCH_SYNC: the contrastive group, else -1 */
  int32_t unit;       /* FORWARD/BACKWARD/ENCODER_TASK: the stage's work unit */
  uint32_t flags;     /* BRAID_FLAG_* */
} braid_instruction;

#define BRAID_INSTRUCTION_INIT \
  { sizeof(braid_instruction), BRAID_OP_LOAD_MICROBATCH, 0, 0, 0, 0, 0, 0 }

/* Instruction `index` (< instruction_count) of stage `stage`. */
BRAID_API braid_status braid_program_instruction(const braid_program* program, size_t stage, size_t index,
                                                 braid_instruction* instruction);

/* ---- simulation ------------------------------------------------------------------ */

/* Why devices were idle (braid_simulation_result.bubbles_s). Pipeline causes follow
 * Optimus' breakdown (ATC'25, Table 1): warm-up before a stage's first forward,
 * cool-down after its last backward, other pipeline waits in between. */
typedef enum braid_bubble_cause {
  BRAID_BUBBLE_DP_START = 0,    /* DP collectives before the first forward */
  BRAID_BUBBLE_DP_END = 1,      /* DP collectives after the last backward */
  BRAID_BUBBLE_DP_SHARD = 2,    /* ZeRO-2/3 collectives during the pipeline */
  BRAID_BUBBLE_PP_WARMUP = 3,   /* waiting before the stage's first forward */
  BRAID_BUBBLE_PP_COOLDOWN = 4, /* waiting after the stage's last backward, and for its pipeline to finish */
  BRAID_BUBBLE_PP_OTHER = 5,    /* other waits on pipeline neighbours */
  BRAID_BUBBLE_TP = 6,          /* tensor-parallel collectives */
  BRAID_BUBBLE_BATCH_SYNC = 7,  /* contrastive batch-sync */
  BRAID_BUBBLE_IMBALANCE = 8,   /* finished early, waiting for slower branches or modules outside its pipeline */
  BRAID_BUBBLE_COUNT = 9
} braid_bubble_cause;

typedef struct braid_simulation_options {
  size_t struct_size;     /* sizeof(braid_simulation_options) */
  uint32_t version;       /* BRAID_SIMULATION_OPTIONS_VERSION */
  int32_t record_trace;   /* 1: keep the events for braid_simulation_write_trace / _gantt */
  int32_t trace_replicas; /* DP replicas per stage to record (-1: all) */
} braid_simulation_options;

#define BRAID_SIMULATION_OPTIONS_VERSION 1
#define BRAID_SIMULATION_OPTIONS_INIT \
  { sizeof(braid_simulation_options), BRAID_SIMULATION_OPTIONS_VERSION, 0, 1 }

typedef struct braid_simulation braid_simulation;

/* Simulates one step of `program` (which must outlive the simulation). A program
 * that deadlocks or is malformed fails with BRAID_ERR_INVALID_ARGUMENT, and the
 * message names the stuck instruction of every blocked stage. */
BRAID_API braid_status braid_simulate(const braid_program* program, const braid_simulation_options* options,
                                      braid_simulation** out);
BRAID_API braid_status braid_simulation_destroy(braid_simulation* simulation);

typedef struct braid_simulation_result {
  size_t struct_size; /* set by the caller: sizeof(braid_simulation_result) */
  double step_time_s;
  double bubble_fraction;               /* idle share of device time */
  double bubbles_s[BRAID_BUBBLE_COUNT]; /* idle seconds per device, mean over devices, by cause */
  double peak_memory_gib;               /* static + activations, on the fullest device */
  double mfu;
  int32_t devices;
  int32_t ranks;  /* simulated (stage, replica) pairs */
  int64_t events; /* instructions executed */
} braid_simulation_result;

#define BRAID_SIMULATION_RESULT_INIT \
  { sizeof(braid_simulation_result), 0, 0, {0}, 0, 0, 0, 0, 0 }

BRAID_API braid_status braid_simulation_result_get(const braid_simulation* simulation, braid_simulation_result* result);

typedef struct braid_stage_result {
  size_t struct_size; /* set by the caller: sizeof(braid_stage_result) */
  double busy_s;      /* per device, mean over the stage's replicas */
  double idle_s;
  double bubbles_s[BRAID_BUBBLE_COUNT];
  double peak_memory_gib;
  double finish_s; /* when its last replica finished */
} braid_stage_result;

#define BRAID_STAGE_RESULT_INIT \
  { sizeof(braid_stage_result), 0, 0, {0}, 0, 0 }

BRAID_API braid_status braid_simulation_stage(const braid_simulation* simulation, size_t stage,
                                              braid_stage_result* result);

/* Writes the Chrome trace (open in ui.perfetto.dev or chrome://tracing) to `path`,
 * atomically. Needs options.record_trace; BRAID_ERR_IO when the file cannot be written. */
BRAID_API braid_status braid_simulation_write_trace(const braid_simulation* simulation, const char* path);
/* A text Gantt chart of each stage's first replica, `width` columns (0: automatic).
 * Needs options.record_trace. The text lives as long as the simulation. */
BRAID_API braid_status braid_simulation_gantt(const braid_simulation* simulation, int32_t width, const char** text);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* BRAID_PIPELINE_H */
