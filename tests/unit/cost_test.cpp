// The cost model against hand-computed values: FLOPs, parameters, activation and
// state memory, collectives, GEMM efficiency.
#include <algorithm>
#include <array>
#include <cmath>
#include <utility>

#include "core/cost/cost_model.hpp"
#include "core/orchestrate/planning.hpp"
#include "tests/unit/support.hpp"

namespace braid {
namespace {

// GPT-175B with 2021 Megatron settings, as a run with knobs to vary.
std::string gpt_run(const std::string& training_extra, int nodes = 1) {
  return "model: ../models/gpt-175b.yaml\n"
         "cluster: ../clusters/dgx-a100-80gb.yaml\n"
         "nodes: " +
         std::to_string(nodes) +
         "\n"
         "training:\n"
         "  global_batch: 64\n"
         "  microbatch: 1\n"
         "  precision: fp16\n" +
         training_extra +
         "data:\n"
         "  text: {tokens: 2048}\n";
}

// The GPT module with dropout on, as the Korthikanti et al. formulas assume.
std::string gpt_with_dropout(const std::string& training_extra) {
  return "model:\n"
         "  name: gpt-dropout\n"
         "  modules:\n"
         "    - {name: gpt, role: llm, layers: 96, hidden: 12288, heads: 96, vocab: 51200, dropout: 0.1}\n"
         "cluster: ../clusters/dgx-a100-80gb.yaml\n"
         "training:\n"
         "  global_batch: 64\n"
         "  microbatch: 1\n"
         "  precision: fp16\n" +
         training_extra +
         "data:\n"
         "  text: {tokens: 2048}\n";
}

constexpr double s = 2048, h = 12288, a = 96, V = 51200, L = 96;

TEST(Cost, Gpt175bHas175BillionParameters) {
  auto run = test::load("gpt-175b-1024gpu.yaml");
  // 12 h^2 per layer + biases and norms, token embedding and an untied LM head.
  double expected = L * (12 * h * h + 13 * h) + 2 * V * h + 2 * h;
  EXPECT_DOUBLE_EQ(spec::model_parameters(run.model), expected);
  EXPECT_NEAR(spec::model_parameters(run.model) / 1e9, 175.2, 0.1);
}

// Parameters one device of a TP group of `tp` holds for module `name` with all its stages:
// what its weights, gradients and optimizer state are counted from.
double per_device_parameters(const spec::RunSpec& run, const std::string& name, int tp) {
  cost::CostModel cost(run);
  const int m = run.model.index_of(name);
  const cost::ModuleCost& c = cost.module(m, tp, 1);
  return c.stage(c.layers, true, true).parameters;
}

// The reference models' tensors (core/nn), counted by hand from the shapes. A GELU block of
// width h and MLP width f splits over TP: q, k, v and fc1 weights and biases, attention out
// and fc2 weights: 3(h^2 + h) + h^2 + (h f + f) + f h; it replicates the out and fc2 biases
// and two norms: 2h + 4h.
//   h 64,  f 256: split 12,480 + 4,096 + 16,640 + 16,384 = 49,600; replicated 384
//   h 128, f 512: split 49,536 + 16,384 + 66,048 + 65,536 = 197,504; replicated 768
TEST(Cost, TinyMllmParametersPerDeviceAreTheReferenceModels) {
  auto run = test::load("tiny-mllm.yaml");
  // vision: 2 blocks (h 64); replicated: patch embedding 8*8*3*64 + 64 = 12,352, row and column
  // position tables 2 * (32/8) * 64 = 512, final norm 128.
  //   tp 1: 2 * (49,600 + 384) + 12,352 + 512 + 128 = 112,960
  //   tp 2: 2 * (24,800 + 384) + 12,992 = 63,360
  //   tp 4: 2 * (12,400 + 384) + 12,992 = 38,560
  EXPECT_EQ(per_device_parameters(run, "vision", 1), 112960);
  EXPECT_EQ(per_device_parameters(run, "vision", 2), 63360);
  EXPECT_EQ(per_device_parameters(run, "vision", 4), 38560);
  // projector 64 -> 128 -> 128: layer 0 column-parallel (64*128 + 128 = 8,320 split), layer 1
  // row-parallel (128*128 = 16,384 split, its bias 128 replicated).
  //   tp 1: 8,320 + 16,384 + 128 = 24,832;  tp 2: 24,704 / 2 + 128 = 12,480;  tp 4: 6,176 + 128 = 6,304
  EXPECT_EQ(per_device_parameters(run, "projector", 1), 24832);
  EXPECT_EQ(per_device_parameters(run, "projector", 2), 12480);
  EXPECT_EQ(per_device_parameters(run, "projector", 4), 6304);
  // llm: 2 blocks (h 128); token table and LM head 32 * 128 = 4,096 each, split by vocabulary;
  // replicated: position table 32 * 128 = 4,096, final norm 256.
  //   tp 1: 2 * (197,504 + 768) + 2 * 4,096 + 4,096 + 256 = 409,088
  //   tp 2: 2 * (98,752 + 768) + 2 * 2,048 + 4,352 = 207,488
  //   tp 4: 2 * (49,376 + 768) + 2 * 1,024 + 4,352 = 106,688
  EXPECT_EQ(per_device_parameters(run, "llm", 1), 409088);
  EXPECT_EQ(per_device_parameters(run, "llm", 2), 207488);
  EXPECT_EQ(per_device_parameters(run, "llm", 4), 106688);
  // Unsharded, the same count as the model's: 112,960 + 24,832 + 409,088.
  EXPECT_EQ(spec::model_parameters(run.model), 546880);
}

TEST(Cost, TinyClipParametersPerDeviceAreTheReferenceModels) {
  auto run = test::load("tiny-clip.yaml");
  // image_encoder: tiny-mllm's vision (112,960 at tp 1) + its contrastive head 64 * 32 = 2,048,
  // replicated: 115,008; tp 2: 63,360 + 2,048 = 65,408; tp 4: 38,560 + 2,048 = 40,608.
  EXPECT_EQ(per_device_parameters(run, "image_encoder", 1), 115008);
  EXPECT_EQ(per_device_parameters(run, "image_encoder", 2), 65408);
  EXPECT_EQ(per_device_parameters(run, "image_encoder", 4), 40608);
  // text_encoder: 2 blocks (h 64); token table 32 * 64 = 2,048 split by vocabulary;
  // replicated: position table 16 * 64 = 1,024, final norm 128, head 2,048.
  //   tp 1: 2 * (49,600 + 384) + 2,048 + 1,024 + 128 + 2,048 = 105,216
  //   tp 2: 2 * (24,800 + 384) + 1,024 + 3,200 = 54,592
  //   tp 4: 2 * (12,400 + 384) + 512 + 3,200 = 29,280
  EXPECT_EQ(per_device_parameters(run, "text_encoder", 1), 105216);
  EXPECT_EQ(per_device_parameters(run, "text_encoder", 2), 54592);
  EXPECT_EQ(per_device_parameters(run, "text_encoder", 4), 29280);
  // + the loss's temperature (no placement: held where the towers' last stages are).
  EXPECT_EQ(spec::model_parameters(run.model), 115008 + 105216 + 1);
}

TEST(Cost, PipelineStagesHoldTheirModulesParts) {
  auto run = test::load("tiny-mllm.yaml");
  cost::CostModel cost(run);
  const cost::ModuleCost& llm = cost.module(run.model.index_of("llm"), 2, 1);
  // First stage: a block + token table (split) + position table; last: a block + final norm + LM head.
  EXPECT_EQ(llm.stage(1, true, false).parameters, 98752 + 768 + 2048 + 4096);
  EXPECT_EQ(llm.stage(1, false, true).parameters, 98752 + 768 + 256 + 2048);
}

TEST(Cost, LayerForwardFlopsPerToken) {
  auto run = test::load("gpt-175b-1024gpu.yaml");
  const auto& m = run.model.modules[0];
  // GEMMs 24 h^2 per token; attention scores and context 4 s h per token.
  EXPECT_DOUBLE_EQ(cost::transformer_layer_forward_flops(m, s, spec::Attention::standard) / s, 24 * h * h + 4 * s * h);
  // Causal flash attention skips the masked half of the scores.
  EXPECT_DOUBLE_EQ(cost::transformer_layer_forward_flops(m, s, spec::Attention::flash) / s, 24 * h * h + 2 * s * h);
}

TEST(Cost, HardwareFlopsMatchMegatronsFormula) {
  // Narayanan et al. 2021, eq. 3: F = 96 B s l h^2 (1 + s/6h + V/16lh), with full recomputation.
  auto run = test::parse(gpt_run("  recompute: full\n  attention: standard\n"));
  cost::CostModel cost(run);
  const auto& c = cost.module(0, 1, 1);
  double per_sample = c.stage(c.layers, true, true).hardware_flops();
  double megatron = 96 * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h));
  EXPECT_NEAR(per_sample / megatron, 1.0, 1e-12);
  // Model FLOPs exclude the recomputed forward: 3/4 of the layers' share.
  double model = 72 * s * L * h * h * (1 + s / (6 * h)) + 6 * s * h * V;
  EXPECT_NEAR(cost.model_flops_per_sample() / model, 1.0, 1e-12);
}

