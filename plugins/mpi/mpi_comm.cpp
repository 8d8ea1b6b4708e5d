// libbraid-mpi.so: the MPI communication plugin. Every MPI call goes through a
// communicator whose error handler is MPI_ERRORS_RETURN, so failures come back as
// messages in last_error() instead of aborting the job.
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <new>
#include <string>
#include <vector>

#include "braid_comm_v1.h"

#define BRAID_PLUGIN_EXPORT __attribute__((visibility("default")))

struct braid_comm_v1 {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 0;
  bool owned = true;  // false for the world communicator, which finalize frees
};

struct braid_comm_request_v1 {
  MPI_Request request = MPI_REQUEST_NULL;
  bool receive = false;  // check the received length on completion
  int expected = 0;      // bytes a receive must get
  char what[192] = "";   // "MPI_Irecv of 40 bytes from rank 1 (tag 7)", for errors
  // A receive from this rank itself lands here first, one byte larger than the caller's
  // buffer: Open MPI's self path truncates a longer message without reporting it when
  // the receive was posted first, so a message that fills the extra byte is too long.
  char* staging = nullptr;
  void* destination = nullptr;  // the caller's buffer, filled from `staging` on success

  braid_comm_request_v1() = default;
  braid_comm_request_v1(const braid_comm_request_v1&) = delete;
  braid_comm_request_v1& operator=(const braid_comm_request_v1&) = delete;
  ~braid_comm_request_v1() { delete[] staging; }
};

namespace {

// The plugin's state. Not thread-safe, as braid_comm_v1.h says.
struct State {
  int inits = 0;                  // nesting depth of init()
  bool started_mpi = false;       // init() called MPI_Init_thread, so the last finalize() ends MPI
  braid_comm_v1 world;            // a duplicate of MPI_COMM_WORLD
  MPI_Comm node = MPI_COMM_NULL;  // processes sharing memory with this one
  int local_rank = 0, local_size = 0;
  char error[1024] = "";
  char version[256] = "";
};
State state;

int fail(int code, const char* format, ...) __attribute__((format(printf, 2, 3)));
int fail(int code, const char* format, ...) {
  va_list args;
  va_start(args, format);
  std::vsnprintf(state.error, sizeof state.error, format, args);
  va_end(args);
  return code == 0 ? MPI_ERR_OTHER : code;
}

// "MPI_ERR_RANK: invalid rank" for an MPI error code.
std::string mpi_message(int code) {
  int length = 0;
  char text[MPI_MAX_ERROR_STRING] = "";
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) std::snprintf(text, sizeof text, "MPI error %d", code);
  return text;
}

// Returns 0, or the MPI error class with "<what>: <MPI's message>" in last_error.
int check(int code, const char* what) {
  if (code == MPI_SUCCESS) return 0;
  int error_class = code;
  MPI_Error_class(code, &error_class);
  return fail(error_class, "%s: %s", what, mpi_message(code).c_str());
}

int not_initialised(const char* call) {
  return fail(MPI_ERR_OTHER, "%s: the mpi plugin is not initialised (call init first)", call);
}

int bad_comm(const char* call) { return fail(MPI_ERR_COMM, "%s: communicator is NULL", call); }

int bad_request_out(const char* call) { return fail(MPI_ERR_ARG, "%s: request output pointer is NULL", call); }

// A NULL buffer for data that exists: refused here, before MPI (or the self-receive's copy)
// would read or write through it. `units` of nothing may come with NULL.
int check_buffer(const void* buffer, size_t units, const char* call, const char* what) {
  if (buffer || units == 0) return 0;
  return fail(MPI_ERR_BUFFER, "%s: %s buffer is NULL for %zu elements or bytes", call, what, units);
}

int to_int(size_t n, const char* call, const char* what, int* out) {
  if (n > static_cast<size_t>(INT_MAX)) {
    return fail(MPI_ERR_COUNT, "%s: %zu %s exceeds MPI's limit of %d per call", call, n, what, INT_MAX);
  }
  *out = static_cast<int>(n);
  return 0;
}

