// braid train --profile-ops: TimedOps forwards every op and records the sizes each call ran
// on; the cost model prices a call with the rule its blocks price the same kernel with.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "core/cost/cost_model.hpp"
#include "core/nn/host_ops.hpp"
#include "core/nn/timed_ops.hpp"
#include "core/train/op_profile.hpp"
#include "tests/unit/support.hpp"

namespace braid {
namespace {

using nn::Tensor;

Tensor random(nn::Shape shape, std::uint32_t seed) {
  Tensor t(std::move(shape));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < t.numel(); ++i) t.data[static_cast<std::size_t>(i)] = normal(rng);
  return t;
}

std::vector<float> values(const Tensor& t) { return {t.data.begin(), t.data.end()}; }

TEST(TimedOps, ForwardsEveryCallAndRecordsItsSizes) {
  nn::HostOps host(1);
  nn::TimedOps timed(host);
  const Tensor x = random({2, 3, 4}, 1), w = random({5, 4}, 2), b = random({5}, 3), dy = random({2, 3, 5}, 4);
  Tensor y, direct;
  timed.linear_forward(x, w, &b, y);
  host.linear_forward(x, w, &b, direct);
  EXPECT_EQ(values(y), values(direct));  // forwarded as it is
  Tensor dx, dw({5, 4});
  timed.linear_backward(x, w, dy, &dx, &dw, nullptr);
  timed.linear_backward(x, w, dy, nullptr, &dw, nullptr);
  const Tensor q = random({2, 6, 8}, 5), k = random({2, 6, 8}, 6), v = random({2, 6, 8}, 7);
  Tensor attn;
  nn::AttentionSaved saved;
  timed.attention_forward(q, k, v, nn::AttentionOptions{2, true}, attn, saved);
  timed.set_recording(false);
  Tensor y2;
  timed.gelu_forward(x, y2);  // runs, untimed
  EXPECT_EQ(y2.numel(), x.numel());
  timed.set_recording(true);
  timed.add(y2, x);
  timed.add(y2, x);

  std::map<std::string, std::array<int64_t, 5>> dims;
  std::map<std::string, long> calls;
  for (const auto& [call, t] : timed.calls()) {
    const std::string key = std::string(call.op) + (call.op == "linear_backward" ? std::to_string(call.dims[3]) : "");
    dims[key] = call.dims;
    calls[key] += t.calls;
    EXPECT_GE(t.seconds, 0.0);
  }
  EXPECT_EQ(dims["linear_forward"], (std::array<int64_t, 5>{6, 5, 4, 0, 0}));     // rows, out, in
  EXPECT_EQ(dims["linear_backward3"], (std::array<int64_t, 5>{6, 5, 4, 3, 0}));   // dx and dweight
  EXPECT_EQ(dims["linear_backward2"], (std::array<int64_t, 5>{6, 5, 4, 2, 0}));   // dweight alone
  EXPECT_EQ(dims["attention_forward"], (std::array<int64_t, 5>{4, 6, 6, 4, 1}));  // 2 x 2 heads of 4, causal
  EXPECT_EQ(dims["add"], (std::array<int64_t, 5>{24, 0, 0, 0, 0}));
  EXPECT_EQ(calls["add"], 2);
  EXPECT_EQ(dims.count("gelu_forward"), 0u);
  const auto by_op = timed.by_op();
  EXPECT_EQ(by_op.at("linear_backward").calls, 2);
  for (const auto& [op, t] : by_op)
    EXPECT_NE(std::find(nn::kTimedOps.begin(), nn::kTimedOps.end(), op), nn::kTimedOps.end()) << op;
}

TEST(OpProfile, CallsArePricedAsTheBlocksPriceTheirKernels) {
  const spec::RunSpec run = test::load("tiny-clip.yaml");
  const cost::CostModel cost(run);
  const cost::DeviceModel& dev = cost.device();
  const double E = dev.element_bytes();
  auto price = [&](std::string_view op, std::array<int64_t, 5> dims) { return train::priced_call(cost, {op, dims}); };

  EXPECT_DOUBLE_EQ(*price("linear_forward", {256, 512, 128}), dev.gemm_seconds(256, 512, 128));
  EXPECT_DOUBLE_EQ(*price("linear_backward", {256, 512, 128, 3}),
                   dev.gemm_seconds(256, 128, 512) + dev.gemm_seconds(128, 512, 256));
  EXPECT_DOUBLE_EQ(*price("linear_backward", {256, 512, 128, 2}), dev.gemm_seconds(128, 512, 256));
  EXPECT_DOUBLE_EQ(*price("add", {1000}), dev.stream_seconds(3 * 1000 * E));
  EXPECT_DOUBLE_EQ(*price("adamw_step", {1000}), dev.optimizer_memory_seconds(32 * 1000));
  EXPECT_DOUBLE_EQ(*price("embedding_forward", {192, 64}), dev.stream_seconds(2 * 192 * 64 * E));  // a row gather
  // A patch embedding's backward is its weight's gradient: no GEMM for the pixels'.
  EXPECT_DOUBLE_EQ(*price("patch_embedding_forward", {144, 64, 192, 0}), dev.gemm_seconds(144, 64, 192));
  EXPECT_DOUBLE_EQ(*price("patch_embedding_backward", {144, 64, 192, 1}), dev.gemm_seconds(192, 64, 144));
  EXPECT_DOUBLE_EQ(*price("patch_embedding_backward", {144, 64, 192, 0}), 0.0);
  EXPECT_GT(*price("layernorm_backward", {4096}), 0);
  // The CLIP loss as the batch-sync step prices it: a share of the rows (16 of 128) takes each
  // direction's logits and the local and gathered rows' gradients, six GEMMs, and two
  // softmaxes of 16 x 128 logits each way; every row, one matrix for both directions, three
  // GEMMs (Megatron's kernels: a single-process loss); without gradients, the logits and
  // softmaxes alone. Fills and scales as streams.
  const double softmaxes = 2 * 2 * 16 * 128 * E, whole_softmaxes = 2 * 2 * 128 * 128 * E;
  EXPECT_DOUBLE_EQ(
      *price("contrastive_loss", {16, 128, 32, 1}),
      6 * dev.gemm_seconds(16, 128, 32) + dev.memory_seconds(softmaxes) + dev.backward_memory_seconds(2 * softmaxes));
  EXPECT_DOUBLE_EQ(*price("contrastive_loss", {16, 128, 32, 0}),
                   2 * dev.gemm_seconds(16, 128, 32) + dev.memory_seconds(softmaxes));
  EXPECT_DOUBLE_EQ(*price("contrastive_loss", {128, 128, 32, 1}), 3 * dev.gemm_seconds(128, 128, 32) +
                                                                      dev.memory_seconds(whole_softmaxes) +
                                                                      dev.backward_memory_seconds(2 * whole_softmaxes));
  EXPECT_DOUBLE_EQ(*price("scale", {100}), dev.stream_seconds(2 * 100 * E));
  EXPECT_DOUBLE_EQ(*price("zero", {100}), dev.stream_seconds(100 * E));
  EXPECT_DOUBLE_EQ(*price("squared_norm", {100}), dev.stream_seconds(100 * E));
  // Every op has a price but the copies between host and device (none on a host).
  std::set<std::string_view> unpriced;
  for (std::string_view op : nn::kTimedOps) {
    const auto p = price(op, {8, 8, 8, 1, 1});
    if (p)
      EXPECT_GT(*p, 0) << op;
    else
      unpriced.insert(op);
  }
  EXPECT_EQ(unpriced, (std::set<std::string_view>{"copy to device", "copy to host"}));

  // The attention core of a call is the layer kernel the simulator charges for it, and the
  // layer's norms and GELU are what their calls are priced: the same rules, not a copy.
  const int text = 1;
  ASSERT_EQ(run.model.modules[text].name, "text_encoder");
  const auto& m = run.model.modules[text];
  const int samples = 16;
  const int64_t s = static_cast<int64_t>(cost.tokens(text)), heads = m.heads, d = m.hidden / m.heads;
  const auto kernels = cost.layer_kernels(text, 1, samples);
  EXPECT_DOUBLE_EQ(*price("attention_forward", {samples * heads, s, s, d, 1}), kernels[2].cost.forward_s);
  EXPECT_DOUBLE_EQ(*price("attention_backward", {samples * heads, s, s, d, 1}), kernels[2].cost.backward_s);
  const int64_t tokens = samples * s;
  EXPECT_NEAR(*price("layernorm_forward", {tokens * m.hidden}) + *price("gelu_forward", {tokens * m.ffn}),
              kernels[5].cost.forward_s - dev.stream_seconds(cost::residual_bytes(tokens * m.hidden, E)),
              1e-12);  // kernel 5: the MLP's norm and activation, and its residual add
  // Backward: the norm's and the activation's, and the residual's gradient as two adds.
  EXPECT_NEAR(*price("layernorm_backward", {tokens * m.hidden}) + *price("gelu_backward", {tokens * m.ffn}) +
                  2 * *price("add", {tokens * m.hidden}),
              kernels[5].cost.backward_s, 1e-12);
}

TEST(OpProfile, ReferenceKernelsArePricedAsBraidsModulesRunThem) {
  const spec::RunSpec run = test::load("tiny-clip.yaml");
  const cost::CostModel megatron(run), reference(run, {}, cost::Kernels::reference);
  const cost::DeviceModel& dev = reference.device();
  const double E = dev.element_bytes();
  auto price = [&](std::string_view op, std::array<int64_t, 5> dims) {
    return *train::priced_call(reference, {op, dims});
  };
  // braid's patch embedding copies the patches out of the image, in forward and backward.
  EXPECT_DOUBLE_EQ(price("patch_embedding_forward", {144, 64, 192, 0}),
                   dev.gemm_seconds(144, 64, 192) + dev.stream_seconds(2 * 144 * 192 * E));
  EXPECT_DOUBLE_EQ(price("patch_embedding_backward", {144, 64, 192, 1}),
                   dev.gemm_seconds(192, 64, 144) + dev.stream_seconds(2 * 144 * 192 * E));

  // nn::TransformerBlock's q, k and v: three linears, and their input gradients added twice.
  const int text = 1, samples = 16;
  const auto& m = run.model.modules[text];
  const int64_t tokens = samples * static_cast<int64_t>(reference.tokens(text)), h = m.hidden;
  const auto qkv = reference.layer_kernels(text, 1, samples)[1].cost;
  EXPECT_NEAR(qkv.forward_s, 3 * price("linear_forward", {tokens, h, h}), 1e-12);
  EXPECT_NEAR(qkv.backward_s, 3 * price("linear_backward", {tokens, h, h, 3}) + 2 * price("add", {tokens * h}), 1e-12);
  // Megatron's fused projection is one GEMM three times as wide.
  EXPECT_DOUBLE_EQ(megatron.layer_kernels(text, 1, samples)[1].cost.forward_s, dev.gemm_seconds(tokens, 3 * h, h));

  // braid's batch-sync hands its loss the gathered rows apart from the local ones, so even a
  // group of one rank runs six GEMMs (Megatron's kernels price the single-process form: three).
  const double softmaxes = 2 * 2 * 128 * 128 * E;
  const double rest = dev.memory_seconds(softmaxes) + dev.backward_memory_seconds(2 * softmaxes);
  EXPECT_DOUBLE_EQ(price("contrastive_loss", {128, 128, 32, 1}), 6 * dev.gemm_seconds(128, 128, 32) + rest);
  EXPECT_DOUBLE_EQ(*train::priced_call(megatron, {"contrastive_loss", {128, 128, 32, 1}}),
                   3 * dev.gemm_seconds(128, 128, 32) + rest);

  // The rest of a module's reference work comes on top of the fused pricing, never below it.
  for (int module : {0, 1}) {
    const cost::ModuleCost& a = megatron.module(module, 1, samples);
    const cost::ModuleCost& b = reference.module(module, 1, samples);
    EXPECT_GT(b.first.compute_time(), a.first.compute_time()) << module;  // position tables
    EXPECT_GT(b.last.compute_time(), a.last.compute_time()) << module;    // final norm, pooling
  }
}

TEST(OpProfile, TheTableSaysWhatIsPricedAndWhatRunsBetweenTheOps) {
  train::OpProfile p;
  p.steps = 10;
  p.ranks = 2;
  p.rows = {{"linear_forward", 4, 0.002, 0.001, true}, {"contrastive_loss", 1, 0.0005, 0, false}};
  const std::string text = train::format_op_profile(p, 0.004);
  EXPECT_NE(text.find("mean of 10 steps and 2 ranks"), std::string::npos) << text;
  EXPECT_NE(text.find("linear_forward"), std::string::npos);
  EXPECT_NE(text.find("2.00"), std::string::npos);  // measured/priced
  EXPECT_NE(text.find("priced ops: measured 2.00 ms, priced 1.00 ms: measured/priced 2.00; all ops 2.50 ms of the "
                      "instructions' measured compute 4.00 ms"),
            std::string::npos)
      << text;
  const std::string json = train::op_profile_json(p, 11);
  EXPECT_NE(json.find(R"("op_profile":true)"), std::string::npos) << json;
  EXPECT_NE(json.find(R"({"op":"contrastive_loss","calls":1.0,"measured_s":0.0005})"), std::string::npos) << json;
}

}  // namespace
}  // namespace braid