TEST(Cost, ActivationMemoryMatchesKorthikanti) {
  // Korthikanti et al. 2022, Table 2, bytes per layer for b = 1 (fp16, dropout on).
  const double sbh = s * h;
  auto per_layer = [&](const std::string& training, int tp) {
    auto run = test::parse(gpt_with_dropout(training));
    cost::CostModel cost(run);
    return cost.module(0, tp, 1).layer.activation_bytes;
  };
  EXPECT_NEAR(per_layer("  recompute: none\n  attention: standard\n", 1), sbh * (34 + 5 * a * s / h), 1.0);
  EXPECT_NEAR(per_layer("  recompute: none\n  attention: standard\n", 8), sbh * (10 + 24.0 / 8 + 5 * a * s / (h * 8)),
              1.0);
  EXPECT_NEAR(per_layer("  recompute: none\n  attention: standard\n  sequence_parallel: true\n", 8),
              sbh / 8 * (34 + 5 * a * s / h), 1.0);
  EXPECT_NEAR(per_layer("  recompute: selective\n  attention: standard\n  sequence_parallel: true\n", 8), sbh / 8 * 34,
              1.0);
  EXPECT_NEAR(per_layer("  recompute: full\n  attention: standard\n", 8), 2 * sbh, 1.0);
}

