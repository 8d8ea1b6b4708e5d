// Data reordering of one global batch that a host's data loader holds (the C ABI's
// braid_reorder_create): each sample's grid cell and microbatch slot for a plan's program,
// priced by the host's own per-module costs or by the cost model from each sample's
// sizes, and how much the slowest cell holds up the others before and after.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "core/data/arrangement.hpp"
#include "core/data/dataset.hpp"

namespace braid::data {

// The most samples a host's batch may hold: far above any global batch, and low enough
// that samples x modules x sizeof(double) cannot wrap and the per-sample vectors stay small.
inline constexpr std::size_t kMaxHostSamples = std::size_t{1} << 24;

// A host's batch: its own cost of each sample per plan module, or each sample's sizes.
struct HostBatch {
  std::size_t samples = 0;
  // samples x plan modules, row-major, in the host's unit (only ratios matter); empty: price `sizes`.
  std::span<const double> placement_costs;
  std::vector<SampleSizes> sizes;  // per sample, used when placement_costs is empty
};

struct ReorderedBatch {
  BatchLayout layout;
  Arrangement arrangement;
  std::vector<int> module_dp;                        // per plan module: its DP width on the cell grid, 0 when off it
  double straggler_before = 1, straggler_after = 1;  // slowest cell over the mean: dataset order, arranged
};

// `program` is the plan's (orchestrate::build_program). Throws Error(invalid_argument)
// for more than kMaxHostSamples samples or a host cost that is not a finite non-negative
// number, and as batch_layout, covering and arrange do.
ReorderedBatch reorder_batch(const spec::RunSpec& run, const plan::Plan& plan, const pipeline::Program& program,
                             const HostBatch& batch, Reordering how, const OrderOptions& options = {});

}  // namespace braid::data
