// The MPI plugin's communication interface v2 (plugins/mpi/mpi_comm_v2.cpp) in real
// processes, run by ctest under `mpiexec -n 2` and `-n 4`; argv[1] is the process count to
// expect. It is the interface NCCL implements on GPUs, on host memory: every collective,
// point to point (a rank to itself included), communicators of some ranks, the trainer's
// DeviceCommunicator (all-reduce, a ping-pong, all-gather, a posted all-reduce), and a deadline that aborts a
// communicator with a message naming the operation and the ranks (and a message's peer); calls
// refused for their arguments post and release nothing, and finalize refuses while an operation
// abandoned at a deadline on the world is still in flight (MPI_Finalize crashed in it).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/runtime/device_comm.hpp"
#include "tests/mpi/checks.hpp"

namespace braid {
namespace {

struct Plugin {
  std::unique_ptr<runtime::DeviceCommPlugin> plugin;
  const braid_comm_plugin_v2& api() const { return plugin->api(); }
  void ok(int code, const std::string& what) const { plugin->check(code, what); }
  void wait(braid_comm_request_v2* r, const std::string& what) const { ok(api().wait(r, 60.0), what); }
};

void collectives(const Plugin& p, int n, int r, test::Checks& check) {
  braid_comm_v2* world = nullptr;
  p.ok(p.api().comm_world(&world), "comm_world");
  int32_t rank = -1, size = -1;
  p.ok(p.api().comm_rank(world, &rank), "comm_rank");
  p.ok(p.api().comm_size(world, &size), "comm_size");
  check(rank == r && size == n, "world communicator rank " + std::to_string(rank) + " of " + std::to_string(size));

  braid_comm_request_v2* q = nullptr;
  std::vector<float> f = {float(r), 1.0f};  // in place
  p.ok(p.api().iallreduce(world, f.data(), f.data(), f.size(), BRAID_COMM_FLOAT32, BRAID_COMM_SUM, nullptr, &q), "f32");
  p.wait(q, "f32 all-reduce");
  check(f[0] == float(n * (n - 1) / 2) && f[1] == float(n), "float32 all-reduce sum");
  std::vector<int64_t> in = {int64_t(r) * 1000000000000LL}, out(1);
  p.ok(p.api().iallreduce(world, in.data(), out.data(), 1, BRAID_COMM_INT64, BRAID_COMM_MAX, nullptr, &q), "i64");
  p.wait(q, "int64 all-reduce");
  check(out[0] == int64_t(n - 1) * 1000000000000LL, "int64 all-reduce max");

  std::vector<double> mine = {double(r) + 0.5}, all(static_cast<std::size_t>(n));
  p.ok(p.api().iallgather(world, mine.data(), all.data(), sizeof(double), nullptr, &q), "all-gather");
  p.wait(q, "all-gather");
  for (int k = 0; k < n; ++k)
    check(all[static_cast<std::size_t>(k)] == k + 0.5, "all-gather of rank " + std::to_string(k));

  std::vector<int32_t> b = {r == n - 1 ? 42 : -1};
  p.ok(p.api().ibroadcast(world, b.data(), sizeof(int32_t), n - 1, nullptr, &q), "broadcast");
  p.wait(q, "broadcast");
  check(b[0] == 42, "broadcast from the last rank");

  std::vector<float> blocks(static_cast<std::size_t>(2 * n)), got(2);
  for (int k = 0; k < 2 * n; ++k) blocks[static_cast<std::size_t>(k)] = float(k + r);
  p.ok(p.api().ireduce_scatter(world, blocks.data(), got.data(), 2, BRAID_COMM_FLOAT32, BRAID_COMM_SUM, nullptr, &q),
       "reduce-scatter");
  p.wait(q, "reduce-scatter");
  const float base = float(n * (n - 1) / 2);
  check(got[0] == float(2 * r * n) + base && got[1] == float((2 * r + 1) * n) + base, "reduce-scatter block");

  // A ring, each rank also sending to itself.
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  std::vector<int32_t> to_next = {r}, from_prev = {-1}, to_self = {r * 7}, from_self = {-1};
  braid_comm_request_v2 *s1 = nullptr, *s2 = nullptr, *r1 = nullptr, *r2 = nullptr;
  p.ok(p.api().irecv(world, from_prev.data(), 4, prev, 3, nullptr, &r1), "irecv");
  p.ok(p.api().irecv(world, from_self.data(), 4, r, 4, nullptr, &r2), "irecv self");
  p.ok(p.api().isend(world, to_next.data(), 4, next, 3, nullptr, &s1), "isend");
  p.ok(p.api().isend(world, to_self.data(), 4, r, 4, nullptr, &s2), "isend self");
  for (auto* req : {s1, s2, r1, r2}) p.wait(req, "ring");
  check(from_prev[0] == prev && from_self[0] == r * 7, "ring and self messages");
  p.ok(p.api().barrier(world, 60.0), "barrier");
  check.passed("collectives");
}

void groups_and_the_trainers_communicator(const Plugin& p, int n, int r, test::Checks& check) {
  // The even ranks; every rank in a pair (0,1), (2,3)...
  std::vector<int> even;
  for (int k = 0; k < n; k += 2) even.push_back(k);
  if (r % 2 == 0) {
    runtime::DeviceCommunicator c(*p.plugin, even);
    std::vector<float> x = {1.0f, float(r)};
    c.allreduce_sum(x.data(), x.size(), nullptr, 60.0);
    float rank_sum = 0;
    for (int k : even) rank_sum += float(k);
    check(x[0] == float(even.size()) && x[1] == rank_sum, "all-reduce over the even ranks");
  }
  std::vector<int> pair = {r - r % 2, r - r % 2 + 1};
  if (pair[1] < n) {
    runtime::DeviceCommunicator c(*p.plugin, pair);
    check(c.size() == 2, "pair size");
    std::vector<float> x(1000, float(r + 1));
    c.allreduce_sum(x.data(), x.size(), nullptr, 0.0);
    check(x[999] == float(pair[0] + pair[1] + 2), "all-reduce over a pair, no deadline");
    // A ping-pong (braid calibrate's p2p case) and an all-gather in group rank order.
    const int me = r % 2, peer = 1 - me;
    std::vector<int32_t> ball = {me == 0 ? 41 : -1};
    if (me == 0) {
      c.send(ball.data(), 4, peer, nullptr, 60.0);
      c.recv(ball.data(), 4, peer, nullptr, 60.0);
      check(ball[0] == 42, "ping-pong: the ball comes back changed");
    } else {
      c.recv(ball.data(), 4, peer, nullptr, 60.0);
      ball[0] += 1;
      c.send(ball.data(), 4, peer, nullptr, 60.0);
    }
    const std::vector<float> mine = {float(r), float(10 * r)};
    std::vector<float> all(4, -1.0f);
    c.allgather(mine.data(), all.data(), mine.size() * sizeof(float), nullptr, 60.0);
    check(all == std::vector<float>{float(pair[0]), float(10 * pair[0]), float(pair[1]), float(10 * pair[1])},
          "all-gather over a pair");
  }
  check.passed("groups");
}

// A posted all-reduce (the trainer's early gradient reduction) does not block: the first rank
// of each pair posts, finds it unfinished, and only then lets its peer join; a request dropped
// unfinished is waited for, so its buffer holds the sum.
void a_posted_all_reduce_completes_later(const Plugin& p, runtime::World& world, int n, int r, test::Checks& check) {
  const std::vector<int> pair = {r - r % 2, r - r % 2 + 1};
  const bool paired = pair[1] < n, first = r % 2 == 0;
  std::optional<runtime::DeviceCommunicator> c;
  if (paired) c.emplace(*p.plugin, pair);
  std::vector<float> x(64, float(r + 1)), y(64, float(r + 1));
  runtime::DeviceRequest posted;
  if (paired && first) {
    posted = c->post_allreduce_sum(x.data(), x.size(), nullptr, 60.0);
    check(!posted.test(), "a posted all-reduce is unfinished while its peer has not joined");
  }
  world.communicator().barrier();  // a post that blocked would never get here
  if (paired && !first) c->allreduce_sum(x.data(), x.size(), nullptr, 60.0);
  if (paired && first) {
    posted.wait();
    check(posted.test(), "a finished request tests done");
  }
  if (paired) {
    check(x[63] == float(pair[0] + pair[1] + 2), "the posted all-reduce's sum");
    { runtime::DeviceRequest dropped = c->post_allreduce_sum(y.data(), y.size(), nullptr, 60.0); }
    check(y[0] == float(pair[0] + pair[1] + 2), "a request dropped unfinished is waited for");
  }
  check.passed("posted");
}

// Rank 0 waits for an all-reduce rank 1 joins only after rank 0 has given up on it.
void a_deadline_aborts_the_communicator(const Plugin& p, runtime::World& world, int r, test::Checks& check) {
  braid_comm_v2* c = nullptr;
  const int32_t ranks[2] = {0, 1};
  if (r < 2) p.ok(p.api().comm_create(ranks, 2, &c), "comm_create");
  std::vector<float> x = {1.0f};
  if (r == 0) {
    braid_comm_request_v2* q = nullptr;
    p.ok(p.api().iallreduce(c, x.data(), x.data(), 1, BRAID_COMM_FLOAT32, BRAID_COMM_SUM, nullptr, &q), "posted");
    const int code = p.api().wait(q, 0.2);
    const std::string message = p.api().last_error();
    check(code != 0, "a wait past its deadline fails");
    check(message.find("all-reduce on the communicator of world ranks {0,1} did not complete within 0.2 s") !=
              std::string::npos,
          "deadline message: " + message);
    braid_comm_request_v2* again = nullptr;
    check(p.api().iallreduce(c, x.data(), x.data(), 1, BRAID_COMM_FLOAT32, BRAID_COMM_SUM, nullptr, &again) != 0 &&
              std::string(p.api().last_error()).find("was aborted at a deadline") != std::string::npos,
          std::string("an aborted communicator refuses work: ") + p.api().last_error());
  }
  world.communicator().barrier();  // rank 0 gave up
  if (r == 1) {
    braid_comm_request_v2* q = nullptr;
    p.ok(p.api().iallreduce(c, x.data(), x.data(), 1, BRAID_COMM_FLOAT32, BRAID_COMM_SUM, nullptr, &q), "late");
    p.wait(q, "the late all-reduce");
  }
  if (r < 2) p.ok(p.api().comm_free(c), "comm_free (waits for the abandoned all-reduce)");
  check.passed("deadline");
}

// Refused calls post nothing and release nothing: a NULL request output pointer (the call
// posted its operation, then wrote through it), a NULL `done` (test released the request its
// caller still held), tags outside 0..32767 (-1 was MPI_ANY_TAG on a receive).
void refused_calls_post_and_release_nothing(const Plugin& p, int n, int r, test::Checks& check) {
  braid_comm_v2* world = nullptr;
  p.ok(p.api().comm_world(&world), "comm_world");
  std::vector<float> x = {1.0f}, all(static_cast<std::size_t>(n)), blocks(static_cast<std::size_t>(n));
  const auto refused = [&](int code, const std::string& message) {
    check(code != 0 && std::string(p.api().last_error()).find(message) != std::string::npos,
          message + " refused: code " + std::to_string(code) + ", " + p.api().last_error());
  };
  const int32_t f32 = BRAID_COMM_FLOAT32, sum = BRAID_COMM_SUM;
  refused(p.api().isend(world, x.data(), 4, r, 0, nullptr, nullptr), "isend: request output pointer is NULL");
  refused(p.api().irecv(world, x.data(), 4, r, 0, nullptr, nullptr), "irecv: request output pointer is NULL");
  refused(p.api().iallreduce(world, x.data(), x.data(), 1, f32, sum, nullptr, nullptr),
          "iallreduce: request output pointer is NULL");
  refused(p.api().iallgather(world, x.data(), all.data(), 4, nullptr, nullptr),
          "iallgather: request output pointer is NULL");
  refused(p.api().ibroadcast(world, x.data(), 4, 0, nullptr, nullptr), "ibroadcast: request output pointer is NULL");
  refused(p.api().ireduce_scatter(world, blocks.data(), x.data(), 1, f32, sum, nullptr, nullptr),
          "ireduce_scatter: request output pointer is NULL");
  braid_comm_request_v2* q = nullptr;
  refused(p.api().irecv(world, x.data(), 4, r, -1, nullptr, &q), "irecv: tag -1 is outside 0..32767");
  refused(p.api().isend(world, x.data(), 4, r, 32768, nullptr, &q), "isend: tag 32768 is outside 0..32767");
  check(q == nullptr, "a refused call gives no request");

  // test without `done`: refused, and the request is still the caller's to wait for.
  p.ok(p.api().iallreduce(world, x.data(), x.data(), 1, f32, sum, nullptr, &q), "all-reduce");
  refused(p.api().test(q, nullptr), "test: done pointer is NULL");
  p.wait(q, "the all-reduce a refused test left");
  check(x[0] == float(n), "all-reduce after a refused test: " + std::to_string(x[0]));
  // Nothing above was posted: a message to this rank with tag 5 meets this receive alone.
  std::vector<int32_t> sent = {r + 100}, got = {-1};
  braid_comm_request_v2 *s = nullptr, *g = nullptr;
  p.ok(p.api().irecv(world, got.data(), 4, r, 5, nullptr, &g), "irecv");
  p.ok(p.api().isend(world, sent.data(), 4, r, 5, nullptr, &s), "isend");
  p.wait(g, "irecv");
  p.wait(s, "isend");
  check(got[0] == r + 100, "a message to self after refused calls: " + std::to_string(got[0]));
  p.ok(p.api().barrier(world, 60.0), "barrier");
  check.passed("refused calls");
}

// A receive past its deadline names its peer's world rank, its bytes and its tag. World rank 0
// is rank 1 of a communicator over world ranks {1,0}; world rank 1 sends after it gave up.
void a_deadline_on_a_message_names_its_peer(const Plugin& p, runtime::World& world, int r, test::Checks& check) {
  braid_comm_v2* c = nullptr;
  const int32_t ranks[2] = {1, 0};
  if (r < 2) p.ok(p.api().comm_create(ranks, 2, &c), "comm_create");
  std::vector<float> x(4, float(r));
  if (r == 0) {
    braid_comm_request_v2* q = nullptr;
    p.ok(p.api().irecv(c, x.data(), 16, 0, 3, nullptr, &q), "irecv");
    check(p.api().wait(q, 0.2) != 0, "a receive past its deadline fails");
    const std::string message = p.api().last_error();
    check(message.find("irecv of 16 bytes from world rank 1 (tag 3) on the communicator of world ranks {1,0} did "
                       "not complete within 0.2 s; it is aborted") != std::string::npos &&
              message.find("MPI does not say") == std::string::npos,
          "deadline message: " + message);
  }
  world.communicator().barrier();  // world rank 0 gave up
  if (r == 1) {
    braid_comm_request_v2* q = nullptr;
    p.ok(p.api().isend(c, x.data(), 16, 1, 3, nullptr, &q), "late isend");
    p.wait(q, "the late send");
  }
  if (r < 2) p.ok(p.api().comm_free(c), "comm_free (waits for the abandoned receive)");
  if (r == 0) check(x[0] == 1.0f, "the abandoned receive completed before comm_free returned");
  check.passed("a message's deadline");
}

// A request outlives its communicator: world rank 0 frees the communicator of its receive,
// then waits for it past its deadline (which wrote into the freed communicator); world rank 1
// sends after that, so the abandoned receive completes and finalize counts it no more.
void a_request_outlives_its_communicator(const Plugin& p, runtime::World& world, int r, test::Checks& check) {
  braid_comm_v2* c = nullptr;
  const int32_t ranks[2] = {0, 1};
  if (r < 2) p.ok(p.api().comm_create(ranks, 2, &c), "comm_create");
  static std::vector<int32_t> y;  // written whenever the abandoned receive completes
  y.assign(1, r);
  if (r == 0) {
    braid_comm_request_v2* q = nullptr;
    p.ok(p.api().irecv(c, y.data(), 4, 1, 6, nullptr, &q), "irecv");
    p.ok(p.api().comm_free(c), "comm_free with a receive in flight");
    check(p.api().wait(q, 0.2) != 0, "a receive past its deadline fails after comm_free");
    const std::string message = p.api().last_error();
    check(
        message.find("irecv of 4 bytes from world rank 1 (tag 6) on the communicator of world ranks {0,1} did not "
                     "complete within 0.2 s; it is abandoned (the communicator was freed before)") != std::string::npos,
        "deadline message after comm_free: " + message);
  }
  world.communicator().barrier();  // world rank 0 gave up
  if (r == 1) {
    braid_comm_request_v2* q = nullptr;
    p.ok(p.api().isend(c, y.data(), 4, 0, 6, nullptr, &q), "late isend");
    p.wait(q, "the late send");
    p.ok(p.api().comm_free(c), "comm_free");
  }
  check.passed("a request outliving its communicator");
}

// An all-reduce on the world abandoned at its deadline is still in flight: finalize refuses,
// saying so, and changes nothing (MPI_Finalize crashed inside it); once the other ranks join
// the all-reduce, finalize succeeds. The other ranks join only when world rank 0 says so, by a
// message (not a collective: its all-reduce is the next collective on the world). Last: it
// finalizes the plugin.
void finalize_refuses_while_an_abandoned_operation_is_in_flight(const Plugin& p, runtime::World& world, int n, int r,
                                                                test::Checks& check) {
  braid_comm_v2* c = nullptr;
  p.ok(p.api().comm_world(&c), "comm_world");
  static std::vector<float> x;  // written when the all-reduce completes, whenever that is
  x.assign(1, 1.0f);
  std::vector<std::byte> go(1);
  braid_comm_request_v2* q = nullptr;
  if (r == 0) {
    p.ok(p.api().iallreduce(c, x.data(), x.data(), 1, BRAID_COMM_FLOAT32, BRAID_COMM_SUM, nullptr, &q), "posted");
    check(p.api().wait(q, 0.2) != 0, "the all-reduce misses its deadline");
    check(p.api().finalize() != 0, "finalize refuses while the abandoned all-reduce is in flight");
    const std::string message = p.api().last_error();
    // One, or two while world rank 1's late send has not yet reached the receive abandoned above.
    check((message.find("finalize: 1 operation(s) abandoned after their deadline is still in flight") !=
               std::string::npos ||
           message.find("finalize: 2 operation(s) abandoned after their deadline are still in flight") !=
               std::string::npos) &&
              message.find("MPI cannot finalize cleanly") != std::string::npos &&
              message.find("abort()") != std::string::npos,
          "finalize's message: " + message);
    int32_t rank = -1;
    p.ok(p.api().world(&rank, nullptr, nullptr, nullptr), "world, after a refused finalize");
    for (int k = 1; k < n; ++k) world.communicator().send(go, k, 9);
    int code = 0;
    const auto start = std::chrono::steady_clock::now();
    while ((code = p.api().finalize()) != 0 && std::chrono::steady_clock::now() - start < std::chrono::seconds(60))
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    check(code == 0, std::string("finalize once the others completed the all-reduce: ") + p.api().last_error());
    check(x[0] == float(n), "the abandoned all-reduce's sum: " + std::to_string(x[0]));
  } else {
    world.communicator().recv(go, 0, 9);
    p.ok(p.api().iallreduce(c, x.data(), x.data(), 1, BRAID_COMM_FLOAT32, BRAID_COMM_SUM, nullptr, &q), "late");
    p.wait(q, "the late all-reduce");
    check(x[0] == float(n), "the late all-reduce's sum: " + std::to_string(x[0]));
    p.ok(p.api().finalize(), "finalize");
  }
  check.passed("finalize with an abandoned operation");
}

}  // namespace
}  // namespace braid

