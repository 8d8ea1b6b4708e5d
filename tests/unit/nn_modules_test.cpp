// The reference modules (core/nn/modules): finite-difference checks of every parameter and
// input gradient of each module and of whole models, deterministic initialisation, a few
// AdamW steps that lower the CLIP and the LM loss of the shipped tiny models, build_model
// on the shipped configs, and the errors for what the reference models do not build.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/nn/host_ops.hpp"
#include "core/nn/modules/model.hpp"
#include "core/nn/optim.hpp"
#include "tests/unit/support.hpp"

namespace braid {
namespace {

using nn::Shape;
using nn::Tensor;

Tensor random_tensor(Shape shape, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  Tensor t(std::move(shape));
  std::uniform_real_distribution<float> u(lo, hi);
  for (float& x : t.data) x = u(rng);
  return t;
}

double dot(const Tensor& y, const Tensor& w) {
  EXPECT_EQ(y.shape, w.shape);
  double s = 0.0;
  for (std::size_t i = 0; i < y.data.size(); ++i) s += static_cast<double>(y.data[i]) * w.data[i];
  return s;
}

double max_abs(const Tensor& t) {
  double m = 0.0;
  for (float x : t.data) m = std::max(m, static_cast<double>(std::abs(x)));
  return m;
}

// Central differences of loss() (which reruns the forward) for every element of x against
// the analytic gradient, the error relative to max(1, |numeric|). float32 forwards: a step
// of 2e-3 keeps the rounding of the loss (~1e-7 relative, over 4e-3) and the truncation
// error of the central difference (~eps^2 times the third derivative, sizeable after a
// few layer norms) both well below the tolerance.
void expect_gradient(const std::string& what, Tensor& x, const Tensor& analytic, const std::function<double()>& loss,
                     bool zero = false, float eps = 2e-3f, double tolerance = 2e-3) {
  ASSERT_EQ(x.shape, analytic.shape) << what;
  if (zero) {
    EXPECT_LT(max_abs(analytic), 1e-5) << what << ": this gradient is zero in exact arithmetic";
  } else {
    EXPECT_GT(max_abs(analytic), 1e-4) << what << ": the gradient is zero, the check would prove nothing";
  }
  double worst = 0.0, worst_numeric = 0.0;
  std::size_t worst_at = 0;
  for (std::size_t i = 0; i < x.data.size(); ++i) {
    const float saved = x.data[i];
    const float up = saved + eps, down = saved - eps;
    x.data[i] = up;
    const double plus = loss();
    x.data[i] = down;
    const double minus = loss();
    x.data[i] = saved;
    const double numeric = (plus - minus) / (static_cast<double>(up) - down);
    const double error = std::abs(numeric - analytic.data[i]) / std::max(1.0, std::abs(numeric));
    if (error > worst) {
      worst = error;
      worst_numeric = numeric;
      worst_at = i;
    }
  }
  EXPECT_LE(worst, tolerance) << what << ": element " << worst_at << " analytic " << analytic.data[worst_at]
                              << " numeric " << worst_numeric;
}

// Moves every parameter by uniform(-0.3, 0.3): the initial values (unit gains, zero biases,
// weights of 0.02) keep activations so small that the layer norms turn a finite-difference
// step into a large relative change; at these values the forward is smooth on its scale.
void perturb(const std::vector<nn::Parameter*>& params, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-0.3f, 0.3f);
  for (nn::Parameter* p : params)
    for (float& x : p->value.data) x += u(rng);
}

// Zeroes the parameters' gradients, runs `forward_backward` once, then checks every
// parameter against finite differences of `loss`. The key projection's bias adds the same
// q . b to every score of a query, which the softmax cancels: its gradient must be zero.
void expect_parameter_gradients(const std::vector<nn::Parameter*>& params,
                                const std::function<void()>& forward_backward, const std::function<double()>& loss) {
  for (nn::Parameter* p : params)
    if (p->trainable) nn::reset(p->grad, p->value.shape);
  forward_backward();
  for (nn::Parameter* p : params) {
    if (!p->trainable) continue;
    const Tensor analytic = p->grad;
    const std::string key_bias = "attn.k.bias";
    const bool zero = p->name.size() >= key_bias.size() &&
                      p->name.compare(p->name.size() - key_bias.size(), key_bias.size(), key_bias) == 0;
    expect_gradient(p->name, p->value, analytic, loss, zero);
  }
}

spec::ModelSpec model_from(const std::string& yaml) {
  return spec::parse_model(spec::parse_document(yaml, "<string>"));
}

// Token batch with ids in [4, vocab) (0-3: the tokenizer's specials), padded with 0.
nn::Tokens random_tokens(int64_t batch, int64_t length, std::vector<int32_t> lengths, int32_t vocab,
                         std::mt19937& rng) {
  nn::Tokens t{batch, length, std::vector<int32_t>(static_cast<std::size_t>(batch * length), 0), std::move(lengths)};
  std::uniform_int_distribution<int32_t> id(4, vocab - 1);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < t.lengths[static_cast<std::size_t>(b)]; ++i)
      t.ids[static_cast<std::size_t>(b * length + i)] = id(rng);
  return t;
}

