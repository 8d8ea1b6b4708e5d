/* The C ABI's edges, from C99 through dlopen, every entry point resolved into its
 * braid_<name>_fn typedef (a typedef that does not match its function's prototype fails
 * to compile in typedef_check.c). What it proves:
 *  - struct_size: above BRAID_MAX_STRUCT_SIZE (an uninitialised struct) is refused for
 *    every struct the library reads or fills, naming the struct and the size, and
 *    nothing is written; exactly BRAID_MAX_STRUCT_SIZE is filled and zero-padded, and
 *    not one byte beyond it. Below the struct's first version is refused, its first
 *    version is filled up to its end; a struct the library reads is refused with a size
 *    between two versions (which would split a field).
 *  - braid_sample_batch.samples: above the documented 2^24 is refused before any array is
 *    read or any size computed from it.
 *  - version: 0 is an invalid argument, newer than the library's is unsupported (naming
 *    the version it knows), an older caller's smaller struct still works.
 *  - braid_config_load_file: a directory, a missing file and (not as root) an unreadable
 *    one are I/O errors that say so.
 *  - braid_last_error: the message of the last call that failed; a success keeps it.
 *  - a handle of another kind (a cast) is refused by the getters and by _destroy, which
 *    frees nothing.
 *  - schedule names: an unknown name is an invalid argument with the closest name (the
 *    message begins with the entry point, as every bad argument's does), a
 *    known schedule the plan cannot run is unsupported.
 *  - every value of every program of every bundled run (the .yaml files of configs/runs), for every
 *    feasible strategy and every schedule it runs, bubble scheduler programs included,
 *    is one braid/pipeline.h documents, and braid_stage_info.prev/next list exactly the
 *    stages each stage exchanges messages with.
 *  - typed run settings (read back, changed, refused with the run file's message naming
 *    the field, the config unchanged, earlier plans unaffected) and the plan options of
 *    version 2 (schedule, virtual stages, microbatch size honoured by the programs).
 * usage: test_hardening LIBBRAID_SO SOURCE_DIR */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <stddef.h>
#include <sys/stat.h>
#include <unistd.h>

#include "capi_test.h"

static struct {
  braid_last_error_fn last_error;
  braid_config_load_file_fn config_load_file;
  braid_config_load_string_fn config_load_string;
  braid_config_destroy_fn config_destroy;
  braid_config_run_settings_fn config_run_settings;
  braid_config_set_run_settings_fn config_set_run_settings;
  braid_plan_create_fn plan_create;
  braid_plan_destroy_fn plan_destroy;
  braid_plan_strategy_fn plan_strategy;
  braid_plan_module_count_fn plan_module_count;
  braid_plan_module_fn plan_module;
  braid_plan_estimate_fn plan_estimate;
  braid_plan_alternative_fn plan_alternative;
  braid_program_create_fn program_create;
  braid_program_destroy_fn program_destroy;
  braid_program_schedule_fn program_schedule;
  braid_program_stage_count_fn program_stage_count;
  braid_program_stage_fn program_stage;
  braid_program_instruction_fn program_instruction;
  braid_simulate_fn simulate;
  braid_simulation_destroy_fn simulation_destroy;
  braid_simulation_result_get_fn simulation_result_get;
  braid_simulation_stage_fn simulation_stage;
  braid_reorder_create_fn reorder_create;
  braid_reorder_destroy_fn reorder_destroy;
  braid_reorder_info_get_fn reorder_info_get;
  braid_bubble_scheduler_create_fn bubble_scheduler_create;
  braid_bubble_scheduler_destroy_fn bubble_scheduler_destroy;
  braid_bubble_scheduler_run_fn bubble_scheduler_run;
  braid_bubble_scheduler_report_fn bubble_scheduler_report;
  braid_bubble_scheduler_program_fn bubble_scheduler_program;
} api;

static const char* source_dir;

static braid_config* load_run(const char* name) {
  char path[4096];
  snprintf(path, sizeof path, "%s/configs/runs/%s", source_dir, name);
  braid_config* config = NULL;
  CHECK(api.config_load_file(path, &config) == BRAID_OK);
  if (!config) fprintf(stderr, "config_load_file(%s): %s\n", name, api.last_error());
  return config;
}

/* LLaVA-13B on 32 devices, as test_capi.c plans it. */
static braid_config* load_llava(void) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/configs/runs", source_dir);
  braid_config* config = NULL;
  CHECK(api.config_load_string("model: ../models/llava-13b.yaml\ncluster: ../clusters/dgx-a100-80gb.yaml\n"
                               "nodes: 4\n"
                               "training: {global_batch: 32, microbatch: 1, zero_stage: 1, recompute: full}\n"
                               "data: {image: {resolution: 336}, text: {tokens: 1472}}\n",
                               dir, &config) == BRAID_OK);
  return config;
}

static braid_plan* plan_megatron(const braid_config* config, braid_plan_options* options) {
  options->strategy = BRAID_STRATEGY_MEGATRON;
  options->tp = 8;
  options->pp = 4;
  braid_plan* plan = NULL;
  if (api.plan_create(config, options, &plan) != BRAID_OK) return NULL;
  return plan;
}

/* ---- struct sizes ------------------------------------------------------------------ */

/* The handles the getters read. */
static struct {
  braid_config* config;
  braid_plan* plan;
  braid_plan* ranked; /* auto: with alternatives */
  braid_program* program;
  braid_simulation* simulation;
  braid_reorder* reorder;
  braid_bubble_scheduler* scheduler;
} h;

static braid_status get_module(void* out) { return api.plan_module(h.plan, 0, out); }
static braid_status get_estimate(void* out) { return api.plan_estimate(h.plan, out); }
static braid_status get_alternative(void* out) { return api.plan_alternative(h.ranked, 0, out); }
static braid_status get_stage(void* out) { return api.program_stage(h.program, 0, out); }
static braid_status get_instruction(void* out) { return api.program_instruction(h.program, 0, 0, out); }
static braid_status get_result(void* out) { return api.simulation_result_get(h.simulation, out); }
static braid_status get_stage_result(void* out) { return api.simulation_stage(h.simulation, 0, out); }
static braid_status get_reorder_info(void* out) { return api.reorder_info_get(h.reorder, out); }
static braid_status get_report(void* out) { return api.bubble_scheduler_report(h.scheduler, out); }
static braid_status get_settings(void* out) { return api.config_run_settings(h.config, out); }

/* `first`: the size of the struct's first version (where the fields added later begin). */
static const struct {
  braid_status (*get)(void*);
  const char* type;
  size_t size;
  size_t first;
} kGetters[] = {
    {get_module, "braid_module_info", sizeof(braid_module_info), sizeof(braid_module_info)},
    {get_estimate, "braid_estimate", sizeof(braid_estimate), sizeof(braid_estimate)},
    {get_alternative, "braid_alternative", sizeof(braid_alternative), sizeof(braid_alternative)},
    {get_stage, "braid_stage_info", sizeof(braid_stage_info), offsetof(braid_stage_info, gradient_scale)},
    {get_instruction, "braid_instruction", sizeof(braid_instruction), sizeof(braid_instruction)},
    {get_result, "braid_simulation_result", sizeof(braid_simulation_result), sizeof(braid_simulation_result)},
    {get_stage_result, "braid_stage_result", sizeof(braid_stage_result), sizeof(braid_stage_result)},
    {get_reorder_info, "braid_reorder_info", sizeof(braid_reorder_info), sizeof(braid_reorder_info)},
    {get_report, "braid_bubble_report", sizeof(braid_bubble_report), offsetof(braid_bubble_report, llm_step_s)},
    {get_settings, "braid_run_settings", sizeof(braid_run_settings),
     offsetof(braid_run_settings, overlap_param_gather)},
};

enum { kCanary = 0xab, kBuffer = 2 * BRAID_MAX_STRUCT_SIZE };
static union {
  unsigned char bytes[kBuffer];
  long double align;
  void* pointer;
} buffer;

static void fill(size_t struct_size) {
  memset(buffer.bytes, kCanary, sizeof buffer.bytes);
  memcpy(buffer.bytes, &struct_size, sizeof struct_size);
}

/* Bytes [from, kBuffer) are still the canary. */
static int untouched_from(size_t from) {
  for (size_t i = from; i < sizeof buffer.bytes; ++i)
    if (buffer.bytes[i] != kCanary) return 0;
  return 1;
}

