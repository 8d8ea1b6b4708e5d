// The MPI communication plugin in real processes: run by ctest as `mpiexec -n 2` and
// `-n 4`, and plainly as a singleton. argv[1] is the process count to expect. This
// program does not link MPI: the plugin brings it, as it does in libbraid.so hosts.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tests/mpi/checks.hpp"

namespace braid {
namespace {

using runtime::Communicator;
using runtime::ReduceOp;
using runtime::Request;
using runtime::World;

template <class T>
std::span<const std::byte> bytes_of(const std::vector<T>& v) {
  return std::as_bytes(std::span<const T>(v));
}
template <class T>
std::span<std::byte> bytes_of(std::vector<T>& v) {
  return std::as_writable_bytes(std::span<T>(v));
}

void world_shape(World& world, int expected_size, test::Checks& check) {
  check(world.size() == expected_size,
        "world size " + std::to_string(world.size()) + ", launched with " + std::to_string(expected_size));
  check(world.rank() >= 0 && world.rank() < world.size(), "rank " + std::to_string(world.rank()) + " out of range");
  // ctest starts every process on this machine.
  check(world.local_size() == world.size(), "local size " + std::to_string(world.local_size()));
  check(world.local_rank() == world.rank(), "local rank " + std::to_string(world.local_rank()));
  check(world.bootstrap().find("mpi plugin") == 0 && world.bootstrap().find("libbraid-mpi.so") != std::string::npos,
        "bootstrap: " + world.bootstrap());
  Communicator& comm = world.communicator();
  check(comm.rank() == world.rank() && comm.size() == world.size(), "world communicator rank/size");
  // Every rank sees the same world: the sum of ranks is the closed form.
  std::vector<std::int64_t> sum = {world.rank(), 1};
  comm.allreduce(std::span<std::int64_t>(sum));
  const std::int64_t n = world.size();
  check(sum[0] == n * (n - 1) / 2 && sum[1] == n, "sum of ranks " + std::to_string(sum[0]));
  check.passed("world");
}

void ring(World& world, test::Checks& check) {
  Communicator& comm = world.communicator();
  const int n = comm.size(), r = comm.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  std::vector<double> out(1000), in(1000, -1);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = r * 1e4 + double(i);
  // Receive first, then send: non-blocking on both sides, any order completes.
  Request recv = comm.irecv(bytes_of(in), prev, 7);
  Request send = comm.isend(bytes_of(out), next, 7);
  send.wait();
  recv.wait();
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (in[i] != prev * 1e4 + double(i))
      check(false,
            "ring: element " + std::to_string(i) + " from " + std::to_string(prev) + " is " + std::to_string(in[i]));
  }
  check(true, "ring");
  check.passed("send/recv ring");
}

void allreduce(World& world, test::Checks& check) {
  Communicator& comm = world.communicator();
  const int n = comm.size(), r = comm.rank();
  // x_r[i] = r + i: integers, exact in float; sum over ranks = n(n-1)/2 + n*i.
  const std::size_t count = 4099;
  std::vector<float> xf(count), sf(count, -1);
  std::vector<double> xd(count);
  for (std::size_t i = 0; i < count; ++i) xf[i] = float(r) + float(i), xd[i] = 0.5 * r - double(i);
  comm.iallreduce<float>(xf, sf).wait();
  Request in_place = comm.iallreduce(std::span<double>(xd));
  in_place.wait();
  for (std::size_t i = 0; i < count; ++i) {
    const double want_f = n * (n - 1) / 2.0 + double(n) * double(i);
    const double want_d = 0.25 * n * (n - 1) - double(n) * double(i);
    if (sf[i] != float(want_f)) check(false, "float sum[" + std::to_string(i) + "] = " + std::to_string(sf[i]));
    if (xd[i] != want_d) check(false, "double sum[" + std::to_string(i) + "] = " + std::to_string(xd[i]));
  }
  std::vector<float> mx = {float(r), -float(r)};
  comm.allreduce(std::span<float>(mx), ReduceOp::max);
  check(mx[0] == float(n - 1) && mx[1] == 0.f, "max: " + std::to_string(mx[0]) + ", " + std::to_string(mx[1]));
  std::vector<std::int32_t> mn = {r + 5};
  comm.allreduce(std::span<std::int32_t>(mn), ReduceOp::min);
  check(mn[0] == 5, "min: " + std::to_string(mn[0]));
  check.passed("all-reduce (float32, float64 in place, max, min)");
}

void reduce_scatter(World& world, test::Checks& check) {
  Communicator& comm = world.communicator();
  const int n = comm.size(), r = comm.rank();
  // Block q of x_r holds r + q + i: integers, exact in float; rank r gets block r summed
  // over ranks, n(n-1)/2 + n(r + i).
  const std::size_t count = 1031;
  std::vector<float> xf(n * count), sf(count, -1);
  std::vector<double> xd(n * count), sd(count, -1);
  for (int q = 0; q < n; ++q) {
    for (std::size_t i = 0; i < count; ++i) {
      xf[q * count + i] = float(r + q) + float(i);
      xd[q * count + i] = 0.5 * r - double(q * count + i);
    }
  }
  Request request = comm.ireduce_scatter<float>(xf, sf);
  check(request.description().find("through iallreduce") == std::string::npos,
        "the mpi plugin reduce-scatters itself: " + request.description());
  request.wait();
  comm.reduce_scatter<double>(xd, sd);
  for (std::size_t i = 0; i < count; ++i) {
    const double want_f = n * (n - 1) / 2.0 + double(n) * double(r + i);
    const double want_d = 0.25 * n * (n - 1) - double(n) * double(r * count + i);
    if (sf[i] != float(want_f)) check(false, "float block[" + std::to_string(i) + "] = " + std::to_string(sf[i]));
    if (sd[i] != want_d) check(false, "double block[" + std::to_string(i) + "] = " + std::to_string(sd[i]));
  }
  std::vector<std::int64_t> products(n), mine = {-1};
  for (int q = 0; q < n; ++q) products[q] = std::int64_t(r) * q;
  comm.reduce_scatter<std::int64_t>(products, mine, ReduceOp::max);
  check(mine[0] == std::int64_t(n - 1) * r, "max: " + std::to_string(mine[0]));
  check.error(
      [&] { comm.ireduce_scatter<float>(std::span(xf).first(n * count - 1), sf); }, Status::invalid_argument,
      "send has " + std::to_string(n * count - 1) + " elements, this " + std::to_string(n) + "-rank communicator");
  check.passed("reduce-scatter (float32, float64 sums, int64 max)");
}

void allgather_and_broadcast(World& world, test::Checks& check) {
  Communicator& comm = world.communicator();
  const int n = comm.size(), r = comm.rank();
  std::vector<std::int32_t> mine = {r, r * r, -r}, all(3 * n, 99);
  Request gather = comm.iallgather(bytes_of(mine), bytes_of(all));
  // Poll with test(): a request finished that way blocked for no time.
  while (!gather.test()) std::this_thread::yield();
  check(!gather.pending() && gather.waited_seconds() == 0, "test() completes without recorded waiting");
  for (int q = 0; q < n; ++q) {
    check(all[3 * q] == q && all[3 * q + 1] == q * q && all[3 * q + 2] == -q,
          "all-gather block " + std::to_string(q) + ": " + std::to_string(all[3 * q]));
  }
  std::vector<char> text(32, '\0');
  const int root = n - 1;
  if (r == root) std::snprintf(text.data(), text.size(), "from rank %d", root);
  comm.broadcast(bytes_of(text), root);
  check(std::string(text.data()) == "from rank " + std::to_string(root), "broadcast: " + std::string(text.data()));
  check.passed("all-gather, broadcast");
}

void groups(World& world, test::Checks& check) {
  const int n = world.size(), r = world.rank();
  // Even and odd world ranks: each process creates only the group it belongs to.
  std::vector<int> members;
  for (int q = r % 2; q < n; q += 2) members.push_back(q);
  Communicator parity = world.group(members);
  const int k = int(members.size());
  check(parity.size() == k, "parity group size " + std::to_string(parity.size()) + ", expected " + std::to_string(k));
  check(parity.world_ranks()[parity.rank()] == r, "parity group rank " + std::to_string(parity.rank()));
  std::vector<double> v = {double(r), 1.0};
  parity.allreduce(std::span<double>(v));
  // Sum of p, p+2, ..., p+2(k-1) for parity p.
  const double want = k * (r % 2) + 2.0 * k * (k - 1) / 2;
  check(v[0] == want && v[1] == k, "parity group sum " + std::to_string(v[0]) + ", expected " + std::to_string(want));

  // Overlapping groups {q, q+1 mod n}, created by their members in increasing q.
  if (n >= 2) {
    for (int q = 0; q < n; ++q) {
      const int a = q, b = (q + 1) % n;
      if (r != a && r != b) continue;
      Communicator pair = world.group({a, b});
      check(pair.size() == 2 && pair.rank() == (r == a ? 0 : 1),
            "pair group {" + std::to_string(a) + "," + std::to_string(b) + "} rank " + std::to_string(pair.rank()));
      std::vector<std::int64_t> s = {r};
      pair.allreduce(std::span<std::int64_t>(s));
      check(s[0] == a + b, "pair group sum " + std::to_string(s[0]));
    }
  }
  // A process may only create a group it belongs to.
  if (n >= 2) {
    check.error([&] { world.group({(r + 1) % n}); }, Status::plugin, "is not among the 1 listed ranks");
  }
  // Members that list one set in different orders fail alike, naming the difference, where MPI
  // alone would leave them waiting for each other; then the same list works.
  if (n >= 2 && r < 2) {
    check.error(
        [&] {
          world.group(r == 0 ? std::vector<int>{0, 1} : std::vector<int>{1, 0});
        },
        Status::plugin,
        r == 0 ? "another member lists the 2 ranks in another order than this process"
               : "this process lists the 2 ranks in another order than world rank 0 (at position 0: world rank 1, "
                 "where it has 0)");
    Communicator again = world.group({1, 0});
    check(again.rank() == 1 - r, "the listed order after a refused one: rank " + std::to_string(again.rank()));
  }
  check.error([&] { world.group({r, r}); }, Status::plugin, "listed twice");
  check.error([&] { world.group({r, n}); }, Status::plugin, "is not a rank of the " + std::to_string(n));
  check.passed("groups from rank lists (even/odd, overlapping pairs)");
}

void waiting_is_measured(World& world, test::Checks& check) {
  Communicator& comm = world.communicator();
  const int n = comm.size(), r = comm.rank();
  if (n < 2) {
    if (r == 0) std::printf("skip waiting time (needs 2 processes)\n");
    return;
  }
  using Clock = std::chrono::steady_clock;
  constexpr double delay = 0.3;
  std::vector<std::int32_t> token(4, r);
  const auto entered = Clock::now();
  comm.barrier();
  if (r == n - 1) {
    // The sender leaves the barrier only after rank 0 entered it, then sleeps: rank 0's
    // receive cannot complete before entered + delay.
    std::this_thread::sleep_for(std::chrono::duration<double>(delay));
    comm.send(bytes_of(token), 0, 3);
  } else if (r == 0) {
    Request recv = comm.irecv(bytes_of(token), n - 1, 3);
    const auto before = Clock::now();
    const double waited = recv.wait();
    const double owed = delay - std::chrono::duration<double>(before - entered).count();
    check(waited == recv.waited_seconds(), "wait() returns what waited_seconds() records");
    // Half the causal minimum: the clock reads around wait() are not the plugin's.
    check(waited > 0 && (owed <= 0 || waited >= 0.5 * owed), "waited " + std::to_string(waited) +
                                                                 " s, but the message could not arrive for another " +
                                                                 std::to_string(owed) + " s");
    check(token[0] == n - 1, "token from rank " + std::to_string(token[0]));
  }
  comm.barrier();
  check.passed("waiting time recorded");
}

void errors_come_back(World& world, test::Checks& check) {
  Communicator& comm = world.communicator();
  const int n = comm.size(), r = comm.rank();
  check.error([&] { comm.isend({}, n, 0); }, Status::invalid_argument, "peer " + std::to_string(n) + " is not a rank");
  std::vector<float> a(3), b(4);
  check.error([&] { comm.iallreduce<float>(a, b); }, Status::invalid_argument, "send has 3 elements, recv 4");
  // The plugin itself refuses bad arguments with a message, without aborting.
  braid_comm_v1* handle = nullptr;
  auto plugin = runtime::load_comm_plugin("mpi");  // the same library, already initialised by `world`
  const auto& api = plugin->api();
  check(api.comm_world(&handle) == 0, "comm_world");
  braid_comm_request_v1* request = nullptr;
  check(api.irecv(handle, a.data(), 4, n + 3, 0, &request) != 0 && request == nullptr, "bad peer is refused");
  check(std::string(api.last_error()).find("is not a rank of this " + std::to_string(n) + "-rank") != std::string::npos,
        std::string("last_error: ") + api.last_error());
  check(api.iallreduce(handle, a.data(), a.data(), 3, 17, BRAID_COMM_SUM, &request) != 0, "unknown dtype refused");
  check(std::string(api.last_error()).find("unknown dtype 17") != std::string::npos, api.last_error());
  check(api.ireduce_scatter(handle, a.data(), b.data(), 1, BRAID_COMM_FLOAT32, 9, &request) != 0, "unknown op refused");
  check(std::string(api.last_error()).find("ireduce_scatter: unknown op 9") != std::string::npos, api.last_error());
  // NULL buffers for data that exists are refused before MPI reads them (they crashed: the
  // self-receive's copy even after returning 0). No call below posts anything.
  const auto refused = [&](int rc, const std::string& message) {
    check(rc != 0 && request == nullptr, message + " refused");
    check(std::string(api.last_error()).find(message) != std::string::npos, api.last_error());
  };
  refused(api.irecv(handle, nullptr, 16, r, 3, &request), "irecv: receive buffer is NULL for 16");
  refused(api.isend(handle, nullptr, 16, r, 3, &request), "isend: send buffer is NULL for 16");
  refused(api.iallreduce(handle, a.data(), nullptr, 3, BRAID_COMM_FLOAT32, BRAID_COMM_SUM, &request),
          "iallreduce: receive buffer is NULL for 3");
  refused(api.iallreduce(handle, nullptr, nullptr, 3, BRAID_COMM_FLOAT32, BRAID_COMM_SUM, &request),
          "iallreduce: send buffer is NULL for 3");
  refused(api.ireduce_scatter(handle, nullptr, a.data(), 1, BRAID_COMM_FLOAT32, BRAID_COMM_SUM, &request),
          "ireduce_scatter: send buffer is NULL");
  refused(api.iallgather(handle, a.data(), nullptr, 4, &request), "iallgather: receive buffer is NULL for 4");
  refused(api.ibroadcast(handle, nullptr, 4, 0, &request), "ibroadcast: data buffer is NULL for 4");
  // Tags outside 0..32767 are refused, naming the tag: MPI took -1 on a receive as MPI_ANY_TAG,
  // which matched (and stole) any message.
  refused(api.irecv(handle, a.data(), 4, r, -1, &request), "irecv: tag -1 is outside 0..32767");
  refused(api.isend(handle, a.data(), 4, r, 32768, &request), "isend: tag 32768 is outside 0..32767");
  refused(api.irecv(handle, a.data(), 4, r, 40000, &request), "irecv: tag 40000 is outside 0..32767");
  {
    const std::string here = "rank " + std::to_string(r) + " (world rank " + std::to_string(r) + ")";
    const std::string over = "over this " + std::to_string(n) + "-rank communicator (world ranks ";
    check.error([&] { comm.irecv(bytes_of(b), r, -1); }, Status::plugin,
                "irecv of 16 bytes from " + here + " with tag -1 " + over);
    check.error([&] { comm.isend(bytes_of(b), r, 32768); }, Status::plugin, "isend: tag 32768 is outside 0..32767");
  }
  if (n >= 2) {
    // Messages of the wrong length fail the receive with MPI's message; the job goes on.
    std::vector<std::int32_t> two(2, 1), four(4, 0);
    if (r == 0) {
      comm.send(bytes_of(two), 1, 11);   // shorter than the receive
      comm.send(bytes_of(four), 1, 12);  // longer than the receive
    } else if (r == 1) {
      Request shorter = comm.irecv(bytes_of(four), 0, 11);
      check.error([&] { shorter.wait(); }, Status::plugin, "received 8 bytes, expected 16");
      check(!shorter.pending(), "a failed request is released");
      Request longer = comm.irecv(bytes_of(two), 0, 12);
      check.error([&] { longer.wait(); }, Status::plugin,
                  "irecv of 8 bytes from rank 0 (world rank 0) with tag 12 over this " + std::to_string(n) +
                      "-rank communicator (world ranks 0,1");
      check(!longer.pending(), "a failed request is released");
    }
    comm.barrier();
    // A group whose ranks are not the world's: errors and descriptions give the peer's world
    // rank and the communicator's world ranks.
    if (r < 2) {
      Communicator reversed = world.group({1, 0});
      const int peer = 1 - reversed.rank();  // world rank r's peer is world rank 1 - r
      const std::string over = " over this 2-rank communicator (world ranks 1,0)";
      std::vector<std::int32_t> word = {r};
      check.error([&] { reversed.isend(bytes_of(word), peer, 40000); }, Status::plugin,
                  "isend of 4 bytes to rank " + std::to_string(peer) + " (world rank " + std::to_string(1 - r) +
                      ") with tag 40000" + over + " failed");
      std::vector<std::int32_t> longer(2, 0);
      if (r == 1) {
        reversed.send(bytes_of(longer), peer, 21);  // world rank 1 is the group's rank 0
      } else {
        Request shorter = reversed.irecv(bytes_of(word), peer, 21);
        check(shorter.description() == "irecv of 4 bytes from rank 0 (world rank 1) with tag 21" + over,
              "description: " + shorter.description());
        check.error([&] { shorter.wait(); }, Status::plugin,
                    "irecv of 4 bytes from rank 0 (world rank 1) with tag 21" + over + " failed");
      }
      Request broadcast = reversed.ibroadcast(bytes_of(word), 0);
      check(broadcast.description() == "ibroadcast of 4 bytes from rank 0 (world rank 1)" + over,
            "description: " + broadcast.description());
      broadcast.wait();
      check(word[0] == 1, "broadcast from world rank 1: " + std::to_string(word[0]));
    }
    comm.barrier();
  }
  {
    // The same between this rank and itself, the only peer a world of one has: Open MPI's
    // self path truncates a longer message silently when the receive is posted first.
    std::vector<std::int32_t> two(2, 1), four(4, 0);
    Request longer = comm.irecv(bytes_of(two), r, 13);
    comm.send(bytes_of(four), r, 13);
    check.error([&] { longer.wait(); }, Status::plugin,
                "irecv of 8 bytes from rank " + std::to_string(r) + " (world rank " + std::to_string(r) +
                    ") with tag 13 over this " + std::to_string(n) + "-rank communicator");
    check(!longer.pending(), "a failed request is released");
    Request shorter = comm.irecv(bytes_of(four), r, 14);
    comm.send(bytes_of(two), r, 14);
    check.error([&] { shorter.wait(); }, Status::plugin, "received 8 bytes, expected 16");
    // A message of the receive's length still arrives whole, posted before or after it.
    const std::vector<std::int32_t> sent = {7, 8, 9, 10};
    std::vector<std::int32_t> first(4, 0), second(4, 0);
    Request before = comm.irecv(bytes_of(first), r, 15);
    comm.send(bytes_of(sent), r, 15);
    before.wait();
    Request sending = comm.isend(bytes_of(sent), r, 16);
    Request after = comm.irecv(bytes_of(second), r, 16);
    after.wait();
    sending.wait();
    check(first == sent && second == sent, "messages to this rank arrive whole");
  }
  check.passed("errors come back as messages");
}

}  // namespace
}  // namespace braid