TEST(NnModules, AddOpAccumulates) {
  nn::HostOps ops(1);
  Tensor y({2, 2}, {1, 2, 3, 4});
  ops.add(y, Tensor({2, 2}, {0.5f, -2, 0, 1}));
  EXPECT_EQ(y.data, (std::vector<float>{1.5f, 0, 3, 5}));
  test::expect_error([&] { ops.add(y, Tensor({4})); }, Status::invalid_argument, {"add", "(4,)", "(2, 2)"});
}

TEST(NnModules, InitDependsOnSeedAndNameOnly) {
  nn::ParameterStore a(7), b(7), c(8);
  a.create("other", {3}, nn::Init::normal(1.0f));
  const nn::Parameter& pa = a.create("block.weight", {200, 100}, nn::Init::normal(0.02f));
  const nn::Parameter& pb = b.create("block.weight", {200, 100}, nn::Init::normal(0.02f));  // made first here
  const nn::Parameter& pc = c.create("block.weight", {200, 100}, nn::Init::normal(0.02f));
  const nn::Parameter& renamed = b.create("block.weight2", {200, 100}, nn::Init::normal(0.02f));
  EXPECT_EQ(pa.value.data, pb.value.data);
  EXPECT_NE(pa.value.data, pc.value.data);
  EXPECT_NE(pa.value.data, renamed.value.data);
  // normal(0, 0.02): 20000 draws put the mean within 4 standard errors and the deviation within 2%.
  double sum = 0.0, sq = 0.0;
  for (float x : pa.value.data) {
    sum += x;
    sq += static_cast<double>(x) * x;
  }
  const double n = static_cast<double>(pa.value.numel()), mean = sum / n;
  EXPECT_NEAR(mean, 0.0, 4 * 0.02 / std::sqrt(n));
  EXPECT_NEAR(std::sqrt(sq / n - mean * mean), 0.02, 0.02 * 0.02);
  EXPECT_TRUE(pa.decay);
  const nn::Parameter& bias = a.create("block.bias", {5}, nn::Init::constant(0.5f));
  EXPECT_FALSE(bias.decay);
  EXPECT_EQ(bias.value.data, std::vector<float>(5, 0.5f));
  EXPECT_EQ(bias.grad.data, std::vector<float>(5, 0.0f));
  const nn::Parameter& frozen = a.create("frozen.weight", {2, 2}, nn::Init::normal(1.0f), false);
  EXPECT_TRUE(frozen.grad.data.empty());
  EXPECT_EQ(a.all().size(), 4u);
  EXPECT_EQ(a.all()[1]->name, "block.weight");
  test::expect_error([&] { a.create("block.bias", {5}, nn::Init::constant(0.0f)); }, Status::invalid_argument,
                     {"duplicate parameter name 'block.bias'"});
}

class NnBlock : public ::testing::TestWithParam<bool> {};

TEST_P(NnBlock, Gradients) {
  const bool causal = GetParam();
  std::mt19937 rng(11);
  nn::HostOps ops(1);
  nn::ParameterStore store(3);
  const nn::TransformerBlock block(store, "block", nn::TransformerShape{8, 2, 12, 1, causal}, false);
  perturb(block.parameters(), rng);
  Tensor x = random_tensor({2, 3, 8}, rng);
  const Tensor w = random_tensor({2, 3, 8}, rng);
  auto loss = [&] {
    nn::BlockCache cache;
    return dot(block.forward(ops, x, cache), w);
  };
  Tensor dx;
  expect_parameter_gradients(
      block.parameters(),
      [&] {
        nn::BlockCache cache;
        block.forward(ops, x, cache);
        dx = block.backward(ops, w, cache);
      },
      loss);
  expect_gradient("block dx", x, dx, loss);
  EXPECT_EQ(block.parameters().size(), 16u);  // 2 norms x 2, 6 linears x 2
  EXPECT_EQ(block.parameters().front()->name, "block.ln1.weight");
  EXPECT_EQ(block.parameters().back()->name, "block.mlp.fc2.bias");
}

INSTANTIATE_TEST_SUITE_P(BidirectionalAndCausal, NnBlock, ::testing::Bool());

TEST(NnModules, CausalBlockIgnoresLaterPositions) {
  std::mt19937 rng(12);
  nn::HostOps ops(1);
  nn::ParameterStore store(3);
  const nn::TransformerBlock block(store, "block", nn::TransformerShape{8, 2, 12, 1, true}, false);
  Tensor x = random_tensor({1, 4, 8}, rng);
  nn::BlockCache cache;
  const Tensor before = block.forward(ops, x, cache);
  for (int c = 0; c < 8; ++c) x.data[3 * 8 + c] += 1.0f;  // change the last position
  const Tensor after = block.forward(ops, x, cache);
  for (int i = 0; i < 3 * 8; ++i) EXPECT_EQ(before.data[i], after.data[i]);
  EXPECT_NE(before.data[3 * 8], after.data[3 * 8]);
}

