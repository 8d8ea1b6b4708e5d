/* Process groups and per-rank programs through the C ABI, from C99 via dlopen (every
 * braid/groups.h and per-rank braid/pipeline.h function resolved through its _fn
 * typedef). For the bundled runs (tiny-clip, tiny-mllm-4px, llava-13b-256gpu) planned
 * with megatron, distmm, disttrain and optimus, it proves:
 *  - every rank holding a module is in exactly one tp, one dp and one pp group of it,
 *    at the grid coordinates it reports (order tp-dp-pp), and in none of the others;
 *  - two handles made independently list the same groups in the same documented order;
 *  - link pairs obey the fan-in / fan-out rule of braid/pipeline.h, with each replica's
 *    ranks; a batch-sync group's ranks are the union of its members' ranks;
 *  - braid_program_rank (no groups handle) places every rank where braid_groups_rank
 *    does, and braid_program_rank_instruction lists its stage's instructions;
 *  - stage parts are complete: the parts of a rank's stage are exactly the module stages
 *    the rank holds, with the plan's layer ranges, so in disaggregated plans every layer
 *    of every module is on exactly one stage (a disttrain encoder stage reports its
 *    projector, a colocated stage its encoder); stage modules use the plan's numbering,
 *    which differs from the model file's in these plans;
 *  - gradient_scale is 1 (derived in core: the loss is normalised by the whole step) on
 *    every stage, among them DP=2 stages and fan-in producers;
 * and that misuse (NULLs, struct_size 0 or too small, ranks -1 and world, indices out of
 * range, a world of the wrong size) returns BRAID_ERR_INVALID_ARGUMENT with a message
 * naming the bad value, while a larger struct_size (a newer caller) gets a zeroed tail
 * and a smaller one (an older caller) is filled only as far as it reaches.
 * usage: test_groups LIBBRAID_SO SOURCE_DIR */

#include "capi_test.h"

/* Where a failure happened: the run and strategy being checked. */
static const char* context = "";
#define CHECKC(cond)                                                                         \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      fprintf(stderr, "%s:%d: [%s] check failed: %s\n", __FILE__, __LINE__, context, #cond); \
      ++failures;                                                                            \
    }                                                                                        \
  } while (0)

static struct {
  /* Entry points of other areas, declared here. */
  const char* (*last_error)(void);
  braid_status (*config_load_file)(const char*, braid_config**);
  braid_status (*config_destroy)(braid_config*);
  braid_status (*plan_create)(const braid_config*, const braid_plan_options*, braid_plan**);
  braid_status (*plan_destroy)(braid_plan*);
  braid_status (*plan_module_count)(const braid_plan*, size_t*);
  braid_status (*plan_module)(const braid_plan*, size_t, braid_module_info*);
  braid_status (*plan_estimate)(const braid_plan*, braid_estimate*);
  braid_status (*program_create)(const braid_plan*, const char*, braid_program**);
  braid_status (*program_destroy)(braid_program*);
  braid_status (*program_stage_count)(const braid_program*, size_t*);
  braid_status (*program_stage)(const braid_program*, size_t, braid_stage_info*);
  braid_status (*program_instruction)(const braid_program*, size_t, size_t, braid_instruction*);
  /* This area's, through their typedefs. */
  braid_groups_create_fn groups_create;
  braid_groups_destroy_fn groups_destroy;
  braid_groups_world_size_fn groups_world_size;
  braid_groups_count_fn groups_count;
  braid_groups_group_fn groups_group;
  braid_groups_rank_fn groups_rank;
  braid_groups_holding_fn groups_holding;
  braid_groups_link_count_fn groups_link_count;
  braid_groups_link_fn groups_link;
  braid_groups_link_pair_fn groups_link_pair;
  braid_groups_batch_sync_count_fn groups_batch_sync_count;
  braid_groups_batch_sync_fn groups_batch_sync;
  braid_groups_batch_sync_member_fn groups_batch_sync_member;
  braid_program_microbatches_fn program_microbatches;
  braid_program_rank_fn program_rank;
  braid_program_rank_instruction_fn program_rank_instruction;
  braid_program_stage_part_fn program_stage_part;
} api;

/* A status and a message that names `part`. */
static int refused(braid_status status, const char* part) {
  const char* message = api.last_error();
  if (status == BRAID_ERR_INVALID_ARGUMENT && message[0] != '\0' && contains(message, part)) return 1;
  fprintf(stderr, "  expected BRAID_ERR_INVALID_ARGUMENT naming '%s', got status %d: %s\n", part, (int)status, message);
  return 0;
}

/* ---- the plan's modules ------------------------------------------------------------- */

enum { kMaxModules = 8 };

typedef struct module {
  int32_t tp, pp, dp, first_device, devices;
  int encoder;
  const int32_t* layers; /* pp entries, live as long as the plan */
} module;

typedef struct planned {
  braid_plan* plan;
  int32_t world;
  size_t count;
  module modules[kMaxModules];
} planned;

