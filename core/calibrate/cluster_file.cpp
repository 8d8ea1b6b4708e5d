#include "core/calibrate/cluster_file.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <tuple>

#include "core/common/text.hpp"

namespace braid::calibrate {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGiB = 1024.0 * kMiB;

// Four significant digits, the way a person writes a measured figure.
std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

// Rows of [size, value] by increasing size, points of equal size averaged.
std::vector<std::pair<double, double>> table(const std::vector<std::pair<double, double>>& points) {
  std::map<double, std::pair<double, int>> by_size;
  for (const auto& [size, value] : points) {
    auto& cell = by_size[size];
    cell.first += value;
    ++cell.second;
  }
  std::vector<std::pair<double, double>> rows;
  for (const auto& [size, cell] : by_size) rows.emplace_back(size, cell.first / cell.second);
  return rows;
}

// A YAML double-quoted scalar: names and CPU strings may hold ':' or '#', and a name given
// on the command line any control character (escaped, or a line break would read as a space).
std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (char ch : text) {
    const auto byte = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (byte < 0x20 || byte == 0x7f) {
      char escape[8];
      std::snprintf(escape, sizeof escape, "\\x%02x", byte);
      out += escape;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string rows_yaml(const std::vector<std::pair<double, double>>& rows, const std::string& indent) {
  std::string out;
  for (const auto& [size, value] : rows) out += indent + "- [" + num(size) + ", " + num(value) + "]\n";
  return out;
}

// [[gap s, fixed s, factor]] of a link's all-reduces after compute.
nlohmann::ordered_json after_compute_json(const LinkFit& f) {
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const auto& r : f.after_compute) rows.push_back({r.gap, r.fixed, r.factor});
  return rows;
}

// The all-reduce's summing as the summary line reports it.
std::string summing(const LinkFit& f) {
  if (f.reduce_bandwidth > 0)
    return ", all-reduce sums at " + num(f.reduce_bandwidth / 1e9) + " GB/s (fitted on " +
           std::to_string(f.reduce_points) + (f.reduce_points == 1 ? " all-reduce)" : " all-reduces)");
  if (f.points > 0 && f.reduce_points == 0) return ", all-reduce's summing not measured (no all-reduce large enough)";
  return "";
}

std::string link_yaml(const LinkFit& f, bool inter, const std::string& what) {
  std::string out = "    # " + what + "\n";
  out += "    bandwidth_gbs: " + num(f.bandwidth / 1e9) + "\n";
  out += "    efficiency: 1           # the fitted bandwidth is the achieved one\n";
  out += "    latency_us: " + num(f.latency * 1e6) + "\n";
  if (f.reduce_bandwidth > 0)
    out += "    reduce_gbs: " + num(f.reduce_bandwidth / 1e9) + "      # all-reduce's summing after its transfer\n";
  else if (f.points > 0 && f.reduce_points == 0)
    out += "    # reduce_gbs: not measured, no all-reduce was large enough to show a summing\n";
  if (inter) out += "    nics_per_node: 1        # not measurable from here: one port per node assumed\n";
  if (!f.after_compute.empty()) {
    out += "    # An all-reduce entered after a gap of compute (GEMMs), as a gradient reduction follows\n";
    out += "    # its backward, took its price + fixed + factor x its price: [gap ms, fixed us, factor].\n";
    out += "    after_compute:\n";
    for (const auto& r : f.after_compute)
      out += "      - [" + num(r.gap * 1e3) + ", " + num(r.fixed * 1e6) + ", " + num(r.factor) + "]\n";
  }
  return out;
}

// Seconds = a + b x pixels over the render cases, least squares; through the origin when the
// line would cross it below zero (a fixed cost cannot be negative).
std::pair<double, double> render_line(const std::vector<Timing>& cases) {
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& t : cases) {
    n += 1;
    sx += t.work;
    sy += t.seconds;
    sxx += t.work * t.work;
    sxy += t.work * t.seconds;
  }
  if (n == 0 || sxx <= 0) return {0, 0};
  const double det = n * sxx - sx * sx;
  const double b = det > 0 ? (n * sxy - sx * sy) / det : 0, a = (sy - b * sx) / n;
  if (det > 0 && a >= 0 && b >= 0) return {a, b};
  return {0, sxy / sxx};
}

bool is_backward(const Timing& t) { return t.what.find("backward") != std::string::npos; }
bool begins(const Timing& t, const char* prefix) { return t.what.rfind(prefix, 0) == 0; }

}  // namespace

