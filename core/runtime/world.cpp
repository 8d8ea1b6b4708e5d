#include "core/runtime/world.hpp"

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>

#include "core/common/error.hpp"
#include "core/common/text.hpp"

namespace braid::runtime {
namespace {

// One process's contribution to the host bootstrap. Fixed layout, no padding.
struct BootRecord {
  std::uint64_t magic;
  std::int32_t size;  // the world size this process was given
  std::int32_t pid;
  std::uint64_t nonce;  // tells apart processes whose hostname and pid agree (pid namespaces)
  char host[256];
};
static_assert(sizeof(BootRecord) == 280, "BootRecord must have no padding");
constexpr std::uint64_t kBootMagic = 0x31646c726f776272ULL;  // "brworld1"

BootRecord own_record(int size) {
  BootRecord r{};
  r.magic = kBootMagic;
  r.size = size;
  r.pid = static_cast<std::int32_t>(::getpid());
  std::random_device device;
  r.nonce = (std::uint64_t(device()) << 32) ^ device();
  if (::gethostname(r.host, sizeof r.host - 1) != 0) std::strcpy(r.host, "unknown-host");
  r.host[sizeof r.host - 1] = '\0';
  return r;
}

}  // namespace

World World::from_plugin(const std::string& backend) {
  World w;
  w.plugin_ = load_comm_plugin(backend);
  w.plugin_->init();
  const auto& api = w.plugin_->api();
  int32_t rank = 0, size = 0, local_rank = 0, local_size = 0;
  w.plugin_->check(api.world(&rank, &size, &local_rank, &local_size), "world");
  w.rank_ = rank;
  w.size_ = size;
  w.local_rank_ = local_rank;
  w.local_size_ = local_size;
  braid_comm_v1* handle = nullptr;
  w.plugin_->check(api.comm_world(&handle), "comm_world");
  std::vector<int> ranks(size);
  for (int i = 0; i < size; ++i) ranks[i] = i;
  w.world_.emplace(Communicator(w.plugin_, handle, std::move(ranks)));
  w.bootstrap_ =
      std::string(w.plugin_->name()) + " plugin " + w.plugin_->path() + " (" + w.plugin_->backend_version() + ")";
  return w;
}

World World::from_host(int size, HostAllgather allgather, void* user) {
  if (size < 1) throw Error(Status::invalid_argument, "World::from_host: size " + std::to_string(size) + " < 1");
  if (!allgather) throw Error(Status::invalid_argument, "World::from_host: the all-gather callback is NULL");
  const BootRecord mine = own_record(size);
  std::vector<BootRecord> all(static_cast<std::size_t>(size));
  std::memset(all.data(), 0, all.size() * sizeof(BootRecord));  // unfilled records fail the magic check
  if (int rc = allgather(&mine, all.data(), sizeof(BootRecord), user); rc != 0) {
    throw Error(Status::invalid_argument,
                "World::from_host: the host's all-gather callback failed (returned " + std::to_string(rc) + ")");
  }
  World w;
  w.size_ = size;
  int found = 0;
  for (int r = 0; r < size; ++r) {
    BootRecord& other = all[r];
    if (other.magic != kBootMagic) {
      throw Error(Status::invalid_argument,
                  "World::from_host: record " + std::to_string(r) + " of " + std::to_string(size) +
                      " returned by the host's all-gather is not a braid bootstrap record (did the callback fill "
                      "recv with every process's " +
                      std::to_string(sizeof(BootRecord)) + " bytes, in rank order?)");
    }
    other.host[sizeof other.host - 1] = '\0';
    if (other.size != size) {
      throw Error(Status::invalid_argument, "World::from_host: rank " + std::to_string(r) + " (" + other.host +
                                                ") was given size " + std::to_string(other.size) +
                                                ", this process size " + std::to_string(size));
    }
    if (other.pid == mine.pid && other.nonce == mine.nonce && std::strcmp(other.host, mine.host) == 0) {
      if (found++ == 0) w.rank_ = r;
    }
  }
  if (found != 1) {
    throw Error(Status::invalid_argument, "World::from_host: this process's record appears " + std::to_string(found) +
                                              " times among the " + std::to_string(size) +
                                              " the host's all-gather returned (expected once)");
  }
  w.local_rank_ = 0;
  w.local_size_ = 0;
  for (int r = 0; r < size; ++r) {
    if (std::strcmp(all[r].host, mine.host) != 0) continue;
    if (r < w.rank_) ++w.local_rank_;
    ++w.local_size_;
  }
  w.bootstrap_ = "host all-gather";
  return w;
}

Communicator& World::communicator() {
  if (!world_) {
    throw Error(Status::unsupported,
                "World::communicator: this world was bootstrapped through the host's all-gather and has no "
                "communication plugin; the host does the communication");
  }
  return *world_;
}

Communicator World::group(const std::vector<int>& world_ranks) const {
  if (!plugin_) {
    throw Error(Status::unsupported,
                "World::group: this world was bootstrapped through the host's all-gather and "
                "has no communication plugin to build groups with");
  }
  std::vector<int32_t> ranks(world_ranks.begin(), world_ranks.end());
  braid_comm_v1* handle = nullptr;
  std::string list;
  for (std::size_t i = 0; i < world_ranks.size() && i < 16; ++i) append_item(list, std::to_string(world_ranks[i]), ",");
  if (world_ranks.size() > 16) list += ",...";
  plugin_->check(plugin_->api().comm_create(ranks.data(), static_cast<int32_t>(ranks.size()), &handle),
                 "comm_create over world ranks " + list);
  return Communicator(plugin_, handle, world_ranks);
}

void World::abort(int code) const {
  if (plugin_) plugin_->api().abort(code);
  std::_Exit(code ? code : 1);
}

}  // namespace braid::runtime