int main(int argc, char** argv) {
  int expected = 0;
  std::optional<braid::runtime::World> world =
      braid::test::plugin_world(argc, argv, "run it under mpiexec -n N, or alone with 1", expected);
  braid::test::Checks check(*world);
  try {
    if (world->rank() == 0) std::printf("%s\n", world->bootstrap().c_str());
    braid::world_shape(*world, expected, check);
    braid::ring(*world, check);
    braid::allreduce(*world, check);
    braid::reduce_scatter(*world, check);
    braid::allgather_and_broadcast(*world, check);
    braid::groups(*world, check);
    braid::waiting_is_measured(*world, check);
    braid::errors_come_back(*world, check);
    world->communicator().barrier();
  } catch (const std::exception& e) {
    check(false, std::string("unexpected error: ") + e.what());
  }
  const bool first = world->rank() == 0;
  if (first) std::printf("all %d checks passed on rank 0\n", check.count());
  world.reset();  // the plugin started MPI, so this ends it
  try {
    braid::runtime::World::from_plugin("mpi");
    std::fprintf(stderr, "FAILED: MPI started again after MPI_Finalize\n");
    return 1;
  } catch (const braid::Error& e) {
    if (std::string(e.what()).find("MPI was already finalized in this process and cannot start again") ==
        std::string::npos) {
      std::fprintf(stderr, "FAILED: a second start after MPI_Finalize: %s\n", e.what());
      return 1;
    }
  }
  if (first) std::printf("ok a second start after MPI_Finalize is refused\n");
  return 0;
}