// What a recomputation re-creates is held while its layer's backward runs: a fully recomputed
// layer all it would have kept but its input, a selective one its scores; one layer's whatever
// a stage holds, and nothing on a stage with no layers.
TEST(Cost, RecomputationHoldsOneLayerDuringItsBackward) {
  const double sbh = s * h;
  auto layer = [&](const std::string& training) {
    auto run = test::parse(gpt_with_dropout(training));
    cost::CostModel cost(run);
    const cost::ModuleCost& m = cost.module(0, 8, 1);
    EXPECT_EQ(m.stage(12, false, false).recompute_bytes, m.layer.recompute_bytes);
    EXPECT_EQ(m.stage(0, true, false).recompute_bytes, 0);
    return m.layer;
  };
  const double kept = sbh * (10 + 24.0 / 8 + 5 * a * s / (h * 8));  // Table 2, no recomputation, TP 8
  const double scores = sbh * 5 * a * s / (h * 8);
  EXPECT_EQ(layer("  recompute: none\n  attention: standard\n").recompute_bytes, 0);
  EXPECT_NEAR(layer("  recompute: full\n  attention: standard\n").recompute_bytes, kept - 2 * sbh, 1.0);
  EXPECT_NEAR(layer("  recompute: selective\n  attention: standard\n").recompute_bytes, scores, 1.0);
  EXPECT_EQ(layer("  recompute: selective\n  attention: flash\n").recompute_bytes, 0);  // flash re-creates no scores
  const cost::BlockCost full = layer("  recompute: full\n  attention: flash\n");
  EXPECT_NEAR(full.activation_bytes + full.recompute_bytes,
              layer("  recompute: none\n  attention: flash\n").activation_bytes, 1.0);
}

TEST(Cost, TrainingStateBytesPerParameter) {
  // ZeRO paper (Rajbhandari et al. 2020): 2 + 2 + 12 bytes per parameter in mixed precision.
  auto plain = test::parse(gpt_run("  zero_stage: 0\n"));
  cost::CostModel c0(plain);
  EXPECT_DOUBLE_EQ(c0.state_bytes(0, 8).total(), 16);
  auto z1 = test::parse(gpt_run("  zero_stage: 1\n"));
  cost::CostModel c1(z1);
  EXPECT_DOUBLE_EQ(c1.state_bytes(0, 8).total(), 2 + 2 + 12.0 / 8);
  auto z3 = test::parse(gpt_run("  zero_stage: 3\n"));
  cost::CostModel c3(z3);
  EXPECT_DOUBLE_EQ(c3.state_bytes(0, 8).total(), 16.0 / 8);
}

TEST(Cost, AFrozenModuleUnderZero3IsNeitherShardedNorGathered) {
  // As the trainer runs it: ZeRO units for trained modules only, a frozen one kept whole.
  auto run = test::load("llava-13b-256gpu.yaml");
  run.training.zero_stage = 3;
  cost::CostModel cost(run);
  const cost::GroupShape dp = cost::group_shape(0, 1, 8, 8);
  int frozen = 0;
  for (int m = 0; m < static_cast<int>(run.model.modules.size()); ++m) {
    const auto& mod = run.model.modules[static_cast<std::size_t>(m)];
    SCOPED_TRACE(mod.name);
    if (mod.role == spec::Role::loss) continue;
    if (mod.frozen) {
      ++frozen;
      EXPECT_DOUBLE_EQ(cost.state_bytes(m, 8).weights, 2);
      EXPECT_EQ(cost.sharded_traffic_seconds(m, 1e9, dp), 0);
    } else {
      EXPECT_DOUBLE_EQ(cost.state_bytes(m, 8).weights, 2.0 / 8);
      EXPECT_GT(cost.sharded_traffic_seconds(m, 1e9, dp), 0);
    }
  }
  EXPECT_EQ(frozen, 1);
}

