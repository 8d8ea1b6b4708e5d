// The cost model prices a module at the run's nominal sequence lengths. To price other
// sizes with the same model, SampleCost builds CostModels for copies of the run whose
// DataSpec sets one modality to each size on a grid over what its distribution can
// draw (every size when there are at most kAllSizes, else kSpread sizes spread evenly),
// plus all modalities at their smallest and at their largest. Each module's time is
// then a piecewise-linear curve in the module's own sequence length, which follows the
// quadratic attention term closely at this density; the sequence length of a module is
// the nominal one plus what each modality's size adds (exact for the cost model's
// token counts: an llm sees text + projected image tokens, every other module one input).
#include "core/data/sample_cost.hpp"

#include <algorithm>
#include <numeric>
#include <set>
#include <string>

#include "core/common/error.hpp"
#include "core/cost/cost_model.hpp"

namespace braid::data {
namespace {

constexpr int kAllSizes = 129;
constexpr int kSpread = 65;

int SampleSizes::*const kSize[] = {&SampleSizes::image_resolution, &SampleSizes::text_tokens,
                                   &SampleSizes::audio_tokens, &SampleSizes::generated_image_resolution};
int spec::DataSpec::*const kNominal[] = {&spec::DataSpec::image_resolution, &spec::DataSpec::text_tokens,
                                         &spec::DataSpec::audio_tokens, &spec::DataSpec::generated_image_resolution};
spec::SizeDistribution spec::DataSpec::*const kDistribution[] = {
    &spec::DataSpec::image, &spec::DataSpec::text, &spec::DataSpec::audio, &spec::DataSpec::generated_image};

// Sizes `d` can draw, and the nominal one.
std::vector<int> size_grid(const spec::SizeDistribution& d, int nominal) {
  std::vector<int> v{nominal};
  if (d.kind == spec::SizeKind::histogram) v.insert(v.end(), d.values.begin(), d.values.end());
  if (d.kind == spec::SizeKind::lognormal) {
    const long long lo = (d.min + d.step - 1) / d.step, hi = d.max / d.step;
    const long long count = hi - lo + 1;
    if (count <= kAllSizes) {
      for (long long cell = lo; cell <= hi; ++cell) v.push_back(static_cast<int>(cell * d.step));
    } else {
      for (int i = 0; i < kSpread; ++i) v.push_back(static_cast<int>((lo + (hi - lo) * i / (kSpread - 1)) * d.step));
    }
  }
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

struct Probe {
  std::vector<double> tokens, seconds;  // per module
};

Probe probe(const spec::RunSpec& run) {
  const cost::CostModel cost(run);
  Probe p;
  for (int m = 0; m < static_cast<int>(run.model.modules.size()); ++m) {
    p.tokens.push_back(cost.tokens(m));
    double s = 0;
    if (run.model.modules[static_cast<std::size_t>(m)].role != spec::Role::loss) {
      const auto& c = cost.module(m, 1, 1);
      const cost::BlockCost all = c.stage(c.layers, true, true);
      s = all.forward_time() + all.backward_time();
    }
    p.seconds.push_back(s);
  }
  return p;
}

}  // namespace

double SampleCost::Curve::at(double v) const {
  if (x.size() == 1) return y[0];
  auto it = std::upper_bound(x.begin(), x.end(), v);
  const auto i = std::clamp<std::size_t>(static_cast<std::size_t>(it - x.begin()), 1, x.size() - 1);
  const double t = (v - x[i - 1]) / (x[i] - x[i - 1]);
  return y[i - 1] + t * (y[i] - y[i - 1]);
}

void SampleCost::Curve::finish() {
  std::vector<std::size_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return x[a] < x[b]; });
  std::vector<double> xs, ys;
  std::vector<int> n;
  for (std::size_t i : order) {
    if (!xs.empty() && x[i] == xs.back()) {
      ys.back() += y[i];
      ++n.back();
    } else {
      xs.push_back(x[i]);
      ys.push_back(y[i]);
      n.push_back(1);
    }
  }
  for (std::size_t i = 0; i < ys.size(); ++i) ys[i] /= n[i];
  x = std::move(xs);
  y = std::move(ys);
}

