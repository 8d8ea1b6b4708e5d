// The decoder's model splits, in one process: pipeline parts chained one after another, and
// Megatron tensor parallelism with each rank on its own std::thread, its own HostOps and its
// own copy of the model, the all-reduce an in-test barrier sum. Both must reproduce the whole
// decoder's logits, loss, parameter gradients and prefix gradient. The CLIP encoders' pipeline
// parts, chained, must reproduce the whole encoder's tokens, pooled output and gradients.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/cost/cost_model.hpp"
#include "core/nn/host_ops.hpp"
#include "core/nn/modules/decoder.hpp"
#include "core/nn/modules/image_encoder.hpp"
#include "core/nn/modules/model.hpp"
#include "core/nn/modules/projector.hpp"
#include "core/nn/modules/text_encoder.hpp"
#include "core/nn/tensor_parallel.hpp"
#include "tests/unit/support.hpp"

namespace braid {
namespace {

using nn::Tensor;

// max |a - b| / max |b|: 0 for equal tensors, the error's size relative to the reference's.
double relative_error(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape, b.shape);
  if (a.shape != b.shape) return 1.0;
  double diff = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < a.data.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::abs(a.data[i] - b.data[i])));
    scale = std::max(scale, static_cast<double>(std::abs(b.data[i])));
  }
  return scale > 0.0 ? diff / scale : diff;
}

// A small causal decoder, 4 heads and an ffn of 24 (both split by 2 and 4), three blocks.
const nn::DecoderShape kShape{{16, 4, 24, 3, true}, 13, 12};

// One copy of the model: the same seed and the same perturbation give every copy the same
// weights. Perturbed so that activations and gradients are of order one, not 0.02.
struct Copy {
  nn::ParameterStore store{5};
  std::unique_ptr<nn::Decoder> llm;
  explicit Copy(const nn::DecoderShape& shape = kShape) {
    llm = std::make_unique<nn::Decoder>(store, "llm", shape, false);
    std::mt19937 rng(31);
    std::uniform_real_distribution<float> u(-0.3f, 0.3f);
    for (nn::Parameter* p : store.all())
      for (float& x : p->value.data) x += u(rng);
  }
};

struct Inputs {
  Tensor prefix;  // empty: none
  nn::Tokens text;
  const Tensor* prefix_or_null() const { return prefix.data.empty() ? nullptr : &prefix; }
};

Inputs make_inputs(bool with_prefix, int64_t hidden = kShape.transformer.hidden, int32_t vocab = 13) {
  std::mt19937 rng(7);
  Inputs in;
  if (with_prefix) {
    in.prefix = Tensor({2, 3, hidden});
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (float& x : in.prefix.data) x = u(rng);
  }
  in.text = nn::Tokens{2, 6, std::vector<int32_t>(12, 0), {6, 4}};
  std::uniform_int_distribution<int32_t> id(4, vocab - 1);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < in.text.lengths[static_cast<std::size_t>(b)]; ++t)
      in.text.ids[static_cast<std::size_t>(b * 6 + t)] = id(rng);
  return in;
}

// What one forward + backward produced.
struct Result {
  Tensor logits;
  float loss = 0.0f;
  Tensor dprefix;
  std::map<std::string, Tensor> grads;
  std::map<std::string, nn::TensorSlice> slices;  // what each gradient is of the whole
};

std::map<std::string, Tensor> grads_of(const nn::ParameterStore& store) {
  std::map<std::string, Tensor> grads;
  for (const nn::Parameter* p : store.all()) grads[p->name] = p->grad;
  return grads;
}

std::map<std::string, nn::TensorSlice> slices_of(const nn::ParameterStore& store) {
  std::map<std::string, nn::TensorSlice> slices;
  for (const nn::Parameter* p : store.all()) slices[p->name] = p->slice;
  return slices;
}

// The decoder through `parts` in order, the LM loss, then back through them in reverse.
Result run_parts(nn::Ops& ops, Copy& model, const std::vector<nn::DecoderPart>& parts, const Inputs& in) {
  model.store.zero_grads();
  std::vector<nn::DecoderCache> caches(parts.size());
  Result r;
  Tensor h;
  for (std::size_t i = 0; i < parts.size(); ++i)
    h = model.llm->forward_part(ops, parts[i], i == 0 ? in.prefix_or_null() : &h, in.text, caches[i]);
  r.logits = h;
  Tensor d;
  r.loss = model.llm->loss(ops, r.logits, in.text, 0, &d);
  for (std::size_t i = parts.size(); i-- > 0;) d = model.llm->backward_part(ops, parts[i], d, caches[i]);
  r.dprefix = d;
  r.grads = grads_of(model.store);
  r.slices = slices_of(model.store);
  return r;
}

Result run_whole(nn::Ops& ops, Copy& model, const Inputs& in) {
  model.store.zero_grads();
  nn::DecoderCache cache;
  Result r;
  r.logits = model.llm->forward(ops, in.prefix_or_null(), in.text, cache);
  Tensor dlogits;
  r.loss = nn::lm_loss(ops, r.logits, in.text, 0, &dlogits);
  r.dprefix = model.llm->backward(ops, dlogits, cache);
  r.grads = grads_of(model.store);
  return r;
}

double max_abs(const Tensor& t) {
  double m = 0.0;
  for (float x : t.data) m = std::max(m, static_cast<double>(std::abs(x)));
  return m;
}

// The key projection's bias adds the same q . b to every score of a query, which the softmax
// cancels: its gradient is zero in exact arithmetic, rounding noise in float.
bool zero_gradient(const std::string& name) { return name.find("attn.k.bias") != std::string::npos; }

void expect_same(const Result& got, const Result& want, double tolerance) {
  EXPECT_LE(relative_error(got.logits, want.logits), tolerance) << "logits";
  EXPECT_NEAR(got.loss, want.loss, tolerance * std::abs(want.loss)) << "loss";
  EXPECT_EQ(got.dprefix.shape, want.dprefix.shape);
  if (!want.dprefix.data.empty()) {
    EXPECT_LE(relative_error(got.dprefix, want.dprefix), tolerance) << "dprefix";
  }
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (const auto& [name, grad] : want.grads) {
    if (zero_gradient(name)) {
      EXPECT_LT(max_abs(got.grads.at(name)), 1e-5) << name;
      continue;
    }
    EXPECT_GT(max_abs(grad), 1e-3) << name << ": a zero reference gradient proves nothing";
    EXPECT_LE(relative_error(got.grads.at(name), grad), tolerance) << name;
  }
}

