/* The C ABI from C: dlopen libbraid.so, resolve every entry point, plan the CLIP run,
 * check the result, build and simulate pipeline programs (LLaVA 1F1B, CLIP DistMM-Pipe),
 * reorder a LLaVA batch for its disttrain plan (ranks with equal counts, whole
 * microbatches, deterministic), bubble-schedule the MLLM-72B optimus plan (a report
 * that adds up, programs whose ENCODER_TASKs are the report's), and misuse the API
 * (NULLs, wrong struct sizes, bad YAML, indices out of range, batches that do not
 * split, plans that are not colocated): each misuse returns a status and a message,
 * never a crash.
 * Compiled as C99 with -Wall -Wextra -Wpedantic -Werror.
 * usage: test_capi LIBBRAID_SO SOURCE_DIR */
#include <math.h>
#include <stddef.h>
#include <unistd.h>

#include "capi_test.h"

/* Every entry point, resolved by name. */
static struct {
  uint32_t (*abi_version)(void);
  const char* (*version_string)(void);
  const char* (*status_string)(braid_status);
  const char* (*last_error)(void);
  braid_status (*config_load_file)(const char*, braid_config**);
  braid_status (*config_load_string)(const char*, const char*, braid_config**);
  braid_status (*config_destroy)(braid_config*);
  braid_status (*config_devices)(const braid_config*, int32_t*);
  braid_status (*plan_create)(const braid_config*, const braid_plan_options*, braid_plan**);
  braid_status (*plan_destroy)(braid_plan*);
  braid_status (*plan_strategy)(const braid_plan*, braid_strategy*);
  braid_status (*plan_module_count)(const braid_plan*, size_t*);
  braid_status (*plan_module)(const braid_plan*, size_t, braid_module_info*);
  braid_status (*plan_estimate)(const braid_plan*, braid_estimate*);
  braid_status (*plan_to_json)(const braid_plan*, const char**);
  braid_status (*plan_to_yaml)(const braid_plan*, const char**);
  braid_status (*plan_alternative_count)(const braid_plan*, size_t*);
  braid_status (*plan_alternative)(const braid_plan*, size_t, braid_alternative*);
  braid_status (*program_create)(const braid_plan*, const char*, braid_program**);
  braid_status (*program_destroy)(braid_program*);
  braid_status (*program_schedule)(const braid_program*, const char**);
  braid_status (*program_stage_count)(const braid_program*, size_t*);
  braid_status (*program_stage)(const braid_program*, size_t, braid_stage_info*);
  braid_status (*program_instruction)(const braid_program*, size_t, size_t, braid_instruction*);
  braid_status (*simulate)(const braid_program*, const braid_simulation_options*, braid_simulation**);
  braid_status (*simulation_destroy)(braid_simulation*);
  braid_status (*simulation_result_get)(const braid_simulation*, braid_simulation_result*);
  braid_status (*simulation_stage)(const braid_simulation*, size_t, braid_stage_result*);
  braid_status (*simulation_write_trace)(const braid_simulation*, const char*);
  braid_status (*simulation_gantt)(const braid_simulation*, int32_t, const char**);
  braid_status (*reorder_create)(const braid_plan*, const braid_sample_batch*, const braid_reorder_options*,
                                 braid_reorder**);
  braid_status (*reorder_destroy)(braid_reorder*);
  braid_status (*reorder_info_get)(const braid_reorder*, braid_reorder_info*);
  braid_status (*reorder_ranks)(const braid_reorder*, size_t, int32_t*, size_t);
  braid_status (*reorder_cells)(const braid_reorder*, int32_t*, size_t);
  braid_status (*reorder_microbatches)(const braid_reorder*, int32_t*, size_t);
  braid_status (*reorder_order)(const braid_reorder*, size_t, int32_t*, size_t);
  braid_status (*bubble_scheduler_create)(const braid_plan*, braid_bubble_scheduler**);
  braid_status (*bubble_scheduler_destroy)(braid_bubble_scheduler*);
  braid_status (*bubble_scheduler_run)(braid_bubble_scheduler*);
  braid_status (*bubble_scheduler_report)(const braid_bubble_scheduler*, braid_bubble_report*);
  braid_status (*bubble_scheduler_program)(const braid_bubble_scheduler*, const char*, braid_program**);
} api;

static void test_versions(void) {
  CHECK(api.abi_version() == BRAID_ABI_VERSION);
  CHECK(strcmp(api.version_string(), "0.1.0") == 0);
  CHECK(strcmp(api.status_string(BRAID_ERR_INFEASIBLE), "infeasible") == 0);
  CHECK(strcmp(api.status_string((braid_status)99), "unknown status") == 0);
  CHECK(strcmp(api.last_error(), "") == 0);
}

static braid_instruction instruction_at(const braid_program* program, size_t stage, size_t index) {
  braid_instruction ins = BRAID_INSTRUCTION_INIT;
  CHECK(api.program_instruction(program, stage, index, &ins) == BRAID_OK);
  return ins;
}

/* The DistMM-Pipe program of the CLIP distmm plan: every last stage of a branch runs
 * one BATCH_SYNC per contrastive group, before its first backward. */
static void check_distmm_pipe(const braid_plan* plan) {
  braid_program* program = NULL;
  CHECK(api.program_create(plan, "distmm-pipe", &program) == BRAID_OK);
  if (!program) {
    fprintf(stderr, "program_create(distmm-pipe): %s\n", api.last_error());
    return;
  }
  const char* schedule = NULL;
  CHECK(api.program_schedule(program, &schedule) == BRAID_OK && schedule && strcmp(schedule, "distmm-pipe") == 0);
  size_t stages = 0;
  CHECK(api.program_stage_count(program, &stages) == BRAID_OK && stages >= 2);
  size_t last_stages = 0;
  for (size_t s = 0; s < stages; ++s) {
    braid_stage_info info = BRAID_STAGE_INFO_INIT;
    CHECK(api.program_stage(program, s, &info) == BRAID_OK);
    CHECK(info.name != NULL && info.module >= 0 && info.replicas >= 1 && info.devices_per_replica >= 1);
    if (info.next_count != 0) continue;
    ++last_stages;
    enum { kMaxGroups = 64 };
    int syncs_per_group[kMaxGroups] = {0};
    int32_t groups = 0;
    long first_sync = -1, first_backward = -1;
    for (size_t i = 0; i < info.instruction_count; ++i) {
      braid_instruction ins = instruction_at(program, s, i);
      if (ins.opcode == BRAID_OP_BATCH_SYNC) {
        CHECK(ins.group >= 0 && ins.group < kMaxGroups);
        if (ins.group >= 0 && ins.group < kMaxGroups) {
          ++syncs_per_group[ins.group];
          if (ins.group + 1 > groups) groups = ins.group + 1;
        }
        if (first_sync < 0) first_sync = (long)i;
      } else {
        CHECK(ins.group == -1);
      }
      if (ins.opcode == BRAID_OP_BACKWARD && first_backward < 0) first_backward = (long)i;
    }
    CHECK(groups >= 1);
    for (int32_t g = 0; g < groups; ++g) CHECK(syncs_per_group[g] == 1);
    CHECK(first_sync >= 0 && first_backward >= 0 && first_sync < first_backward);
  }
  CHECK(last_stages == 2); /* the image and the text encoder */

  braid_simulation_options options = BRAID_SIMULATION_OPTIONS_INIT;
  braid_simulation* sim = NULL;
  CHECK(api.simulate(program, &options, &sim) == BRAID_OK);
  if (sim) {
    braid_simulation_result result = BRAID_SIMULATION_RESULT_INIT;
    CHECK(api.simulation_result_get(sim, &result) == BRAID_OK);
    CHECK(result.step_time_s > 0 && result.bubbles_s[BRAID_BUBBLE_BATCH_SYNC] > 0);
    CHECK(result.bubble_fraction >= 0 && result.bubble_fraction < 1);
    api.simulation_destroy(sim);
  }
  api.program_destroy(program);
}