TEST(Cost, GroupShapes) {
  auto g = cost::group_shape(0, 1, 16, 8);
  EXPECT_EQ(g.nodes, 2);
  EXPECT_EQ(g.per_node, 8);
  g = cost::group_shape(0, 8, 4, 8);  // one member per node (TP = 8 below it)
  EXPECT_EQ(g.nodes, 4);
  EXPECT_EQ(g.per_node, 1);
  g = cost::group_shape(4, 1, 8, 8);  // straddles a node boundary
  EXPECT_EQ(g.nodes, 2);
  EXPECT_EQ(g.per_node, 4);
  g = cost::group_shape(1, 2, 4, 8);
  EXPECT_EQ(g.nodes, 1);
  EXPECT_EQ(g.per_node, 4);
}

TEST(Cost, AllReduceIsTheCheaperOfRingAndTree) {
  auto run = test::load("gpt-175b-1024gpu.yaml");
  cost::CommModel comm(run.cluster);
  // 8 GPUs on NVLink: 300 GB/s x 0.77, 1.9 us per step.
  const double bw = 300e9 * 0.77, alpha = 1.9e-6, bytes = 1e9;
  auto node = cost::group_shape(0, 1, 8, 8);
  double ring = 2 * 7.0 / 8 * bytes / bw + 2 * 7 * alpha;
  double tree = 2 * bytes / bw + 2 * 3 * alpha;
  EXPECT_DOUBLE_EQ(comm.all_reduce(bytes, node), std::min(ring, tree));
  // Small messages take the tree's log-depth latency.
  EXPECT_DOUBLE_EQ(comm.all_reduce(8, node), 2 * 8 / bw + 2 * 3 * alpha);
  // Across 4 nodes with one member each: one 25 GB/s port x 0.96, 4 us per step.
  auto spread = cost::group_shape(0, 8, 4, 8);
  double inter = 25e9 * 0.96;
  EXPECT_DOUBLE_EQ(comm.bus_bandwidth(spread), inter);
  EXPECT_DOUBLE_EQ(comm.all_gather(bytes, spread), 3.0 / 4 * bytes / inter + 3 * 4e-6);
  // Eight members per node drive eight ports, capped by NVLink.
  EXPECT_DOUBLE_EQ(comm.bus_bandwidth(cost::group_shape(0, 1, 32, 8)), std::min(8 * inter, bw));
  EXPECT_EQ(comm.all_reduce(bytes, cost::group_shape(0, 1, 1, 8)), 0.0);
}

TEST(Cost, GemmEfficiencyInterpolatesInLogSize) {
  auto run = test::load("gpt-175b-1024gpu.yaml");
  cost::DeviceModel dev(run.cluster, spec::Precision::bf16);
  EXPECT_DOUBLE_EQ(dev.gemm_efficiency(1e9), 0.442);
  EXPECT_DOUBLE_EQ(dev.gemm_efficiency(128e9), 0.70);
  EXPECT_DOUBLE_EQ(dev.gemm_efficiency(1e15), 0.70);  // beyond the table: its last row
  EXPECT_DOUBLE_EQ(dev.gemm_efficiency(1e3), 0.074);  // below: its first row
  EXPECT_NEAR(dev.gemm_efficiency(4e9), 0.442 + (0.663 - 0.442) * std::log(4.0) / std::log(16.0), 1e-12);
  // A large square GEMM is compute bound at the table's efficiency.
  double n = 8192, flops = 2 * n * n * n;
  EXPECT_DOUBLE_EQ(dev.gemm_seconds(n, n, n), flops / (312e12 * dev.gemm_efficiency(flops)));
}

TEST(Cost, FrozenEncoderRunsNoBackward) {
  auto run = test::load("llava-13b-256gpu.yaml");
  cost::CostModel cost(run);
  EXPECT_FALSE(cost.grads(0).any());  // the vision tower is frozen and first
  const auto& vision = cost.module(0, 1, 1);
  EXPECT_EQ(vision.layer.backward_s, 0.0);
  EXPECT_EQ(vision.layer.activation_bytes, 0.0);
  EXPECT_TRUE(cost.grads(1).weights);            // the projector trains
  EXPECT_DOUBLE_EQ(cost.tokens(2), 576 + 1472);  // image tokens + text tokens reach the llm
}

