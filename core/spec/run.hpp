// A training run: a model on a cluster with the training knobs and input sizes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/spec/cluster.hpp"
#include "core/spec/model.hpp"

namespace braid::spec {

enum class Recompute { none, selective, full };
enum class Attention { flash, standard };
enum class Schedule { one_f_one_b, interleaved, gpipe };

const char* recompute_name(Recompute r);
const char* attention_name(Attention a);
const char* schedule_name(Schedule s);

struct TrainingSpec {
  long long global_batch = 0;       // samples per optimizer step
  int microbatch = 1;               // samples per microbatch (per DP replica)
  long long contrastive_batch = 0;  // samples that share one contrastive loss (default: global batch)
  Precision precision = Precision::bf16;
  int zero_stage = 1;  // 0: none, 1: optimizer state, 2: + gradients, 3: + parameters
  Recompute recompute = Recompute::selective;
  Attention attention = Attention::flash;
  bool sequence_parallel = false;
  Schedule schedule = Schedule::one_f_one_b;
  int virtual_stages = 1;            // interleaved 1F1B model chunks per device
  bool overlap_grad_reduce = false;  // DP gradient reduction overlapped with the last backward
};

enum class SizeKind { fixed, lognormal, histogram };
const char* size_kind_name(SizeKind k);

// How the size of one modality varies from sample to sample (synthetic, for data
// reordering). Sizes are drawn in the modality's unit (pixels per side, tokens) and
// land on multiples of `step` (the patch grid of an image encoder, 1 for tokens).
struct SizeDistribution {
  SizeKind kind = SizeKind::fixed;  // fixed: every sample at the nominal size
  double median = 0, sigma = 0;     // lognormal: exp(N(ln median, sigma^2))...
  int min = 0, max = 0;             // ...clamped to [min, max]
  std::vector<int> values;          // histogram: these sizes...
  std::vector<double> weights;      // ...with these relative frequencies
  int step = 1;
};

// Input sizes per modality; 0 where the model has no such input. The planner and the
// cost model use these nominal sizes; the distributions only feed data reordering.
struct DataSpec {
  int image_resolution = 0;            // pixels per side, encoder input
  int text_tokens = 0;                 // text tokens per sample
  int audio_tokens = 0;                // audio frames (tokens) per sample
  int generated_image_resolution = 0;  // pixels per side, generator output
  SizeDistribution image, text, audio, generated_image;
  std::uint64_t seed = 0;  // of the synthetic sample sizes
  int steps = 4;           // steps the data report averages over

  // Whether any modality's size varies.
  bool heterogeneous() const;
};

struct RunSpec {
  std::string source;
  ModelSpec model;
  ClusterSpec cluster;  // with the run's node count applied
  TrainingSpec training;
  DataSpec data;

  int devices() const { return cluster.devices(); }
};

// Reads a run file; `model:` and `cluster:` are paths relative to it, or inline mappings.
RunSpec load_run(const std::string& path);
// Same from text; relative paths resolve against `base_dir`; `source` names the text in messages.
RunSpec parse_run(const std::string& text, const std::string& base_dir, const std::string& source = "<string>");

}  // namespace braid::spec
