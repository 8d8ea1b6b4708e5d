/*
 * braid/groups.h: the process groups of a plan. Included by braid.h; the conventions
 * of braid.h hold here too.
 *
 * A world of `world_size` ranks runs a plan, one rank per device: rank r is device r,
 * the numbering of braid_stage_info's first_device and device_stride, so a rank that
 * runs a program finds its peers here. Every module of the plan has a rank grid of
 * order tp-dp-pp (the tp ranks of a replica are consecutive, then the replicas of a
 * stage, then the stages) from its braid_module_info.first_device; its groups are the
 * sub-grids along one axis. Modules are numbered as braid_plan_module numbers them (the
 * plan's order); so is every `module` field of this header and of braid/pipeline.h.
 *
 * Groups are listed in one order, the same for every rank and every handle made from
 * the same plan (so hosts may create their communicators collectively in list order):
 * module by module in plan order; within a module, its tp groups, then its dp groups,
 * then its pp groups; within an axis, by their lowest rank. A group's ranks ascend.
 * Links are listed producers before consumers (the model file's order of consumers,
 * each consumer's inputs in order); batch-sync groups in the model file's order of
 * its contrastive losses.
 *
 * Everything here is arithmetic on the plan: braid_groups_create takes milliseconds
 * even for thousands of ranks and needs no communication.
 */
/* braid.h first, before this header's guard: it includes every header, in an order where
 * each finds what it needs, whichever header a program includes first. */
#include "braid/braid.h"

#ifndef BRAID_GROUPS_H
#define BRAID_GROUPS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct braid_groups braid_groups;

typedef enum braid_axis {
  BRAID_AXIS_TP = 0, /* tensor parallel: the devices of one replica of one module stage */
  BRAID_AXIS_DP = 1, /* data parallel: the replicas of one module stage, at one tp rank */
  BRAID_AXIS_PP = 2  /* pipeline parallel: the stages of one module, at one (tp rank, replica) */
} braid_axis;

/* The groups of `plan` on a world of `world_size` ranks (which must be the plan's
 * devices, braid_estimate.devices; else BRAID_ERR_INVALID_ARGUMENT with both counts).
 * BRAID_ERR_BAD_CONFIG when the plan's placements do not form grids on ranks
 * 0..world_size-1. The handle is self-contained: it may outlive the plan. */
BRAID_API braid_status braid_groups_create(const braid_plan* plan, int32_t world_size, braid_groups** out);
typedef braid_status (*braid_groups_create_fn)(const braid_plan*, int32_t, braid_groups**);
/* NULL: no-op. */
BRAID_API braid_status braid_groups_destroy(braid_groups* groups);
typedef braid_status (*braid_groups_destroy_fn)(braid_groups*);
BRAID_API braid_status braid_groups_world_size(const braid_groups* groups, int32_t* size);
typedef braid_status (*braid_groups_world_size_fn)(const braid_groups*, int32_t*);

/* ---- per-module groups ------------------------------------------------------------ */

/* Groups of every module along every axis, in the order above. */
BRAID_API braid_status braid_groups_count(const braid_groups* groups, size_t* count);
typedef braid_status (*braid_groups_count_fn)(const braid_groups*, size_t*);

typedef struct braid_group_info {
  size_t struct_size;   /* set by the caller: sizeof(braid_group_info) */
  const char* name;     /* "vision.dp[pp=0,tp=1]": the module, the axis, the coordinates it fixes */
  int32_t module;       /* braid_plan_module index */
  braid_axis axis;      /* the axis its ranks differ along */
  size_t rank_count;    /* the axis' size in the module's grid */
  const int32_t* ranks; /* rank_count ranks, ascending */
} braid_group_info;

#define BRAID_GROUP_INFO_INIT \
  { sizeof(braid_group_info), NULL, 0, BRAID_AXIS_TP, 0, NULL }

/* Group `index` (< braid_groups_count). Strings and arrays live as long as the handle. */
BRAID_API braid_status braid_groups_group(const braid_groups* groups, size_t index, braid_group_info* info);
typedef braid_status (*braid_groups_group_fn)(const braid_groups*, size_t, braid_group_info*);

/* ---- ranks ------------------------------------------------------------------------ */

typedef struct braid_rank_info {
  size_t struct_size;   /* set by the caller: sizeof(braid_rank_info) */
  int32_t stage;        /* the program stage the rank runs (braid_program_stage index) */
  int32_t replica;      /* its DP replica of that stage */
  int32_t tp_rank;      /* its place in the replica's devices, 0..devices_per_replica-1 */
  size_t holding_count; /* module stages it holds (several in monolithic and colocated plans) */
} braid_rank_info;

#define BRAID_RANK_INFO_INIT \
  { sizeof(braid_rank_info), 0, 0, 0, 0 }

/* Where rank `rank` (0..world_size-1) runs; braid_program_rank gives the same stage,
 * replica and tp rank for any program of the plan. */
BRAID_API braid_status braid_groups_rank(const braid_groups* groups, int32_t rank, braid_rank_info* info);
typedef braid_status (*braid_groups_rank_fn)(const braid_groups*, int32_t, braid_rank_info*);

/* What a rank holds of one module: its coordinates in the module's grid. */
typedef struct braid_holding {
  size_t struct_size; /* set by the caller: sizeof(braid_holding) */
  int32_t module;     /* braid_plan_module index */
  int32_t stage;      /* the module's own pipeline stage, 0..pp-1 */
  int32_t tp;         /* tensor-parallel rank, 0..tp-1 */
  int32_t dp;         /* data-parallel replica, 0..dp-1 */
} braid_holding;