static int plan_run(braid_config* config, braid_strategy strategy, int32_t tp, int32_t pp, int32_t dp, planned* out) {
  memset(out, 0, sizeof *out);
  braid_plan_options options = BRAID_PLAN_OPTIONS_INIT;
  options.strategy = strategy;
  options.tp = tp;
  options.pp = pp;
  options.dp = dp;
  if (api.plan_create(config, &options, &out->plan) != BRAID_OK) {
    fprintf(stderr, "[%s] plan_create: %s\n", context, api.last_error());
    ++failures;
    return 0;
  }
  braid_estimate estimate = BRAID_ESTIMATE_INIT;
  CHECKC(api.plan_estimate(out->plan, &estimate) == BRAID_OK);
  out->world = estimate.devices;
  CHECKC(api.plan_module_count(out->plan, &out->count) == BRAID_OK && out->count >= 1 && out->count <= kMaxModules);
  if (out->count > kMaxModules) out->count = kMaxModules;
  for (size_t m = 0; m < out->count; ++m) {
    braid_module_info info = BRAID_MODULE_INFO_INIT;
    CHECKC(api.plan_module(out->plan, m, &info) == BRAID_OK);
    module* x = &out->modules[m];
    x->tp = info.tp;
    x->pp = info.pp;
    x->dp = info.dp;
    x->first_device = info.first_device;
    x->devices = info.devices;
    x->encoder = strcmp(info.role, "encoder") == 0;
    x->layers = info.layers_per_stage;
    CHECKC(info.devices == info.tp * info.pp * info.dp && info.stage_count == info.pp);
  }
  return 1;
}

/* Grid coordinates of `rank` in module m's tp-dp-pp grid. */
static void coords(const module* m, int32_t rank, int32_t* tp, int32_t* dp, int32_t* stage) {
  const int32_t at = rank - m->first_device;
  *tp = at % m->tp;
  *dp = (at / m->tp) % m->dp;
  *stage = at / (m->tp * m->dp);
}

static int32_t replica_rank(const module* m, int32_t stage, int32_t replica, int32_t tp) {
  return m->first_device + tp + m->tp * (replica + m->dp * stage);
}

static int32_t axis_size(const module* m, braid_axis axis) {
  return axis == BRAID_AXIS_TP ? m->tp : axis == BRAID_AXIS_DP ? m->dp : m->pp;
}

static int32_t layers_before(const module* m, int32_t stage) {
  int32_t n = 0;
  for (int32_t s = 0; s < stage; ++s) n += m->layers[s];
  return n;
}

/* ---- groups ------------------------------------------------------------------------- */

static int same_group(const braid_group_info* a, const braid_group_info* b) {
  return strcmp(a->name, b->name) == 0 && a->module == b->module && a->axis == b->axis &&
         a->rank_count == b->rank_count && memcmp(a->ranks, b->ranks, a->rank_count * sizeof(int32_t)) == 0;
}

/* Checks the groups of `p`; returns a handle (the caller destroys it) and whether some
 * link fans in, with its producer module. */