TEST(NnModules, ImageEncoderGradients) {
  std::mt19937 rng(13);
  nn::HostOps ops(1);
  nn::ParameterStore store(4);
  const nn::ImageEncoder encoder(store, "vision", nn::ImageEncoderShape{{8, 2, 12, 2, false}, 4, 2, 16}, false);
  perturb(encoder.parameters(), rng);
  Tensor images = random_tensor({2, 2, 8, 12}, rng);  // a 2 x 3 patch grid: not square
  const Tensor w_tokens = random_tensor({2, 6, 8}, rng), w_pooled = random_tensor({2, 8}, rng);
  auto loss = [&] {
    nn::ImageEncoderCache cache;
    const nn::EncoderOutput out = encoder.forward(ops, images, cache);
    return dot(out.tokens, w_tokens) + dot(out.pooled, w_pooled);
  };
  Tensor dimages;
  expect_parameter_gradients(
      encoder.parameters(),
      [&] {
        nn::ImageEncoderCache cache;
        encoder.forward(ops, images, cache);
        dimages = encoder.backward(ops, &w_tokens, &w_pooled, cache, true);
      },
      loss);
  expect_gradient("vision dimages", images, dimages, loss);

  // The pooled output is the mean of the tokens; patch (r, c) sees row r's and column c's table.
  nn::ImageEncoderCache cache;
  const nn::EncoderOutput out = encoder.forward(ops, images, cache);
  ASSERT_EQ(out.tokens.shape, (Shape{2, 6, 8}));
  for (int b = 0; b < 2; ++b)
    for (int f = 0; f < 8; ++f) {
      double mean = 0.0;
      for (int n = 0; n < 6; ++n) mean += out.tokens.data[(b * 6 + n) * 8 + f] / 6.0;
      EXPECT_NEAR(out.pooled.data[b * 8 + f], mean, 1e-6);
    }
  EXPECT_EQ(cache.grid_rows, (std::vector<int32_t>{0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(cache.grid_cols, (std::vector<int32_t>{0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2}));
  // Another resolution, same weights; too large or off the patch grid is refused.
  EXPECT_EQ(encoder.forward(ops, random_tensor({1, 2, 16, 4}, rng), cache).tokens.shape, (Shape{1, 4, 8}));
  test::expect_error(
      [&] {
        encoder.forward(ops, random_tensor({1, 2, 20, 4}, rng), cache);
      },
      Status::invalid_argument, {"vision", "20 x 4", "exceed max_image_size 16"});
  test::expect_error(
      [&] {
        encoder.forward(ops, random_tensor({1, 2, 6, 8}, rng), cache);
      },
      Status::invalid_argument, {"vision", "not multiples of the patch size 4"});
}

// The colocated executor runs the encoder kernel by kernel (the bubble scheduler's tasks). The
// whole forward and backward run the blocks' kernels too; this checks the step state around
// them (embedding, hidden between blocks, final norm, the gradient between blocks): bit for
// bit the whole encoder, with two microbatches' steps interleaved without mixing their state.
TEST(NnModules, ImageEncoderStepByStepEqualsTheWholeEncoder) {
  std::mt19937 rng(15);
  nn::HostOps ops(1);
  nn::ParameterStore whole_store(4), steps_store(4);
  const nn::ImageEncoderShape shape{{8, 2, 12, 2, false}, 4, 2, 16};
  const nn::ImageEncoder whole(whole_store, "vision", shape, false), stepped(steps_store, "vision", shape, false);
  const Tensor a = random_tensor({2, 2, 8, 12}, rng), b = random_tensor({3, 2, 16, 16}, rng);
  const Tensor wa = random_tensor({2, 6, 8}, rng), wb = random_tensor({3, 16, 8}, rng);

  nn::ImageEncoderCache ca, cb;
  const nn::EncoderOutput oa = whole.forward(ops, a, ca), ob = whole.forward(ops, b, cb);
  whole.backward(ops, &wa, nullptr, ca);
  whole.backward(ops, &wb, nullptr, cb);

  nn::ImageEncoderSteps sa, sb;
  stepped.forward_embed(ops, a, sa);
  stepped.forward_embed(ops, b, sb);
  for (int layer = 0; layer < stepped.layers(); ++layer)
    for (int k = 0; k < nn::TransformerBlock::kKernels; ++k) {
      stepped.forward_kernel(ops, layer, k, sb);
      stepped.forward_kernel(ops, layer, k, sa);
    }
  const nn::EncoderOutput sa_out = stepped.forward_finish(ops, sa), sb_out = stepped.forward_finish(ops, sb);
  EXPECT_EQ(sa_out.tokens.data, oa.tokens.data);
  EXPECT_EQ(sb_out.tokens.data, ob.tokens.data);
  stepped.backward_start(ops, &wa, nullptr, sa);
  stepped.backward_start(ops, &wb, nullptr, sb);
  for (int layer = stepped.layers(); layer-- > 0;)
    for (int k = nn::TransformerBlock::kKernels; k-- > 0;) {
      stepped.backward_kernel(ops, layer, k, sa);
      stepped.backward_kernel(ops, layer, k, sb);
    }
  stepped.backward_embed(ops, sa);
  stepped.backward_embed(ops, sb);
  // Each parameter still receives a's gradient, then b's: the same sums.
  const auto& want = whole.parameters();
  const auto& got = stepped.parameters();
  ASSERT_EQ(want.size(), got.size());
  double largest = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    largest = std::max(largest, max_abs(want[i]->grad));
    EXPECT_EQ(got[i]->grad.data, want[i]->grad.data) << want[i]->name;
  }
  EXPECT_GT(largest, 1e-3);
  test::expect_error([&] { stepped.forward_kernel(ops, 0, nn::TransformerBlock::kKernels, sa); },
                     Status::invalid_argument, {"no forward kernel 9"});
  test::expect_error([&] { stepped.forward_kernel(ops, 2, 0, sa); }, Status::invalid_argument, {"no layer 2"});
}

// Recomputation keeps less from the forward and gives the same gradients bit for bit, whole
// or kernel by kernel (the colocated executor's way): full keeps each block's input alone,
// selective no attention probabilities.
TEST(NnModules, RecomputedBlocksGiveTheGradientsOfNoRecomputation) {
  const nn::ImageEncoderShape shape{{8, 2, 12, 2, false}, 4, 2, 16};
  for (spec::Recompute recompute : {spec::Recompute::full, spec::Recompute::selective}) {
    SCOPED_TRACE(spec::recompute_name(recompute));
    std::mt19937 rng(16);
    nn::HostOps ops(1);
    nn::ParameterStore plain_store(4), whole_store(4), steps_store(4);
    const nn::ImageEncoder plain(plain_store, "vision", shape, false);
    nn::ImageEncoder whole(whole_store, "vision", shape, false), stepped(steps_store, "vision", shape, false);
    whole.set_recompute(recompute);
    stepped.set_recompute(recompute);
    const Tensor images = random_tensor({2, 2, 8, 12}, rng), weights = random_tensor({2, 6, 8}, rng);

    nn::ImageEncoderCache plain_cache, cache;
    const nn::EncoderOutput want = plain.forward(ops, images, plain_cache);
    EXPECT_EQ(whole.forward(ops, images, cache).tokens.data, want.tokens.data);
    for (const nn::BlockCache& b : cache.transformer.blocks) {
      EXPECT_GT(b.x.numel(), 0);
      EXPECT_EQ(b.h1.numel() == 0, recompute == spec::Recompute::full);
      EXPECT_EQ(b.attention.probs.numel(), 0);
    }
    plain.backward(ops, &weights, nullptr, plain_cache);
    whole.backward(ops, &weights, nullptr, cache);

    nn::ImageEncoderSteps s;
    stepped.forward_embed(ops, images, s);
    for (int layer = 0; layer < stepped.layers(); ++layer)
      for (int k = 0; k < nn::TransformerBlock::kKernels; ++k) stepped.forward_kernel(ops, layer, k, s);
    EXPECT_EQ(stepped.forward_finish(ops, s).tokens.data, want.tokens.data);
    stepped.backward_start(ops, &weights, nullptr, s);
    for (int layer = stepped.layers(); layer-- > 0;)
      for (int k = nn::TransformerBlock::kKernels; k-- > 0;) stepped.backward_kernel(ops, layer, k, s);
    stepped.backward_embed(ops, s);
    for (const nn::BlockCache& b : s.cache.transformer.blocks)
      EXPECT_EQ(b.h1.numel() == 0, recompute == spec::Recompute::full);  // what it recomputed, dropped again

    double largest = 0;
    for (std::size_t i = 0; i < plain.parameters().size(); ++i) {
      const Tensor& expected = plain.parameters()[i]->grad;
      largest = std::max(largest, max_abs(expected));
      EXPECT_EQ(whole.parameters()[i]->grad.data, expected.data) << plain.parameters()[i]->name;
      EXPECT_EQ(stepped.parameters()[i]->grad.data, expected.data) << plain.parameters()[i]->name;
    }
    EXPECT_GT(largest, 1e-3);
  }
}

TEST(NnModules, TextEncoderGradientsAndPoolingAtTheLastToken) {
  std::mt19937 rng(14);
  nn::HostOps ops(1);
  nn::ParameterStore store(5);
  const nn::TextEncoder encoder(store, "text", nn::TextEncoderShape{{8, 2, 12, 2, true}, 9, 6}, false);
  perturb(encoder.parameters(), rng);
  const nn::Tokens tokens = random_tokens(2, 5, {5, 3}, 9, rng);
  const Tensor w_tokens = random_tensor({2, 5, 8}, rng), w_pooled = random_tensor({2, 8}, rng);
  auto loss = [&] {
    nn::TextEncoderCache cache;
    const nn::EncoderOutput out = encoder.forward(ops, tokens, cache);
    return dot(out.tokens, w_tokens) + dot(out.pooled, w_pooled);
  };
  expect_parameter_gradients(
      encoder.parameters(),
      [&] {
        nn::TextEncoderCache cache;
        encoder.forward(ops, tokens, cache);
        encoder.backward(ops, &w_tokens, &w_pooled, cache);
      },
      loss);

  nn::TextEncoderCache cache;
  const nn::EncoderOutput out = encoder.forward(ops, tokens, cache);
  for (int f = 0; f < 8; ++f) {
    EXPECT_EQ(out.pooled.data[f], out.tokens.data[(0 * 5 + 4) * 8 + f]);      // sample 0: 5 tokens
    EXPECT_EQ(out.pooled.data[8 + f], out.tokens.data[(1 * 5 + 2) * 8 + f]);  // sample 1: 3 tokens
  }
  // Causal: the pooled embedding does not depend on the padding after the caption.
  nn::Tokens longer{2, 6, {}, tokens.lengths};
  for (int b = 0; b < 2; ++b) {
    for (int t = 0; t < 5; ++t) longer.ids.push_back(tokens.ids[static_cast<std::size_t>(b * 5 + t)]);
    longer.ids.push_back(7);
  }
  const nn::EncoderOutput padded = encoder.forward(ops, longer, cache);
  for (int i = 0; i < 16; ++i) EXPECT_NEAR(padded.pooled.data[i], out.pooled.data[i], 1e-6);
  test::expect_error([&] { encoder.forward(ops, random_tokens(1, 7, {7}, 9, rng), cache); }, Status::invalid_argument,
                     {"text", "at most 6 (max_positions)"});
  test::expect_error(
      [&] {
        encoder.forward(ops, nn::Tokens{1, 3, {4, 5, 6}, {4}}, cache);
      },
      Status::invalid_argument, {"text", "sample 0 has 4 tokens, outside [1, 3]"});
}

TEST(NnModules, ProjectorGradients) {
  std::mt19937 rng(15);
  nn::HostOps ops(1);
  nn::ParameterStore store(6);
  const nn::Projector projector(store, "proj", 6, 10, 7, 2, false);
  perturb(projector.parameters(), rng);
  Tensor x = random_tensor({2, 3, 6}, rng, -2.0f, 2.0f);
  const Tensor w = random_tensor({2, 3, 7}, rng);
  auto loss = [&] {
    nn::ProjectorCache cache;
    return dot(projector.forward(ops, x, cache), w);
  };
  Tensor dx;
  expect_parameter_gradients(
      projector.parameters(),
      [&] {
        nn::ProjectorCache cache;
        projector.forward(ops, x, cache);
        dx = projector.backward(ops, w, cache);
      },
      loss);
  expect_gradient("projector dx", x, dx, loss);
  EXPECT_EQ(projector.numel(), 6 * 10 + 10 + 10 * 7 + 7);
}

TEST(NnModules, DecoderGradientsAndTargets) {
  std::mt19937 rng(16);
  nn::HostOps ops(1);
  nn::ParameterStore store(7);
  const nn::Decoder llm(store, "llm", nn::DecoderShape{{9, 3, 12, 2, true}, 11, 9}, false);
  perturb(llm.parameters(), rng);
  Tensor prefix = random_tensor({2, 3, 9}, rng);
  const nn::Tokens text = random_tokens(2, 5, {5, 2}, 11, rng);
  EXPECT_EQ(nn::next_token_targets(text), (std::vector<int32_t>{text.ids[1], text.ids[2], text.ids[3], text.ids[4], -1,
                                                                text.ids[6], -1, -1, -1, -1}));
  auto loss = [&] {
    nn::DecoderCache cache;
    return static_cast<double>(nn::lm_loss(ops, llm.forward(ops, &prefix, text, cache), text, 0, nullptr));
  };
  Tensor dprefix;
  expect_parameter_gradients(
      llm.parameters(),
      [&] {
        nn::DecoderCache cache;
        Tensor dlogits;
        nn::lm_loss(ops, llm.forward(ops, &prefix, text, cache), text, 0, &dlogits);
        dprefix = llm.backward(ops, dlogits, cache);
      },
      loss);
  expect_gradient("llm dprefix", prefix, dprefix, loss);

  // The padding after a caption changes no counted position: the loss is the same.
  nn::Tokens padded = text;
  for (std::size_t i = 7; i < 10; ++i) padded.ids[i] = 3;
  nn::DecoderCache cache;
  EXPECT_EQ(loss(),
            static_cast<double>(nn::lm_loss(ops, llm.forward(ops, &prefix, padded, cache), padded, 0, nullptr)));
  EXPECT_EQ(llm.forward(ops, nullptr, text, cache).shape, (Shape{2, 5, 11}));  // no prefix: a plain LM
  test::expect_error(
      [&] {
        llm.forward(ops, &prefix, random_tokens(2, 7, {7, 7}, 11, rng), cache);
      },
      Status::invalid_argument, {"llm", "exceed max_positions 9"});
}

const char* kTinyClip = R"(name: t
modules:
  - {name: image, role: encoder, modality: image, layers: 1, hidden: 8, ffn: 12, heads: 2, patch_size: 4,
     channels: 2, max_image_size: 8, embed_dim: 6}
  - {name: text, role: encoder, modality: text, layers: 1, hidden: 8, ffn: 12, heads: 2, vocab: 9, causal: true,
     max_positions: 5, embed_dim: 6}
  - {name: loss, role: loss, loss: contrastive, inputs: [image, text]}
)";

const char* kTinyMllm = R"(name: t
modules:
  - {name: vision, role: encoder, modality: image, layers: 1, hidden: 8, ffn: 12, heads: 2, patch_size: 4,
     channels: 2, max_image_size: 8}
  - {name: proj, role: projector, inputs: [vision], layers: 2, hidden: 9, ffn: 10}
  - {name: llm, role: llm, inputs: [proj], layers: 1, hidden: 9, ffn: 12, heads: 3, vocab: 11, max_positions: 9}
)";

