// The machines: nodes of identical devices joined by an intra-node fabric (NVLink)
// and an inter-node network (InfiniBand/RoCE), plus the achieved-efficiency table
// that turns peak figures into time.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/spec/yaml_reader.hpp"

namespace braid::spec {

enum class Precision { fp32, fp16, bf16 };
const char* precision_name(Precision p);
double bytes_per_element(Precision p);

struct LinkSpec {
  double bandwidth = 0;   // bytes/s per device, one direction
  double latency = 0;     // seconds per message hop
  double efficiency = 1;  // achieved fraction of `bandwidth` for large collectives
  int nics_per_node = 0;  // inter-node only: independent network ports per node
  // Bytes/s at which a collective sums what it receives (all-reduce, reduce-scatter), as a
  // step of its own after the transfer (MPI on a host); 0: the reduction is hidden in
  // `bandwidth` (NCCL's bus bandwidth on GPUs).
  double reduce_bandwidth = 0;
  // How much longer an all-reduce takes when a process enters it after a stretch of compute
  // than when it runs back to back with others (`braid calibrate` on a host: after 17 ms of
  // GEMMs a 2 MiB all-reduce took 2.5x, a 4 KiB one 7x its back-to-back time): rows by
  // increasing gap, each adding fixed + factor x the priced time; interpolated in the gap,
  // from nothing at gap 0, held past the last row. Empty: no such slowdown.
  struct AfterCompute {
    double gap = 0;     // seconds of compute since the process last communicated
    double fixed = 0;   // seconds added to every all-reduce
    double factor = 0;  // ... and this fraction of its priced time
  };
  std::vector<AfterCompute> after_compute = {};
  // `seconds`, an all-reduce's priced time, entered after `gap` seconds of compute.
  double after_compute_seconds(double seconds, double gap) const;
};

struct EfficiencyTable {
  // Achieved fraction of peak for one GEMM, by its size in GFLOP; interpolated in log(size).
  std::vector<std::pair<double, double>> gemm;
  // Same for an FP8 GEMM (TransformerEngine), as a fraction of the FP8 peak; empty: `gemm`.
  std::vector<std::pair<double, double>> gemm_fp8;
  double memory = 0.8;  // achieved fraction of HBM bandwidth for elementwise kernels
  // Achieved bandwidth (GB/s) of an element-wise kernel call by the MiB it moves (as the cost
  // model counts them; a backward call looks up its own, doubled, size), interpolated in
  // log(size), as `braid calibrate` measures it (caches make small kernels faster than
  // memory); when given, it prices element-wise kernels instead of `memory`.
  std::vector<std::pair<double, double>> elementwise;
  // The same for backward calls, when measured apart (`braid calibrate`): on a CPU a norm's or
  // an activation's backward takes about 1.2x its forward, not the 2x its bytes say, so one
  // table for both overprices backwards and underprices forwards, and a pipeline's critical
  // path (forwards to the last stage) with them. Empty: `elementwise` prices both.
  std::vector<std::pair<double, double>> elementwise_backward;
  // The optimizer step's achieved GB/s by the MiB it moves (weights, gradients and moments,
  // read and written), when measured: AdamW's square root and division bound it on a host,
  // between a norm's rate and a stream's. Empty: priced as an element-wise kernel.
  std::vector<std::pair<double, double>> optimizer;
  // A contiguous stream's achieved GB/s by the MiB it moves, when measured (`braid calibrate`
  // times the residual add): residual adds, fills and scalings. Small calls run in the caches,
  // far above the triad's rate on a host, down to a per-call cost at the smallest (a kernel
  // launch on a GPU). Empty: the triad's rate (memory_bandwidth x memory), which GEMMs' memory
  // roofline, rows gathered or scattered and squared norms keep either way.
  std::vector<std::pair<double, double>> streaming;
  double flash_attention_forward = 0.6;  // fused attention kernels, fraction of peak
  double flash_attention_backward = 0.5;
  // The attention op braid runs (core/nn: the host's softmax attention with its probabilities
  // materialised, or a GPU's kernel), as `braid calibrate` times it: [GFLOP of one head of one
  // sample, counted as fused kernels count them, fraction of peak], interpolated in log(size).
  // The host op runs head by head, so its efficiency follows one head's size (small heads are
  // bound by the softmax's exponentials and per-call costs: one figure for all priced some
  // 1.5x short); on a GPU the count of heads filling the device is not in it. When given, they
  // price the fused kernels of `attention: flash` runs and the attention core of braid's own
  // blocks (`braid train`) in place of the flash_attention_* figures.
  std::vector<std::pair<double, double>> attention_forward, attention_backward;
};

// What a host core takes to make one sample of braid's dataset (core/data/shapes.hpp): a
// rendered one (the image tower's ranks) costs sample_s + pixel_s per pixel, a described one
// (sides, caption, tokens) describe_s. 0: not measured (the simulator then prices data at
// nothing, as on GPU servers, whose data workers have cores to spare).
struct SampleRates {
  double render_sample_s = 0, render_pixel_s = 0, describe_sample_s = 0;
};

// The GEMM case `braid calibrate` timed for braid train to time again before its first step
// and after its last (calibrate/probe.hpp): the linear op of rows x width activations through a
// width x width weight, seconds the slowest process took. 0 seconds: none (a nominal file).
struct HostProbe {
  std::int64_t rows = 0, width = 0;
  double seconds = 0;
};

struct ClusterSpec {
  std::string name;
  std::string source;
  int nodes = 1;
  int devices_per_node = 8;
  std::string device_name;
  double memory_bytes = 0;      // per device
  double memory_bandwidth = 0;  // bytes/s
  double peak_flops_fp32 = 0, peak_flops_fp16 = 0, peak_flops_bf16 = 0;
  double peak_flops_fp8 = 0;         // dense FP8 tensor-core peak; 0 where the device has none
  double reserved_memory_bytes = 0;  // runtime context, communicator buffers, fragmentation
  // The least time one kernel call takes (device.launch_us): its launch, where a GPU's ops
  // are too small to cover it. Every op call the cost model prices takes at least this.
  // 0 (bundled files): none, as the published tables price large layers.
  double launch_seconds = 0;
  LinkSpec intra_node;
  LinkSpec inter_node;
  EfficiencyTable efficiency;
  // Devices that are processes on their node's CPU cores (`braid calibrate` records them):
  // while more threads compute on a node than it has cores, a kernel runs at efficiency x
  // cores / busy threads of its speed; and with no core left over for the data workers, the
  // step's samples are made in the step's time. 0: every device computes on units of its own
  // (GPUs) and its host has cores to spare.
  int cores_per_node = 0;
  int threads_per_device = 1;
  double shared_core_efficiency = 1;  // of the cores' time, when more threads than cores compute
  SampleRates data;
  HostProbe probe;

  int devices() const { return nodes * devices_per_node; }
  // Whether a node's processes leave a core for the threads that render the next steps'
  // samples (braid train's data workers): false when their threads hold every core.
  bool spare_core_for_data() const {
    return cores_per_node <= 0 || devices_per_node * threads_per_device < cores_per_node;
  }
  double peak_flops(Precision p) const;
};

ClusterSpec parse_cluster(const Node& root);
// Reads a cluster file (configs/clusters/*.yaml, or one `braid calibrate` wrote).
ClusterSpec load_cluster(const std::string& path);

}  // namespace braid::spec