int check_peer(braid_comm_v1* comm, int32_t peer, const char* call, const char* role) {
  if (peer < 0 || peer >= comm->size) {
    return fail(MPI_ERR_RANK, "%s: %s %d is not a rank of this %d-rank communicator", call, role, int(peer),
                comm->size);
  }
  return 0;
}

// Tags outside 0..32767 are refused: MPI would take -1 (MPI_ANY_TAG) on a receive as "any
// tag", and tags above 32767 only on the MPIs whose MPI_TAG_UB allows them.
constexpr int32_t kMaxTag = 32767;

int check_tag(int32_t tag, const char* call) {
  if (tag < 0 || tag > kMaxTag)
    return fail(MPI_ERR_TAG, "%s: tag %d is outside 0..%d, the tags valid on every backend", call, int(tag),
                int(kMaxTag));
  return 0;
}

// Allocates the request record; MPI fills its request.
braid_comm_request_v1* new_request(const char* call) {
  auto* r = new (std::nothrow) braid_comm_request_v1();
  if (!r) fail(MPI_ERR_NO_MEM, "%s: out of memory for a request", call);
  return r;
}

// Finishes a request MPI reported complete with `code` and `status`; releases it.
int complete(braid_comm_request_v1* r, int code, const MPI_Status& status) {
  int result = 0;
  if (code != MPI_SUCCESS) {
    char what[256];
    std::snprintf(what, sizeof what, "%s failed", r->what);
    result = check(code, what);
  } else if (r->receive) {
    int got = 0;
    MPI_Get_count(&status, MPI_BYTE, &got);
    if (r->staging && got > r->expected) {
      // Longer than the receive: what MPI reports itself between two ranks.
      char what[256];
      std::snprintf(what, sizeof what, "%s failed", r->what);
      result = check(MPI_ERR_TRUNCATE, what);
    } else if (got != r->expected) {
      result = fail(MPI_ERR_TRUNCATE, "%s: received %d bytes, expected %d", r->what, got, r->expected);
    } else if (r->staging && got > 0) {
      std::memcpy(r->destination, r->staging, static_cast<size_t>(got));
    }
  }
  delete r;
  return result;
}

// How to wait. MPI_Wait polls, keeping a core busy (the default, BRAID_MPI_WAIT=spin).
// BRAID_MPI_WAIT=sleep makes a waiting process test and sleep instead, handing its core to a
// process beside it that computes, at tens of microseconds per wait: `braid calibrate` waits
// so while processes take turns on shared cores, and sets it only for those turns, so the
// variable is read at each wait. Training keeps polling: on 4 ranks over 2 cores it measured
// 10-30% faster than sleeping, whose wake-ups lengthen every latency-bound TP collective.
const char* wait_mode_problem() {
  const char* mode = std::getenv("BRAID_MPI_WAIT");
  if (!mode || !*mode || std::strcmp(mode, "spin") == 0 || std::strcmp(mode, "sleep") == 0) return nullptr;
  return mode;
}

bool sleepy_waits() {
  const char* mode = std::getenv("BRAID_MPI_WAIT");
  return mode && std::strcmp(mode, "sleep") == 0;
}

int wait_for(MPI_Request* request, MPI_Status* status) {
  if (!sleepy_waits()) return MPI_Wait(request, status);
  for (int polls = 0;; ++polls) {
    int flag = 0;
    const int code = MPI_Test(request, &flag, status);
    if (code != MPI_SUCCESS || flag) return code;
    if (polls >= 32) {
      const timespec pause{0, 20 * 1000};
      nanosleep(&pause, nullptr);
    }
  }
}

const char* last_error() { return state.error; }

