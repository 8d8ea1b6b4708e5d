// Inter-microbatch reordering (DistTrain): the order in which one pipeline runs its
// microbatches. Under 1F1B the first microbatches fill the pipeline and the last ones
// drain it, so where an expensive microbatch runs changes the step time; this picks
// the order with a fast 1F1B step-time evaluator, a few heuristic orders and local search.
#pragma once

#include <span>
#include <vector>

namespace braid::data {

// Times of one linear pipeline (stage s feeds stage s + 1), per stage and microbatch.
struct PipelineTimes {
  int stages = 0, microbatches = 0;
  std::vector<double> forward, backward;  // [stage * microbatches + mb]: compute + exposed TP
  std::vector<double> send_activation;    // per stage: one activation message to the next (empty: 0)
  std::vector<double> send_grad;          // per stage: one gradient message to the previous (empty: 0)
  // Per stage: what runs after its last backward (its gradient reduction, its optimizer step);
  // empty: 0. The step ends when the last stage's tail does, so a stage with a long tail must
  // finish its backwards early.
  std::vector<double> tail;

  double f(int s, int mb) const { return forward[static_cast<std::size_t>(s * microbatches + mb)]; }
  double b(int s, int mb) const { return backward[static_cast<std::size_t>(s * microbatches + mb)]; }
};

// Step time of Megatron's 1F1B (stage s runs min(stages - s - 1, m) warm-up forwards,
// then one forward one backward, then the remaining backwards, then its tail) when the k-th
// microbatch of the schedule is microbatch order[k]. Each stage has a compute stream and a send
// stream, receives wait for their message: the same model as braid::sim::simulate on the
// program one_f_one_b builds, computed by a recurrence over each stage's instruction order.
double one_f_one_b_step(const PipelineTimes& t, std::span<const int> order);

struct OrderSearch {
  std::vector<int> order;     // order[k]: the microbatch run k-th
  double step_s = 0;          // step time of `order`
  double input_step_s = 0;    // step time of the input order 0, 1, ..., m-1
  long long evaluations = 0;  // step times computed
};

struct OrderOptions {
  // Budget of the local search; every starting order is timed even past it.
  long long max_evaluations = 2000;
};

// Best of the input order and a few heuristic orders, improved by local search (swaps
// and moves of one microbatch, first improvement) until no move helps or the budget is
// spent. Never worse than the input order. Deterministic.
OrderSearch order_microbatches(const PipelineTimes& t, const OrderOptions& options = {});
// Every order (m! of them), for measuring the search's gap on small cases. m <= 10.
OrderSearch best_order_exhaustive(const PipelineTimes& t);

}  // namespace braid::data
