/*
 * braid/pipeline.h: pipeline programs and their simulation. Included by braid.h;
 * the conventions of braid.h hold here too.
 *
 * A program is what a plan's devices execute in one training step: per stage (one
 * pipeline stage of a module grid, run by each of its data-parallel replicas), an
 * ordered list of instructions. Host frameworks that drive their own pipeline
 * engines execute these instructions in order on every device of the stage:
 *
 *   LOAD_MICROBATCH  take the inputs of `microbatch` (chunk `chunk`): a pipeline's first stages
 *   RECV_ACTIVATION  receive the activations of `microbatch` (chunk `chunk`) from stage `peer`
 *   FORWARD          run the forward of `microbatch` through model chunk `chunk` (work unit `unit`)
 *   SEND_ACTIVATION  send its output to stage `peer` (non-blocking)
 *   RECV_GRAD        receive the gradients of its output from stage `peer`
 *   BACKWARD         run its backward (recomputing first when the run recomputes)
 *   SEND_GRAD        send the input gradients to stage `peer` (non-blocking)
 *   BATCH_SYNC       contrastive group `group`: all-gather the group's embeddings
 *                    over every branch and DP replica, compute the loss and the
 *                    embedding gradients once, keep this stage's share (see "Values")
 *   REDUCE_GRADS     reduce this stage's gradients over its DP replicas
 *   OPTIMIZER_STEP   update the stage's parameters
 *   ENCODER_TASK     colocated layouts: run encoder work unit `unit` (layer `chunk`) for
 *                    encoder microbatch `microbatch` (forward, or backward with
 *                    BRAID_FLAG_BACKWARD_TASK; see "Values")
 *
 * Messages between two stages match in order per (sender, receiver, kind,
 * microbatch). When the stages have different DP widths, replica r of a stage with
 * A replicas exchanges with replica r/(A/B) of a stage with B < A replicas (fan-in),
 * or with replicas r*(B/A) .. r*(B/A)+B/A-1 when B > A (fan-out).
 *
 * Losses and gradients. The loss a replica backpropagates for one microbatch is its
 * share of the step's loss, already divided by the whole step's count, so that the
 * shares of every microbatch of every replica sum to the step's loss (a mean over the
 * global batch), never a mean over the microbatch:
 *  - causal LM loss: the microbatch's token cross-entropies, summed over its counted
 *    positions (every sample's text tokens but its last), divided by the counted
 *    positions of the whole step summed over every llm replica and microbatch (braid's
 *    trainer all-reduces that count before the step's first instruction);
 *  - contrastive loss (BATCH_SYNC): a group's CLIP loss over its gathered rows (a mean
 *    over the group's samples) divided by the step's groups; each rank takes the
 *    embedding gradients of that loss for its own rows.
 * REDUCE_GRADS then sums each stage's gradients over its DP replicas (an all-reduce
 * sum), and braid_stage_info.gradient_scale times that sum is the single-process
 * gradient of the step's loss. Fan-in: the gradients a producer replica receives come
 * from a consumer whose loss already spans all the producers that feed it, so producer
 * gradients are summed over the producers' DP group too, never averaged by the fan-in.
 * A host whose loss is a per-microbatch mean multiplies it by the microbatch's share of
 * the step's count first (samples: microbatch samples / global batch).
 *
 * Values. Every value a braid_instruction carries is one of these (tests check it on
 * every bundled run, strategy and schedule):
 *  - opcode: a braid_opcode; flags: a combination of the BRAID_FLAG_* bits below.
 *  - peer (the four sends and receives, else -1): another stage of the program,
 *    0 .. stage_count-1; every peer of a stage is in its braid_stage_info prev or next.
 *  - chunk: 0 .. virtual stages - 1 on FORWARD/BACKWARD and their messages (0 but for
 *    "interleaved"); on ENCODER_TASK the layer (below); else 0.
 *  - unit: ENCODER_TASK below; on every other instruction equal to chunk (FORWARD and
 *    BACKWARD run the stage's model chunk `chunk`).
 *  - microbatch: 0 .. M-1 on the pipeline's own instructions, M =
 *    braid_program_microbatches (a branch of another DP width runs its own count), and
 *    -1 on BATCH_SYNC, REDUCE_GRADS and OPTIMIZER_STEP. Two exceptions in colocated
 *    programs: ENCODER_TASK counts encoder microbatches (below), and the ordering-only
 *    messages (BRAID_FLAG_SYNC_ONLY) carry either an llm microbatch id (0 .. M-1: the
 *    hand-over of encoder outputs from a stage to the llm's first stage, and their
 *    gradients back, before that llm microbatch's FORWARD / after its BACKWARD) or,
 *    between two stages of an encoder's own pipeline, BRAID_ENCODER_MESSAGE_BASE +
 *    (e << 16) + j for encoder microbatch j of encoder e (below).
 *  - group (BATCH_SYNC, else -1): contrastive group g, 0 .. G-1, G = global batch /
 *    contrastive batch (braid_run_settings). Group g is the step's g-th contrastive
 *    batch: on a stage whose replicas run K microbatches per group (K = contrastive
 *    batch / (replicas x microbatch size), per branch), microbatches g*K .. g*K+K-1 of
 *    every DP replica, on every branch. The rows gathered are those microbatches'
 *    samples; the branches hold the same samples in a group (an image and its caption),
 *    the loss pairs them by sample, and the all-gather covers every replica of each
 *    branch's last stage.
 *  - ENCODER_TASK (colocated plans: every llm stage's devices also run a stage of each
 *    encoder; braid_program_stage_part lists which, llm part first): encoder e is the
 *    e-th encoder of the plan in braid_plan_module order, and
 *      unit = 1 + e * BRAID_ENCODER_UNITS + slot (unit 0 is the llm's), slot one of the
 *      BRAID_ENCODER_UNIT_* below; every stage numbers all of every encoder's units, so
 *      a slot the stage does not run never appears (the embedding runs on the encoder's
 *      first stage, the head on its last, the transfer and shard traffic when they take
 *      time);
 *      chunk = for a kernel, the layer within the stage's range of the encoder (layer
 *      first_layer + chunk of braid_stage_part), else 0;
 *      microbatch = encoder microbatch j, 0 .. K-1, K = global batch / (encoder dp x
 *      encoder microbatch size) per device and step; each j runs its forward tasks in
 *      slot order (embedding, each layer's kernels in order, head, transfer) and later
 *      its backward tasks in reverse (BRAID_FLAG_BACKWARD_TASK; the shard traffic last).
 */