static void test_plan_clip(const char* source_dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s/configs/runs/clip-vit-l14-64gpu.yaml", source_dir);
  braid_config* config = NULL;
  CHECK(api.config_load_file(path, &config) == BRAID_OK);
  if (!config) return;
  int32_t devices = 0;
  CHECK(api.config_devices(config, &devices) == BRAID_OK && devices == 64);

  braid_plan_options options = BRAID_PLAN_OPTIONS_INIT;
  options.strategy = BRAID_STRATEGY_DISTMM;
  braid_plan* plan = NULL;
  CHECK(api.plan_create(config, &options, &plan) == BRAID_OK);
  if (!plan) {
    fprintf(stderr, "plan_create: %s\n", api.last_error());
    api.config_destroy(config);
    return;
  }
  braid_strategy strategy = BRAID_STRATEGY_AUTO;
  CHECK(api.plan_strategy(plan, &strategy) == BRAID_OK && strategy == BRAID_STRATEGY_DISTMM);
  size_t count = 0;
  CHECK(api.plan_module_count(plan, &count) == BRAID_OK && count == 2);
  int32_t used = 0, image_devices = 0, text_devices = 0, text_tp = 0;
  for (size_t i = 0; i < count; ++i) {
    braid_module_info info = BRAID_MODULE_INFO_INIT;
    CHECK(api.plan_module(plan, i, &info) == BRAID_OK);
    CHECK(strcmp(info.role, "encoder") == 0);
    CHECK(info.devices == info.tp * info.pp * info.dp);
    CHECK(info.stage_count == info.pp && info.layers_per_stage != NULL);
    used += info.devices;
    if (strcmp(info.name, "image_encoder") == 0) image_devices = info.devices;
    if (strcmp(info.name, "text_encoder") == 0) {
      text_devices = info.devices;
      text_tp = info.tp;
    }
  }
  CHECK(used <= 64 && text_tp == 1 && text_devices < image_devices);

  braid_estimate estimate = BRAID_ESTIMATE_INIT;
  CHECK(api.plan_estimate(plan, &estimate) == BRAID_OK);
  CHECK(estimate.iteration_time_s > 0 && estimate.mfu > 0 && estimate.mfu < 1);
  CHECK(estimate.peak_memory_gib > 0 && estimate.peak_memory_gib <= 80);
  CHECK(estimate.devices == used);

  const char* json = NULL;
  const char* yaml = NULL;
  CHECK(api.plan_to_json(plan, &json) == BRAID_OK && contains(json, "\"strategy\": \"distmm\""));
  CHECK(api.plan_to_yaml(plan, &yaml) == BRAID_OK && contains(yaml, "layout: branches"));

  /* The YAML evaluates back to the same plan. */
  braid_plan_options fixed = BRAID_PLAN_OPTIONS_INIT;
  fixed.strategy = BRAID_STRATEGY_FIXED;
  fixed.plan_yaml = yaml;
  braid_plan* again = NULL;
  CHECK(api.plan_create(config, &fixed, &again) == BRAID_OK);
  if (again) {
    braid_estimate e2 = BRAID_ESTIMATE_INIT;
    CHECK(api.plan_estimate(again, &e2) == BRAID_OK && e2.iteration_time_s == estimate.iteration_time_s);
    api.plan_destroy(again);
  }

  /* auto ranks all four strategies. */
  braid_plan* best = NULL;
  CHECK(api.plan_create(config, NULL, &best) == BRAID_OK);
  if (best) {
    size_t n = 0;
    CHECK(api.plan_alternative_count(best, &n) == BRAID_OK && n == 4);
    braid_alternative first = BRAID_ALTERNATIVE_INIT;
    CHECK(api.plan_alternative(best, 0, &first) == BRAID_OK && first.feasible == 1 &&
          strcmp(first.reason, "fastest") == 0);
    braid_alternative last = BRAID_ALTERNATIVE_INIT;
    CHECK(api.plan_alternative(best, n - 1, &last) == BRAID_OK && last.feasible == 0 &&
          contains(last.reason, "not applicable"));
    CHECK(api.plan_alternative(best, n, &last) == BRAID_ERR_INVALID_ARGUMENT &&
          contains(api.last_error(), "out of range"));
    api.plan_destroy(best);
  }
  check_distmm_pipe(plan);
  api.plan_destroy(plan);
  api.config_destroy(config);
}

