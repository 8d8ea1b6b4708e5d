// libbraid-mpi.so's communication interface v2 (braid_comm_v2.h), over its version 1
// (mpi_comm.cpp): the same MPI communicators and requests, on host memory. It is what lets
// braid's device collectives run where the "device" is host memory (the host backend as an
// emulated device), with the calls NCCL gets on a GPU:
// - streams are accepted and ignored: host memory has none, work is ordered by the calls;
// - the bootstrap is not needed (MPI has its own) and is only checked;
// - wait and barrier keep their deadline by testing and sleeping. Past it the operation is
//   abandoned (MPI cannot cancel a collective) and the communicator refuses further work;
//   the error names the operation and the communicator's world ranks (and, for a send or a
//   receive, the peer's world rank, the bytes and the tag). Freeing the communicator then waits
//   for what it abandoned, which the other ranks must complete. finalize refuses (and changes
//   nothing) while an abandoned operation is still in flight: MPI_Finalize would crash in it.
// Tags are honoured (MPI has them), which the interface allows; version 1 refuses tags
// outside 0..32767. Output pointers are checked before anything is posted, and a call
// refused for its arguments releases nothing.
#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "braid_comm_v1.h"
#include "braid_comm_v2.h"

#define BRAID_PLUGIN_EXPORT __attribute__((visibility("default")))

extern "C" const braid_comm_plugin_v1 braidCommPlugin_v1;  // mpi_comm.cpp, in this library

struct braid_comm_v2 {
  braid_comm_v1* comm = nullptr;
  std::vector<int32_t> world_ranks;               // for errors
  bool owned = true;                              // false for the world
  bool aborted = false;                           // a deadline passed: no further work
  std::vector<braid_comm_request_v1*> abandoned;  // operations left at a deadline
  std::vector<braid_comm_request_v2*> requests;   // handed to the caller, not yet released
};

struct braid_comm_request_v2 {
  braid_comm_request_v1* request = nullptr;
  braid_comm_v2* comm = nullptr;
  std::string op;     // "all-reduce", "irecv of 16 bytes from world rank 2 (tag 3)": for errors
  bool p2p = false;   // a send or a receive: its peer is named, so the deadline's error names it
  std::string freed;  // once its communicator was freed (comm is then NULL): its world ranks
};

namespace {

const braid_comm_plugin_v1& v1 = braidCommPlugin_v1;
char error[1024] = "";
braid_comm_v2 world_comm;
std::vector<braid_comm_v2*> created;          // live communicators from comm_create, for finalize
std::vector<braid_comm_request_v1*> orphans;  // abandoned at a deadline after their communicator was freed
bool started = false;

int fail(int code, const char* format, ...) __attribute__((format(printf, 2, 3)));
int fail(int code, const char* format, ...) {
  va_list args;
  va_start(args, format);
  std::vsnprintf(error, sizeof error, format, args);
  va_end(args);
  return code;
}

// Version 1's status, its message kept as this version's.
int from_v1(int code) {
  if (code) std::snprintf(error, sizeof error, "%s", v1.last_error());
  return code;
}

constexpr int kFailed = 17;  // MPI_ERR_OTHER's value in Open MPI and MPICH alike

std::string ranks_text(const braid_comm_v2* c) {
  std::string s;
  for (std::size_t i = 0; i < c->world_ranks.size(); ++i) s += (i ? "," : "") + std::to_string(c->world_ranks[i]);
  return "{" + s + "}";
}

int usable(braid_comm_v2* c, const char* call) {
  if (!c) return fail(kFailed, "%s: communicator is NULL", call);
  if (c->aborted)
    return fail(kFailed, "%s: the communicator of world ranks %s was aborted at a deadline; free it", call,
                ranks_text(c).c_str());
  return 0;
}

// Where a call puts version 1's request: NULL when the caller gave no output pointer, so
// that version 1 refuses the call, with its status and message, before posting anything.
braid_comm_request_v1** v1_out(braid_comm_request_v2** out, braid_comm_request_v1** r) { return out ? r : nullptr; }

// The request record of an operation, made before version 1 posts it: once the operation is
// in flight, handing the record over cannot fail (throw), so none is left without a handle.
class Record {
 public:
  Record(braid_comm_v2* c, std::string op, bool p2p = false)
      : q_(std::make_unique<braid_comm_request_v2>(braid_comm_request_v2{nullptr, c, std::move(op), p2p, ""})) {
    c->requests.reserve(c->requests.size() + 1);
  }
  // `code` is version 1's status for the call, taken before (not in the same call's
  // arguments as `r`, which it sets); `out` is not NULL when it is 0 (version 1 refused a
  // NULL one).
  int hand_over(int code, braid_comm_request_v1* r, braid_comm_request_v2** out) noexcept {
    if (code) return from_v1(code);
    q_->request = r;
    q_->comm->requests.push_back(q_.get());  // reserved
    *out = q_.release();
    return 0;
  }

