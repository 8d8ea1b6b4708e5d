/* The vocabularies of braid/vocabulary.h from C, through dlopen: each has the size of
 * its C enum (or list), names the C values the way the core does ("auto" is
 * BRAID_STRATEGY_AUTO and "bf16" BRAID_PRECISION_BF16 although the core orders them
 * differently), refuses an unknown vocabulary or value with a message naming the value
 * and the size, and every schedule it names is one braid_program_create knows: accepted for some plan of
 * configs/runs, and never refused as an invalid argument (at most as unsupported for a
 * plan whose layout cannot run it).
 * Compiled as C99 with -Wall -Wextra -Wpedantic -Werror.
 * usage: test_vocabulary LIBBRAID_SO SOURCE_DIR */

#include "capi_test.h"

static struct {
  braid_vocabulary_size_fn vocabulary_size;
  braid_vocabulary_name_fn vocabulary_name;
  const char* (*last_error)(void);
  braid_status (*config_load_file)(const char*, braid_config**);
  braid_status (*config_destroy)(braid_config*);
  braid_status (*plan_create)(const braid_config*, const braid_plan_options*, braid_plan**);
  braid_status (*plan_destroy)(braid_plan*);
  braid_status (*program_create)(const braid_plan*, const char*, braid_program**);
  braid_status (*program_destroy)(braid_program*);
  braid_status (*program_schedule)(const braid_program*, const char**);
} api;

/* The _fn typedefs match the prototypes: an incompatible pointer type fails the build.
 * Inside sizeof nothing is evaluated, so this needs no link against libbraid. */
static void check_typedefs(void) {
  braid_vocabulary_size_fn size_fn = NULL;
  braid_vocabulary_name_fn name_fn = NULL;
  (void)sizeof(size_fn = braid_vocabulary_size);
  (void)sizeof(name_fn = braid_vocabulary_name);
  (void)size_fn;
  (void)name_fn;
}

static size_t size_of(braid_vocabulary vocabulary) {
  size_t n = 0;
  CHECK(api.vocabulary_size(vocabulary, &n) == BRAID_OK);
  return n;
}

/* The name of `value`, or "" (and a failure) when there is none. */
static const char* name_of(braid_vocabulary vocabulary, size_t value) {
  const char* name = NULL;
  CHECK(api.vocabulary_name(vocabulary, value, &name) == BRAID_OK);
  CHECK(name != NULL && name[0] != '\0');
  return name ? name : "";
}

static void test_sizes_match_the_enums(void) {
  CHECK(size_of(BRAID_VOCABULARY_STRATEGY) == BRAID_STRATEGY_FIXED + 1);
  CHECK(size_of(BRAID_VOCABULARY_OPCODE) == BRAID_OP_ENCODER_TASK + 1);
  CHECK(size_of(BRAID_VOCABULARY_BUBBLE_CAUSE) == BRAID_BUBBLE_COUNT);
  CHECK(size_of(BRAID_VOCABULARY_REORDERING) == BRAID_REORDER_INTRA_INTER + 1);
  CHECK(size_of(BRAID_VOCABULARY_AXIS) == 3);
  CHECK(size_of(BRAID_VOCABULARY_PRECISION) == BRAID_PRECISION_FP32 + 1);
  CHECK(size_of(BRAID_VOCABULARY_RECOMPUTE) == BRAID_RECOMPUTE_FULL + 1);
  CHECK(size_of(BRAID_VOCABULARY_ATTENTION) == BRAID_ATTENTION_STANDARD + 1);
  /* gpipe, 1f1b, interleaved, the three contrastive ones and the colocated ones */
  CHECK(size_of(BRAID_VOCABULARY_SCHEDULE) >= 9);
  CHECK(size_of(BRAID_VOCABULARY_BUBBLE_SCHEDULE) >= 3);
  CHECK(size_of(BRAID_VOCABULARY_BUBBLE_SCHEDULE) < size_of(BRAID_VOCABULARY_SCHEDULE));
}

