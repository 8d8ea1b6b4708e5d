// The processes of a training job: this process's rank, the world size, and its rank
// and the process count on its node. Two ways in:
//  - from_plugin("mpi"): the communication plugin joins the launcher's world (mpiexec,
//    or a world of one when started plainly) and provides communicators;
//  - from_host(size, allgather, user): a host framework that owns the processes (a
//    PyTorch or DeepSpeed job) lends braid its own all-gather. Every process sends a
//    fixed-size record (a magic value, the size it was given, its hostname, pid and a
//    random nonce); the host returns all records in its rank order, so this process's
//    rank is the position of its own record, its local rank the number of lower ranks
//    on the same hostname. The host passes the size because the receive buffer
//    (size * bytes) has to exist before the call. Such a world has no communicator:
//    the host keeps doing the communication.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/runtime/comm_plugin.hpp"
#include "core/runtime/communicator.hpp"

namespace braid::runtime {

// The host's all-gather over its process group: `bytes` bytes from `send` of every
// process into `recv` (size * bytes), process r's at r * bytes. Returns 0 on success.
// Called once per bootstrap, from every process, with the same `bytes`.
using HostAllgather = int (*)(const void* send, void* recv, std::size_t bytes, void* user);

class World {
 public:
  // Loads libbraid-<backend>.so and joins its world; throws Error(Status::plugin) with the
  // reason. Worlds may coexist; once the last one that started MPI is gone, MPI cannot
  // start again in this process (an MPI rule), and a later from_plugin says so.
  static World from_plugin(const std::string& backend = "mpi");
  // Learns rank, local rank and local size through the host's all-gather (see above);
  // throws Error(Status::invalid_argument) when the callback fails or returns records
  // that are not every process's, once each, in a consistent world of `size`.
  static World from_host(int size, HostAllgather allgather, void* user);

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  // "mpi plugin /path/libbraid-mpi.so (Open MPI v4.1.4, ...)" or "host all-gather".
  const std::string& bootstrap() const { return bootstrap_; }

  bool has_communicator() const { return world_.has_value(); }
  // Every process, world rank order; throws Error(Status::unsupported) for a host-bootstrapped world.
  Communicator& communicator();
  // A communicator over the given world ranks (its rank i is world_ranks[i]). Collective
  // over those ranks only, in one order every process agrees on (braid_comm_v1.h).
  Communicator group(const std::vector<int>& world_ranks) const;
  // Ends every process (the plugin's abort, i.e. MPI_Abort) or, without a plugin, this one.
  [[noreturn]] void abort(int code) const;

 private:
  World() = default;
  std::shared_ptr<CommPlugin> plugin_;
  std::optional<Communicator> world_;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  std::string bootstrap_;
};

}  // namespace braid::runtime
