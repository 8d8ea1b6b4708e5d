// libbraid-nccl.so: the NCCL communication plugin (braid_comm_v2.h). It never links MPI:
// each communicator's unique id travels over the bootstrap it is given at init. Its
// communicators are non-blocking (every NCCL call is settled by polling its state, so a
// wait can give up), a request is a CUDA event recorded after the operation, and every
// wait has a deadline past which the communicator is aborted. Sends and receives queue up
// and are issued as one NCCL group at the communicator's next wait, test, collective or
// barrier, so a rank can exchange with itself and its peers in any order. Requests belong to
// the caller until their wait or test: freeing a communicator detaches them, and they then
// complete (an issued one, by its event) or fail (one still queued, never issued) there.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "braid_comm_v2.h"

#define BRAID_PLUGIN_EXPORT __attribute__((visibility("default")))

struct braid_comm_request_v2;

struct braid_comm_v2 {
  ncclComm_t comm = nullptr;
  std::vector<int32_t> world_ranks;
  int32_t rank = 0;
  bool is_world = false;
  bool aborted = false;
  float* barrier_scratch = nullptr;  // one float on the device, for barrier's all-reduce
  struct P2p {
    bool send;
    void* data;
    size_t bytes;
    int32_t peer;
    braid_comm_request_v2* request;
  };
  std::vector<P2p> pending;  // sends and receives not yet issued
  cudaStream_t pending_stream = nullptr;
  std::vector<braid_comm_request_v2*> requests;  // handed to the caller, not yet released
};

struct braid_comm_request_v2 {
  braid_comm_v2* comm = nullptr;  // null once the communicator was freed (the request outlives it)
  cudaEvent_t event = nullptr;    // recorded after the operation; null while a p2p is pending
  std::string op;
  std::string freed;  // the freed communicator, as where() named it, for errors
};

namespace {

using Clock = std::chrono::steady_clock;

struct State {
  bool initialised = false;
  braid_comm_bootstrap_v2 bootstrap{};
  int device = 0;
  braid_comm_v2* world = nullptr;
  std::vector<braid_comm_v2*> comms;  // every live communicator, for abort
  double init_limit_s = 300.0;        // BRAID_NCCL_INIT_TIMEOUT, read at init
  double call_limit_s = 60.0;         // BRAID_NCCL_CALL_TIMEOUT, read at init
  std::string last_error;
};

State& state() {
  static State s;
  return s;
}

// A failure inside the plugin: the message becomes last_error(), the code the return value.
struct Failure {
  int code;
  std::string message;
};

[[noreturn]] void fail(int code, const std::string& message) { throw Failure{code, message}; }

template <typename F>
int guarded(F&& body) {
  try {
    body();
    return 0;
  } catch (const Failure& f) {
    state().last_error = f.message;
    return f.code;
  } catch (const std::exception& e) {
    state().last_error = std::string("nccl plugin: ") + e.what();
    return 1;
  }
}

std::string ranks_text(const std::vector<int32_t>& ranks) {
  std::string s = "[";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s + "]";
}

std::string where(const braid_comm_v2* c) {
  return "communicator over world ranks " + ranks_text(c->world_ranks) + " (rank " + std::to_string(c->rank) + " here)";
}

void check_cuda(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess) fail(2000 + static_cast<int>(err), what + ": " + cudaGetErrorString(err));
}

// Seconds from the variable `name` into `out`: unset or empty, `fallback`. Returns what is
// wrong with a value that is not all a finite number above 0 ("5min", "0", "-1", "bogus"),
// "" when nothing is: refused, not read as something else.
std::string seconds_from_env(const char* name, double fallback, double& out) {
  out = fallback;
  const char* v = std::getenv(name);
  if (!v || !*v) return "";
  char* end = nullptr;
  errno = 0;
  const double d = std::strtod(v, &end);
  if (end == v || *end != '\0' || errno == ERANGE || !std::isfinite(d) || d <= 0)
    return std::string(name) + " is '" + v +
           "'; set it to a number of seconds above 0 (unset: " + std::to_string(static_cast<int>(fallback)) + ")";
  out = d;
  return "";
}