static braid_groups* check_groups(const planned* p, int32_t* fan_in_module) {
  braid_groups *g = NULL, *again = NULL;
  CHECKC(api.groups_create(p->plan, p->world, &g) == BRAID_OK && g != NULL);
  CHECKC(api.groups_create(p->plan, p->world, &again) == BRAID_OK && again != NULL);
  if (!g || !again) {
    fprintf(stderr, "[%s] groups_create: %s\n", context, api.last_error());
    api.groups_destroy(g);
    api.groups_destroy(again);
    return NULL;
  }
  int32_t world = 0;
  CHECKC(api.groups_world_size(g, &world) == BRAID_OK && world == p->world);
  const size_t nm = p->count, nw = (size_t)p->world;

  /* Every group: its module's grid, listed in order, the same on both handles. */
  size_t count = 0, count_again = 0, expected = 0;
  CHECKC(api.groups_count(g, &count) == BRAID_OK && api.groups_count(again, &count_again) == BRAID_OK);
  CHECKC(count == count_again);
  for (size_t m = 0; m < nm; ++m) {
    const module* x = &p->modules[m];
    expected += (size_t)(x->devices / x->tp + x->devices / x->dp + x->devices / x->pp);
  }
  CHECKC(count == expected);
  int* member = calloc(nw * nm * 3, sizeof(int));
  long prev_key = -1;
  for (size_t i = 0; i < count; ++i) {
    braid_group_info a = BRAID_GROUP_INFO_INIT, b = BRAID_GROUP_INFO_INIT;
    CHECKC(api.groups_group(g, i, &a) == BRAID_OK && api.groups_group(again, i, &b) == BRAID_OK);
    CHECKC(same_group(&a, &b));
    CHECKC(a.module >= 0 && (size_t)a.module < nm && a.axis >= BRAID_AXIS_TP && a.axis <= BRAID_AXIS_PP);
    if (a.module < 0 || (size_t)a.module >= nm || a.rank_count == 0) continue;
    const module* x = &p->modules[a.module];
    CHECKC(a.name != NULL && a.name[0] != '\0');
    CHECKC(a.rank_count == (size_t)axis_size(x, a.axis) && a.ranks != NULL);
    /* Module by module, tp then dp then pp, by lowest rank. */
    const long key = ((long)a.module * 3 + (long)a.axis) * (long)nw + a.ranks[0];
    CHECKC(key > prev_key);
    prev_key = key;
    int32_t t0, d0, s0;
    coords(x, a.ranks[0], &t0, &d0, &s0);
    for (size_t k = 0; k < a.rank_count; ++k) {
      const int32_t r = a.ranks[k];
      CHECKC(r >= x->first_device && r < x->first_device + x->devices && r < p->world);
      if (r < 0 || r >= p->world) continue;
      CHECKC(k == 0 || r > a.ranks[k - 1]);
      /* The ranks differ along the group's axis only, at coordinates 0..n-1. */
      int32_t t, d, s;
      coords(x, r, &t, &d, &s);
      const int32_t along = a.axis == BRAID_AXIS_TP ? t : a.axis == BRAID_AXIS_DP ? d : s;
      CHECKC(along == (int32_t)k);
      CHECKC((a.axis == BRAID_AXIS_TP || t == t0) && (a.axis == BRAID_AXIS_DP || d == d0) &&
             (a.axis == BRAID_AXIS_PP || s == s0));
      ++member[((size_t)r * nm + (size_t)a.module) * 3 + (size_t)a.axis];
    }
  }

  /* Every rank: one group per axis of each module it holds, at the coordinates it reports. */
  for (int32_t r = 0; r < p->world; ++r) {
    braid_rank_info info = BRAID_RANK_INFO_INIT;
    CHECKC(api.groups_rank(g, r, &info) == BRAID_OK && info.holding_count >= 1);
    int held[kMaxModules] = {0};
    int32_t last = -1;
    for (size_t h = 0; h < info.holding_count; ++h) {
      braid_holding hold = BRAID_HOLDING_INIT;
      CHECKC(api.groups_holding(g, r, h, &hold) == BRAID_OK);
      CHECKC(hold.module > last && (size_t)hold.module < nm);
      if (hold.module <= last || (size_t)hold.module >= nm) continue;
      last = hold.module;
      held[hold.module] = 1;
      int32_t t, d, s;
      coords(&p->modules[hold.module], r, &t, &d, &s);
      CHECKC(hold.tp == t && hold.dp == d && hold.stage == s);
    }
    for (size_t m = 0; m < nm; ++m)
      for (size_t axis = 0; axis < 3; ++axis) CHECKC(member[((size_t)r * nm + m) * 3 + axis] == held[m]);
  }
  free(member);

  /* Links: the fan-in / fan-out rule, pairs by producer then consumer replica. */
  size_t links = 0;
  CHECKC(api.groups_link_count(g, &links) == BRAID_OK);
  *fan_in_module = -1;
  for (size_t l = 0; l < links; ++l) {
    braid_link_info link = BRAID_LINK_INFO_INIT;
    CHECKC(api.groups_link(g, l, &link) == BRAID_OK);
    if (link.from_module < 0 || (size_t)link.from_module >= nm || link.to_module < 0 || (size_t)link.to_module >= nm) {
      CHECKC(!"link module out of range");
      continue;
    }
    const module *a = &p->modules[link.from_module], *b = &p->modules[link.to_module];
    CHECKC(link.from_stage == a->pp - 1 && link.to_stage == 0);
    const int32_t A = a->dp, B = b->dp;
    CHECKC(A % B == 0 || B % A == 0);
    CHECKC(link.pair_count == (size_t)(A > B ? A : B));
    if (A > B) *fan_in_module = link.from_module;
    int local = 1;
    for (size_t k = 0; k < link.pair_count; ++k) {
      braid_link_pair pair = BRAID_LINK_PAIR_INIT;
      CHECKC(api.groups_link_pair(g, l, k, &pair) == BRAID_OK);
      const int32_t r = A >= B ? (int32_t)k : (int32_t)k / (B / A);
      const int32_t to = A >= B ? r / (A / B) : r * (B / A) + (int32_t)k % (B / A);
      CHECKC(pair.from_replica == r && pair.to_replica == to);
      CHECKC(pair.from_rank_count == (size_t)a->tp && pair.to_rank_count == (size_t)b->tp);
      int same = pair.from_rank_count == pair.to_rank_count;
      for (int32_t t = 0; t < a->tp && (size_t)t < pair.from_rank_count; ++t)
        CHECKC(pair.from_ranks[t] == replica_rank(a, link.from_stage, r, t));
      for (int32_t t = 0; t < b->tp && (size_t)t < pair.to_rank_count; ++t)
        CHECKC(pair.to_ranks[t] == replica_rank(b, 0, to, t));
      for (size_t t = 0; same && t < pair.from_rank_count; ++t) same = pair.from_ranks[t] == pair.to_ranks[t];
      local = local && same;
    }
    CHECKC(link.local == local);
  }

  /* Batch-sync groups: members by tower then replica, ranks their union in member order. */
  size_t syncs = 0;
  CHECKC(api.groups_batch_sync_count(g, &syncs) == BRAID_OK);
  for (size_t i = 0; i < syncs; ++i) {
    braid_batch_sync_info info = BRAID_BATCH_SYNC_INFO_INIT;
    CHECKC(api.groups_batch_sync(g, i, &info) == BRAID_OK && contains(info.name, ".batch_sync"));
    int32_t* expect = malloc(nw * sizeof(int32_t));
    char* seen = calloc(nw, 1);
    size_t n = 0;
    int32_t prev_module = -1, prev_replica = -1;
    CHECKC(info.member_count >= 2);
    for (size_t k = 0; k < info.member_count; ++k) {
      braid_batch_sync_member mem = BRAID_BATCH_SYNC_MEMBER_INIT;
      CHECKC(api.groups_batch_sync_member(g, i, k, &mem) == BRAID_OK);
      if (mem.module < 0 || (size_t)mem.module >= nm) {
        CHECKC(!"batch-sync member module out of range");
        continue;
      }
      const module* x = &p->modules[mem.module];
      CHECKC(mem.stage == x->pp - 1 && mem.replica >= 0 && mem.replica < x->dp);
      CHECKC(mem.module == prev_module ? mem.replica == prev_replica + 1 : mem.replica == 0);
      prev_module = mem.module;
      prev_replica = mem.replica;
      CHECKC(mem.rank_count == (size_t)x->tp);
      for (size_t t = 0; t < mem.rank_count; ++t) {
        const int32_t r = mem.ranks[t];
        CHECKC(r == replica_rank(x, mem.stage, mem.replica, (int32_t)t));
        if (r >= 0 && r < p->world && !seen[r]) {
          seen[r] = 1;
          expect[n++] = r;
        }
      }
    }
    CHECKC(info.rank_count == n && memcmp(info.ranks, expect, n * sizeof(int32_t)) == 0);
    free(expect);
    free(seen);
  }
  api.groups_destroy(again);
  return g;
}