// Each Megatron-Core setting moves the estimate the way it should, from the same model:
// userbuffers hide TP collectives, FP8 shortens the linear layers' GEMMs, unfused
// kernels cost more element passes, the overlapped parameter all-gather leaves less DP
// time exposed.
TEST(Cost, MegatronCoreSettingsEachPriceTheirMechanism) {
  auto base = test::load("megatron-core-h100/llama2-70b-64gpu.yaml");
  auto estimate = [](const spec::RunSpec& run) {
    cost::CostModel cost(run);
    return orchestrate::make_plan(cost, plan::PlanRequest{plan::Strategy::megatron, {4, 4, 0}, {}}).best.estimate;
  };
  const auto all = estimate(base);
  auto run = base;
  run.training.tp_comm_overlap = false;
  const auto no_ub = estimate(run);
  EXPECT_GT(no_ub.tp_comm_s, 1.5 * all.tp_comm_s);
  EXPECT_GT(no_ub.iteration_time_s, all.iteration_time_s);
  run = base;
  run.training.fp8 = false;
  const auto bf16 = estimate(run);
  EXPECT_GT(bf16.compute_s, 1.3 * all.compute_s);
  run = base;
  run.training.fused_kernels = false;
  EXPECT_GT(estimate(run).compute_s, all.compute_s);
  run = base;
  run.training.overlap_param_gather = false;
  EXPECT_GT(estimate(run).dp_comm_s, all.dp_comm_s);
}

// Sequence parallelism's backward, per half of a layer: the output gradient's all-gather (the
// reduce-scatter's backward), the column-parallel layer's input gathered again (it kept its
// shard) and its input gradient reduce-scattered. braid's trainer runs them one after another
// and all-reduces the norm's weight gradients (NnParallel.ASequenceParallelLayerRunsThe...);
// Megatron-LM hides the gather under the input-gradient GEMM and the reduce-scatter under the
// weight-gradient GEMM, and with userbuffers the output gradient's gather under the
// row-parallel layer's input-gradient GEMM.
TEST(Cost, ASequenceParallelBackwardGathersTheColumnLayersInputAgain) {
  auto run = test::load("tiny-mllm.yaml");
  run.training.sequence_parallel = true;
  // At TP 2 Megatron's hidden collectives happen to cost what one all-reduce did: TP 4.
  const int llm = run.model.index_of("llm"), tp = 4, b = 4;
  const auto& m = run.model.modules[static_cast<std::size_t>(llm)];
  auto sums = [&](const spec::RunSpec& r, cost::Kernels kernels, double* ag, double* rs, double* norm_ar) {
    const cost::CostModel cost(r, {}, kernels);
    const double E = cost.device().element_bytes(), sbh = cost.tokens(llm) * b * m.hidden;
    const cost::GroupShape group = cost::group_shape(0, 1, tp, r.cluster.devices_per_node);
    *ag = cost.comm().all_gather(sbh * E, group);
    *rs = cost.comm().reduce_scatter(sbh * E, group);
    *norm_ar = cost.comm().all_reduce(2.0 * m.hidden * 4, group);
    return cost.layer_kernels(llm, tp, b);
  };
  auto comm = [](const std::vector<cost::LayerKernel>& ks, bool backward) {
    double s = 0;
    for (const auto& k : ks) s += backward ? k.cost.comm_backward_s : k.cost.comm_forward_s;
    return s;
  };
  auto collectives = [](const std::vector<cost::LayerKernel>& ks, bool backward) {
    double n = 0;
    for (const auto& k : ks) n += backward ? k.cost.collectives_backward : k.cost.collectives_forward;
    return n;
  };
  double ag = 0, rs = 0, norm_ar = 0;
  const auto trainer = sums(run, cost::Kernels::reference, &ag, &rs, &norm_ar);
  ASSERT_GT(ag, 0);
  EXPECT_NEAR(comm(trainer, true), 2 * (2 * ag + rs + norm_ar), 1e-15);
  EXPECT_GT(comm(trainer, true), comm(trainer, false) + 2 * ag);  // the forward gathers once a half

  // Megatron: kernels [1] qkv and [6] mlp up are column-parallel, [3] and [7] row-parallel.
  auto hidden = [&](double c, double gemm) { return std::max(c / tp, c - gemm); };
  const auto megatron = sums(run, cost::Kernels::megatron, &ag, &rs, &norm_ar);
  double want = 0;
  for (int column : {1, 6}) {
    const double half = megatron[static_cast<std::size_t>(column)].cost.backward_s / 2;
    want += ag + hidden(ag, half) + hidden(rs, half);
  }
  EXPECT_NEAR(comm(megatron, true), want, 1e-15);
  // Each of the three leaves a part exposed; the norms' gradients are summed once a step.
  EXPECT_EQ(collectives(megatron, false), 4);
  EXPECT_EQ(collectives(megatron, true), 6);
  auto overlap = run;
  overlap.training.tp_comm_overlap = true;
  const auto userbuffers = sums(overlap, cost::Kernels::megatron, &ag, &rs, &norm_ar);
  want = 0;
  for (const auto& [column, row] : {std::pair{1, 3}, std::pair{6, 7}}) {
    const double half = userbuffers[static_cast<std::size_t>(column)].cost.backward_s / 2;
    const double row_half = userbuffers[static_cast<std::size_t>(row)].cost.backward_s / 2;
    want += hidden(ag, row_half) + hidden(ag, half) + hidden(rs, half);
  }
  EXPECT_NEAR(comm(userbuffers, true), want, 1e-15);

  // A frozen llm (its input gradients still wanted, for the modules before it): no norm
  // gradients to sum; Megatron gathers nothing again and has no weight-gradient GEMM to hide
  // the reduce-scatter under.
  auto frozen = run;
  frozen.model.modules[static_cast<std::size_t>(llm)].frozen = true;
  const auto frozen_trainer = sums(frozen, cost::Kernels::reference, &ag, &rs, &norm_ar);
  EXPECT_NEAR(comm(frozen_trainer, true), 2 * (2 * ag + rs), 1e-15);
  const auto frozen_megatron = sums(frozen, cost::Kernels::megatron, &ag, &rs, &norm_ar);
  EXPECT_NEAR(comm(frozen_megatron, true), 2 * (ag + rs), 1e-15);
  EXPECT_EQ(collectives(frozen_trainer, true), 6);
  EXPECT_EQ(collectives(frozen_megatron, true), 4);
}

