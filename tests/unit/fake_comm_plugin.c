/* Fake communication plugins, built several times from this file. Compiled as C99 with
 * -Wpedantic: braid_comm_v1.h must be valid C.
 * - Refused by the loader: FAKE_VERSION 2 (a future interface this braid does not read)
 *   and 1 with no functions (an incomplete plugin).
 * - FAKE_WORLD: a working plugin, rank 1 of a world of 2 whose rank 0 sends what this
 *   rank sends (a sum is twice this rank's values, max and min are them). Collectives
 *   run in wait() or the second test(), so a caller that reads its buffers before the
 *   request completes sees them untouched. Point to point and comm_create fail.
 *   FAKE_REDUCE_SCATTER selects how ireduce_scatter is offered: 1 set, 0 NULL, -1 a
 *   table laid out as braid_comm_v1.h was before ireduce_scatter was appended. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "braid_comm_v1.h"

#define EXPORT __attribute__((visibility("default")))

#ifndef FAKE_WORLD

EXPORT const braid_comm_plugin_v1 braidCommPlugin_v1 = {
    .interface_version = FAKE_VERSION,
    .name = "fake",
};

#else

struct braid_comm_v1 {
  int unused;
};
static braid_comm_v1 fake_world;

/* A collective to compute when it completes: recv[i] = op(send[offset + i], the same). */
struct braid_comm_request_v1 {
  const void* send;
  void* recv;
  size_t offset, count;
  int32_t dtype, op;
  int tests;
};

static char error_text[256] = "";

static int fail(const char* call, const char* why) {
  snprintf(error_text, sizeof error_text, "fake %s: %s", call, why);
  return 1;
}

static const char* last_error(void) { return error_text; }
static const char* backend_version(void) { return "fake: rank 1 of 2, rank 0 sends what this rank sends"; }
static int init(void) { return 0; }
static int finalize(void) { return 0; }

static int world(int32_t* rank, int32_t* size, int32_t* local_rank, int32_t* local_size) {
  if (rank) *rank = 1;
  if (size) *size = 2;
  if (local_rank) *local_rank = 1;
  if (local_size) *local_size = 2;
  return 0;
}

static int comm_world(braid_comm_v1** out) {
  *out = &fake_world;
  return 0;
}

static int comm_create(const int32_t* world_ranks, int32_t count, braid_comm_v1** out) {
  (void)world_ranks, (void)count, (void)out;
  return fail("comm_create", "not supported");
}

static int comm_free(braid_comm_v1* comm) {
  (void)comm;
  return 0;
}

static int comm_rank(braid_comm_v1* comm, int32_t* rank) {
  (void)comm;
  *rank = 1;
  return 0;
}

static int comm_size(braid_comm_v1* comm, int32_t* size) {
  (void)comm;
  *size = 2;
  return 0;
}

static int isend(braid_comm_v1* comm, const void* data, size_t bytes, int32_t peer, int32_t tag,
                 braid_comm_request_v1** request) {
  (void)comm, (void)data, (void)bytes, (void)peer, (void)tag, (void)request;
  return fail("isend", "not supported");
}

static int irecv(braid_comm_v1* comm, void* data, size_t bytes, int32_t peer, int32_t tag,
                 braid_comm_request_v1** request) {
  (void)comm, (void)data, (void)bytes, (void)peer, (void)tag, (void)request;
  return fail("irecv", "not supported");
}

static int reduction(const char* call, const void* send, void* recv, size_t offset, size_t count, int32_t dtype,
                     int32_t op, braid_comm_request_v1** request) {
  braid_comm_request_v1* r;
  if (dtype < BRAID_COMM_FLOAT32 || dtype > BRAID_COMM_INT64) return fail(call, "unknown dtype");
  if (op < BRAID_COMM_SUM || op > BRAID_COMM_MIN) return fail(call, "unknown op");
  r = calloc(1, sizeof *r);
  if (!r) return fail(call, "out of memory");
  r->send = send;
  r->recv = recv;
  r->offset = offset;
  r->count = count;
  r->dtype = dtype;
  r->op = op;
  *request = r;
  return 0;
}

static int iallreduce(braid_comm_v1* comm, const void* send, void* recv, size_t count, int32_t dtype, int32_t op,
                      braid_comm_request_v1** request) {
  (void)comm;
  return reduction("iallreduce", send, recv, 0, count, dtype, op, request);
}

static int iallgather(braid_comm_v1* comm, const void* send, void* recv, size_t bytes,
                      braid_comm_request_v1** request) {
  (void)comm, (void)send, (void)recv, (void)bytes, (void)request;
  return fail("iallgather", "not supported");
}

static int ibroadcast(braid_comm_v1* comm, void* data, size_t bytes, int32_t root, braid_comm_request_v1** request) {
  (void)comm, (void)data, (void)bytes, (void)root, (void)request;
  return fail("ibroadcast", "not supported");
}

#define FAKE_REDUCE(T)                                                                       \
  do {                                                                                       \
    const T* in = (const T*)r->send + r->offset;                                             \
    T* out = (T*)r->recv;                                                                    \
    for (i = 0; i < r->count; ++i) out[i] = r->op == BRAID_COMM_SUM ? in[i] + in[i] : in[i]; \
  } while (0)

