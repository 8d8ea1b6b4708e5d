// Every rank of a launch runs one command: ranks started with other options (an MPMD line,
// `mpiexec -n 1 braid train A : -n 1 braid train B`) or reading a file that differs between
// nodes would wait for each other forever, or train replicas that drift apart.
#pragma once

#include <string>
#include <vector>

#include "core/runtime/world.hpp"

namespace braid::cli {

// Collective over the world: compares every rank's arguments (`args`, the subcommand's) and the
// contents of `files` (the run, plan and cluster files they name; "" entries are skipped) with
// rank 0's. Throws Error(Status::invalid_argument) on every rank when any differs, naming the
// first rank that does and the first argument or file where.
void require_same_command(runtime::World& world, const std::vector<std::string>& args,
                          const std::vector<std::string>& files);

}  // namespace braid::cli