// Every TP collective the cost model prices is counted where it is priced (the waits the
// bubble scheduler's fine pass fills): a layer's two all-reduces each way, the vocab-parallel
// embedding's one, the head's row max and sum forward and its input gradient backward;
// full recomputation runs the forward's again; nothing without tensor parallelism.
TEST(Cost, EveryTpCollectiveIsCountedWhereItIsPriced) {
  auto count = [](spec::RunSpec run, int tp) {
    const cost::CostModel cost(run, {}, cost::Kernels::megatron);
    const auto& m = cost.module(run.model.index_of("llm"), tp, 2);
    return std::array<double, 6>{m.layer.collectives_forward, m.layer.collectives_backward,
                                 m.first.collectives_forward, m.first.collectives_backward,
                                 m.last.collectives_forward,  m.last.collectives_backward};
  };
  const auto run = test::load("tiny-mllm.yaml");
  EXPECT_EQ(count(run, 2), (std::array<double, 6>{2, 2, 1, 0, 2, 1}));
  EXPECT_EQ(count(run, 1), (std::array<double, 6>{}));
  auto full = run;
  full.training.recompute = spec::Recompute::full;
  EXPECT_EQ(count(full, 2), (std::array<double, 6>{2, 4, 1, 0, 2, 1}));
  auto userbuffers = run;
  userbuffers.training.sequence_parallel = true;
  userbuffers.training.tp_comm_overlap = true;
  EXPECT_EQ(count(userbuffers, 2), (std::array<double, 6>{4, 6, 1, 0, 2, 1}));
}

// The trainer's images: a microbatch runs one pass per image side. Priced as those passes,
// the modules that see image tokens cost the mean microbatch and keep the largest one's
// activations; a module that sees no image (CLIP's text tower) keeps its nominal price.
TEST(Cost, TrainedImagesArePricedAsTheirPassesBySide) {
  auto run = test::load("tiny-clip.yaml");  // 32 px nominal, 8 px patches, microbatches of 16
  const int image = run.model.index_of("image_encoder"), text = run.model.index_of("text_encoder");
  const cost::CostModel nominal(run);
  // Every image at the nominal side: one pass per microbatch, the nominal price.
  const cost::CostModel same(run, cost::TrainedSamples{cost::at_sides(std::vector<int>(64, 32))});
  EXPECT_DOUBLE_EQ(same.module(image, 1, 16).layer.forward_s, nominal.module(image, 1, 16).layer.forward_s);
  // Microbatches alternately all 16 px and all 32 px: the mean of the two prices, the 32 px one's activations.
  std::vector<int> sides;
  for (int mb = 0; mb < 4; ++mb) sides.insert(sides.end(), 16, mb % 2 ? 32 : 16);
  const cost::CostModel mixed(run, cost::TrainedSamples{cost::at_sides(sides)});
  auto small_run = run;
  small_run.data.image_resolution = 16;
  const cost::CostModel small(small_run);
  const auto& big = nominal.module(image, 1, 16).layer;
  const auto& got = mixed.module(image, 1, 16).layer;
  EXPECT_NEAR(got.forward_s, (big.forward_s + small.module(image, 1, 16).layer.forward_s) / 2, 1e-12);
  EXPECT_NEAR(got.flops_backward, (big.flops_backward + small.module(image, 1, 16).layer.flops_backward) / 2, 1);
  EXPECT_DOUBLE_EQ(got.activation_bytes, big.activation_bytes);
  EXPECT_DOUBLE_EQ(got.parameters, big.parameters);
  // One microbatch of both sides: two passes of 8, each its own smaller GEMMs.
  std::vector<int> halves(8, 16);
  halves.insert(halves.end(), 8, 32);
  const cost::CostModel split(run, cost::TrainedSamples{cost::at_sides(halves)});
  EXPECT_NEAR(split.module(image, 1, 16).layer.forward_s,
              nominal.module(image, 1, 8).layer.forward_s + small.module(image, 1, 8).layer.forward_s, 1e-12);
  // The text tower sees no image.
  EXPECT_DOUBLE_EQ(mixed.module(text, 1, 16).layer.forward_s, nominal.module(text, 1, 16).layer.forward_s);
  // The kernels of a layer follow the same passes.
  double kernels = 0;
  for (const auto& k : mixed.layer_kernels(image, 1, 16)) kernels += k.cost.forward_s;
  EXPECT_NEAR(kernels, got.forward_s, 1e-12);
}