/* ---- programs ----------------------------------------------------------------------- */

typedef enum layout { kMonolithic, kDisaggregated, kColocated } layout;

typedef struct found {
  int dp2;    /* a DP=2 stage checked */
  int fan_in; /* a fan-in producer stage checked */
} found;

static int same_instruction(const braid_instruction* a, const braid_instruction* b) {
  return a->opcode == b->opcode && a->microbatch == b->microbatch && a->chunk == b->chunk && a->peer == b->peer &&
         a->group == b->group && a->unit == b->unit && a->flags == b->flags;
}

static void check_program(const planned* p, const braid_groups* g, const char* schedule, layout kind, int contrastive,
                          int32_t fan_in_module, found* f) {
  braid_program* program = NULL;
  CHECKC(api.program_create(p->plan, schedule, &program) == BRAID_OK);
  if (!program) {
    fprintf(stderr, "[%s] program_create(%s): %s\n", context, schedule ? schedule : "NULL", api.last_error());
    return;
  }
  size_t stages = 0;
  CHECKC(api.program_stage_count(program, &stages) == BRAID_OK && stages >= 1);
  int32_t microbatches = 0;
  CHECKC(api.program_microbatches(program, &microbatches) == BRAID_OK && microbatches >= 1);
  const size_t nm = p->count;
  enum { kMaxStages = 64 };
  int cover[kMaxModules][kMaxStages];
  memset(cover, 0, sizeof cover);
  braid_stage_info* infos = calloc(stages, sizeof *infos);

  for (size_t s = 0; s < stages; ++s) {
    braid_stage_info info = BRAID_STAGE_INFO_INIT;
    CHECKC(api.program_stage(program, s, &info) == BRAID_OK && info.part_count >= 1);
    infos[s] = info;
    /* gradient_scale: 1, the sum over the DP group is the gradient (core/pipeline/program.hpp). */
    CHECKC(info.gradient_scale == 1.0);
    if (info.replicas == 2) f->dp2 = 1;
    int32_t prev_module = -1, encoders = 0, others = 0, fan_in = 0;
    int own = info.module < 0;
    for (size_t k = 0; k < info.part_count; ++k) {
      braid_stage_part part = BRAID_STAGE_PART_INIT;
      CHECKC(api.program_stage_part(program, s, k, &part) == BRAID_OK);
      if (part.module < 0 || (size_t)part.module >= nm) {
        CHECKC(!"stage part module out of range");
        continue;
      }
      const module* x = &p->modules[part.module];
      CHECKC(part.module > prev_module); /* plan order, each module once */
      prev_module = part.module;
      CHECKC(part.module_stage >= 0 && part.module_stage < x->pp && part.module_stage < kMaxStages);
      if (part.module_stage < 0 || part.module_stage >= x->pp || part.module_stage >= kMaxStages) continue;
      CHECKC(part.first_layer == layers_before(x, part.module_stage));
      CHECKC(part.layer_count == x->layers[part.module_stage]);
      ++cover[part.module][part.module_stage];
      own = own || part.module == info.module;
      if (x->encoder)
        ++encoders;
      else
        ++others;
      if (part.module == fan_in_module) fan_in = 1;
    }
    CHECKC(own); /* the stage's module is among its parts */
    if (kind == kDisaggregated) CHECKC(info.module >= 0);
    if (kind == kMonolithic) CHECKC((info.module < 0) == (info.part_count > 1));
    if (kind == kColocated) CHECKC(encoders >= 1 && others >= 1);
    if (fan_in) {
      CHECKC(info.gradient_scale == 1.0);
      f->fan_in = 1;
    }
    /* Each stage runs the program's microbatches (non-contrastive programs). */
    if (!contrastive) {
      int32_t forwards = 0, chunks = 1;
      for (size_t i = 0; i < info.instruction_count; ++i) {
        braid_instruction ins = BRAID_INSTRUCTION_INIT;
        CHECKC(api.program_instruction(program, s, i, &ins) == BRAID_OK);
        if (ins.opcode == BRAID_OP_FORWARD) ++forwards;
        if (ins.opcode == BRAID_OP_FORWARD && ins.chunk + 1 > chunks) chunks = ins.chunk + 1;
      }
      CHECKC(forwards == microbatches * chunks);
    }
  }
  /* Every module stage on exactly one stage (colocated encoders: on one or more). */
  for (size_t m = 0; m < nm; ++m) {
    const module* x = &p->modules[m];
    int32_t layers = 0, total = 0;
    for (int32_t st = 0; st < x->pp && st < kMaxStages; ++st) {
      total += x->layers[st];
      if (kind == kColocated && x->encoder) {
        CHECKC(cover[m][st] >= 1);
      } else {
        CHECKC(cover[m][st] == 1);
      }
      layers += cover[m][st] ? x->layers[st] : 0;
    }
    CHECKC(layers == total);
  }

  /* Every rank: the program places it where the groups do; its instructions are its stage's;
   * its stage's parts are the module stages it holds. */
  for (int32_t r = 0; r < p->world; ++r) {
    braid_rank_info where = BRAID_RANK_INFO_INIT;
    braid_program_rank_info mine = BRAID_PROGRAM_RANK_INFO_INIT;
    CHECKC(api.groups_rank(g, r, &where) == BRAID_OK);
    CHECKC(api.program_rank(program, r, &mine) == BRAID_OK);
    CHECKC(mine.stage == where.stage && mine.replica == where.replica && mine.tp_rank == where.tp_rank);
    if (mine.stage < 0 || (size_t)mine.stage >= stages) continue;
    const braid_stage_info* info = &infos[mine.stage];
    CHECKC(r == info->first_device + mine.replica * info->device_stride + mine.tp_rank);
    CHECKC(mine.replica < info->replicas && mine.tp_rank < info->devices_per_replica);
    CHECKC(mine.instruction_count == info->instruction_count);
    /* Instructions: sampled on every rank, all of them on each stage's first rank. */
    const int first = r == info->first_device;
    for (size_t i = 0; i < mine.instruction_count; i += first ? 1 : 97) {
      braid_instruction a = BRAID_INSTRUCTION_INIT, b = BRAID_INSTRUCTION_INIT;
      CHECKC(api.program_rank_instruction(program, r, i, &a) == BRAID_OK);
      CHECKC(api.program_instruction(program, (size_t)mine.stage, i, &b) == BRAID_OK);
      CHECKC(same_instruction(&a, &b));
    }
    CHECKC(where.holding_count == info->part_count);
    for (size_t k = 0; k < where.holding_count && k < info->part_count; ++k) {
      braid_holding hold = BRAID_HOLDING_INIT;
      braid_stage_part part = BRAID_STAGE_PART_INIT;
      CHECKC(api.groups_holding(g, r, k, &hold) == BRAID_OK);
      CHECKC(api.program_stage_part(program, (size_t)mine.stage, k, &part) == BRAID_OK);
      CHECKC(hold.module == part.module && hold.stage == part.module_stage);
    }
  }
  /* Ranks outside the program's devices. */
  braid_program_rank_info mine = BRAID_PROGRAM_RANK_INFO_INIT;
  char devices[64];
  snprintf(devices, sizeof devices, "%d device", (int)p->world);
  CHECKC(refused(api.program_rank(program, -1, &mine), "rank -1") && contains(api.last_error(), devices));
  CHECKC(refused(api.program_rank(program, p->world, &mine), devices));
  printf("%-52s %-14s %4d ranks, %2zu stages, %d microbatches\n", context, schedule ? schedule : "(default)",
         (int)p->world, stages, (int)microbatches);
  free(infos);
  api.program_destroy(program);
}

