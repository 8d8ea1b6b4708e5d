#include "core/calibrate/measure.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>

#include "core/data/shapes.hpp"
#include "core/nn/device_ops.hpp"
#include "core/nn/float4.hpp"
#include "core/nn/host_ops.hpp"

namespace braid::calibrate {
namespace {

using Clock = std::chrono::steady_clock;

double min_seconds(const ComputeOptions& o) { return o.quick ? 0.005 : 0.04; }
int batches(const ComputeOptions& o) { return o.quick ? 3 : 5; }

// Past the last-level caches of the hosts braid runs on (and a GPU's L2).
constexpr double kColdBytes = 64.0 * 1024 * 1024;

// How many copies of `bytes` of saved inputs a backward cycles through to read them cold.
std::size_t cold_sets(double bytes) {
  return static_cast<std::size_t>(std::clamp(std::ceil(kColdBytes / bytes), 1.0, 65536.0));
}

bool on_gpu(const ComputeOptions& o) { return o.device && !o.device->device().is_host(); }

// Calls timed together between two waits of a device's stream: a step queues its ops back
// to back and waits a few times a step. One wait per call would price each small op at the
// stream's round trip: on an H200 one kernel's call took 11.7 us so, 4.5 grouped (2026-11-30).
constexpr int kDeviceGroup = 16;

// What runs the cases: the host ops, or a device backend's with its stream waited for after
// each group of calls (a device call returns before it ran, and the time is the device's).
struct Runner {
  std::unique_ptr<nn::Ops> ops;
  nn::DeviceBackend* device = nullptr;
  explicit Runner(const ComputeOptions& o) {
    if (o.device) {
      device = o.device.get();
      ops = std::make_unique<nn::DeviceOps>(o.device);
    } else {
      ops = std::make_unique<nn::HostOps>(o.threads);
    }
  }
  nn::Tensor on(const nn::Tensor& t) const { return device ? device->upload(t) : t; }
  void wait() const {
    if (device) device->synchronize();
  }
  double time(const std::function<void()>& call, const ComputeOptions& o) const {
    if (!device) return time_call(call, min_seconds(o), batches(o));
    return time_call(
        call, min_seconds(o), batches(o), [this] { wait(); }, kDeviceGroup);
  }
};
// A deterministic fill, not zeros: denormals and exact zeros take other paths in some kernels.
nn::Tensor filled(nn::Shape shape) {
  nn::Tensor t(std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data[static_cast<std::size_t>(i)] = 0.01f * static_cast<float>(i % 97) - 0.4f;
  return t;
}

struct GemmShape {
  int64_t rows, width;
};

// Rows x width activations through a width x width weight: per-head products of small
// attention (16 x 16) and the few rows of a small pass up to the widest layers the host
// models train. Only shapes whose forward + backward stays under a second of one core are kept.
std::vector<GemmShape> gemm_shapes(const ComputeOptions& o) {
  if (on_gpu(o)) {  // from a small layer's GEMMs to the widest a GPU trains
    const std::vector<int64_t> widths =
        o.quick ? std::vector<int64_t>{256, 1024} : std::vector<int64_t>{128, 256, 1024, 4096, 8192};
    const std::vector<int64_t> rows =
        o.quick ? std::vector<int64_t>{256, 2048} : std::vector<int64_t>{64, 256, 2048, 16384};
    std::vector<GemmShape> shapes;
    for (int64_t w : widths)
      for (int64_t r : rows) shapes.push_back({r, w});
    return shapes;
  }
  const std::vector<int64_t> widths =
      o.quick ? std::vector<int64_t>{8, 16, 64, 256} : std::vector<int64_t>{8, 16, 32, 64, 128, 256, 512, 1024};
  const std::vector<int64_t> rows =
      o.quick ? std::vector<int64_t>{4, 16, 256, 2048} : std::vector<int64_t>{4, 16, 64, 256, 1024, 4096};
  const double cap = o.quick ? 2e8 : 4e9;
  std::vector<GemmShape> shapes;
  for (int64_t w : widths)
    for (int64_t r : rows)
      if (6.0 * r * w * w <= cap) shapes.push_back({r, w});
  return shapes;
}

std::vector<int64_t> elementwise_sizes(const ComputeOptions& o) {
  std::vector<int64_t> sizes;  // elements, rows of 128 features: from the few rows of a small
  // microbatch's pass (per-call costs dominate there) to arrays far beyond the caches
  const int64_t largest = on_gpu(o) ? (o.quick ? (1 << 22) : (1 << 26)) : (o.quick ? (1 << 20) : (1 << 24));
  for (int64_t n = 256; n <= largest; n *= 4) sizes.push_back(n);
  return sizes;
}

struct AttentionShape {
  int64_t batch, seq, heads, head_dim;
};

std::vector<AttentionShape> attention_shapes(const ComputeOptions& o) {
  if (on_gpu(o)) {
    if (o.quick) return {{8, 128, 8, 64}};
    return {{8, 256, 16, 64}, {4, 1024, 16, 64}, {1, 2048, 16, 128}};
  }
  // From the tiny runs' smallest images (4 patches) and captions up to layers a host trains.
  if (o.quick) return {{16, 4, 4, 16}, {8, 16, 4, 16}, {2, 64, 4, 32}};
  return {{16, 4, 4, 16}, {16, 8, 4, 16},  {16, 16, 4, 16}, {8, 32, 4, 32},
          {8, 64, 4, 32}, {2, 256, 4, 32}, {1, 512, 8, 64}};
}

// Image sides of the sample cases: those of the tiny runs' images up to four times them.
std::vector<int> sample_sides(const ComputeOptions& o) {
  return o.quick ? std::vector<int>{16, 64} : std::vector<int>{16, 32, 64, 128};
}

}  // namespace

double median(std::vector<double> repeats) {
  if (repeats.empty()) return 0;
  const auto middle = repeats.begin() + static_cast<std::ptrdiff_t>(repeats.size() / 2);
  std::nth_element(repeats.begin(), middle, repeats.end());
  return *middle;
}

double time_call(const std::function<void()>& run, double min_seconds, int batch_count,
                 const std::function<void()>& wait, int group) {
  run();  // warm: first-touch page faults, OpenBLAS buffers
  if (wait) wait();
  std::vector<double> means;
  for (int b = 0; b < batch_count; ++b) {
    int calls = 0;
    const auto start = Clock::now();
    double elapsed = 0;
    do {
      for (int g = 0; g < std::max(1, group); ++g) run();
      if (wait) wait();
      calls += std::max(1, group);
      elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    } while (elapsed < min_seconds);
    means.push_back(elapsed / calls);
  }
  return median(std::move(means));
}

int gemm_case_count(const ComputeOptions& o) { return static_cast<int>(gemm_shapes(o).size()); }

int compute_case_count(const ComputeOptions& o) {
  return static_cast<int>(gemm_shapes(o).size() + 1 + kElementwiseCasesPerSize * elementwise_sizes(o).size() +
                          2 * attention_shapes(o).size());
}

std::vector<Timing> measure_gemms(const ComputeOptions& o, const CaseHook& between) {
  std::vector<Timing> out;
  const auto shapes = gemm_shapes(o);
  int index = 0;
  for (const auto& s : shapes) {
    const std::string what =
        "gemm " + std::to_string(s.rows) + "x" + std::to_string(s.width) + "x" + std::to_string(s.width);
    between(index++, static_cast<int>(shapes.size()), what);
    out.push_back({what, 6.0 * static_cast<double>(s.rows) * s.width * s.width, time_linear(o, s.rows, s.width)});
  }
  return out;
}

double time_linear(const ComputeOptions& o, int64_t rows, int64_t width) {
  const Runner run(o);
  nn::Tensor x = run.on(filled({rows, width})), w = run.on(filled({width, width})), y, dx;
  nn::Tensor dy = run.on(filled({rows, width})), dw = run.on(nn::Tensor({width, width}));
  return run.time(
      [&] {
        run.ops->linear_forward(x, w, nullptr, y);
        run.ops->linear_backward(x, w, dy, &dx, &dw, nullptr);
      },
      o);
}

Timing measure_memory_bandwidth(const ComputeOptions& o, const CaseHook& between) {
  between(0, 1, "memory bandwidth");
  if (on_gpu(o)) {  // a device-to-device copy: every byte read once and written once
    const int64_t n = o.quick ? (int64_t{1} << 24) : (int64_t{1} << 28);
    const Runner run(o);
    nn::Tensor a = o.device->zeros({n}), b = o.device->zeros({n});
    const double t = run.time([&] { o.device->copy(a, b); }, o);
    return {"device copy " + std::to_string(n * 4 >> 20) + " MiB", 2.0 * 4.0 * static_cast<double>(n), t};
  }
  // Each array 8x the last-level caches of common servers (32-64 MiB): DRAM, not cache.
  const std::size_t n = o.quick ? (std::size_t{1} << 23) : (std::size_t{1} << 26);
  std::vector<float> a(n, 0.0f), b(n, 1.0f), c(n, 2.0f);
  const float scale = 0.5f;
  // Four floats at a time: at -O2 GCC leaves the plain loop scalar (it cannot rule out that
  // the arrays overlap), which bounds it by the core, not by memory (15 against 25 GB/s here).
  float *out = a.data(), *in = b.data(), *times = c.data();
  double t = time_call(
      [&] {
        nn::f4::each4(
            static_cast<int64_t>(n),
            [&](int64_t i) {
              nn::f4::store(out + i, nn::f4::load(in + i) + nn::f4::splat(scale) * nn::f4::load(times + i));
            },
            [&](int64_t i) { out[i] = in[i] + scale * times[i]; });
      },
      min_seconds(o), batches(o));
  // Reads b and c, writes a (write-allocate traffic not counted, as STREAM reports it).
  return {"triad " + std::to_string(n * 4 >> 20) + " MiB arrays", 3.0 * 4.0 * static_cast<double>(n), t};
}

std::vector<Timing> measure_elementwise(const ComputeOptions& o, const CaseHook& between) {
  const Runner run(o);
  nn::Ops& ops = *run.ops;
  std::vector<Timing> out;
  const auto sizes = elementwise_sizes(o);
  const int count = static_cast<int>(kElementwiseCasesPerSize * sizes.size());
  int index = 0;
  for (int64_t n : sizes) {
    const int64_t features = 128, rows = n / features;
    const std::string size = std::to_string(n * 4 >> 10) + " KiB";
    // A backward reads the input its forward saved long before, out of the caches (as for
    // attention): it cycles through copies of it and its norm statistics past kColdBytes. The
    // incoming gradient comes hot, from the op just before.
    struct Saved {
      nn::Tensor x;
      nn::LayerNormSaved norm;
    };
    std::vector<Saved> saved(cold_sets(4.0 * static_cast<double>(n + 2 * rows)));
    for (auto& c : saved) c.x = run.on(filled({rows, features}));
    nn::Tensor dy = run.on(filled({rows, features})), gamma = run.on(nn::Tensor({features}, 1.0f)),
               beta = run.on(nn::Tensor({features}));
    nn::Tensor y, dx, dgamma = run.on(nn::Tensor({features})), dbeta = run.on(nn::Tensor({features})), g, dg;
    // A layer's norm and activation each way. Not the residual add: a pure stream (on this
    // kind of host 5-8x a norm's rate), which would lift the table above what the norms and
    // activations that fill it run at; it has a table of its own.
    Saved& hot = saved.front();
    const auto forward = [&] {
      ops.layernorm_forward(hot.x, gamma, beta, 1e-5f, y, hot.norm);
      ops.gelu_forward(hot.x, g);
    };
    std::size_t next = 0;
    const auto backward = [&] {
      Saved& c = saved[next++ % saved.size()];
      ops.layernorm_backward(c.x, gamma, c.norm, dy, &dx, &dgamma, &dbeta);
      ops.gelu_backward(c.x, dy, dg);
    };
    // Bytes as the cost model counts them (cost/transformer.cpp, add_elementwise): a norm's or
    // an activation's forward reads and writes n floats; a backward is charged twice that.
    const double forward_bytes = 4.0 * static_cast<double>(n) * (2 + 2);
    const std::string forward_case = std::string(kElementwiseForward) + " " + size,
                      backward_case = std::string(kElementwiseBackward) + " " + size,
                      optimizer_case = std::string(kOptimizerStep) + " " + size,
                      streaming_case = std::string(kStreamingAdd) + " " + size;
    between(index++, count, forward_case);
    out.push_back({forward_case, forward_bytes, run.time(forward, o)});
    for (auto& c : saved) ops.layernorm_forward(c.x, gamma, beta, 1e-5f, y, c.norm);
    between(index++, count, backward_case);
    out.push_back({backward_case, 2 * forward_bytes, run.time(backward, o)});
    // AdamW over n parameters, charged as the cost model charges a float32 step (cost_model.cpp,
    // optimizer_seconds): weight, gradient and both moments read and written, 32 bytes each.
    nn::AdamWState state{run.on(nn::Tensor({rows, features})), run.on(nn::Tensor({rows, features})), 0};
    const nn::AdamWConfig config{1e-3, 0.9, 0.999, 1e-8, 0.1};
    between(index++, count, optimizer_case);
    const double adamw = run.time([&] { ops.adamw_step(y, dy, state, config); }, o);
    out.push_back({optimizer_case, 32.0 * static_cast<double>(n), adamw});
    // A residual add over n floats, charged as the cost model charges one (residual_bytes: two
    // arrays read, one written), both operands hot from the ops before it, as in a block.
    between(index++, count, streaming_case);
    const double add = run.time([&] { ops.add(y, dy); }, o);
    out.push_back({streaming_case, 12.0 * static_cast<double>(n), add});
  }
  return out;
}

std::vector<Timing> measure_attention(const ComputeOptions& o, const CaseHook& between) {
  const Runner run(o);
  nn::Ops& ops = *run.ops;
  std::vector<Timing> out;
  const auto shapes = attention_shapes(o);
  int index = 0;
  for (const auto& s : shapes) {
    const int64_t width = s.heads * s.head_dim;
    const std::string shape = "b" + std::to_string(s.batch) + " s" + std::to_string(s.seq) + " h" +
                              std::to_string(s.heads) + " d" + std::to_string(s.head_dim);
    // A backward reads what its forward saved a step's worth of work before, out of the
    // caches (timed hot, the host's took 1.7x less than in a step): it cycles through copies
    // of the saved inputs that together pass kColdBytes. The forward's inputs come hot, from
    // the projections just before it.
    const auto sets = cold_sets(4.0 * (3 * s.batch * s.seq * width + s.batch * s.heads * s.seq * s.seq));
    struct Saved {
      nn::Tensor q, k, v;
      nn::AttentionSaved attention;
    };
    std::vector<Saved> saved(sets);
    for (auto& x : saved) {
      x.q = run.on(filled({s.batch, s.seq, width}));
      x.k = run.on(filled({s.batch, s.seq, width}));
      x.v = run.on(filled({s.batch, s.seq, width}));
    }
    nn::Tensor dout = run.on(filled({s.batch, s.seq, width})), y, dq, dk, dv;
    const nn::AttentionOptions options{s.heads, false};
    const double flops = 4.0 * static_cast<double>(s.seq) * s.seq * s.head_dim;  // one head of one sample
    const double pieces = static_cast<double>(s.batch * s.heads);
    between(index++, static_cast<int>(2 * shapes.size()), "attention forward " + shape);
    Saved& hot = saved.front();
    const double forward = run.time([&] { ops.attention_forward(hot.q, hot.k, hot.v, options, y, hot.attention); }, o);
    out.push_back({"attention forward " + shape, flops, forward / pieces});
    for (auto& x : saved) ops.attention_forward(x.q, x.k, x.v, options, y, x.attention);
    between(index++, static_cast<int>(2 * shapes.size()), "attention backward " + shape);
    std::size_t next = 0;
    const double backward = run.time(
        [&] {
          Saved& x = saved[next++ % sets];
          ops.attention_backward(x.q, x.k, x.v, options, x.attention, dout, dq, dk, dv);
        },
        o);
    out.push_back({"attention backward " + shape, 2.5 * flops, backward / pieces});
  }
  return out;
}

int sample_case_count(const ComputeOptions& o) { return static_cast<int>(sample_sides(o).size()) + 1; }

std::vector<Timing> measure_samples(const ComputeOptions& o, const CaseHook& between) {
  // As a data worker makes them: a step's share of samples per call, the last call's freed
  // first (untimed); the median call is kept. (In a training step the renderer runs 1.5-3x
  // slower than here, its caches and heap left as the step's tensors left them; no stand-in
  // for that tracked it, so this is the renderer's own rate.)
  constexpr int kPerCall = 64;
  const int calls = o.quick ? 5 : 25;
  const auto time_batch = [&](const std::function<data::Sample(std::int64_t)>& make) {
    std::vector<double> seconds;
    std::vector<data::Sample> made;  // a step's samples, kept until the next step's are made
    std::int64_t next = 0;           // new samples each call: scenes differ in their objects' extent
    for (int c = 0; c < calls; ++c) {
      made.clear();
      const auto start = Clock::now();
      for (int k = 0; k < kPerCall; ++k) made.push_back(make(next++));
      seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count() / kPerCall);
    }
    return median(std::move(seconds));
  };
  std::vector<Timing> out;
  const auto sides = sample_sides(o);
  const int count = sample_case_count(o);
  int index = 0;
  for (int side : sides) {
    data::ShapesConfig config;  // every image at `side` (the fixed distribution: the largest)
    config.seed = 1;
    config.min_side = config.max_side = side;
    const data::ShapesDataset dataset(config);
    const std::string what = std::string(kRenderSample) + " " + std::to_string(side) + "x" + std::to_string(side);
    between(index++, count, what);
    const double t = time_batch([&](std::int64_t i) { return dataset.get(i); });
    out.push_back({what, static_cast<double>(side) * side, t});
  }
  const data::ShapesDataset dataset(data::ShapesConfig{});
  between(index++, count, kDescribeSample);
  out.push_back({kDescribeSample, 1, time_batch([&](std::int64_t i) { return dataset.describe(i); })});
  return out;
}

}  // namespace braid::calibrate
