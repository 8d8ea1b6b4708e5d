// The decoder's model splits, in one process: pipeline parts chained one after another, and
// Megatron tensor parallelism with each rank on its own std::thread, its own HostOps and its
// own copy of the model, the all-reduce an in-test barrier sum. Both must reproduce the whole
// decoder's logits, loss, parameter gradients and prefix gradient.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/nn/host_ops.hpp"
#include "core/nn/modules/decoder.hpp"
#include "core/nn/modules/model.hpp"
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
};

std::map<std::string, Tensor> grads_of(const nn::ParameterStore& store) {
  std::map<std::string, Tensor> grads;
  for (const nn::Parameter* p : store.all()) grads[p->name] = p->grad;
  return grads;
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
  r.loss = nn::lm_loss(ops, r.logits, in.text, 0, &d);
  for (std::size_t i = parts.size(); i-- > 0;) d = model.llm->backward_part(ops, parts[i], d, caches[i]);
  r.dprefix = d;
  r.grads = grads_of(model.store);
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

// Runs `parts` on `size` TP ranks, one thread and one model copy each.
std::vector<Result> run_tensor_parallel(int size, const std::vector<nn::DecoderPart>& parts, const Inputs& in,
                                        const nn::DecoderShape& shape, int* allreduces = nullptr) {
  BarrierSum group(size);
  std::vector<Copy> copies;
  copies.reserve(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) copies.emplace_back(shape);
  for (int r = 0; r < size; ++r)
    copies[static_cast<std::size_t>(r)].llm->set_tensor_parallel(
        {r, size, [&group, r](Tensor& t) { group.sum(r, t); }});
  std::vector<Result> results(static_cast<std::size_t>(size));
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      try {
        nn::HostOps ops(1);
        const auto i = static_cast<std::size_t>(r);
        results[i] = run_parts(ops, copies[i], parts, in);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
        group.abort();
      }
    });
  for (auto& t : threads) t.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  if (allreduces) *allreduces = group.calls();
  return results;
}

// Checks TP ranks against one process: replicated values equal on every rank, sharded
// gradients summed over the ranks.
void expect_tensor_parallel_matches(const std::vector<Result>& ranks, const Result& want,
                                    const std::vector<nn::Parameter*>& sharded, double tolerance) {
  std::set<std::string> sharded_names;
  for (const nn::Parameter* p : sharded) sharded_names.insert(p->name);
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    Result replicated = ranks[r];
    for (const auto& name : sharded_names) {
      Tensor sum = ranks[0].grads.at(name);
      for (std::size_t o = 1; o < ranks.size(); ++o)
        for (std::size_t i = 0; i < sum.data.size(); ++i) sum.data[i] += ranks[o].grads.at(name).data[i];
      replicated.grads[name] = sum;
      // A rank fills its slice only: the other (size - 1) / size of the tensor stays zero.
      const Tensor& mine = ranks[r].grads.at(name);
      const auto zeros = std::count(mine.data.begin(), mine.data.end(), 0.0f);
      EXPECT_GE(zeros, mine.numel() - mine.numel() / static_cast<int64_t>(ranks.size())) << name;
      if (!zero_gradient(name)) {
        EXPECT_LT(zeros, mine.numel()) << name << ": this rank's slice is empty";
      }
    }
    expect_same(replicated, want, tolerance);
  }
}

TEST(NnParallel, TensorParallelDecoderMatchesOneProcess) {
  Copy reference;
  nn::HostOps ops(1);
  const auto sharded = reference.llm->tp_sharded_parameters();
  ASSERT_EQ(sharded.size(), 3u * 10u);  // q, k, v, fc1 weight + bias; out, fc2 weight
  EXPECT_EQ(sharded[0]->name, "llm.blocks.0.attn.q.weight");
  for (bool with_prefix : {false, true}) {
    const Inputs in = make_inputs(with_prefix);
    const Result want = run_whole(ops, reference, in);
    for (int size : {2, 4}) {
      SCOPED_TRACE("TP " + std::to_string(size) + (with_prefix ? ", prefix" : ", no prefix"));
      int allreduces = 0;
      const auto ranks = run_tensor_parallel(size, {nn::DecoderPart{0, 3}}, in, kShape, &allreduces);
      EXPECT_EQ(allreduces, size * 3 * 4);  // per rank and block: 2 forward, 2 backward
      expect_tensor_parallel_matches(ranks, want, sharded, 1e-4);
    }
  }
}

TEST(NnParallel, TensorParallelWithPipelinePartsMatchesOneProcess) {
  Copy reference;
  nn::HostOps ops(1);
  const Inputs in = make_inputs(true);
  const Result want = run_whole(ops, reference, in);
  const auto ranks = run_tensor_parallel(2, nn::split_decoder(3, 2), in, kShape);
  expect_tensor_parallel_matches(ranks, want, reference.llm->tp_sharded_parameters(), 1e-4);
  // The first part's sharded parameters are those of its blocks.
  EXPECT_EQ(reference.llm->tp_sharded_parameters({0, 2}).size(), 20u);
  EXPECT_EQ(reference.llm->tp_sharded_parameters({2, 3}).front()->name, "llm.blocks.2.attn.q.weight");
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
  expect_tensor_parallel_matches(ranks, want, reference.llm->tp_sharded_parameters(), 1e-4);
}

TEST(NnParallel, TensorParallelRefusesUnevenSplits) {
  Copy model;
  auto noop = [](Tensor&) {};
  test::expect_error(
      [&] {
        model.llm->set_tensor_parallel({0, 3, noop});
      },
      Status::invalid_argument, {"llm.blocks.0: 4 heads do not split over 3 tensor-parallel ranks"});
  Copy odd_ffn(nn::DecoderShape{{16, 4, 18, 1, true}, 13, 12});
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

}  // namespace
}  // namespace braid