TEST(NnModules, ClipModelGradients) {
  std::mt19937 rng(17);
  nn::HostOps ops(1);
  nn::Model model = nn::build_model(model_from(kTinyClip), 1);
  ASSERT_TRUE(model.clip);
  EXPECT_NEAR(model.parameters().back()->value.data[0], std::log(1 / 0.07), 1e-6);
  perturb(model.parameters(), rng);
  const nn::ClipModel& clip = *model.clip;
  const Tensor images = random_tensor({3, 2, 8, 4}, rng, 0.0f, 1.0f);
  const nn::Tokens text = random_tokens(3, 4, {4, 2, 3}, 9, rng);
  expect_parameter_gradients(
      model.parameters(), [&] { clip.step(ops, images, text, true); },
      [&] { return static_cast<double>(clip.step(ops, images, text, false)); });
  EXPECT_EQ(model.parameters().back()->name, "loss.logit_scale");
}

TEST(NnModules, MllmModelGradientsAndFrozenVision) {
  std::mt19937 rng(18);
  nn::HostOps ops(1);
  nn::Model model = nn::build_model(model_from(kTinyMllm), 2);
  ASSERT_TRUE(model.chain);
  std::mt19937 perturb_rng(21);
  perturb(model.parameters(), perturb_rng);
  const Tensor images = random_tensor({2, 2, 8, 8}, rng, 0.0f, 1.0f);  // 4 image tokens + 5 text = 9 positions
  const nn::Tokens text = random_tokens(2, 5, {5, 3}, 11, rng);
  expect_parameter_gradients(
      model.parameters(), [&] { model.chain->step(ops, &images, text, 0, true); },
      [&] { return static_cast<double>(model.chain->step(ops, &images, text, 0, false)); });

  // A frozen vision encoder: the same weights (same names and seed), no gradient for it, the
  // same gradients for the rest.
  std::string frozen_yaml = kTinyMllm;
  frozen_yaml.replace(frozen_yaml.find("max_image_size: 8}"), 18, "max_image_size: 8, frozen: true}");
  nn::Model frozen = nn::build_model(model_from(frozen_yaml), 2);
  perturb_rng.seed(21);
  perturb(frozen.parameters(), perturb_rng);
  ASSERT_EQ(frozen.parameters().size(), model.parameters().size());
  model.store.zero_grads();
  frozen.store.zero_grads();
  EXPECT_EQ(model.chain->step(ops, &images, text, 0, true), frozen.chain->step(ops, &images, text, 0, true));
  for (std::size_t i = 0; i < model.parameters().size(); ++i) {
    const nn::Parameter& a = *model.parameters()[i];
    const nn::Parameter& b = *frozen.parameters()[i];
    EXPECT_EQ(a.value.data, b.value.data) << a.name;
    const bool vision = a.name.rfind("vision.", 0) == 0;
    EXPECT_EQ(b.trainable, !vision) << a.name;
    if (vision) {
      EXPECT_TRUE(b.grad.data.empty()) << a.name;
    } else {
      EXPECT_EQ(a.grad.data, b.grad.data) << a.name;
    }
  }
}