int main(int argc, char** argv) {
  int expected = 0;
  std::optional<braid::runtime::World> world =
      braid::test::plugin_world(argc, argv, "run it under mpiexec -n N", expected);
  braid::test::Checks check(*world);
  const int n = world->size(), r = world->rank();
  check(n == expected, "world size " + std::to_string(n) + ", launched with " + std::to_string(expected));
  try {
    braid::runtime::WorldBootstrap bootstrap(*world);
    braid::Plugin p{braid::runtime::load_device_comm_plugin("mpi")};
    p.plugin->init(bootstrap.get());
    check(p.plugin->backend_version().find("MPI") != std::string::npos, "version " + p.plugin->backend_version());
    braid::collectives(p, n, r, check);
    braid::groups_and_the_trainers_communicator(p, n, r, check);
    braid::a_posted_all_reduce_completes_later(p, *world, n, r, check);
    braid::a_deadline_aborts_the_communicator(p, *world, r, check);
    braid::refused_calls_post_and_release_nothing(p, n, r, check);
    braid::a_deadline_on_a_message_names_its_peer(p, *world, r, check);
    braid::a_request_outlives_its_communicator(p, *world, r, check);
    world->communicator().barrier();
    braid::finalize_refuses_while_an_abandoned_operation_is_in_flight(p, *world, n, r, check);
    world->communicator().barrier();
  } catch (const std::exception& e) {
    check(false, std::string("unexpected error: ") + e.what());
  }
  if (r == 0) std::printf("all %d checks passed on rank 0\n", check.count());
  world.reset();
  return 0;
}
