// Schedule generators. They fill the instruction lists of a Program whose stages
// already know their place in the stage graph (prev, next, depth).
//
// The pipeline-parallel ones follow Megatron-LM's schedules.py: 1F1B runs
// min(depth_total - depth - 1, m) warm-up forwards, then alternates one forward and
// one backward, then drains the remaining backwards; the interleaved schedule maps
// virtual microbatches to model chunks as Megatron's get_model_chunk_id does.
#pragma once

#include "core/pipeline/program.hpp"

namespace braid::pipeline {

// One forward of `microbatch` through `chunk` on stage s: receive from every
// previous stage (or load the inputs), compute, send to every next stage.
void emit_forward(Program& p, int s, int microbatch, int chunk = 0, std::uint8_t flags = 0);
// One backward: receive gradients from every next stage, compute, send to every previous one.
void emit_backward(Program& p, int s, int microbatch, int chunk = 0);

void gpipe(Program& p, int microbatches);
void one_f_one_b(Program& p, int microbatches);
// Linear pipelines only (stage i feeds stage i+1); needs microbatches % stages == 0.
void interleaved(Program& p, int microbatches, int virtual_stages);
// Contrastive models: `groups` groups of `group_microbatches`; the last stage of
// every branch (a stage with no next) joins each group's BatchSync. `kind` is one of
//   batch_sync   per group: K forwards, BatchSync, K backwards (a pipeline flush per group)
//   distmm_pipe  group g+1's forwards interleave with group g's backwards (DistMM-Pipe)
//   two_phase    forwards without activations, BatchSync, then recompute-forward + backward in 1F1B order
// and Error(Status::invalid_argument) is thrown for any other schedule.
void batch_sync(Program& p, int groups, int group_microbatches, spec::Schedule kind);
// ReduceGrads and OptimizerStep at the end of every stage's program.
void finish_step(Program& p);

}  // namespace braid::pipeline
