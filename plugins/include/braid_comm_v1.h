/*
 * braid_comm_v1.h: version 1 of the communication plugin interface. Frozen: a new
 * version gets a new header and a new exported symbol, and the loader tries the
 * newest first (after NCCL's net/tuner plugins). The one change version 1 allows is
 * an optional function appended at the end of braid_comm_plugin_v1 (see "Optional
 * functions" there), so that plugins built against an older copy of this header
 * still load.
 *
 * A communication plugin is a shared library libbraid-<name>.so that exports
 *   const braid_comm_plugin_v1 braidCommPlugin_v1;
 * and nothing else. Every function pointer up to abort is set (the loader rejects a
 * NULL); the optional ones after it may be NULL.
 *
 * Conventions, for every function below:
 * - Status: functions return 0 on success and a non-zero, backend-defined code on
 *   failure (the MPI plugin returns the MPI error class). After a failure,
 *   last_error() describes it: which call, on which peer / communicator, and the
 *   backend's own message. No function throws, exits or aborts the process
 *   (abort() excepted), whatever its arguments.
 * - Threads: not thread-safe. Calls must not overlap; use the plugin from the
 *   thread that called init() (the MPI plugin asks MPI for MPI_THREAD_FUNNELED).
 *   Single-threaded use is what braid does.
 * - Lifetime: init() before anything else except name, interface_version,
 *   last_error and backend_version; finalize() last. After finalize() only
 *   last_error() and backend_version() may be called (and init(), which fails when
 *   the backend cannot start twice in one process, as MPI cannot).
 * - Ownership: communicators and requests are opaque handles that the plugin
 *   allocates. The caller frees each communicator it created with comm_free(); the
 *   world communicator belongs to the plugin. A request is released by wait()
 *   (whatever its result) or by test() once it reports completion or fails; the
 *   handle is invalid afterwards. Buffers passed to a non-blocking call stay owned
 *   by the caller and must stay valid, and unmodified (sends) or unread (receives),
 *   until its request completes.
 * - Ranks: `peer` and `root` are ranks in the communicator passed (0 .. size-1);
 *   comm_create() takes world ranks. Tags 0 .. 32767 are valid on every backend; the
 *   MPI plugin refuses others, naming the tag (MPI would take -1 on a receive as any tag).
 * - Sizes: counts are size_t; a backend that cannot move that much in one call
 *   fails with a message saying so (MPI: more than INT_MAX elements).
 */
#ifndef BRAID_COMM_V1_H
#define BRAID_COMM_V1_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element types of iallreduce and ireduce_scatter (int32_t values, not an enum, so that any value
 * crossing the boundary is well-defined; an unknown one is an error). */
#define BRAID_COMM_FLOAT32 0
#define BRAID_COMM_FLOAT64 1
#define BRAID_COMM_INT32 2
#define BRAID_COMM_INT64 3

/* Reductions of iallreduce and ireduce_scatter. */
#define BRAID_COMM_SUM 0
#define BRAID_COMM_MAX 1
#define BRAID_COMM_MIN 2

typedef struct braid_comm_v1 braid_comm_v1;                 /* a communicator (plugin-defined) */
typedef struct braid_comm_request_v1 braid_comm_request_v1; /* an operation in flight (plugin-defined) */