const char* backend_version() {
  if (!state.version[0]) {
    char text[MPI_MAX_LIBRARY_VERSION_STRING] = "";
    int length = 0;
    MPI_Get_library_version(text, &length);
    text[sizeof text - 1] = '\0';
    text[std::strcspn(text, "\r\n")] = '\0';  // the first line names library and version
    std::snprintf(state.version, sizeof state.version, "%s", text[0] ? text : "MPI (unknown library)");
  }
  return state.version;
}

int init() {
  state.error[0] = '\0';
  if (state.inits > 0) {
    ++state.inits;
    return 0;
  }
  if (const char* mode = wait_mode_problem())
    return fail(MPI_ERR_ARG, "init: BRAID_MPI_WAIT is '%s'; set it to spin (poll, the default) or sleep", mode);
  int finalized = 0, initialized = 0;
  MPI_Finalized(&finalized);
  if (finalized) {
    return fail(MPI_ERR_OTHER, "init: MPI was already finalized in this process and cannot start again");
  }
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    // Starts from mpiexec's environment, or as a singleton of size 1 without it.
    int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS) return fail(rc, "init: MPI_Init_thread failed with code %d", rc);
    state.started_mpi = true;
    // MPI we started is ours: errors outside any communicator come back too.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
  }
  // A host's MPI_COMM_WORLD keeps its own error handler; braid works on a duplicate.
  if (int rc = check(MPI_Comm_dup(MPI_COMM_WORLD, &state.world.comm), "init: MPI_Comm_dup(MPI_COMM_WORLD)")) {
    if (state.started_mpi) MPI_Finalize();
    state.started_mpi = false;
    return rc;
  }
  MPI_Comm_set_errhandler(state.world.comm, MPI_ERRORS_RETURN);
  state.world.owned = false;
  MPI_Comm_rank(state.world.comm, &state.world.rank);
  MPI_Comm_size(state.world.comm, &state.world.size);
  if (int rc = check(
          MPI_Comm_split_type(state.world.comm, MPI_COMM_TYPE_SHARED, state.world.rank, MPI_INFO_NULL, &state.node),
          "init: MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)")) {
    MPI_Comm_free(&state.world.comm);
    if (state.started_mpi) MPI_Finalize();
    state.started_mpi = false;
    return rc;
  }
  MPI_Comm_rank(state.node, &state.local_rank);
  MPI_Comm_size(state.node, &state.local_size);
  state.inits = 1;
  return 0;
}

int finalize() {
  if (state.inits == 0) return 0;
  if (--state.inits > 0) return 0;
  MPI_Comm_free(&state.node);
  MPI_Comm_free(&state.world.comm);
  state.world = braid_comm_v1();
  int rc = 0;
  if (state.started_mpi) rc = check(MPI_Finalize(), "finalize: MPI_Finalize");
  state.started_mpi = false;
  return rc;
}

int world(int32_t* rank, int32_t* size, int32_t* local_rank, int32_t* local_size) {
  if (!state.inits) return not_initialised("world");
  if (rank) *rank = state.world.rank;
  if (size) *size = state.world.size;
  if (local_rank) *local_rank = state.local_rank;
  if (local_size) *local_size = state.local_size;
  return 0;
}

int comm_world(braid_comm_v1** out) {
  if (!state.inits) return not_initialised("comm_world");
  if (!out) return fail(MPI_ERR_ARG, "comm_world: output pointer is NULL");
  *out = &state.world;
  return 0;
}