// Images (B, 3, side, side): each a random colour with a brighter random quadrant, plus
// noise, so that samples differ the way the shapes dataset's do (not as iid noise, which
// mean pooling averages away).
Tensor coloured_images(int64_t batch, int64_t side, std::mt19937& rng) {
  Tensor images({batch, 3, side, side});
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t quadrant = std::uniform_int_distribution<int64_t>(0, 3)(rng);
    for (int64_t c = 0; c < 3; ++c) {
      const float colour = u(rng);
      for (int64_t y = 0; y < side; ++y)
        for (int64_t x = 0; x < side; ++x) {
          const bool lit = (y < side / 2) == (quadrant < 2) && (x < side / 2) == (quadrant % 2 == 0);
          images.data[static_cast<std::size_t>(((b * 3 + c) * side + y) * side + x)] =
              colour + (lit ? 0.5f : 0.0f) + 0.1f * u(rng);
        }
    }
  }
  return images;
}

// AdamW steps on one fixed batch; returns the losses before and after.
std::pair<float, float> train(nn::Ops& ops, nn::Model& model, int steps, const std::function<float(bool)>& step) {
  std::vector<nn::AdamWState> states(model.parameters().size());
  const nn::AdamWConfig config{2e-3, 0.9, 0.999, 1e-8, 0.0};
  const float first = step(false);
  for (int s = 0; s < steps; ++s) {
    model.store.zero_grads();
    step(true);
    for (std::size_t i = 0; i < model.parameters().size(); ++i) {
      nn::Parameter& p = *model.parameters()[i];
      if (p.trainable) ops.adamw_step(p.value, p.grad, states[i], config);
    }
    if (model.clip) model.clip->loss->clamp_after_step(ops);
  }
  return {first, step(false)};
}