/* braid.h first, before this header's guard: it includes every header, in an order where
 * each finds what it needs, whichever header a program includes first. */
#include "braid/braid.h"

#ifndef BRAID_PIPELINE_H
#define BRAID_PIPELINE_H

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
/* ENCODER_TASK ("optimus-fine", "optimus-online"): placed inside the tensor-parallel
 * collective waits of the stage's last FORWARD or BACKWARD before it (only sends,
 * LOAD_MICROBATCH and other such tasks in between). An executor may run it while that
 * instruction's TP collectives are in flight, or simply in order after it. Never set on
 * a communication task (transfer, shard traffic, the encoder's own TP collectives). */
#define BRAID_FLAG_IN_TP_BUBBLE 16u
/* ENCODER_TASK ("optimus-coarse", "optimus-fine", "optimus-online") inside a wait of the
 * llm's data-parallel collectives. A backward task placed after the stage's last BACKWARD
 * and before its REDUCE_GRADS: an executor may issue the reduction of the stage's own (llm)
 * gradients when that BACKWARD ends and run the task while it is in flight, then reduce the
 * encoders' gradients at REDUCE_GRADS. A forward task placed before the stage's first
 * FORWARD or BACKWARD: it may run while the llm's parameter all-gather (ZeRO-1/2, issued
 * after the previous step's optimizer step) is in flight. Or simply run everything in order. */