TEST(NnParallel, SplitDecoderGivesEarlierStagesTheExtraBlock) {
  auto pairs = [](const std::vector<nn::DecoderPart>& parts) {
    std::vector<std::pair<int, int>> out;
    for (const auto& p : parts) out.emplace_back(p.first, p.last);
    return out;
  };
  EXPECT_EQ(pairs(nn::split_decoder(3, 1)), (std::vector<std::pair<int, int>>{{0, 3}}));
  EXPECT_EQ(pairs(nn::split_decoder(3, 2)), (std::vector<std::pair<int, int>>{{0, 2}, {2, 3}}));
  EXPECT_EQ(pairs(nn::split_decoder(7, 3)), (std::vector<std::pair<int, int>>{{0, 3}, {3, 5}, {5, 7}}));
  EXPECT_EQ(pairs(nn::split_decoder(4, 4)), (std::vector<std::pair<int, int>>{{0, 1}, {1, 2}, {2, 3}, {3, 4}}));
  test::expect_error([] { nn::split_decoder(3, 4); }, Status::invalid_argument,
                     {"split_decoder", "4 pipeline stages do not fit 3 decoder layers"});
  test::expect_error([] { nn::split_decoder(3, 0); }, Status::invalid_argument,
                     {"split_decoder", "at least one pipeline stage, got 0"});
}

TEST(NnParallel, DecoderPartsChainedMatchTheWholeDecoder) {
  nn::HostOps ops(1);
  Copy model;
  for (bool with_prefix : {false, true}) {
    const Inputs in = make_inputs(with_prefix);
    const Result whole = run_whole(ops, model, in);
    for (int stages : {2, 3}) {
      SCOPED_TRACE("stages " + std::to_string(stages) + (with_prefix ? ", prefix" : ", no prefix"));
      expect_same(run_parts(ops, model, nn::split_decoder(3, stages), in), whole, 1e-5);
    }
  }
}

TEST(NnParallel, DecoderPartsOwnDisjointParametersAndTouchOnlyTheirGradients) {
  nn::HostOps ops(1);
  Copy model;
  const Inputs in = make_inputs(true);
  const std::vector<nn::DecoderPart> parts = nn::split_decoder(3, 3);
  std::set<const nn::Parameter*> seen;
  std::size_t owned = 0;
  for (const auto& part : parts) {
    for (const nn::Parameter* p : model.llm->part_parameters(part)) {
      EXPECT_TRUE(seen.insert(p).second) << p->name << " owned twice";
      ++owned;
    }
  }
  EXPECT_EQ(owned, model.llm->parameters().size());
  EXPECT_EQ(model.llm->part_parameters(parts[0]).front()->name, "llm.token_embed");
  EXPECT_EQ(model.llm->part_parameters(parts[2]).back()->name, "llm.lm_head.weight");
  EXPECT_EQ(model.llm->part_parameters(model.llm->whole()), model.llm->parameters());

  // Each part's backward changes the gradients of its own parameters only.
  model.store.zero_grads();
  std::vector<nn::DecoderCache> caches(parts.size());
  Tensor h;
  for (std::size_t i = 0; i < parts.size(); ++i)
    h = model.llm->forward_part(ops, parts[i], i == 0 ? &in.prefix : &h, in.text, caches[i]);
  EXPECT_EQ(h.shape, (nn::Shape{2, 6, 13}));
  Tensor d;
  nn::lm_loss(ops, h, in.text, 0, &d);
  for (std::size_t i = parts.size(); i-- > 0;) {
    const auto before = grads_of(model.store);
    d = model.llm->backward_part(ops, parts[i], d, caches[i]);
    const auto mine = model.llm->part_parameters(parts[i]);
    for (const nn::Parameter* p : model.store.all()) {
      const bool owns = std::find(mine.begin(), mine.end(), p) != mine.end();
      if (!owns) {
        EXPECT_EQ(p->grad.data, before.at(p->name).data) << "part " << i << " touched " << p->name;
      }
    }
    EXPECT_EQ(d.shape, i == 0 ? (nn::Shape{2, 3, 16}) : (nn::Shape{2, 9, 16}));
  }
}

TEST(NnParallel, DecoderPartErrors) {
  nn::HostOps ops(1);
  Copy model;
  const Inputs in = make_inputs(true);
  nn::DecoderCache cache;
  test::expect_error(
      [&] {
        model.llm->forward_part(ops, {2, 4}, nullptr, in.text, cache);
      },
      Status::invalid_argument, {"llm: part [2, 4) is not a range of its 3 blocks"});
  test::expect_error(
      [&] {
        model.llm->forward_part(ops, {1, 3}, nullptr, in.text, cache);
      },
      Status::invalid_argument, {"llm: part [1, 3) takes the previous part's hidden", "got none"});
  const Tensor short_hidden({2, 5, 16});  // fewer positions than the 6 text tokens
  test::expect_error(
      [&] {
        model.llm->forward_part(ops, {1, 3}, &short_hidden, in.text, cache);
      },
      Status::invalid_argument, {"got (2, 5, 16)"});
  const Tensor h = model.llm->forward_part(ops, {0, 1}, &in.prefix, in.text, cache);
  test::expect_error(
      [&] {
        model.llm->backward_part(ops, {1, 3}, h, cache);
      },
      Status::invalid_argument, {"backward of part [1, 3) got the cache of part [0, 1)"});
}

// An all-reduce over `size` threads: each rank leaves its tensor, the last to arrive sums them
// in rank order (so every rank gets the same bits), and every rank copies the sum back.
// abort() wakes the others when one rank fails, so a failing test ends instead of hanging.
class BarrierSum {
 public:
  explicit BarrierSum(int size) : size_(size), parts_(static_cast<std::size_t>(size)) {}

  void sum(int rank, Tensor& t) {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return !draining_ || broken_; });
    check();
    parts_[static_cast<std::size_t>(rank)] = &t;
    ++calls_;
    if (++arrived_ == size_) {
      sum_.assign(t.data.size(), 0.0f);
      for (const Tensor* part : parts_) {
        if (part->data.size() != sum_.size()) {
          broken_ = true;
          cv_.notify_all();
          throw std::runtime_error("barrier sum: the ranks' tensors differ in size");
        }
        for (std::size_t i = 0; i < sum_.size(); ++i) sum_[i] += part->data[i];
      }
      draining_ = true;
      ++round_;
      cv_.notify_all();
    } else {
      const auto round = round_;
      cv_.wait(lock, [&] { return round_ != round || broken_; });
      check();
    }
    t.data = sum_;
    if (++departed_ == size_) {
      arrived_ = departed_ = 0;
      draining_ = false;
      cv_.notify_all();
    }
  }

  void abort() {
    std::lock_guard lock(mutex_);
    broken_ = true;
    cv_.notify_all();
  }
  int calls() const { return calls_; }

 private:
  void check() const {
    if (broken_) throw std::runtime_error("barrier sum: another rank failed");
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  int size_, arrived_ = 0, departed_ = 0, calls_ = 0;
  std::uint64_t round_ = 0;
  bool draining_ = false, broken_ = false;
  std::vector<Tensor*> parts_;
  std::vector<float> sum_;
};