static int wait_request(braid_comm_request_v1* r) {
  size_t i;
  switch (r->dtype) {
    case BRAID_COMM_FLOAT32:
      FAKE_REDUCE(float);
      break;
    case BRAID_COMM_FLOAT64:
      FAKE_REDUCE(double);
      break;
    case BRAID_COMM_INT32:
      FAKE_REDUCE(int32_t);
      break;
    default:
      FAKE_REDUCE(int64_t);
      break;
  }
  free(r);
  return 0;
}

static int test_request(braid_comm_request_v1* r, int32_t* done) {
  *done = ++r->tests >= 2;
  return *done ? wait_request(r) : 0;
}

static int barrier(braid_comm_v1* comm) {
  (void)comm;
  return 0;
}

static void abort_world(int32_t code) { exit(code ? code : 1); }

#if FAKE_REDUCE_SCATTER > 0
static int ireduce_scatter(braid_comm_v1* comm, const void* send, void* recv, size_t recv_count, int32_t dtype,
                           int32_t op, braid_comm_request_v1** request) {
  (void)comm;
  return reduction("ireduce_scatter", send, recv, recv_count /* rank 1's block */, recv_count, dtype, op, request);
}
#endif

/* The members every variant's table sets: version 1 up to abort. */
#define FAKE_V1_MEMBERS                                                                                               \
  .interface_version = 1, .name = "fake", .last_error = last_error, .backend_version = backend_version, .init = init, \
  .finalize = finalize, .world = world, .comm_world = comm_world, .comm_create = comm_create, .comm_free = comm_free, \
  .comm_rank = comm_rank, .comm_size = comm_size, .isend = isend, .irecv = irecv, .iallreduce = iallreduce,           \
  .iallgather = iallgather, .ibroadcast = ibroadcast, .test = test_request, .wait = wait_request, .barrier = barrier, \
  .abort = abort_world

#if FAKE_REDUCE_SCATTER >= 0

EXPORT const braid_comm_plugin_v1 braidCommPlugin_v1 = {
    FAKE_V1_MEMBERS,
#if FAKE_REDUCE_SCATTER > 0
    .ireduce_scatter = ireduce_scatter,
#endif
};

#else

/* braid_comm_plugin_v1 as braid_comm_v1.h declared it before ireduce_scatter: what a
 * plugin built against that header exports. */
typedef struct {
  uint32_t interface_version;
  const char* name;
  const char* (*last_error)(void);
  const char* (*backend_version)(void);
  int (*init)(void);
  int (*finalize)(void);
  int (*world)(int32_t*, int32_t*, int32_t*, int32_t*);
  int (*comm_world)(braid_comm_v1**);
  int (*comm_create)(const int32_t*, int32_t, braid_comm_v1**);
  int (*comm_free)(braid_comm_v1*);
  int (*comm_rank)(braid_comm_v1*, int32_t*);
  int (*comm_size)(braid_comm_v1*, int32_t*);
  int (*isend)(braid_comm_v1*, const void*, size_t, int32_t, int32_t, braid_comm_request_v1**);
  int (*irecv)(braid_comm_v1*, void*, size_t, int32_t, int32_t, braid_comm_request_v1**);
  int (*iallreduce)(braid_comm_v1*, const void*, void*, size_t, int32_t, int32_t, braid_comm_request_v1**);
  int (*iallgather)(braid_comm_v1*, const void*, void*, size_t, braid_comm_request_v1**);
  int (*ibroadcast)(braid_comm_v1*, void*, size_t, int32_t, braid_comm_request_v1**);
  int (*test)(braid_comm_request_v1*, int32_t*);
  int (*wait)(braid_comm_request_v1*);
  int (*barrier)(braid_comm_v1*);
  void (*abort)(int32_t);
} plugin_before_reduce_scatter;
/* The old table is the new one without its last member (a C99 static assertion). */
typedef char
    same_prefix[sizeof(plugin_before_reduce_scatter) == offsetof(braid_comm_plugin_v1, ireduce_scatter) ? 1 : -1];

static int read_past_the_end(braid_comm_v1* comm, const void* send, void* recv, size_t recv_count, int32_t dtype,
                             int32_t op, braid_comm_request_v1** request) {
  (void)comm, (void)send, (void)recv, (void)recv_count, (void)dtype, (void)op, (void)request;
  return fail("ireduce_scatter", "the loader read past the end of a table from before ireduce_scatter");
}

EXPORT const plugin_before_reduce_scatter braidCommPlugin_v1 = {
    FAKE_V1_MEMBERS,
};
/* Emitted right after the table (-fno-toplevel-reorder), where a loader that read past
 * its end would find a non-NULL ireduce_scatter. */
__attribute__((used)) static const struct {
  int (*ireduce_scatter)(braid_comm_v1*, const void*, void*, size_t, int32_t, int32_t, braid_comm_request_v1**);
} past_the_end = {read_past_the_end};

#endif
#endif
