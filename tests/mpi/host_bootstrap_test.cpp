// A host that owns MPI (it calls MPI_Init, as a PyTorch or DeepSpeed job owns its
// process group) bootstraps braid's world through its own all-gather, then lets the
// MPI plugin join the MPI it started. Both must agree with MPI about rank, size and
// local rank, and braid must leave the host's MPI running and its error handler alone.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/mpi/checks.hpp"

namespace {

// The host's all-gather, as braid's HostAllgather expects it.
int mpi_allgather(const void* send, void* recv, std::size_t bytes, void* user) {
  auto comm = *static_cast<MPI_Comm*>(user);
  return MPI_Allgather(send, int(bytes), MPI_BYTE, recv, int(bytes), MPI_BYTE, comm) == MPI_SUCCESS ? 0 : 1;
}

int failing_allgather(const void*, void*, std::size_t, void*) { return 42; }

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s EXPECTED_PROCESS_COUNT (run it under mpiexec -n N)\n", argv[0]);
    return 2;
  }
  const int expected = std::atoi(argv[1]);
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0, local_rank = 0, local_size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_size(node, &local_size);
  MPI_Comm_free(&node);

  using braid::runtime::World;
  MPI_Comm host = MPI_COMM_WORLD;
  World hosted = World::from_host(size, mpi_allgather, &host);
  braid::test::Checks check(hosted);
  check(size == expected, "MPI size " + std::to_string(size) + ", launched with " + std::to_string(expected));
  check(hosted.rank() == rank && hosted.size() == size, "host bootstrap: rank " + std::to_string(hosted.rank()) +
                                                            " of " + std::to_string(hosted.size()) + ", MPI says " +
                                                            std::to_string(rank) + " of " + std::to_string(size));
  check(hosted.local_rank() == local_rank && hosted.local_size() == local_size,
        "host bootstrap: local rank " + std::to_string(hosted.local_rank()) + " of " +
            std::to_string(hosted.local_size()) + ", MPI says " + std::to_string(local_rank) + " of " +
            std::to_string(local_size));
  check(!hosted.has_communicator() && hosted.bootstrap() == "host all-gather", "host world has no communicator");
  check.error([&] { hosted.communicator(); }, braid::Status::unsupported, "host does the communication");
  check.error([] { World::from_host(2, failing_allgather, nullptr); }, braid::Status::invalid_argument,
              "callback failed (returned 42)");
  // Hosts that pass a wrong size (too large: a smaller one would overrun the host's
  // receive buffer, which braid cannot see) get an error on every process.
  check.error([&] { World::from_host(size + 1, mpi_allgather, &host); }, braid::Status::invalid_argument,
              "record " + std::to_string(size) + " of " + std::to_string(size + 1) +
                  " returned by the host's all-gather is not a braid bootstrap record");
  if (size >= 2) {
    check.error(
        [&] { World::from_host(rank == 0 ? size + 1 : size, mpi_allgather, &host); }, braid::Status::invalid_argument,
        rank == 0 ? "was given size " + std::to_string(size) + ", this process size " + std::to_string(size + 1)
                  : "was given size " + std::to_string(size + 1) + ", this process size " + std::to_string(size));
  }
  check.passed("host all-gather bootstrap");

  {
    World joined = World::from_plugin("mpi");
    check(joined.rank() == rank && joined.size() == size && joined.local_rank() == local_rank &&
              joined.local_size() == local_size,
          "plugin world inside a host's MPI: rank " + std::to_string(joined.rank()) + " of " +
              std::to_string(joined.size()));
    std::vector<double> v = {double(rank)};
    joined.communicator().allreduce(std::span<double>(v));
    check(v[0] == size * (size - 1) / 2.0, "all-reduce through the joined plugin: " + std::to_string(v[0]));
  }
  int finalized = 1;
  MPI_Finalized(&finalized);
  check(!finalized, "the plugin finalized the host's MPI");
  MPI_Errhandler handler;
  MPI_Comm_get_errhandler(MPI_COMM_WORLD, &handler);
  check(handler == MPI_ERRORS_ARE_FATAL, "the plugin changed the host's MPI_COMM_WORLD error handler");
  MPI_Errhandler_free(&handler);
  int total = 0, one = 1;
  MPI_Allreduce(&one, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  check(total == size, "host MPI after braid: " + std::to_string(total));
  check.passed("plugin joins and leaves the host's MPI");
  MPI_Finalize();
  return 0;
}
