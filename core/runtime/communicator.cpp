#include "core/runtime/communicator.hpp"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <utility>

#include "core/common/error.hpp"
#include "core/common/text.hpp"

namespace braid::runtime {

Request::Request(std::shared_ptr<CommPlugin> plugin, braid_comm_request_v1* handle, std::string what,
                 std::unique_ptr<BlockCopy> block_copy)
    : plugin_(std::move(plugin)), handle_(handle), what_(std::move(what)), block_copy_(std::move(block_copy)) {}

Request::Request(Request&& other) noexcept
    : plugin_(std::move(other.plugin_)),
      handle_(std::exchange(other.handle_, nullptr)),
      what_(std::move(other.what_)),
      waited_(other.waited_),
      block_copy_(std::move(other.block_copy_)) {}

Request& Request::operator=(Request&& other) noexcept {
  if (this != &other) {
    release();
    plugin_ = std::move(other.plugin_);
    handle_ = std::exchange(other.handle_, nullptr);
    what_ = std::move(other.what_);
    waited_ = other.waited_;
    block_copy_ = std::move(other.block_copy_);
  }
  return *this;
}

Request::~Request() { release(); }

void Request::release() noexcept {
  if (!handle_) return;
  // The plugin may still write the buffers: waiting is the only safe way to let go.
  const int code = plugin_->api().wait(std::exchange(handle_, nullptr));
  if (code != 0) {
    std::fprintf(stderr, "braid: %s, dropped before it completed, failed: %s\n", what_.c_str(),
                 plugin_->api().last_error());
  }
  finish(code == 0);
}

void Request::finish(bool succeeded) noexcept {
  if (block_copy_ && succeeded && !block_copy_->out.empty()) {
    std::memcpy(block_copy_->out.data(), block_copy_->reduced.data() + block_copy_->offset, block_copy_->out.size());
  }
  block_copy_.reset();
}

double Request::wait() {
  if (!handle_) return 0;
  const auto start = std::chrono::steady_clock::now();
  const int code = plugin_->api().wait(std::exchange(handle_, nullptr));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  waited_ += seconds;
  finish(code == 0);
  plugin_->check(code, what_);
  return seconds;
}

bool Request::test() {
  if (!handle_) return true;
  int32_t done = 0;
  const int code = plugin_->api().test(handle_, &done);
  if (done || code != 0) {
    handle_ = nullptr;  // released by the plugin
    finish(code == 0);
  }
  plugin_->check(code, what_);
  return done != 0;
}

Communicator::Communicator(std::shared_ptr<CommPlugin> plugin, braid_comm_v1* handle, std::vector<int> world_ranks)
    : plugin_(std::move(plugin)), handle_(handle), world_ranks_(std::move(world_ranks)) {
  try {
    int32_t rank = 0, size = 0;
    plugin_->check(plugin_->api().comm_rank(handle_, &rank), "comm_rank");
    plugin_->check(plugin_->api().comm_size(handle_, &size), "comm_size");
    if (size != static_cast<int32_t>(world_ranks_.size())) {
      throw Error(Status::plugin, std::string(plugin_->name()) + " plugin: a communicator over " +
                                      std::to_string(world_ranks_.size()) + " ranks reports size " +
                                      std::to_string(size));
    }
    rank_ = rank;
  } catch (...) {
    plugin_->api().comm_free(handle_);  // the destructor does not run for a half-built object
    throw;
  }
}

Communicator::Communicator(Communicator&& other) noexcept
    : plugin_(std::move(other.plugin_)),
      handle_(std::exchange(other.handle_, nullptr)),
      world_ranks_(std::move(other.world_ranks_)),
      rank_(other.rank_) {}

Communicator& Communicator::operator=(Communicator&& other) noexcept {
  if (this != &other) {
    if (handle_) plugin_->api().comm_free(handle_);
    plugin_ = std::move(other.plugin_);
    handle_ = std::exchange(other.handle_, nullptr);
    world_ranks_ = std::move(other.world_ranks_);
    rank_ = other.rank_;
  }
  return *this;
}

Communicator::~Communicator() {
  if (handle_) plugin_->api().comm_free(handle_);
}

std::string Communicator::describe() const {
  std::string ranks;
  for (std::size_t i = 0; i < world_ranks_.size() && i < 16; ++i)
    append_item(ranks, std::to_string(world_ranks_[i]), ",");
  if (world_ranks_.size() > 16) ranks += ",...";
  return "this " + std::to_string(size()) + "-rank communicator (world ranks " + ranks + ")";
}

void Communicator::check_rank(int rank, const char* call, const char* role) const {
  if (rank < 0 || rank >= size()) {
    throw Error(Status::invalid_argument, std::string("Communicator::") + call + ": " + role + " " +
                                              std::to_string(rank) + " is not a rank of " + describe());
  }
}

std::string Communicator::member(int rank) const {
  return "rank " + std::to_string(rank) + " (world rank " +
         std::to_string(world_ranks_[static_cast<std::size_t>(rank)]) + ")";
}

Request Communicator::isend(std::span<const std::byte> data, int peer, int tag) {
  check_rank(peer, "isend", "peer");
  braid_comm_request_v1* r = nullptr;
  std::string what = "isend of " + std::to_string(data.size()) + " bytes to " + member(peer) + " with tag " +
                     std::to_string(tag) + " over " + describe();
  plugin_->check(plugin_->api().isend(handle_, data.data(), data.size(), peer, tag, &r), what);
  return Request(plugin_, r, std::move(what));
}

Request Communicator::irecv(std::span<std::byte> data, int peer, int tag) {
  check_rank(peer, "irecv", "peer");
  braid_comm_request_v1* r = nullptr;
  std::string what = "irecv of " + std::to_string(data.size()) + " bytes from " + member(peer) + " with tag " +
                     std::to_string(tag) + " over " + describe();
  plugin_->check(plugin_->api().irecv(handle_, data.data(), data.size(), peer, tag, &r), what);
  return Request(plugin_, r, std::move(what));
}

namespace {

int32_t plugin_op(ReduceOp op) {
  return op == ReduceOp::sum ? BRAID_COMM_SUM : op == ReduceOp::max ? BRAID_COMM_MAX : BRAID_COMM_MIN;
}

}  // namespace

Request Communicator::iallreduce_raw(const void* send, void* recv, std::size_t count, std::size_t recv_count,
                                     int32_t dtype, ReduceOp op) {
  if (count != recv_count) {
    throw Error(Status::invalid_argument, "Communicator::iallreduce: send has " + std::to_string(count) +
                                              " elements, recv " + std::to_string(recv_count));
  }
  braid_comm_request_v1* r = nullptr;
  std::string what = "iallreduce of " + std::to_string(count) + " elements over " + describe();
  plugin_->check(plugin_->api().iallreduce(handle_, send, recv, count, dtype, plugin_op(op), &r), what);
  return Request(plugin_, r, std::move(what));
}

Request Communicator::ireduce_scatter_raw(const void* send, void* recv, std::size_t send_count, std::size_t recv_count,
                                          std::size_t element_bytes, int32_t dtype, ReduceOp op) {
  if (send_count != recv_count * world_ranks_.size()) {
    throw Error(Status::invalid_argument, "Communicator::ireduce_scatter: send has " + std::to_string(send_count) +
                                              " elements, " + describe() + " reduce-scatters " +
                                              std::to_string(size()) + " x " + std::to_string(recv_count));
  }
  const auto* send_bytes = static_cast<const std::byte*>(send);
  auto* recv_bytes = static_cast<std::byte*>(recv);
  const std::less<const std::byte*> before;
  if (recv_count > 0 && before(send_bytes, recv_bytes + recv_count * element_bytes) &&
      before(recv_bytes, send_bytes + send_count * element_bytes)) {
    throw Error(Status::invalid_argument, "Communicator::ireduce_scatter: send and recv overlap");
  }
  braid_comm_request_v1* r = nullptr;
  std::string what = "ireduce_scatter of " + std::to_string(recv_count) + " elements per rank over " + describe();
  if (plugin_->api().ireduce_scatter) {
    plugin_->check(plugin_->api().ireduce_scatter(handle_, send, recv, recv_count, dtype, plugin_op(op), &r), what);
    return Request(plugin_, r, std::move(what));
  }
  what += " (through iallreduce: the plugin has no ireduce_scatter)";
  auto copy = std::make_unique<Request::BlockCopy>();
  copy->reduced.resize(send_count * element_bytes);
  copy->offset = static_cast<std::size_t>(rank_) * recv_count * element_bytes;
  copy->out = std::span<std::byte>(recv_bytes, recv_count * element_bytes);
  plugin_->check(plugin_->api().iallreduce(handle_, send, copy->reduced.data(), send_count, dtype, plugin_op(op), &r),
                 what);
  return Request(plugin_, r, std::move(what), std::move(copy));
}

Request Communicator::iallgather(std::span<const std::byte> send, std::span<std::byte> recv) {
  if (recv.size() != send.size() * world_ranks_.size()) {
    throw Error(Status::invalid_argument, "Communicator::iallgather: recv holds " + std::to_string(recv.size()) +
                                              " bytes, " + describe() + " gathers " + std::to_string(size()) + " x " +
                                              std::to_string(send.size()));
  }
  braid_comm_request_v1* r = nullptr;
  std::string what = "iallgather of " + std::to_string(send.size()) + " bytes per rank over " + describe();
  plugin_->check(plugin_->api().iallgather(handle_, send.data(), recv.data(), send.size(), &r), what);
  return Request(plugin_, r, std::move(what));
}

Request Communicator::ibroadcast(std::span<std::byte> data, int root) {
  check_rank(root, "ibroadcast", "root");
  braid_comm_request_v1* r = nullptr;
  std::string what =
      "ibroadcast of " + std::to_string(data.size()) + " bytes from " + member(root) + " over " + describe();
  plugin_->check(plugin_->api().ibroadcast(handle_, data.data(), data.size(), root, &r), what);
  return Request(plugin_, r, std::move(what));
}

void Communicator::barrier() { plugin_->check(plugin_->api().barrier(handle_), "barrier over " + describe()); }

}  // namespace braid::runtime