typedef struct run_case {
  const char* run;
  braid_strategy strategy;
  int32_t tp, pp, dp;
  layout kind;
  int contrastive;
  const char* schedules[4]; /* NULL-terminated; NULL first: the plan's default only */
} run_case;

static const char* strategy_name(braid_strategy s) {
  switch (s) {
    case BRAID_STRATEGY_MEGATRON:
      return "megatron";
    case BRAID_STRATEGY_DISTMM:
      return "distmm";
    case BRAID_STRATEGY_DISTTRAIN:
      return "disttrain";
    case BRAID_STRATEGY_OPTIMUS:
      return "optimus";
    default:
      return "?";
  }
}

static void check_case(const char* source_dir, const run_case* c, found* f) {
  char path[4096], label[256];
  snprintf(path, sizeof path, "%s/configs/runs/%s", source_dir, c->run);
  snprintf(label, sizeof label, "%s %s tp %d pp %d dp %d", c->run, strategy_name(c->strategy), (int)c->tp, (int)c->pp,
           (int)c->dp);
  context = label;
  braid_config* config = NULL;
  CHECKC(api.config_load_file(path, &config) == BRAID_OK);
  if (!config) return;
  planned p;
  if (plan_run(config, c->strategy, c->tp, c->pp, c->dp, &p)) {
    int32_t fan_in = -1;
    braid_groups* g = check_groups(&p, &fan_in);
    if (g) {
      check_program(&p, g, NULL, c->kind, c->contrastive, fan_in, f);
      for (size_t i = 0; i < 4 && c->schedules[i]; ++i)
        check_program(&p, g, c->schedules[i], c->kind, c->contrastive, fan_in, f);
      api.groups_destroy(g);
    }
    api.plan_destroy(p.plan);
  }
  api.config_destroy(config);
  context = "";
}