// Runs body(rank, allreduce) on `size` threads, the all-reduce a BarrierSum; returns the
// all-reduce calls of all ranks. A rank that throws wakes the others, and the error is rethrown.
int run_ranks(int size, const std::function<void(int, std::function<void(Tensor&)>)>& body) {
  BarrierSum group(size);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      try {
        body(r, [&group, r](Tensor& t) { group.sum(r, t); });
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
        group.abort();
      }
    });
  for (auto& t : threads) t.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  return group.calls();
}

// Rank r's group of `size` over the barrier all-reduce `sum`; with `sequence_parallel`, its
// all-gather and reduce-scatter built from the same sum (a rank's block in zeros, summed).
nn::TensorParallel group_of(int r, int size, std::function<void(Tensor&)> sum, bool sequence_parallel) {
  nn::TensorParallel tp{r, size, sum};
  if (!sequence_parallel) return tp;
  tp.sequence_parallel = true;
  tp.allgather = [r, sum](std::span<const float> mine, std::span<float> all) {
    Tensor t({static_cast<int64_t>(all.size())});
    std::copy(mine.begin(), mine.end(), t.data.begin() + static_cast<std::ptrdiff_t>(r * mine.size()));
    sum(t);
    std::copy(t.data.begin(), t.data.end(), all.begin());
  };
  tp.reduce_scatter = [r, sum](std::span<const float> all, std::span<float> mine) {
    Tensor t({static_cast<int64_t>(all.size())});
    std::copy(all.begin(), all.end(), t.data.begin());
    sum(t);
    const auto from = t.data.begin() + static_cast<std::ptrdiff_t>(r * mine.size());
    std::copy(from, from + static_cast<std::ptrdiff_t>(mine.size()), mine.begin());
  };
  return tp;
}

// Runs `parts` on `size` TP ranks, one thread and one model copy each.
std::vector<Result> run_tensor_parallel(int size, const std::vector<nn::DecoderPart>& parts, const Inputs& in,
                                        const nn::DecoderShape& shape, int* allreduces = nullptr,
                                        bool sequence_parallel = false) {
  std::vector<Copy> copies;
  copies.reserve(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) copies.emplace_back(shape);
  std::vector<Result> results(static_cast<std::size_t>(size));
  const int calls = run_ranks(size, [&](int r, std::function<void(Tensor&)> allreduce) {
    const auto i = static_cast<std::size_t>(r);
    copies[i].llm->set_tensor_parallel(group_of(r, size, std::move(allreduce), sequence_parallel));
    nn::HostOps ops(1);
    results[i] = run_parts(ops, copies[i], parts, in);
  });
  if (allreduces) *allreduces = calls;
  return results;
}

// The whole tensor of `full_shape` from each rank's slice along `axis`.
Tensor join_slices(const std::vector<Tensor>& slices, int axis, nn::Shape full_shape) {
  Tensor whole(full_shape);
  const int count = static_cast<int>(slices.size());
  for (int k = 0; k < count; ++k) {
    if (axis == 0)
      nn::add_column_parallel_shard(whole, slices[static_cast<std::size_t>(k)], k, count);
    else
      nn::add_row_parallel_shard(whole, slices[static_cast<std::size_t>(k)], k, count);
  }
  return whole;
}

// The gradients of every rank as one process's: a split parameter's slices joined (each
// exactly 1/size of the whole), a replicated one the same on every rank.
std::map<std::string, Tensor> joined_grads(const std::vector<std::map<std::string, Tensor>>& grads,
                                           const std::vector<std::map<std::string, nn::TensorSlice>>& slices,
                                           const std::map<std::string, Tensor>& want) {
  std::map<std::string, Tensor> out;
  const auto size = static_cast<int>(grads.size());
  for (const auto& [name, whole] : want) {
    const nn::TensorSlice s = slices[0].at(name);
    if (s.whole()) {
      for (int r = 1; r < size; ++r) {
        EXPECT_TRUE(slices[static_cast<std::size_t>(r)].at(name).whole()) << name;
        EXPECT_EQ(grads[static_cast<std::size_t>(r)].at(name).data, grads[0].at(name).data)
            << name << ": replicated, the same on every rank";
      }
      out[name] = grads[0].at(name);
      continue;
    }
    std::vector<Tensor> parts;
    for (int r = 0; r < size; ++r) {
      const nn::TensorSlice mine = slices[static_cast<std::size_t>(r)].at(name);
      EXPECT_EQ(mine, (nn::TensorSlice{s.axis, r, size})) << name;
      const Tensor& g = grads[static_cast<std::size_t>(r)].at(name);
      EXPECT_EQ(g.numel() * size, whole.numel()) << name << ": a slice holds 1/" << size << " of the tensor";
      parts.push_back(g);
    }
    out[name] = join_slices(parts, s.axis, whole.shape);
  }
  return out;
}

// Checks TP ranks against one process: replicated values equal on every rank, the slices of
// split gradients and of the vocabulary-parallel logits joined.
void expect_tensor_parallel_matches(const std::vector<Result>& ranks, const Result& want, double tolerance) {
  std::vector<std::map<std::string, Tensor>> grads;
  std::vector<std::map<std::string, nn::TensorSlice>> slices;
  std::vector<Tensor> logits;
  const int64_t vocab = want.logits.dim(-1), rows = want.logits.numel() / vocab;
  for (const Result& r : ranks) {
    grads.push_back(r.grads);
    slices.push_back(r.slices);
    logits.push_back(nn::reshaped(r.logits, {rows, vocab / static_cast<int64_t>(ranks.size())}));
  }
  Result joined = ranks[0];
  joined.grads = joined_grads(grads, slices, want.grads);
  joined.logits = join_slices(logits, 1, {rows, vocab});
  joined.logits.reshape(want.logits.shape);
  for (const Result& r : ranks) {
    EXPECT_EQ(r.loss, ranks[0].loss) << "the loss is the same on every rank";
    EXPECT_EQ(r.dprefix.data, ranks[0].dprefix.data) << "the prefix gradient is the same on every rank";
  }
  expect_same(joined, want, tolerance);
}