// Non-blocking NCCL calls return ncclInProgress until the communicator settles: poll its
// state until it does, at most `limit_s` seconds, then abort it.
void settle(braid_comm_v2* c, ncclResult_t result, const std::string& what, double limit_s) {
  const auto start = Clock::now();
  while (result == ncclInProgress) {
    if (std::chrono::duration<double>(Clock::now() - start).count() > limit_s) {
      ncclCommAbort(c->comm);
      c->aborted = true;
      fail(3, where(c) + ": " + what + " did not settle within " + std::to_string(limit_s) +
                  " s; the communicator is aborted (free it)");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    ncclCommGetAsyncError(c->comm, &result);
  }
  if (result != ncclSuccess)
    fail(1000 + static_cast<int>(result),
         where(c) + ": " + what + ": " + ncclGetErrorString(result) + " (" + ncclGetLastError(c->comm) + ")");
}

double init_limit() { return state().init_limit_s; }
double call_limit() { return state().call_limit_s; }

// A non-blocking NCCL communicator over `ranks` (world ranks; this process among them),
// its unique id from ranks[0] over the bootstrap. Every listed process takes part in the
// broadcast whatever went wrong before it (a root without an id sends a refusal), so no
// process is left waiting there; `local_problem` (no GPU here...) then fails this process
// after it, and the others meet NCCL's init deadline.
braid_comm_v2* make_comm(const std::vector<int32_t>& ranks, const std::string& local_problem = "") {
  State& s = state();
  const auto me = static_cast<int32_t>(std::find(ranks.begin(), ranks.end(), s.bootstrap.rank) - ranks.begin());
  struct Payload {
    int32_t ok;
    ncclUniqueId id;
  } payload{};
  std::string root_problem = local_problem;
  if (me == 0 && root_problem.empty()) {
    const ncclResult_t r = ncclGetUniqueId(&payload.id);
    if (r != ncclSuccess) root_problem = std::string("ncclGetUniqueId: ") + ncclGetErrorString(r);
  }
  if (me == 0) payload.ok = root_problem.empty() ? 1 : 0;
  if (s.bootstrap.broadcast(s.bootstrap.context, ranks.data(), static_cast<int32_t>(ranks.size()), &payload,
                            sizeof payload) != 0)
    fail(4, "the bootstrap's broadcast of the unique id for world ranks " + ranks_text(ranks) + " failed");
  if (me == 0 && !root_problem.empty()) fail(9, "nccl plugin: " + root_problem);
  if (!local_problem.empty()) fail(6, "nccl plugin: " + local_problem);  // this process's own first
  if (!payload.ok)
    fail(9, "nccl plugin: world rank " + std::to_string(ranks.front()) + " could not make the communicator over " +
                ranks_text(ranks) + " (its own error says why)");
  auto* c = new braid_comm_v2();
  c->world_ranks = ranks;
  c->rank = me;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  try {
    settle(c, ncclCommInitRankConfig(&c->comm, static_cast<int>(ranks.size()), payload.id, c->rank, &config),
           "ncclCommInitRankConfig", init_limit());
    check_cuda(cudaMalloc(reinterpret_cast<void**>(&c->barrier_scratch), sizeof(float)), "cudaMalloc");
  } catch (...) {
    if (c->comm && !c->aborted) ncclCommAbort(c->comm);
    if (c->barrier_scratch) cudaFree(c->barrier_scratch);
    delete c;
    throw;
  }
  s.comms.push_back(c);
  return c;
}

void destroy(braid_comm_v2* c) {
  State& s = state();
  s.comms.erase(std::remove(s.comms.begin(), s.comms.end(), c), s.comms.end());
  if (c->comm && !c->aborted) {
    ncclResult_t r = ncclCommFinalize(c->comm);
    const auto start = Clock::now();
    while (r == ncclInProgress && std::chrono::duration<double>(Clock::now() - start).count() < call_limit()) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      ncclCommGetAsyncError(c->comm, &r);
    }
    if (r == ncclSuccess)
      ncclCommDestroy(c->comm);
    else
      ncclCommAbort(c->comm);
  }
  // After the communicator: cudaFree waits for the device, and a kernel of a communicator
  // stuck on a rank that never arrived only ends with the abort above.
  if (c->barrier_scratch) cudaFree(c->barrier_scratch);
  // The caller still holds its requests: they stay valid, detached. An issued one completes
  // by its event; one still queued (never issued) fails at its wait or test.
  const std::string place = where(c);
  for (braid_comm_request_v2* r : c->requests) {
    r->comm = nullptr;
    r->freed = place;
  }
  delete c;
}

