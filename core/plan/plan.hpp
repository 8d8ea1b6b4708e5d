// A parallel plan: which devices run which module with which (TP, PP, DP), and
// what the cost model predicts for it.
#pragma once

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "core/spec/run.hpp"

namespace braid::plan {

enum class Strategy { megatron, distmm, disttrain, optimus, fixed, automatic };

// How modules share devices; each layout has its own evaluator.
enum class Layout {
  monolithic,  // one TP x PP x DP grid for the whole model (Megatron-LM)
  branches,    // each module on its own devices, joined by a contrastive loss (DistMM)
  chain,       // each module on its own devices, one pipeline encoder -> llm -> generator (DistTrain)
  colocated,   // every device holds encoder and llm, each with its own grid (Optimus)
};

const char* strategy_name(Strategy s);
const char* layout_name(Layout l);
std::optional<Strategy> parse_strategy(const std::string& name);
std::optional<Layout> parse_layout(const std::string& name);

struct ModulePlacement {
  std::string name;
  spec::Role role = spec::Role::encoder;
  int module = 0;  // index into the model's modules
  int tp = 1, pp = 1, dp = 1;
  int first_device = 0;
  int devices = 0;  // devices that hold this module
  int microbatch_size = 1;
  int first_stage = 0;  // monolithic: the global pipeline stage of this module's first stage
  std::vector<int> layers_per_stage;
};

// The counts every layer derives from a placement and the training knobs, in one place.
// Samples one microbatch of `p` takes over its DP replicas: dp x microbatch size.
long long samples_per_microbatch(const ModulePlacement& p);
// Microbatches each DP replica of `p` runs per step: global batch / (dp x microbatch size).
int microbatches_per_step(const spec::TrainingSpec& t, const ModulePlacement& p);
// Contrastive: microbatches each DP replica of `p` runs per group (DistMM's K).
int microbatches_per_group(const spec::TrainingSpec& t, const ModulePlacement& p);
// Contrastive groups (one batch-sync each) per step: global batch / contrastive batch.
int contrastive_groups(const spec::TrainingSpec& t);

// The devices of one pipeline stage: DP replica r holds `devices_per_replica` devices
// (its TP group) from first_device + r * stride.
struct StageDevices {
  int first_device = 0;
  int replicas = 1;
  int devices_per_replica = 1;
  int stride = 1;
};
// Stage `s` of a module's own tp-dp-pp grid, which starts at its first device.
StageDevices module_stage_devices(const ModulePlacement& p, int s);
// Global stage `s` of a monolithic grid from device 0 (a monolithic plan, a colocated llm).
StageDevices grid_stage_devices(int tp, int dp, int s);

struct MemoryBreakdown {
  double weights = 0, gradients = 0, optimizer = 0, activations = 0, reserved = 0;
  // The buffers braid's own DP collectives copy through (cost::CostModel::collective_buffer_bytes):
  // those held inside a forward or backward, beside the activations, and those after the last
  // backward, when none is held.
  double buffers = 0, step_end_buffers = 0;
  // Weights, gradients, optimizer state and the reserved memory.
  double state() const { return weights + gradients + optimizer + reserved; }
  double communication() const { return std::max(buffers, step_end_buffers); }
  // At the step's peak: inside an instruction or after the last backward, whichever holds more.
  double total() const { return state() + std::max(activations + buffers, step_end_buffers); }
};

struct Estimate {
  double iteration_time_s = 0;
  double samples_per_s = 0;
  double tflops_per_device = 0;  // hardware FLOP/s per device incl. recomputation (Megatron's convention)
  double mfu = 0;                // model FLOPs (no recomputation) / (devices * peak * time)
  double peak_memory_gib = 0;
  double bubble_fraction = 0;  // share of device time without compute
  // Where the time goes on the critical path.
  double compute_s = 0;          // compute of the busiest device
  double pipeline_bubble_s = 0;  // fill and drain of the pipeline(s)
  double tp_comm_s = 0;          // exposed tensor-parallel collectives
  double dp_comm_s = 0;          // exposed gradient reduction
  double p2p_s = 0;              // pipeline sends/receives on the critical path
  double sync_s = 0;             // contrastive batch-sync (all-gather + loss)
  double optimizer_s = 0;
  double encoder_exposed_s = 0;  // colocated encoder work not hidden in LLM bubbles
  MemoryBreakdown memory;        // of the device with the peak
  std::string peak_memory_at;    // "module stage k"
};

// Where a plan read from YAML came from, so that what its evaluation finds wrong points into
// the file (empty for the planner's own plans).
struct PlanSource {
  std::string file;                  // "plan.yaml:1:1"
  std::vector<std::string> modules;  // per placement: "plan.yaml:3:5: modules[0]"
  std::string devices_where;         // the file's `devices:` field ("" when not given) ...
  int devices = 0;                   // ... and its value
};

struct Plan {
  Strategy strategy = Strategy::megatron;
  Layout layout = Layout::monolithic;
  int devices = 0;          // devices the plan uses
  int cluster_devices = 0;  // devices the cluster has
  int microbatches = 1;     // per pipeline per step
  spec::Schedule schedule = spec::Schedule::one_f_one_b;
  int virtual_stages = 1;
  std::vector<ModulePlacement> modules;
  Estimate estimate;
  std::vector<std::string> notes;
  PlanSource source;
};

// The index into plan.modules of model module `model_module` (the numbering the C ABI
// uses for modules), or -1 when the plan does not place it (or for -1).
int placement_index(const Plan& plan, int model_module);

struct Alternative {
  Strategy strategy = Strategy::megatron;
  bool feasible = false;
  double iteration_time_s = 0;
  std::string reason;  // why it lost, or why it cannot run
  std::optional<Plan> plan;
};

struct PlanResult {
  Plan best;
  std::vector<Alternative> alternatives;  // filled by auto: every strategy, ranked
};

}  // namespace braid::plan