TEST(NnParallel, TensorParallelDecoderMatchesOneProcess) {
  const nn::DecoderShape shape{kShape.transformer, 16, 12};  // a vocabulary 2 and 4 ranks split
  Copy reference(shape);
  nn::HostOps ops(1);
  const auto splits = reference.llm->tp_splits();
  ASSERT_EQ(splits.size(), 1u + 3u * 10u + 1u);  // token table; q, k, v, fc1 weight + bias, out, fc2 weight; head
  EXPECT_EQ(splits[0].param->name, "llm.token_embed");
  EXPECT_EQ(splits[1].param->name, "llm.blocks.0.attn.q.weight");
  EXPECT_EQ(splits.back().param->name, "llm.lm_head.weight");
  for (bool with_prefix : {false, true}) {
    const Inputs in = make_inputs(with_prefix, shape.transformer.hidden, 16);
    const Result want = run_whole(ops, reference, in);
    for (int size : {2, 4}) {
      SCOPED_TRACE("TP " + std::to_string(size) + (with_prefix ? ", prefix" : ", no prefix"));
      int allreduces = 0;
      const auto ranks = run_tensor_parallel(size, {nn::DecoderPart{0, 3}}, in, shape, &allreduces);
      // Per rank: 2 forward and 2 backward per block; the embedding's, the head's backward, 2 for the loss.
      EXPECT_EQ(allreduces, size * (3 * 4 + 4));
      expect_tensor_parallel_matches(ranks, want, 1e-4);
    }
  }
}

TEST(NnParallel, SequenceParallelDecoderMatchesOneProcess) {
  // 3 prefix + 6 text positions: padded to 10 for 2 ranks, 12 for 4 (causal: no position sees
  // the padding); in pipeline parts too.
  const nn::DecoderShape shape{kShape.transformer, 16, 12};
  Copy reference(shape);
  nn::HostOps ops(1);
  const Inputs in = make_inputs(true, shape.transformer.hidden, 16);
  const Result want = run_whole(ops, reference, in);
  for (int size : {2, 4}) {
    SCOPED_TRACE("TP " + std::to_string(size) + " with sequence parallelism");
    expect_tensor_parallel_matches(run_tensor_parallel(size, {nn::DecoderPart{0, 3}}, in, shape, nullptr, true), want,
                                   1e-4);
    expect_tensor_parallel_matches(run_tensor_parallel(size, nn::split_decoder(3, 2), in, shape, nullptr, true), want,
                                   1e-4);
  }
}

TEST(NnParallel, TensorParallelWithPipelinePartsMatchesOneProcess) {
  const nn::DecoderShape shape{kShape.transformer, 16, 12};
  Copy reference(shape);
  nn::HostOps ops(1);
  const Inputs in = make_inputs(true, shape.transformer.hidden, 16);
  const Result want = run_whole(ops, reference, in);
  const auto ranks = run_tensor_parallel(2, nn::split_decoder(3, 2), in, shape);
  expect_tensor_parallel_matches(ranks, want, 1e-4);
  // The first part splits the token table and its blocks; the last its blocks and the head.
  EXPECT_EQ(reference.llm->tp_splits({0, 2}).size(), 21u);
  EXPECT_EQ(reference.llm->tp_splits({2, 3}).front().param->name, "llm.blocks.2.attn.q.weight");
  EXPECT_EQ(reference.llm->tp_splits({2, 3}).back().param->name, "llm.lm_head.weight");
}

TEST(NnParallel, TinyMllmDecoderSplitsTwoWaysBothWays) {
  // The shipped tiny-mllm LLM's shapes (2 x 128, ffn 512, 4 heads, vocab 32): 2 stages x TP 2.
  const spec::RunSpec run = spec::load_run(test::source_path("configs/runs/tiny-mllm.yaml"));
  const nn::Model model = nn::build_model(run.model, 42);
  ASSERT_TRUE(model.chain && model.chain->llm);
  const nn::DecoderShape shape = model.chain->llm->shape();
  ASSERT_EQ(shape.transformer.hidden, 128);
  Copy reference(shape);
  nn::HostOps ops(1);
  const Inputs in = make_inputs(true, shape.transformer.hidden, static_cast<int32_t>(shape.vocab));
  const Result want = run_whole(ops, reference, in);
  expect_same(run_parts(ops, reference, nn::split_decoder(2, 2), in), want, 1e-5);
  const auto ranks = run_tensor_parallel(2, nn::split_decoder(2, 2), in, shape);
  expect_tensor_parallel_matches(ranks, want, 1e-4);
}

TEST(NnParallel, TensorParallelSlicesAndGathersBack) {
  // Slicing keeps 1/size of each split parameter; size 1 again gathers the whole tensors back.
  const nn::DecoderShape shape{kShape.transformer, 16, 12};
  std::vector<Copy> copies;
  for (int r = 0; r < 2; ++r) copies.emplace_back(shape);
  const Copy reference(shape);
  run_ranks(2, [&](int r, std::function<void(Tensor&)> allreduce) {
    auto& llm = *copies[static_cast<std::size_t>(r)].llm;
    llm.set_tensor_parallel({r, 2, allreduce});
    for (const auto& s : llm.tp_splits()) {
      EXPECT_EQ(s.param->value.numel() * 2, nn::shape_numel(s.param->full_shape)) << s.param->name;
      EXPECT_EQ(s.param->grad.shape, s.param->value.shape) << s.param->name;
    }
    llm.set_tensor_parallel({});
  });
  for (const Copy& c : copies)
    for (std::size_t i = 0; i < c.store.all().size(); ++i) {
      EXPECT_TRUE(c.store.all()[i]->slice.whole());
      EXPECT_EQ(c.store.all()[i]->value.data, reference.store.all()[i]->value.data) << c.store.all()[i]->name;
    }
}

TEST(NnParallel, TensorParallelRefusesUnevenSplits) {
  Copy model;
  auto noop = [](Tensor&) {};
  test::expect_error(
      [&] {
        model.llm->set_tensor_parallel({0, 3, noop});
      },
      Status::invalid_argument, {"llm.blocks.0: 4 heads do not split over 3 tensor-parallel ranks"});
  test::expect_error(
      [&] {
        model.llm->set_tensor_parallel({0, 2, noop});
      },
      Status::invalid_argument, {"llm: vocabulary 13 does not split over 2 tensor-parallel ranks"});
  Copy odd_ffn(nn::DecoderShape{{16, 4, 18, 1, true}, 16, 12});
  test::expect_error(
      [&] {
        odd_ffn.llm->set_tensor_parallel({1, 4, noop});
      },
      Status::invalid_argument, {"llm.blocks.0: ffn width 18 does not split over 4 tensor-parallel ranks"});
  test::expect_error(
      [&] {
        model.llm->set_tensor_parallel({2, 2, noop});
      },
      Status::invalid_argument, {"llm: tensor-parallel rank 2 of 2 does not exist"});
  test::expect_error(
      [&] {
        model.llm->set_tensor_parallel({0, 2, nullptr});
      },
      Status::invalid_argument, {"llm: tensor parallelism over 2 ranks needs an allreduce_sum"});
  EXPECT_EQ(model.llm->tensor_parallel().size, 1);  // a refused group leaves the decoder as it was
}