Fitted fit(const Calibration& c) {
  Fitted f;
  for (const auto& t : c.gemms) f.peak_flops = std::max(f.peak_flops, t.work / t.seconds);
  std::vector<std::pair<double, double>> gemm;
  // Each case is a linear layer's forward and backward: three GEMMs of work / 3.
  for (const auto& t : c.gemms) gemm.emplace_back(t.work / 3 * 1e-9, t.work / t.seconds / f.peak_flops);
  f.gemm = table(gemm);
  f.memory_bandwidth = c.memory.work / c.memory.seconds;
  std::vector<std::pair<double, double>> elementwise, elementwise_backward, optimizer, streaming;
  // Each case is layer norm and GELU over arrays of n floats, one way: work is 16 n bytes
  // forward (a call moves 8 n of them, the size the cost model looks it up at), 32 n backward
  // (a call charged 16 n): half the work either way.
  // The optimizer's and the add's cases: the bytes of one call.
  for (const auto& t : c.elementwise) {
    if (begins(t, kOptimizerStep))
      optimizer.emplace_back(t.work / kMiB, t.work / t.seconds / 1e9);
    else if (begins(t, kStreamingAdd)) {
      streaming.emplace_back(t.work / kMiB, t.work / t.seconds / 1e9);
      if (f.launch_seconds == 0 || t.seconds < f.launch_seconds) f.launch_seconds = t.seconds;
    } else if (begins(t, kElementwiseBackward))
      elementwise_backward.emplace_back(t.work / 2 / kMiB, t.work / t.seconds / 1e9);
    else if (begins(t, kElementwiseForward))
      elementwise.emplace_back(t.work / 2 / kMiB, t.work / t.seconds / 1e9);
  }
  f.optimizer = table(optimizer);
  f.streaming = table(streaming);
  f.elementwise = table(elementwise);
  f.elementwise_backward = table(elementwise_backward);
  std::vector<std::pair<double, double>> forward, backward;
  for (const auto& t : c.attention)
    (is_backward(t) ? backward : forward).emplace_back(t.work * 1e-9, std::min(1.0, t.work / t.seconds / f.peak_flops));
  f.attention_forward = table(forward);
  f.attention_backward = table(backward);
  std::vector<Timing> rendered;
  for (const auto& t : c.samples) {
    if (begins(t, kRenderSample)) rendered.push_back(t);
    if (begins(t, kDescribeSample)) f.describe_sample_s = t.seconds;
  }
  std::tie(f.render_sample_s, f.render_pixel_s) = render_line(rendered);
  f.intra = fit_link(c.intra, false);
  if (!c.inter.empty()) f.inter = fit_link(c.inter, true);
  if (!c.crowded_gemms.empty() && c.crowded_gemms.size() == c.gemms.size()) {
    const double oversubscribed = double(c.per_node) * c.threads / c.cores;
    std::vector<double> slower;
    for (std::size_t i = 0; i < c.gemms.size(); ++i)
      slower.push_back(c.crowded_gemms[i].seconds / (c.gemms[i].seconds * oversubscribed));
    f.shared_core_efficiency = std::clamp(1 / median(slower), 0.05, 1.0);
  }
  return f;
}

