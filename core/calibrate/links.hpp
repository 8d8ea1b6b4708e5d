// The links of the machine `braid calibrate` runs on, measured through the communication
// plugin (the same path the trainer's collectives take) and fitted to the cost model's
// alpha-beta formulas (cost::CommModel), so that the cluster file prices p2p, all-reduce
// and all-gather as measured.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/calibrate/measure.hpp"
#include "core/nn/device_backend.hpp"
#include "core/runtime/device_comm.hpp"
#include "core/runtime/world.hpp"
#include "core/spec/cluster.hpp"

namespace braid::calibrate {

enum class LinkOp { p2p, all_reduce, all_gather };

struct LinkTiming {
  LinkOp op = LinkOp::p2p;
  int members = 2;   // processes taking part
  double bytes = 0;  // the message (p2p), the reduced buffer or the gathered output
  double seconds = 0;
  // Seconds of GEMMs each member ran before it, as a trainer's gradient reduction follows its
  // backward (all-reduces only); 0: back to back with the others of its case.
  double after_compute = 0;
};

// Latency per step and bandwidth (bytes/s, efficiency included) of one kind of link.
struct LinkFit {
  double bandwidth = 0;
  double latency = 0;
  double reduce_bandwidth = 0;  // bytes/s of the all-reduce's summing; 0: none measurable
  int reduce_points = 0;        // all-reduces large enough to show it (bandwidth-bound)
  // What an all-reduce entered after compute adds to its price, by gap (spec::LinkSpec): per
  // gap timed, fixed + factor x price fitted to its sizes; empty when none were timed.
  std::vector<spec::LinkSpec::AfterCompute> after_compute;
  double worst_error = 0;  // largest max(model / measured, measured / model) - 1 over the points
  int points = 0;
};

// What the links are timed through: the world's communicators (the MPI plugin) on host
// memory, or, with `plugin`, a started device communication plugin (NCCL on GPUs) on the
// memory of `backend`, as the trainer's device collectives run.
struct LinkPath {
  const runtime::DeviceCommPlugin* plugin = nullptr;
  std::shared_ptr<nn::DeviceBackend> backend;
  // Whether training computes on the host's cores, where the all-reduces after compute are
  // timed (a device plugin comes only with a device that is not the host).
  bool compute_on_host = true;
  // Whether the all-reduces after compute are timed: compute on the host between host
  // collectives (between device collectives it would time neither as training does).
  bool times_after_compute() const { return compute_on_host && !plugin; }
};

// Ping-pong between world ranks `pair[0]` and `pair[1]`, then all-reduce and all-gather over
// `group` (world ranks, ascending), then (on host memory) all-reduces after a ladder of gaps
// of compute. Every process of the world calls it with the same arguments; those outside the
// pair or the group wait. Times are rank pair[0]'s (p2p: half a round trip), the slowest
// member's (collectives) and, after compute, the member that entered last's (the least time
// any member spent in it), valid on every process.
std::vector<LinkTiming> measure_links(runtime::World& world, const std::vector<int>& pair,
                                      const std::vector<int>& group, bool quick, const CaseHook& between,
                                      const LinkPath& path = {});
int link_case_count(bool quick, bool compute_on_host = true);

// The latency and bandwidth that make the cost model's formulas closest to `points` (least
// squares in log(time)): within a node when `cross_node` is false, else between nodes. The
// transfers (p2p, all-gather) fix latency and bandwidth; then the all-reduces, slower by
// their summing on a host, fix the reduce bandwidth (none when a reduction-free model
// fits them at least as well). The all-reduces timed after compute are left out of that and
// give `after_compute`.
LinkFit fit_link(const std::vector<LinkTiming>& points, bool cross_node);

const char* link_op_name(LinkOp op);

}  // namespace braid::calibrate