void require_live(braid_comm_v2* c) {
  if (!c) fail(1, "nccl plugin: a null communicator");
  if (c->aborted) fail(5, where(c) + " was aborted after an earlier failure; free it");
}

ncclDataType_t dtype_of(int32_t dtype) {
  switch (dtype) {
    case BRAID_COMM_FLOAT32:
      return ncclFloat32;
    case BRAID_COMM_FLOAT64:
      return ncclFloat64;
    case BRAID_COMM_INT32:
      return ncclInt32;
    case BRAID_COMM_INT64:
      return ncclInt64;
  }
  fail(1, "nccl plugin: unknown dtype " + std::to_string(dtype));
}

ncclRedOp_t op_of(int32_t op) {
  switch (op) {
    case BRAID_COMM_SUM:
      return ncclSum;
    case BRAID_COMM_MAX:
      return ncclMax;
    case BRAID_COMM_MIN:
      return ncclMin;
  }
  fail(1, "nccl plugin: unknown reduction " + std::to_string(op));
}

braid_comm_request_v2* recorded(braid_comm_v2* c, cudaStream_t stream, const std::string& op) {
  auto* r = new braid_comm_request_v2{c, nullptr, op, ""};
  cudaError_t err = cudaEventCreateWithFlags(&r->event, cudaEventDisableTiming);
  if (err == cudaSuccess) err = cudaEventRecord(r->event, stream);
  if (err != cudaSuccess) {
    if (r->event) cudaEventDestroy(r->event);
    delete r;
    check_cuda(err, where(c) + ": recording " + op);
  }
  c->requests.push_back(r);
  return r;
}

// Issues the queued sends and receives as one group, settled within `limit_s` seconds, and
// records their requests' events. A failure aborts the communicator: its queued requests
// were not all issued.
void flush(braid_comm_v2* c, double limit_s) {
  if (c->pending.empty()) return;
  std::vector<braid_comm_v2::P2p> ops;
  ops.swap(c->pending);
  try {
    ncclResult_t r = ncclGroupStart();
    for (const auto& p : ops) {
      if (r != ncclSuccess && r != ncclInProgress) break;
      r = p.send ? ncclSend(p.data, p.bytes, ncclChar, p.peer, c->comm, c->pending_stream)
                 : ncclRecv(p.data, p.bytes, ncclChar, p.peer, c->comm, c->pending_stream);
    }
    const ncclResult_t end = ncclGroupEnd();
    settle(c, r != ncclSuccess && r != ncclInProgress ? r : end, std::to_string(ops.size()) + " send/recv", limit_s);
    for (const auto& p : ops) {
      cudaError_t err = cudaEventCreateWithFlags(&p.request->event, cudaEventDisableTiming);
      if (err == cudaSuccess) err = cudaEventRecord(p.request->event, c->pending_stream);
      check_cuda(err, where(c) + ": recording " + p.request->op);
    }
  } catch (...) {
    if (!c->aborted) {
      ncclCommAbort(c->comm);
      c->aborted = true;
    }
    throw;
  }
}

// A collective: the queued point to point first, then `call` on the stream, each settled
// within `limit_s` seconds.
template <typename F>
braid_comm_request_v2* collective(braid_comm_v2* c, cudaStream_t stream, const std::string& op, F&& call,
                                  double limit_s = call_limit()) {
  require_live(c);
  if (!c->pending.empty() && c->pending_stream != stream)
    fail(1, where(c) + ": " + op + " on another stream than the sends and receives queued before it");
  flush(c, limit_s);
  settle(c, call(), op, limit_s);
  return recorded(c, stream, op);
}

void release(braid_comm_request_v2* r) {
  if (braid_comm_v2* c = r->comm)
    c->requests.erase(std::remove(c->requests.begin(), c->requests.end(), r), c->requests.end());
  if (r->event) cudaEventDestroy(r->event);
  delete r;
}

// ---- the table ----

const char* last_error() { return state().last_error.c_str(); }

const char* backend_version() {
  static std::string version = [] {
    int v = 0;
    if (ncclGetVersion(&v) != ncclSuccess) return std::string("NCCL (version unknown)");
    return "NCCL " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
  }();
  return version.c_str();
}