#define BRAID_FLAG_IN_DP_WAIT 32u
/* Every flag a program may carry. */
#define BRAID_FLAG_ALL 63u

/* ENCODER_TASK units: unit = 1 + e * BRAID_ENCODER_UNITS + one of these (see "Values"). */
#define BRAID_ENCODER_UNIT_EMBEDDING 0 /* patch/token embedding (the encoder's first stage) */
/* 1 .. 9: the kernels of one transformer layer, in order: norm (attention), qkv,
 * attention, attention out, TP all-reduce (attention), norm (mlp), mlp up, mlp down,
 * TP all-reduce (mlp); the two all-reduces are communication. */
#define BRAID_ENCODER_UNIT_FIRST_KERNEL 1
#define BRAID_ENCODER_LAYER_KERNELS 9
#define BRAID_ENCODER_UNIT_HEAD 10     /* final norm and projection (the encoder's last stage) */
#define BRAID_ENCODER_UNIT_TRANSFER 11 /* hand-over to the llm's first stage, or the send to the next encoder stage */
#define BRAID_ENCODER_UNIT_SHARD 12    /* ZeRO-2/3 traffic of the encoder's gradients (backward) */
#define BRAID_ENCODER_UNITS 13         /* units per encoder on a colocated stage */
/* BRAID_FLAG_SYNC_ONLY messages between two stages of an encoder's own pipeline carry
 * microbatch BRAID_ENCODER_MESSAGE_BASE + (e << 16) + j: encoder e, encoder microbatch j. */
#define BRAID_ENCODER_MESSAGE_BASE (1 << 24)

typedef struct braid_program braid_program;

/* Builds the program `plan` runs with `schedule`: "gpipe", "1f1b", "interleaved",
 * "batch-sync", "distmm-pipe" or "two-phase"; a colocated plan's are the bubble
 * scheduler's "optimus-fine", "optimus-coarse", "encoder-first" and "optimus-online"
 * (the fine program, which an executor also fills online) (NULL or "": the schedule
 * braid_plan_options.schedule named, else the plan's own).
 * BRAID_ERR_INVALID_ARGUMENT for a name that is no schedule (the message suggests the
 * closest); BRAID_ERR_UNSUPPORTED for a schedule the plan's layout cannot run (the
 * message names those it runs). The program is self-contained: it may outlive the plan. */
BRAID_API braid_status braid_program_create(const braid_plan* plan, const char* schedule, braid_program** out);
typedef braid_status (*braid_program_create_fn)(const braid_plan*, const char*, braid_program**);
BRAID_API braid_status braid_program_destroy(braid_program* program);
typedef braid_status (*braid_program_destroy_fn)(braid_program*);
/* The schedule's name; lives as long as the program. */
BRAID_API braid_status braid_program_schedule(const braid_program* program, const char** schedule);
typedef braid_status (*braid_program_schedule_fn)(const braid_program*, const char**);
BRAID_API braid_status braid_program_stage_count(const braid_program* program, size_t* count);
typedef braid_status (*braid_program_stage_count_fn)(const braid_program*, size_t*);

