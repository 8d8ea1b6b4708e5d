#include "core/data/microbatch_order.hpp"

#include <algorithm>
#include <numeric>
#include <string>

#include "core/common/error.hpp"

namespace braid::data {
namespace {

// The 1F1B recurrence. Which instruction waits on which does not depend on the times,
// so the constructor finds once an order of all 2 x stages x m instructions in which
// each comes after what it waits on (each stage's own in program order); a step time
// is then one pass over that list, as cheap as it gets for the many orders a search tries.
class StepEvaluator {
 public:
  explicit StepEvaluator(const PipelineTimes& t) : t_(t) {
    const int S = t.stages, m = t.microbatches;
    if (S < 1 || m < 1) throw Error(Status::invalid_argument, "a pipeline needs at least one stage and microbatch");
    const auto cells = static_cast<std::size_t>(S) * static_cast<std::size_t>(m);
    if (t.forward.size() != cells || t.backward.size() != cells) {
      throw Error(Status::invalid_argument, "pipeline times need " + std::to_string(cells) +
                                                " forward and backward times (stages x microbatches)");
    }
    const auto n = static_cast<std::size_t>(S);
    if ((!t.send_activation.empty() && t.send_activation.size() != n) ||
        (!t.send_grad.empty() && t.send_grad.size() != n) || (!t.tail.empty() && t.tail.size() != n)) {
      throw Error(Status::invalid_argument, "pipeline send and tail times need one entry per stage");
    }
    for (int s = 0; s < S; ++s) {
      send_act_.push_back(t.send_activation.empty() ? 0 : t.send_activation[static_cast<std::size_t>(s)]);
      send_grad_.push_back(t.send_grad.empty() ? 0 : t.send_grad[static_cast<std::size_t>(s)]);
      tail_.push_back(t.tail.empty() ? 0 : t.tail[static_cast<std::size_t>(s)]);
    }
    arrival_.resize(2 * cells);
    compute_.resize(n);
    send_.resize(n);
    schedule();
  }

  double operator()(std::span<const int> order) {
    std::fill(compute_.begin(), compute_.end(), 0.0);
    std::fill(send_.begin(), send_.end(), 0.0);
    for (const Step& x : steps_) {
      const auto s = static_cast<std::size_t>(x.stage);
      const int mb = order[static_cast<std::size_t>(x.k)];
      const double ready = x.input < 0 ? 0 : arrival_[static_cast<std::size_t>(x.input)];
      const double end = std::max(compute_[s], ready) + (x.forward ? t_.f(x.stage, mb) : t_.b(x.stage, mb));
      compute_[s] = end;
      if (x.output >= 0) {
        send_[s] = std::max(send_[s], end) + (x.forward ? send_act_[s] : send_grad_[s]);
        arrival_[static_cast<std::size_t>(x.output)] = send_[s];
      }
    }
    double end = 0;
    for (std::size_t s = 0; s < compute_.size(); ++s) end = std::max(end, compute_[s] + tail_[s]);
    return end;
  }

 private:
  struct Step {
    int stage, k;
    bool forward;
    int input, output;  // arrival_ slots it waits on and fills (-1: none)
  };

  // Megatron's 1F1B on stage s: min(S - s - 1, m) warm-up forwards, pairs, drain backwards.
  static std::pair<bool, int> instruction(int S, int m, int s, int pc) {
    const int warmup = std::min(S - s - 1, m);
    if (pc < warmup) return {true, pc};
    if (pc < 2 * m - warmup) {
      const bool forward = (pc - warmup) % 2 == 0;
      return {forward, forward ? warmup + (pc - warmup) / 2 : (pc - warmup) / 2};
    }
    return {false, pc - m};
  }

  void schedule() {
    const int S = t_.stages, m = t_.microbatches;
    // arrival_ slots: activations of (stage, k) at [stage * m + k], gradients after them.
    auto act = [&](int s, int k) { return s * m + k; };
    auto grad = [&](int s, int k) { return S * m + s * m + k; };
    std::vector<char> known(static_cast<std::size_t>(2 * S * m), 0);
    std::vector<int> pc(static_cast<std::size_t>(S), 0);
    bool progress = true;
    while (progress) {
      progress = false;
      for (int s = 0; s < S; ++s) {
        auto& p = pc[static_cast<std::size_t>(s)];
        while (p < 2 * m) {
          const auto [forward, k] = instruction(S, m, s, p);
          const int input = forward ? (s > 0 ? act(s, k) : -1) : (s + 1 < S ? grad(s, k) : -1);
          if (input >= 0 && !known[static_cast<std::size_t>(input)]) break;
          const int output = forward ? (s + 1 < S ? act(s + 1, k) : -1) : (s > 0 ? grad(s - 1, k) : -1);
          if (output >= 0) known[static_cast<std::size_t>(output)] = 1;
          steps_.push_back({s, k, forward, input, output});
          ++p;
          progress = true;
        }
      }
    }
    if (steps_.size() != static_cast<std::size_t>(2 * S * m)) throw Error(Status::internal, "1F1B order deadlocks");
  }