int init(const braid_comm_bootstrap_v2* bootstrap) {
  return guarded([&] {
    State& s = state();
    if (s.initialised) fail(1, "nccl plugin: already initialised");
    if (!bootstrap || bootstrap->struct_size < sizeof(braid_comm_bootstrap_v2) || !bootstrap->broadcast)
      fail(1, "nccl plugin: init needs a bootstrap (rank, size and a broadcast); NCCL cannot find its world alone");
    if (bootstrap->size < 1 || bootstrap->rank < 0 || bootstrap->rank >= bootstrap->size)
      fail(1,
           "nccl plugin: bootstrap rank " + std::to_string(bootstrap->rank) + " of " + std::to_string(bootstrap->size));
    s.bootstrap = *bootstrap;
    // A process with a bad timeout or without a usable GPU still takes part in the world's id
    // broadcast, then fails.
    std::string problem = seconds_from_env("BRAID_NCCL_INIT_TIMEOUT", 300.0, s.init_limit_s);
    const std::string call_problem = seconds_from_env("BRAID_NCCL_CALL_TIMEOUT", 60.0, s.call_limit_s);
    if (problem.empty()) problem = call_problem;
    int devices = 0;
    const cudaError_t err = cudaGetDeviceCount(&devices);
    if (problem.empty() && (err != cudaSuccess || devices == 0))
      problem =
          std::string("no CUDA device: ") + (err != cudaSuccess ? cudaGetErrorString(err) : "the driver sees none");
    if (problem.empty()) {
      s.device = bootstrap->local_rank % devices;
      const cudaError_t set = cudaSetDevice(s.device);
      if (set != cudaSuccess) problem = std::string("cudaSetDevice: ") + cudaGetErrorString(set);
    }
    std::vector<int32_t> everyone(static_cast<size_t>(bootstrap->size));
    for (int32_t r = 0; r < bootstrap->size; ++r) everyone[static_cast<size_t>(r)] = r;
    s.world = make_comm(everyone, problem);
    s.world->is_world = true;
    s.initialised = true;
  });
}

int finalize() {
  return guarded([&] {
    State& s = state();
    if (!s.initialised) return;
    while (!s.comms.empty()) destroy(s.comms.back());  // the world's last, whatever the caller left
    s.world = nullptr;
    s.initialised = false;
  });
}

int world(int32_t* rank, int32_t* size, int32_t* local_rank, int32_t* local_size) {
  return guarded([&] {
    const State& s = state();
    if (!s.initialised) fail(1, "nccl plugin: not initialised");
    if (rank) *rank = s.bootstrap.rank;
    if (size) *size = s.bootstrap.size;
    if (local_rank) *local_rank = s.bootstrap.local_rank;
    if (local_size) *local_size = s.bootstrap.local_size;
  });
}

int comm_world(braid_comm_v2** out) {
  return guarded([&] {
    if (!state().initialised) fail(1, "nccl plugin: not initialised");
    if (!out) fail(1, "nccl plugin: a null output pointer");
    *out = state().world;
  });
}

int comm_create(const int32_t* world_ranks, int32_t count, braid_comm_v2** out) {
  return guarded([&] {
    const State& s = state();
    if (!s.initialised) fail(1, "nccl plugin: not initialised");
    if (!world_ranks || count < 1 || !out) fail(1, "nccl plugin: comm_create needs at least one rank and an output");
    std::vector<int32_t> ranks(world_ranks, world_ranks + count);
    std::vector<int32_t> sorted = ranks;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() || sorted.front() < 0 ||
        sorted.back() >= s.bootstrap.size)
      fail(1, "nccl plugin: comm_create: ranks " + ranks_text(ranks) + " are not distinct world ranks");
    if (std::find(ranks.begin(), ranks.end(), s.bootstrap.rank) == ranks.end())
      fail(1, "nccl plugin: comm_create: this process (world rank " + std::to_string(s.bootstrap.rank) +
                  ") is not among " + ranks_text(ranks));
    *out = make_comm(ranks);
  });
}

int comm_free(braid_comm_v2* c) {
  return guarded([&] {
    if (!c || c->is_world) return;
    destroy(c);
  });
}

int comm_rank(braid_comm_v2* c, int32_t* rank) {
  return guarded([&] {
    if (!c || !rank) fail(1, "nccl plugin: a null communicator or output");
    *rank = c->rank;
  });
}

int comm_size(braid_comm_v2* c, int32_t* size) {
  return guarded([&] {
    if (!c || !size) fail(1, "nccl plugin: a null communicator or output");
    *size = static_cast<int32_t>(c->world_ranks.size());
  });
}