static void test_runs(const char* source_dir) {
  static const run_case cases[] = {
      {"tiny-clip.yaml", BRAID_STRATEGY_MEGATRON, 0, 0, 0, kMonolithic, 1, {"two-phase", NULL}},
      {"tiny-clip.yaml", BRAID_STRATEGY_DISTMM, 0, 0, 0, kDisaggregated, 1, {"batch-sync", "two-phase", NULL}},
      {"tiny-mllm-4px.yaml", BRAID_STRATEGY_DISTTRAIN, 0, 0, 0, kDisaggregated, 0, {"gpipe", NULL}},
      {"tiny-mllm-4px.yaml", BRAID_STRATEGY_DISTTRAIN, 0, 2, 0, kDisaggregated, 0, {NULL}},
      {"tiny-mllm-4px.yaml", BRAID_STRATEGY_MEGATRON, 0, 2, 0, kMonolithic, 0, {"gpipe", NULL}},
      {"tiny-mllm-4px.yaml", BRAID_STRATEGY_OPTIMUS, 0, 0, 0, kColocated, 0, {NULL}},
      {"tiny-mllm-4px.yaml", BRAID_STRATEGY_OPTIMUS, 0, 2, 0, kColocated, 0, {"encoder-first", NULL}},
      {"llava-13b-256gpu.yaml", BRAID_STRATEGY_DISTTRAIN, 0, 0, 0, kDisaggregated, 0, {NULL}},
      {"llava-13b-256gpu.yaml", BRAID_STRATEGY_MEGATRON, 4, 4, 0, kMonolithic, 0, {NULL}},
  };
  found f = {0, 0};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) check_case(source_dir, &cases[i], &f);
  CHECK(f.dp2);    /* the gradient scale was checked on a DP=2 stage */
  CHECK(f.fan_in); /* and on a fan-in producer */
}

/* ---- misuse ------------------------------------------------------------------------- */

/* A caller's struct with room for a field this library does not know: filled, tail zeroed. */
#define CHECK_NEWER_CALLER(type, call_with)        \
  do {                                             \
    struct {                                       \
      type v1;                                     \
      int64_t future_field;                        \
    } bigger;                                      \
    memset(&bigger, 0xff, sizeof bigger);          \
    bigger.v1.struct_size = sizeof bigger;         \
    type* out = &bigger.v1;                        \
    CHECK((call_with) == BRAID_OK);                \
    CHECK(bigger.v1.struct_size == sizeof bigger); \
    CHECK(bigger.future_field == 0);               \
  } while (0)

/* struct_size 0, smaller than the first field, and a field short of the struct's one
 * version: refused, naming struct_size (and the version's size). */