typedef struct braid_comm_plugin_v1 {
  uint32_t interface_version; /* 1 */
  const char* name;           /* "mpi": the <name> of libbraid-<name>.so; static storage */

  /* The message of the most recent failed call, "" when none. Static storage owned
   * by the plugin, valid until the next call into the plugin. Never NULL. */
  const char* (*last_error)(void);
  /* One line naming the backend library and version ("Open MPI v4.1.4, ..."). Static
   * storage owned by the plugin. Never NULL; callable before init. */
  const char* (*backend_version)(void);

  /* Joins the world that the launcher describes through the environment (mpiexec,
   * srun...), or a world of one process when started without a launcher. When the
   * host program already started the backend (MPI_Init), the plugin joins it and
   * leaves it running at finalize. Calls nest: each init needs one finalize. */
  int (*init)(void);
  /* Frees what init made; the backend stops with the last finalize if init started it. */
  int (*finalize)(void);

  /* This process in the world: rank and size, and its rank and the process count on
   * its node (processes that share memory). Any pointer may be NULL. */
  int (*world)(int32_t* rank, int32_t* size, int32_t* local_rank, int32_t* local_size);

  /* The communicator over every process, world rank order. Owned by the plugin and
   * valid until finalize; separate from any the host uses (MPI: a duplicate of
   * MPI_COMM_WORLD), so braid's tags never match the host's messages. */
  int (*comm_world)(braid_comm_v1** out);
  /* A communicator over `count` distinct world ranks; its rank i is world_ranks[i].
   * Collective over the listed processes only: each of them calls it with the same
   * list, and processes not listed do not call it (MPI plugin: members that list the
   * same ranks in different orders all fail, those whose order differs told where;
   * lists of different ranks are not detected and wait). Processes that create several
   * overlapping communicators must create them in one order that all agree on (as
   * built from one plan). The caller must be listed; it frees *out with comm_free. */
  int (*comm_create)(const int32_t* world_ranks, int32_t count, braid_comm_v1** out);
  /* Frees a communicator from comm_create; NULL and the world communicator are ignored.
   * Requests still in flight on it complete normally. */
  int (*comm_free)(braid_comm_v1* comm);
  int (*comm_rank)(braid_comm_v1* comm, int32_t* rank);
  int (*comm_size)(braid_comm_v1* comm, int32_t* size);

  /* Point to point: `bytes` bytes to / from `peer` with `tag`. A receive takes a
   * message of exactly `bytes` bytes; one of another length fails its request. */
  int (*isend)(braid_comm_v1* comm, const void* data, size_t bytes, int32_t peer, int32_t tag,
               braid_comm_request_v1** request);
  int (*irecv)(braid_comm_v1* comm, void* data, size_t bytes, int32_t peer, int32_t tag,
               braid_comm_request_v1** request);
  /* recv[i] = op over ranks of send[i], for `count` elements of `dtype`, on every
   * rank. send == recv reduces in place. */
  int (*iallreduce)(braid_comm_v1* comm, const void* send, void* recv, size_t count, int32_t dtype, int32_t op,
                    braid_comm_request_v1** request);
  /* Every rank contributes `bytes` bytes; recv (size * bytes) holds rank r's at r * bytes. */
  int (*iallgather)(braid_comm_v1* comm, const void* send, void* recv, size_t bytes, braid_comm_request_v1** request);
  /* `root`'s `bytes` bytes of data are copied into every other rank's data. */
  int (*ibroadcast)(braid_comm_v1* comm, void* data, size_t bytes, int32_t root, braid_comm_request_v1** request);

  /* Sets *done to 1 and releases the request when it has completed, else 0; never
   * blocks. A failed request is released too and returns its error. */
  int (*test)(braid_comm_request_v1* request, int32_t* done);
  /* Blocks until the request completes, then releases it: 0 when it succeeded, else
   * its error (a receive of the wrong length, a peer that failed...). */
  int (*wait)(braid_comm_request_v1* request);
  /* Blocks until every rank of comm has called it. */
  int (*barrier)(braid_comm_v1* comm);
  /* Ends every process of the world with exit code `code` (MPI_Abort); does not return.
   * For fatal errors on one rank that would leave its peers waiting forever. */
  void (*abort)(int32_t code);

  /* Optional functions, appended after abort. The loader copies as many bytes of the
   * table as the exported symbol holds (its ELF symbol size) and leaves the members
   * past them NULL, so a plugin built against an older copy of this header loads
   * with those functions absent, as does one that sets them NULL; braid then does
   * without (each says how). New ones go after the last, never between. */

  /* MPI_Reduce_scatter_block: send holds size * recv_count elements of `dtype`, block
   * r at r * recv_count; rank r's recv (recv_count elements) gets op over ranks of
   * their block r. send and recv must not overlap. Absent: braid all-reduces the
   * whole of send into a buffer of its own and copies out this rank's block, which
   * moves about twice the bytes. */
  int (*ireduce_scatter)(braid_comm_v1* comm, const void* send, void* recv, size_t recv_count, int32_t dtype,
                         int32_t op, braid_comm_request_v1** request);
} braid_comm_plugin_v1;

#define BRAID_COMM_PLUGIN_SYMBOL_V1 "braidCommPlugin_v1"

#ifdef __cplusplus
}
#endif

#endif /* BRAID_COMM_V1_H */
