#include "core/data/dataset.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace braid::data {
namespace {

// SplitMix64's finaliser: spreads (seed, step, stream) over the generator's seed space,
// so that nearby steps do not get nearby seeds.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::uint64_t stream_seed(std::uint64_t seed, long long step, int stream) {
  return mix(mix(mix(seed) ^ static_cast<std::uint64_t>(step)) ^ static_cast<std::uint64_t>(stream));
}

}  // namespace

SplitMix64::result_type SplitMix64::operator()() {
  const std::uint64_t at = state_;
  state_ += 0x9e3779b97f4a7c15ULL;
  return mix(at);  // the finaliser of the state advanced by its gamma
}

SampleSizes nominal_sizes(const spec::DataSpec& data) {
  return {data.image_resolution, data.text_tokens, data.audio_tokens, data.generated_image_resolution};
}

SizeSampler::SizeSampler(const spec::SizeDistribution& dist, int nominal, std::uint64_t seed, long long step,
                         int stream)
    : dist_(&dist), nominal_(nominal), bits_(stream_seed(seed, step, stream)) {
  double sum = 0;
  for (double w : dist.weights) cumulative_.push_back(sum += w);
}

double SizeSampler::uniform() { return static_cast<double>(bits_() >> 11) * 0x1.0p-53; }

double SizeSampler::normal() {
  if (spare_ready_) {
    spare_ready_ = false;
    return spare_;
  }
  const double u1 = 1 - uniform();  // (0, 1]: log stays finite
  const double u2 = uniform();
  const double r = std::sqrt(-2 * std::log(u1));
  spare_ = r * std::sin(2 * std::numbers::pi * u2);
  spare_ready_ = true;
  return r * std::cos(2 * std::numbers::pi * u2);
}

int SizeSampler::next() {
  const auto& d = *dist_;
  switch (d.kind) {
    case spec::SizeKind::fixed:
      return nominal_;
    case spec::SizeKind::lognormal: {
      // Nearest size on the modality's grid, clamped to the grid points in [min, max].
      const double x = d.median * std::exp(d.sigma * normal());
      const long long lo = (d.min + d.step - 1) / d.step, hi = d.max / d.step;
      const double cells = std::clamp(x / d.step, double(lo), double(hi));
      return static_cast<int>(std::llround(cells) * d.step);
    }
    case spec::SizeKind::histogram: {
      const double u = uniform() * cumulative_.back();
      auto it = std::upper_bound(cumulative_.begin(), cumulative_.end(), u);
      const auto i = std::min<std::size_t>(static_cast<std::size_t>(it - cumulative_.begin()), d.values.size() - 1);
      return d.values[i];
    }
  }
  return nominal_;
}

std::vector<SampleSizes> draw_batch(const spec::DataSpec& data, long long samples, long long step) {
  std::vector<SampleSizes> batch(static_cast<std::size_t>(std::max(0LL, samples)), nominal_sizes(data));
  auto fill = [&](const spec::SizeDistribution& dist, int nominal, int stream, int SampleSizes::*field) {
    if (dist.kind == spec::SizeKind::fixed) return;
    SizeSampler sampler(dist, nominal, data.seed, step, stream);
    for (auto& s : batch) s.*field = sampler.next();
  };
  fill(data.image, data.image_resolution, 0, &SampleSizes::image_resolution);
  fill(data.text, data.text_tokens, 1, &SampleSizes::text_tokens);
  fill(data.audio, data.audio_tokens, 2, &SampleSizes::audio_tokens);
  fill(data.generated_image, data.generated_image_resolution, 3, &SampleSizes::generated_image_resolution);
  return batch;
}

}  // namespace braid::data