// ---- The CLIP encoders' pipeline parts ----

// Small encoders of three blocks (splits into 2 and 3 parts), perturbed as Copy does.
const nn::ImageEncoderShape kImageShape{{16, 4, 24, 3, false}, 4, 2, 16};
const nn::TextEncoderShape kTextShape{{16, 4, 24, 3, true}, 16, 8};  // a vocabulary 2 and 4 ranks split

void perturb(nn::ParameterStore& store, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-0.3f, 0.3f);
  for (nn::Parameter* p : store.all())
    for (float& x : p->value.data) x += u(rng);
}

Tensor random_tensor(const nn::Shape& shape, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Tensor t(shape);
  for (float& x : t.data) x = u(rng);
  return t;
}

// An image encoder and its input: 2 images of 8 x 12 pixels, a 2 x 3 patch grid.
struct ImageTower {
  using Cache = nn::ImageEncoderCache;
  nn::ParameterStore store{6};
  std::unique_ptr<nn::ImageEncoder> encoder;
  Tensor images = random_tensor({2, 2, 8, 12}, 21);
  ImageTower() {
    encoder = std::make_unique<nn::ImageEncoder>(store, "vision", kImageShape, false);
    perturb(store, 41);
  }
  nn::Shape hidden_shape() const { return {2, 6, 16}; }
  nn::EncoderOutput forward(nn::Ops& ops, Cache& c) const { return encoder->forward(ops, images, c); }
  Tensor backward(nn::Ops& ops, const Tensor* dt, const Tensor* dp, const Cache& c) const {
    return encoder->backward(ops, dt, dp, c, true);
  }
  nn::EncoderOutput forward_part(nn::Ops& ops, const nn::EncoderPart& part, const Tensor* hidden, Cache& c) const {
    return encoder->forward_part(ops, part, part.first == 0 ? &images : nullptr, hidden, c);
  }
  Tensor backward_part(nn::Ops& ops, const nn::EncoderPart& part, const Tensor* dt, const Tensor* dp,
                       const Cache& c) const {
    return encoder->backward_part(ops, part, dt, dp, c, true);
  }
};

// A causal text encoder and its input: 2 captions of 6 and 4 tokens, padded to 7.
struct TextTower {
  using Cache = nn::TextEncoderCache;
  nn::ParameterStore store{7};
  std::unique_ptr<nn::TextEncoder> encoder;
  nn::Tokens tokens{2, 7, std::vector<int32_t>(14, 0), {6, 4}};
  TextTower() {
    encoder = std::make_unique<nn::TextEncoder>(store, "text", kTextShape, false);
    perturb(store, 43);
    std::mt19937 rng(23);
    std::uniform_int_distribution<int32_t> id(4, 12);
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t t = 0; t < tokens.lengths[static_cast<std::size_t>(b)]; ++t)
        tokens.ids[static_cast<std::size_t>(b * 7 + t)] = id(rng);
  }
  nn::Shape hidden_shape() const { return {2, 7, 16}; }
  nn::EncoderOutput forward(nn::Ops& ops, Cache& c) const { return encoder->forward(ops, tokens, c); }
  Tensor backward(nn::Ops& ops, const Tensor* dt, const Tensor* dp, const Cache& c) const {
    encoder->backward(ops, dt, dp, c);
    return Tensor();
  }
  nn::EncoderOutput forward_part(nn::Ops& ops, const nn::EncoderPart& part, const Tensor* hidden, Cache& c) const {
    return encoder->forward_part(ops, part, tokens, hidden, c);
  }
  Tensor backward_part(nn::Ops& ops, const nn::EncoderPart& part, const Tensor* dt, const Tensor* dp,
                       const Cache& c) const {
    return encoder->backward_part(ops, part, dt, dp, c);
  }
};

// What one encoder forward + backward produced; d_input: the images' gradient (image encoder).
struct EncoderResult {
  Tensor tokens, pooled, d_input;
  std::map<std::string, Tensor> grads;
};

// The gradients flowing back: of the tokens (null: none) and of the pooled output.
struct EncoderGrads {
  Tensor d_tokens, d_pooled;
  bool with_tokens = true;
  const Tensor* tokens_or_null() const { return with_tokens ? &d_tokens : nullptr; }
};

template <class Tower>
EncoderGrads encoder_grads(const Tower& tower, bool with_tokens) {
  const nn::Shape h = tower.hidden_shape();
  return {random_tensor(h, 51), random_tensor({h[0], h[2]}, 52), with_tokens};
}

template <class Tower>
EncoderResult run_encoder_whole(nn::Ops& ops, Tower& tower, const EncoderGrads& g) {
  tower.store.zero_grads();
  typename Tower::Cache cache;
  EncoderResult r;
  const nn::EncoderOutput out = tower.forward(ops, cache);
  r.tokens = out.tokens;
  r.pooled = out.pooled;
  r.d_input = tower.backward(ops, g.tokens_or_null(), &g.d_pooled, cache);
  r.grads = grads_of(tower.store);
  return r;
}

// The encoder through `parts` in order, then back through them in reverse.
template <class Tower>
EncoderResult run_encoder_parts(nn::Ops& ops, Tower& tower, const std::vector<nn::EncoderPart>& parts,
                                const EncoderGrads& g) {
  tower.store.zero_grads();
  std::vector<typename Tower::Cache> caches(parts.size());
  EncoderResult r;
  Tensor h;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const nn::EncoderOutput out = tower.forward_part(ops, parts[i], i == 0 ? nullptr : &h, caches[i]);
    h = out.tokens;
    EXPECT_EQ(h.shape, tower.hidden_shape()) << "part " << i;
    if (i + 1 < parts.size()) {
      EXPECT_TRUE(out.pooled.data.empty()) << "part " << i << " pooled before the last";
    } else {
      r.tokens = out.tokens;
      r.pooled = out.pooled;
    }
  }
  Tensor d;
  for (std::size_t i = parts.size(); i-- > 0;) {
    d = i + 1 == parts.size() ? tower.backward_part(ops, parts[i], g.tokens_or_null(), &g.d_pooled, caches[i])
                              : tower.backward_part(ops, parts[i], &d, nullptr, caches[i]);
    if (i > 0) {
      EXPECT_EQ(d.shape, tower.hidden_shape()) << "part " << i;
    }
  }
  r.d_input = d;
  r.grads = grads_of(tower.store);
  return r;
}