SampleCost::SampleCost(const spec::RunSpec& run) {
  const std::size_t n = run.model.modules.size();
  const Probe nominal = probe(run);
  ++built_;
  nominal_tokens_ = nominal.tokens;
  nominal_seconds_ = nominal.seconds;
  time_.resize(n);
  for (std::size_t m = 0; m < n; ++m) time_[m].add(nominal.tokens[m], nominal.seconds[m]);
  spec::RunSpec copy = run;
  spec::DataSpec smallest = run.data, largest = run.data;
  bool varies = false;
  for (int k = 0; k < kModalities; ++k) {
    tokens_[k].assign(n, Curve{});
    const auto& dist = run.data.*kDistribution[k];
    const int size = run.data.*kNominal[k];
    if (dist.kind == spec::SizeKind::fixed || size == 0) continue;
    const auto grid = size_grid(dist, size);
    smallest.*kNominal[k] = grid.front();
    largest.*kNominal[k] = grid.back();
    varies = true;
    for (int v : grid) {
      copy.data = run.data;
      copy.data.*kNominal[k] = v;
      const Probe p = probe(copy);
      ++built_;
      for (std::size_t m = 0; m < n; ++m) {
        tokens_[k][m].add(v, p.tokens[m]);
        time_[m].add(p.tokens[m], p.seconds[m]);
      }
    }
    for (auto& c : tokens_[k]) {
      c.finish();
      if (std::all_of(c.y.begin(), c.y.end(), [&](double t) { return t == c.y.front(); })) c = Curve{};
    }
  }
  // Samples large (or small) in every modality at once lie beyond the one-at-a-time
  // grid for modules that see several modalities.
  for (const auto* extreme : {&smallest, &largest}) {
    if (!varies) break;
    copy.data = *extreme;
    const Probe p = probe(copy);
    ++built_;
    for (std::size_t m = 0; m < n; ++m) time_[m].add(p.tokens[m], p.seconds[m]);
  }
  for (auto& c : time_) c.finish();
}

double SampleCost::module_tokens(int m, const SampleSizes& s) const {
  const auto i = static_cast<std::size_t>(m);
  double t = nominal_tokens_[i];
  for (int k = 0; k < kModalities; ++k) {
    const Curve& c = tokens_[k][i];
    if (!c.x.empty()) t += c.at(s.*kSize[k]) - nominal_tokens_[i];
  }
  return t;
}

double SampleCost::module_seconds(int m, const SampleSizes& s) const {
  return time_[static_cast<std::size_t>(m)].at(module_tokens(m, s));
}

std::vector<double> SampleCost::batch_costs(std::span<const SampleSizes> batch) const {
  const std::size_t n = time_.size();
  std::vector<double> out(batch.size() * n);
  for (std::size_t i = 0; i < batch.size(); ++i) {
    for (std::size_t m = 0; m < n; ++m) out[i * n + m] = module_seconds(static_cast<int>(m), batch[i]);
  }
  return out;
}

spec::DataSpec covering(const spec::DataSpec& data, std::span<const SampleSizes> batch) {
  static const char* const kNames[] = {"image_resolution", "text_tokens", "audio_tokens", "generated_image_resolution"};
  spec::DataSpec out = data;
  for (std::size_t k = 0; k < std::size(kSize); ++k) {
    const int nominal = data.*kNominal[k];
    auto& dist = out.*kDistribution[k];
    dist = spec::SizeDistribution{};
    if (nominal == 0) continue;  // the model has no such input: sizes are ignored
    std::set<int> sizes;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      const int v = batch[i].*kSize[k];
      if (v < 1) {
        throw Error(Status::invalid_argument, std::string(kNames[k]) + " of sample " + std::to_string(i) + " is " +
                                                  std::to_string(v) + "; sizes must be at least 1");
      }
      sizes.insert(v);
    }
    if (sizes.empty() || (sizes.size() == 1 && *sizes.begin() == nominal)) continue;
    dist.kind = spec::SizeKind::histogram;
    if (sizes.size() <= kAllSizes) {
      dist.values.assign(sizes.begin(), sizes.end());
    } else {  // too many to price each: an even spread over their range
      const int lo = *sizes.begin(), hi = *sizes.rbegin();
      for (int i = 0; i < kSpread; ++i)
        dist.values.push_back(static_cast<int>(lo + static_cast<long long>(hi - lo) * i / (kSpread - 1)));
    }
    dist.weights.assign(dist.values.size(), 1);
  }
  return out;
}

}  // namespace braid::data
