// Checks for the multi-process tests: a failure prints the rank and place, then ends
// every process through the world (MPI_Abort), so no peer is left waiting in a
// collective and mpiexec exits non-zero.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <source_location>
#include <string>

#include "core/common/error.hpp"
#include "core/runtime/world.hpp"

namespace braid::test {

class Checks {
 public:
  explicit Checks(const runtime::World& world) : world_(world) {}

  void operator()(bool ok, const std::string& what, std::source_location where = std::source_location::current()) {
    ++count_;
    if (ok) return;
    std::fprintf(stderr, "[rank %d of %d] FAILED %s:%u: %s\n", world_.rank(), world_.size(), where.file_name(),
                 where.line(), what.c_str());
    std::fflush(stderr);
    world_.abort(1);
  }

  // `fn` throws a braid::Error with `status` whose message contains `part`.
  void error(const std::function<void()>& fn, Status status, const std::string& part,
             std::source_location where = std::source_location::current()) {
    try {
      fn();
    } catch (const Error& e) {
      (*this)(e.status() == status && std::string(e.what()).find(part) != std::string::npos,
              std::string("expected a ") + status_name(status) + " error containing \"" + part + "\", got " +
                  status_name(e.status()) + ": " + e.what(),
              where);
      return;
    }
    (*this)(false, std::string("expected a ") + status_name(status) + " error containing \"" + part + "\"", where);
  }

  // Printed once, by rank 0.
  void passed(const char* name) const {
    if (world_.rank() == 0) std::printf("ok %s (%d processes)\n", name, world_.size());
    std::fflush(stdout);
  }
  int count() const { return count_; }

 private:
  const runtime::World& world_;
  int count_ = 0;
};

// The world of a test program run as `PROGRAM EXPECTED_PROCESS_COUNT` (`launch` says how),
// through the MPI plugin, and the expected count. Exits 2 on other arguments, 1 when the
// plugin cannot start. The world is returned in an optional so that main can end MPI
// (reset) before it returns.
inline std::optional<runtime::World> plugin_world(int argc, char** argv, const char* launch, int& expected) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s EXPECTED_PROCESS_COUNT (%s)\n", argv[0], launch);
    std::exit(2);
  }
  expected = std::atoi(argv[1]);
  try {
    return runtime::World::from_plugin("mpi");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    std::exit(1);
  }
}

}  // namespace braid::test
