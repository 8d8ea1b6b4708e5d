// A training run: a model on a cluster with the training knobs and input sizes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/spec/cluster.hpp"
#include "core/spec/model.hpp"
#include "core/spec/schedule.hpp"

namespace braid::spec {

enum class Recompute { none, selective, full };
enum class Attention { flash, standard };

const char* recompute_name(Recompute r);
const char* attention_name(Attention a);

struct TrainingSpec {
  long long global_batch = 0;       // samples per optimizer step
  int microbatch = 1;               // samples per microbatch (per DP replica)
  long long contrastive_batch = 0;  // samples that share one contrastive loss (default: global batch)
  Precision precision = Precision::bf16;
  int zero_stage = 1;  // 0: none, 1: optimizer state, 2: + gradients, 3: + parameters
  Recompute recompute = Recompute::selective;
  Attention attention = Attention::flash;
  bool sequence_parallel = false;
  Schedule schedule = Schedule::one_f_one_b;  // the run file takes 1f1b, interleaved or gpipe
  int virtual_stages = 1;                     // interleaved 1F1B model chunks per device
  // Megatron-Core / TransformerEngine overlaps and kernels. Defaults are those of
  // Megatron-LM's arguments (megatron/training/arguments.py: --overlap-grad-reduce,
  // --overlap-param-gather, --tp-comm-overlap and --fp8-format are off unless given; the
  // fused kernels are on unless --no-bias-gelu-fusion etc.), so a run file that does not
  // name them prices what a plain `pretrain_gpt.py` run does.
  bool overlap_grad_reduce = false;   // DP gradient reduce-scatter / all-reduce behind the last backward
  bool overlap_param_gather = false;  // ZeRO-1/2 parameter all-gather behind the next step's first forward
  bool tp_comm_overlap = false;       // userbuffers: SP all-gather / reduce-scatter chunked behind the TP GEMMs
  bool fused_kernels = true;          // fused norm, bias+activation, bias+dropout+add, softmax (not cross-entropy)
  bool fp8 = false;                   // TransformerEngine FP8 GEMMs in the transformer layers' linears
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

// How `braid train` runs the reference models (the optional `trainer:` section of a run
// file; the planner ignores it). AdamW with a linear warm-up then a cosine decay to
// min_lr_ratio x learning_rate at the last step, global-norm gradient clipping.
struct TrainerSpec {
  long long steps = 200;
  double learning_rate = 1e-3;
  long long warmup_steps = 10;
  double min_lr_ratio = 0.1;
  double weight_decay = 0.1;                     // decoupled, on matrices only (Parameter::decay)
  double beta1 = 0.9, beta2 = 0.98, eps = 1e-6;  // CLIP's AdamW (Radford et al. 2021)
  double grad_clip = 1.0;                        // max global L2 norm; 0: no clipping
  long long eval_every = 50;                     // steps between evaluations (and at the last step); 0: only at the end
  long long eval_samples = 256;                  // held-out samples an evaluation uses
  long long checkpoint_every = 0;  // steps between checkpoints when --checkpoint-dir is given; 0: only at the end
  long long keep_checkpoints = 3;  // newest checkpoints kept; 0: all
  int threads = 0;                 // host threads per process; 0: the node's cores / processes on it
};

// Host threads a process may be given (trainer.threads, --threads, --data-workers): each
// one is started, so a count past any host's cores is a typo, not a request.
constexpr long long kMaxHostThreads = 1024;
// "" when `threads` is in [0, kMaxHostThreads], else why not ("at most 1024 (got N)").
std::string host_threads_problem(long long threads);

struct RunSpec {
  std::string source;
  ModelSpec model;
  ClusterSpec cluster;  // with the run's node count applied
  TrainingSpec training;
  DataSpec data;
  TrainerSpec trainer;

  int devices() const { return cluster.devices(); }
};

// A value the run file reader refuses: the field's dotted path in a run file
// ("training.microbatch", "data.image.resolution") and what is wrong with it.
struct FieldProblem {
  std::string field;
  std::string message;
};

// The first problem of the training settings `t` of a run of `model`, as the run file
// reader checks them (each field's range, and the relations between fields), or nullopt.
// The reader reports these messages at the field's line; the C ABI's typed settings the
// same messages for the same values. (The schedule, an enum here, is checked where it is
// parsed: the run file takes 1f1b, interleaved or gpipe.)
std::optional<FieldProblem> check_training(const TrainingSpec& t, const ModelSpec& model);
// What the training settings need of the cluster (an FP8 peak for fp8), or nullopt.
std::optional<FieldProblem> check_training_on(const TrainingSpec& t, const ClusterSpec& cluster);
// Same for the nominal input sizes of `d`: every input `model` takes is at least 1 and on
// its encoder's grid; an input it does not take is 0.
std::optional<FieldProblem> check_input_sizes(const DataSpec& d, const ModelSpec& model);
// The schedules a run file's `training.schedule` takes, by name.
std::vector<std::string> run_schedule_names();

// Reads a run file; `model:` and `cluster:` are paths relative to it, or inline mappings.
RunSpec load_run(const std::string& path);
// Same from text; relative paths resolve against `base_dir`; `source` names the text in messages.
RunSpec parse_run(const std::string& text, const std::string& base_dir, const std::string& source = "<string>");

}  // namespace braid::spec