// A recomputed layer holds one pass's recomputation at a time where each pass runs its own
// backward, and every pass's where all of a microbatch's passes recompute the layer at once
// (a colocated encoder run kernel by kernel).
TEST(Cost, ARecomputedLayerHoldsOnePassAtATimeOrEveryPassAtOnce) {
  auto run = test::load("tiny-clip.yaml");  // 32 px nominal, microbatches of 16
  run.training.recompute = spec::Recompute::full;
  const int image = run.model.index_of("image_encoder");
  std::vector<int> halves(8, 16);  // one microbatch of two passes: 8 images of 16 px, 8 of 32 px
  halves.insert(halves.end(), 8, 32);
  const cost::CostModel split(run, cost::TrainedSamples{cost::at_sides(halves)});
  auto small_run = run;
  small_run.data.image_resolution = 16;
  const cost::CostModel nominal(run), small(small_run);
  const double big_pass = nominal.module(image, 1, 8).layer.recompute_bytes;
  const double small_pass = small.module(image, 1, 8).layer.recompute_bytes;
  ASSERT_GT(small_pass, 0);
  EXPECT_DOUBLE_EQ(split.module(image, 1, 16).layer.recompute_bytes, std::max(big_pass, small_pass));
  EXPECT_DOUBLE_EQ(split.module(image, 1, 16).recompute_bytes_all_passes, big_pass + small_pass);
  EXPECT_DOUBLE_EQ(nominal.module(image, 1, 16).recompute_bytes_all_passes,
                   nominal.module(image, 1, 16).layer.recompute_bytes);  // one pass: the same
}

// The trainer's captions: a text runs padded to the longest caption of its batch, the whole
// microbatch for a text tower, each image side's pass for an llm (tokens_of per side group).
TEST(Cost, TrainedCaptionsArePricedAtTheirBatchesLongest) {
  auto run = test::load("tiny-clip.yaml");  // 12 text tokens nominal, microbatches of 16
  const int image = run.model.index_of("image_encoder"), text = run.model.index_of("text_encoder");
  const cost::CostModel nominal(run);
  // Captions of 5 tokens but one of 8 in each microbatch: the text tower runs 8 positions.
  std::vector<cost::TrainedSample> samples;
  for (int i = 0; i < 64; ++i) samples.push_back({32, i % 16 == 3 ? 8 : 5});
  const cost::CostModel trained(run, cost::TrainedSamples{samples});
  spec::RunSpec eight = run;
  eight.data.text_tokens = 8;
  const cost::CostModel at_eight(eight);
  EXPECT_NEAR(trained.module(text, 1, 16).layer.forward_s, at_eight.module(text, 1, 16).layer.forward_s, 1e-15);
  EXPECT_LT(trained.module(text, 1, 16).layer.forward_s, nominal.module(text, 1, 16).layer.forward_s);
  // The image tower sees no text.
  EXPECT_DOUBLE_EQ(trained.module(image, 1, 16).layer.forward_s, nominal.module(image, 1, 16).layer.forward_s);

  // An llm: each image side's pass pads its own captions (16 px images with 4-token captions,
  // 32 px ones with 10-token captions, in each microbatch of 4).
  auto mllm = test::load("tiny-mllm.yaml");
  const int llm = mllm.model.index_of("llm");
  std::vector<cost::TrainedSample> mixed;
  for (int i = 0; i < 64; ++i) mixed.push_back(i % 2 ? cost::TrainedSample{32, 10} : cost::TrainedSample{16, 4});
  const cost::CostModel priced(mllm, cost::TrainedSamples{mixed});
  auto pass = [&](int side, int tokens) {
    spec::RunSpec r = mllm;
    r.data.image_resolution = side;
    r.data.text_tokens = tokens;
    return cost::CostModel(r).module(llm, 1, 2).layer.forward_s;
  };
  EXPECT_NEAR(priced.module(llm, 1, 4).layer.forward_s, pass(16, 4) + pass(32, 10), 1e-15);
}

