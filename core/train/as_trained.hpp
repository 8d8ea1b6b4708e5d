// The run as braid's trainer runs it. The trainer computes every tensor in fp32, its attention
// op keeps the probabilities (standard attention), and it runs none of Megatron-Core's
// overlaps nor FP8: the planner prices those for the cluster a run file names, but the program
// the trainer executes, the simulated step it prints next to the measured one and the memory
// it predicts are priced as it runs. Recomputation and sequence parallelism it runs as asked.
#pragma once

#include <string>
#include <vector>

#include "core/spec/run.hpp"

namespace braid::train {

struct AsTrained {
  spec::RunSpec run;
  // Each training setting the trainer runs otherwise than the run file says, as
  // "precision fp32 (the run says bf16)"; empty when it runs the file as written.
  std::vector<std::string> changed;
};

AsTrained as_trained(const spec::RunSpec& run);

}  // namespace braid::train