#define CHECK_SMALL_STRUCT(type, call_with)                                                            \
  do {                                                                                                 \
    type small;                                                                                        \
    char first_[128];                                                                                  \
    memset(&small, 0, sizeof small);                                                                   \
    type* out = &small;                                                                                \
    small.struct_size = 0;                                                                             \
    CHECK(refused((call_with), "struct_size is 0"));                                                   \
    small.struct_size = sizeof(size_t);                                                                \
    CHECK(refused((call_with), "struct_size"));                                                        \
    small.struct_size = sizeof small - sizeof(int32_t);                                                \
    snprintf(first_, sizeof first_, "below the first version of " #type " (%zu bytes)", sizeof small); \
    CHECK(refused((call_with), first_));                                                               \
  } while (0)

static void test_misuse(const char* source_dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s/configs/runs/tiny-mllm-4px.yaml", source_dir);
  context = "misuse";
  braid_config* config = NULL;
  CHECK(api.config_load_file(path, &config) == BRAID_OK);
  if (!config) return;
  planned p;
  if (!plan_run(config, BRAID_STRATEGY_DISTTRAIN, 0, 2, 0, &p)) {
    api.config_destroy(config);
    return;
  }
  CHECK(p.world == 4);

  /* Creation. */
  braid_groups* g = (braid_groups*)&p; /* must be reset to NULL on failure */
  CHECK(refused(api.groups_create(p.plan, 5, &g), "5 ranks") && g == NULL);
  CHECK(contains(api.last_error(), "4 devices"));
  CHECK(refused(api.groups_create(p.plan, 0, &g), "0 ranks") && g == NULL);
  CHECK(refused(api.groups_create(p.plan, -3, &g), "-3 ranks") && g == NULL);
  CHECK(refused(api.groups_create(NULL, 4, &g), "plan is NULL") && g == NULL);
  CHECK(refused(api.groups_create(p.plan, 4, NULL), "out is NULL"));
  CHECK(api.groups_destroy(NULL) == BRAID_OK);
  CHECK(api.groups_create(p.plan, 4, &g) == BRAID_OK && g != NULL);
  if (!g) {
    api.plan_destroy(p.plan);
    api.config_destroy(config);
    return;
  }

  /* NULL handles and out-pointers. */
  int32_t world = 0;
  size_t count = 0;
  CHECK(refused(api.groups_world_size(NULL, &world), "groups is NULL"));
  CHECK(refused(api.groups_world_size(g, NULL), "size is NULL"));
  CHECK(refused(api.groups_count(NULL, &count), "groups is NULL"));
  CHECK(refused(api.groups_count(g, NULL), "count is NULL"));
  CHECK(refused(api.groups_link_count(g, NULL), "count is NULL"));
  CHECK(refused(api.groups_batch_sync_count(NULL, &count), "groups is NULL"));
  braid_group_info group = BRAID_GROUP_INFO_INIT;
  braid_rank_info rank = BRAID_RANK_INFO_INIT;
  braid_holding holding = BRAID_HOLDING_INIT;
  braid_link_info link = BRAID_LINK_INFO_INIT;
  braid_link_pair pair = BRAID_LINK_PAIR_INIT;
  braid_batch_sync_info sync = BRAID_BATCH_SYNC_INFO_INIT;
  braid_batch_sync_member member = BRAID_BATCH_SYNC_MEMBER_INIT;
  CHECK(refused(api.groups_group(NULL, 0, &group), "groups is NULL"));
  CHECK(refused(api.groups_group(g, 0, NULL), "info is NULL"));
  CHECK(refused(api.groups_rank(NULL, 0, &rank), "groups is NULL"));
  CHECK(refused(api.groups_rank(g, 0, NULL), "info is NULL"));
  CHECK(refused(api.groups_holding(g, 0, 0, NULL), "holding is NULL"));
  CHECK(refused(api.groups_link(g, 0, NULL), "info is NULL"));
  CHECK(refused(api.groups_link_pair(g, 0, 0, NULL), "out is NULL"));
  CHECK(refused(api.groups_batch_sync(NULL, 0, &sync), "groups is NULL"));
  CHECK(refused(api.groups_batch_sync_member(NULL, 0, 0, &member), "groups is NULL"));

  /* Ranks and indices out of range, naming the value and the bound. */
  CHECK(api.groups_count(g, &count) == BRAID_OK && count > 0);
  char text[128];
  snprintf(text, sizeof text, "index %zu is out of range (%zu groups)", count, count);
  CHECK(refused(api.groups_group(g, count, &group), text));
  CHECK(refused(api.groups_group(g, (size_t)-1, &group), "is out of range"));
  CHECK(refused(api.groups_rank(g, -1, &rank), "rank -1 is out of range (the world has 4 ranks)"));
  CHECK(refused(api.groups_rank(g, 4, &rank), "rank 4 is out of range (the world has 4 ranks)"));
  CHECK(refused(api.groups_holding(g, -1, 0, &holding), "rank -1"));
  CHECK(refused(api.groups_holding(g, 4, 0, &holding), "rank 4"));
  CHECK(api.groups_rank(g, 0, &rank) == BRAID_OK && rank.holding_count == 2); /* vision and its projector */
  CHECK(refused(api.groups_holding(g, 0, 2, &holding), "index 2 is out of range (rank 0 holds 2 module stages)"));
  size_t links = 0;
  CHECK(api.groups_link_count(g, &links) == BRAID_OK && links == 2);
  CHECK(refused(api.groups_link(g, 2, &link), "index 2 is out of range (2 links)"));
  CHECK(api.groups_link(g, 1, &link) == BRAID_OK && link.pair_count == 2); /* fan-in 2 -> 1 */
  CHECK(refused(api.groups_link_pair(g, 1, 2, &pair), "pair 2 is out of range (2 pairs) of link 1"));
  CHECK(refused(api.groups_link_pair(g, 7, 0, &pair), "link 7 is out of range (2 links)"));
  size_t syncs = 9;
  CHECK(api.groups_batch_sync_count(g, &syncs) == BRAID_OK && syncs == 0);
  CHECK(refused(api.groups_batch_sync(g, 0, &sync), "index 0 is out of range (0 batch-sync groups)"));
  CHECK(refused(api.groups_batch_sync_member(g, 0, 0, &member), "index 0 is out of range (0 batch-sync groups)"));

  /* Struct sizes: too small refused, larger zero-padded. */
  CHECK_SMALL_STRUCT(braid_group_info, api.groups_group(g, 0, out));
  CHECK_SMALL_STRUCT(braid_rank_info, api.groups_rank(g, 0, out));
  CHECK_SMALL_STRUCT(braid_holding, api.groups_holding(g, 0, 0, out));
  CHECK_SMALL_STRUCT(braid_link_info, api.groups_link(g, 0, out));
  CHECK_SMALL_STRUCT(braid_link_pair, api.groups_link_pair(g, 0, 0, out));
  CHECK_NEWER_CALLER(braid_group_info, api.groups_group(g, 0, out));
  CHECK_NEWER_CALLER(braid_rank_info, api.groups_rank(g, 3, out));
  CHECK_NEWER_CALLER(braid_holding, api.groups_holding(g, 0, 1, out));
  CHECK_NEWER_CALLER(braid_link_info, api.groups_link(g, 1, out));
  CHECK_NEWER_CALLER(braid_link_pair, api.groups_link_pair(g, 1, 1, out));
  {
    struct {
      braid_link_pair v1;
      int64_t future_field;
    } bigger;
    memset(&bigger, 0xff, sizeof bigger);
    bigger.v1.struct_size = sizeof bigger;
    CHECK(api.groups_link_pair(g, 1, 1, &bigger.v1) == BRAID_OK);
    CHECK(bigger.v1.from_replica == 1 && bigger.v1.to_replica == 0 && bigger.future_field == 0);
  }

  /* Per-rank programs. */
  braid_program* program = NULL;
  CHECK(api.program_create(p.plan, NULL, &program) == BRAID_OK && program != NULL);
  if (program) {
    braid_program_rank_info info = BRAID_PROGRAM_RANK_INFO_INIT;
    braid_instruction ins = BRAID_INSTRUCTION_INIT;
    braid_stage_part part = BRAID_STAGE_PART_INIT;
    int32_t microbatches = 0;
    CHECK(refused(api.program_microbatches(NULL, &microbatches), "program is NULL"));
    CHECK(refused(api.program_microbatches(program, NULL), "count is NULL"));
    CHECK(refused(api.program_rank(NULL, 0, &info), "program is NULL"));
    CHECK(refused(api.program_rank(program, 0, NULL), "info is NULL"));
    CHECK(refused(api.program_rank(program, -1, &info), "rank -1 is out of range (the program runs on 4 devices)"));
    CHECK(refused(api.program_rank(program, 4, &info), "rank 4 is out of range (the program runs on 4 devices)"));
    CHECK(refused(api.program_rank_instruction(NULL, 0, 0, &ins), "program is NULL"));
    CHECK(refused(api.program_rank_instruction(program, 0, 0, NULL), "instruction is NULL"));
    CHECK(refused(api.program_rank_instruction(program, 9, 0, &ins), "rank 9"));
    CHECK(api.program_rank(program, 3, &info) == BRAID_OK && info.stage == 2 && info.instruction_count > 0);
    snprintf(text, sizeof text, "index %zu is out of range (stage 2 has %zu instructions) (the stage of rank 3)",
             info.instruction_count, info.instruction_count);
    CHECK(refused(api.program_rank_instruction(program, 3, info.instruction_count, &ins), text));
    CHECK(refused(api.program_stage_part(NULL, 0, 0, &part), "program is NULL"));
    CHECK(refused(api.program_stage_part(program, 0, 0, NULL), "part is NULL"));
    CHECK(refused(api.program_stage_part(program, 3, 0, &part),
                  "stage index 3 is out of range (the program has 3 stages)"));
    CHECK(refused(api.program_stage_part(program, 0, 2, &part), "index 2 is out of range (stage 0 has 2 parts)"));
    CHECK_SMALL_STRUCT(braid_program_rank_info, api.program_rank(program, 0, out));
    CHECK_SMALL_STRUCT(braid_stage_part, api.program_stage_part(program, 0, 0, out));
    CHECK_SMALL_STRUCT(braid_instruction, api.program_rank_instruction(program, 0, 0, out));
    CHECK_NEWER_CALLER(braid_program_rank_info, api.program_rank(program, 2, out));
    CHECK_NEWER_CALLER(braid_stage_part, api.program_stage_part(program, 0, 1, out));
    CHECK_NEWER_CALLER(braid_instruction, api.program_rank_instruction(program, 1, 0, out));
    CHECK_NEWER_CALLER(braid_stage_info, api.program_stage(program, 0, out));

    /* An older caller's braid_stage_info, compiled before gradient_scale and part_count:
     * filled as far as it reaches, nothing written beyond. */
    {
      union {
        braid_stage_info info;
        unsigned char bytes[sizeof(braid_stage_info)];
      } old;
      memset(&old, 0xab, sizeof old);
      old.info.struct_size = offsetof(braid_stage_info, gradient_scale);
      CHECK(api.program_stage(program, 0, &old.info) == BRAID_OK);
      CHECK(old.info.struct_size == offsetof(braid_stage_info, gradient_scale) && old.info.instruction_count > 0);
      int untouched = 1;
      for (size_t b = offsetof(braid_stage_info, gradient_scale); b < sizeof old; ++b)
        untouched = untouched && old.bytes[b] == 0xab;
      CHECK(untouched);
    }
    /* The stage of the disttrain encoder holds the encoder and its projector, in plan order
     * (vision 0, llm 1, projector 2): the stage's module is the plan's vision, not the model's. */
    braid_stage_info stage = BRAID_STAGE_INFO_INIT;
    CHECK(api.program_stage(program, 0, &stage) == BRAID_OK && stage.module == 0 && stage.part_count == 2);
    CHECK(api.program_stage_part(program, 0, 1, &part) == BRAID_OK && part.module == 2 && part.module_stage == 0);
    CHECK(api.program_stage(program, 1, &stage) == BRAID_OK && stage.module == 1 && stage.part_count == 1);
    CHECK(api.program_stage(program, 2, &stage) == BRAID_OK && stage.module == 1 && stage.replicas == 1);
    api.program_destroy(program);
  }
  api.groups_destroy(g);
  api.plan_destroy(p.plan);
  api.config_destroy(config);
  context = "";
}

int main(int argc, char** argv) {
  void* lib = capi_open(argc, argv, 2, "LIBBRAID_SO SOURCE_DIR");
  RESOLVE(last_error);
  RESOLVE(config_load_file);
  RESOLVE(config_destroy);
  RESOLVE(plan_create);
  RESOLVE(plan_destroy);
  RESOLVE(plan_module_count);
  RESOLVE(plan_module);
  RESOLVE(plan_estimate);
  RESOLVE(program_create);
  RESOLVE(program_destroy);
  RESOLVE(program_stage_count);
  RESOLVE(program_stage);
  RESOLVE(program_instruction);
  RESOLVE(groups_create);
  RESOLVE(groups_destroy);
  RESOLVE(groups_world_size);
  RESOLVE(groups_count);
  RESOLVE(groups_group);
  RESOLVE(groups_rank);
  RESOLVE(groups_holding);
  RESOLVE(groups_link_count);
  RESOLVE(groups_link);
  RESOLVE(groups_link_pair);
  RESOLVE(groups_batch_sync_count);
  RESOLVE(groups_batch_sync);
  RESOLVE(groups_batch_sync_member);
  RESOLVE(program_microbatches);
  RESOLVE(program_rank);
  RESOLVE(program_rank_instruction);
  RESOLVE(program_stage_part);

  test_runs(argv[2]);
  test_misuse(argv[2]);
  return capi_finish(lib, "C ABI groups and per-rank programs", "");
}