std::string cluster_yaml(const Calibration& c, const Fitted& f, const std::string& name) {
  std::string y;
  y += "# Measured by `braid calibrate` on " + c.host + " at " + c.when_utc + ":\n";
  y += "# " + std::to_string(c.processes) + " process(es) on " + std::to_string(c.nodes) + " host(s) (" +
       std::to_string(c.per_node) + " per host), " + std::to_string(c.threads) + " thread(s) each, " +
       (!c.shared ? std::string("all measuring at once")
                  : "measuring compute " + std::to_string(c.per_turn) + " at a time per host (" +
                        std::to_string(c.cores) + " cores)") +
       ";\n";
  y += "# CPU: " + c.cpu + "; communication: " + c.communication + ".\n";
  const bool gpu = c.device_memory_bytes > 0;
  y += std::string("# Every figure is the cost model's own parameter fitted to timings of braid's ") +
       (gpu ? "ops on the GPU (its CUDA backend)" : "host ops (core/nn)") + "\n";
  y += "# and of its communication plugin on this machine" + std::string(c.quick ? " (--quick: short ladders)" : "") +
       "; `braid calibrate --format json` lists the timings.\n";
  y += "name: " + quoted(name) + "\n";
  y += "nodes: " + std::to_string(c.nodes) + "\n";
  y += "devices_per_node: " + std::to_string(c.per_node) + "\n";
  y += "device:\n";
  y += "  name: " + quoted(c.cpu + ", one process (float32, " + c.library + ")") + "\n";
  y += gpu ? "  # The GPU's memory (its share where processes share a GPU).\n"
           : "  # The host's RAM shared by the processes on it.\n";
  y += "  memory_gib: " + num((gpu ? c.device_memory_bytes : c.memory_per_process_bytes) / kGiB) + "\n";
  y += (gpu ? "  # A device-to-device copy of " + std::string(c.quick ? "64 MiB" : "1 GiB") + ", "
            : "  # STREAM-style triad over arrays far larger than the caches, ") +
       std::string(!c.shared ? "every process at once" : "as many processes at once as cores") + ".\n";
  y += "  memory_bandwidth_gbs: " + num(f.memory_bandwidth / 1e9) + "\n";
  y += "  # The best rate of the linear op's GEMMs below (the host ops compute in float32 at any\n";
  y += "  # precision, so every precision gets the float32 figure).\n";
  const std::string peak = num(f.peak_flops / 1e12);
  y += "  peak_tflops: {fp32: " + peak + ", fp16: " + peak + ", bf16: " + peak + "}\n";
  if (f.launch_seconds > 0) {
    y += "  # The quickest call of one kernel (the residual add below): every op call is priced at\n";
    y += "  # least this, where the tables would price it below their smallest case.\n";
    y += "  launch_us: " + num(f.launch_seconds * 1e6) + "\n";
  }
  y += "links:\n";
  y += "  intra_node:\n";
  y +=
      link_yaml(f.intra, false,
                c.per_node == 1 ? "Not measured (one process per host): the fit between hosts below."
                                : "Alpha-beta fit (least squares in log time) of p2p ping-pong and all-gather between\n"
                                  "    # processes on one host, then of all-reduce's summing; worst point off by " +
                                      num(100 * f.intra.worst_error) + "%.");
  y += "  inter_node:\n";
  if (f.inter) {
    y += link_yaml(*f.inter, true,
                   "The same fit between hosts; worst point off by " + num(100 * f.inter->worst_error) + "%.");
  } else {
    y += link_yaml(f.intra, true, "Not measured (one host): the intra-host figures.");
  }
  y += "efficiency:\n";
  y += "  # Linear op forward + backward (three GEMMs) at a ladder of shapes: [GFLOP of one GEMM,\n";
  y += "  # fraction of peak_tflops].\n";
  y += "  gemm:\n" + rows_yaml(f.gemm, "    ");
  y += "  # Layer norm and GELU forward: [MiB of one kernel call, GB/s of the bytes the cost model\n";
  y += "  # charges them]; then their backward (a call charged twice its forward's).\n";
  y += "  elementwise:\n" + rows_yaml(f.elementwise, "    ");
  y += "  elementwise_backward:\n" + rows_yaml(f.elementwise_backward, "    ");
  y += "  # AdamW's step: [MiB of weights, gradients and moments it reads and writes, GB/s].\n";
  y += "  optimizer:\n" + rows_yaml(f.optimizer, "    ");
  if (!f.streaming.empty()) {
    y += "  # The residual add: [MiB of the two arrays it reads and the one it writes, GB/s]; it\n";
    y += "  # prices the contiguous streams (residual adds, fills, scalings).\n";
    y += "  streaming:\n" + rows_yaml(f.streaming, "    ");
  }
  y += "  # The triad's own rate: GEMMs stream their operands at it (the memory roofline), as do\n";
  y += "  # rows gathered or scattered and squared norms.\n";
  y += "  memory: 1\n";
  y += "  # braid's attention op (" + std::string(gpu ? "the GPU's" : "the host's, its probabilities materialised") +
       ") at a ladder of shapes, forward\n";
  y += "  # and backward, each call's time over its heads x samples: [GFLOP of one head of one sample\n";
  y += "  # as fused kernels count them (4 x sequence^2 x head width forward, 2.5x that backward),\n";
  y += "  # fraction of peak_tflops]. They price braid train's attention and runs that ask for\n";
  y += "  # `attention: flash`.\n";
  y += "  attention_forward:\n" + rows_yaml(f.attention_forward, "    ");
  y += "  attention_backward:\n" + rows_yaml(f.attention_backward, "    ");
  if (!c.samples.empty()) {
    y += "# braid's dataset on one core (braid train's data workers): a sample rendered costs\n";
    y += "# render_sample_us + render_pixel_ns per pixel (least squares over sides of ";
    std::string sides;
    for (const auto& t : c.samples)
      if (begins(t, kRenderSample)) sides += (sides.empty() ? "" : ", ") + num(std::sqrt(t.work));
    y += sides + " px),\n# one described (no image) describe_sample_us. Priced in the step when no core is left for\n";
    y += std::string("# the workers") + (!gpu || c.shared ? " (cores_per_node below)" : "") +
         " or braid train runs none.\n";
    y += "data:\n";
    y += "  render_sample_us: " + num(f.render_sample_s * 1e6) + "\n";
    y += "  render_pixel_ns: " + num(f.render_pixel_s * 1e9) + "\n";
    y += "  describe_sample_us: " + num(f.describe_sample_s * 1e6) + "\n";
  }
  if (c.probe_seconds > 0) {
    y += "# One GEMM case (the linear op of rows x width activations through a width x width weight),\n";
    y += "# the slowest process's time: braid train times it again before its first step and after\n";
    y += "# its last, and prints how fast the host ran then against now.\n";
    y += "probe: {rows: " + std::to_string(c.probe_shape.rows) + ", width: " + std::to_string(c.probe_shape.width) +
         ", seconds: " + num(c.probe_seconds) + "}\n";
  }
  y += "# Resident memory of one process before it held any tensor (runtime, MPI, OpenBLAS).\n";
  y += "memory_reserved_gib: " + num(c.reserved_bytes / kGiB) + "\n";
  // The host's cores whenever they compute (not a GPU's): what the processes' threads leave
  // to the data workers, and on crowded hosts what the simulator slows down.
  if (!gpu || c.shared) {
    y += c.shared ? "# More threads than cores on a host: the compute figures above are those of a process\n"
                    "# measuring while the others waited; the simulator slows down work that runs side by side.\n"
                  : "# The host's cores and each process's threads: no core is left for data workers when the\n"
                    "# processes' threads hold them all.\n";
    y += "shared_cores:\n";
    y += "  cores_per_node: " + std::to_string(c.cores) + "\n";
    y += "  threads_per_device: " + std::to_string(c.threads) + "\n";
    if (c.shared) {
      y += "  # The GEMM ladder with every process at once against in turns: the share of the cores'\n";
      y += "  # time that turns into work when more threads than cores compute (time-slicing, caches).\n";
      y += "  efficiency: " + num(f.shared_core_efficiency) + "\n";
    }
  }
  return y;
}

