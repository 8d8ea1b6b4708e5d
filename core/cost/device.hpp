// Time of compute kernels on one device: a roofline per kernel, with the achieved
// efficiencies of the cluster file (GEMM efficiency depends on the GEMM's size).
#pragma once

#include "core/spec/cluster.hpp"

namespace braid::cost {

class DeviceModel {
 public:
  // `fp8`: the linear layers' GEMMs run in FP8 (TransformerEngine); the cluster must give an FP8 peak.
  DeviceModel(const spec::ClusterSpec& cluster, spec::Precision precision, bool fp8 = false);

  double peak_flops() const { return peak_; }
  double element_bytes() const { return element_bytes_; }
  bool fp8() const { return fp8_; }
  // Achieved fraction of peak for one GEMM of `flops`.
  double gemm_efficiency(double flops) const;
  // Same for an FP8 GEMM, as a fraction of the FP8 peak.
  double fp8_gemm_efficiency(double flops) const;
  // `batch` independent products C[m,n] = A[m,k] B[k,n]: max(compute time, memory time).
  double gemm_seconds(double m, double n, double k, double batch = 1) const;
  // A GEMM of a linear layer (weights x activations): FP8 in, output in the training
  // precision, when the run uses FP8; otherwise gemm_seconds.
  double linear_gemm_seconds(double m, double n, double k) const;
  // Element-wise kernels that move `bytes` through HBM: the cluster's measured element-wise
  // rates where it has them (`braid calibrate`), else memory bandwidth x efficiency.memory.
  double memory_seconds(double bytes) const;
  // The backward of such a kernel, charged `bytes` (twice its forward's): the cluster's
  // measured backward rates where it has them apart, else as memory_seconds.
  double backward_memory_seconds(double bytes) const;
  // An optimizer step that moves `bytes`: the cluster's measured optimizer rates where it has
  // them, else as memory_seconds.
  double optimizer_memory_seconds(double bytes) const;
  // Streaming `bytes` at memory bandwidth x efficiency.memory: a GEMM's memory roofline.
  // Like every price here, one call's, so at least device.launch_us.
  double stream_seconds(double bytes) const;
  // A contiguous stream's call (a residual add, a fill, a scaling) that moves `bytes`: the
  // cluster's measured streaming rates where it has them, else stream_seconds.
  double streaming_seconds(double bytes) const;
  // One call of a fused (flash) attention kernel doing `flops` over `heads` heads of every
  // sample (4 sq sk head_dim per head forward, 2.5x that backward): at the measured efficiency
  // for one head's size where the cluster has the attention tables (`braid calibrate`), else
  // at flash_attention_forward/backward.
  double flash_attention_seconds(double flops, bool backward, double heads = 1) const;
  // Whether the cluster times the attention op by size (efficiency.attention_forward/backward).
  bool measured_attention() const;

 private:
  // One kernel call of `seconds` of work: at least the cluster's launch (work that is none
  // stays free).
  double call(double seconds) const;

  const spec::ClusterSpec* cluster_;
  double peak_;
  double element_bytes_;
  bool fp8_;
};

}  // namespace braid::cost