typedef struct braid_stage_info {
  size_t struct_size; /* set by the caller: sizeof(braid_stage_info) */
  const char* name;   /* "llm stage 3" */
  /* braid_plan_module index of the module whose pipeline stage this is, or -1 when the
   * stage is a global stage of several modules (monolithic and colocated grids); the
   * stage's parts list everything it runs (a chain encoder's projector, colocated encoders) */
  int32_t module;
  int32_t replicas;            /* data-parallel replicas running this stage's program */
  int32_t devices_per_replica; /* tensor-parallel width */
  int32_t first_device; /* replica r holds devices first_device + r*device_stride ... + devices_per_replica - 1 */
  int32_t device_stride;
  int32_t depth; /* position in the pipeline, 0 first */
  size_t instruction_count;
  /* Every stage this one exchanges messages with, ascending: `prev` the stages it
   * receives activations from or sends gradients to, `next` those it sends activations
   * to or receives gradients from (an interleaved pipeline's last stage and first stage
   * are each other's next and prev; a colocated stage's ordering-only messages count). */
  size_t prev_count;
  const int32_t* prev;
  size_t next_count;
  const int32_t* next;
  /* Multiplies the sum of this stage's per-replica gradients over its DP group (what
   * REDUCE_GRADS all-reduces) into the single-process gradient of the step's loss, when
   * every replica backpropagates its share of the loss as "Losses and gradients" above
   * defines it. 1 for every stage of braid's programs (a producer's too, whatever its fan-in). */
  double gradient_scale;
  size_t part_count; /* module stages the stage runs (braid_program_stage_part), at least 1 */
} braid_stage_info;

#define BRAID_STAGE_INFO_INIT \
  { sizeof(braid_stage_info), NULL, 0, 0, 0, 0, 0, 0, 0, 0, NULL, 0, NULL, 0, 0 }

BRAID_API braid_status braid_program_stage(const braid_program* program, size_t stage, braid_stage_info* info);
typedef braid_status (*braid_program_stage_fn)(const braid_program*, size_t, braid_stage_info*);

/* What a stage holds: one range of layers of one module stage. A stage runs its own
 * module stage; a monolithic stage every module stage on it (encoder layers on the first
 * stages, then the llm's); a chain (disttrain) encoder's last stage its projector too; a
 * colocated (optimus) stage its llm parts and the encoder stage its ENCODER_TASKs run
 * (several llm stages run copies of one encoder stage when the encoder has fewer stages).
 * Over the stages of a disaggregated (distmm, disttrain) program, every layer of every
 * module appears exactly once. */
typedef struct braid_stage_part {
  size_t struct_size;   /* set by the caller: sizeof(braid_stage_part) */
  int32_t module;       /* braid_plan_module index */
  int32_t module_stage; /* the module's own pipeline stage, 0..pp-1 */
  int32_t first_layer;  /* layers first_layer .. first_layer + layer_count - 1 of the module: */
  int32_t layer_count;  /* braid_module_info.layers_per_stage[module_stage], after the earlier stages' */
} braid_stage_part;

#define BRAID_STAGE_PART_INIT \
  { sizeof(braid_stage_part), 0, 0, 0, 0 }

/* Part `index` (< part_count) of stage `stage`, in the order the stage runs them: the
 * modules of its pipeline in data-flow order (an encoder before the projector it feeds,
 * a monolithic stage's modules as the model file chains them), then the colocated
 * encoder stages its ENCODER_TASKs run. An
 * interleaved program runs a stage's layers as equal model chunks (instruction.chunk);
 * the part is the stage's whole range. */
BRAID_API braid_status braid_program_stage_part(const braid_program* program, size_t stage, size_t index,
                                                braid_stage_part* part);
typedef braid_status (*braid_program_stage_part_fn)(const braid_program*, size_t, size_t, braid_stage_part*);

typedef struct braid_instruction {
  size_t struct_size; /* set by the caller: sizeof(braid_instruction) */
  braid_opcode opcode;
  int32_t microbatch; /* -1 where not per microbatch */
  int32_t chunk;      /* model chunk (interleaved schedules); ENCODER_TASK: the layer; else 0 */
  int32_t peer;       /* the other stage of a send or receive, else -1 */
  int32_t group;      /* BATCH_SYNC: the contrastive group, else -1 */
  int32_t unit;       /* FORWARD/BACKWARD/ENCODER_TASK: the stage's work unit (== chunk but for ENCODER_TASK) */
  uint32_t flags;     /* BRAID_FLAG_* */
  /* The ranges and encodings of every field: "Values" at the top of this header. */
} braid_instruction;

