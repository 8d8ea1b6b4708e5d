// Intra-microbatch reordering (DistTrain): which data-parallel rank each sample of a
// global batch goes to. Longest processing time first with equal sample counts, so
// every rank gets the same number of samples and about the same work; deterministic,
// so every rank computes the same assignment from the same costs without talking.
#pragma once

#include <span>
#include <vector>

namespace braid::data {

struct RankAssignment {
  int ranks = 0;
  std::vector<int> rank;     // per sample
  std::vector<double> load;  // per rank: the sum of its samples' costs
};

// Dataset order: rank r gets the r-th contiguous slice of the batch (Megatron's sampler).
RankAssignment assign_in_order(std::span<const double> costs, int ranks);
// LPT: samples by cost, largest first (ties: lower index first), each to the least
// loaded rank that still has room for its n/ranks samples (ties: lower rank first).
// Throws Error(invalid_argument) unless `ranks` divides the sample count and every cost
// is finite and not negative.
RankAssignment assign_lpt(std::span<const double> costs, int ranks);

// The microbatch (0 .. microbatches-1) of each sample: each rank's samples in sample
// order, cut into `microbatches` equal parts.
std::vector<int> split_microbatches(const RankAssignment& a, int microbatches);

// How much the slowest rank holds up the others in one step.
struct Straggler {
  double ratio = 1;  // max rank load / mean rank load
  double time = 0;   // max - mean, in the loads' unit
};
Straggler straggler(std::span<const double> loads);

// Modules with different DP widths (a disaggregated encoder with DP 4 next to an llm
// with DP 6) draw from one assignment on the grid of lcm(widths) cells: cell c belongs
// to rank c / (cells / dp) of a module with width dp, so each module's ranks get whole
// runs of consecutive cells, hence equal sample counts, and cells balanced in summed cost
// make ranks balanced in summed cost for every module at once (a module's own share of it
// may still vary when samples are heavy on one module or on another). Cells whose ranks overlap in any module
// form one pipeline group (gcd(widths) groups of cells / gcd consecutive cells): their
// microbatches travel together, so they share one inter-microbatch order.
struct CellGrid {
  int cells = 1;   // lcm of the widths
  int groups = 1;  // gcd of the widths
  int rank_of(int cell, int dp) const { return cell / (cells / dp); }
  int group_of(int cell) const { return cell / (cells / groups); }
};
// Throws Error(invalid_argument) for a width below 1 or an lcm above 2^20 cells.
CellGrid cell_grid(std::span<const int> dp_widths);

}  // namespace braid::data
