// Views of a simulated step: a Chrome trace (opens in Perfetto or chrome://tracing:
// one process per simulated rank, one track per stream) and a text Gantt chart.
#pragma once

#include <string>

#include "core/pipeline/program.hpp"
#include "core/sim/simulator.hpp"

namespace braid::sim {

// Chrome trace-event JSON of `result` (simulated with Options::trace, or a measured step
// laid out the same way: `generator` names which).
std::string chrome_trace(const pipeline::Program& program, const Result& result,
                         const std::string& generator = "braid simulate");
// Writes it atomically (temporary file, then rename); Status::io on failure.
void write_chrome_trace(const std::string& path, const pipeline::Program& program, const Result& result,
                        const std::string& generator = "braid simulate");

// One row per stage (its first replica), `width` columns over the step (0: sized
// to the number of instructions): forward cells show the microbatch (mod 10) as a
// digit, backward as a letter a-j, encoder tasks e/E, ReduceGrads R, BatchSync S,
// optimizer o, idle '.'.
std::string gantt(const pipeline::Program& program, const Result& result, int width = 0);

}  // namespace braid::sim
