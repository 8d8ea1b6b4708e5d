#include "core/train/op_profile.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/common/error.hpp"
#include "core/common/text.hpp"

namespace braid::train {

// Each call as the op runs it: fused, without dropout (the reference ops have neither the
// unfused kernels' extra passes nor dropout, which the blocks price where a run asks for them).
std::optional<double> priced_call(const cost::CostModel& cost, const nn::OpCall& call) {
  const cost::DeviceModel& dev = cost.device();
  const cost::BlockContext ctx = cost.kernel_context();
  const double E = dev.element_bytes();
  const auto d = [&](std::size_t i) { return static_cast<double>(call.dims[i]); };
  const std::string_view op = call.op;
  // A linear op: activations [m, k] through a weight [k, n]; backward the input's gradient
  // [m, n] x [n, k] and the weight's [k, m] x [m, n], each where it was asked for.
  if (op == "linear_forward") return dev.linear_gemm_seconds(d(0), d(1), d(2));
  if (op == "linear_backward")
    return (call.dims[3] & 1 ? dev.linear_gemm_seconds(d(0), d(2), d(1)) : 0.0) +
           (call.dims[3] & 2 ? dev.linear_gemm_seconds(d(2), d(1), d(0)) : 0.0);
  if (op == "layernorm_forward") return cost::elementwise_op(cost::norm_bytes(d(0), E), ctx).forward_s;
  if (op == "layernorm_backward") return cost::elementwise_op(cost::norm_bytes(d(0), E), ctx).backward_s;
  if (op == "gelu_forward") return cost::elementwise_op(cost::activation_bytes(d(0), false, E), ctx).forward_s;
  if (op == "gelu_backward") return cost::elementwise_op(cost::activation_bytes(d(0), false, E), ctx).backward_s;
  if (op == "add") return cost::residual_op(cost::residual_bytes(d(0), E), ctx).forward_s;
  if (op == "attention_forward" || op == "attention_backward") {
    const cost::BlockCost c = cost::attention_core(d(1), d(2), d(3), d(0), call.dims[4] != 0, false, ctx);
    return op == "attention_forward" ? c.forward_s : c.backward_s;
  }
  if (op == "embedding_forward") return cost::embedding_op(d(0), d(1), ctx).forward_s;
  if (op == "embedding_backward") return cost::embedding_op(d(0), d(1), ctx).backward_s;
  if (op == "patch_embedding_forward") return cost::patch_projection_op(d(0), d(1), d(2), ctx).forward_s;
  if (op == "patch_embedding_backward")
    return call.dims[3] ? cost::patch_projection_op(d(0), d(1), d(2), ctx).backward_s : 0.0;
  if (op == "cross_entropy") {  // the loss and, in the same call, its gradient
    const cost::BlockCost c = cost::elementwise_op(cost::cross_entropy_bytes(d(0), d(1), E), ctx);
    return c.forward_s + (call.dims[2] ? c.backward_s : 0.0);
  }
  if (op == "adamw_step")
    return dev.optimizer_memory_seconds(d(0) * cost::adamw_bytes_per_parameter(cost.run().training.precision));
  if (op == "zero") return cost::zero_seconds(d(0), ctx);
  if (op == "scale") return cost::scale_seconds(d(0), ctx);
  if (op == "squared_norm") return cost::squared_norm_seconds(d(0), ctx);
  if (op == "l2_normalize_forward") return cost::elementwise_op(cost::norm_bytes(d(0), E), ctx).forward_s;
  if (op == "l2_normalize_backward") return cost::elementwise_op(cost::norm_bytes(d(0), E), ctx).backward_s;
  if (op == "contrastive_loss") {  // the loss, and with gradients the whole op the batch-sync step prices
    const cost::BlockCost c = cost::contrastive_loss_op(d(0), d(1), d(2), ctx);
    return c.forward_s + (call.dims[3] ? c.backward_s : 0.0);
  }
  return std::nullopt;
}

double OpProfile::measured_s() const {
  double s = 0;
  for (const auto& r : rows) s += r.measured_s;
  return s;
}

double OpProfile::priced_measured_s() const {
  double s = 0;
  for (const auto& r : rows)
    if (r.priced) s += r.measured_s;
  return s;
}

double OpProfile::priced_s() const {
  double s = 0;
  for (const auto& r : rows) s += r.priced_s;
  return s;
}

OpProfile gather_op_profile(const std::map<nn::OpCall, nn::OpTimes>& calls, std::int64_t steps,
                            const cost::CostModel& cost, runtime::Communicator& world) {
  constexpr std::size_t kOps = nn::kTimedOps.size(), kFields = 4;  // calls, measured, priced, priced at all
  std::vector<double> mine(kOps * kFields, 0.0);
  for (const auto& [call, t] : calls) {
    const auto at = std::find(nn::kTimedOps.begin(), nn::kTimedOps.end(), call.op);
    if (at == nn::kTimedOps.end())
      throw Error(Status::internal, "op profile: '" + std::string(call.op) + "' is not in nn::kTimedOps");
    double* row = &mine[static_cast<std::size_t>(at - nn::kTimedOps.begin()) * kFields];
    const std::optional<double> price = priced_call(cost, call);
    row[0] += static_cast<double>(t.calls);
    row[1] += t.seconds;
    row[2] += price.value_or(0.0) * static_cast<double>(t.calls);
    if (price) row[3] = 1;
  }
  const int ranks = world.size();
  std::vector<double> all(mine.size() * static_cast<std::size_t>(ranks));
  world.allgather(std::as_bytes(std::span<const double>(mine)), std::as_writable_bytes(std::span<double>(all)));
  OpProfile p;
  p.steps = steps;
  p.ranks = ranks;
  const double per = steps > 0 ? 1.0 / (static_cast<double>(steps) * ranks) : 0.0;
  for (std::size_t o = 0; o < kOps; ++o) {
    OpProfileRow row{std::string(nn::kTimedOps[o])};
    for (int r = 0; r < ranks; ++r) {
      const double* f = &all[(static_cast<std::size_t>(r) * kOps + o) * kFields];
      row.calls += f[0] * per;
      row.measured_s += f[1] * per;
      row.priced_s += f[2] * per;
      row.priced = row.priced || f[3] > 0;
    }
    if (row.calls > 0) p.rows.push_back(std::move(row));
  }
  std::stable_sort(p.rows.begin(), p.rows.end(),
                   [](const OpProfileRow& a, const OpProfileRow& b) { return a.measured_s > b.measured_s; });
  return p;
}

std::string format_op_profile(const OpProfile& p, double compute_s) {
  std::string out = "ops per rank and step (mean of " + std::to_string(p.steps) + " steps and " +
                    std::to_string(p.ranks) + (p.ranks == 1 ? " rank" : " ranks") +
                    "), measured and as the cost model prices the same calls:\n";
  out += pad("op", 26) + pad("calls", 8, true) + pad("measured", 12, true) + pad("priced", 12, true) +
         pad("measured/priced", 17, true) + "\n";
  for (const auto& r : p.rows)
    out += pad(r.op, 26) + pad(fixed(r.calls, 1), 8, true) + pad(seconds(r.measured_s), 12, true) +
           pad(r.priced ? seconds(r.priced_s) : "-", 12, true) + pad(r.priced ? fixed(r.ratio(), 2) : "-", 17, true) +
           "\n";
  const double priced = p.priced_s();
  out += "priced ops: measured " + seconds(p.priced_measured_s()) + ", priced " + seconds(priced) +
         (priced > 0 ? ": measured/priced " + fixed(p.priced_measured_s() / priced, 2) : std::string()) + "; all ops " +
         seconds(p.measured_s()) + " of the instructions' measured compute " + seconds(compute_s) +
         " (the rest runs between the ops)\n";
  return out;
}

std::string op_profile_json(const OpProfile& p, std::int64_t step) {
  nlohmann::ordered_json ops = nlohmann::ordered_json::array();
  for (const auto& r : p.rows) {
    nlohmann::ordered_json o{{"op", r.op}, {"calls", r.calls}, {"measured_s", r.measured_s}};
    if (r.priced) o["priced_s"] = r.priced_s;
    ops.push_back(std::move(o));
  }
  nlohmann::ordered_json j{{"step", step}, {"op_profile", true}, {"steps", p.steps}, {"ranks", p.ranks}, {"ops", ops}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace braid::train
