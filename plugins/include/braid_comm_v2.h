/*
 * braid_comm_v2.h: version 2 of the communication plugin interface, for backends that
 * move device memory on streams (NCCL). Frozen: a new version gets a new header and a new
 * exported symbol. Version 1 (braid_comm_v1.h) stays for host backends (MPI).
 *
 * A plugin is a shared library libbraid-<name>.so that exports
 *   const braid_comm_plugin_v2 braidCommPlugin_v2;
 * and nothing else. Every function pointer is set.
 *
 * What version 2 changes, against version 1's conventions (which hold otherwise: status
 * codes with last_error(), one thread, ownership of communicators and requests, buffers
 * untouched until their request completes):
 * - init takes a bootstrap: this process's place in the world and a broadcast among
 *   listed processes, over which the plugin agrees on what it needs (NCCL's unique id of
 *   each communicator). braid builds one over its MPI plugin, a host framework over its
 *   own process group, so the plugin never links MPI.
 * - every transfer and collective takes a stream (a cudaStream_t for NCCL; NULL: the
 *   device's default stream); its buffers are device memory of this process's device.
 * - wait and barrier take a deadline in seconds (<= 0: none). Past it the communicator is
 *   aborted (unusable afterwards: free it) and the error names the communicator's world
 *   ranks, the operation and what the backend can tell of the ranks that did not arrive
 *   (the peer's world rank, for a send or a receive). A backend that cannot cancel the
 *   operation (MPI) leaves it in flight: comm_free waits for the other ranks to complete
 *   it, and finalize fails, changing nothing, while one is still in flight (MPI cannot
 *   finalize cleanly under it); a process that cannot wait for its peers calls abort.
 * - Requests issued on a communicator stay valid after comm_free: each still completes, or
 *   fails, at its wait or test. (NCCL: sends and receives still queued, not yet issued as a
 *   group, are not issued by comm_free; they fail at their wait or test.)
 * - A call refused for its arguments (a NULL output pointer, a tag outside 0..32767 where the
 *   backend honours tags) posts nothing and releases nothing.
 * - Point to point matches by issue order, per pair of ranks (NCCL has no tags): the
 *   n-th send from a to b meets the n-th receive on b from a. Tags are accepted for
 *   symmetry with version 1 and ignored; sizes must match (NCCL does not check them).
 *   Sends and receives issued before the next wait, test, collective or barrier on the
 *   communicator run as one group, on one stream (another stream meanwhile is refused),
 *   so a rank may send to itself and exchange with peers in any order. A test may
 *   therefore issue that group, which can take as long as NCCL takes to accept it.
 * - Every process of a communicator takes part in its creation even when it cannot use
 *   it (no GPU): the others then fail at NCCL's init deadline instead of waiting forever.
 */
#ifndef BRAID_COMM_V2_H
#define BRAID_COMM_V2_H

#include <stddef.h>
#include <stdint.h>

#include "braid_comm_v1.h" /* dtypes (BRAID_COMM_FLOAT32...) and reductions (BRAID_COMM_SUM...) */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct braid_comm_v2 braid_comm_v2;                 /* a communicator (plugin-defined) */
typedef struct braid_comm_request_v2 braid_comm_request_v2; /* an operation in flight (plugin-defined) */

typedef struct braid_comm_bootstrap_v2 {
  size_t struct_size; /* sizeof(braid_comm_bootstrap_v2) */
  int32_t rank, size;
  int32_t local_rank, local_size; /* among the processes of this node */
  void* context;                  /* passed back to broadcast */
  /* world_ranks[0]'s `bytes` bytes at data copied into data on every listed process.
   * Called by exactly the `count` listed processes (world ranks, this one among them), in
   * the same order on each; returns 0, or non-zero on failure. */
  int (*broadcast)(void* context, const int32_t* world_ranks, int32_t count, void* data, size_t bytes);
} braid_comm_bootstrap_v2;

typedef struct braid_comm_plugin_v2 {
  uint32_t interface_version; /* 2 */
  const char* name;           /* "nccl" */

  const char* (*last_error)(void);      /* as version 1 */
  const char* (*backend_version)(void); /* "NCCL 2.28.3"; callable before init */

  /* Joins the world the bootstrap describes (it is copied; its context must stay valid
   * until finalize). The device is the node's local_rank-th (modulo the devices this
   * process sees: with one visible GPU per process, that one). */
  int (*init)(const braid_comm_bootstrap_v2* bootstrap);
  int (*finalize)(void);
  int (*world)(int32_t* rank, int32_t* size, int32_t* local_rank, int32_t* local_size);

  int (*comm_world)(braid_comm_v2** out);
  /* Collective over the listed world ranks only, as version 1. */
  int (*comm_create)(const int32_t* world_ranks, int32_t count, braid_comm_v2** out);
  int (*comm_free)(braid_comm_v2* comm);
  int (*comm_rank)(braid_comm_v2* comm, int32_t* rank);
  int (*comm_size)(braid_comm_v2* comm, int32_t* size);

  int (*isend)(braid_comm_v2* comm, const void* data, size_t bytes, int32_t peer, int32_t tag, void* stream,
               braid_comm_request_v2** request);
  int (*irecv)(braid_comm_v2* comm, void* data, size_t bytes, int32_t peer, int32_t tag, void* stream,
               braid_comm_request_v2** request);
  int (*iallreduce)(braid_comm_v2* comm, const void* send, void* recv, size_t count, int32_t dtype, int32_t op,
                    void* stream, braid_comm_request_v2** request);
  int (*iallgather)(braid_comm_v2* comm, const void* send, void* recv, size_t bytes, void* stream,
                    braid_comm_request_v2** request);
  int (*ibroadcast)(braid_comm_v2* comm, void* data, size_t bytes, int32_t root, void* stream,
                    braid_comm_request_v2** request);
  int (*ireduce_scatter)(braid_comm_v2* comm, const void* send, void* recv, size_t recv_count, int32_t dtype,
                         int32_t op, void* stream, braid_comm_request_v2** request);

  /* *done = 1 and the request released once the device has run it; never blocks. */
  int (*test)(braid_comm_request_v2* request, int32_t* done);
  /* Blocks until the request completes (the device ran it), at most timeout_s seconds
   * (<= 0: no deadline), then releases it. */
  int (*wait)(braid_comm_request_v2* request, double timeout_s);
  int (*barrier)(braid_comm_v2* comm, double timeout_s);
  /* Aborts every communicator of this process and ends it with `code`; the other
   * processes' operations with it then fail or meet their deadlines. Does not return. */
  void (*abort)(int32_t code);
} braid_comm_plugin_v2;

#define BRAID_COMM_PLUGIN_SYMBOL_V2 "braidCommPlugin_v2"

#ifdef __cplusplus
}
#endif

#endif /* BRAID_COMM_V2_H */
