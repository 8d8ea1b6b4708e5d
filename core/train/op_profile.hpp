// `braid train --profile-ops`: the ops of every rank's timed steps, by op, measured against
// what the cost model charges for the same calls (its rule for each kind of kernel, at the
// cluster file's rates). Where a step measures off its simulation, this tells a mispriced
// kernel from time spent outside the ops (between them, or in what the model has no price
// for), kernel by kernel.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/cost/cost_model.hpp"
#include "core/nn/timed_ops.hpp"
#include "core/runtime/communicator.hpp"

namespace braid::train {

// The seconds the cost model charges one call of `call.op` on its sizes: a linear op's GEMMs,
// norms and activations at the element-wise rates, residual adds, fills and scales at the
// streaming rate, the attention core, embeddings, cross-entropy, the contrastive loss and
// AdamW as the blocks and the optimizer price them. Nothing for an op the model has no price
// for (copies between host and device).
std::optional<double> priced_call(const cost::CostModel& cost, const nn::OpCall& call);

struct OpProfileRow {
  std::string op;
  double calls = 0, measured_s = 0, priced_s = 0;  // per rank and step, mean over the ranks
  bool priced = false;
  double ratio() const { return priced && priced_s > 0 ? measured_s / priced_s : 0; }
};

struct OpProfile {
  std::int64_t steps = 0;
  int ranks = 0;
  std::vector<OpProfileRow> rows;  // the ops that ran, most measured time first
  // Over every op, and over the priced ones alone (per rank and step).
  double measured_s() const;
  double priced_measured_s() const;
  double priced_s() const;
};

// Collective over `world`: each rank's `calls` over its `steps` timed steps, priced on `cost`,
// averaged over the ranks.
OpProfile gather_op_profile(const std::map<nn::OpCall, nn::OpTimes>& calls, std::int64_t steps,
                            const cost::CostModel& cost, runtime::Communicator& world);

// The table `braid train` prints; `compute_s` is the instructions' measured compute per rank
// and step (StepComparison), which the ops' total is a part of.
std::string format_op_profile(const OpProfile& p, double compute_s);
// {"step": step, "op_profile": true, "steps", "ranks", "ops": [{op, calls, measured_s, priced_s}]}
std::string op_profile_json(const OpProfile& p, std::int64_t step);

}  // namespace braid::train
