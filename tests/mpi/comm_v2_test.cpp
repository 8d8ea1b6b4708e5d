// The MPI plugin's communication interface v2 (plugins/mpi/mpi_comm_v2.cpp) in real
// processes, run by ctest under `mpiexec -n 2` and `-n 4`; argv[1] is the process count to
// expect. It is the interface NCCL implements on GPUs, on host memory: every collective,
// point to point (a rank to itself included), communicators of some ranks, the trainer's
// DeviceCommunicator (all-reduce, a ping-pong, all-gather, a posted all-reduce), and a deadline that aborts a
// communicator with a message naming the operation and the ranks.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
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
    world->communicator().barrier();
  } catch (const std::exception& e) {
    check(false, std::string("unexpected error: ") + e.what());
  }
  if (r == 0) std::printf("all %d checks passed on rank 0\n", check.count());
  world.reset();
  return 0;
}