nlohmann::ordered_json to_json(const Calibration& c, const Fitted& f) {
  auto timings = [](const std::vector<Timing>& ts) {
    auto a = nlohmann::ordered_json::array();
    for (const auto& t : ts) a.push_back({{"what", t.what}, {"work", t.work}, {"seconds", t.seconds}});
    return a;
  };
  auto links = [](const std::vector<LinkTiming>& ts) {
    auto a = nlohmann::ordered_json::array();
    for (const auto& t : ts)
      a.push_back({{"op", link_op_name(t.op)},
                   {"members", t.members},
                   {"bytes", t.bytes},
                   {"seconds", t.seconds},
                   {"after_compute_s", t.after_compute}});
    return a;
  };
  auto fit_json = [](const LinkFit& l) {
    return nlohmann::ordered_json{{"bandwidth_bytes_per_s", l.bandwidth},
                                  {"latency_s", l.latency},
                                  {"reduce_bytes_per_s", l.reduce_bandwidth},
                                  {"reduce_points", l.reduce_points},
                                  {"worst_error", l.worst_error},
                                  {"points", l.points},
                                  {"after_compute", after_compute_json(l)}};
  };
  nlohmann::ordered_json j;
  j["host"] = c.host;
  j["cpu"] = c.cpu;
  j["measured_at"] = c.when_utc;
  j["communication"] = c.communication;
  j["processes"] = c.processes;
  j["nodes"] = c.nodes;
  j["processes_per_node"] = c.per_node;
  j["threads"] = c.threads;
  j["cores_per_node"] = c.cores;
  j["measuring_at_once_per_node"] = c.per_turn;
  j["quick"] = c.quick;
  // What the file writes from the host rather than from a fit.
  j["memory_per_process_bytes"] = c.memory_per_process_bytes;
  j["device_memory_bytes"] = c.device_memory_bytes;
  j["memory_reserved_bytes"] = c.reserved_bytes;
  j["fitted"] = {{"peak_flops", f.peak_flops},
                 {"gemm", f.gemm},
                 {"memory_bandwidth_bytes_per_s", f.memory_bandwidth},
                 {"elementwise_mib_gbs", f.elementwise},
                 {"elementwise_backward_mib_gbs", f.elementwise_backward},
                 {"optimizer_mib_gbs", f.optimizer},
                 {"streaming_mib_gbs", f.streaming},
                 {"launch_s", f.launch_seconds},
                 {"attention_forward_gflop_fraction", f.attention_forward},
                 {"attention_backward_gflop_fraction", f.attention_backward},
                 {"shared_core_efficiency", f.shared_core_efficiency},
                 {"render_sample_s", f.render_sample_s},
                 {"render_pixel_s", f.render_pixel_s},
                 {"describe_sample_s", f.describe_sample_s},
                 {"intra_node", fit_json(f.intra)}};
  if (f.inter) j["fitted"]["inter_node"] = fit_json(*f.inter);
  j["timings"] = {{"gemm", timings(c.gemms)},          {"gemm_every_process_at_once", timings(c.crowded_gemms)},
                  {"memory", timings({c.memory})},     {"elementwise", timings(c.elementwise)},
                  {"attention", timings(c.attention)}, {"samples", timings(c.samples)},
                  {"intra_node", links(c.intra)},      {"inter_node", links(c.inter)}};
  if (c.probe_seconds > 0)
    j["timings"]["probe"] = {
        {"rows", c.probe_shape.rows}, {"width", c.probe_shape.width}, {"seconds", c.probe_seconds}};
  return j;
}