 private:
  std::unique_ptr<braid_comm_request_v2> q_;
};

// Deletes a request whose version-1 request was released (or abandoned).
void release(braid_comm_request_v2* q) {
  if (braid_comm_v2* c = q->comm)
    c->requests.erase(std::remove(c->requests.begin(), c->requests.end(), q), c->requests.end());
  delete q;
}

// The caller still holds the requests of a communicator it frees: they stay valid, detached.
void detach_requests(braid_comm_v2* c) {
  for (braid_comm_request_v2* q : c->requests) {
    q->comm = nullptr;
    q->freed = ranks_text(c);
  }
  c->requests.clear();
}

// Tests operations abandoned at deadlines, releasing those that ended; returns how many are
// still in flight.
std::size_t still_in_flight(std::vector<braid_comm_request_v1*>& abandoned) {
  std::vector<braid_comm_request_v1*> left;
  for (braid_comm_request_v1* r : abandoned) {
    int32_t done = 0;
    if (v1.test(r, &done) == 0 && !done) left.push_back(r);  // else v1 released it (done or failed)
  }
  abandoned.swap(left);
  return abandoned.size();
}

const char* last_error() { return error; }
const char* backend_version() { return v1.backend_version(); }

int init(const braid_comm_bootstrap_v2* bootstrap) {
  error[0] = '\0';
  if (!bootstrap || bootstrap->struct_size < sizeof(braid_comm_bootstrap_v2))
    return fail(kFailed, "init: the bootstrap is missing or older than this plugin");
  if (started) return fail(kFailed, "init: already initialised");
  if (int rc = from_v1(v1.init())) return rc;
  int32_t rank = 0, size = 0;
  v1.world(&rank, &size, nullptr, nullptr);
  if (rank != bootstrap->rank || size != bootstrap->size) {
    v1.finalize();
    return fail(kFailed, "init: the bootstrap says rank %d of %d, MPI rank %d of %d", bootstrap->rank, bootstrap->size,
                rank, size);
  }
  world_comm = braid_comm_v2();
  v1.comm_world(&world_comm.comm);
  for (int32_t r = 0; r < size; ++r) world_comm.world_ranks.push_back(r);
  world_comm.owned = false;
  started = true;
  return 0;
}

int finalize() {
  if (!started) return 0;
  // MPI_Finalize progresses what is in flight and crashes in an operation abandoned at a
  // deadline (its communicator freed under it), and nothing can cancel a collective: refuse,
  // changing nothing, while one is in flight. Once the other ranks complete them, finalize
  // succeeds; a caller that cannot wait for that ends the job with abort().
  std::size_t in_flight = still_in_flight(world_comm.abandoned) + still_in_flight(orphans);
  for (braid_comm_v2* c : created) in_flight += still_in_flight(c->abandoned);
  if (in_flight)
    return fail(kFailed,
                "finalize: %zu operation(s) abandoned after their deadline %s still in flight (the other ranks "
                "have not completed them); MPI cannot finalize cleanly with them: call abort() to end the job",
                in_flight, in_flight == 1 ? "is" : "are");
  started = false;
  detach_requests(&world_comm);
  world_comm = braid_comm_v2();
  return from_v1(v1.finalize());
}

int world(int32_t* rank, int32_t* size, int32_t* local_rank, int32_t* local_size) {
  if (!started) return fail(kFailed, "world: not initialised");
  return from_v1(v1.world(rank, size, local_rank, local_size));
}

int comm_world(braid_comm_v2** out) {
  if (!started) return fail(kFailed, "comm_world: not initialised");
  if (!out) return fail(kFailed, "comm_world: output pointer is NULL");
  *out = &world_comm;
  return 0;
}

int comm_create(const int32_t* world_ranks, int32_t count, braid_comm_v2** out) {
  if (!started) return fail(kFailed, "comm_create: not initialised");
  if (!out) return fail(kFailed, "comm_create: output pointer is NULL");
  braid_comm_v1* c = nullptr;
  if (int rc = from_v1(v1.comm_create(world_ranks, count, &c))) return rc;
  *out = new braid_comm_v2{c, std::vector<int32_t>(world_ranks, world_ranks + count), true, false, {}, {}};
  created.push_back(*out);
  return 0;
}

int comm_free(braid_comm_v2* c) {
  if (!c || !c->owned) return 0;
  for (braid_comm_request_v1* r : c->abandoned) v1.wait(r);  // MPI frees nothing in flight
  const int rc = from_v1(v1.comm_free(c->comm));
  created.erase(std::remove(created.begin(), created.end(), c), created.end());
  detach_requests(c);
  delete c;
  return rc;
}

int comm_rank(braid_comm_v2* c, int32_t* rank) {
  if (!c) return fail(kFailed, "comm_rank: communicator is NULL");
  return from_v1(v1.comm_rank(c->comm, rank));
}

int comm_size(braid_comm_v2* c, int32_t* size) {
  if (!c) return fail(kFailed, "comm_size: communicator is NULL");
  return from_v1(v1.comm_size(c->comm, size));
}

// "irecv of 16 bytes from world rank 2 (tag 3)"
std::string p2p_text(const char* call, size_t bytes, const char* direction, int32_t world_peer, int32_t tag) {
  return std::string(call) + " of " + std::to_string(bytes) + " bytes " + direction + " world rank " +
         std::to_string(world_peer) + " (tag " + std::to_string(tag) + ")";
}

// The world rank of `peer` in c; a peer outside it as given (version 1 refuses it).
int32_t world_peer(const braid_comm_v2* c, int32_t peer) {
  return peer >= 0 && std::size_t(peer) < c->world_ranks.size() ? c->world_ranks[std::size_t(peer)] : peer;
}

int isend(braid_comm_v2* c, const void* data, size_t bytes, int32_t peer, int32_t tag, void*,
          braid_comm_request_v2** out) {
  if (int rc = usable(c, "isend")) return rc;
  Record record(c, p2p_text("isend", bytes, "to", world_peer(c, peer), tag), true);
  braid_comm_request_v1* r = nullptr;
  const int code = v1.isend(c->comm, data, bytes, peer, tag, v1_out(out, &r));
  return record.hand_over(code, r, out);
}

int irecv(braid_comm_v2* c, void* data, size_t bytes, int32_t peer, int32_t tag, void*, braid_comm_request_v2** out) {
  if (int rc = usable(c, "irecv")) return rc;
  Record record(c, p2p_text("irecv", bytes, "from", world_peer(c, peer), tag), true);
  braid_comm_request_v1* r = nullptr;
  const int code = v1.irecv(c->comm, data, bytes, peer, tag, v1_out(out, &r));
  return record.hand_over(code, r, out);
}

int iallreduce(braid_comm_v2* c, const void* send, void* recv, size_t count, int32_t dtype, int32_t op, void*,
               braid_comm_request_v2** out) {
  if (int rc = usable(c, "iallreduce")) return rc;
  Record record(c, "all-reduce");
  braid_comm_request_v1* r = nullptr;
  const int code = v1.iallreduce(c->comm, send, recv, count, dtype, op, v1_out(out, &r));
  return record.hand_over(code, r, out);
}

int iallgather(braid_comm_v2* c, const void* send, void* recv, size_t bytes, void*, braid_comm_request_v2** out) {
  if (int rc = usable(c, "iallgather")) return rc;
  Record record(c, "all-gather");
  braid_comm_request_v1* r = nullptr;
  const int code = v1.iallgather(c->comm, send, recv, bytes, v1_out(out, &r));
  return record.hand_over(code, r, out);
}

int ibroadcast(braid_comm_v2* c, void* data, size_t bytes, int32_t root, void*, braid_comm_request_v2** out) {
  if (int rc = usable(c, "ibroadcast")) return rc;
  Record record(c, "broadcast");
  braid_comm_request_v1* r = nullptr;
  const int code = v1.ibroadcast(c->comm, data, bytes, root, v1_out(out, &r));
  return record.hand_over(code, r, out);
}

int ireduce_scatter(braid_comm_v2* c, const void* send, void* recv, size_t recv_count, int32_t dtype, int32_t op, void*,
                    braid_comm_request_v2** out) {
  if (int rc = usable(c, "ireduce_scatter")) return rc;
  Record record(c, "reduce-scatter");
  braid_comm_request_v1* r = nullptr;
  const int code = v1.ireduce_scatter(c->comm, send, recv, recv_count, dtype, op, v1_out(out, &r));
  return record.hand_over(code, r, out);
}

int test(braid_comm_request_v2* request, int32_t* done) {
  if (!request) return fail(kFailed, "test: request is NULL");
  // Refused by version 1 before it looks at the request, which stays valid: release nothing.
  if (!done) return from_v1(v1.test(request->request, nullptr));
  const int rc = from_v1(v1.test(request->request, done));
  if (rc != 0 || *done) release(request);  // v1 released its request either way
  return rc;
}

int wait(braid_comm_request_v2* request, double timeout_s) {
  if (!request) return fail(kFailed, "wait: request is NULL");
  if (timeout_s <= 0) {
    const int rc = from_v1(v1.wait(request->request));
    release(request);
    return rc;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    int32_t done = 0;
    if (int rc = from_v1(v1.test(request->request, &done)); rc || done) {
      release(request);
      return rc;
    }
    if (std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  braid_comm_v2* c = request->comm;
  const std::string op = request->op, ranks = c ? ranks_text(c) : request->freed;
  const bool p2p = request->p2p;
  if (c) {
    c->abandoned.push_back(request->request);
    c->aborted = true;
  } else {
    orphans.push_back(request->request);  // its communicator is gone: finalize still tests it
  }
  release(request);
  // A send or a receive names its peer; of a collective MPI does not say who did not arrive.
  return fail(kFailed, "%s on the communicator of world ranks %s did not complete within %.3g s; %s%s", op.c_str(),
              ranks.c_str(), timeout_s, c ? "it is aborted" : "it is abandoned (the communicator was freed before)",
              p2p ? "" : " (MPI does not say which ranks did not arrive)");
}

int barrier(braid_comm_v2* c, double timeout_s) {
  if (int rc = usable(c, "barrier")) return rc;
  // An all-reduce of nothing is a barrier that can be waited on with a deadline.
  static int32_t none_in = 0, none_out = 0;
  braid_comm_request_v2* r = nullptr;
  if (int rc = iallreduce(c, &none_in, &none_out, 1, BRAID_COMM_INT32, BRAID_COMM_SUM, nullptr, &r)) return rc;
  r->op = "barrier";
  return wait(r, timeout_s);
}

void abort_world(int32_t code) { v1.abort(code); }

// Every entry that returns a status returns one, never a C++ exception across the C ABI (an
// allocation that failed: nothing was posted, see Record).
template <auto Fn>
struct Guarded;
template <typename... A, int (*Fn)(A...)>
struct Guarded<Fn> {
  static int call(A... a) noexcept {
    try {
      return Fn(a...);
    } catch (const std::exception& e) {
      return fail(kFailed, "%s", e.what());
    } catch (...) {
      return fail(kFailed, "an unknown C++ exception");
    }
  }
};

}  // namespace

extern "C" BRAID_PLUGIN_EXPORT const braid_comm_plugin_v2 braidCommPlugin_v2 = {
    .interface_version = 2,
    .name = "mpi",
    .last_error = last_error,
    .backend_version = backend_version,
    .init = Guarded<init>::call,
    .finalize = Guarded<finalize>::call,
    .world = Guarded<world>::call,
    .comm_world = Guarded<comm_world>::call,
    .comm_create = Guarded<comm_create>::call,
    .comm_free = Guarded<comm_free>::call,
    .comm_rank = Guarded<comm_rank>::call,
    .comm_size = Guarded<comm_size>::call,
    .isend = Guarded<isend>::call,
    .irecv = Guarded<irecv>::call,
    .iallreduce = Guarded<iallreduce>::call,
    .iallgather = Guarded<iallgather>::call,
    .ibroadcast = Guarded<ibroadcast>::call,
    .ireduce_scatter = Guarded<ireduce_scatter>::call,
    .test = Guarded<test>::call,
    .wait = Guarded<wait>::call,
    .barrier = Guarded<barrier>::call,
    .abort = abort_world,
};