void expect_same_encoder(const EncoderResult& got, const EncoderResult& want, double tolerance) {
  EXPECT_LE(relative_error(got.tokens, want.tokens), tolerance) << "tokens";
  EXPECT_LE(relative_error(got.pooled, want.pooled), tolerance) << "pooled";
  EXPECT_EQ(got.d_input.shape, want.d_input.shape);
  if (!want.d_input.data.empty()) {
    EXPECT_LE(relative_error(got.d_input, want.d_input), tolerance) << "d input";
  }
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (const auto& [name, grad] : want.grads) {
    if (zero_gradient(name)) {
      EXPECT_LT(max_abs(got.grads.at(name)), 1e-5) << name;
      continue;
    }
    EXPECT_GT(max_abs(grad), 1e-3) << name << ": a zero reference gradient proves nothing";
    EXPECT_LE(relative_error(got.grads.at(name), grad), tolerance) << name;
  }
}

template <class Tower>
void expect_parts_match_whole(Tower& tower) {
  nn::HostOps ops(1);
  for (bool with_tokens : {true, false}) {
    const EncoderGrads g = encoder_grads(tower, with_tokens);
    const EncoderResult whole = run_encoder_whole(ops, tower, g);
    for (int stages : {1, 2, 3}) {
      SCOPED_TRACE("stages " + std::to_string(stages) + (with_tokens ? ", d tokens + d pooled" : ", d pooled"));
      expect_same_encoder(run_encoder_parts(ops, tower, nn::split_encoder(3, stages), g), whole, 1e-5);
    }
  }
}

template <class Tower>
void expect_disjoint_parts(Tower& tower, const std::string& first_name, const std::string& last_name) {
  nn::HostOps ops(1);
  const auto& encoder = *tower.encoder;
  const std::vector<nn::EncoderPart> parts = nn::split_encoder(3, 3);
  std::set<const nn::Parameter*> seen;
  std::size_t owned = 0;
  for (const auto& part : parts) {
    for (const nn::Parameter* p : encoder.part_parameters(part)) {
      EXPECT_TRUE(seen.insert(p).second) << p->name << " owned twice";
      ++owned;
    }
  }
  EXPECT_EQ(owned, encoder.parameters().size());
  EXPECT_EQ(encoder.part_parameters(parts[0]).front()->name, first_name);
  EXPECT_EQ(encoder.part_parameters(parts[2]).back()->name, last_name);
  EXPECT_EQ(encoder.part_parameters(encoder.whole()), encoder.parameters());

  // Each part's backward changes the gradients of its own parameters only.
  const EncoderGrads g = encoder_grads(tower, true);
  tower.store.zero_grads();
  std::vector<typename Tower::Cache> caches(parts.size());
  Tensor h;
  for (std::size_t i = 0; i < parts.size(); ++i)
    h = tower.forward_part(ops, parts[i], i == 0 ? nullptr : &h, caches[i]).tokens;
  Tensor d;
  for (std::size_t i = parts.size(); i-- > 0;) {
    const auto before = grads_of(tower.store);
    d = i + 1 == parts.size() ? tower.backward_part(ops, parts[i], &g.d_tokens, &g.d_pooled, caches[i])
                              : tower.backward_part(ops, parts[i], &d, nullptr, caches[i]);
    const auto mine = encoder.part_parameters(parts[i]);
    std::size_t changed = 0;
    for (const nn::Parameter* p : tower.store.all()) {
      const bool owns = std::find(mine.begin(), mine.end(), p) != mine.end();
      const bool same = p->grad.data == before.at(p->name).data;
      if (!owns) {
        EXPECT_TRUE(same) << "part " << i << " touched " << p->name;
      } else if (!same) {
        ++changed;
      }
    }
    EXPECT_GT(changed, mine.size() / 2) << "part " << i << " left its own gradients alone";
  }
}

TEST(NnParallel, SplitEncoderFollowsTheDecoderRule) {
  for (int layers : {1, 3, 7, 12})
    for (int stages = 1; stages <= layers; ++stages) {
      const auto enc = nn::split_encoder(layers, stages);
      const auto dec = nn::split_decoder(layers, stages);
      ASSERT_EQ(enc.size(), dec.size());
      for (std::size_t i = 0; i < enc.size(); ++i) {
        EXPECT_EQ(enc[i].first, dec[i].first);
        EXPECT_EQ(enc[i].last, dec[i].last);
      }
    }
  const auto parts = nn::split_encoder(7, 3);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[1].first, 3);
  EXPECT_EQ(parts[1].last, 5);
  test::expect_error([] { nn::split_encoder(3, 4); }, Status::invalid_argument,
                     {"split_encoder", "4 pipeline stages do not fit 3 encoder layers"});
  test::expect_error([] { nn::split_encoder(3, 0); }, Status::invalid_argument,
                     {"split_encoder", "at least one pipeline stage, got 0"});
}

TEST(NnParallel, ImageEncoderPartsChainedMatchTheWholeEncoder) {
  ImageTower tower;
  EXPECT_EQ(tower.encoder->layers(), 3);
  expect_parts_match_whole(tower);
}

TEST(NnParallel, TextEncoderPartsChainedMatchTheWholeEncoder) {
  TextTower tower;
  EXPECT_EQ(tower.encoder->layers(), 3);
  expect_parts_match_whole(tower);
}

TEST(NnParallel, EncoderPartsOwnDisjointParametersAndTouchOnlyTheirGradients) {
  {
    SCOPED_TRACE("image");
    ImageTower tower;
    expect_disjoint_parts(tower, "vision.patch_embed.weight", "vision.final_norm.bias");
  }
  {
    SCOPED_TRACE("text");
    TextTower tower;
    expect_disjoint_parts(tower, "text.token_embed", "text.final_norm.bias");
  }
}

