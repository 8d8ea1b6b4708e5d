// braid_config_*: load and validate run files; read and change their typed settings.
#include <cstring>
#include <string>

#include "capi/src/enums.hpp"
#include "capi/src/guard.hpp"
#include "capi/src/handles.hpp"
#include "core/common/text.hpp"
#include "core/spec/yaml_reader.hpp"

namespace {

using braid::spec::Attention;
using braid::spec::Precision;
using braid::spec::Recompute;

// Version 1 ends before the Megatron-Core settings of version 2.
constexpr std::size_t kRunSettingsV1 = offsetof(braid_run_settings, overlap_param_gather);
constexpr std::size_t kRunSettingsVersions[] = {kRunSettingsV1, sizeof(braid_run_settings)};

// The C enums are read as ints: a C caller may store any value in an enum field, and
// loading an out-of-range value as a C++ enum is undefined behaviour.
template <class E>
int raw(const E& value) {
  static_assert(sizeof(E) == sizeof(int), "C enums are int-sized");
  int v = 0;
  std::memcpy(&v, &value, sizeof v);
  return v;
}

}  // namespace

// Also read by vocabulary.cpp (capi/src/enums.hpp).
namespace braid::capi {

braid_precision precision_to_c(Precision p) {
  switch (p) {
    case Precision::bf16:
      return BRAID_PRECISION_BF16;
    case Precision::fp16:
      return BRAID_PRECISION_FP16;
    case Precision::fp32:
      return BRAID_PRECISION_FP32;
  }
  return BRAID_PRECISION_BF16;
}

braid_recompute recompute_to_c(Recompute r) {
  switch (r) {
    case Recompute::none:
      return BRAID_RECOMPUTE_NONE;
    case Recompute::selective:
      return BRAID_RECOMPUTE_SELECTIVE;
    case Recompute::full:
      return BRAID_RECOMPUTE_FULL;
  }
  return BRAID_RECOMPUTE_SELECTIVE;
}

}  // namespace braid::capi

namespace {

using braid::capi::precision_to_c;
using braid::capi::recompute_to_c;

// The struct field that holds each run-file field, for messages.
const char* settings_field(const std::string& run_field) {
  static const std::pair<const char*, const char*> fields[] = {
      {"training.global_batch", "global_batch"},
      {"training.microbatch", "microbatch_size"},
      {"training.contrastive_batch", "contrastive_batch"},
      {"training.zero_stage", "zero_stage"},
      {"training.schedule", "schedule"},
      {"training.virtual_stages", "virtual_stages"},
      {"training.overlap_param_gather", "overlap_param_gather"},
      {"training.tp_comm_overlap", "tp_comm_overlap"},
      {"training.fp8", "fp8"},
      {"data.image.resolution", "image_resolution"},
      {"data.text.tokens", "text_tokens"},
      {"data.audio.tokens", "audio_tokens"},
      {"data.generated_image.resolution", "generated_image_resolution"},
  };
  for (const auto& [from, to] : fields)
    if (run_field == from) return to;
  return "?";
}

braid_run_settings settings_of(const braid::spec::RunSpec& run) {
  const auto& t = run.training;
  const auto& d = run.data;
  braid_run_settings v = BRAID_RUN_SETTINGS_INIT;
  v.global_batch = t.global_batch;
  v.microbatch_size = t.microbatch;
  v.contrastive_batch = t.contrastive_batch == t.global_batch ? 0 : t.contrastive_batch;
  v.precision = precision_to_c(t.precision);
  v.zero_stage = t.zero_stage;
  v.recompute = recompute_to_c(t.recompute);
  v.attention = t.attention == Attention::flash ? BRAID_ATTENTION_FLASH : BRAID_ATTENTION_STANDARD;
  v.sequence_parallel = t.sequence_parallel ? 1 : 0;
  v.schedule = braid::spec::schedule_name(t.schedule);  // static storage
  v.virtual_stages = t.virtual_stages;
  v.overlap_grad_reduce = t.overlap_grad_reduce ? 1 : 0;
  v.overlap_param_gather = t.overlap_param_gather ? 1 : 0;
  v.tp_comm_overlap = t.tp_comm_overlap ? 1 : 0;
  v.fused_kernels = t.fused_kernels ? 1 : 0;
  v.fp8 = t.fp8 ? 1 : 0;
  v.image_resolution = d.image_resolution;
  v.text_tokens = d.text_tokens;
  v.audio_tokens = d.audio_tokens;
  v.generated_image_resolution = d.generated_image_resolution;
  return v;
}

// "settings->precision is 7; use BRAID_PRECISION_BF16, _FP16 or _FP32", or "".
std::string enum_problem(const char* field, int value, int last, const char* choices) {
  if (value >= 0 && value <= last) return "";
  return std::string("settings->") + field + " is " + std::to_string(value) + "; use " + choices;
}

std::string flag_problem(const char* field, const char* run_field, int value) {
  if (value == 0 || value == 1) return "";
  return std::string("settings->") + field + " (" + run_field + ") is " + std::to_string(value) + "; set it to 0 or 1";
}

}  // namespace