nn::Model build_shipped(const std::string& run) {
  return nn::build_model(spec::load_run(test::source_path("configs/runs/" + run)).model, 42);
}

TEST(NnModules, AdamWLowersTheTinyClipLoss) {
  std::mt19937 rng(19);
  nn::HostOps ops(2);
  nn::Model model = build_shipped("tiny-clip.yaml");
  const Tensor images = coloured_images(8, 16, rng);
  const nn::Tokens text = random_tokens(8, 10, {10, 6, 8, 4, 9, 7, 5, 10}, 32, rng);
  const auto [before, after] =
      train(ops, model, 25, [&](bool backward) { return model.clip->step(ops, images, text, backward); });
  // Chance is ln 8 (eight candidates per row); the random start sits above it.
  EXPECT_LT(after, 0.5f * std::log(8.0f)) << "before " << before << " after " << after;
  EXPECT_LT(after, 0.5f * before);
}

TEST(NnModules, AdamWLowersTheTinyMllmLoss) {
  std::mt19937 rng(20);
  nn::HostOps ops(2);
  nn::Model model = build_shipped("tiny-mllm.yaml");
  const Tensor images = random_tensor({4, 3, 24, 24}, rng, 0.0f, 1.0f);  // 9 image tokens
  const nn::Tokens text = random_tokens(4, 12, {12, 7, 9, 5}, 32, rng);
  const auto [before, after] =
      train(ops, model, 12, [&](bool backward) { return model.chain->step(ops, &images, text, 0, backward); });
  EXPECT_NEAR(before, std::log(32.0f), 0.3);  // uniform over the vocabulary
  EXPECT_LT(after, 0.5f * before) << "before " << before << " after " << after;
}