std::string summary(const Calibration& c, const Fitted& f) {
  std::string s;
  s += "calibrated " + c.host + ": " + std::to_string(c.processes) + " process(es), " + std::to_string(c.nodes) +
       " host(s), " + std::to_string(c.threads) + " thread(s) each\n";
  s += "  GEMM peak (best measured)   " + num(f.peak_flops / 1e9) + " GFLOP/s per process; " +
       num(100 * f.gemm.front().second) + "% of it at " + num(f.gemm.front().first * 1e9 / 1e3) + " kFLOP, " +
       num(100 * f.gemm.back().second) + "% at " + num(f.gemm.back().first) + " GFLOP\n";
  s += "  memory bandwidth (triad)    " + num(f.memory_bandwidth / 1e9) + " GB/s per process\n";
  auto rates = [](const std::vector<std::pair<double, double>>& t) {
    return num(t.front().second) + " GB/s at " + num(t.front().first * 1024) + " KiB, " + num(t.back().second) +
           " GB/s at " + num(t.back().first) + " MiB";
  };
  s += "  element-wise kernels        forward " + rates(f.elementwise) + "; backward " + rates(f.elementwise_backward) +
       "\n";
  s += "  optimizer step (AdamW)      " + rates(f.optimizer) + "\n";
  if (!f.streaming.empty()) s += "  streaming (residual add)    " + rates(f.streaming) + "\n";
  if (f.launch_seconds > 0) s += "  one kernel call at least    " + num(f.launch_seconds * 1e6) + " us\n";
  auto shares = [](const std::vector<std::pair<double, double>>& t) {
    return num(100 * t.front().second) + "% of peak at " + num(t.front().first * 1e6) + " kFLOP, " +
           num(100 * t.back().second) + "% at " + num(t.back().first * 1e3) + " MFLOP a head";
  };
  s += "  attention (braid's op)      forward " + shares(f.attention_forward) + "; backward " +
       shares(f.attention_backward) + "\n";
  auto link = [&](const char* name, const LinkFit& l) {
    s += std::string("  ") + name + num(l.latency * 1e6) + " us latency, " + num(l.bandwidth / 1e9) + " GB/s" +
         summing(l) + " (fit of " + std::to_string(l.points) + " timings, worst off by " + num(100 * l.worst_error) +
         "%)\n";
  };
  if (!c.samples.empty())
    s += "  samples (one core)          rendered " + num(f.render_sample_s * 1e6) + " us + " +
         num(f.render_pixel_s * 1e9) + " ns a pixel (" + num((f.render_sample_s + f.render_pixel_s * 1024) * 1e6) +
         " us at 32x32); described " + num(f.describe_sample_s * 1e6) + " us\n";
  auto after = [&](const char* name, const LinkFit& l) {
    if (l.after_compute.empty()) return;
    const auto& last = l.after_compute.back();
    // What the slowdown comes to for two all-reduces the trainer meets, at the longest gap.
    auto at = [&](double priced) { return num(1 + last.fixed / priced + last.factor); };
    s += std::string("  ") + name + "+" + num(last.fixed * 1e6) + " us + " + num(100 * last.factor) +
         "% of the price after " + num(last.gap * 1e3) + " ms of compute (" + at(1e-5) + "x at a 10 us price, " +
         at(1e-3) + "x at 1 ms)\n";
  };
  link("links within a host         ", f.intra);
  after("all-reduce after compute    ", f.intra);
  if (f.inter) {
    link("links between hosts         ", *f.inter);
    after("... between hosts           ", *f.inter);
  }
  return s;
}

}  // namespace braid::calibrate