static void test_names(void) {
  CHECK(strcmp(name_of(BRAID_VOCABULARY_STRATEGY, BRAID_STRATEGY_AUTO), "auto") == 0);
  CHECK(strcmp(name_of(BRAID_VOCABULARY_STRATEGY, BRAID_STRATEGY_MEGATRON), "megatron") == 0);
  CHECK(strcmp(name_of(BRAID_VOCABULARY_STRATEGY, BRAID_STRATEGY_DISTTRAIN), "disttrain") == 0);
  CHECK(strcmp(name_of(BRAID_VOCABULARY_STRATEGY, BRAID_STRATEGY_FIXED), "fixed") == 0);
  CHECK(strcmp(name_of(BRAID_VOCABULARY_OPCODE, BRAID_OP_LOAD_MICROBATCH), "LoadMicrobatch") == 0);
  CHECK(strcmp(name_of(BRAID_VOCABULARY_OPCODE, BRAID_OP_FORWARD), "Forward") == 0);
  CHECK(strcmp(name_of(BRAID_VOCABULARY_OPCODE, BRAID_OP_ENCODER_TASK), "EncoderTask") == 0);
  CHECK(strcmp(name_of(BRAID_VOCABULARY_BUBBLE_CAUSE, BRAID_BUBBLE_DP_START), "dp_start") == 0);
  CHECK(strcmp(name_of(BRAID_VOCABULARY_BUBBLE_CAUSE, BRAID_BUBBLE_PP_WARMUP), "pp_warmup") == 0);
  CHECK(strcmp(name_of(BRAID_VOCABULARY_BUBBLE_CAUSE, BRAID_BUBBLE_IMBALANCE), "imbalance") == 0);
  CHECK(strcmp(name_of(BRAID_VOCABULARY_REORDERING, BRAID_REORDER_NONE), "none") == 0);
  CHECK(strcmp(name_of(BRAID_VOCABULARY_REORDERING, BRAID_REORDER_INTRA_INTER), "intra_inter") == 0);
  CHECK(strcmp(name_of(BRAID_VOCABULARY_AXIS, 0), "tp") == 0);
  CHECK(strcmp(name_of(BRAID_VOCABULARY_AXIS, 1), "dp") == 0);
  CHECK(strcmp(name_of(BRAID_VOCABULARY_AXIS, 2), "pp") == 0);
  CHECK(strcmp(name_of(BRAID_VOCABULARY_BUBBLE_SCHEDULE, 0), "optimus-fine") == 0);
  /* The core orders precisions fp32, fp16, bf16; the C enum starts with the default. */
  CHECK(strcmp(name_of(BRAID_VOCABULARY_PRECISION, BRAID_PRECISION_BF16), "bf16") == 0);
  CHECK(strcmp(name_of(BRAID_VOCABULARY_PRECISION, BRAID_PRECISION_FP32), "fp32") == 0);
  CHECK(strcmp(name_of(BRAID_VOCABULARY_RECOMPUTE, BRAID_RECOMPUTE_SELECTIVE), "selective") == 0);
  CHECK(strcmp(name_of(BRAID_VOCABULARY_ATTENTION, BRAID_ATTENTION_STANDARD), "standard") == 0);
  /* Names within a vocabulary are distinct; the bubble scheduler's are schedules. */
  for (int v = BRAID_VOCABULARY_STRATEGY; v <= BRAID_VOCABULARY_ATTENTION; ++v) {
    size_t n = size_of((braid_vocabulary)v);
    for (size_t i = 0; i < n; ++i)
      for (size_t j = i + 1; j < n; ++j)
        CHECK(strcmp(name_of((braid_vocabulary)v, i), name_of((braid_vocabulary)v, j)) != 0);
  }
  size_t schedules = size_of(BRAID_VOCABULARY_SCHEDULE);
  for (size_t b = 0; b < size_of(BRAID_VOCABULARY_BUBBLE_SCHEDULE); ++b) {
    int found = 0;
    for (size_t s = 0; s < schedules; ++s)
      found |= strcmp(name_of(BRAID_VOCABULARY_BUBBLE_SCHEDULE, b), name_of(BRAID_VOCABULARY_SCHEDULE, s)) == 0;
    CHECK(found);
  }
}