TEST(NnModules, ShippedTinyModelsBuildWithTheSpecParameterCount) {
  for (const char* run : {"tiny-clip.yaml", "tiny-mllm.yaml"}) {
    SCOPED_TRACE(run);
    const spec::RunSpec spec = spec::load_run(test::source_path(std::string("configs/runs/") + run));
    const nn::Model model = nn::build_model(spec.model, 42);
    EXPECT_EQ(static_cast<double>(model.store.numel()), spec::model_parameters(spec.model));
    std::set<std::string> names;
    for (const nn::Parameter* p : model.parameters()) EXPECT_TRUE(names.insert(p->name).second) << p->name;
    // Parameters follow the model file's module order.
    EXPECT_EQ(model.parameters().front()->name.substr(0, spec.model.modules[0].name.size()),
              spec.model.modules[0].name);
    EXPECT_EQ(model.topology, spec.model.topology);
  }
  const nn::Model clip = build_shipped("tiny-clip.yaml");
  EXPECT_EQ(clip.store.numel(), 220225);  // as the README's table says
  ASSERT_TRUE(clip.clip);
  EXPECT_FALSE(clip.chain);
  EXPECT_EQ(clip.clip->image_encoder->shape().patch, 8);
  EXPECT_EQ(clip.clip->text_encoder->shape().vocab, 32);
  const nn::Model mllm = build_shipped("tiny-mllm.yaml");
  EXPECT_EQ(mllm.store.numel(), 546880);
  ASSERT_TRUE(mllm.chain && mllm.chain->vision && mllm.chain->projector);
  EXPECT_EQ(mllm.chain->projector->in(), 64);
  EXPECT_EQ(mllm.chain->projector->out(), 128);
}