  const PipelineTimes& t_;
  std::vector<Step> steps_;
  std::vector<double> send_act_, send_grad_, tail_;
  std::vector<double> arrival_;         // when an activation or gradient reaches its stage
  std::vector<double> compute_, send_;  // when each stream of a stage is free
};

void check_order(std::span<const int> order, int m) {
  std::vector<char> seen(static_cast<std::size_t>(m), 0);
  bool ok = static_cast<int>(order.size()) == m;
  for (int k : order) {
    ok = ok && k >= 0 && k < m && !seen[static_cast<std::size_t>(k)];
    if (ok) seen[static_cast<std::size_t>(k)] = 1;
  }
  if (!ok)
    throw Error(Status::invalid_argument, "an order must list each of the " + std::to_string(m) + " microbatches once");
}

// Candidate starting orders, from the shape of 1F1B: the first microbatches' forwards fill
// the pipeline and the last ones' backwards drain it, while the steady state in between
// hides variation; so light microbatches belong at the ends.
std::vector<std::vector<int>> heuristic_orders(const PipelineTimes& t) {
  const int m = t.microbatches;
  std::vector<double> work(static_cast<std::size_t>(m), 0);
  for (int s = 0; s < t.stages; ++s)
    for (int k = 0; k < m; ++k) work[static_cast<std::size_t>(k)] += t.f(s, k) + t.b(s, k);
  std::vector<int> light(static_cast<std::size_t>(m));
  std::iota(light.begin(), light.end(), 0);
  std::stable_sort(light.begin(), light.end(),
                   [&](int a, int b) { return work[static_cast<std::size_t>(a)] < work[static_cast<std::size_t>(b)]; });
  std::vector<int> valley(static_cast<std::size_t>(m));  // lightest at both ends, heaviest in the middle
  for (int i = 0, front = 0, back = m - 1; i < m; ++i)
    valley[static_cast<std::size_t>(i % 2 == 0 ? front++ : back--)] = light[static_cast<std::size_t>(i)];
  std::vector<int> heavy(light.rbegin(), light.rend());
  return {light, valley, heavy};
}

}  // namespace

double one_f_one_b_step(const PipelineTimes& t, std::span<const int> order) {
  check_order(order, t.microbatches);
  return StepEvaluator(t)(order);
}

OrderSearch order_microbatches(const PipelineTimes& t, const OrderOptions& options) {
  StepEvaluator eval(t);
  const int m = t.microbatches;
  long long evaluations = 0;
  auto step = [&](std::span<const int> o) {
    ++evaluations;
    return eval(o);
  };
  // First-improvement descent over swaps and moves of one microbatch from `order`.
  auto descend = [&](std::vector<int> order, long long budget) {
    double best = step(order);
    // A move must gain more than rounding noise, so the descent ends.
    auto better = [&](double s) { return s < best * (1 - 1e-12); };
    std::vector<int> trial;
    bool improved = true;
    while (improved && evaluations < budget) {
      improved = false;
      for (int i = 0; i < m && evaluations < budget; ++i) {
        for (int j = i + 1; j < m && evaluations < budget; ++j) {
          std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(j)]);
          const double s = step(order);
          if (better(s)) {
            best = s, improved = true;
          } else {
            std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(j)]);
          }
        }
      }
      for (int i = 0; i < m && evaluations < budget; ++i) {
        for (int j = 0; j < m && evaluations < budget; ++j) {
          if (j >= i - 1 && j <= i + 1) continue;  // a no-op, or a swap already tried
          trial = order;                           // the i-th microbatch moved to position j
          const int mb = trial[static_cast<std::size_t>(i)];
          trial.erase(trial.begin() + i);
          trial.insert(trial.begin() + j, mb);
          const double s = step(trial);
          if (better(s)) best = s, order = trial, improved = true;
        }
      }
    }
    return std::make_pair(best, order);
  };
  OrderSearch r;
  r.order.resize(static_cast<std::size_t>(m));
  std::iota(r.order.begin(), r.order.end(), 0);
  r.input_step_s = step(r.order);
  auto starts = heuristic_orders(t);
  starts.insert(starts.begin(), r.order);
  // Descend from every start, each with an equal share of what is left of the budget:
  // 1F1B's step time has many local optima, and the starts land in different ones.
  for (std::size_t i = 0; i < starts.size(); ++i) {
    const long long share = (options.max_evaluations - evaluations) / static_cast<long long>(starts.size() - i);
    auto [s, o] = descend(starts[i], evaluations + std::max(1LL, share));
    if (i == 0 || s < r.step_s) r.step_s = s, r.order = std::move(o);
  }
  r.evaluations = evaluations;
  return r;
}

OrderSearch best_order_exhaustive(const PipelineTimes& t) {
  const int m = t.microbatches;
  if (m > 10)
    throw Error(Status::invalid_argument,
                "exhaustive search over " + std::to_string(m) + "! orders is too slow (at most 10 microbatches)");
  StepEvaluator eval(t);
  OrderSearch r;
  std::vector<int> order(static_cast<std::size_t>(m));
  std::iota(order.begin(), order.end(), 0);
  r.order = order;
  r.input_step_s = r.step_s = eval(order);
  r.evaluations = 1;
  while (std::next_permutation(order.begin(), order.end())) {
    const double s = eval(order);
    ++r.evaluations;
    if (s < r.step_s) r.step_s = s, r.order = order;
  }
  return r;
}

}  // namespace braid::data
