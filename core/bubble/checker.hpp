// Verifies every constraint of a scheduled colocated program (any program, whoever
// placed its EncoderTasks): each encoder task runs exactly once per microbatch, in
// the encoder's order; only compute kernels that fit one collective's wait sit in a
// TP bubble; and, on the simulated timeline, encoder forwards end before the llm
// forward that needs them starts, encoder backwards start after the llm backward
// that feeds them ends, and the encoder's own pipeline order holds.
#pragma once

#include "core/bubble/encoder_tasks.hpp"

namespace braid::bubble {

// Throws Error(Status::invalid_argument) naming the first violated constraint.
void check(const Colocated& c, const pipeline::Program& program);

}  // namespace braid::bubble
