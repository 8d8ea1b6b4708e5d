#include "core/spec/cluster.hpp"

#include <algorithm>

namespace braid::spec {

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::fp32:
      return "fp32";
    case Precision::fp16:
      return "fp16";
    case Precision::bf16:
      return "bf16";
  }
  return "?";
}

double bytes_per_element(Precision p) { return p == Precision::fp32 ? 4.0 : 2.0; }

double ClusterSpec::peak_flops(Precision p) const {
  switch (p) {
    case Precision::fp32:
      return peak_flops_fp32;
    case Precision::fp16:
      return peak_flops_fp16;
    case Precision::bf16:
      return peak_flops_bf16;
  }
  return 0;
}

double LinkSpec::after_compute_seconds(double seconds, double gap) const {
  if (after_compute.empty() || gap <= 0 || seconds <= 0) return seconds;
  // Linear in the gap between rows; from nothing at gap 0 to the first row; the last row held.
  auto hi = std::lower_bound(after_compute.begin(), after_compute.end(), gap,
                             [](const AfterCompute& r, double g) { return r.gap < g; });
  double fixed = 0, factor = 0;
  if (hi == after_compute.end()) {
    fixed = after_compute.back().fixed;
    factor = after_compute.back().factor;
  } else {
    const AfterCompute lo = hi == after_compute.begin() ? AfterCompute{} : *(hi - 1);
    const double w = (gap - lo.gap) / (hi->gap - lo.gap);
    fixed = lo.fixed + w * (hi->fixed - lo.fixed);
    factor = lo.factor + w * (hi->factor - lo.factor);
  }
  return seconds + fixed + factor * seconds;
}

namespace {

constexpr double kGB = 1e9;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

LinkSpec parse_link(const Node& n, bool inter) {
  if (inter) {
    n.expect_keys({"bandwidth_gbs", "latency_us", "efficiency", "nics_per_node", "reduce_gbs", "after_compute"});
  } else {
    n.expect_keys({"bandwidth_gbs", "latency_us", "efficiency", "reduce_gbs", "after_compute"});
  }
  LinkSpec link;
  link.bandwidth = n.at("bandwidth_gbs").as_positive() * kGB;
  link.latency = n.at("latency_us").as_double() * 1e-6;
  if (link.latency < 0) n.at("latency_us").fail("must not be negative");
  if (auto e = n.find("efficiency")) link.efficiency = e->as_fraction();
  if (inter) link.nics_per_node = static_cast<int>(n.at("nics_per_node").as_int_at_least(1));
  if (auto r = n.find("reduce_gbs")) link.reduce_bandwidth = r->as_positive() * kGB;
  if (auto a = n.find("after_compute")) {
    for (const auto& row : a->items()) {
      auto cells = row.items();
      if (cells.size() != 3) row.fail("each after_compute row is [gap ms, fixed us, factor]");
      LinkSpec::AfterCompute r{cells[0].as_positive() * 1e-3, cells[1].as_double() * 1e-6, cells[2].as_double()};
      if (r.fixed < 0) cells[1].fail("must not be negative");
      if (r.factor < 0) cells[2].fail("must not be negative");
      if (!link.after_compute.empty() && r.gap <= link.after_compute.back().gap)
        cells[0].fail("after_compute rows must be sorted by increasing gap");
      link.after_compute.push_back(r);
    }
    if (link.after_compute.empty()) a->fail("needs at least one [gap ms, fixed us, factor] row");
  }
  return link;
}

// What one kind of [size, value] table holds, for its messages.
struct TableKind {
  const char* size;    // "gflop", "MiB"
  const char* row;     // "[gflop, fraction of peak]"
  const char* short_;  // "[gflop, fraction]"
  bool fraction;       // values are fractions of a peak (else positive rates)
};
constexpr TableKind kGemmTable{"gflop", "[gflop, fraction of peak]", "[gflop, fraction]", true};
constexpr TableKind kElementwiseTable{"MiB", "[MiB moved, GB/s achieved]", "[MiB, GB/s]", false};

// A [size, value] table (GEMM efficiency by GFLOP, element-wise rate by MiB): rows by increasing size.
std::vector<std::pair<double, double>> parse_table(const Node& n, const std::string& key, const TableKind& kind) {
  std::vector<std::pair<double, double>> table;
  for (const auto& row : n.items()) {
    auto cells = row.items();
    if (cells.size() != 2) row.fail("each " + key + " row is " + kind.row);
    double size = cells[0].as_positive();
    double value = kind.fraction ? cells[1].as_fraction() : cells[1].as_positive();
    if (!table.empty() && size <= table.back().first) {
      cells[0].fail(key + " rows must be sorted by increasing " + kind.size);
    }
    table.emplace_back(size, value);
  }
  if (table.empty()) n.fail(std::string("needs at least one ") + kind.short_ + " row");
  return table;
}

EfficiencyTable parse_efficiency(const Node& n) {
  n.expect_keys({"gemm", "gemm_fp8", "memory", "elementwise", "elementwise_backward", "optimizer", "streaming",
                 "flash_attention_forward", "flash_attention_backward", "attention_forward", "attention_backward"});
  EfficiencyTable t;
  t.gemm = parse_table(n.at("gemm"), "gemm", kGemmTable);
  if (auto f = n.find("gemm_fp8")) t.gemm_fp8 = parse_table(*f, "gemm_fp8", kGemmTable);
  if (auto m = n.find("memory")) t.memory = m->as_fraction();
  if (auto e = n.find("elementwise")) t.elementwise = parse_table(*e, "elementwise", kElementwiseTable);
  if (auto e = n.find("elementwise_backward"))
    t.elementwise_backward = parse_table(*e, "elementwise_backward", kElementwiseTable);
  if (auto e = n.find("optimizer")) t.optimizer = parse_table(*e, "optimizer", kElementwiseTable);
  if (auto e = n.find("streaming")) t.streaming = parse_table(*e, "streaming", kElementwiseTable);
  if (auto f = n.find("flash_attention_forward")) t.flash_attention_forward = f->as_fraction();
  if (auto b = n.find("flash_attention_backward")) t.flash_attention_backward = b->as_fraction();
  if (auto f = n.find("attention_forward")) t.attention_forward = parse_table(*f, "attention_forward", kGemmTable);
  if (auto b = n.find("attention_backward")) t.attention_backward = parse_table(*b, "attention_backward", kGemmTable);
  // The measured attention prices both passes or neither (DeviceModel::measured_attention).
  if (t.attention_forward.empty() != t.attention_backward.empty()) {
    const char* given = t.attention_forward.empty() ? "attention_backward" : "attention_forward";
    const char* missing = t.attention_forward.empty() ? "attention_forward" : "attention_backward";
    n.at(given).fail(std::string("needs ") + missing + " too: the measured attention prices both passes or neither");
  }
  return t;
}

}  // namespace

