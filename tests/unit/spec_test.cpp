// Spec loading and validation: every shipped config loads; every kind of bad input
// gives one error naming the file, line, column and field.
#include <filesystem>
#include <set>

#include "core/spec/run.hpp"
#include "core/spec/schedule.hpp"
#include "tests/unit/support.hpp"

namespace braid {
namespace {

using test::expect_error;
using test::parse;

// A valid run with an inline model and the bundled A100 cluster; tests break one field.
std::string clip_run(const std::string& training, const std::string& model_extra = "") {
  return "model:\n"
         "  name: small-clip\n"
         "  modules:\n"
         "    - name: image\n"
         "      role: encoder\n"
         "      modality: image\n"
         "      layers: 12\n"
         "      hidden: 768\n"
         "      heads: 12\n"
         "      patch_size: 16\n"
         "      embed_dim: 512\n" +
         model_extra +
         "    - name: text\n"
         "      role: encoder\n"
         "      modality: text\n"
         "      layers: 12\n"
         "      hidden: 512\n"
         "      heads: 8\n"
         "      vocab: 49408\n"
         "      embed_dim: 512\n"
         "    - name: loss\n"
         "      role: loss\n"
         "      loss: contrastive\n"
         "      inputs: [image, text]\n"
         "cluster: ../clusters/dgx-a100-80gb.yaml\n"
         "nodes: 2\n"
         "training:\n" +
         training +
         "data:\n"
         "  image: {resolution: 224}\n"
         "  text: {tokens: 77}\n";
}

const std::string kTraining = "  global_batch: 1024\n  microbatch: 32\n";

TEST(Spec, EveryShippedRunLoads) {
  int count = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(test::source_path("configs/runs"))) {
    if (entry.path().extension() != ".yaml") continue;
    SCOPED_TRACE(entry.path().string());
    spec::RunSpec run = spec::load_run(entry.path().string());
    EXPECT_GT(run.devices(), 0);
    EXPECT_FALSE(run.model.modules.empty());
    ++count;
  }
  EXPECT_GE(count, 17);  // the named multimodal runs and the ten calibration runs
}

TEST(Spec, ReadsTheNamedRuns) {
  auto run = test::load("vit22b-gpt175b-3072gpu.yaml");
  EXPECT_EQ(run.devices(), 3072);
  EXPECT_EQ(run.training.global_batch, 1536);
  EXPECT_EQ(run.cluster.device_name, "NVIDIA H100-SXM5-80GB");
  EXPECT_EQ(run.model.topology, spec::Topology::chain);
  auto clip = test::load("clip-vit-l14-64gpu.yaml");
  EXPECT_EQ(clip.model.topology, spec::Topology::contrastive);
  EXPECT_EQ(clip.devices(), 64);
  auto gpt = test::load("gpt-175b-1024gpu.yaml");
  EXPECT_EQ(gpt.model.topology, spec::Topology::llm_only);
}

TEST(Spec, ADirectoryIsAnIoErrorNotAnEmptyDocument) {
  const std::string dir = test::source_path("configs/runs");
  expect_error([&] { spec::load_run(dir); }, Status::io, {"cannot read '" + dir + "': it is a directory"});
  expect_error([&] { spec::load_run(dir + "/no-such-run.yaml"); }, Status::io, {"No such file or directory"});
}

// The typed checks (the C ABI's braid_run_settings) say what the reader says, field by field.
TEST(Spec, TypedTrainingChecksMatchTheReader) {
  const auto run = test::load("llava-13b-256gpu.yaml");
  EXPECT_EQ(spec::check_training(run.training, run.model), std::nullopt);
  EXPECT_EQ(spec::check_input_sizes(run.data, run.model), std::nullopt);
  auto t = run.training;
  t.microbatch = 3;
  auto problem = spec::check_training(t, run.model);
  ASSERT_TRUE(problem);
  EXPECT_EQ(problem->field, "training.global_batch");
  expect_error([&] { parse(clip_run("  global_batch: 1024\n  microbatch: 3\n")); }, Status::bad_config,
               {"training.global_batch: global batch 1024 is not divisible by the microbatch size 3"});
  EXPECT_EQ(problem->message, "global batch 1024 is not divisible by the microbatch size 3");
  t = run.training;
  t.virtual_stages = 2;
  problem = spec::check_training(t, run.model);
  ASSERT_TRUE(problem);
  EXPECT_EQ(problem->field, "training.virtual_stages");
  EXPECT_EQ(problem->message, "virtual stages need 'schedule: interleaved'");
  t = run.training;
  t.contrastive_batch = t.global_batch / 2;
  problem = spec::check_training(t, run.model);
  ASSERT_TRUE(problem);
  EXPECT_EQ(problem->message, "only applies to models with a contrastive loss");
  auto d = run.data;
  d.audio_tokens = 4;
  problem = spec::check_input_sizes(d, run.model);
  ASSERT_TRUE(problem);
  EXPECT_EQ(problem->field, "data.audio.tokens");
}

// The Megatron-Core overlaps and FP8 default off (fused kernels on), and refuse the
// combinations Megatron-LM refuses, at the field's line.
TEST(Spec, OverlapAndFp8SettingsDefaultOffAndRefuseWhatMegatronRefuses) {
  auto run = parse(clip_run(kTraining));
  EXPECT_FALSE(run.training.overlap_param_gather);
  EXPECT_FALSE(run.training.tp_comm_overlap);
  EXPECT_FALSE(run.training.fp8);
  EXPECT_TRUE(run.training.fused_kernels);
  auto with = [](const std::string& extra) { return clip_run("  global_batch: 1024\n  microbatch: 32\n" + extra); };
  expect_error([&] { parse(with("  tp_comm_overlap: true\n")); }, Status::bad_config,
               {"training.tp_comm_overlap: needs sequence_parallel: true"});
  expect_error([&] { parse(with("  overlap_param_gather: true\n")); }, Status::bad_config,
               {"training.overlap_param_gather: needs overlap_grad_reduce: true"});
  expect_error([&] { parse(with("  zero_stage: 3\n  overlap_grad_reduce: true\n  overlap_param_gather: true\n")); },
               Status::bad_config, {"training.overlap_param_gather: needs zero_stage 1 or 2"});
  expect_error([&] { parse(with("  fp8: yes please\n")); }, Status::bad_config, {"training.fp8"});
  expect_error([&] { parse(with("  fp8: true\n")); }, Status::bad_config,
               {"training.fp8: cluster", "gives no FP8 peak: add `fp8` to device.peak_tflops"});
  auto h100 = test::load("megatron-core-h100/llama2-70b-64gpu.yaml");
  EXPECT_TRUE(h100.training.fp8 && h100.training.tp_comm_overlap && h100.training.overlap_param_gather);
  EXPECT_DOUBLE_EQ(h100.cluster.peak_flops_fp8, 1979e12);
}

TEST(Spec, ValidInlineRunParses) {
  auto run = parse(clip_run(kTraining));
  EXPECT_EQ(run.model.modules.size(), 3u);
  EXPECT_EQ(run.model.modules[0].ffn, 4 * 768);     // default ffn
  EXPECT_EQ(run.model.modules[0].kv_groups, 12);    // default: plain multi-head attention
  EXPECT_EQ(run.training.contrastive_batch, 1024);  // default: the whole global batch
}

TEST(Spec, UnknownFieldSuggestsTheClosestOne) {
  std::string yaml = clip_run("  global_bach: 1024\n  microbatch: 32\n");
  // "  global_bach" is on line 27, column 3.
  expect_error([&] { parse(yaml); }, Status::bad_config,
               {"<string>:27:3: training.global_bach: unknown field 'global_bach'", "did you mean 'global_batch'?"});
}

TEST(Spec, MissingFieldNamesIt) {
  expect_error([&] { parse(clip_run("  global_batch: 1024\n")); }, Status::bad_config,
               {"<string>:27:3", "training.microbatch: missing required field 'microbatch'"});
}

TEST(Spec, WrongTypeSaysWhatItFound) {
  expect_error([&] { parse(clip_run("  global_batch: 1024\n  microbatch: two\n")); }, Status::bad_config,
               {"<string>:28:15: training.microbatch: expected an integer, found 'two'"});
  expect_error([&] { parse(clip_run(kTraining + "  recompute: [full]\n")); }, Status::bad_config,
               {"<string>:29:14: training.recompute: expected a string, found a list"});
}

TEST(Spec, BadChoiceListsTheChoices) {
  expect_error([&] { parse(clip_run(kTraining + "  precision: bf61\n")); }, Status::bad_config,
               {"<string>:29:14: training.precision: 'bf61' is not one of bf16, fp16 or fp32", "did you mean 'bf16'?"});
}

TEST(Spec, HeadsMustDivideHidden) {
  std::string yaml = clip_run(kTraining);
  yaml.replace(yaml.find("heads: 12"), 9, "heads: 10");
  expect_error([&] { parse(yaml); }, Status::bad_config,
               {"<string>:9:14: model.modules[0].heads: 10 heads do not divide hidden size 768"});
}

TEST(Spec, KvGroupsMustDivideHeads) {
  expect_error([&] { parse(clip_run(kTraining, "      kv_groups: 5\n")); }, Status::bad_config,
               {"<string>:12:18: model.modules[0].kv_groups: 5 key/value groups do not divide 12 heads"});
}

TEST(Spec, ZeroLayersIsRejected) {
  std::string yaml = clip_run(kTraining);
  yaml.replace(yaml.find("layers: 12"), 10, "layers: 0");
  expect_error([&] { parse(yaml); }, Status::bad_config,
               {"<string>:7:15: model.modules[0].layers: must be at least 1 (got 0)"});
}

TEST(Spec, BatchMustSplitIntoMicrobatches) {
  expect_error([&] { parse(clip_run("  global_batch: 1000\n  microbatch: 32\n")); }, Status::bad_config,
               {"<string>:27:17: training.global_batch: global batch 1000 is not divisible by the microbatch size 32"});
  expect_error([&] { parse(clip_run(kTraining + "  contrastive_batch: 300\n")); }, Status::bad_config,
               {"training.contrastive_batch: contrastive batch 300 does not divide the global batch 1024"});
}

TEST(Spec, ImageResolutionMustFitPatches) {
  std::string yaml = clip_run(kTraining);
  yaml.replace(yaml.find("resolution: 224"), 15, "resolution: 230");
  expect_error([&] { parse(yaml); }, Status::bad_config,
               {"data.image.resolution: image resolution 230 is not a multiple of the patch size 16 of 'image'"});
}

TEST(Spec, InputsMustNameEarlierModules) {
  std::string yaml = clip_run(kTraining);
  yaml.replace(yaml.find("inputs: [image, text]"), 21, "inputs: [image, txt]");
  expect_error([&] { parse(yaml); }, Status::bad_config, {"model.modules[2].inputs[1]: no module named 'txt'"});
}

TEST(Spec, MissingModelFileNamesThePath) {
  std::string yaml = clip_run(kTraining);
  yaml.replace(0, yaml.find("cluster:"), "model: ../models/no-such-model.yaml\n");
  expect_error([&] { parse(yaml); }, Status::io,
               {"<string>:1:8: model: cannot read '", "no-such-model.yaml': No such file or directory"});
}

TEST(Spec, AFieldGivenTwiceIsRefusedWhereverItIs) {
  // yaml-cpp keeps the first of two values; the user meant one of them.
  expect_error([&] { parse(clip_run(kTraining + "  microbatch: 16\n")); }, Status::bad_config,
               {"<string>:29:3: training.microbatch: field 'microbatch' given twice in one mapping (first at line "
                "28)"});
  expect_error([&] { parse(clip_run(kTraining, "      layers: 6\n")); }, Status::bad_config,
               {"<string>:12:7: model.modules[0].layers: field 'layers' given twice in one mapping (first at line 7)"});
}

TEST(Spec, NestingPastYamlCppsLimitIsNamed) {
  // yaml-cpp stops at its depth limit with a message ("bad file") that names no cause.
  const std::string deep = "model: " + std::string(3000, '[') + std::string(3000, ']') + "\n";
  expect_error([&] { parse(deep); }, Status::bad_config,
               {"<string>:1:", ": invalid YAML: nested deeper than yaml-cpp reads"});
}

TEST(Spec, AnEmptyValueIsReportedAtItsKey) {
  expect_error([&] { parse(clip_run("  global_batch:\n  microbatch: 32\n")); }, Status::bad_config,
               {"<string>:27:3: training.global_batch: expected an integer, found nothing"});
}

TEST(Spec, DataForAnInputNoModuleTakesIsRefused) {
  expect_error([&] { parse(clip_run(kTraining) + "  audio: {tokens: 5}\n"); }, Status::bad_config,
               {"<string>:32:10: data.audio: model 'small-clip' takes no audio input; remove this section"});
}

TEST(Spec, AStepOfMillionsOfMicrobatchesIsRefused) {
  expect_error([&] { parse(clip_run("  global_batch: 2097152\n  microbatch: 1\n")); }, Status::bad_config,
               {"training.global_batch: global batch 2097152 is 2097152 microbatches of 1 a step; at most 1048576"});
  EXPECT_NO_THROW(parse(clip_run("  global_batch: 2097152\n  microbatch: 2\n")));
}

TEST(Spec, SizesAnIntCannotHoldAreRefused) {
  std::string yaml = clip_run(kTraining);
  yaml.replace(yaml.find("hidden: 768"), 11, "hidden: 600000000");
  expect_error([&] { parse(yaml); }, Status::bad_config,
               {"<string>:8:15: model.modules[0].hidden: is too large (got 600000000): the default ffn, 4 x hidden, "
                "exceeds 2147483647"});
  expect_error([&] { parse(clip_run(kTraining) + "trainer: {eval_samples: 100000}\n"); }, Status::bad_config,
               {"trainer.eval_samples: at most 65536 (got 100000)"});
  expect_error([&] { parse(clip_run(kTraining) + "trainer: {threads: 5000}\n"); }, Status::bad_config,
               {"trainer.threads: at most 1024 (got 5000)"});
}

TEST(Spec, MissingRunFileIsAnIoError) {
  expect_error([] { spec::load_run("/nonexistent/run.yaml"); }, Status::io, {"cannot read '/nonexistent/run.yaml'"});
}

TEST(Spec, InvalidYamlGivesThePosition) {
  expect_error([] { parse("training:\n  global_batch: [1, 2\n"); }, Status::bad_config, {"<string>:3:1: invalid YAML"});
  expect_error([] { parse("- just\n- a list\n"); }, Status::bad_config,
               {"expected a YAML mapping at the top level, found a list"});
}

TEST(Spec, ErrorsInsideAReferencedFileNameThatFile) {
  // The cluster file is correct, so break the model by pointing at a cluster as a model.
  std::string yaml = clip_run(kTraining);
  yaml.replace(0, yaml.find("cluster:"), "model: ../clusters/dgx-h100.yaml\n");
  expect_error([&] { parse(yaml); }, Status::bad_config, {"dgx-h100.yaml:", "unknown field"});
}

TEST(Spec, EveryScheduleNameParsesBackToItsSchedule) {
  std::set<std::string> names;
  for (spec::Schedule s : spec::all_schedules()) {
    const std::string name = spec::schedule_name(s);
    EXPECT_TRUE(names.insert(name).second) << name;  // one name per schedule
    EXPECT_EQ(spec::parse_schedule(name), s) << name;
  }
  EXPECT_EQ(names.size(), 10u);
  EXPECT_EQ(spec::parse_schedule("zigzag"), std::nullopt);
  EXPECT_EQ(spec::parse_schedule(""), std::nullopt);
  EXPECT_EQ(spec::schedule_names({spec::Schedule::one_f_one_b, spec::Schedule::distmm_pipe}),
            (std::vector<std::string>{"1f1b", "distmm-pipe"}));
}

}  // namespace
}  // namespace braid