#define BRAID_INSTRUCTION_INIT \
  { sizeof(braid_instruction), BRAID_OP_LOAD_MICROBATCH, 0, 0, 0, 0, 0, 0 }

/* Instruction `index` (< instruction_count) of stage `stage`. */
BRAID_API braid_status braid_program_instruction(const braid_program* program, size_t stage, size_t index,
                                                 braid_instruction* instruction);
typedef braid_status (*braid_program_instruction_fn)(const braid_program*, size_t, size_t, braid_instruction*);

/* ---- per-rank programs -------------------------------------------------------------- */

/* Microbatches each DP replica runs per step (contrastive programs: groups x the
 * program's microbatches per group; a branch of another DP width runs another count,
 * its FORWARDs tell). */
BRAID_API braid_status braid_program_microbatches(const braid_program* program, int32_t* count);
typedef braid_status (*braid_program_microbatches_fn)(const braid_program*, int32_t*);

typedef struct braid_program_rank_info {
  size_t struct_size;       /* set by the caller: sizeof(braid_program_rank_info) */
  int32_t stage;            /* the stage the rank runs (braid_program_stage index) */
  int32_t replica;          /* its DP replica of the stage */
  int32_t tp_rank;          /* its place in the replica: rank = first_device + replica*device_stride + tp_rank */
  size_t instruction_count; /* the stage's */
} braid_program_rank_info;

#define BRAID_PROGRAM_RANK_INFO_INIT \
  { sizeof(braid_program_rank_info), 0, 0, 0, 0 }

/* Which stage device rank `rank` runs (ranks = devices 0..N-1 of the plan, as
 * braid_groups_rank numbers them; no braid_groups needed). BRAID_ERR_INVALID_ARGUMENT
 * for a rank outside the program's devices, naming the rank and the device count. */
BRAID_API braid_status braid_program_rank(const braid_program* program, int32_t rank, braid_program_rank_info* info);
typedef braid_status (*braid_program_rank_fn)(const braid_program*, int32_t, braid_program_rank_info*);
/* Instruction `index` (< instruction_count) of the stage rank `rank` runs: the same as
 * braid_program_instruction of that stage. */
BRAID_API braid_status braid_program_rank_instruction(const braid_program* program, int32_t rank, size_t index,
                                                      braid_instruction* instruction);
typedef braid_status (*braid_program_rank_instruction_fn)(const braid_program*, int32_t, size_t, braid_instruction*);

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
  int32_t trace_replicas; /* DP replicas per stage to record (-1: all; at least 1 with record_trace) */
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
typedef braid_status (*braid_simulate_fn)(const braid_program*, const braid_simulation_options*, braid_simulation**);
BRAID_API braid_status braid_simulation_destroy(braid_simulation* simulation);
typedef braid_status (*braid_simulation_destroy_fn)(braid_simulation*);

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
typedef braid_status (*braid_simulation_result_get_fn)(const braid_simulation*, braid_simulation_result*);

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
typedef braid_status (*braid_simulation_stage_fn)(const braid_simulation*, size_t, braid_stage_result*);

/* Writes the Chrome trace (open in ui.perfetto.dev or chrome://tracing) to `path`,
 * atomically. Needs options.record_trace; BRAID_ERR_IO when the file cannot be written. */
BRAID_API braid_status braid_simulation_write_trace(const braid_simulation* simulation, const char* path);
typedef braid_status (*braid_simulation_write_trace_fn)(const braid_simulation*, const char*);
/* A text Gantt chart of each stage's first replica, `width` columns (0: automatic).
 * Needs options.record_trace. The text lives as long as the simulation. */
BRAID_API braid_status braid_simulation_gantt(const braid_simulation* simulation, int32_t width, const char** text);
typedef braid_status (*braid_simulation_gantt_fn)(const braid_simulation*, int32_t, const char**);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* BRAID_PIPELINE_H */