int p2p(bool send, braid_comm_v2* c, void* data, size_t bytes, int32_t peer, void* stream,
        braid_comm_request_v2** request) {
  return guarded([&] {
    require_live(c);
    if (peer < 0 || peer >= static_cast<int32_t>(c->world_ranks.size()))
      fail(1, where(c) + ": " + (send ? "send to" : "receive from") + " rank " + std::to_string(peer) +
                  " outside the communicator");
    if (!request) fail(1, "nccl plugin: a null request pointer");
    auto s = static_cast<cudaStream_t>(stream);
    // One group runs on one stream; splitting it would separate the halves of an exchange.
    if (!c->pending.empty() && c->pending_stream != s)
      fail(1, where(c) +
                  ": sends and receives queued before the next wait, test, collective or barrier must use "
                  "one stream");
    c->pending_stream = s;
    auto* r = new braid_comm_request_v2{c, nullptr,
                                        std::string(send ? "send of " : "receive of ") + std::to_string(bytes) +
                                            " bytes " + (send ? "to" : "from") + " rank " + std::to_string(peer),
                                        ""};
    c->pending.push_back({send, data, bytes, peer, r});
    c->requests.push_back(r);
    *request = r;
  });
}

int isend(braid_comm_v2* c, const void* data, size_t bytes, int32_t peer, int32_t, void* stream,
          braid_comm_request_v2** request) {
  return p2p(true, c, const_cast<void*>(data), bytes, peer, stream, request);
}

int irecv(braid_comm_v2* c, void* data, size_t bytes, int32_t peer, int32_t, void* stream,
          braid_comm_request_v2** request) {
  return p2p(false, c, data, bytes, peer, stream, request);
}

int iallreduce(braid_comm_v2* c, const void* send, void* recv, size_t count, int32_t dtype, int32_t op, void* stream,
               braid_comm_request_v2** request) {
  return guarded([&] {
    if (!request) fail(1, "nccl plugin: a null request pointer");
    const ncclDataType_t t = dtype_of(dtype);
    const ncclRedOp_t o = op_of(op);
    auto s = static_cast<cudaStream_t>(stream);
    *request = collective(c, s, "all-reduce of " + std::to_string(count) + " elements",
                          [&] { return ncclAllReduce(send, recv, count, t, o, c->comm, s); });
  });
}

int iallgather(braid_comm_v2* c, const void* send, void* recv, size_t bytes, void* stream,
               braid_comm_request_v2** request) {
  return guarded([&] {
    if (!request) fail(1, "nccl plugin: a null request pointer");
    auto s = static_cast<cudaStream_t>(stream);
    *request = collective(c, s, "all-gather of " + std::to_string(bytes) + " bytes",
                          [&] { return ncclAllGather(send, recv, bytes, ncclChar, c->comm, s); });
  });
}

int ibroadcast(braid_comm_v2* c, void* data, size_t bytes, int32_t root, void* stream,
               braid_comm_request_v2** request) {
  return guarded([&] {
    if (!request) fail(1, "nccl plugin: a null request pointer");
    auto s = static_cast<cudaStream_t>(stream);
    *request = collective(c, s, "broadcast of " + std::to_string(bytes) + " bytes from rank " + std::to_string(root),
                          [&] { return ncclBroadcast(data, data, bytes, ncclChar, root, c->comm, s); });
  });
}

int ireduce_scatter(braid_comm_v2* c, const void* send, void* recv, size_t recv_count, int32_t dtype, int32_t op,
                    void* stream, braid_comm_request_v2** request) {
  return guarded([&] {
    if (!request) fail(1, "nccl plugin: a null request pointer");
    const ncclDataType_t t = dtype_of(dtype);
    const ncclRedOp_t o = op_of(op);
    auto s = static_cast<cudaStream_t>(stream);
    *request = collective(c, s, "reduce-scatter of " + std::to_string(recv_count) + " elements per rank",
                          [&] { return ncclReduceScatter(send, recv, recv_count, t, o, c->comm, s); });
  });
}