// The communicator over `ranks` (checked: distinct world ranks, this process among them), its
// rank i world rank ranks[i]. It is made over the listed set in world order first, which every
// member agrees on whatever order it listed them in; the members then check their lists against
// that of the set's first, so that one listing them in another order fails on every member
// instead of leaving them all waiting in MPI_Comm_create_group for groups that differ.
int create_in_listed_order(const std::vector<int>& ranks, MPI_Comm* out) {
  const int count = static_cast<int>(ranks.size());
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  MPI_Group world_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
  int rc = check(MPI_Comm_group(state.world.comm, &world_group), "comm_create: MPI_Comm_group");
  if (!rc) rc = check(MPI_Group_incl(world_group, count, sorted.data(), &group), "comm_create: MPI_Group_incl");
  MPI_Comm set = MPI_COMM_NULL;
  // Collective over the group only, so overlapping groups need no world-wide call.
  if (!rc) rc = check(MPI_Comm_create_group(state.world.comm, group, 0, &set), "comm_create: MPI_Comm_create_group");
  if (group != MPI_GROUP_NULL) MPI_Group_free(&group);
  if (world_group != MPI_GROUP_NULL) MPI_Group_free(&world_group);
  if (rc) return rc;
  std::vector<int> first = ranks;  // becomes the list of the lowest world rank, the set's rank 0
  rc = check(MPI_Bcast(first.data(), count, MPI_INT, 0, set), "comm_create: MPI_Bcast of the first member's list");
  const auto at = std::mismatch(ranks.begin(), ranks.end(), first.begin()).first - ranks.begin();
  int same = at == count ? 1 : 0;
  if (!rc) rc = check(MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, set), "comm_create: MPI_Allreduce");
  if (!rc && at < count) {
    rc = fail(MPI_ERR_ARG,
              "comm_create: this process lists the %d ranks in another order than world rank %d (at position %d: world "
              "rank %d, where it has %d); every member must pass one list",
              count, sorted[0], int(at), ranks[static_cast<std::size_t>(at)], first[static_cast<std::size_t>(at)]);
  } else if (!rc && !same) {
    rc = fail(MPI_ERR_ARG,
              "comm_create: another member lists the %d ranks in another order than this process; every member must "
              "pass one list",
              count);
  }
  // Ranks in the listed order: this process's key is its place in the list.
  const int mine = static_cast<int>(std::find(ranks.begin(), ranks.end(), state.world.rank) - ranks.begin());
  if (!rc) rc = check(MPI_Comm_split(set, 0, mine, out), "comm_create: MPI_Comm_split");
  MPI_Comm_free(&set);
  return rc;
}

int comm_create(const int32_t* world_ranks, int32_t count, braid_comm_v1** out) {
  if (!state.inits) return not_initialised("comm_create");
  if (!out) return fail(MPI_ERR_ARG, "comm_create: output pointer is NULL");
  *out = nullptr;
  if (count <= 0 || !world_ranks) return fail(MPI_ERR_ARG, "comm_create: no ranks listed (count %d)", int(count));
  // Checked here: MPI would report bad ranks through MPI_COMM_WORLD's handler, which may abort.
  std::vector<char> seen(state.world.size, 0);
  bool listed = false;
  for (int32_t i = 0; i < count; ++i) {
    int32_t r = world_ranks[i];
    if (r < 0 || r >= state.world.size) {
      return fail(MPI_ERR_RANK, "comm_create: world_ranks[%d] = %d is not a rank of the %d-process world", int(i),
                  int(r), state.world.size);
    }
    if (seen[r]) return fail(MPI_ERR_RANK, "comm_create: world rank %d is listed twice", int(r));
    seen[r] = 1;
    listed = listed || r == state.world.rank;
  }
  if (!listed) {
    return fail(MPI_ERR_RANK, "comm_create: world rank %d is not among the %d listed ranks; only they may call it",
                state.world.rank, int(count));
  }
  MPI_Comm comm = MPI_COMM_NULL;
  if (int rc = create_in_listed_order(std::vector<int>(world_ranks, world_ranks + count), &comm)) return rc;
  auto* c = new (std::nothrow) braid_comm_v1();
  if (!c) {
    MPI_Comm_free(&comm);
    return fail(MPI_ERR_NO_MEM, "comm_create: out of memory");
  }
  c->comm = comm;
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm, &c->rank);
  MPI_Comm_size(comm, &c->size);
  *out = c;
  return 0;
}

