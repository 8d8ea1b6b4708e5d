// Synthetic sample sizes: the global batch of step k drawn from the run's per-modality
// size distributions (DataSpec). Deterministic by (seed, step): every rank that draws
// step k gets the same batch, on any platform.
#pragma once

#include <cstdint>
#include <vector>

#include "core/spec/run.hpp"

namespace braid::data {

// The sizes of one sample, in the units of DataSpec (0 where the model has no such input).
struct SampleSizes {
  int image_resolution = 0;
  int text_tokens = 0;
  int audio_tokens = 0;
  int generated_image_resolution = 0;
};

// Every sample at the nominal sizes.
SampleSizes nominal_sizes(const spec::DataSpec& data);

// The `samples` sample sizes of step `step`. A modality without a distribution stays at
// its nominal size; each modality draws from its own stream, so adding a distribution to
// one modality leaves the others' draws unchanged.
std::vector<SampleSizes> draw_batch(const spec::DataSpec& data, long long samples, long long step);

// A SplitMix64 stream: a counter through a fixed mixing function, so seeding it costs
// nothing (a std::mt19937_64 fills 312 words first: 2.5 us, more than a 16 px sample takes
// to render, for a generator made per sample) and its output is the same everywhere.
class SplitMix64 {
 public:
  using result_type = std::uint64_t;
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  static constexpr result_type min() { return 0; }
  static constexpr result_type max() { return ~result_type{0}; }
  result_type operator()();

 private:
  std::uint64_t state_;
};

// Draws the sizes of one modality, one sample at a time, from a SplitMix64 stream and its
// own lognormal and histogram draws rather than <random>'s distributions, whose algorithms
// vary between standard libraries.
class SizeSampler {
 public:
  SizeSampler(const spec::SizeDistribution& dist, int nominal, std::uint64_t seed, long long step, int stream);
  int next();

 private:
  double uniform();  // in [0, 1), 53 random bits
  double normal();   // standard normal, Box-Muller

  const spec::SizeDistribution* dist_;
  int nominal_;
  SplitMix64 bits_;
  bool spare_ready_ = false;  // Box-Muller yields normals in pairs
  double spare_ = 0;
  std::vector<double> cumulative_;  // histogram: running sums of the weights
};

}  // namespace braid::data