// One look at a request: true when done (its event ran), false while in flight; throws
// (releasing it) when its communicator failed. Sends and receives still queued are issued
// first, settled within `limit_s` seconds.
bool poll(braid_comm_request_v2* r, double limit_s) {
  braid_comm_v2* c = r->comm;
  if (!c) {  // its communicator was freed: only its event is left
    if (!r->event)
      fail(10, r->freed + ": " + r->op +
                   " was never issued: the communicator was freed before a wait, test, collective or barrier "
                   "issued its sends and receives");
    const cudaError_t q = cudaEventQuery(r->event);
    if (q == cudaSuccess) return true;
    if (q != cudaErrorNotReady) check_cuda(q, r->freed + ": " + r->op);
    return false;
  }
  flush(c, limit_s);  // sends and receives still queued: issue their group now
  if (!r->event) fail(10, where(c) + ": " + r->op + " was never issued");
  const cudaError_t q = cudaEventQuery(r->event);
  if (q == cudaSuccess) return true;
  if (q != cudaErrorNotReady) check_cuda(q, where(c) + ": " + r->op);
  ncclResult_t async = ncclSuccess;
  ncclCommGetAsyncError(c->comm, &async);
  if (async != ncclSuccess && async != ncclInProgress)
    fail(1000 + static_cast<int>(async),
         where(c) + ": " + r->op + ": " + ncclGetErrorString(async) + " (" + ncclGetLastError(c->comm) + ")");
  return false;
}

int test(braid_comm_request_v2* r, int32_t* done) {
  if (!r || !done) return guarded([] { fail(1, "nccl plugin: a null request or output"); });
  int rc = guarded([&] {
    if (r->comm) require_live(r->comm);
    *done = poll(r, call_limit()) ? 1 : 0;
  });
  if (rc != 0 || *done) release(r);
  return rc;
}

int wait(braid_comm_request_v2* r, double timeout_s) {
  if (!r) return guarded([] { fail(1, "nccl plugin: a null request"); });
  const int rc = guarded([&] {
    braid_comm_v2* c = r->comm;
    if (c) require_live(c);
    const auto start = Clock::now();
    const auto waited = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
    // A group still queued is issued within what is left of the deadline (and the call limit).
    const auto limit = [&] {
      return timeout_s > 0 ? std::min(call_limit(), std::max(0.0, timeout_s - waited())) : call_limit();
    };
    while (!poll(r, limit())) {
      if (timeout_s > 0 && waited() > timeout_s) {
        if (!c)
          fail(8, r->freed + ": " + r->op + " did not complete within " + std::to_string(timeout_s) +
                      " s (its communicator was freed before)");
        ncclCommAbort(c->comm);
        c->aborted = true;
        fail(8, where(c) + ": " + r->op + " did not complete within " + std::to_string(timeout_s) +
                    " s; the communicator is aborted (free it). NCCL does not say which ranks did not arrive: "
                    "any of " +
                    ranks_text(c->world_ranks) + " other than this one may not have issued it");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  });
  release(r);
  return rc;
}

int barrier(braid_comm_v2* c, double timeout_s) {
  // The deadline covers issuing the all-reduce too: the wait gets what is left of it.
  const auto start = std::chrono::steady_clock::now();
  const double limit = timeout_s > 0 ? std::min(call_limit(), timeout_s) : call_limit();
  braid_comm_request_v2* r = nullptr;
  const int rc = guarded([&] {
    r = collective(
        c, nullptr, "barrier",
        [&] {
          return ncclAllReduce(c->barrier_scratch, c->barrier_scratch, 1, ncclFloat32, ncclSum, c->comm, nullptr);
        },
        limit);
  });
  if (rc != 0) return rc;
  if (timeout_s <= 0) return wait(r, 0);
  const double taken = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return wait(r, std::max(timeout_s - taken, 1e-9));  // past it already: the wait fails at once, saying so
}

void abort_all(int32_t code) {
  for (braid_comm_v2* c : state().comms)
    if (c->comm && !c->aborted) ncclCommAbort(c->comm);
  std::fflush(nullptr);
  std::_Exit(code ? code : 1);  // an abort never ends as a success
}

}  // namespace

extern "C" BRAID_PLUGIN_EXPORT const braid_comm_plugin_v2 braidCommPlugin_v2 = {
    2,         "nccl",    last_error, backend_version, init,  finalize,   world,      comm_world, comm_create,
    comm_free, comm_rank, comm_size,  isend,           irecv, iallreduce, iallgather, ibroadcast, ireduce_scatter,
    test,      wait,      barrier,    abort_all};