int comm_free(braid_comm_v1* comm) {
  if (!comm || !comm->owned) return 0;
  int rc = 0;
  if (comm->comm != MPI_COMM_NULL) rc = check(MPI_Comm_free(&comm->comm), "comm_free: MPI_Comm_free");
  delete comm;
  return rc;
}

int comm_rank(braid_comm_v1* comm, int32_t* rank) {
  if (!comm) return bad_comm("comm_rank");
  if (rank) *rank = comm->rank;
  return 0;
}

int comm_size(braid_comm_v1* comm, int32_t* size) {
  if (!comm) return bad_comm("comm_size");
  if (size) *size = comm->size;
  return 0;
}

int isend(braid_comm_v1* comm, const void* data, size_t bytes, int32_t peer, int32_t tag,
          braid_comm_request_v1** request) {
  if (!comm) return bad_comm("isend");
  if (!request) return bad_request_out("isend");
  *request = nullptr;
  int n = 0;
  if (int rc = check_peer(comm, peer, "isend", "peer")) return rc;
  if (int rc = check_tag(tag, "isend")) return rc;
  if (int rc = check_buffer(data, bytes, "isend", "send")) return rc;
  if (int rc = to_int(bytes, "isend", "bytes", &n)) return rc;
  braid_comm_request_v1* r = new_request("isend");
  if (!r) return MPI_ERR_NO_MEM;
  std::snprintf(r->what, sizeof r->what, "MPI_Isend of %d bytes to rank %d (tag %d)", n, int(peer), int(tag));
  if (int rc = check(MPI_Isend(data, n, MPI_BYTE, peer, tag, comm->comm, &r->request), r->what)) {
    delete r;
    return rc;
  }
  *request = r;
  return 0;
}

int irecv(braid_comm_v1* comm, void* data, size_t bytes, int32_t peer, int32_t tag, braid_comm_request_v1** request) {
  if (!comm) return bad_comm("irecv");
  if (!request) return bad_request_out("irecv");
  *request = nullptr;
  int n = 0;
  if (int rc = check_peer(comm, peer, "irecv", "peer")) return rc;
  if (int rc = check_tag(tag, "irecv")) return rc;
  if (int rc = check_buffer(data, bytes, "irecv", "receive")) return rc;
  if (int rc = to_int(bytes, "irecv", "bytes", &n)) return rc;
  braid_comm_request_v1* r = new_request("irecv");
  if (!r) return MPI_ERR_NO_MEM;
  std::snprintf(r->what, sizeof r->what, "MPI_Irecv of %d bytes from rank %d (tag %d)", n, int(peer), int(tag));
  r->receive = true;
  r->expected = n;
  void* buffer = data;
  int posted = n;
  if (peer == comm->rank && n < INT_MAX) {
    r->staging = new (std::nothrow) char[static_cast<size_t>(n) + 1];
    if (!r->staging) {
      delete r;
      return fail(MPI_ERR_NO_MEM, "irecv: out of memory for a %d-byte receive from this rank", n);
    }
    r->destination = data;
    buffer = r->staging;
    posted = n + 1;
  }
  if (int rc = check(MPI_Irecv(buffer, posted, MPI_BYTE, peer, tag, comm->comm, &r->request), r->what)) {
    delete r;
    return rc;
  }
  *request = r;
  return 0;
}

// The MPI type of a BRAID_COMM_* dtype, or an error naming `call`.
int to_mpi_type(int32_t dtype, const char* call, MPI_Datatype* out) {
  switch (dtype) {
    case BRAID_COMM_FLOAT32:
      *out = MPI_FLOAT;
      return 0;
    case BRAID_COMM_FLOAT64:
      *out = MPI_DOUBLE;
      return 0;
    case BRAID_COMM_INT32:
      *out = MPI_INT32_T;
      return 0;
    case BRAID_COMM_INT64:
      *out = MPI_INT64_T;
      return 0;
    default:
      return fail(MPI_ERR_TYPE, "%s: unknown dtype %d (0..3 are defined)", call, int(dtype));
  }
}