#define BRAID_HOLDING_INIT \
  { sizeof(braid_holding), 0, 0, 0, 0 }

/* Holding `index` (< holding_count) of rank `rank`, by module in plan order. The rank is
 * in exactly one tp, one dp and one pp group of each module it holds. */
BRAID_API braid_status braid_groups_holding(const braid_groups* groups, int32_t rank, size_t index,
                                            braid_holding* holding);
typedef braid_status (*braid_groups_holding_fn)(const braid_groups*, int32_t, size_t, braid_holding*);

/* ---- cross-module links ------------------------------------------------------------ */

/* Where one module's output feeds another's input (encoder -> projector -> llm ->
 * generator): activations go from from_module's last stage to to_module's first,
 * gradients come back. */
BRAID_API braid_status braid_groups_link_count(const braid_groups* groups, size_t* count);
typedef braid_status (*braid_groups_link_count_fn)(const braid_groups*, size_t*);

typedef struct braid_link_info {
  size_t struct_size;  /* set by the caller: sizeof(braid_link_info) */
  int32_t from_module; /* braid_plan_module index of the producer */
  int32_t to_module;   /* braid_plan_module index of the consumer */
  int32_t from_stage;  /* the producer's last stage (its pp - 1) */
  int32_t to_stage;    /* the consumer's first stage (0) */
  int32_t local;       /* 1: every pair's ranks are the same, the hand-over stays on the device */
  size_t pair_count;   /* one pair per (producer replica, consumer replica) that exchange */
} braid_link_info;

#define BRAID_LINK_INFO_INIT \
  { sizeof(braid_link_info), 0, 0, 0, 0, 0, 0 }

BRAID_API braid_status braid_groups_link(const braid_groups* groups, size_t index, braid_link_info* info);
typedef braid_status (*braid_groups_link_fn)(const braid_groups*, size_t, braid_link_info*);

/* One pair of a link. With A producer replicas and B consumer replicas (one divides the
 * other), producer replica r exchanges with consumer replica r/(A/B) when A >= B (fan-in:
 * A/B producers feed one consumer, which sends each of them the gradients of its share)
 * and with replicas r*(B/A) .. r*(B/A)+B/A-1 when A < B (fan-out), the rule of
 * braid/pipeline.h. Pairs are listed by producer replica, then consumer replica:
 * max(A, B) pairs. */
typedef struct braid_link_pair {
  size_t struct_size;     /* set by the caller: sizeof(braid_link_pair) */
  int32_t from_replica;   /* producer replica, 0..A-1 */
  int32_t to_replica;     /* consumer replica, 0..B-1 */
  size_t from_rank_count; /* the producer replica's tp ranks at from_stage */
  const int32_t* from_ranks;
  size_t to_rank_count; /* the consumer replica's tp ranks at to_stage */
  const int32_t* to_ranks;
} braid_link_pair;

#define BRAID_LINK_PAIR_INIT \
  { sizeof(braid_link_pair), 0, 0, 0, NULL, 0, NULL }

/* Pair `pair` (< pair_count) of link `link` (< braid_groups_link_count). */
BRAID_API braid_status braid_groups_link_pair(const braid_groups* groups, size_t link, size_t pair,
                                              braid_link_pair* out);
typedef braid_status (*braid_groups_link_pair_fn)(const braid_groups*, size_t, size_t, braid_link_pair*);

/* ---- contrastive batch-sync -------------------------------------------------------- */

/* One group per contrastive loss: the ranks a BATCH_SYNC instruction gathers over, every
 * DP replica of the last stage of every tower that feeds the loss. */
BRAID_API braid_status braid_groups_batch_sync_count(const braid_groups* groups, size_t* count);
typedef braid_status (*braid_groups_batch_sync_count_fn)(const braid_groups*, size_t*);

typedef struct braid_batch_sync_info {
  size_t struct_size;  /* set by the caller: sizeof(braid_batch_sync_info) */
  const char* name;    /* "<loss module>.batch_sync" */
  size_t member_count; /* (tower, replica) members, by tower (the loss's inputs in order), then replica */
  size_t rank_count;   /* the members' ranks, each once, in member order */
  const int32_t* ranks;
} braid_batch_sync_info;

#define BRAID_BATCH_SYNC_INFO_INIT \
  { sizeof(braid_batch_sync_info), NULL, 0, 0, NULL }

BRAID_API braid_status braid_groups_batch_sync(const braid_groups* groups, size_t index, braid_batch_sync_info* info);
typedef braid_status (*braid_groups_batch_sync_fn)(const braid_groups*, size_t, braid_batch_sync_info*);

typedef struct braid_batch_sync_member {
  size_t struct_size; /* set by the caller: sizeof(braid_batch_sync_member) */
  int32_t module;     /* braid_plan_module index of the tower */
  int32_t stage;      /* its last stage, which produces the embeddings */
  int32_t replica;    /* its DP replica */
  size_t rank_count;  /* the replica's tp ranks at that stage */
  const int32_t* ranks;
} braid_batch_sync_member;

#define BRAID_BATCH_SYNC_MEMBER_INIT \
  { sizeof(braid_batch_sync_member), 0, 0, 0, 0, NULL }

/* Member `member` (< member_count) of batch-sync group `index`. */
BRAID_API braid_status braid_groups_batch_sync_member(const braid_groups* groups, size_t index, size_t member,
                                                      braid_batch_sync_member* out);
typedef braid_status (*braid_groups_batch_sync_member_fn)(const braid_groups*, size_t, size_t,
                                                          braid_batch_sync_member*);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* BRAID_GROUPS_H */
