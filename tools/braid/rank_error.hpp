// The one way a command running on every rank of a launch reports a failure.
#pragma once

#include <exception>
#include <functional>

#include "core/runtime/world.hpp"

namespace braid::cli {

// Prints `error` (a braid::Error with its status, or any other exception as internal), naming
// the rank when there are several, and returns the exit status. With several ranks it ends them
// all at once (the plugin's abort): the others may be waiting for this one in a collective.
int fail_rank(runtime::World& world, const std::exception_ptr& error);

// Runs a command's set-up (reading its files, planning: nothing that waits for another rank),
// then, collective over the world, settles whether it failed anywhere. 0 when no rank's
// `setup` threw; else every rank returns the exit status, and the error is printed once, by
// the first rank that failed (with its rank when not every rank did). Ranks given the same
// command fail alike, so one line says it, not one per rank, and no abort is needed.
int agree_on_setup(runtime::World& world, const std::function<void()>& setup);

}  // namespace braid::cli