// The MPI reduction of a BRAID_COMM_* op, or an error naming `call`.
int to_mpi_op(int32_t op, const char* call, MPI_Op* out) {
  switch (op) {
    case BRAID_COMM_SUM:
      *out = MPI_SUM;
      return 0;
    case BRAID_COMM_MAX:
      *out = MPI_MAX;
      return 0;
    case BRAID_COMM_MIN:
      *out = MPI_MIN;
      return 0;
    default:
      return fail(MPI_ERR_OP, "%s: unknown op %d (0..2 are defined)", call, int(op));
  }
}

int iallreduce(braid_comm_v1* comm, const void* send, void* recv, size_t count, int32_t dtype, int32_t op,
               braid_comm_request_v1** request) {
  if (!comm) return bad_comm("iallreduce");
  if (!request) return bad_request_out("iallreduce");
  *request = nullptr;
  MPI_Datatype type = MPI_DATATYPE_NULL;
  MPI_Op mpi_op = MPI_OP_NULL;
  int n = 0;
  if (int rc = to_mpi_type(dtype, "iallreduce", &type)) return rc;
  if (int rc = to_mpi_op(op, "iallreduce", &mpi_op)) return rc;
  if (int rc = to_int(count, "iallreduce", "elements", &n)) return rc;
  if (int rc = check_buffer(send, count, "iallreduce", "send")) return rc;
  if (int rc = check_buffer(recv, count, "iallreduce", "receive")) return rc;
  braid_comm_request_v1* r = new_request("iallreduce");
  if (!r) return MPI_ERR_NO_MEM;
  std::snprintf(r->what, sizeof r->what, "MPI_Iallreduce of %d elements over %d ranks", n, comm->size);
  const void* in = send == recv ? MPI_IN_PLACE : send;
  if (int rc = check(MPI_Iallreduce(in, recv, n, type, mpi_op, comm->comm, &r->request), r->what)) {
    delete r;
    return rc;
  }
  *request = r;
  return 0;
}

int ireduce_scatter(braid_comm_v1* comm, const void* send, void* recv, size_t recv_count, int32_t dtype, int32_t op,
                    braid_comm_request_v1** request) {
  if (!comm) return bad_comm("ireduce_scatter");
  if (!request) return bad_request_out("ireduce_scatter");
  *request = nullptr;
  MPI_Datatype type = MPI_DATATYPE_NULL;
  MPI_Op mpi_op = MPI_OP_NULL;
  int n = 0;
  if (int rc = to_mpi_type(dtype, "ireduce_scatter", &type)) return rc;
  if (int rc = to_mpi_op(op, "ireduce_scatter", &mpi_op)) return rc;
  if (int rc = to_int(recv_count, "ireduce_scatter", "elements per rank", &n)) return rc;
  if (int rc = check_buffer(send, recv_count, "ireduce_scatter", "send")) return rc;
  if (int rc = check_buffer(recv, recv_count, "ireduce_scatter", "receive")) return rc;
  braid_comm_request_v1* r = new_request("ireduce_scatter");
  if (!r) return MPI_ERR_NO_MEM;
  std::snprintf(r->what, sizeof r->what, "MPI_Ireduce_scatter_block of %d elements per rank over %d ranks", n,
                comm->size);
  if (int rc = check(MPI_Ireduce_scatter_block(send, recv, n, type, mpi_op, comm->comm, &r->request), r->what)) {
    delete r;
    return rc;
  }
  *request = r;
  return 0;
}