static void test_output_struct_sizes(void) {
  char part[128];
  for (size_t g = 0; g < sizeof kGetters / sizeof kGetters[0]; ++g) {
    const size_t refused[] = {BRAID_MAX_STRUCT_SIZE + 1, (size_t)1 << 40, (size_t)-1};
    for (size_t k = 0; k < sizeof refused / sizeof refused[0]; ++k) {
      fill(refused[k]);
      CHECK(kGetters[g].get(buffer.bytes) == BRAID_ERR_INVALID_ARGUMENT);
      CHECK(untouched_from(sizeof(size_t))); /* nothing written */
      snprintf(part, sizeof part, "struct_size is %zu, above BRAID_MAX_STRUCT_SIZE (%d)", refused[k],
               BRAID_MAX_STRUCT_SIZE);
      CHECK_ERROR(part);
      snprintf(part, sizeof part, "set it to sizeof(%s) (%zu)", kGetters[g].type, kGetters[g].size);
      CHECK_ERROR(part);
    }
    /* Too small: refused, naming the struct. */
    fill(sizeof(size_t));
    CHECK(kGetters[g].get(buffer.bytes) == BRAID_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(kGetters[g].type);
    /* A field short of the first version: refused, naming it, nothing written. */
    fill(kGetters[g].first - sizeof(int32_t));
    CHECK(kGetters[g].get(buffer.bytes) == BRAID_ERR_INVALID_ARGUMENT);
    CHECK(untouched_from(sizeof(size_t)));
    snprintf(part, sizeof part, "struct_size is %zu, below the first version of %s (%zu bytes)",
             kGetters[g].first - sizeof(int32_t), kGetters[g].type, kGetters[g].first);
    CHECK_ERROR(part);
    /* The first version: filled up to its end. */
    fill(kGetters[g].first);
    CHECK(kGetters[g].get(buffer.bytes) == BRAID_OK);
    CHECK(untouched_from(kGetters[g].first));
    /* The largest accepted: filled up to it, zeroed past the library's struct, nothing beyond. */
    fill(BRAID_MAX_STRUCT_SIZE);
    CHECK(kGetters[g].get(buffer.bytes) == BRAID_OK);
    size_t size = 0;
    memcpy(&size, buffer.bytes, sizeof size);
    CHECK(size == BRAID_MAX_STRUCT_SIZE);
    int zeroed = 1;
    for (size_t i = kGetters[g].size; i < BRAID_MAX_STRUCT_SIZE; ++i) zeroed = zeroed && buffer.bytes[i] == 0;
    CHECK(zeroed);
    CHECK(untouched_from(BRAID_MAX_STRUCT_SIZE));
    /* Its own size: filled exactly. */
    fill(kGetters[g].size);
    CHECK(kGetters[g].get(buffer.bytes) == BRAID_OK);
    CHECK(untouched_from(kGetters[g].size));
  }
}

/* An older caller's plan options: version 1, without the fields of version 2. */
typedef struct {
  size_t struct_size;
  uint32_t version;
  braid_strategy strategy;
  int32_t tp, pp, dp;
  const char* plan_yaml;
} plan_options_v1;

static void test_input_structs(void) {
  braid_plan* plan = NULL;
  braid_program* program = NULL;
  braid_simulation* sim = NULL;
  braid_reorder* reorder = NULL;

  /* braid_plan_options: size, version 0, a newer version, an older caller. */
  braid_plan_options options = BRAID_PLAN_OPTIONS_INIT;
  options.struct_size = BRAID_MAX_STRUCT_SIZE + 1;
  CHECK(api.plan_create(h.config, &options, &plan) == BRAID_ERR_INVALID_ARGUMENT && plan == NULL);
  CHECK_ERROR("options->struct_size is 4097, above BRAID_MAX_STRUCT_SIZE (4096)");
  CHECK_ERROR("sizeof(braid_plan_options)");
  CHECK_ERROR("BRAID_PLAN_OPTIONS_INIT");
  options = (braid_plan_options)BRAID_PLAN_OPTIONS_INIT;
  options.version = 0;
  CHECK(api.plan_create(h.config, &options, &plan) == BRAID_ERR_INVALID_ARGUMENT && plan == NULL);
  CHECK_ERROR("options->version is 0");
  options.version = BRAID_PLAN_OPTIONS_VERSION + 1;
  CHECK(api.plan_create(h.config, &options, &plan) == BRAID_ERR_UNSUPPORTED && plan == NULL);
  CHECK_ERROR("options->version is 3, newer than this library's BRAID_PLAN_OPTIONS_VERSION (2)");
  CHECK(BRAID_PLAN_OPTIONS_VERSION == 2);
  plan_options_v1 old = {sizeof old, 1, BRAID_STRATEGY_MEGATRON, 8, 4, 0, NULL};
  CHECK(api.plan_create(h.config, (const braid_plan_options*)(const void*)&old, &plan) == BRAID_OK);
  if (plan) {
    braid_module_info info = BRAID_MODULE_INFO_INIT;
    CHECK(api.plan_module(plan, 0, &info) == BRAID_OK && info.tp == 8 && info.microbatch_size == 1);
    const char* schedule = NULL;
    size_t stages = 0;
    CHECK(api.program_create(plan, NULL, &program) == BRAID_OK &&
          api.program_schedule(program, &schedule) == BRAID_OK && strcmp(schedule, "1f1b") == 0);
    CHECK(program && api.program_stage_count(program, &stages) == BRAID_OK && stages == 4);
    api.program_destroy(program);
    api.plan_destroy(plan);
  }
  /* A size between version 1 (ending at plan_yaml) and version 2 would split the schedule
   * pointer: refused, naming the sizes accepted. */
  char part[160];
  options = (braid_plan_options)BRAID_PLAN_OPTIONS_INIT;
  const size_t split[] = {offsetof(braid_plan_options, schedule) + 4, offsetof(braid_plan_options, virtual_stages),
                          sizeof options - 4};
  for (size_t k = 0; k < sizeof split / sizeof split[0]; ++k) {
    options.struct_size = split[k];
    CHECK(api.plan_create(h.config, &options, &plan) == BRAID_ERR_INVALID_ARGUMENT && plan == NULL);
    snprintf(part, sizeof part,
             "options->struct_size is %zu, between the versions of braid_plan_options: it takes %zu or at least %zu "
             "bytes",
             split[k], offsetof(braid_plan_options, schedule), sizeof options);
    CHECK_ERROR(part);
  }

  /* braid_simulation_options. */
  braid_simulation_options sim_options = BRAID_SIMULATION_OPTIONS_INIT;
  sim_options.struct_size = (size_t)-1;
  CHECK(api.simulate(h.program, &sim_options, &sim) == BRAID_ERR_INVALID_ARGUMENT && sim == NULL);
  CHECK_ERROR("above BRAID_MAX_STRUCT_SIZE");
  CHECK_ERROR("sizeof(braid_simulation_options)");
  sim_options = (braid_simulation_options)BRAID_SIMULATION_OPTIONS_INIT;
  sim_options.version = 2;
  CHECK(api.simulate(h.program, &sim_options, &sim) == BRAID_ERR_UNSUPPORTED && sim == NULL);
  CHECK_ERROR("BRAID_SIMULATION_OPTIONS_VERSION (1)");
  /* Its fields' end is not its one version's size (sizeof, with the tail padding). */
  sim_options = (braid_simulation_options)BRAID_SIMULATION_OPTIONS_INIT;
  sim_options.struct_size = offsetof(braid_simulation_options, trace_replicas) + sizeof(int32_t);
  CHECK(sim_options.struct_size < sizeof sim_options);
  CHECK(api.simulate(h.program, &sim_options, &sim) == BRAID_ERR_INVALID_ARGUMENT && sim == NULL);
  snprintf(part, sizeof part, "below the first version of braid_simulation_options (%zu bytes)", sizeof sim_options);
  CHECK_ERROR(part);
  /* A trace of no replica would come back as every stage idle. */
  sim_options = (braid_simulation_options)BRAID_SIMULATION_OPTIONS_INIT;
  sim_options.record_trace = 1;
  sim_options.trace_replicas = 0;
  CHECK(api.simulate(h.program, &sim_options, &sim) == BRAID_ERR_INVALID_ARGUMENT && sim == NULL);
  CHECK_ERROR("options->trace_replicas is 0; set it to -1 (all replicas) or a count of at least 1");
  sim_options.record_trace = 0;
  CHECK(api.simulate(h.program, &sim_options, &sim) == BRAID_OK && sim != NULL);
  api.simulation_destroy(sim);
  sim = NULL;

  /* braid_sample_batch (no version) and braid_reorder_options. */
  braid_sample_batch batch = BRAID_SAMPLE_BATCH_INIT;
  batch.samples = 32;
  batch.struct_size = BRAID_MAX_STRUCT_SIZE + 8;
  CHECK(api.reorder_create(h.plan, &batch, NULL, &reorder) == BRAID_ERR_INVALID_ARGUMENT && reorder == NULL);
  CHECK_ERROR("batch->struct_size is 4104, above BRAID_MAX_STRUCT_SIZE");
  batch.struct_size = sizeof batch;
  braid_reorder_options reorder_options = BRAID_REORDER_OPTIONS_INIT;
  reorder_options.struct_size = BRAID_MAX_STRUCT_SIZE + 1;
  CHECK(api.reorder_create(h.plan, &batch, &reorder_options, &reorder) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK_ERROR("sizeof(braid_reorder_options)");
  reorder_options = (braid_reorder_options)BRAID_REORDER_OPTIONS_INIT;
  reorder_options.version = 0;
  CHECK(api.reorder_create(h.plan, &batch, &reorder_options, &reorder) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK_ERROR("options->version is 0; initialise the struct with BRAID_REORDER_OPTIONS_INIT");
  reorder_options.version = 7;
  CHECK(api.reorder_create(h.plan, &batch, &reorder_options, &reorder) == BRAID_ERR_UNSUPPORTED && reorder == NULL);
  CHECK_ERROR("BRAID_REORDER_OPTIONS_VERSION (1)");
  /* More samples than the 2^24 a batch may hold: refused before module_costs is read or
   * samples x modules computed (0x5555555555555558 x 3 wraps to 8; 2^62 nominal sizes
   * exceed a vector's max_size; 2^63 + 8 is negative as a signed count). */
  static const double costs[64];
  const size_t too_many[] = {(size_t)0x5555555555555558u, (size_t)1 << 62, ((size_t)1 << 63) + 8,
                             ((size_t)1 << 24) + 32};
  for (size_t k = 0; k < sizeof too_many / sizeof too_many[0]; ++k) {
    for (int with_costs = 0; with_costs < 2; ++with_costs) {
      batch.samples = too_many[k];
      batch.module_costs = with_costs ? costs : NULL;
      CHECK(api.reorder_create(h.plan, &batch, NULL, &reorder) == BRAID_ERR_INVALID_ARGUMENT && reorder == NULL);
      snprintf(part, sizeof part, "braid_reorder_create: batch->samples is %zu, above the 16777216 samples",
               too_many[k]);
      CHECK_ERROR(part);
    }
  }
  batch.samples = 32;
  batch.module_costs = NULL;

  /* braid_run_settings, given. */
  braid_run_settings settings = BRAID_RUN_SETTINGS_INIT;
  CHECK(api.config_run_settings(h.config, &settings) == BRAID_OK);
  settings.struct_size = BRAID_MAX_STRUCT_SIZE + 1;
  CHECK(api.config_set_run_settings(h.config, &settings) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK_ERROR("settings->struct_size is 4097");
  settings.struct_size = sizeof settings;
  settings.version = 0;
  CHECK(api.config_set_run_settings(h.config, &settings) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK_ERROR("settings->version is 0");
  settings.version = BRAID_RUN_SETTINGS_VERSION + 1;
  CHECK(api.config_set_run_settings(h.config, &settings) == BRAID_ERR_UNSUPPORTED);
  CHECK_ERROR("BRAID_RUN_SETTINGS_VERSION (2)");
  /* Between version 1 (ending before overlap_param_gather) and version 2: refused. */
  settings.version = 1;
  settings.struct_size = offsetof(braid_run_settings, overlap_param_gather) + sizeof(int32_t);
  CHECK(api.config_set_run_settings(h.config, &settings) == BRAID_ERR_INVALID_ARGUMENT);
  snprintf(part, sizeof part,
           "settings->struct_size is %zu, between the versions of braid_run_settings: it takes %zu or at least %zu "
           "bytes",
           settings.struct_size, offsetof(braid_run_settings, overlap_param_gather), sizeof settings);
  CHECK_ERROR(part);
  settings.struct_size = offsetof(braid_run_settings, overlap_param_gather);
  CHECK(api.config_set_run_settings(h.config, &settings) == BRAID_OK);
}

/* A handle of another kind (a C cast) is refused by name, by getters and _destroy alike,
 * and leaves the handle it really is intact. */
static void test_handle_kinds(void) {
  size_t count = 0;
  CHECK(api.plan_module_count((const braid_plan*)h.config, &count) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK_ERROR("braid_plan_module_count: plan is not a braid_plan (a handle of another kind)");
  braid_stage_info stage = BRAID_STAGE_INFO_INIT;
  CHECK(api.program_stage((const braid_program*)h.plan, 0, &stage) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK_ERROR("program is not a braid_program");
  braid_simulation_result result = BRAID_SIMULATION_RESULT_INIT;
  CHECK(api.simulation_result_get((const braid_simulation*)h.program, &result) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK_ERROR("simulation is not a braid_simulation");
  braid_bubble_report report = BRAID_BUBBLE_REPORT_INIT;
  CHECK(api.bubble_scheduler_report((const braid_bubble_scheduler*)h.reorder, &report) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK(api.plan_destroy((braid_plan*)h.config) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK_ERROR("braid_plan_destroy: the handle is not a braid_plan");
  CHECK(api.config_destroy((braid_config*)h.simulation) == BRAID_ERR_INVALID_ARGUMENT);
  /* Nothing was freed: each still works as what it is. */
  braid_run_settings settings = BRAID_RUN_SETTINGS_INIT;
  CHECK(api.config_run_settings(h.config, &settings) == BRAID_OK);
  CHECK(api.simulation_result_get(h.simulation, &result) == BRAID_OK);
  CHECK(api.plan_module_count(h.plan, &count) == BRAID_OK && count > 0);
}

static void test_struct_sizes(void) {
  h.config = load_llava();
  if (!h.config) return;
  braid_plan_options options = BRAID_PLAN_OPTIONS_INIT;
  h.plan = plan_megatron(h.config, &options);
  CHECK(h.plan != NULL);
  CHECK(api.plan_create(h.config, NULL, &h.ranked) == BRAID_OK);
  if (h.plan) CHECK(api.program_create(h.plan, NULL, &h.program) == BRAID_OK);
  if (h.program) CHECK(api.simulate(h.program, NULL, &h.simulation) == BRAID_OK);
  braid_sample_batch batch = BRAID_SAMPLE_BATCH_INIT;
  batch.samples = 32;
  if (h.plan) CHECK(api.reorder_create(h.plan, &batch, NULL, &h.reorder) == BRAID_OK);
  braid_config* mllm = load_run("mllm-72b-1024gpu.yaml");
  braid_plan* colocated = NULL;
  braid_plan_options optimus = BRAID_PLAN_OPTIONS_INIT;
  optimus.strategy = BRAID_STRATEGY_OPTIMUS;
  if (mllm) CHECK(api.plan_create(mllm, &optimus, &colocated) == BRAID_OK);
  if (colocated) CHECK(api.bubble_scheduler_create(colocated, &h.scheduler) == BRAID_OK);
  if (h.scheduler) CHECK(api.bubble_scheduler_run(h.scheduler) == BRAID_OK);
  if (h.plan && h.ranked && h.program && h.simulation && h.reorder && h.scheduler) {
    test_output_struct_sizes();
    test_input_structs();
    test_handle_kinds();
  }
  api.bubble_scheduler_destroy(h.scheduler);
  api.plan_destroy(colocated);
  api.config_destroy(mllm);
  api.reorder_destroy(h.reorder);
  api.simulation_destroy(h.simulation);
  api.program_destroy(h.program);
  api.plan_destroy(h.plan);
  api.plan_destroy(h.ranked);
  api.config_destroy(h.config);
  memset(&h, 0, sizeof h);
}

/* ---- files, last error, names ------------------------------------------------------- */

static void test_load_file_errors(void) {
  braid_config* config = NULL;
  char path[4096];
  snprintf(path, sizeof path, "%s/configs/runs", source_dir);
  CHECK(api.config_load_file(path, &config) == BRAID_ERR_IO && config == NULL);
  CHECK_ERROR("it is a directory");
  CHECK_ERROR(path);
  CHECK(api.config_load_file("/nonexistent-braid-dir/run.yaml", &config) == BRAID_ERR_IO && config == NULL);
  CHECK_ERROR("cannot read '/nonexistent-braid-dir/run.yaml': No such file or directory");
  /* A run whose model: names a directory or a missing file: an I/O error (braid.h), at the
   * field that names it, and why. */
  snprintf(path, sizeof path, "%s/configs", source_dir);
  CHECK(api.config_load_string("model: models\ncluster: clusters/dgx-a100-80gb.yaml\n"
                               "training: {global_batch: 8, microbatch: 1}\ndata: {text: {tokens: 8}}\n",
                               path, &config) == BRAID_ERR_IO);
  CHECK_ERROR("<string>:1:8: model: cannot read");
  CHECK_ERROR("it is a directory");
  CHECK(api.config_load_string("model: models/no-such-model.yaml\ncluster: clusters/dgx-a100-80gb.yaml\n"
                               "training: {global_batch: 8, microbatch: 1}\ndata: {text: {tokens: 8}}\n",
                               path, &config) == BRAID_ERR_IO &&
        config == NULL);
  CHECK_ERROR("no-such-model.yaml': No such file or directory");
  /* Unreadable (root reads anything: then there is nothing to check). */
  char file[256];
  snprintf(file, sizeof file, "/tmp/braid-hardening-%ld.yaml", (long)getpid());
  FILE* f = fopen(file, "w");
  if (f) {
    fputs("model: x\n", f);
    fclose(f);
    chmod(file, 0);
    if (access(file, R_OK) != 0) {
      CHECK(api.config_load_file(file, &config) == BRAID_ERR_IO && config == NULL);
      CHECK_ERROR("Permission denied");
    }
    remove(file);
  }
}

static void test_last_error(void) {
  braid_config* config = load_llava();
  if (!config) return;
  braid_plan* plan = NULL;
  CHECK(api.plan_create(config, NULL, NULL) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK_ERROR("braid_plan_create: out is NULL");
  /* Successes keep the last failure's message... */
  braid_plan_options options = BRAID_PLAN_OPTIONS_INIT;
  plan = plan_megatron(config, &options);
  CHECK(plan != NULL);
  size_t count = 0;
  CHECK(plan && api.plan_module_count(plan, &count) == BRAID_OK);
  CHECK(strcmp(api.last_error(), "braid_plan_create: out is NULL") == 0);
  /* ...until the next failure replaces it. */
  braid_module_info info = BRAID_MODULE_INFO_INIT;
  CHECK(api.plan_module(plan, 99, &info) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK_ERROR("index 99 is out of range");
  CHECK(!contains(api.last_error(), "out is NULL"));
  api.plan_destroy(plan);
  api.config_destroy(config);
}

static void test_schedule_names(void) {
  braid_config* config = load_llava();
  if (!config) return;
  braid_plan_options options = BRAID_PLAN_OPTIONS_INIT;
  braid_plan* plan = plan_megatron(config, &options);
  braid_program* program = NULL;
  if (plan) {
    CHECK(api.program_create(plan, "gpipee", &program) == BRAID_ERR_INVALID_ARGUMENT && program == NULL);
    CHECK_ERROR("unknown schedule 'gpipee' (did you mean 'gpipe'?)");
    /* A bad argument found inside braid names the entry point too. */
    CHECK(strncmp(api.last_error(), "braid_program_create: ", 22) == 0);
    CHECK(api.program_create(plan, "1F1B", &program) == BRAID_ERR_INVALID_ARGUMENT && program == NULL);
    CHECK_ERROR("did you mean '1f1b'?");
    CHECK(api.program_create(plan, "two-phase", &program) == BRAID_ERR_UNSUPPORTED && program == NULL);
    CHECK_ERROR("runs 1f1b or gpipe, not 'two-phase'");
    api.plan_destroy(plan);
  }
  /* The plan options' schedule takes the same names. */
  options = (braid_plan_options)BRAID_PLAN_OPTIONS_INIT;
  options.schedule = "interleavd";
  plan = plan_megatron(config, &options);
  CHECK(plan == NULL);
  CHECK_ERROR("options->schedule: unknown schedule 'interleavd' (did you mean 'interleaved'?)");
  api.config_destroy(config);
}

/* ---- values of every program ----------------------------------------------------------- */

enum { kMaxModules = 16, kMaxStages = 1024, kMaxReports = 8 };

/* What the header's value ranges are computed from, per plan. */
typedef struct {
  const char* where; /* "run strategy schedule", for messages */
  int64_t global_batch;
  int64_t groups; /* contrastive groups per step */
  int32_t virtual_stages;
  size_t modules;
  braid_module_info module[kMaxModules];
  int32_t encoders; /* encoder modules, in braid_plan_module order */
  int32_t encoder_module[kMaxModules];
  int32_t llm; /* braid_plan_module index of the llm, or -1 */
  int reports;
} Facts;

/* What the checks saw, over every program: each kind must have been there. */
static struct {
  long instructions, encoder_tasks, tp_bubble_tasks, dp_wait_tasks, encoder_messages, llm_handovers, batch_syncs,
      wrap_arounds;
} seen;

static void violation(Facts* f, size_t stage, size_t index, const char* what, int64_t value) {
  ++failures;
  if (f->reports++ < kMaxReports)
    fprintf(stderr, "%s: stage %zu instruction %zu: %s %lld is not documented\n", f->where, stage, index, what,
            (long long)value);
}

static int in_list(const int32_t* list, size_t n, int32_t v) {
  for (size_t i = 0; i < n; ++i)
    if (list[i] == v) return 1;
  return 0;
}

/* Microbatches per step of a DP replica of a grid of `replicas` x `size`. */
static int64_t per_step(const Facts* f, int32_t replicas, int32_t size) {
  return replicas > 0 && size > 0 ? f->global_batch / ((int64_t)replicas * size) : 0;
}

static void check_program(const braid_program* program, Facts* f) {
  const char* schedule = NULL;
  CHECK(api.program_schedule(program, &schedule) == BRAID_OK && schedule != NULL);
  const int interleaved = schedule && strcmp(schedule, "interleaved") == 0;
  const int32_t chunks = interleaved ? f->virtual_stages : 1;
  size_t stages = 0;
  CHECK(api.program_stage_count(program, &stages) == BRAID_OK && stages >= 1 && stages <= kMaxStages);
  if (stages > kMaxStages) return;
  static int used_prev[kMaxStages], used_next[kMaxStages];
  for (size_t s = 0; s < stages; ++s) {
    braid_stage_info info = BRAID_STAGE_INFO_INIT;
    CHECK(api.program_stage(program, s, &info) == BRAID_OK);
    memset(used_prev, 0, sizeof used_prev);
    memset(used_next, 0, sizeof used_next);
    /* The stage's own microbatches: its module's, or the llm's on a grid of several modules. */
    const int32_t own = info.module >= 0 ? info.module : f->llm >= 0 ? f->llm : 0;
    const int64_t M = per_step(f, info.replicas, f->module[own].microbatch_size);
    int32_t last_work = -1; /* the opcode an IN_TP_BUBBLE task fills the waits of */
    int llm_started = 0;    /* a FORWARD or BACKWARD ran: no IN_DP_WAIT forward task from here */
    int in_dp_wait = 0;     /* an IN_DP_WAIT backward task ran: the stage's llm forwards and backwards are over */
    for (size_t i = 0; i < info.instruction_count; ++i) {
      braid_instruction ins = BRAID_INSTRUCTION_INIT;
      if (api.program_instruction(program, s, i, &ins) != BRAID_OK) {
        violation(f, s, i, "readable instruction", -1);
        continue;
      }
      int32_t op = 0;
      memcpy(&op, &ins.opcode, sizeof op);
      ++seen.instructions;
      if (op < BRAID_OP_LOAD_MICROBATCH || op > BRAID_OP_ENCODER_TASK) violation(f, s, i, "opcode", op);
      if (ins.flags & ~BRAID_FLAG_ALL) violation(f, s, i, "flags", ins.flags);
      const int dp_wait = (ins.flags & BRAID_FLAG_IN_DP_WAIT) != 0;
      const int backward_task = (ins.flags & BRAID_FLAG_BACKWARD_TASK) != 0;
      in_dp_wait = in_dp_wait || (dp_wait && backward_task);
      if (dp_wait && !backward_task && llm_started)
        violation(f, s, i, "forward task in the DP wait after the stage's first FORWARD or BACKWARD", ins.flags);
      if (op == BRAID_OP_FORWARD || op == BRAID_OP_BACKWARD) {
        if (in_dp_wait) violation(f, s, i, "FORWARD or BACKWARD after a backward task in the DP wait, opcode", op);
        llm_started = 1;
      }
      const int p2p = op == BRAID_OP_SEND_ACTIVATION || op == BRAID_OP_RECV_ACTIVATION || op == BRAID_OP_SEND_GRAD ||
                      op == BRAID_OP_RECV_GRAD;
      const int sync_only = (ins.flags & BRAID_FLAG_SYNC_ONLY) != 0;
      if ((ins.flags & (BRAID_FLAG_SYNC_ONLY)) && !p2p) violation(f, s, i, "SYNC_ONLY flag on opcode", op);
      if ((ins.flags & (BRAID_FLAG_BACKWARD_TASK | BRAID_FLAG_IN_TP_BUBBLE | BRAID_FLAG_IN_DP_WAIT)) &&
          op != BRAID_OP_ENCODER_TASK)
        violation(f, s, i, "task flags on opcode", op);
      /* peer: another stage, listed in prev (receives activations, sends gradients) or next. */
      if (p2p) {
        const int to_prev = op == BRAID_OP_RECV_ACTIVATION || op == BRAID_OP_SEND_GRAD;
        if (ins.peer < 0 || (size_t)ins.peer >= stages || (size_t)ins.peer == s) {
          violation(f, s, i, "peer", ins.peer);
        } else if (to_prev ? !in_list(info.prev, info.prev_count, ins.peer)
                           : !in_list(info.next, info.next_count, ins.peer)) {
          violation(f, s, i, to_prev ? "peer missing from prev" : "peer missing from next", ins.peer);
        } else {
          (to_prev ? used_prev : used_next)[ins.peer] = 1;
        }
      } else if (ins.peer != -1) {
        violation(f, s, i, "peer", ins.peer);
      }
      /* group */
      if (op == BRAID_OP_BATCH_SYNC) {
        ++seen.batch_syncs;
        if (ins.group < 0 || ins.group >= f->groups) violation(f, s, i, "group", ins.group);
      } else if (ins.group != -1) {
        violation(f, s, i, "group", ins.group);
      }
      if (op == BRAID_OP_ENCODER_TASK) {
        const int32_t slot = (ins.unit - 1) % BRAID_ENCODER_UNITS, e = (ins.unit - 1) / BRAID_ENCODER_UNITS;
        ++seen.encoder_tasks;
        if (ins.flags & BRAID_FLAG_IN_TP_BUBBLE) ++seen.tp_bubble_tasks;
        if (ins.flags & BRAID_FLAG_IN_DP_WAIT) ++seen.dp_wait_tasks;
        if (ins.unit < 1 || e >= f->encoders) {
          violation(f, s, i, "ENCODER_TASK unit", ins.unit);
          continue;
        }
        const braid_module_info* enc = &f->module[f->encoder_module[e]];
        const braid_module_info* llm = &f->module[f->llm >= 0 ? f->llm : 0];
        const int32_t span = enc->pp > 0 ? llm->pp / enc->pp : 1;
        const int32_t estage = span > 0 ? (int32_t)s / span : 0;
        if (estage >= enc->stage_count) {
          violation(f, s, i, "ENCODER_TASK on an llm stage past its encoder's stages", estage);
          continue;
        }
        if (slot == BRAID_ENCODER_UNIT_EMBEDDING && estage != 0)
          violation(f, s, i, "embedding on encoder stage", estage);
        if (slot == BRAID_ENCODER_UNIT_HEAD && estage != enc->pp - 1)
          violation(f, s, i, "head on encoder stage", estage);
        const int kernel = slot >= BRAID_ENCODER_UNIT_FIRST_KERNEL &&
                           slot < BRAID_ENCODER_UNIT_FIRST_KERNEL + BRAID_ENCODER_LAYER_KERNELS;
        if (kernel ? ins.chunk < 0 || ins.chunk >= enc->layers_per_stage[estage] : ins.chunk != 0)
          violation(f, s, i, "ENCODER_TASK chunk (layer)", ins.chunk);
        if (ins.microbatch < 0 || ins.microbatch >= per_step(f, enc->dp, enc->microbatch_size))
          violation(f, s, i, "ENCODER_TASK microbatch", ins.microbatch);
        if (ins.flags & BRAID_FLAG_IN_TP_BUBBLE) {
          if (slot == BRAID_ENCODER_UNIT_TRANSFER || slot == BRAID_ENCODER_UNIT_SHARD ||
              slot == BRAID_ENCODER_UNIT_FIRST_KERNEL + 4 || slot == BRAID_ENCODER_UNIT_FIRST_KERNEL + 8)
            violation(f, s, i, "communication in a TP bubble, slot", slot);
          if (last_work != BRAID_OP_FORWARD && last_work != BRAID_OP_BACKWARD)
            violation(f, s, i, "TP-bubble task after opcode", last_work);
        } else {
          last_work = op;
        }
        continue;
      }
      if (op != BRAID_OP_SEND_ACTIVATION && op != BRAID_OP_SEND_GRAD && op != BRAID_OP_LOAD_MICROBATCH) last_work = op;
      /* chunk and unit */
      if (ins.chunk < 0 || ins.chunk >= chunks) violation(f, s, i, "chunk", ins.chunk);
      if (ins.unit != ins.chunk) violation(f, s, i, "unit (not the chunk)", ins.unit);
      /* microbatch */
      if (op == BRAID_OP_BATCH_SYNC || op == BRAID_OP_REDUCE_GRADS || op == BRAID_OP_OPTIMIZER_STEP) {
        if (ins.microbatch != -1) violation(f, s, i, "microbatch", ins.microbatch);
      } else if (sync_only && ins.microbatch >= BRAID_ENCODER_MESSAGE_BASE) {
        const int32_t e = (ins.microbatch - BRAID_ENCODER_MESSAGE_BASE) >> 16;
        const int32_t j = (ins.microbatch - BRAID_ENCODER_MESSAGE_BASE) & 0xffff;
        const braid_module_info* enc = e < f->encoders ? &f->module[f->encoder_module[e]] : NULL;
        ++seen.encoder_messages;
        if (!enc || j >= per_step(f, enc->dp, enc->microbatch_size))
          violation(f, s, i, "encoder message microbatch", ins.microbatch);
      } else if (ins.microbatch < 0 || ins.microbatch >= M) {
        violation(f, s, i, "microbatch", ins.microbatch);
      } else if (sync_only) {
        ++seen.llm_handovers;
      }
      if (p2p && interleaved && stages > 2 &&
          ((s == 0 && (size_t)ins.peer == stages - 1) || (s == stages - 1 && ins.peer == 0)))
        ++seen.wrap_arounds;
    }
    /* prev and next hold exactly the stages messages go to and come from. */
    for (size_t k = 0; k < info.prev_count; ++k)
      if (info.prev[k] < 0 || (size_t)info.prev[k] >= stages || !used_prev[info.prev[k]])
        violation(f, s, k, "prev entry without messages", info.prev[k]);
    for (size_t k = 0; k < info.next_count; ++k)
      if (info.next[k] < 0 || (size_t)info.next[k] >= stages || !used_next[info.next[k]])
        violation(f, s, k, "next entry without messages", info.next[k]);
  }
}

static const char* const kSchedules[] = {"1f1b",          "interleaved",   "gpipe",        "batch-sync",
                                         "distmm-pipe",   "two-phase",     "optimus-fine", "optimus-coarse",
                                         "encoder-first", "optimus-online"};
static const char* const kStrategyNames[] = {"auto", "megatron", "distmm", "disttrain", "optimus"};

static int facts_of(const braid_config* config, const braid_plan* plan, Facts* f) {
  braid_run_settings settings = BRAID_RUN_SETTINGS_INIT;
  if (api.config_run_settings(config, &settings) != BRAID_OK) return 0;
  f->global_batch = settings.global_batch;
  f->groups = settings.contrastive_batch ? settings.global_batch / settings.contrastive_batch : 1;
  f->virtual_stages = settings.virtual_stages;
  f->encoders = 0;
  f->llm = -1;
  f->reports = 0;
  if (api.plan_module_count(plan, &f->modules) != BRAID_OK || f->modules > kMaxModules) return 0;
  for (size_t m = 0; m < f->modules; ++m) {
    f->module[m] = (braid_module_info)BRAID_MODULE_INFO_INIT;
    if (api.plan_module(plan, m, &f->module[m]) != BRAID_OK) return 0;
    if (strcmp(f->module[m].role, "encoder") == 0) f->encoder_module[f->encoders++] = (int32_t)m;
    if (strcmp(f->module[m].role, "llm") == 0) f->llm = (int32_t)m;
  }
  return 1;
}

/* Every run, strategy and schedule: returns the programs checked. */
static int test_program_values(void) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/configs/runs", source_dir);
  DIR* d = opendir(dir);
  CHECK(d != NULL);
  if (!d) return 0;
  int programs = 0, runs = 0, colocated_programs = 0, interleaved_programs = 0;
  struct dirent* entry;
  while ((entry = readdir(d)) != NULL) {
    const size_t n = strlen(entry->d_name);
    if (n < 6 || strcmp(entry->d_name + n - 5, ".yaml") != 0) continue;
    braid_config* config = load_run(entry->d_name);
    if (!config) continue;
    ++runs;
    for (int k = 0; k < 5; ++k) {
      braid_plan_options options = BRAID_PLAN_OPTIONS_INIT;
      options.strategy = (braid_strategy)k;
      braid_plan* plan = NULL;
      const braid_status planned = api.plan_create(config, &options, &plan);
      /* Strategies that do not apply or fit say so; anything else is a bug. */
      if (planned != BRAID_OK) {
        CHECK(planned == BRAID_ERR_INFEASIBLE || planned == BRAID_ERR_UNSUPPORTED || planned == BRAID_ERR_BAD_CONFIG);
        continue;
      }
      static Facts f;
      char where[512];
      f.where = where;
      CHECK(facts_of(config, plan, &f));
      for (size_t s = 0; s < sizeof kSchedules / sizeof kSchedules[0]; ++s) {
        braid_program* program = NULL;
        const braid_status built = api.program_create(plan, kSchedules[s], &program);
        if (built != BRAID_OK) {
          if (built != BRAID_ERR_UNSUPPORTED)
            fprintf(stderr, "%s %s %s: %s\n", entry->d_name, kStrategyNames[k], kSchedules[s], api.last_error());
          CHECK(built == BRAID_ERR_UNSUPPORTED && program == NULL);
          continue;
        }
        snprintf(where, sizeof where, "%s %s %s", entry->d_name, kStrategyNames[k], kSchedules[s]);
        check_program(program, &f);
        ++programs;
        if (strncmp(kSchedules[s], "optimus", 7) == 0) ++colocated_programs;
        if (s == 1) ++interleaved_programs;
        api.program_destroy(program);
      }
      /* A colocated plan's programs through the bubble scheduler too. */
      braid_bubble_scheduler* scheduler = NULL;
      if (api.bubble_scheduler_create(plan, &scheduler) == BRAID_OK &&
          api.bubble_scheduler_run(scheduler) == BRAID_OK) {
        const char* names[] = {NULL, "optimus-fine", "optimus-coarse", "encoder-first"};
        for (size_t s = 0; s < sizeof names / sizeof names[0]; ++s) {
          braid_program* program = NULL;
          CHECK(api.bubble_scheduler_program(scheduler, names[s], &program) == BRAID_OK);
          if (!program) continue;
          snprintf(where, sizeof where, "%s %s bubble scheduler %s", entry->d_name, kStrategyNames[k],
                   names[s] ? names[s] : "(default)");
          check_program(program, &f);
          ++programs;
          ++colocated_programs;
          api.program_destroy(program);
        }
      }
      api.bubble_scheduler_destroy(scheduler);
      api.plan_destroy(plan);
    }
    api.config_destroy(config);
  }
  closedir(d);
  CHECK(runs >= 10);
  /* The interesting cases were there: colocated (encoder tasks, ordering messages) and interleaved. */
  CHECK(colocated_programs > 0 && interleaved_programs > 0);
  /* (The planner's own colocated plans gain nothing from TP waits once the backwards hide
   * behind the llm's gradient reduction, so their fine programs carry no IN_TP_BUBBLE task;
   * tests/unit/bubble_test.cpp checks those on a shallow encoder.) */
  CHECK(seen.instructions > 0 && seen.encoder_tasks > 0 && seen.dp_wait_tasks > 0 && seen.encoder_messages > 0 &&
        seen.llm_handovers > 0 && seen.batch_syncs > 0 && seen.wrap_arounds > 0);
  printf(
      "checked %ld instructions: %ld encoder tasks (%ld in TP bubbles, %ld in DP waits), %ld encoder-pipeline and %ld "
      "hand-over ordering messages, %ld batch-syncs, %ld interleaved wrap-around messages\n",
      seen.instructions, seen.encoder_tasks, seen.tp_bubble_tasks, seen.dp_wait_tasks, seen.encoder_messages,
      seen.llm_handovers, seen.batch_syncs, seen.wrap_arounds);
  return programs;
}

/* The interleaved pipeline's wrap-around is in prev/next: gpt-175b, megatron. */
static void test_wrap_around(void) {
  braid_config* config = load_run("gpt-175b-1024gpu.yaml");
  if (!config) return;
  braid_plan_options options = BRAID_PLAN_OPTIONS_INIT;
  options.strategy = BRAID_STRATEGY_MEGATRON;
  braid_plan* plan = NULL;
  braid_program* program = NULL;
  CHECK(api.plan_create(config, &options, &plan) == BRAID_OK);
  if (plan) CHECK(api.program_create(plan, NULL, &program) == BRAID_OK);
  const char* schedule = NULL;
  size_t stages = 0;
  if (program && api.program_schedule(program, &schedule) == BRAID_OK && strcmp(schedule, "interleaved") == 0 &&
      api.program_stage_count(program, &stages) == BRAID_OK && stages >= 2) {
    braid_stage_info first = BRAID_STAGE_INFO_INIT, last = BRAID_STAGE_INFO_INIT;
    CHECK(api.program_stage(program, 0, &first) == BRAID_OK);
    CHECK(api.program_stage(program, stages - 1, &last) == BRAID_OK);
    CHECK(in_list(first.prev, first.prev_count, (int32_t)stages - 1) && in_list(first.next, first.next_count, 1));
    CHECK(in_list(last.next, last.next_count, 0) && in_list(last.prev, last.prev_count, (int32_t)stages - 2));
  } else {
    fprintf(stderr, "gpt-175b megatron: no interleaved program (%s)\n", schedule ? schedule : api.last_error());
    CHECK(0);
  }
  api.program_destroy(program);
  api.plan_destroy(plan);
  api.config_destroy(config);
}

/* ---- typed settings and plan options ------------------------------------------------------ */

/* FORWARDs without flags of stage 0: its microbatches. */
static int forwards_of_stage(const braid_program* program, size_t stage) {
  braid_stage_info info = BRAID_STAGE_INFO_INIT;
  if (api.program_stage(program, stage, &info) != BRAID_OK) return -1;
  int forwards = 0;
  for (size_t i = 0; i < info.instruction_count; ++i) {
    braid_instruction ins = BRAID_INSTRUCTION_INIT;
    if (api.program_instruction(program, stage, i, &ins) == BRAID_OK && ins.opcode == BRAID_OP_FORWARD &&
        ins.chunk == 0)
      ++forwards;
  }
  return forwards;
}

static int plan_forwards(const braid_plan* plan, const char* schedule) {
  braid_program* program = NULL;
  if (api.program_create(plan, schedule, &program) != BRAID_OK) return -1;
  const int forwards = forwards_of_stage(program, 0);
  api.program_destroy(program);
  return forwards;
}

/* Sets `settings` and expects an invalid argument whose message has `part`, and the
 * config unchanged. */
static int same_settings(const braid_run_settings* a, const braid_run_settings* b) {
  return a->microbatch_size == b->microbatch_size && a->global_batch == b->global_batch &&
         a->contrastive_batch == b->contrastive_batch && a->precision == b->precision &&
         a->zero_stage == b->zero_stage && a->recompute == b->recompute && a->attention == b->attention &&
         a->sequence_parallel == b->sequence_parallel && a->virtual_stages == b->virtual_stages &&
         strcmp(a->schedule, b->schedule) == 0 && a->overlap_grad_reduce == b->overlap_grad_reduce &&
         a->image_resolution == b->image_resolution && a->text_tokens == b->text_tokens &&
         a->audio_tokens == b->audio_tokens && a->generated_image_resolution == b->generated_image_resolution &&
         a->overlap_param_gather == b->overlap_param_gather && a->tp_comm_overlap == b->tp_comm_overlap &&
         a->fused_kernels == b->fused_kernels && a->fp8 == b->fp8;
}

static void refuse(braid_config* config, const braid_run_settings* settings, const char* part) {
  braid_run_settings before = BRAID_RUN_SETTINGS_INIT, after = BRAID_RUN_SETTINGS_INIT;
  CHECK(api.config_run_settings(config, &before) == BRAID_OK);
  CHECK(api.config_set_run_settings(config, settings) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK_ERROR(part);
  CHECK(api.config_run_settings(config, &after) == BRAID_OK);
  CHECK(same_settings(&before, &after));
}

/* The run file refuses `training` (flow mapping) of LLaVA with a message holding `part`. */
static void refused_by_run_file(const char* training, const char* data, const char* part) {
  char dir[4096], text[1024];
  snprintf(dir, sizeof dir, "%s/configs/runs", source_dir);
  snprintf(text, sizeof text,
           "model: ../models/llava-13b.yaml\ncluster: ../clusters/dgx-a100-80gb.yaml\nnodes: 4\n"
           "training: %s\ndata: %s\n",
           training, data);
  braid_config* config = NULL;
  CHECK(api.config_load_string(text, dir, &config) == BRAID_ERR_BAD_CONFIG && config == NULL);
  CHECK_ERROR(part);
}

static void test_run_settings(void) {
  braid_config* config = load_llava();
  if (!config) return;
  braid_run_settings s = BRAID_RUN_SETTINGS_INIT;
  CHECK(api.config_run_settings(config, &s) == BRAID_OK);
  CHECK(s.struct_size == sizeof s && s.version == BRAID_RUN_SETTINGS_VERSION);
  CHECK(s.global_batch == 32 && s.microbatch_size == 1 && s.contrastive_batch == 0);
  CHECK(s.precision == BRAID_PRECISION_BF16 && s.zero_stage == 1 && s.recompute == BRAID_RECOMPUTE_FULL);
  CHECK(s.attention == BRAID_ATTENTION_FLASH && s.sequence_parallel == 0 && s.overlap_grad_reduce == 0);
  CHECK(s.schedule && strcmp(s.schedule, "1f1b") == 0 && s.virtual_stages == 1);
  CHECK(s.image_resolution == 336 && s.text_tokens == 1472 && s.audio_tokens == 0 && s.generated_image_resolution == 0);
  CHECK(s.overlap_param_gather == 0 && s.tp_comm_overlap == 0 && s.fused_kernels == 1 && s.fp8 == 0);
  /* Read back unchanged: setting what was read changes nothing. */
  CHECK(api.config_set_run_settings(config, &s) == BRAID_OK);

  /* A plan made now keeps these settings after the config changes. */
  braid_plan_options options = BRAID_PLAN_OPTIONS_INIT;
  braid_plan* before = plan_megatron(config, &options);
  CHECK(before != NULL);
  braid_run_settings changed = s;
  changed.microbatch_size = 2;
  changed.zero_stage = 2;
  changed.recompute = BRAID_RECOMPUTE_SELECTIVE;
  changed.precision = BRAID_PRECISION_FP16;
  changed.schedule = "gpipe";
  changed.image_resolution = 224;
  CHECK(api.config_set_run_settings(config, &changed) == BRAID_OK);
  braid_run_settings now = BRAID_RUN_SETTINGS_INIT;
  CHECK(api.config_run_settings(config, &now) == BRAID_OK);
  CHECK(now.microbatch_size == 2 && now.zero_stage == 2 && now.recompute == BRAID_RECOMPUTE_SELECTIVE &&
        now.precision == BRAID_PRECISION_FP16 && strcmp(now.schedule, "gpipe") == 0 && now.image_resolution == 224);
  options = (braid_plan_options)BRAID_PLAN_OPTIONS_INIT;
  braid_plan* after = plan_megatron(config, &options);
  CHECK(after != NULL);
  if (before && after) {
    braid_module_info a = BRAID_MODULE_INFO_INIT, b = BRAID_MODULE_INFO_INIT;
    CHECK(api.plan_module(before, 0, &b) == BRAID_OK && b.microbatch_size == 1);
    CHECK(api.plan_module(after, 0, &a) == BRAID_OK && a.microbatch_size == 2);
    CHECK(plan_forwards(before, NULL) == 32 && plan_forwards(after, NULL) == 16);
    /* The run's schedule is the megatron plan's own. */
    braid_program* program = NULL;
    const char* name = NULL;
    CHECK(api.program_create(after, NULL, &program) == BRAID_OK && api.program_schedule(program, &name) == BRAID_OK &&
          strcmp(name, "gpipe") == 0);
    api.program_destroy(program);
  }
  api.plan_destroy(before);
  api.plan_destroy(after);
  /* NULL schedule: keeps the current one. */
  changed.schedule = NULL;
  CHECK(api.config_set_run_settings(config, &changed) == BRAID_OK);
  CHECK(api.config_run_settings(config, &now) == BRAID_OK && strcmp(now.schedule, "gpipe") == 0);

  /* The Megatron-Core settings (version 2), with the run file's checks. */
  braid_run_settings core = now;
  core.fused_kernels = 0;
  core.zero_stage = 1;
  core.overlap_grad_reduce = 1;
  core.overlap_param_gather = 1;
  CHECK(api.config_set_run_settings(config, &core) == BRAID_OK);
  CHECK(api.config_run_settings(config, &now) == BRAID_OK && now.fused_kernels == 0 && now.overlap_param_gather == 1);
  /* A version-1 caller's struct ends before them: they keep their values. */
  braid_run_settings v1 = now;
  v1.struct_size = offsetof(braid_run_settings, overlap_param_gather);
  v1.version = 1;
  v1.microbatch_size = 1;
  CHECK(api.config_set_run_settings(config, &v1) == BRAID_OK);
  CHECK(api.config_run_settings(config, &now) == BRAID_OK && now.microbatch_size == 1 && now.fused_kernels == 0 &&
        now.overlap_param_gather == 1);
  braid_run_settings bad = now;
  bad.fp8 = 2;
  refuse(config, &bad, "settings->fp8 (training.fp8) is 2; set it to 0 or 1");
  bad = now;
  bad.fp8 = 1;
  refuse(config, &bad, "settings->fp8 (training.fp8): cluster 'dgx-a100-80gb' gives no FP8 peak");
  refused_by_run_file("{global_batch: 32, microbatch: 1, fp8: true}",
                      "{image: {resolution: 336}, text: {tokens: 1472}}",
                      "training.fp8: cluster 'dgx-a100-80gb' gives no FP8 peak");
  bad = now;
  bad.tp_comm_overlap = 1;
  refuse(config, &bad, "settings->tp_comm_overlap (training.tp_comm_overlap): needs sequence_parallel: true");
  bad = now;
  bad.overlap_grad_reduce = 0;
  refuse(config, &bad, "settings->overlap_param_gather (training.overlap_param_gather): needs overlap_grad_reduce");
  core = now;
  core.fused_kernels = 1;
  core.overlap_param_gather = 0;
  core.overlap_grad_reduce = 0;
  CHECK(api.config_set_run_settings(config, &core) == BRAID_OK);
  CHECK(api.config_run_settings(config, &now) == BRAID_OK);

  /* Refused, with the run file's message for the same value, naming the field. */
  bad = now;
  bad.microbatch_size = 0;
  refuse(config, &bad, "settings->microbatch_size (training.microbatch): must be at least 1 (got 0)");
  refused_by_run_file("{global_batch: 32, microbatch: 0}", "{image: {resolution: 336}, text: {tokens: 1472}}",
                      "training.microbatch: must be at least 1 (got 0)");
  bad = now;
  bad.microbatch_size = 3;
  refuse(config, &bad,
         "settings->global_batch (training.global_batch): global batch 32 is not divisible by the microbatch size 3");
  refused_by_run_file("{global_batch: 32, microbatch: 3}", "{image: {resolution: 336}, text: {tokens: 1472}}",
                      "training.global_batch: global batch 32 is not divisible by the microbatch size 3");
  bad = now;
  bad.global_batch = (int64_t)1 << 40;
  refuse(config, &bad, "(training.global_batch): is too large (got 1099511627776, at most 2147483647)");
  bad = now;
  bad.zero_stage = 5;
  refuse(config, &bad, "settings->zero_stage (training.zero_stage): must be 0, 1, 2 or 3 (got 5)");
  refused_by_run_file("{global_batch: 32, microbatch: 1, zero_stage: 5}",
                      "{image: {resolution: 336}, text: {tokens: 1472}}",
                      "training.zero_stage: must be 0, 1, 2 or 3 (got 5)");
  bad = now;
  bad.schedule = "interleaved";
  refuse(config, &bad,
         "settings->schedule (training.schedule): the interleaved schedule needs virtual_stages of at least 2");
  refused_by_run_file("{global_batch: 32, microbatch: 1, schedule: interleaved}",
                      "{image: {resolution: 336}, text: {tokens: 1472}}",
                      "training.schedule: the interleaved schedule needs virtual_stages of at least 2");
  bad = now;
  bad.virtual_stages = 2;
  refuse(config, &bad,
         "settings->virtual_stages (training.virtual_stages): virtual stages need 'schedule: interleaved'");
  bad = now;
  bad.schedule = "gpipee";
  refuse(config, &bad,
         "settings->schedule (training.schedule): 'gpipee' is not one of 1f1b, interleaved or gpipe "
         "(did you mean 'gpipe'?)");
  bad = now;
  bad.schedule = "distmm-pipe"; /* a schedule, but not one a run file takes */
  refuse(config, &bad, "'distmm-pipe' is not one of 1f1b, interleaved or gpipe");
  bad = now;
  bad.contrastive_batch = 16;
  refuse(config, &bad,
         "settings->contrastive_batch (training.contrastive_batch): only applies to models with a "
         "contrastive loss");
  bad = now;
  bad.image_resolution = 337;
  refuse(config, &bad,
         "settings->image_resolution (data.image.resolution): image resolution 337 is not a multiple "
         "of the patch size 14");
  refused_by_run_file("{global_batch: 32, microbatch: 1}", "{image: {resolution: 337}, text: {tokens: 1472}}",
                      "data.image.resolution: image resolution 337 is not a multiple of the patch size 14");
  bad = now;
  bad.text_tokens = 0;
  refuse(config, &bad, "settings->text_tokens (data.text.tokens): must be at least 1 (got 0)");
  bad = now;
  bad.audio_tokens = 5;
  refuse(config, &bad, "settings->audio_tokens (data.audio.tokens): the model takes no audio input");
  bad = now;
  memset(&bad.precision, 0x7f, sizeof bad.precision);
  refuse(config, &bad, "settings->precision is 2139062143; use BRAID_PRECISION_BF16");
  bad = now;
  bad.recompute = (braid_recompute)-1;
  refuse(config, &bad, "settings->recompute is -1");
  bad = now;
  bad.sequence_parallel = 2;
  refuse(config, &bad, "settings->sequence_parallel (training.sequence_parallel) is 2; set it to 0 or 1");
  CHECK(api.config_set_run_settings(NULL, &now) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK(api.config_set_run_settings(config, NULL) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK(api.config_run_settings(config, NULL) == BRAID_ERR_INVALID_ARGUMENT);
  api.config_destroy(config);

  /* A contrastive run: contrastive_batch reads 0 when it is the global batch, and takes a divisor. */
  config = load_run("clip-vit-l14-64gpu.yaml");
  if (!config) return;
  CHECK(api.config_run_settings(config, &s) == BRAID_OK && s.contrastive_batch == 0 && s.global_batch == 28672);
  s.contrastive_batch = s.global_batch / 2;
  CHECK(api.config_set_run_settings(config, &s) == BRAID_OK);
  CHECK(api.config_run_settings(config, &now) == BRAID_OK && now.contrastive_batch == s.global_batch / 2);
  s.contrastive_batch = s.global_batch / 2 + 64;
  refuse(config, &s, "(training.contrastive_batch): contrastive batch 14400 does not divide the global batch 28672");
  api.config_destroy(config);
}

static void test_plan_options(void) {
  braid_config* config = load_llava();
  if (!config) return;
  const char* name = NULL;
  braid_program* program = NULL;

  /* microbatch_size: the plan's modules and its programs' microbatches. */
  braid_plan_options options = BRAID_PLAN_OPTIONS_INIT;
  options.microbatch_size = 2;
  braid_plan* plan = plan_megatron(config, &options);
  CHECK(plan != NULL);
  if (plan) {
    braid_module_info info = BRAID_MODULE_INFO_INIT;
    CHECK(api.plan_module(plan, 0, &info) == BRAID_OK && info.microbatch_size == 2);
    CHECK(plan_forwards(plan, NULL) == 16);
    api.plan_destroy(plan);
  }
  /* The config itself is unchanged. */
  braid_run_settings s = BRAID_RUN_SETTINGS_INIT;
  CHECK(api.config_run_settings(config, &s) == BRAID_OK && s.microbatch_size == 1);

  /* schedule: what braid_program_create builds without a name. */
  options = (braid_plan_options)BRAID_PLAN_OPTIONS_INIT;
  options.schedule = "gpipe";
  plan = plan_megatron(config, &options);
  CHECK(plan != NULL);
  if (plan) {
    CHECK(api.program_create(plan, NULL, &program) == BRAID_OK && api.program_schedule(program, &name) == BRAID_OK &&
          strcmp(name, "gpipe") == 0);
    api.program_destroy(program);
    program = NULL;
    CHECK(api.program_create(plan, "1f1b", &program) == BRAID_OK); /* a name still wins */
    api.program_destroy(program);
    program = NULL;
    api.plan_destroy(plan);
  }
  /* schedule + virtual stages: interleaved, with its chunks and wrap-around. */
  options = (braid_plan_options)BRAID_PLAN_OPTIONS_INIT;
  options.schedule = "interleaved";
  options.virtual_stages = 2;
  plan = plan_megatron(config, &options);
  CHECK(plan != NULL);
  if (plan) {
    CHECK(api.program_create(plan, NULL, &program) == BRAID_OK && api.program_schedule(program, &name) == BRAID_OK &&
          strcmp(name, "interleaved") == 0);
    braid_stage_info first = BRAID_STAGE_INFO_INIT;
    int32_t max_chunk = 0;
    if (program && api.program_stage(program, 0, &first) == BRAID_OK) {
      CHECK(in_list(first.prev, first.prev_count, 3) && in_list(first.next, first.next_count, 1));
      for (size_t i = 0; i < first.instruction_count; ++i) {
        braid_instruction ins = BRAID_INSTRUCTION_INIT;
        CHECK(api.program_instruction(program, 0, i, &ins) == BRAID_OK);
        if (ins.chunk > max_chunk) max_chunk = ins.chunk;
      }
    }
    CHECK(max_chunk == 1);
    CHECK(program && forwards_of_stage(program, 0) == 32);
    api.program_destroy(program);
    program = NULL;
    api.plan_destroy(plan);
  }
  /* Refused as the run file refuses them, naming the option. */
  options = (braid_plan_options)BRAID_PLAN_OPTIONS_INIT;
  options.schedule = "interleaved";
  CHECK(plan_megatron(config, &options) == NULL);
  CHECK_ERROR("braid_plan_create: options->schedule: the interleaved schedule needs virtual_stages of at least 2");
  options = (braid_plan_options)BRAID_PLAN_OPTIONS_INIT;
  options.virtual_stages = 2;
  CHECK(plan_megatron(config, &options) == NULL);
  CHECK_ERROR("options->virtual_stages: virtual stages need 'schedule: interleaved'");
  options = (braid_plan_options)BRAID_PLAN_OPTIONS_INIT;
  options.microbatch_size = 3;
  CHECK(plan_megatron(config, &options) == NULL);
  CHECK_ERROR("options->microbatch_size: global batch 32 is not divisible by the microbatch size 3");
  options = (braid_plan_options)BRAID_PLAN_OPTIONS_INIT;
  options.microbatch_size = -4;
  CHECK(plan_megatron(config, &options) == NULL);
  CHECK_ERROR("options->microbatch_size: must be at least 1 (got -4)");
  /* A known schedule the plan cannot run: unsupported, naming those it runs. */
  options = (braid_plan_options)BRAID_PLAN_OPTIONS_INIT;
  options.schedule = "distmm-pipe";
  braid_plan* unsupported = NULL;
  options.strategy = BRAID_STRATEGY_MEGATRON;
  CHECK(api.plan_create(config, &options, &unsupported) == BRAID_ERR_UNSUPPORTED && unsupported == NULL);
  CHECK_ERROR("runs 1f1b or gpipe, not 'distmm-pipe'");
  api.config_destroy(config);

  /* A program schedule that is no planning input: CLIP distmm runs batch-sync instead of distmm-pipe. */
  config = load_run("clip-vit-l14-64gpu.yaml");
  if (!config) return;
  options = (braid_plan_options)BRAID_PLAN_OPTIONS_INIT;
  options.strategy = BRAID_STRATEGY_DISTMM;
  options.schedule = "batch-sync";
  plan = NULL;
  CHECK(api.plan_create(config, &options, &plan) == BRAID_OK);
  if (plan) {
    CHECK(api.program_create(plan, NULL, &program) == BRAID_OK && api.program_schedule(program, &name) == BRAID_OK &&
          strcmp(name, "batch-sync") == 0);
    api.program_destroy(program);
    api.plan_destroy(plan);
  }
  api.config_destroy(config);
}

int main(int argc, char** argv) {
  void* lib = capi_open(argc, argv, 2, "LIBBRAID_SO SOURCE_DIR");
  source_dir = argv[2];
  RESOLVE(last_error);
  RESOLVE(config_load_file);
  RESOLVE(config_load_string);
  RESOLVE(config_destroy);
  RESOLVE(config_run_settings);
  RESOLVE(config_set_run_settings);
  RESOLVE(plan_create);
  RESOLVE(plan_destroy);
  RESOLVE(plan_strategy);
  RESOLVE(plan_module_count);
  RESOLVE(plan_module);
  RESOLVE(plan_estimate);
  RESOLVE(plan_alternative);
  RESOLVE(program_create);
  RESOLVE(program_destroy);
  RESOLVE(program_schedule);
  RESOLVE(program_stage_count);
  RESOLVE(program_stage);
  RESOLVE(program_instruction);
  RESOLVE(simulate);
  RESOLVE(simulation_destroy);
  RESOLVE(simulation_result_get);
  RESOLVE(simulation_stage);
  RESOLVE(reorder_create);
  RESOLVE(reorder_destroy);
  RESOLVE(reorder_info_get);
  RESOLVE(bubble_scheduler_create);
  RESOLVE(bubble_scheduler_destroy);
  RESOLVE(bubble_scheduler_run);
  RESOLVE(bubble_scheduler_report);
  RESOLVE(bubble_scheduler_program);

  /* Nothing failed yet on this thread. */
  CHECK(strcmp(api.last_error(), "") == 0);
  test_struct_sizes();
  test_load_file_errors();
  test_last_error();
  test_schedule_names();
  const int programs = test_program_values();
  test_wrap_around();
  test_run_settings();
  test_plan_options();
  char detail[64];
  snprintf(detail, sizeof detail, " (%d programs of the bundled runs checked)", programs);
  return capi_finish(lib, "C ABI hardening", detail);
}