TEST(NnParallel, ImageEncoderPartErrors) {
  nn::HostOps ops(1);
  ImageTower tower;
  const nn::ImageEncoder& encoder = *tower.encoder;
  nn::ImageEncoderCache cache;
  test::expect_error(
      [&] {
        encoder.part_parameters({2, 4});
      },
      Status::invalid_argument, {"vision: part [2, 4) is not a range of its 3 blocks"});
  test::expect_error(
      [&] {
        encoder.forward_part(ops, {-1, 1}, &tower.images, nullptr, cache);
      },
      Status::invalid_argument, {"vision: part [-1, 1) is not a range of its 3 blocks"});
  test::expect_error(
      [&] {
        encoder.forward_part(ops, {0, 1}, nullptr, nullptr, cache);
      },
      Status::invalid_argument, {"vision: images must be", "got none"});
  test::expect_error(
      [&] {
        encoder.forward_part(ops, {1, 3}, &tower.images, nullptr, cache);
      },
      Status::invalid_argument, {"vision: part [1, 3) takes the previous part's hidden", "got none"});
  const Tensor narrow({2, 6, 8});  // hidden 8, not 16
  test::expect_error(
      [&] {
        encoder.forward_part(ops, {1, 3}, nullptr, &narrow, cache);
      },
      Status::invalid_argument, {"vision: part [1, 3)", "got (2, 6, 8)"});
  const Tensor h = encoder.forward_part(ops, {0, 1}, &tower.images, nullptr, cache).tokens;
  test::expect_error(
      [&] {
        encoder.backward_part(ops, {1, 3}, &h, nullptr, cache);
      },
      Status::invalid_argument, {"vision: the backward of part [1, 3) got the cache of part [0, 1)"});
  const Tensor d_pooled({2, 16});
  test::expect_error(
      [&] {
        encoder.backward_part(ops, {0, 1}, &h, &d_pooled, cache);
      },
      Status::invalid_argument, {"vision: part [0, 1) does not pool"});
  test::expect_error(
      [&] {
        encoder.backward_part(ops, {0, 1}, nullptr, nullptr, cache);
      },
      Status::invalid_argument, {"vision: part [0, 1) does not pool"});
  const Tensor wrong({2, 5, 16});
  test::expect_error(
      [&] {
        encoder.backward_part(ops, {0, 1}, &wrong, nullptr, cache);
      },
      Status::invalid_argument, {"d hidden"});
  nn::ImageEncoderCache last;
  encoder.forward_part(ops, {1, 3}, nullptr, &h, last);
  test::expect_error(
      [&] {
        encoder.backward_part(ops, {1, 3}, nullptr, nullptr, last);
      },
      Status::invalid_argument, {"vision: backward needs the gradient of the tokens or of the pooled output"});
}

TEST(NnParallel, TextEncoderPartErrors) {
  nn::HostOps ops(1);
  TextTower tower;
  const nn::TextEncoder& encoder = *tower.encoder;
  nn::TextEncoderCache cache;
  test::expect_error(
      [&] {
        encoder.forward_part(ops, {3, 2}, tower.tokens, nullptr, cache);
      },
      Status::invalid_argument, {"text: part [3, 2) is not a range of its 3 blocks"});
  test::expect_error(
      [&] {
        encoder.forward_part(ops, {2, 3}, tower.tokens, nullptr, cache);
      },
      Status::invalid_argument, {"text: part [2, 3) takes the previous part's hidden (2, 7, 16)", "got none"});
  const Tensor longer({2, 8, 16});  // another caption length than the tokens'
  test::expect_error(
      [&] {
        encoder.forward_part(ops, {2, 3}, tower.tokens, &longer, cache);
      },
      Status::invalid_argument, {"text: part [2, 3)", "got (2, 8, 16)"});
  const Tensor h = encoder.forward_part(ops, {0, 2}, tower.tokens, nullptr, cache).tokens;
  test::expect_error([&] { encoder.backward_part(ops, encoder.whole(), &h, nullptr, cache); }, Status::invalid_argument,
                     {"text: the backward of part [0, 3) got the cache of part [0, 2)"});
  const Tensor d_pooled({2, 16});
  test::expect_error(
      [&] {
        encoder.backward_part(ops, {0, 2}, nullptr, &d_pooled, cache);
      },
      Status::invalid_argument, {"text: part [0, 2) does not pool"});
}

// ---- Tensor parallelism of the encoders and the projector ----

// `size` copies of a tower, each on its own thread as one TP rank, against one process: the
// outputs and input gradient the same on every rank, the split gradients' slices joined.
template <class Tower>
void expect_tensor_parallel_encoder(int size, bool sequence_parallel = false) {
  nn::HostOps ops(1);
  Tower reference;
  const EncoderGrads g = encoder_grads(reference, true);
  const EncoderResult want = run_encoder_whole(ops, reference, g);
  std::vector<Tower> towers(static_cast<std::size_t>(size));
  std::vector<EncoderResult> results(static_cast<std::size_t>(size));
  std::vector<std::map<std::string, Tensor>> grads(static_cast<std::size_t>(size));
  std::vector<std::map<std::string, nn::TensorSlice>> slices(static_cast<std::size_t>(size));
  run_ranks(size, [&](int r, std::function<void(Tensor&)> allreduce) {
    const auto i = static_cast<std::size_t>(r);
    towers[i].encoder->set_tensor_parallel(group_of(r, size, std::move(allreduce), sequence_parallel));
    nn::HostOps rank_ops(1);
    results[i] = run_encoder_whole(rank_ops, towers[i], g);
    grads[i] = results[i].grads;
    slices[i] = slices_of(towers[i].store);
  });
  for (const EncoderResult& r : results) {
    EXPECT_EQ(r.tokens.data, results[0].tokens.data);
    EXPECT_EQ(r.d_input.data, results[0].d_input.data);
  }
  EncoderResult joined = results[0];
  joined.grads = joined_grads(grads, slices, want.grads);
  expect_same_encoder(joined, want, 1e-4);
}

TEST(NnParallel, TensorParallelImageEncoderMatchesOneProcess) {
  for (int size : {2, 4}) {
    SCOPED_TRACE("TP " + std::to_string(size));
    expect_tensor_parallel_encoder<ImageTower>(size);
  }
}

TEST(NnParallel, TensorParallelTextEncoderMatchesOneProcess) {
  for (int size : {2, 4}) {
    SCOPED_TRACE("TP " + std::to_string(size));
    expect_tensor_parallel_encoder<TextTower>(size);
  }
}

TEST(NnParallel, SequenceParallelEncodersMatchOneProcess) {
  // The text tower's 7 positions padded (causal); the image tower's 6 patches split by 2 as
  // they are, and by 4 not at all (bidirectional attention would see padding): plain TP.
  for (int size : {2, 4}) {
    SCOPED_TRACE("TP " + std::to_string(size) + " with sequence parallelism");
    expect_tensor_parallel_encoder<TextTower>(size, true);
  }
  expect_tensor_parallel_encoder<ImageTower>(2, true);
  expect_tensor_parallel_encoder<ImageTower>(4, true);
}

