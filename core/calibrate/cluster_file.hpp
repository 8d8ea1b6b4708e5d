// What `braid calibrate` measured, turned into the figures of a cluster file (the format of
// configs/clusters/*.yaml) that the planner, the simulator and `braid train` read: the
// cost model's own parameters fitted to the machine it ran on.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/calibrate/links.hpp"
#include "core/calibrate/measure.hpp"
#include "core/calibrate/probe.hpp"

namespace braid::calibrate {

struct Calibration {
  // Where and when.
  std::string host, cpu, when_utc, communication;
  int processes = 1, nodes = 1, per_node = 1, threads = 1;
  int cores = 1;        // hardware threads of a host
  int per_turn = 1;     // processes of a host measuring compute at once (per_node, or fewer on shared cores)
  bool shared = false;  // some host had more processes x threads than cores: compute was measured in turns
  bool quick = false;
  double memory_per_process_bytes = 0;  // the host's RAM shared by the processes on it
  std::string library = "OpenBLAS";     // what computed the GEMMs ("cuBLAS" on a GPU)
  double device_memory_bytes = 0;       // a GPU's memory when the compute ran on one, else 0
  double reserved_bytes = 0;            // resident before any tensor: runtime, MPI, BLAS buffers
  // Raw timings: compute, the mean over the processes (all measuring at once); links, the
  // slowest member's.
  std::vector<Timing> gemms, elementwise, attention;
  // On shared cores (per_turn < per_node): the GEMM ladder again, every process at once.
  std::vector<Timing> crowded_gemms;
  Timing memory;
  std::vector<Timing> samples;           // braid's dataset on one core: rendered by side, described
  std::vector<LinkTiming> intra, inter;  // inter: empty on one host
  ProbeShape probe_shape;                // the host probe braid train repeats (probe.hpp)
  double probe_seconds = 0;              // its time, the slowest process's; 0: not measured
};

// The cost-model figures derived from the timings.
struct Fitted {
  double peak_flops = 0;                                        // the best GEMM rate measured
  std::vector<std::pair<double, double>> gemm;                  // [gflop of one GEMM, fraction of peak]
  double memory_bandwidth = 0;                                  // bytes/s
  std::vector<std::pair<double, double>> elementwise;           // forward calls: [MiB moved, GB/s]
  std::vector<std::pair<double, double>> elementwise_backward;  // backward calls, the same
  std::vector<std::pair<double, double>> optimizer;             // AdamW steps: [MiB moved, GB/s]
  std::vector<std::pair<double, double>> streaming;             // residual adds: [MiB moved, GB/s]
  // The least time one kernel call took: the quickest residual add (device.launch_us).
  double launch_seconds = 0;
  // braid's attention op: [gflop of one head of one sample (fused kernels' count), fraction of peak]
  std::vector<std::pair<double, double>> attention_forward, attention_backward;
  LinkFit intra;
  std::optional<LinkFit> inter;
  // Shared cores: the share of its cores' time a host turns into work when every process
  // computes at once (1 / the median of crowded time over turn time x oversubscription).
  double shared_core_efficiency = 1;
  // One sample of braid's dataset on a host core: rendered, render_sample_s + render_pixel_s per
  // pixel (least squares over the sides); described, describe_sample_s.
  double render_sample_s = 0, render_pixel_s = 0, describe_sample_s = 0;
};

Fitted fit(const Calibration& c);
// The cluster file: figures with comments saying what was measured, when and on what.
std::string cluster_yaml(const Calibration& c, const Fitted& f, const std::string& name);
// Every timing and fitted figure, for --format json.
nlohmann::ordered_json to_json(const Calibration& c, const Fitted& f);
// A short human summary of the fitted figures.
std::string summary(const Calibration& c, const Fitted& f);

}  // namespace braid::calibrate
