// C++ side of a communication plugin's communicator: non-blocking operations return
// a Request whose wait() measures the seconds spent blocked, which the executor
// reports as bubbles. Errors are braid::Error: invalid_argument for misuse caught
// here (a peer outside the communicator, buffers of the wrong size), plugin for
// failures the backend reports, with its message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "core/runtime/comm_plugin.hpp"

namespace braid::runtime {

enum class ReduceOp { sum, max, min };

// One operation in flight. Move-only; destroying a pending request waits for it
// (its buffers may still be in use), reporting a failure on stderr.
class Request {
 public:
  Request() = default;
  Request(Request&& other) noexcept;
  Request& operator=(Request&& other) noexcept;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request();

  bool pending() const { return handle_ != nullptr; }
  // Blocks until done and returns the seconds it blocked (also added to waited_seconds()).
  // Throws Error(Status::plugin) when the operation failed. No-op on a finished request.
  double wait();
  // True once done (never blocks); throws when the operation failed.
  bool test();
  // Seconds spent blocked in wait() on this request.
  double waited_seconds() const { return waited_; }
  // "isend of 40 bytes to rank 1 (world rank 3) with tag 7 over this 2-rank communicator
  // (world ranks 2,3)"
  const std::string& description() const { return what_; }

 private:
  friend class Communicator;
  // The reduce-scatter of a plugin without ireduce_scatter: an all-reduce into `reduced`,
  // which the plugin writes until the request completes, then this rank's block copied out.
  struct BlockCopy {
    std::vector<std::byte> reduced;
    std::size_t offset = 0;  // bytes
    std::span<std::byte> out;
  };
  Request(std::shared_ptr<CommPlugin> plugin, braid_comm_request_v1* handle, std::string what,
          std::unique_ptr<BlockCopy> block_copy = nullptr);
  void release() noexcept;
  // After the plugin released the request: the block copy when it succeeded, then frees its buffer.
  void finish(bool succeeded) noexcept;
  std::shared_ptr<CommPlugin> plugin_;
  braid_comm_request_v1* handle_ = nullptr;
  std::string what_;
  double waited_ = 0;
  std::unique_ptr<BlockCopy> block_copy_;
};

// Element types iallreduce and ireduce_scatter take.
template <class T>
inline constexpr int32_t comm_dtype = -1;
template <>
inline constexpr int32_t comm_dtype<float> = BRAID_COMM_FLOAT32;
template <>
inline constexpr int32_t comm_dtype<double> = BRAID_COMM_FLOAT64;
template <>
inline constexpr int32_t comm_dtype<std::int32_t> = BRAID_COMM_INT32;
template <>
inline constexpr int32_t comm_dtype<std::int64_t> = BRAID_COMM_INT64;

// A group of processes of the world (World::communicator() or World::group()).
// Move-only; frees the plugin's communicator when destroyed.
class Communicator {
 public:
  Communicator(Communicator&& other) noexcept;
  Communicator& operator=(Communicator&& other) noexcept;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  ~Communicator();

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(world_ranks_.size()); }
  // World rank of each member, by rank in this communicator.
  const std::vector<int>& world_ranks() const { return world_ranks_; }

  Request isend(std::span<const std::byte> data, int peer, int tag);
  // Receives exactly data.size() bytes; a message of another length fails the request.
  Request irecv(std::span<std::byte> data, int peer, int tag);
  // recv[i] = op over ranks of send[i]; send and recv may be the same buffer.
  template <class T>
  Request iallreduce(std::span<const T> send, std::span<T> recv, ReduceOp op = ReduceOp::sum) {
    static_assert(comm_dtype<std::remove_const_t<T>> >= 0, "iallreduce takes float, double, int32_t or int64_t");
    return iallreduce_raw(send.data(), recv.data(), send.size(), recv.size(), comm_dtype<T>, op);
  }
  template <class T>
  Request iallreduce(std::span<T> data, ReduceOp op = ReduceOp::sum) {
    return iallreduce(std::span<const T>(data), data, op);
  }
  // MPI_Reduce_scatter_block: send holds size() blocks of recv.size() elements; recv gets
  // op over ranks of block rank(). send and recv must not overlap. A plugin without
  // ireduce_scatter (braid_comm_v1.h) all-reduces the whole of send into a buffer the
  // request owns and copies this rank's block into recv when it completes: about twice
  // the bytes on the wire, and size() * recv.size() elements of memory meanwhile.
  template <class T>
  Request ireduce_scatter(std::span<const T> send, std::span<T> recv, ReduceOp op = ReduceOp::sum) {
    static_assert(comm_dtype<T> >= 0, "ireduce_scatter takes float, double, int32_t or int64_t");
    return ireduce_scatter_raw(send.data(), recv.data(), send.size(), recv.size(), sizeof(T), comm_dtype<T>, op);
  }
  // Every rank sends send.size() bytes; recv (size() * send.size() bytes) gets rank r's at r * send.size().
  Request iallgather(std::span<const std::byte> send, std::span<std::byte> recv);
  // root's data is copied into every other rank's data (same size everywhere).
  Request ibroadcast(std::span<std::byte> data, int root);

  // Blocking forms: the operation, then wait().
  void send(std::span<const std::byte> data, int peer, int tag) { isend(data, peer, tag).wait(); }
  void recv(std::span<std::byte> data, int peer, int tag) { irecv(data, peer, tag).wait(); }
  template <class T>
  void allreduce(std::span<T> data, ReduceOp op = ReduceOp::sum) {
    iallreduce(data, op).wait();
  }
  template <class T>
  void reduce_scatter(std::span<const T> send, std::span<T> recv, ReduceOp op = ReduceOp::sum) {
    ireduce_scatter(send, recv, op).wait();
  }
  void allgather(std::span<const std::byte> send, std::span<std::byte> recv) { iallgather(send, recv).wait(); }
  void broadcast(std::span<std::byte> data, int root) { ibroadcast(data, root).wait(); }
  void barrier();

 private:
  friend class World;
  Communicator(std::shared_ptr<CommPlugin> plugin, braid_comm_v1* handle, std::vector<int> world_ranks);
  Request iallreduce_raw(const void* send, void* recv, std::size_t count, std::size_t recv_count, int32_t dtype,
                         ReduceOp op);
  Request ireduce_scatter_raw(const void* send, void* recv, std::size_t send_count, std::size_t recv_count,
                              std::size_t element_bytes, int32_t dtype, ReduceOp op);
  void check_rank(int rank, const char* call, const char* role) const;
  std::string describe() const;
  // "rank 1 (world rank 3)", for a rank check_rank accepted.
  std::string member(int rank) const;
  std::shared_ptr<CommPlugin> plugin_;
  braid_comm_v1* handle_ = nullptr;
  std::vector<int> world_ranks_;
  int rank_ = 0;
};

}  // namespace braid::runtime