// The collectives one layer runs under sequence parallelism, as the cost model prices braid's
// own (cost::transformer_layer_kernels with Kernels::reference): forward, each half an
// all-gather of the whole sequence before its column-parallel layer and a reduce-scatter after
// its row-parallel one; backward, each half the output gradient's all-gather, the input's
// all-gather again (the column-parallel layer kept its shard), the input gradient's
// reduce-scatter and the norm's two weight gradients all-reduced. One layer's are those of the
// text tower's first two layers less those of its first.
TEST(NnParallel, ASequenceParallelLayerRunsTheCollectivesTheCostModelPrices) {
  using Calls = std::map<std::string, std::vector<std::size_t>>;  // floats of each call, rank 0's
  auto collectives = [](int layers) {
    std::array<Calls, 2> seen;  // forward, backward
    TextTower towers[2];
    run_ranks(2, [&](int r, std::function<void(Tensor&)> allreduce) {
      int pass = 0;
      auto note = [&, r](const char* kind, std::size_t floats) {
        if (r == 0) seen[static_cast<std::size_t>(pass)][kind].push_back(floats);
      };
      nn::TensorParallel tp = group_of(r, 2, allreduce, true);
      tp.allreduce_sum = [note, sum = tp.allreduce_sum](Tensor& t) {
        note("all-reduce", static_cast<std::size_t>(t.numel()));
        sum(t);
      };
      tp.allgather = [note, gather = tp.allgather](std::span<const float> mine, std::span<float> all) {
        note("all-gather", all.size());
        gather(mine, all);
      };
      tp.reduce_scatter = [note, scatter = tp.reduce_scatter](std::span<const float> all, std::span<float> mine) {
        note("reduce-scatter", all.size());
        scatter(all, mine);
      };
      TextTower& tower = towers[r];
      tower.encoder->set_tensor_parallel(tp);
      nn::HostOps ops(1);
      const nn::EncoderPart part{0, layers};
      nn::TextEncoderCache cache;
      const nn::EncoderOutput out = tower.forward_part(ops, part, nullptr, cache);
      pass = 1;
      const Tensor dy(out.tokens.shape, 0.5f);
      tower.backward_part(ops, part, &dy, nullptr, cache);
    });
    return seen;
  };
  const auto one = collectives(1), two = collectives(2);
  auto layer = [&](int pass) {  // the second layer's calls: those of two layers past the first's
    Calls out;
    for (const auto& [kind, calls] : two[static_cast<std::size_t>(pass)]) {
      std::multiset<std::size_t> left(calls.begin(), calls.end());
      const auto it = one[static_cast<std::size_t>(pass)].find(kind);
      if (it != one[static_cast<std::size_t>(pass)].end())
        for (std::size_t f : it->second) {
          const auto found = left.find(f);
          if (found == left.end()) {
            ADD_FAILURE() << "two layers lack a " << kind << " of " << f << " floats that one layer runs";
            continue;
          }
          left.erase(found);
        }
      if (!left.empty()) out[kind] = {left.begin(), left.end()};
    }
    return out;
  };
  // 2 sequences padded to 8 positions (a multiple of the group) x hidden 16: the whole sequence.
  const std::size_t sbh = 2 * 8 * 16, norm = 2 * 16;
  EXPECT_EQ(layer(0), (Calls{{"all-gather", {sbh, sbh}}, {"reduce-scatter", {sbh, sbh}}}));
  EXPECT_EQ(
      layer(1),
      (Calls{{"all-gather", {sbh, sbh, sbh, sbh}}, {"all-reduce", {norm, norm}}, {"reduce-scatter", {sbh, sbh}}}));

  // The cost model counts as many each way: the waits Optimus' fine pass fills.
  auto run = test::load("tiny-mllm.yaml");
  run.training.sequence_parallel = true;
  const cost::CostModel cost(run, {}, cost::Kernels::reference);
  std::array<double, 2> priced{};
  for (const auto& k : cost.layer_kernels(run.model.index_of("llm"), 2, 1)) {
    priced[0] += k.cost.collectives_forward;
    priced[1] += k.cost.collectives_backward;
  }
  for (int pass : {0, 1}) {
    std::size_t calls = 0;
    for (const auto& [kind, sizes] : layer(pass)) calls += sizes.size();
    EXPECT_EQ(priced[static_cast<std::size_t>(pass)], static_cast<double>(calls)) << (pass ? "backward" : "forward");
  }
}

TEST(NnParallel, TensorParallelProjectorMatchesOneProcess) {
  // One layer (row-parallel on a slice of its input), two (a column/row pair), three (a pair,
  // then a row-parallel layer on a slice of the pair's whole output).
  for (int64_t layers : {1, 2, 3}) {
    for (int size : {2, 4}) {
      SCOPED_TRACE(std::to_string(layers) + " layers, TP " + std::to_string(size));
      auto build = [&](nn::ParameterStore& store) {
        auto p = std::make_unique<nn::Projector>(store, "projector", 8, 16, 12, layers, false);
        perturb(store, 61);
        return p;
      };
      const Tensor x = random_tensor({2, 3, 8}, 62), dy = random_tensor({2, 3, 12}, 63);
      nn::HostOps ops(1);
      nn::ParameterStore reference_store(9);
      const auto reference = build(reference_store);
      nn::ProjectorCache cache;
      const Tensor want_y = reference->forward(ops, x, cache);
      const Tensor want_dx = reference->backward(ops, dy, cache);
      const auto want_grads = grads_of(reference_store);
      std::vector<nn::ParameterStore> stores;
      for (int r = 0; r < size; ++r) stores.emplace_back(9);
      std::vector<std::unique_ptr<nn::Projector>> copies;
      for (auto& store : stores) copies.push_back(build(store));
      std::vector<std::map<std::string, Tensor>> grads(static_cast<std::size_t>(size));
      std::vector<std::map<std::string, nn::TensorSlice>> slices(static_cast<std::size_t>(size));
      run_ranks(size, [&](int r, std::function<void(Tensor&)> allreduce) {
        const auto i = static_cast<std::size_t>(r);
        copies[i]->set_tensor_parallel({r, size, std::move(allreduce)});
        nn::HostOps rank_ops(1);
        nn::ProjectorCache c;
        const Tensor y = copies[i]->forward(rank_ops, x, c);
        const Tensor dx = copies[i]->backward(rank_ops, dy, c);
        EXPECT_LE(relative_error(y, want_y), 1e-5);
        EXPECT_LE(relative_error(dx, want_dx), 1e-5);
        grads[i] = grads_of(stores[i]);
        slices[i] = slices_of(stores[i]);
      });
      for (const auto& [name, g] : joined_grads(grads, slices, want_grads))
        EXPECT_LE(relative_error(g, want_grads.at(name)), 1e-5) << name;
    }
  }
  nn::ParameterStore store;
  nn::Projector odd(store, "projector", 8, 6, 12, 2, false);
  test::expect_error(
      [&] {
        odd.set_tensor_parallel({0, 4, [](Tensor&) {}});
      },
      Status::invalid_argument, {"projector.layers.0: width 6 does not split over 4 tensor-parallel ranks"});
}

}  // namespace
}  // namespace braid