static void test_misuse(void) {
  size_t n = 0;
  const char* name = NULL;
  CHECK(api.vocabulary_size((braid_vocabulary)42, &n) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK(contains(api.last_error(), "42") && contains(api.last_error(), "there are 10"));
  CHECK(api.vocabulary_size((braid_vocabulary)-1, &n) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK(api.vocabulary_size(BRAID_VOCABULARY_OPCODE, NULL) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK(api.vocabulary_name((braid_vocabulary)10, 0, &name) == BRAID_ERR_INVALID_ARGUMENT && name == NULL);
  CHECK(api.vocabulary_name(BRAID_VOCABULARY_OPCODE, 99, &name) == BRAID_ERR_INVALID_ARGUMENT && name == NULL);
  CHECK(contains(api.last_error(), "99") && contains(api.last_error(), "has 11 names"));
  CHECK(api.vocabulary_name(BRAID_VOCABULARY_AXIS, 3, &name) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK(contains(api.last_error(), "value 3") && contains(api.last_error(), "has 3 names"));
  CHECK(api.vocabulary_name(BRAID_VOCABULARY_AXIS, 0, NULL) == BRAID_ERR_INVALID_ARGUMENT);
}

enum { kMaxPlans = 16 };

/* Plans of configs/runs that between them cover every layout. */
static size_t make_plans(const char* source_dir, braid_config** configs, braid_plan** plans) {
  static const struct {
    const char* run;
    braid_strategy strategy;
    int32_t tp, pp;
  } wanted[] = {
      {"llava-13b-256gpu.yaml", BRAID_STRATEGY_MEGATRON, 8, 4},
      {"llava-13b-256gpu.yaml", BRAID_STRATEGY_DISTTRAIN, 0, 0},
      {"clip-vit-l14-64gpu.yaml", BRAID_STRATEGY_DISTMM, 0, 0},
      {"tiny-clip.yaml", BRAID_STRATEGY_DISTMM, 0, 0},
      {"tiny-clip.yaml", BRAID_STRATEGY_MEGATRON, 0, 0},
      {"tiny-mllm.yaml", BRAID_STRATEGY_OPTIMUS, 0, 0},
      {"tiny-mllm.yaml", BRAID_STRATEGY_MEGATRON, 0, 0},
      {"tiny-mllm-4px.yaml", BRAID_STRATEGY_OPTIMUS, 0, 0},
      {"pipeline-demo.yaml", BRAID_STRATEGY_AUTO, 0, 0},
      {"gpt-175b-1024gpu.yaml", BRAID_STRATEGY_MEGATRON, 0, 0},
  };
  size_t count = 0;
  for (size_t w = 0; w < sizeof wanted / sizeof wanted[0] && count < kMaxPlans; ++w) {
    char path[4096];
    snprintf(path, sizeof path, "%s/configs/runs/%s", source_dir, wanted[w].run);
    braid_config* config = NULL;
    if (api.config_load_file(path, &config) != BRAID_OK) {
      fprintf(stderr, "skipping %s: %s\n", path, api.last_error());
      continue;
    }
    braid_plan_options options = BRAID_PLAN_OPTIONS_INIT;
    options.strategy = wanted[w].strategy;
    options.tp = wanted[w].tp;
    options.pp = wanted[w].pp;
    braid_plan* plan = NULL;
    if (api.plan_create(config, &options, &plan) != BRAID_OK) {
      fprintf(stderr, "skipping %s (strategy %d): %s\n", wanted[w].run, (int)wanted[w].strategy, api.last_error());
      api.config_destroy(config);
      continue;
    }
    configs[count] = config;
    plans[count] = plan;
    ++count;
  }
  return count;
}

static void test_every_schedule_builds_a_program(const char* source_dir) {
  braid_config* configs[kMaxPlans] = {NULL};
  braid_plan* plans[kMaxPlans] = {NULL};
  size_t count = make_plans(source_dir, configs, plans);
  CHECK(count >= 4);
  size_t schedules = size_of(BRAID_VOCABULARY_SCHEDULE);
  for (size_t s = 0; s < schedules; ++s) {
    const char* name = name_of(BRAID_VOCABULARY_SCHEDULE, s);
    int accepted = 0;
    for (size_t p = 0; p < count; ++p) {
      braid_program* program = NULL;
      braid_status status = api.program_create(plans[p], name, &program);
      if (status == BRAID_OK) {
        const char* built = NULL;
        CHECK(api.program_schedule(program, &built) == BRAID_OK && built && strcmp(built, name) == 0);
        ++accepted;
      } else if (status != BRAID_ERR_UNSUPPORTED) {
        fprintf(stderr, "schedule '%s', plan %zu: status %d: %s\n", name, p, (int)status, api.last_error());
        CHECK(status == BRAID_ERR_UNSUPPORTED);
      }
      api.program_destroy(program);
    }
    if (!accepted) fprintf(stderr, "no plan runs schedule '%s'\n", name);
    CHECK(accepted > 0);
  }
  for (size_t p = 0; p < count; ++p) {
    api.plan_destroy(plans[p]);
    api.config_destroy(configs[p]);
  }
}

int main(int argc, char** argv) {
  void* lib = capi_open(argc, argv, 2, "LIBBRAID_SO SOURCE_DIR");
  RESOLVE(vocabulary_size);
  RESOLVE(vocabulary_name);
  RESOLVE(last_error);
  RESOLVE(config_load_file);
  RESOLVE(config_destroy);
  RESOLVE(plan_create);
  RESOLVE(plan_destroy);
  RESOLVE(program_create);
  RESOLVE(program_destroy);
  RESOLVE(program_schedule);

  check_typedefs();
  test_sizes_match_the_enums();
  test_names();
  test_misuse();
  test_every_schedule_builds_a_program(argv[2]);
  return capi_finish(lib, "vocabularies", "");
}