int iallgather(braid_comm_v1* comm, const void* send, void* recv, size_t bytes, braid_comm_request_v1** request) {
  if (!comm) return bad_comm("iallgather");
  if (!request) return bad_request_out("iallgather");
  *request = nullptr;
  int n = 0;
  if (int rc = to_int(bytes, "iallgather", "bytes", &n)) return rc;
  if (int rc = check_buffer(send, bytes, "iallgather", "send")) return rc;
  if (int rc = check_buffer(recv, bytes, "iallgather", "receive")) return rc;
  braid_comm_request_v1* r = new_request("iallgather");
  if (!r) return MPI_ERR_NO_MEM;
  std::snprintf(r->what, sizeof r->what, "MPI_Iallgather of %d bytes per rank over %d ranks", n, comm->size);
  if (int rc = check(MPI_Iallgather(send, n, MPI_BYTE, recv, n, MPI_BYTE, comm->comm, &r->request), r->what)) {
    delete r;
    return rc;
  }
  *request = r;
  return 0;
}

int ibroadcast(braid_comm_v1* comm, void* data, size_t bytes, int32_t root, braid_comm_request_v1** request) {
  if (!comm) return bad_comm("ibroadcast");
  if (!request) return bad_request_out("ibroadcast");
  *request = nullptr;
  int n = 0;
  if (int rc = check_peer(comm, root, "ibroadcast", "root")) return rc;
  if (int rc = to_int(bytes, "ibroadcast", "bytes", &n)) return rc;
  if (int rc = check_buffer(data, bytes, "ibroadcast", "data")) return rc;
  braid_comm_request_v1* r = new_request("ibroadcast");
  if (!r) return MPI_ERR_NO_MEM;
  std::snprintf(r->what, sizeof r->what, "MPI_Ibcast of %d bytes from rank %d over %d ranks", n, int(root), comm->size);
  if (int rc = check(MPI_Ibcast(data, n, MPI_BYTE, root, comm->comm, &r->request), r->what)) {
    delete r;
    return rc;
  }
  *request = r;
  return 0;
}

int test(braid_comm_request_v1* request, int32_t* done) {
  if (!request) return fail(MPI_ERR_REQUEST, "test: request is NULL");
  if (!done) return fail(MPI_ERR_ARG, "test: done pointer is NULL");
  int flag = 0;
  MPI_Status status{};
  int code = MPI_Test(&request->request, &flag, &status);
  *done = 0;
  if (code != MPI_SUCCESS || flag) {
    *done = 1;
    return complete(request, code, status);
  }
  return 0;
}

int wait(braid_comm_request_v1* request) {
  if (!request) return fail(MPI_ERR_REQUEST, "wait: request is NULL");
  MPI_Status status{};
  int code = wait_for(&request->request, &status);
  return complete(request, code, status);
}

int barrier(braid_comm_v1* comm) {
  if (!comm) return bad_comm("barrier");
  if (!sleepy_waits()) return check(MPI_Barrier(comm->comm), "MPI_Barrier");
  MPI_Request request = MPI_REQUEST_NULL;
  if (int rc = check(MPI_Ibarrier(comm->comm, &request), "MPI_Ibarrier")) return rc;
  MPI_Status status{};
  return check(wait_for(&request, &status), "MPI_Ibarrier (wait)");
}

void abort_world(int32_t code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(state.inits ? state.world.comm : MPI_COMM_WORLD, code);
  std::_Exit(code ? code : 1);  // no MPI to abort through, or MPI_Abort returned
}

}  // namespace

extern "C" BRAID_PLUGIN_EXPORT const braid_comm_plugin_v1 braidCommPlugin_v1 = {
    .interface_version = 1,
    .name = "mpi",
    .last_error = last_error,
    .backend_version = backend_version,
    .init = init,
    .finalize = finalize,
    .world = world,
    .comm_world = comm_world,
    .comm_create = comm_create,
    .comm_free = comm_free,
    .comm_rank = comm_rank,
    .comm_size = comm_size,
    .isend = isend,
    .irecv = irecv,
    .iallreduce = iallreduce,
    .iallgather = iallgather,
    .ibroadcast = ibroadcast,
    .test = test,
    .wait = wait,
    .barrier = barrier,
    .abort = abort_world,
    .ireduce_scatter = ireduce_scatter,
};
