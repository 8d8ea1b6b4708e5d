#include "core/cost/device.hpp"

#include <algorithm>
#include <cmath>

#include "core/common/error.hpp"

namespace braid::cost {

namespace {

// A [size, value] table interpolated in log(size), held flat beyond its ends: the GEMM
// efficiency by GFLOP, the element-wise bandwidth by MiB.
double interpolate(const std::vector<std::pair<double, double>>& table, double size) {
  if (size <= table.front().first) return table.front().second;
  if (size >= table.back().first) return table.back().second;
  for (std::size_t i = 1; i < table.size(); ++i) {
    if (size <= table[i].first) {
      double x0 = std::log(table[i - 1].first), x1 = std::log(table[i].first);
      double w = (std::log(size) - x0) / (x1 - x0);
      return table[i - 1].second + w * (table[i].second - table[i - 1].second);
    }
  }
  return table.back().second;
}

// `bytes` at the GB/s a [MiB, GB/s] table gives for their size.
double measured_seconds(const std::vector<std::pair<double, double>>& table, double bytes) {
  return bytes / (interpolate(table, bytes / (1024.0 * 1024.0)) * 1e9);
}

}  // namespace

DeviceModel::DeviceModel(const spec::ClusterSpec& cluster, spec::Precision precision, bool fp8)
    : cluster_(&cluster),
      peak_(cluster.peak_flops(precision)),
      element_bytes_(spec::bytes_per_element(precision)),
      fp8_(fp8) {
  if (fp8 && cluster.peak_flops_fp8 <= 0)
    throw Error(Status::bad_config, "cluster '" + cluster.name + "' gives no FP8 peak (device.peak_tflops.fp8)");
}

double DeviceModel::call(double seconds) const {
  return seconds > 0 ? std::max(seconds, cluster_->launch_seconds) : seconds;
}

double DeviceModel::gemm_efficiency(double flops) const { return interpolate(cluster_->efficiency.gemm, flops * 1e-9); }

double DeviceModel::fp8_gemm_efficiency(double flops) const {
  const auto& fp8 = cluster_->efficiency.gemm_fp8;
  return interpolate(fp8.empty() ? cluster_->efficiency.gemm : fp8, flops * 1e-9);
}

double DeviceModel::linear_gemm_seconds(double m, double n, double k) const {
  if (!fp8_) return gemm_seconds(m, n, k);
  if (m <= 0 || n <= 0 || k <= 0) return 0;
  // TransformerEngine runs fprop, dgrad and wgrad of a linear layer as FP8 GEMMs (E4M3
  // or E5M2 operands, one byte each) with higher-precision output
  // (docs.nvidia.com/deeplearning/transformer-engine, "Using FP8 with Transformer Engine").
  double flops = 2.0 * m * n * k;
  double compute = flops / (cluster_->peak_flops_fp8 * fp8_gemm_efficiency(flops));
  double bytes = m * k + k * n + element_bytes_ * m * n;
  return call(std::max(compute, stream_seconds(bytes)));
}

double DeviceModel::gemm_seconds(double m, double n, double k, double batch) const {
  if (m <= 0 || n <= 0 || k <= 0 || batch <= 0) return 0;
  double one = 2.0 * m * n * k;
  double compute = batch * one / (peak_ * gemm_efficiency(one));
  double bytes = batch * element_bytes_ * (m * k + k * n + m * n);
  return call(std::max(compute, stream_seconds(bytes)));
}

double DeviceModel::memory_seconds(double bytes) const {
  const auto& measured = cluster_->efficiency.elementwise;
  if (!measured.empty()) return call(measured_seconds(measured, bytes));
  return stream_seconds(bytes);
}

double DeviceModel::backward_memory_seconds(double bytes) const {
  const auto& measured = cluster_->efficiency.elementwise_backward;
  if (!measured.empty()) return call(measured_seconds(measured, bytes));
  return memory_seconds(bytes);
}

double DeviceModel::optimizer_memory_seconds(double bytes) const {
  const auto& measured = cluster_->efficiency.optimizer;
  if (!measured.empty()) return call(measured_seconds(measured, bytes));
  return memory_seconds(bytes);
}

double DeviceModel::stream_seconds(double bytes) const {
  return call(bytes / (cluster_->memory_bandwidth * cluster_->efficiency.memory));
}

double DeviceModel::streaming_seconds(double bytes) const {
  const auto& measured = cluster_->efficiency.streaming;
  if (!measured.empty()) return call(measured_seconds(measured, bytes));
  return stream_seconds(bytes);
}

double DeviceModel::flash_attention_seconds(double flops, bool backward, double heads) const {
  const auto& e = cluster_->efficiency;
  if (measured_attention())
    return call(flops /
                (peak_ * interpolate(backward ? e.attention_backward : e.attention_forward, flops / heads * 1e-9)));
  return call(flops / (peak_ * (backward ? e.flash_attention_backward : e.flash_attention_forward)));
}

bool DeviceModel::measured_attention() const {
  return !cluster_->efficiency.attention_forward.empty() && !cluster_->efficiency.attention_backward.empty();
}

}  // namespace braid::cost