extern "C" {

BRAID_API braid_status braid_config_load_file(const char* path, braid_config** out) {
  BRAID_API_BEGIN
  BRAID_REQUIRE(out, "out is NULL");
  *out = nullptr;
  BRAID_REQUIRE(path, "path is NULL");
  *out = new braid_config(braid::spec::load_run(path));
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_config_load_string(const char* yaml, const char* base_dir, braid_config** out) {
  BRAID_API_BEGIN
  BRAID_REQUIRE(out, "out is NULL");
  *out = nullptr;
  BRAID_REQUIRE(yaml, "yaml is NULL");
  *out = new braid_config(braid::spec::parse_run(yaml, base_dir ? base_dir : "", "<string>"));
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_config_destroy(braid_config* config) {
  return braid::capi::destroy_handle(config, __func__, "braid_config");
}

BRAID_API braid_status braid_config_devices(const braid_config* config, int32_t* devices) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(config, braid_config);
  BRAID_REQUIRE(devices, "devices is NULL");
  *devices = config->current()->run.devices();
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_config_run_settings(const braid_config* config, braid_run_settings* settings) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(config, braid_config);
  BRAID_REQUIRE_STRUCT(settings, braid_run_settings, kRunSettingsV1);
  braid_run_settings v = settings_of(config->current()->run);
  v.version = settings->version;  // the caller's: what it knows, for braid_config_set_run_settings
  braid::capi::copy_out(v, settings);
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_config_set_run_settings(braid_config* config, const braid_run_settings* settings) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(config, braid_config);
  BRAID_REQUIRE(settings, "settings is NULL");
  const auto now = config->current();
  // Fields beyond the caller's struct keep their current values.
  braid_run_settings s = settings_of(now->run);
  BRAID_READ_OPTIONS(settings, braid_run_settings, kRunSettingsVersions, BRAID_RUN_SETTINGS_VERSION,
                     BRAID_RUN_SETTINGS_INIT, &s);
  for (const auto& problem :
       {enum_problem("precision", raw(s.precision), BRAID_PRECISION_FP32,
                     "BRAID_PRECISION_BF16, BRAID_PRECISION_FP16 or BRAID_PRECISION_FP32"),
        enum_problem("recompute", raw(s.recompute), BRAID_RECOMPUTE_FULL,
                     "BRAID_RECOMPUTE_NONE, BRAID_RECOMPUTE_SELECTIVE or BRAID_RECOMPUTE_FULL"),
        enum_problem("attention", raw(s.attention), BRAID_ATTENTION_STANDARD,
                     "BRAID_ATTENTION_FLASH or BRAID_ATTENTION_STANDARD"),
        flag_problem("sequence_parallel", "training.sequence_parallel", s.sequence_parallel),
        flag_problem("overlap_grad_reduce", "training.overlap_grad_reduce", s.overlap_grad_reduce),
        flag_problem("overlap_param_gather", "training.overlap_param_gather", s.overlap_param_gather),
        flag_problem("tp_comm_overlap", "training.tp_comm_overlap", s.tp_comm_overlap),
        flag_problem("fused_kernels", "training.fused_kernels", s.fused_kernels),
        flag_problem("fp8", "training.fp8", s.fp8)})
    BRAID_REQUIRE(problem.empty(), problem);

  braid::spec::RunSpec run = now->run;
  auto& t = run.training;
  auto& d = run.data;
  t.global_batch = s.global_batch;
  t.microbatch = s.microbatch_size;
  t.contrastive_batch = s.contrastive_batch == 0 ? s.global_batch : s.contrastive_batch;
  const int precision = raw(s.precision);
  t.precision = precision == BRAID_PRECISION_BF16   ? Precision::bf16
                : precision == BRAID_PRECISION_FP16 ? Precision::fp16
                                                    : Precision::fp32;
  t.zero_stage = s.zero_stage;
  const int recompute = raw(s.recompute);
  t.recompute = recompute == BRAID_RECOMPUTE_NONE        ? Recompute::none
                : recompute == BRAID_RECOMPUTE_SELECTIVE ? Recompute::selective
                                                         : Recompute::full;
  t.attention = raw(s.attention) == BRAID_ATTENTION_FLASH ? Attention::flash : Attention::standard;
  t.sequence_parallel = s.sequence_parallel == 1;
  if (s.schedule && *s.schedule) {
    const auto names = braid::spec::run_schedule_names();
    const std::string problem = braid::spec::choice_problem(s.schedule, names);
    BRAID_REQUIRE(problem.empty(), "settings->schedule (training.schedule): " + problem);
    t.schedule = *braid::spec::parse_schedule(s.schedule);
  }
  t.virtual_stages = s.virtual_stages;
  t.overlap_grad_reduce = s.overlap_grad_reduce == 1;
  t.overlap_param_gather = s.overlap_param_gather == 1;
  t.tp_comm_overlap = s.tp_comm_overlap == 1;
  t.fused_kernels = s.fused_kernels == 1;
  t.fp8 = s.fp8 == 1;
  d.image_resolution = s.image_resolution;
  d.text_tokens = s.text_tokens;
  d.audio_tokens = s.audio_tokens;
  d.generated_image_resolution = s.generated_image_resolution;

  // The run file's own checks, with its messages.
  auto problem = braid::spec::check_training(t, run.model);
  if (!problem) problem = braid::spec::check_training_on(t, run.cluster);
  if (!problem) problem = braid::spec::check_input_sizes(d, run.model);
  BRAID_REQUIRE(!problem, problem ? std::string("settings->") + settings_field(problem->field) + " (" + problem->field +
                                        "): " + problem->message
                                  : std::string());
  config->replace(std::make_shared<const braid::capi::PricedRun>(std::move(run)));
  return BRAID_OK;
  BRAID_API_END
}

}  // extern "C"