static void test_misuse(const char* source_dir) {
  braid_config* config = NULL;
  braid_plan* plan = NULL;
  /* NULL handles and out-pointers. */
  CHECK(api.config_load_file(NULL, &config) == BRAID_ERR_INVALID_ARGUMENT && config == NULL);
  CHECK(contains(api.last_error(), "path is NULL"));
  CHECK(api.config_load_file("x.yaml", NULL) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK(api.plan_create(NULL, NULL, &plan) == BRAID_ERR_INVALID_ARGUMENT && plan == NULL);
  CHECK(api.plan_module_count(NULL, NULL) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK(api.plan_estimate(NULL, NULL) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK(api.config_destroy(NULL) == BRAID_OK);
  CHECK(api.plan_destroy(NULL) == BRAID_OK);

  /* Missing file: an I/O error naming the path. */
  CHECK(api.config_load_file("/nonexistent/run.yaml", &config) == BRAID_ERR_IO);
  CHECK(contains(api.last_error(), "/nonexistent/run.yaml"));

  /* Bad YAML: a bad-config error with line, column and field. */
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/configs/runs", source_dir);
  CHECK(api.config_load_string("model: ../models/clip-vit-l14.yaml\ncluster: [", dir, &config) == BRAID_ERR_BAD_CONFIG);
  CHECK(contains(api.last_error(), "invalid YAML"));
  const char* typo =
      "model: ../models/clip-vit-l14.yaml\n"
      "cluster: ../clusters/dgx-a100-80gb.yaml\n"
      "nodes: 2\n"
      "training: {global_batch: 1024, microbach: 32}\n"
      "data: {image: {resolution: 224}, text: {tokens: 77}}\n";
  CHECK(api.config_load_string(typo, dir, &config) == BRAID_ERR_BAD_CONFIG && config == NULL);
  CHECK(contains(api.last_error(), "<string>:4:32: training.microbach: unknown field"));
  CHECK(contains(api.last_error(), "did you mean 'microbatch'?"));

  /* A valid config for the struct checks. */
  const char* good =
      "model: ../models/clip-vit-l14.yaml\n"
      "cluster: ../clusters/dgx-a100-80gb.yaml\n"
      "nodes: 2\n"
      "training: {global_batch: 1024, microbatch: 32}\n"
      "data: {image: {resolution: 224}, text: {tokens: 77}}\n";
  CHECK(api.config_load_string(good, dir, &config) == BRAID_OK);
  if (!config) return;
  braid_plan_options options = BRAID_PLAN_OPTIONS_INIT;
  options.struct_size = 4; /* a caller that did not use the init macro */
  CHECK(api.plan_create(config, &options, &plan) == BRAID_ERR_INVALID_ARGUMENT && plan == NULL);
  CHECK(contains(api.last_error(), "BRAID_PLAN_OPTIONS_INIT"));
  options = (braid_plan_options)BRAID_PLAN_OPTIONS_INIT;
  options.strategy = (braid_strategy)42;
  CHECK(api.plan_create(config, &options, &plan) == BRAID_ERR_INVALID_ARGUMENT);
  options = (braid_plan_options)BRAID_PLAN_OPTIONS_INIT;
  options.strategy = BRAID_STRATEGY_FIXED; /* without plan_yaml */
  CHECK(api.plan_create(config, &options, &plan) == BRAID_ERR_INVALID_ARGUMENT);
  options.plan_yaml = "layout: monolithic\nmodules: [{name: nope, tp: 1, pp: 1, dp: 1}]\n";
  CHECK(api.plan_create(config, &options, &plan) == BRAID_ERR_BAD_CONFIG);
  CHECK(contains(api.last_error(), "<plan_yaml>:2:18: modules[0].name: the model has no module 'nope'"));
  options = (braid_plan_options)BRAID_PLAN_OPTIONS_INIT;
  options.strategy = BRAID_STRATEGY_DISTTRAIN; /* CLIP has no llm */
  CHECK(api.plan_create(config, &options, &plan) == BRAID_ERR_UNSUPPORTED);

  CHECK(api.plan_create(config, NULL, &plan) == BRAID_OK);
  if (plan) {
    /* Output structs: too small is refused; larger (a newer caller) is filled and zero-padded. */
    braid_estimate small = BRAID_ESTIMATE_INIT;
    small.struct_size = sizeof(size_t);
    CHECK(api.plan_estimate(plan, &small) == BRAID_ERR_INVALID_ARGUMENT && contains(api.last_error(), "struct_size"));
    struct {
      braid_estimate v1;
      double future_field;
    } bigger;
    memset(&bigger, 0xff, sizeof bigger);
    bigger.v1.struct_size = sizeof bigger;
    CHECK(api.plan_estimate(plan, &bigger.v1) == BRAID_OK);
    CHECK(bigger.v1.struct_size == sizeof bigger && bigger.v1.iteration_time_s > 0 && bigger.future_field == 0.0);
    braid_module_info info = BRAID_MODULE_INFO_INIT;
    CHECK(api.plan_module(plan, 99, &info) == BRAID_ERR_INVALID_ARGUMENT);
    CHECK(strcmp(api.last_error(), "") != 0);
    /* A successful call leaves the last failure's message as it is. */
    size_t count = 0;
    CHECK(api.plan_module_count(plan, &count) == BRAID_OK && contains(api.last_error(), "out of range"));
    api.plan_destroy(plan);
  }
  api.config_destroy(config);
}

static braid_config* load_llava(const char* source_dir) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/configs/runs", source_dir);
  const char* text =
      "model: ../models/llava-13b.yaml\n"
      "cluster: ../clusters/dgx-a100-80gb.yaml\n"
      "nodes: 4\n"
      "training: {global_batch: 32, microbatch: 1, zero_stage: 1, recompute: full}\n"
      "data: {image: {resolution: 336}, text: {tokens: 1472}}\n";
  braid_config* config = NULL;
  CHECK(api.config_load_string(text, dir, &config) == BRAID_OK);
  if (!config) fprintf(stderr, "config_load_string(llava): %s\n", api.last_error());
  return config;
}

static braid_plan* plan_llava_megatron(const braid_config* config) {
  braid_plan_options options = BRAID_PLAN_OPTIONS_INIT;
  options.strategy = BRAID_STRATEGY_MEGATRON;
  options.tp = 8;
  options.pp = 4;
  braid_plan* plan = NULL;
  CHECK(api.plan_create(config, &options, &plan) == BRAID_OK);
  if (!plan) fprintf(stderr, "plan_create(llava megatron tp8 pp4): %s\n", api.last_error());
  return plan;
}

static int read_file(const char* path, char* buf, size_t size) {
  FILE* f = fopen(path, "rb");
  if (!f) return 0;
  size_t n = fread(buf, 1, size - 1, f);
  buf[n] = '\0';
  fclose(f);
  return n > 0;
}

/* The 1F1B program of LLaVA-13B on 32 devices, megatron tp=8 pp=4 (dp=1): 32
 * microbatches per step; stage s warms up with p-s-1 forwards, then alternates. */
static void test_program_llava(const char* source_dir) {
  braid_config* config = load_llava(source_dir);
  if (!config) return;
  braid_plan* plan = plan_llava_megatron(config);
  if (!plan) {
    api.config_destroy(config);
    return;
  }
  braid_program* program = NULL;
  CHECK(api.program_create(plan, NULL, &program) == BRAID_OK);
  if (!program) fprintf(stderr, "program_create: %s\n", api.last_error());
  braid_program* named = NULL; /* "" is the default too; "1f1b" by name gives the same */
  CHECK(api.program_create(plan, "", &named) == BRAID_OK);
  api.program_destroy(named);
  named = NULL;
  CHECK(api.program_create(plan, "1f1b", &named) == BRAID_OK);
  api.program_destroy(named);
  /* The program is self-contained: it outlives its plan and config. */
  api.plan_destroy(plan);
  api.config_destroy(config);
  if (!program) return;

  const char* schedule = NULL;
  CHECK(api.program_schedule(program, &schedule) == BRAID_OK && schedule && strcmp(schedule, "1f1b") == 0);
  size_t stages = 0;
  CHECK(api.program_stage_count(program, &stages) == BRAID_OK && stages == 4);
  if (stages != 4) {
    api.program_destroy(program);
    return;
  }
  for (size_t s = 0; s < stages; ++s) {
    braid_stage_info info = BRAID_STAGE_INFO_INIT;
    CHECK(api.program_stage(program, s, &info) == BRAID_OK);
    CHECK(info.struct_size == sizeof info && info.name != NULL);
    CHECK(info.depth == (int32_t)s);
    CHECK(info.replicas == 1 && info.devices_per_replica == 8);
    CHECK(info.first_device >= 0 && info.first_device + info.devices_per_replica <= 32);
    CHECK(info.instruction_count > 0);
    if (s == 0) {
      CHECK(info.prev_count == 0 && info.prev == NULL);
      CHECK(info.next_count == 1 && info.next != NULL && info.next[0] == 1);
    } else {
      CHECK(info.prev_count == 1 && info.prev != NULL && info.prev[0] == (int32_t)s - 1);
    }
    if (s == 3) {
      CHECK(info.next_count == 0 && info.next == NULL);
      CHECK(contains(info.name, "stage 3"));
    }
    int forwards = 0, backwards = 0, forwards_before_backward = 0;
    int32_t next_forward = 0, next_backward = 0;
    int compute_seen = 0;
    braid_opcode first_compute = BRAID_OP_LOAD_MICROBATCH, second_compute = BRAID_OP_LOAD_MICROBATCH;
    int32_t first_mb = -1, second_mb = -1;
    for (size_t i = 0; i < info.instruction_count; ++i) {
      braid_instruction ins = instruction_at(program, s, i);
      CHECK(ins.struct_size == sizeof ins);
      CHECK(ins.group == -1 && ins.chunk == 0);
      switch (ins.opcode) {
        case BRAID_OP_FORWARD:
          CHECK(ins.microbatch == next_forward); /* microbatches in order */
          ++next_forward;
          ++forwards;
          if (backwards == 0) ++forwards_before_backward;
          break;
        case BRAID_OP_BACKWARD:
          CHECK(ins.microbatch == next_backward);
          ++next_backward;
          ++backwards;
          CHECK(ins.microbatch < next_forward); /* after its forward */
          break;
        case BRAID_OP_SEND_ACTIVATION:
          CHECK(ins.peer == (int32_t)s + 1);
          break;
        case BRAID_OP_RECV_ACTIVATION:
        case BRAID_OP_SEND_GRAD:
          CHECK(ins.peer == (int32_t)s - 1);
          break;
        case BRAID_OP_RECV_GRAD:
          CHECK(ins.peer == (int32_t)s + 1);
          break;
        case BRAID_OP_LOAD_MICROBATCH:
          CHECK(s == 0);
          break;
        default:
          CHECK(ins.microbatch == -1 || ins.opcode == BRAID_OP_ENCODER_TASK);
          break;
      }
      if (ins.opcode == BRAID_OP_FORWARD || ins.opcode == BRAID_OP_BACKWARD) {
        if (compute_seen == 0) {
          first_compute = ins.opcode;
          first_mb = ins.microbatch;
        } else if (compute_seen == 1) {
          second_compute = ins.opcode;
          second_mb = ins.microbatch;
        }
        ++compute_seen;
      }
    }
    CHECK(forwards == 32 && backwards == 32);
    /* p-s-1 warm-up forwards, then the steady state's forward before the first backward. */
    CHECK(forwards_before_backward == (int)(stages - s - 1) + 1);
    if (s == 0) CHECK(forwards_before_backward - 1 == 3);
    if (s == 3) {
      /* No warm-up: forward 0, (its sends and receives), backward 0. */
      CHECK(first_compute == BRAID_OP_FORWARD && first_mb == 0);
      CHECK(second_compute == BRAID_OP_BACKWARD && second_mb == 0);
    }
  }

  /* Simulate with a trace. */
  braid_simulation_options options = BRAID_SIMULATION_OPTIONS_INIT;
  options.record_trace = 1;
  options.trace_replicas = 1;
  braid_simulation* sim = NULL;
  CHECK(api.simulate(program, &options, &sim) == BRAID_OK);
  if (!sim) {
    fprintf(stderr, "simulate: %s\n", api.last_error());
    api.program_destroy(program);
    return;
  }
  braid_simulation_result result = BRAID_SIMULATION_RESULT_INIT;
  CHECK(api.simulation_result_get(sim, &result) == BRAID_OK);
  CHECK(result.step_time_s > 0);
  CHECK(result.bubble_fraction >= 0 && result.bubble_fraction < 1);
  CHECK(result.bubbles_s[BRAID_BUBBLE_PP_WARMUP] > 0);
  for (int c = 0; c < BRAID_BUBBLE_COUNT; ++c) CHECK(result.bubbles_s[c] >= 0);
  CHECK(result.bubbles_s[BRAID_BUBBLE_BATCH_SYNC] == 0); /* not contrastive */
  CHECK(result.devices == 32 && result.ranks == 4 && result.events > 0);
  CHECK(result.peak_memory_gib > 0 && result.mfu > 0 && result.mfu < 1);
  for (size_t s = 0; s < stages; ++s) {
    braid_stage_result stage = BRAID_STAGE_RESULT_INIT;
    CHECK(api.simulation_stage(sim, s, &stage) == BRAID_OK);
    CHECK(stage.busy_s > 0 && stage.idle_s >= 0 && stage.peak_memory_gib > 0);
    CHECK(stage.finish_s > 0 && stage.finish_s <= result.step_time_s * (1 + 1e-9));
  }
  braid_stage_result stage = BRAID_STAGE_RESULT_INIT;
  CHECK(api.simulation_stage(sim, stages, &stage) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK(contains(api.last_error(), "index 4 is out of range (the program has 4 stages)"));

  /* A newer caller's larger result struct is filled and zero-padded. */
  struct {
    braid_simulation_result v1;
    double future_field;
  } bigger;
  memset(&bigger, 0xff, sizeof bigger);
  bigger.v1.struct_size = sizeof bigger;
  CHECK(api.simulation_result_get(sim, &bigger.v1) == BRAID_OK);
  CHECK(bigger.v1.struct_size == sizeof bigger && bigger.v1.step_time_s == result.step_time_s &&
        bigger.future_field == 0.0);

  char path[256];
  snprintf(path, sizeof path, "/tmp/braid-capi-trace-%ld.json", (long)getpid());
  CHECK(api.simulation_write_trace(sim, path) == BRAID_OK);
  static char buf[1 << 16];
  CHECK(read_file(path, buf, sizeof buf));
  CHECK(buf[0] == '{' && contains(buf, "traceEvents"));
  remove(path);
  CHECK(api.simulation_write_trace(sim, "/nonexistent-braid-dir/trace.json") == BRAID_ERR_IO);
  CHECK(strcmp(api.last_error(), "") != 0);

  const char* gantt = NULL;
  CHECK(api.simulation_gantt(sim, 0, &gantt) == BRAID_OK && contains(gantt, "stage 3"));
  const char* narrow = NULL;
  CHECK(api.simulation_gantt(sim, 40, &narrow) == BRAID_OK && contains(narrow, "stage 0"));
  /* Each rendering lives as long as the simulation: the first is still readable. */
  CHECK(contains(gantt, "stage 3") && contains(narrow, "stage 0"));
  CHECK(api.simulation_gantt(sim, -1, &narrow) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK(api.simulation_gantt(sim, 0, NULL) == BRAID_ERR_INVALID_ARGUMENT);

  /* NULL options: the defaults (no trace). */
  braid_simulation* plain = NULL;
  CHECK(api.simulate(program, NULL, &plain) == BRAID_OK);
  if (plain) {
    braid_simulation_result again = BRAID_SIMULATION_RESULT_INIT;
    CHECK(api.simulation_result_get(plain, &again) == BRAID_OK && again.step_time_s == result.step_time_s);
    CHECK(api.simulation_gantt(plain, 0, &gantt) == BRAID_ERR_INVALID_ARGUMENT);
    api.simulation_destroy(plain);
  }
  api.simulation_destroy(sim);
  api.program_destroy(program);
}

static void test_program_misuse(const char* source_dir) {
  braid_program* program = NULL;
  braid_simulation* sim = NULL;
  size_t count = 0;
  const char* text = NULL;
  braid_stage_info info = BRAID_STAGE_INFO_INIT;
  braid_instruction ins = BRAID_INSTRUCTION_INIT;
  braid_simulation_result result = BRAID_SIMULATION_RESULT_INIT;
  braid_stage_result stage = BRAID_STAGE_RESULT_INIT;
  braid_simulation_options options = BRAID_SIMULATION_OPTIONS_INIT;

  /* NULL handles and pointers. */
  CHECK(api.program_create(NULL, NULL, &program) == BRAID_ERR_INVALID_ARGUMENT && program == NULL);
  CHECK(contains(api.last_error(), "plan is NULL"));
  CHECK(api.program_schedule(NULL, &text) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK(api.program_stage_count(NULL, &count) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK(api.program_stage(NULL, 0, &info) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK(api.program_instruction(NULL, 0, 0, &ins) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK(api.simulate(NULL, &options, &sim) == BRAID_ERR_INVALID_ARGUMENT && sim == NULL);
  CHECK(contains(api.last_error(), "program is NULL"));
  CHECK(api.simulation_result_get(NULL, &result) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK(api.simulation_stage(NULL, 0, &stage) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK(api.simulation_write_trace(NULL, "/tmp/x.json") == BRAID_ERR_INVALID_ARGUMENT);
  CHECK(api.simulation_gantt(NULL, 0, &text) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK(api.program_destroy(NULL) == BRAID_OK);
  CHECK(api.simulation_destroy(NULL) == BRAID_OK);

  braid_config* config = load_llava(source_dir);
  if (!config) return;
  braid_plan* plan = plan_llava_megatron(config);
  if (!plan) {
    api.config_destroy(config);
    return;
  }
  CHECK(api.program_create(plan, NULL, NULL) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK(contains(api.last_error(), "out is NULL"));
  /* A name that is no schedule: an invalid argument, naming braid's schedules. */
  CHECK(api.program_create(plan, "zigzag", &program) == BRAID_ERR_INVALID_ARGUMENT && program == NULL);
  CHECK(contains(api.last_error(), "zigzag") && contains(api.last_error(), "1f1b") &&
        contains(api.last_error(), "gpipe"));
  /* A schedule the layout cannot run: unsupported, naming the ones it can. */
  CHECK(api.program_create(plan, "distmm-pipe", &program) == BRAID_ERR_UNSUPPORTED && program == NULL);
  CHECK(contains(api.last_error(), "distmm-pipe") && contains(api.last_error(), "runs 1f1b or gpipe"));
  CHECK(api.program_create(plan, NULL, &program) == BRAID_OK);
  api.plan_destroy(plan);
  api.config_destroy(config);
  if (!program) return;

  CHECK(api.program_schedule(program, NULL) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK(api.program_stage_count(program, NULL) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK(api.program_stage_count(program, &count) == BRAID_OK && count == 4);
  /* Indices out of range. */
  CHECK(api.program_stage(program, 12, &info) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK(contains(api.last_error(), "index 12 is out of range (the program has 4 stages)"));
  CHECK(api.program_stage(program, (size_t)-1, &info) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK(api.program_stage(program, 0, NULL) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK(api.program_stage(program, 0, &info) == BRAID_OK && info.instruction_count > 0);
  CHECK(api.program_instruction(program, 0, info.instruction_count, &ins) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK(contains(api.last_error(), "is out of range (stage 0 has"));
  CHECK(api.program_instruction(program, 4, 0, &ins) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK(contains(api.last_error(), "index 4 is out of range (the program has 4 stages)"));
  CHECK(api.program_instruction(program, 0, 0, NULL) == BRAID_ERR_INVALID_ARGUMENT);
  /* Struct sizes: too small is refused; larger is filled and zero-padded. */
  info = (braid_stage_info)BRAID_STAGE_INFO_INIT;
  info.struct_size = sizeof(size_t);
  CHECK(api.program_stage(program, 0, &info) == BRAID_ERR_INVALID_ARGUMENT &&
        contains(api.last_error(), "struct_size"));
  ins = (braid_instruction)BRAID_INSTRUCTION_INIT;
  ins.struct_size = 0;
  CHECK(api.program_instruction(program, 0, 0, &ins) == BRAID_ERR_INVALID_ARGUMENT &&
        contains(api.last_error(), "struct_size"));
  struct {
    braid_instruction v1;
    int64_t future_field;
  } bigger;
  memset(&bigger, 0xff, sizeof bigger);
  bigger.v1.struct_size = sizeof bigger;
  CHECK(api.program_instruction(program, 0, 0, &bigger.v1) == BRAID_OK);
  CHECK(bigger.v1.struct_size == sizeof bigger && bigger.v1.opcode == BRAID_OP_LOAD_MICROBATCH &&
        bigger.future_field == 0);

  /* Simulation options. */
  CHECK(api.simulate(program, &options, NULL) == BRAID_ERR_INVALID_ARGUMENT);
  options.struct_size = 4;
  CHECK(api.simulate(program, &options, &sim) == BRAID_ERR_INVALID_ARGUMENT && sim == NULL);
  CHECK(contains(api.last_error(), "BRAID_SIMULATION_OPTIONS_INIT"));
  options = (braid_simulation_options)BRAID_SIMULATION_OPTIONS_INIT;
  options.version = 0;
  CHECK(api.simulate(program, &options, &sim) == BRAID_ERR_INVALID_ARGUMENT && sim == NULL);
  options = (braid_simulation_options)BRAID_SIMULATION_OPTIONS_INIT;
  options.trace_replicas = -2;
  CHECK(api.simulate(program, &options, &sim) == BRAID_ERR_INVALID_ARGUMENT && sim == NULL);

  /* Without record_trace there is nothing to write or draw. */
  options = (braid_simulation_options)BRAID_SIMULATION_OPTIONS_INIT;
  CHECK(api.simulate(program, &options, &sim) == BRAID_OK);
  if (sim) {
    CHECK(api.simulation_write_trace(sim, "/tmp/braid-capi-never-written.json") == BRAID_ERR_INVALID_ARGUMENT);
    CHECK(contains(api.last_error(), "record_trace"));
    text = NULL;
    CHECK(api.simulation_gantt(sim, 0, &text) == BRAID_ERR_INVALID_ARGUMENT && text == NULL);
    CHECK(contains(api.last_error(), "record_trace"));
    CHECK(api.simulation_write_trace(sim, NULL) == BRAID_ERR_INVALID_ARGUMENT);
    CHECK(api.simulation_result_get(sim, NULL) == BRAID_ERR_INVALID_ARGUMENT);
    result.struct_size = 4;
    CHECK(api.simulation_result_get(sim, &result) == BRAID_ERR_INVALID_ARGUMENT);
    CHECK(api.simulation_stage(sim, 0, NULL) == BRAID_ERR_INVALID_ARGUMENT);
    CHECK(api.simulation_stage(sim, 4, &stage) == BRAID_ERR_INVALID_ARGUMENT);
    CHECK(contains(api.last_error(), "out of range"));
    /* A successful call leaves the last failure's message as it is. */
    CHECK(api.simulation_stage(sim, 0, &stage) == BRAID_OK && contains(api.last_error(), "out of range"));
    api.simulation_destroy(sim);
  }
  api.program_destroy(program);
}

/* Data reordering: a skewed LLaVA batch of 64 samples on its disttrain plan. */
enum { kBatch = 64 };

static braid_reorder* reorder_llava(const braid_plan* plan, const int32_t* image, const int32_t* text,
                                    braid_reordering how) {
  braid_sample_batch batch = BRAID_SAMPLE_BATCH_INIT;
  batch.samples = kBatch;
  batch.image_resolution = image;
  batch.text_tokens = text;
  braid_reorder_options options = BRAID_REORDER_OPTIONS_INIT;
  options.reordering = how;
  braid_reorder* reorder = NULL;
  CHECK(api.reorder_create(plan, &batch, &options, &reorder) == BRAID_OK);
  if (!reorder) fprintf(stderr, "reorder_create: %s\n", api.last_error());
  return reorder;
}

static void test_reorder_llava(const char* source_dir) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/configs/runs", source_dir);
  braid_config* config = NULL;
  CHECK(api.config_load_string("model: ../models/llava-13b.yaml\ncluster: ../clusters/dgx-a100-80gb.yaml\n"
                               "nodes: 4\ntraining: {global_batch: 64, microbatch: 1}\n"
                               "data: {image: {resolution: 336}, text: {tokens: 1472}}\n",
                               dir, &config) == BRAID_OK);
  if (!config) return;
  braid_plan_options options = BRAID_PLAN_OPTIONS_INIT;
  options.strategy = BRAID_STRATEGY_DISTTRAIN;
  braid_plan* plan = NULL;
  CHECK(api.plan_create(config, &options, &plan) == BRAID_OK);
  if (!plan) {
    fprintf(stderr, "plan_create(disttrain): %s\n", api.last_error());
    api.config_destroy(config);
    return;
  }
  /* Many short captions and a few long ones; images of varying size. */
  int32_t image[kBatch], text[kBatch];
  for (int i = 0; i < kBatch; ++i) {
    image[i] = 224 + 14 * ((i * 7) % 17);
    text[i] = i % 8 == 0 ? 1472 : 64 + 32 * (i % 5);
  }
  braid_reorder* reorder = reorder_llava(plan, image, text, BRAID_REORDER_INTRA_INTER);
  braid_reorder* again = reorder_llava(plan, image, text, BRAID_REORDER_INTRA_INTER);
  braid_reorder* plain = reorder_llava(plan, image, text, BRAID_REORDER_NONE);
  if (reorder && again && plain) {
    braid_reorder_info info = BRAID_REORDER_INFO_INIT, none = BRAID_REORDER_INFO_INIT;
    CHECK(api.reorder_info_get(reorder, &info) == BRAID_OK);
    CHECK(api.reorder_info_get(plain, &none) == BRAID_OK);
    CHECK(info.samples == kBatch && info.cells >= 1 && info.pipeline_groups >= 1 && info.microbatches >= 1);
    CHECK((size_t)info.cells * (size_t)info.microbatches * (size_t)info.cell_microbatch == kBatch);
    CHECK(info.straggler_before > 1 && info.straggler_after < info.straggler_before);
    CHECK(none.straggler_after == none.straggler_before);
    CHECK(info.evaluations > 0 && none.evaluations == 0);
    int32_t cells[kBatch], cells_again[kBatch], mbs[kBatch], mbs_again[kBatch], ranks[kBatch];
    CHECK(api.reorder_cells(reorder, cells, kBatch) == BRAID_OK);
    CHECK(api.reorder_microbatches(reorder, mbs, kBatch) == BRAID_OK);
    CHECK(api.reorder_cells(again, cells_again, kBatch) == BRAID_OK);
    CHECK(api.reorder_microbatches(again, mbs_again, kBatch) == BRAID_OK);
    CHECK(memcmp(cells, cells_again, sizeof cells) == 0 && memcmp(mbs, mbs_again, sizeof mbs) == 0);
    /* Every (cell, microbatch) holds cell_microbatch samples. */
    int filled[kBatch] = {0};
    for (int i = 0; i < kBatch; ++i) {
      CHECK(cells[i] >= 0 && cells[i] < info.cells && mbs[i] >= 0 && mbs[i] < info.microbatches);
      if (cells[i] >= 0 && cells[i] < info.cells && mbs[i] >= 0 && mbs[i] < info.microbatches)
        ++filled[cells[i] * info.microbatches + mbs[i]];
    }
    for (int c = 0; c < info.cells * info.microbatches; ++c) CHECK(filled[c] == info.cell_microbatch);
    /* Each module's ranks get equal counts. */
    size_t modules = 0;
    CHECK(api.plan_module_count(plan, &modules) == BRAID_OK && modules >= 3);
    for (size_t m = 0; m < modules; ++m) {
      braid_module_info mod = BRAID_MODULE_INFO_INIT;
      CHECK(api.plan_module(plan, m, &mod) == BRAID_OK);
      CHECK(api.reorder_ranks(reorder, m, ranks, kBatch) == BRAID_OK);
      int count[kBatch] = {0};
      for (int i = 0; i < kBatch; ++i) {
        CHECK(ranks[i] >= 0 && ranks[i] < mod.dp);
        if (ranks[i] >= 0 && ranks[i] < mod.dp && ranks[i] < kBatch) ++count[ranks[i]];
      }
      for (int r = 0; r < mod.dp && r < kBatch; ++r) CHECK(count[r] == kBatch / mod.dp);
    }
    /* Each pipeline group's order lists every microbatch once. */
    for (int32_t g = 0; g < info.pipeline_groups; ++g) {
      int32_t order[kBatch];
      int seen[kBatch] = {0};
      CHECK(api.reorder_order(reorder, (size_t)g, order, (size_t)info.microbatches) == BRAID_OK);
      for (int k = 0; k < info.microbatches; ++k) {
        CHECK(order[k] >= 0 && order[k] < info.microbatches);
        if (order[k] >= 0 && order[k] < info.microbatches) ++seen[order[k]];
      }
      for (int k = 0; k < info.microbatches; ++k) CHECK(seen[k] == 1);
    }
    /* Misuse: counts, indices, NULLs. */
    CHECK(api.reorder_cells(reorder, cells, kBatch - 1) == BRAID_ERR_INVALID_ARGUMENT);
    CHECK(contains(api.last_error(), "count is 63; the batch has 64 samples"));
    CHECK(api.reorder_ranks(reorder, modules, ranks, kBatch) == BRAID_ERR_INVALID_ARGUMENT);
    CHECK(contains(api.last_error(), "out of range"));
    CHECK(api.reorder_order(reorder, (size_t)info.pipeline_groups, ranks, (size_t)info.microbatches) ==
          BRAID_ERR_INVALID_ARGUMENT);
    CHECK(api.reorder_microbatches(reorder, NULL, kBatch) == BRAID_ERR_INVALID_ARGUMENT);
    CHECK(api.reorder_info_get(NULL, &info) == BRAID_ERR_INVALID_ARGUMENT);
  }
  api.reorder_destroy(reorder);
  api.reorder_destroy(again);
  api.reorder_destroy(plain);
  CHECK(api.reorder_destroy(NULL) == BRAID_OK);

  /* Costs given directly, one column per plan module: only their ratios matter. */
  size_t modules = 0;
  CHECK(api.plan_module_count(plan, &modules) == BRAID_OK);
  double costs[kBatch * 8];
  if (modules <= 8) {
    for (int i = 0; i < kBatch; ++i)
      for (size_t m = 0; m < modules; ++m) costs[(size_t)i * modules + m] = (double)text[i] * (double)(m + 1);
    braid_sample_batch batch = BRAID_SAMPLE_BATCH_INIT;
    batch.samples = kBatch;
    batch.module_costs = costs;
    braid_reorder* direct = NULL;
    CHECK(api.reorder_create(plan, &batch, NULL, &direct) == BRAID_OK);
    braid_reorder_info info = BRAID_REORDER_INFO_INIT;
    CHECK(direct && api.reorder_info_get(direct, &info) == BRAID_OK && info.straggler_after < info.straggler_before);
    api.reorder_destroy(direct);
    costs[5 * modules] = -1;
    CHECK(api.reorder_create(plan, &batch, NULL, &direct) == BRAID_ERR_INVALID_ARGUMENT && direct == NULL);
    CHECK(contains(api.last_error(), "module_costs of sample 5, module 0 is not a finite non-negative number"));
  }

  /* Batches that cannot run. */
  braid_sample_batch batch = BRAID_SAMPLE_BATCH_INIT;
  braid_reorder* bad = NULL;
  batch.samples = kBatch - 1;
  batch.text_tokens = text;
  CHECK(api.reorder_create(plan, &batch, NULL, &bad) == BRAID_ERR_INVALID_ARGUMENT && bad == NULL);
  CHECK(contains(api.last_error(), "a batch of 63 samples does not split into"));
  batch.samples = kBatch;
  text[5] = 0;
  CHECK(api.reorder_create(plan, &batch, NULL, &bad) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK(contains(api.last_error(), "text_tokens of sample 5 is 0"));
  batch.struct_size = 8;
  CHECK(api.reorder_create(plan, &batch, NULL, &bad) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK(contains(api.last_error(), "BRAID_SAMPLE_BATCH_INIT"));
  batch.struct_size = sizeof batch;
  braid_reorder_options opts = BRAID_REORDER_OPTIONS_INIT;
  opts.reordering = (braid_reordering)7;
  CHECK(api.reorder_create(plan, &batch, &opts, &bad) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK(api.reorder_create(NULL, &batch, NULL, &bad) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK(api.reorder_create(plan, NULL, NULL, &bad) == BRAID_ERR_INVALID_ARGUMENT);
  api.plan_destroy(plan);

  /* A contrastive batch-sync plan groups its microbatches: not supported yet, said so. */
  api.config_destroy(config);
  config = NULL;
  CHECK(api.config_load_string("model: ../models/clip-vit-l14.yaml\ncluster: ../clusters/dgx-a100-80gb.yaml\n"
                               "nodes: 2\ntraining: {global_batch: 1024, microbatch: 32}\n"
                               "data: {image: {resolution: 224}, text: {tokens: 77}}\n",
                               dir, &config) == BRAID_OK);
  options.strategy = BRAID_STRATEGY_DISTMM;
  plan = NULL;
  if (config) CHECK(api.plan_create(config, &options, &plan) == BRAID_OK);
  if (plan) {
    batch.samples = 1024;
    batch.text_tokens = NULL;
    CHECK(api.reorder_create(plan, &batch, NULL, &bad) == BRAID_ERR_UNSUPPORTED && bad == NULL);
    CHECK(contains(api.last_error(), "contrastive batch-sync"));
  }
  api.plan_destroy(plan);
  api.config_destroy(config);
}

/* The Optimus bubble scheduler on the colocated plan of MLLM-72B (1024 devices, 2 llm
 * stages, a few hundredths of a second to schedule). */
static braid_config* load_mllm(const char* source_dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s/configs/runs/mllm-72b-1024gpu.yaml", source_dir);
  braid_config* config = NULL;
  CHECK(api.config_load_file(path, &config) == BRAID_OK);
  if (!config) fprintf(stderr, "config_load_file(mllm): %s\n", api.last_error());
  return config;
}

static double sum_bubbles(const double* b) {
  double t = 0;
  for (int c = 0; c < BRAID_BUBBLE_COUNT; ++c) t += b[c];
  return t;
}

/* ENCODER_TASK instructions of the stage that has the most (and whether any is a backward task). */
static int64_t most_encoder_tasks(const braid_program* program, int* backward_tasks) {
  size_t stages = 0;
  CHECK(api.program_stage_count(program, &stages) == BRAID_OK && stages > 0);
  int64_t most = 0;
  for (size_t s = 0; s < stages; ++s) {
    braid_stage_info info = BRAID_STAGE_INFO_INIT;
    CHECK(api.program_stage(program, s, &info) == BRAID_OK);
    int64_t tasks = 0;
    for (size_t i = 0; i < info.instruction_count; ++i) {
      braid_instruction ins = instruction_at(program, s, i);
      if (ins.opcode != BRAID_OP_ENCODER_TASK) continue;
      ++tasks;
      CHECK(ins.microbatch >= 0);
      if (ins.flags & BRAID_FLAG_BACKWARD_TASK) ++*backward_tasks;
    }
    if (tasks > most) most = tasks;
  }
  return most;
}

/* Two programs with the same stages and instructions. */
static int same_program(const braid_program* a, const braid_program* b) {
  size_t na = 0, nb = 0;
  if (api.program_stage_count(a, &na) != BRAID_OK || api.program_stage_count(b, &nb) != BRAID_OK || na != nb) return 0;
  for (size_t s = 0; s < na; ++s) {
    braid_stage_info ia = BRAID_STAGE_INFO_INIT, ib = BRAID_STAGE_INFO_INIT;
    if (api.program_stage(a, s, &ia) != BRAID_OK || api.program_stage(b, s, &ib) != BRAID_OK) return 0;
    if (ia.instruction_count != ib.instruction_count || ia.replicas != ib.replicas) return 0;
    for (size_t i = 0; i < ia.instruction_count; ++i) {
      braid_instruction x = instruction_at(a, s, i), y = instruction_at(b, s, i);
      if (x.opcode != y.opcode || x.microbatch != y.microbatch || x.unit != y.unit || x.peer != y.peer ||
          x.flags != y.flags)
        return 0;
    }
  }
  return 1;
}

static void test_bubble_mllm(const char* source_dir) {
  braid_config* config = load_mllm(source_dir);
  if (!config) return;
  braid_plan_options options = BRAID_PLAN_OPTIONS_INIT;
  options.strategy = BRAID_STRATEGY_OPTIMUS;
  braid_plan* plan = NULL;
  CHECK(api.plan_create(config, &options, &plan) == BRAID_OK);
  if (!plan) {
    fprintf(stderr, "plan_create(mllm optimus): %s\n", api.last_error());
    api.config_destroy(config);
    return;
  }
  braid_bubble_scheduler* scheduler = NULL;
  CHECK(api.bubble_scheduler_create(plan, &scheduler) == BRAID_OK);
  braid_program* reference = NULL; /* what braid_program_create builds for the plan */
  CHECK(api.program_create(plan, "optimus-fine", &reference) == BRAID_OK);
  api.plan_destroy(plan); /* the scheduler keeps its own copy of the layout */
  if (!scheduler) {
    fprintf(stderr, "bubble_scheduler_create: %s\n", api.last_error());
    api.program_destroy(reference);
    api.config_destroy(config);
    return;
  }

  /* Nothing to read before it has run. */
  braid_bubble_report report = BRAID_BUBBLE_REPORT_INIT;
  braid_program* program = NULL;
  CHECK(api.bubble_scheduler_report(scheduler, &report) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK(contains(api.last_error(), "has not run yet"));
  CHECK(api.bubble_scheduler_program(scheduler, NULL, &program) == BRAID_ERR_INVALID_ARGUMENT && program == NULL);
  CHECK(contains(api.last_error(), "braid_bubble_scheduler_run"));

  CHECK(api.bubble_scheduler_run(scheduler) == BRAID_OK);
  CHECK(api.bubble_scheduler_report(scheduler, &report) == BRAID_OK);
  CHECK(report.struct_size == sizeof report);
  CHECK(report.plain_step_s > 0);
  CHECK(report.fine_step_s <= report.coarse_step_s && report.coarse_step_s <= report.plain_step_s);
  CHECK(report.recovered_coarse >= 0 && report.recovered_coarse <= 1);
  CHECK(report.recovered_fine >= report.recovered_coarse && report.recovered_fine <= 1);
  for (int c = 0; c < BRAID_BUBBLE_COUNT; ++c) CHECK(report.bubbles_before_s[c] >= 0 && report.bubbles_after_s[c] >= 0);
  CHECK(report.bubbles_before_s[BRAID_BUBBLE_PP_WARMUP] > 0 && report.bubbles_before_s[BRAID_BUBBLE_BATCH_SYNC] == 0);
  /* The recovered share is the idle time the fine schedule took from encoder-first. */
  const double before = sum_bubbles(report.bubbles_before_s), after = sum_bubbles(report.bubbles_after_s);
  CHECK(before > 0 && after <= before);
  CHECK(report.recovered_fine * before - (before - after) < 1e-9 * before &&
        (before - after) - report.recovered_fine * before < 1e-9 * before);
  CHECK(report.scheduler_time_s > 0 && report.placements >= 3);
  CHECK(report.encoder_tasks > 0 && report.tp_bubble_tasks >= 0 && report.dp_wait_tasks > 0);
  /* Against the llm alone: the shares follow from the step times and the encoder's seconds. */
  CHECK(report.llm_step_s > 0 && report.llm_step_s <= report.fine_step_s * (1 + 1e-12) && report.encoder_s > 0 &&
        report.llm_idle_s > 0);
  const double steps[3] = {report.plain_step_s, report.coarse_step_s, report.fine_step_s};
  for (int k = 0; k < 3; ++k) {
    double hidden = report.encoder_s - (steps[k] - report.llm_step_s);
    if (hidden < 0) hidden = 0;
    CHECK(fabs(report.encoder_hidden[k] * report.encoder_s - hidden) < 1e-9 * report.encoder_s);
    CHECK(fabs(report.bubble_filled[k] * report.llm_idle_s - hidden) < 1e-9 * report.llm_idle_s);
  }
  CHECK(report.encoder_hidden[2] >= report.encoder_hidden[0]);
  /* A caller built before these fields (ABI 1.0's struct) gets the fields it knows only. */
  struct {
    braid_bubble_report known;
    double guard;
  } old = {BRAID_BUBBLE_REPORT_INIT, 7.0};
  old.known.struct_size = offsetof(braid_bubble_report, llm_step_s);
  old.known.llm_step_s = -1;
  CHECK(api.bubble_scheduler_report(scheduler, &old.known) == BRAID_OK &&
        old.known.plain_step_s == report.plain_step_s && old.known.llm_step_s == -1 && old.guard == 7.0);
  old.known.struct_size = offsetof(braid_bubble_report, dp_wait_tasks);
  old.known.dp_wait_tasks = -1;
  CHECK(api.bubble_scheduler_report(scheduler, &old.known) == BRAID_OK && old.known.encoder_s == report.encoder_s &&
        old.known.dp_wait_tasks == -1 && old.guard == 7.0);

  /* Idempotent: a second run changes nothing. */
  braid_bubble_report again = BRAID_BUBBLE_REPORT_INIT;
  CHECK(api.bubble_scheduler_run(scheduler) == BRAID_OK);
  CHECK(api.bubble_scheduler_report(scheduler, &again) == BRAID_OK && memcmp(&again, &report, sizeof report) == 0);

  /* The programs: every stage runs each encoder task once per microbatch, so the
   * busiest stage holds the report's encoder_tasks. NULL and "" name the fine one. */
  const char* names[] = {NULL, "", "optimus-fine", "optimus-coarse", "encoder-first"};
  const char* expected[] = {"optimus-fine", "optimus-fine", "optimus-fine", "optimus-coarse", "encoder-first"};
  for (size_t k = 0; k < sizeof names / sizeof names[0]; ++k) {
    program = NULL;
    CHECK(api.bubble_scheduler_program(scheduler, names[k], &program) == BRAID_OK);
    if (!program) continue;
    const char* schedule = NULL;
    CHECK(api.program_schedule(program, &schedule) == BRAID_OK && strcmp(schedule, expected[k]) == 0);
    int backward_tasks = 0;
    CHECK(most_encoder_tasks(program, &backward_tasks) == report.encoder_tasks);
    CHECK(backward_tasks > 0);
    api.program_destroy(program);
  }

  /* The fine program is the plan's own optimus-fine program and simulates to the
   * report's step time; it outlives the scheduler and the config. */
  program = NULL;
  CHECK(api.bubble_scheduler_program(scheduler, "optimus-fine", &program) == BRAID_OK);
  api.bubble_scheduler_destroy(scheduler);
  api.config_destroy(config);
  if (program && reference) CHECK(same_program(program, reference));
  braid_simulation* sim = NULL;
  if (program) CHECK(api.simulate(program, NULL, &sim) == BRAID_OK);
  if (sim) {
    braid_simulation_result result = BRAID_SIMULATION_RESULT_INIT;
    CHECK(api.simulation_result_get(sim, &result) == BRAID_OK);
    CHECK(result.step_time_s - report.fine_step_s < 1e-9 * report.fine_step_s &&
          report.fine_step_s - result.step_time_s < 1e-9 * report.fine_step_s);
    api.simulation_destroy(sim);
  }
  api.program_destroy(program);
  api.program_destroy(reference);
}

static void test_bubble_misuse(const char* source_dir) {
  braid_bubble_scheduler* scheduler = NULL;
  braid_bubble_report report = BRAID_BUBBLE_REPORT_INIT;
  braid_program* program = NULL;
  /* NULL handles and pointers. */
  CHECK(api.bubble_scheduler_create(NULL, &scheduler) == BRAID_ERR_INVALID_ARGUMENT && scheduler == NULL);
  CHECK(contains(api.last_error(), "plan is NULL"));
  CHECK(api.bubble_scheduler_run(NULL) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK(contains(api.last_error(), "scheduler is NULL"));
  CHECK(api.bubble_scheduler_report(NULL, &report) == BRAID_ERR_INVALID_ARGUMENT);
  CHECK(api.bubble_scheduler_program(NULL, NULL, &program) == BRAID_ERR_INVALID_ARGUMENT && program == NULL);
  CHECK(api.bubble_scheduler_destroy(NULL) == BRAID_OK);

  /* A plan that is not colocated: unsupported, naming its layout. */
  braid_config* config = load_llava(source_dir);
  if (!config) return;
  braid_plan* plan = plan_llava_megatron(config);
  if (plan) {
    CHECK(api.bubble_scheduler_create(plan, NULL) == BRAID_ERR_INVALID_ARGUMENT);
    CHECK(contains(api.last_error(), "out is NULL"));
    scheduler = NULL;
    CHECK(api.bubble_scheduler_create(plan, &scheduler) == BRAID_ERR_UNSUPPORTED && scheduler == NULL);
    CHECK(contains(api.last_error(), "colocated") && contains(api.last_error(), "monolithic") &&
          contains(api.last_error(), "megatron"));
    api.plan_destroy(plan);
  }
  api.config_destroy(config);

  /* On a scheduler that has run: bad schedule names and output structs. */
  config = load_mllm(source_dir);
  if (!config) return;
  braid_plan_options options = BRAID_PLAN_OPTIONS_INIT;
  options.strategy = BRAID_STRATEGY_OPTIMUS;
  plan = NULL;
  CHECK(api.plan_create(config, &options, &plan) == BRAID_OK);
  scheduler = NULL;
  if (plan) CHECK(api.bubble_scheduler_create(plan, &scheduler) == BRAID_OK);
  if (scheduler && api.bubble_scheduler_run(scheduler) == BRAID_OK) {
    CHECK(api.bubble_scheduler_program(scheduler, "1f1b", &program) == BRAID_ERR_INVALID_ARGUMENT && program == NULL);
    CHECK(contains(api.last_error(), "'1f1b'") && contains(api.last_error(), "optimus-coarse") &&
          contains(api.last_error(), "encoder-first"));
    CHECK(api.bubble_scheduler_program(scheduler, NULL, NULL) == BRAID_ERR_INVALID_ARGUMENT);
    CHECK(api.bubble_scheduler_report(scheduler, NULL) == BRAID_ERR_INVALID_ARGUMENT);
    report.struct_size = sizeof(size_t);
    CHECK(api.bubble_scheduler_report(scheduler, &report) == BRAID_ERR_INVALID_ARGUMENT &&
          contains(api.last_error(), "struct_size"));
    struct {
      braid_bubble_report v1;
      double future_field;
    } bigger;
    memset(&bigger, 0xff, sizeof bigger);
    bigger.v1.struct_size = sizeof bigger;
    CHECK(api.bubble_scheduler_report(scheduler, &bigger.v1) == BRAID_OK);
    CHECK(bigger.v1.struct_size == sizeof bigger && bigger.v1.fine_step_s > 0 && bigger.future_field == 0.0);
    /* A successful call leaves the last failure's message as it is. */
    CHECK(contains(api.last_error(), "struct_size"));
  } else {
    fprintf(stderr, "bubble scheduler on mllm: %s\n", api.last_error());
    CHECK(0);
  }
  api.bubble_scheduler_destroy(scheduler);
  api.plan_destroy(plan);
  api.config_destroy(config);
}

int main(int argc, char** argv) {
  void* lib = capi_open(argc, argv, 2, "LIBBRAID_SO SOURCE_DIR");
  RESOLVE(abi_version);
  RESOLVE(version_string);
  RESOLVE(status_string);
  RESOLVE(last_error);
  RESOLVE(config_load_file);
  RESOLVE(config_load_string);
  RESOLVE(config_destroy);
  RESOLVE(config_devices);
  RESOLVE(plan_create);
  RESOLVE(plan_destroy);
  RESOLVE(plan_strategy);
  RESOLVE(plan_module_count);
  RESOLVE(plan_module);
  RESOLVE(plan_estimate);
  RESOLVE(plan_to_json);
  RESOLVE(plan_to_yaml);
  RESOLVE(plan_alternative_count);
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
  RESOLVE(simulation_write_trace);
  RESOLVE(simulation_gantt);
  RESOLVE(reorder_create);
  RESOLVE(reorder_destroy);
  RESOLVE(reorder_info_get);
  RESOLVE(reorder_ranks);
  RESOLVE(reorder_cells);
  RESOLVE(reorder_microbatches);
  RESOLVE(reorder_order);
  RESOLVE(bubble_scheduler_create);
  RESOLVE(bubble_scheduler_destroy);
  RESOLVE(bubble_scheduler_run);
  RESOLVE(bubble_scheduler_report);
  RESOLVE(bubble_scheduler_program);

  test_versions();
  test_plan_clip(argv[2]);
  test_misuse(argv[2]);
  test_program_llava(argv[2]);
  test_program_misuse(argv[2]);
  test_reorder_llava(argv[2]);
  test_bubble_mllm(argv[2]);
  test_bubble_misuse(argv[2]);
  return capi_finish(lib, "C ABI", "");
}
