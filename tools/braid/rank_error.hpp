// The one way a command running on every rank of a launch reports a failure.
#pragma once

#include <exception>

#include "core/runtime/world.hpp"

namespace braid::cli {

// Prints `error` (a braid::Error with its status, or any other exception as internal), naming
// the rank when there are several, and returns the exit status. With several ranks it ends them
// all at once (the plugin's abort): the others may be waiting for this one in a collective.
int fail_rank(runtime::World& world, const std::exception_ptr& error);

}  // namespace braid::cli
