// The cost of one sample, per module, from the cost model: the forward + backward time
// of each module for a sample of given sizes, on one device (TP 1). Modules sit on
// different devices in disaggregated plans, so the costs stay separate per module.
#pragma once

#include <span>
#include <vector>

#include "core/data/dataset.hpp"
#include "core/spec/run.hpp"

namespace braid::data {

class SampleCost {
 public:
  // Builds the cost curves of `run`'s modules over the sizes its distributions can draw.
  explicit SampleCost(const spec::RunSpec& run);

  int modules() const { return static_cast<int>(time_.size()); }
  // Forward + backward seconds of module `m` for one sample (0 for a loss module).
  double module_seconds(int m, const SampleSizes& s) const;
  // The same at the run's nominal sizes: what the planner assumed for every sample.
  double nominal_seconds(int m) const { return nominal_seconds_[static_cast<std::size_t>(m)]; }
  // Sequence length module `m` sees for this sample (patches, tokens...).
  double module_tokens(int m, const SampleSizes& s) const;
  // Costs of a batch, samples x modules, row-major: [i * modules() + m].
  std::vector<double> batch_costs(std::span<const SampleSizes> batch) const;
  // CostModels built to trace the curves (for tests and the benchmark's report).
  int cost_models_built() const { return built_; }

 private:
  // A piecewise-linear function through sorted points, extended linearly past its ends.
  struct Curve {
    std::vector<double> x, y;
    double at(double v) const;
    void add(double xv, double yv) {
      x.push_back(xv);
      y.push_back(yv);
    }
    void finish();  // sorts, and averages points with the same x
  };
  static constexpr int kModalities = 4;

  std::vector<Curve> time_;  // per module: seconds against the module's tokens
  // Per modality and module: the module's tokens against that modality's size, the
  // other modalities at nominal; empty where the modality does not reach the module.
  std::vector<Curve> tokens_[kModalities];
  std::vector<double> nominal_tokens_, nominal_seconds_;
  int built_ = 0;
};

// `data` with distributions that draw exactly the sizes in `batch` (a histogram of them),
// so that a SampleCost of it prices a caller's samples on its grid rather than by
// extrapolation. Throws Error(invalid_argument) for a size below 1 where the model has
// that input.
spec::DataSpec covering(const spec::DataSpec& data, std::span<const SampleSizes> batch);

}  // namespace braid::data