TEST(NnModules, InitDoesNotDependOnTheRestOfTheModel) {
  const nn::Model a = build_shipped("tiny-clip.yaml");
  const nn::Model b = build_shipped("tiny-clip.yaml");
  std::string yaml;  // the same model with a deeper text tower: the image tower's weights stay
  {
    std::ifstream in(test::source_path("configs/models/tiny-clip.yaml"));
    yaml.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const auto at = yaml.find("layers: 2", yaml.find("name: text_encoder"));
  ASSERT_NE(at, std::string::npos);
  yaml.replace(at, 9, "layers: 3");
  const nn::Model deeper = nn::build_model(model_from(yaml), 42);
  const nn::Model reseeded = nn::build_model(model_from(yaml), 43);
  ASSERT_EQ(a.parameters().size(), b.parameters().size());
  for (std::size_t i = 0; i < a.parameters().size(); ++i) {
    const nn::Parameter& p = *a.parameters()[i];
    EXPECT_EQ(p.value.data, b.parameters()[i]->value.data) << p.name;
    const nn::Parameter* q = deeper.store.find(p.name);
    ASSERT_NE(q, nullptr) << p.name;
    // GPT-2's depth scaling: the residual projections of the deeper tower start smaller.
    const bool depth_scaled =
        p.name.rfind("text_encoder.", 0) == 0 &&
        (p.name.find("attn.out.weight") != std::string::npos || p.name.find("mlp.fc2.weight") != std::string::npos);
    if (!depth_scaled) {
      EXPECT_EQ(p.value.data, q->value.data) << p.name;
    }
    if (p.value.numel() > 1 && p.name.find(".ln") == std::string::npos && p.name.find("bias") == std::string::npos &&
        p.name.find("norm") == std::string::npos) {
      EXPECT_NE(p.value.data, reseeded.store.find(p.name)->value.data) << p.name;
    }
  }
  EXPECT_GT(deeper.parameters().size(), a.parameters().size());
}

// The tiny MLLM's model text with one module field replaced or added.
std::string mllm_with(const std::string& from, const std::string& to) {
  std::string yaml = kTinyMllm;
  const auto at = yaml.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return yaml.replace(at, from.size(), to);
}

TEST(NnModules, BuildModelRefusesWhatItDoesNotBuild) {
  auto build = [](const std::string& yaml) { nn::build_model(model_from(yaml), 0); };
  test::expect_error([&] { build(mllm_with(", max_positions: 9}", "}")); }, Status::bad_config,
                     {"<string>:6:5: modules[2].max_positions: missing: the reference llm 'llm' needs max_positions"});
  test::expect_error([&] { build(mllm_with(", max_image_size: 8}", "}")); }, Status::bad_config,
                     {"<string>:3:5: modules[0].max_image_size: missing", "largest image side"});
  test::expect_error([&] { build(mllm_with("vocab: 11,", "vocab: 11, mlp: swiglu,")); }, Status::unsupported,
                     {"<string>:6:5: modules[2].mlp:", "GELU MLP only"});
  test::expect_error([&] { build(mllm_with("heads: 3,", "heads: 3, kv_groups: 1,")); }, Status::unsupported,
                     {"modules[2].kv_groups:", "kv_groups must equal heads (3)"});
  test::expect_error([&] { build(mllm_with("heads: 2,", "heads: 2, dropout: 0.1,")); }, Status::unsupported,
                     {"<string>:3:5: modules[0].dropout:", "no dropout"});
  test::expect_error([&] { build(mllm_with("ffn: 10}", "ffn: 10, downsample: 4}")); }, Status::unsupported,
                     {"<string>:5:5: modules[1].downsample:", "downsample must be 1"});
  test::expect_error([&] { build(mllm_with("max_positions: 9}", "max_positions: 9, causal: false}")); },
                     Status::unsupported, {"modules[2].causal:", "causal decoder"});
  test::expect_error(
      [&] {
        build(std::string(kTinyMllm) +
              "  - {name: gen, role: generator, modality: image, inputs: [llm], layers: 1, hidden: 8, heads: 2, "
              "patch_size: 2}\n");
      },
      Status::unsupported, {"<string>:7:5: modules[3].role:", "no generator"});
  std::string audio = kTinyClip;
  audio.replace(audio.find("modality: text"), 14, "modality: audio");
  audio.replace(audio.find("vocab: 9, "), 10, "");
  test::expect_error([&] { build(audio); }, Status::unsupported, {"modules[1].modality:", "no audio encoder"});
  // The spec reader checks the new fields where they are written.
  test::expect_error([&] { build(mllm_with("max_image_size: 8}", "max_image_size: 2}")); }, Status::bad_config,
                     {"<string>:4:35: modules[0].max_image_size: must be at least the patch size 4 (got 2)"});
  test::expect_error([&] { build(mllm_with("ffn: 10}", "ffn: 10, max_positions: 4}")); }, Status::bad_config,
                     {"modules[1].max_positions: does not apply to a projector module"});
  test::expect_error([&] { build(mllm_with("max_image_size: 8}", "max_image_size: 8, max_positions: 4}")); },
                     Status::bad_config, {"modules[0].max_positions: does not apply to a encoder module"});
  test::expect_error([&] { build(mllm_with("max_positions: 9}", "max_positions: 0}")); }, Status::bad_config,
                     {"modules[2].max_positions: must be at least 1 (got 0)"});
}

}  // namespace
}  // namespace braid
