/*
 * braid/bubble.h: the Optimus bubble scheduler (Feng et al., ATC'25) for colocated
 * plans. Included by braid.h; the conventions of braid.h hold here too.
 *
 * A colocated plan (strategy optimus) puts the encoders and the llm on every device.
 * The scheduler cuts the encoders' work into kernel-sized tasks and places them into
 * the llm pipeline's bubbles, giving four programs of one training step:
 *
 *   "encoder-first"   every encoder forward before the llm starts, every backward after
 *                     it ends (what a colocated engine does without a scheduler);
 *   "optimus-coarse"  forwards in each stage's PP warm-up bubble, backwards in its
 *                     cool-down bubble;
 *   "optimus-fine"    also every other pipeline wait and, kernel by kernel, the
 *                     tensor-parallel collective waits inside llm forwards and backwards;
 *   "optimus-online"  the fine program, named for executors that also fill waits online
 *                     (run the next encoder task whose inputs are there while a receive
 *                     or collective is pending; movable work keeps its order).
 *
 * Each pass is simulated and never ends slower than the one before it. The programs are
 * ordinary braid_program handles (braid/pipeline.h): their ENCODER_TASK instructions say
 * which encoder work unit runs for which microbatch, and where ("Values" in
 * braid/pipeline.h gives the numbering of units, layers and encoder microbatches).
 *
 *   braid_bubble_scheduler* s = NULL;
 *   braid_bubble_scheduler_create(plan, &s);
 *   braid_bubble_scheduler_run(s);
 *   braid_bubble_report r = BRAID_BUBBLE_REPORT_INIT;
 *   braid_bubble_scheduler_report(s, &r);
 *   braid_program* fine = NULL;
 *   braid_bubble_scheduler_program(s, "optimus-fine", &fine);
 *   ... braid_program_instruction(fine, stage, i, &ins) ...
 *   braid_program_destroy(fine);
 *   braid_bubble_scheduler_destroy(s);
 */
/* braid.h first, before this header's guard: it includes every header, in an order where
 * each finds what it needs, whichever header a program includes first. */
#include "braid/braid.h"

#ifndef BRAID_BUBBLE_H
#define BRAID_BUBBLE_H
#include "braid/pipeline.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct braid_bubble_scheduler braid_bubble_scheduler;

/* A scheduler for `plan`, which must be colocated (strategy optimus, or an auto plan
 * that optimus won). The scheduler keeps its own copy of the plan's layout: the plan
 * may be destroyed first, but its braid_config must outlive the scheduler (as it must
 * outlive the plan). Nothing is scheduled until braid_bubble_scheduler_run.
 * BRAID_ERR_UNSUPPORTED when the plan is not colocated (the message names its layout and
 * strategy); BRAID_ERR_INVALID_ARGUMENT for NULL arguments. *out is NULL on failure. */
BRAID_API braid_status braid_bubble_scheduler_create(const braid_plan* plan, braid_bubble_scheduler** out);
typedef braid_status (*braid_bubble_scheduler_create_fn)(const braid_plan*, braid_bubble_scheduler**);
BRAID_API braid_status braid_bubble_scheduler_destroy(braid_bubble_scheduler* scheduler);
typedef braid_status (*braid_bubble_scheduler_destroy_fn)(braid_bubble_scheduler*);

/* Schedules the plan: all four programs and the report. Idempotent: a second call
 * returns BRAID_OK at once and changes nothing. Safe to call from several threads (one
 * runs, the others wait for it). BRAID_ERR_BAD_CONFIG when the plan cannot run as a
 * colocated program (the message says why); on failure nothing is kept and a later
 * call tries again. */
BRAID_API braid_status braid_bubble_scheduler_run(braid_bubble_scheduler* scheduler);
typedef braid_status (*braid_bubble_scheduler_run_fn)(braid_bubble_scheduler*);

/* What the scheduler found. Idle seconds are per device, mean over devices, by cause
 * (indexed by braid_bubble_cause). */
typedef struct braid_bubble_report {
  size_t struct_size; /* set by the caller: sizeof(braid_bubble_report) */
  /* Simulated step time of each program. fine <= coarse <= plain. */
  double plain_step_s;  /* "encoder-first" */
  double coarse_step_s; /* "optimus-coarse" */
  double fine_step_s;   /* "optimus-fine" */
  /* Share (0..1) of the encoder-first schedule's idle device time that each pass turned into work. */
  double recovered_coarse;
  double recovered_fine;
  double bubbles_before_s[BRAID_BUBBLE_COUNT]; /* idle seconds of "encoder-first" */
  double bubbles_after_s[BRAID_BUBBLE_COUNT];  /* idle seconds of "optimus-fine" */
  double scheduler_time_s;                     /* wall-clock seconds braid_bubble_scheduler_run took */
  int32_t placements;                          /* placements of the encoder tasks simulated */
  int64_t encoder_tasks;                       /* encoder tasks per step on the busiest device */
  int64_t tp_bubble_tasks; /* tasks of "optimus-fine" placed inside TP collective waits (all stages) */
  /* Added later: a caller whose struct_size ends before them gets the fields above.
   * Against the llm alone (the colocated step without encoder work, Optimus' reference),
   * per device, mean over devices: the llm alone's step and idle seconds, and the
   * encoder's seconds per step. */
  double llm_step_s;
  double llm_idle_s;
  double encoder_s;
  /* H = encoder_s - (step - llm_step_s), clamped at 0: encoder seconds inside llm bubbles.
   * Shares (0..1) per schedule [encoder-first, optimus-coarse, optimus-fine]: of the llm's
   * bubble time that encoder work fills (H / llm_idle_s), and of the encoder work that runs
   * in llm bubbles (H / encoder_s, what Optimus' published coarse/fine shares measure). */
  double bubble_filled[3];
  double encoder_hidden[3];
  /* Added later: tasks of "optimus-fine" in the llm's DP waits (BRAID_FLAG_IN_DP_WAIT: forwards
   * behind its parameter all-gather, backwards behind its gradient reduction), all stages. */
  int64_t dp_wait_tasks;
} braid_bubble_report;

#define BRAID_BUBBLE_REPORT_INIT \
  { sizeof(braid_bubble_report), 0, 0, 0, 0, 0, {0}, {0}, 0, 0, 0, 0, 0, 0, 0, {0}, {0}, 0 }

/* The report of the last successful run. BRAID_ERR_INVALID_ARGUMENT before
 * braid_bubble_scheduler_run has succeeded, or when report->struct_size is too small. */
BRAID_API braid_status braid_bubble_scheduler_report(const braid_bubble_scheduler* scheduler,
                                                     braid_bubble_report* report);
typedef braid_status (*braid_bubble_scheduler_report_fn)(const braid_bubble_scheduler*, braid_bubble_report*);

/* A new program holding the scheduled step: `schedule` is "optimus-fine" (NULL or "": the
 * default), "optimus-coarse", "encoder-first" or "optimus-online". The caller owns it (braid_program_destroy);
 * it is self-contained and may outlive the scheduler, the plan and the config. It is the
 * program braid_program_create(plan, schedule) builds, without scheduling again; iterate
 * and simulate it with braid/pipeline.h. BRAID_ERR_INVALID_ARGUMENT before
 * braid_bubble_scheduler_run has succeeded, or for another schedule name (the message
 * lists the four). */
BRAID_API braid_status braid_bubble_scheduler_program(const braid_bubble_scheduler* scheduler, const char* schedule,
                                                      braid_program** out);
typedef braid_status (*braid_bubble_scheduler_program_fn)(const braid_bubble_scheduler*, const char*, braid_program**);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* BRAID_BUBBLE_H */
