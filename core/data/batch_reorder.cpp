#include "core/data/batch_reorder.hpp"

#include <string>

#include "core/common/error.hpp"
#include "core/data/sample_cost.hpp"

namespace braid::data {
namespace {

// The host's per-plan-module costs as a samples x model-modules matrix, and each
// module's mean as the reference load (the host's unit is unknown; ratios are not).
void host_costs(const HostBatch& b, const plan::Plan& plan, std::size_t model_modules, std::vector<double>& costs,
                std::vector<double>& reference) {
  const auto& placements = plan.modules;
  const std::size_t M = model_modules, P = placements.size();
  costs.assign(b.samples * M, 0);
  reference.assign(M, 0);
  for (std::size_t i = 0; i < b.samples; ++i) {
    for (std::size_t j = 0; j < P; ++j) {
      const double c = b.placement_costs[i * P + j];
      if (!(c >= 0 && c < 1e300)) {
        throw Error(Status::invalid_argument, "module_costs of sample " + std::to_string(i) + ", module " +
                                                  std::to_string(j) + " is not a finite non-negative number");
      }
      const auto m = static_cast<std::size_t>(placements[j].module);
      costs[i * M + m] += c;
      reference[m] += c / static_cast<double>(b.samples);
    }
  }
}

// The cost model's price of each sample's sizes, and of a nominal sample as the reference.
void priced_costs(const HostBatch& b, const spec::RunSpec& run, std::vector<double>& costs,
                  std::vector<double>& reference) {
  spec::RunSpec priced = run;
  priced.data = covering(run.data, b.sizes);
  const SampleCost pricing(priced);
  costs = pricing.batch_costs(b.sizes);
  for (int m = 0; m < pricing.modules(); ++m) reference.push_back(pricing.nominal_seconds(m));
}

}  // namespace

ReorderedBatch reorder_batch(const spec::RunSpec& run, const plan::Plan& plan, const pipeline::Program& program,
                             const HostBatch& batch, Reordering how, const OrderOptions& options) {
  // Checked before anything is sized by samples (x modules) or converted to a signed count.
  if (batch.samples > kMaxHostSamples) {
    throw Error(Status::invalid_argument, "a batch of " + std::to_string(batch.samples) + " samples is above the " +
                                              std::to_string(kMaxHostSamples) + " a batch may hold");
  }
  if (!batch.placement_costs.empty() && batch.placement_costs.size() != batch.samples * plan.modules.size()) {
    throw Error(Status::internal, "the host's costs hold " + std::to_string(batch.placement_costs.size()) +
                                      " values, not samples x plan modules");
  }
  ReorderedBatch r;
  r.layout = batch_layout(run, plan, program, static_cast<long long>(batch.samples));
  std::vector<double> costs, reference;
  if (!batch.placement_costs.empty()) {
    host_costs(batch, plan, run.model.modules.size(), costs, reference);
  } else {
    priced_costs(batch, run, costs, reference);
  }
  r.arrangement = arrange(r.layout, program, costs, reference, how, options);
  std::vector<double> total(batch.samples, 0);
  const auto M = static_cast<std::size_t>(r.layout.modules);
  for (std::size_t i = 0; i < batch.samples; ++i)
    for (std::size_t m = 0; m < M; ++m) total[i] += costs[i * M + m];
  r.straggler_before = straggler(assign_in_order(total, r.layout.grid.cells).load).ratio;
  r.straggler_after = straggler(r.arrangement.cell_load).ratio;
  for (const auto& p : plan.modules) {
    const int dp = r.layout.module_dp[static_cast<std::size_t>(p.module)];
    r.module_dp.push_back(dp == p.dp ? dp : 0);
  }
  return r;
}

}  // namespace braid::data