TEST(Cost, ZeroHoldsWholeGradientsAndGatheredWeightsInsideAnInstruction) {
  // Beside the shards: ZeRO-2 a unit's whole gradients until its reduce-scatter, ZeRO-3 also its
  // gathered weights. braid's trainer (train/zero.hpp) gathers the whole part for a stage-3
  // backward, and holds its whole gradients where a microbatch makes several passes (image
  // sides), else the rest's and one layer's; DeepSpeed's per-module gather and reduction one
  // unit. Bytes per parameter from state_bytes unsharded (fp32: 4 and 4). tiny-mllm's llm: 2
  // layers of 198,272 and 12,544 more.
  auto run = test::load("tiny-mllm.yaml");
  run.training.precision = spec::Precision::fp32;
  const int llm = 2, layers = 2;
  const double layer = 198272, rest = 12544, part = layers * layer + rest;
  cost::TrainedSamples sides;  // microbatches of 4 at two sides each: 16, 16, 32, 32
  for (int i = 0; i < 16; ++i) sides.samples.push_back({i % 4 < 2 ? 16 : 32, 0});
  for (int zero = 0; zero <= 3; ++zero) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    run.training.zero_stage = zero;
    const cost::CostModel one(run, {}, cost::Kernels::reference), several(run, sides, cost::Kernels::reference),
        megatron(run);
    EXPECT_EQ(one.most_passes(llm, 4), 1);
    EXPECT_EQ(several.most_passes(llm, 4), 2);
    const cost::StateBytes a = one.in_instruction_bytes(llm, 4, layers, layer, rest, 2),
                           b = several.in_instruction_bytes(llm, 4, layers, layer, rest, 2),
                           c = megatron.in_instruction_bytes(llm, 4, layers, layer, rest, 2);
    EXPECT_EQ(a.gradients, zero >= 2 ? 4 * (rest + layer) : 0);
    EXPECT_EQ(b.gradients, zero >= 2 ? 4 * part : 0);
    EXPECT_EQ(c.gradients, zero >= 2 ? 4 * layer : 0);
    EXPECT_EQ(a.weights, zero == 3 ? 4 * part : 0);
    EXPECT_EQ(b.weights, a.weights);
    EXPECT_EQ(c.weights, zero == 3 ? 4 * layer : 0);
    EXPECT_EQ(a.optimizer + b.optimizer + c.optimizer, 0);
    EXPECT_EQ(several.in_instruction_bytes(llm, 4, layers, layer, rest, 1).total(), 0);  // nothing sharded
    // A part without layers (a projector; a middle stage's rest is 0) is one unit.
    EXPECT_EQ(megatron.in_instruction_bytes(llm, 4, 0, layer, rest, 2).gradients, zero >= 2 ? 4 * rest : 0);
  }
  run.model.modules[llm].frozen = true;  // kept whole, never gathered (state_bytes)
  EXPECT_EQ(cost::CostModel(run).in_instruction_bytes(llm, 4, layers, layer, rest, 2).total(), 0);
}

TEST(Cost, BraidsCollectivesCopyOneUnitAtATimeThroughPaddedShards) {
  // train/comm_buffer.hpp: a ZeRO unit of n floats goes through dp shards of ceil(n / dp) and
  // this rank's shard; without ZeRO the all-reduce sums in place, laid out. 3 layers of 1,001
  // parameters and a rest of 10 over 4 replicas: a layer pads to 4 x 251, + 251.
  auto run = test::load("tiny-mllm.yaml");
  const int llm = 2, layers = 3;
  const double layer = 1001, rest = 10, unit = 4.0 * (4 * 251 + 251);
  for (int zero = 0; zero <= 3; ++zero) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    run.training.zero_stage = zero;
    const cost::CostModel ours(run, {}, cost::Kernels::reference), megatron(run);
    const auto b = ours.collective_buffer_bytes(llm, layers, layer, rest, 4);
    EXPECT_EQ(b.inside, zero >= 2 ? unit : 0);
    EXPECT_EQ(b.step_end, zero == 1 || zero == 2 ? unit : 0);
    // The rest alone (a projector, the ends of a pipeline): 4 x 3 + 3.
    EXPECT_EQ(ours.collective_buffer_bytes(llm, 0, layer, rest, 4).inside, zero >= 2 ? 4.0 * 15 : 0);
    const auto none = megatron.collective_buffer_bytes(llm, layers, layer, rest, 4);
    EXPECT_EQ(none.inside + none.step_end, 0);  // Megatron reduces and gathers in place
    const auto alone = ours.collective_buffer_bytes(llm, layers, layer, rest, 1);
    EXPECT_EQ(alone.inside + alone.step_end, 0);  // no DP group, no collective
  }
  run.model.modules[llm].frozen = true;  // no gradient to reduce
  const auto frozen =
      cost::CostModel(run, {}, cost::Kernels::reference).collective_buffer_bytes(llm, layers, layer, rest, 4);
  EXPECT_EQ(frozen.inside + frozen.step_end, 0);
}

}  // namespace
}  // namespace braid