ClusterSpec parse_cluster(const Node& root) {
  root.expect_keys({"name", "description", "nodes", "devices_per_node", "device", "links", "efficiency",
                    "memory_reserved_gib", "shared_cores", "data", "probe"});
  ClusterSpec c;
  c.source = root.source();
  c.name = root.at("name").as_string();
  if (auto n = root.find("nodes")) c.nodes = static_cast<int>(n->as_int_at_least(1));
  c.devices_per_node = static_cast<int>(root.at("devices_per_node").as_int_at_least(1));

  const Node dev = root.at("device");
  dev.expect_keys({"name", "memory_gib", "memory_bandwidth_gbs", "peak_tflops", "launch_us"});
  c.device_name = dev.at("name").as_string();
  c.memory_bytes = dev.at("memory_gib").as_positive() * kGiB;
  c.memory_bandwidth = dev.at("memory_bandwidth_gbs").as_positive() * kGB;
  const Node peak = dev.at("peak_tflops");
  peak.expect_keys({"fp32", "fp16", "bf16", "fp8"});
  c.peak_flops_fp32 = peak.at("fp32").as_positive() * 1e12;
  c.peak_flops_fp16 = peak.at("fp16").as_positive() * 1e12;
  c.peak_flops_bf16 = peak.at("bf16").as_positive() * 1e12;
  if (auto f = peak.find("fp8")) c.peak_flops_fp8 = f->as_positive() * 1e12;
  if (auto l = dev.find("launch_us")) {
    c.launch_seconds = l->as_double() * 1e-6;
    if (c.launch_seconds < 0) l->fail("must not be negative");
  }

  const Node links = root.at("links");
  links.expect_keys({"intra_node", "inter_node"});
  c.intra_node = parse_link(links.at("intra_node"), false);
  c.inter_node = parse_link(links.at("inter_node"), true);
  c.efficiency = parse_efficiency(root.at("efficiency"));
  if (auto r = root.find("memory_reserved_gib")) {
    double v = r->as_double();
    if (v < 0) r->fail("must not be negative");
    c.reserved_memory_bytes = v * kGiB;
    if (c.reserved_memory_bytes >= c.memory_bytes) r->fail("reserves all of the device memory");
  }
  if (auto shared = root.find("shared_cores")) {
    shared->expect_keys({"cores_per_node", "threads_per_device", "efficiency"});
    c.cores_per_node = static_cast<int>(shared->at("cores_per_node").as_int_at_least(1));
    if (auto t = shared->find("threads_per_device")) c.threads_per_device = static_cast<int>(t->as_int_at_least(1));
    if (auto e = shared->find("efficiency")) c.shared_core_efficiency = e->as_fraction();
  }
  if (auto data = root.find("data")) {
    data->expect_keys({"render_sample_us", "render_pixel_ns", "describe_sample_us"});
    const auto at_least_zero = [&](const char* key, double unit) {
      const auto v = data->find(key);
      if (!v) return 0.0;
      const double x = v->as_double();
      if (!(x >= 0)) v->fail("must not be negative");
      return x * unit;
    };
    c.data.render_sample_s = at_least_zero("render_sample_us", 1e-6);
    c.data.render_pixel_s = at_least_zero("render_pixel_ns", 1e-9);
    c.data.describe_sample_s = at_least_zero("describe_sample_us", 1e-6);
  }
  if (auto probe = root.find("probe")) {
    probe->expect_keys({"rows", "width", "seconds"});
    c.probe.rows = probe->at("rows").as_int_at_least(1);
    c.probe.width = probe->at("width").as_int_at_least(1);
    // braid train allocates the case twice a run: a GEMM of a few MiB, as calibrate times it.
    constexpr std::int64_t kMostProbeFloats = std::int64_t{1} << 26;  // 256 MiB of activations or weight
    if (c.probe.rows > kMostProbeFloats / c.probe.width)
      probe->at("rows").fail("rows x width is past 2^26 floats (" + std::to_string(c.probe.rows) + " x " +
                             std::to_string(c.probe.width) + "); braid calibrate writes a case of a few MiB");
    if (c.probe.width > kMostProbeFloats / c.probe.width)
      probe->at("width").fail("a " + std::to_string(c.probe.width) + " x " + std::to_string(c.probe.width) +
                              " weight is past 2^26 floats; braid calibrate writes a case of a few MiB");
    c.probe.seconds = probe->at("seconds").as_positive();
  }
  return c;
}

ClusterSpec load_cluster(const std::string& path) { return parse_cluster(load_document(path)); }

}  // namespace braid::spec
