// Training-throughput benchmark: one training step of each reference model (forward +
// backward + AdamW on every trainable parameter) in braid against the same model in PyTorch
// (bench/train_peer.py, torch.nn) on the same device, side by side in one run, at the same
// thread count.
//
// --device picks braid's ops and PyTorch's device:
//   cpu   braid's host ops called directly (core/nn HostOps), PyTorch on the CPU.
//         Goal: braid >= 1.0x PyTorch in samples/s.
//   host  the device path on a host: DeviceOps over libbraid-host.so run as an emulated
//         device (BRAID_HOST_MEMORY=separate), every parameter, gradient, AdamW moment and
//         activation resident in the backend's memory; PyTorch on the CPU. No goal: it shows
//         what the device path costs where it can be run without a GPU.
//   cuda  the same on the GPU (libbraid-cuda.so), PyTorch on the same GPU, TF32 off on both.
//         Goals against eager PyTorch: tiny models >= 2x, a GPT-2-sized decoder >= 0.95x.
//         --compile adds PyTorch under torch.compile. MFU: model FLOPs (the cost model's
//         model_flops_per_sample) per second against the GPU's float32 peak (kPeaks, or
//         --peak-tflops). --tf32: TF32 tensor-core GEMMs on both sides (BRAID_CUDA_TF32=1,
//         allow_tf32), the losses then checked within 1e-2, MFU against the TF32 peak.
//
// The models (--model, default tiny-clip,tiny-mllm): configs/runs/NAME.yaml's model as
// build_model makes it, with that run's global batch (printed); gpt2-small is the decoder
// (12 x 768, sequence 1024, batch 8), for a GPU. The peer
// gets braid's spec, initial weights and inputs through a temporary folder, builds the same
// architecture with the same parameter names, and prints its parameter count: the run fails
// unless it equals braid's (so both time the same model size), and unless both sides' losses
// agree: the first step's (same weights, same inputs: the forward) to 1e-6 relative, the
// second's (after one AdamW step: the backward and the optimizer) to 1e-5. The first is tight
// enough to tell the tanh GELU from the erf one on tiny-clip (2e-6 apart).
//
// The batch: fixed synthetic tensors, the same on both sides — images of the run file's
// nominal side (32 x 32, 3 channels; uniform in [-1, 1)) and captions of its nominal 12
// tokens (random ids below the vocabulary, every length 12). Real data mixes image sides
// (16-32 px on the tiny runs) and caption lengths; this bench fixes them so that both sides
// run identical shapes.
//
// A step, timed whole on both sides: zero the gradients, forward, backward, AdamW (lr 1e-3,
// betas 0.9/0.999, eps 1e-8, weight decay 0.1 on matrices as Parameter::decay says, none on
// biases, norms and the logit scale) and, for CLIP, open_clip's clamp of the temperature.
// Figures: the median of the per-step times after the warm-up; samples/s = batch / median.
//
// Memory: both processes run glibc malloc with the same thresholds — keep freed memory (trim
// threshold 256 MiB) and serve blocks up to 32 MiB from the heap (mmap threshold) — set with
// mallopt here (core/nn/host_memory, as braid train does) and GLIBC_TUNABLES for the peer.
// braid's modules allocate their activations afresh each step; under glibc's defaults the heap
// top is returned to the kernel when a step frees them and faulted back in the next step (a
// quarter to a third of a tiny step). The Python process keeps its heap busy and barely
// changes. --system-malloc runs both with the defaults.
//
// usage: train_bench [--quick] [--threads T] [--format table|json] [--profile] [--system-malloc]
//                    [--device cpu|host|cuda] [--model NAME[,NAME...]] [--compile] [--tf32] [--peak-tflops X]
//   full: 100 steps after 10 warm-up; quick: 10 after 2 (what ctest runs: it asserts no
//   wall-clock bound, only that both sides ran the same model).
//   T: threads for braid's HostOps, OpenBLAS and PyTorch alike (default: 1, then 2; a
//   device backend runs at the first only).
//   --profile: braid's step time by op (an Ops wrapper with timers) and by phase.
//   Each row also goes to standard error as soon as it is measured (the table waits for all).
//   The peer runs under the first of $BRAID_PYTHON, CMake's Python3, python3 and
//   /usr/bin/python3 (Debian's python3-torch) that imports torch; without one, braid's
//   figures are printed and the comparison says "skipped: no torch".
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/peer_support.hpp"
#include "bench/quick_flag.hpp"
#include "core/common/error.hpp"
#include "core/cost/cost_model.hpp"
#include "core/nn/blas.hpp"
#include "core/nn/device_ops.hpp"
#include "core/nn/flat_parameters.hpp"
#include "core/nn/host_memory.hpp"
#include "core/nn/host_ops.hpp"
#include "core/nn/modules/model.hpp"
#include "core/nn/timed_ops.hpp"
#include "core/spec/run.hpp"

#ifndef BRAID_BENCH_PYTHON3
#define BRAID_BENCH_PYTHON3 ""
#endif

namespace {

using braid::bench::find_torch_python;
using braid::bench::quoted;
using braid::bench::relative;
using braid::bench::TempDir;

using namespace braid;
using nn::Tensor;
using Clock = std::chrono::steady_clock;

constexpr double kGoal = 1.0;
constexpr double kFirstLossTolerance = 1e-6, kSecondLossTolerance = 1e-5;
constexpr double kTf32LossTolerance = 1e-2;  // either step, with TF32's 10-bit mantissas in the GEMMs
constexpr std::uint64_t kSeed = 1;
// The same malloc thresholds in this process (now, as braid train sets them) and the peer's
// (its environment).
std::string keep_freed_memory() {
  nn::keep_freed_host_memory();
  return nn::keep_freed_host_memory_env();
}
const nn::AdamWConfig kAdamW{1e-3, 0.9, 0.999, 1e-8, 0.1};  // weight_decay for decay parameters

struct Options {
  bool quick = false, json = false, profile = false, system_malloc = false, compile = false, tf32 = false;
  std::vector<int> threads{1, 2};
  std::string device = "cpu";
  std::vector<std::string> models{"tiny-clip", "tiny-mllm"};
  double peak_tflops = 0.0;  // 0: the GPU's from kPeaks, none on a host
  // How far the first and second steps' losses may be from PyTorch's (relative).
  double first_loss_tolerance() const { return tf32 ? kTf32LossTolerance : kFirstLossTolerance; }
  double second_loss_tolerance() const { return tf32 ? kTf32LossTolerance : kSecondLossTolerance; }
};

constexpr const char* kUsage =
    "usage: train_bench [--quick] [--threads T] [--format table|json] [--profile] [--system-malloc]\n"
    "                   [--device cpu|host|cuda] [--model NAME[,NAME...]] [--compile] [--tf32] "
    "[--peak-tflops X]\n";

[[noreturn]] void usage() {
  std::fprintf(stderr, "%s", kUsage);
  std::exit(2);
}

std::vector<std::string> split_commas(const std::string& list) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at <= list.size()) {
    const std::size_t comma = std::min(list.find(',', at), list.size());
    if (comma > at) out.push_back(list.substr(at, comma - at));
    at = comma + 1;
  }
  return out;
}

// bench/quick_flag.hpp takes --quick alone; this bench has more flags.
Options parse(int argc, char** argv) {
  bench::exit_on_help(argc, argv, kUsage);
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") {
      o.quick = true;
    } else if (arg == "--profile") {
      o.profile = true;
    } else if (arg == "--system-malloc") {
      o.system_malloc = true;
    } else if (arg == "--threads" && i + 1 < argc) {
      char* end = nullptr;
      const long t = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || t < 1 || t > 1024) usage();
      o.threads = {static_cast<int>(t)};
    } else if (arg == "--compile") {
      o.compile = true;
    } else if (arg == "--tf32") {
      o.tf32 = true;
    } else if (arg == "--device" && i + 1 < argc) {
      o.device = argv[++i];
      if (o.device != "cpu" && o.device != "host" && o.device != "cuda") usage();
    } else if (arg == "--model" && i + 1 < argc) {
      o.models = split_commas(argv[++i]);
      if (o.models.empty()) usage();
    } else if (arg == "--peak-tflops" && i + 1 < argc) {
      char* end = nullptr;
      o.peak_tflops = std::strtod(argv[++i], &end);
      if (*end != '\0' || !(o.peak_tflops > 0)) usage();
    } else if (arg == "--format" && i + 1 < argc) {
      const std::string f = argv[++i];
      if (f != "table" && f != "json") usage();
      o.json = f == "json";
    } else {
      usage();
    }
  }
  if (o.tf32 && o.device != "cuda") {
    std::fprintf(stderr, "train_bench: --tf32 needs --device cuda (the host ops compute in fp32)\n");
    std::exit(2);
  }
  return o;
}

// What both sides train on: the run file's model and global batch, fixed inputs.
struct Workload {
  std::string name;
  spec::RunSpec run;
  int64_t batch = 0, channels = 0, side = 0, tokens = 0, vocab = 0;
  Tensor images;
  nn::Tokens text;
};

// Uniform in [-1, 1) from a 64-bit LCG (Knuth's MMIX constants): the same on every platform.
std::uint64_t next(std::uint64_t& state) {
  state = state * 6364136223846793005ULL + 1442695040888963407ULL;
  return state >> 33;
}

Workload make_workload(const std::string& name) {
  Workload w;
  w.name = name;
  w.run = spec::load_run("configs/runs/" + name + ".yaml");
  w.batch = w.run.training.global_batch;
  w.side = w.run.data.image_resolution;
  w.tokens = w.run.data.text_tokens;
  for (const auto& m : w.run.model.modules) {
    if (m.role == spec::Role::encoder && m.modality == spec::Modality::image) w.channels = m.channels;
    if (m.vocab > 0) w.vocab = m.vocab;
  }
  if (w.batch < 1 || w.tokens < 1 || w.vocab < 1 || (w.channels > 0 && w.side < 1))
    throw Error(Status::bad_config, w.run.source + ": train_bench needs a global batch, text tokens with a " +
                                        "vocabulary, and the nominal image side of an image encoder");
  std::uint64_t state = 20240501;
  if (w.channels > 0) {
    w.images = Tensor({w.batch, w.channels, w.side, w.side});
    for (float& x : w.images.data) x = static_cast<float>(static_cast<double>(next(state) >> 8) / 8388608.0 - 1.0);
  }
  w.text.batch = w.batch;
  w.text.length = w.tokens;
  for (int64_t i = 0; i < w.batch * w.tokens; ++i)
    w.text.ids.push_back(static_cast<int32_t>(next(state) % static_cast<std::uint64_t>(w.vocab)));
  w.text.lengths.assign(static_cast<std::size_t>(w.batch), static_cast<int32_t>(w.tokens));
  return w;
}

// What runs braid's side: the host ops called directly (cpu), or a device backend through
// the device interface with every tensor resident in its memory (host: libbraid-host.so as
// an emulated device; cuda: the GPU).
struct BraidDevice {
  std::shared_ptr<nn::DeviceBackend> backend;  // null on cpu
  std::unique_ptr<nn::Ops> ops;
  std::string description;
  void wait() const {
    if (backend) backend->synchronize();
  }
};

BraidDevice open_device(const std::string& device, int threads) {
  BraidDevice d;
  if (device == "cpu") {
    d.ops = std::make_unique<nn::HostOps>(threads);
    d.description = "host ops (" + std::to_string(threads) + " threads)";
    return d;
  }
  // host: the host backend as an emulated device, every tensor in the backend's memory
  d.backend = nn::DeviceBackend::open_for_process(device == "host" ? "emulated" : device, threads, 0);
  d.ops = std::make_unique<nn::DeviceOps>(d.backend);
  d.description = d.backend->name() + " backend, " + d.backend->info().name + " (" + d.backend->device().name() +
                  "), tensors resident";
  return d;
}

// braid's side: the model and its optimizer state, on the device's memory.
struct BraidTrainer {
  nn::Model model;
  std::vector<nn::AdamWState> states;
  nn::FlatParameters flat;
  Tensor images;                                       // the workload's, where the ops keep tensors
  double forward_backward_s = 0.0, optimizer_s = 0.0;  // summed over steps, for --profile

  explicit BraidTrainer(const spec::ModelSpec& spec)
      : model(nn::build_model(spec, kSeed)), states(model.parameters().size()) {}

  // Moves the parameters and the images to where `ops` keeps tensors (after the peer's copy
  // of the initial weights is written).
  void place(nn::Ops& ops, const Workload& w) {
    model.store.move_to(ops);
    if (!w.images.data.empty()) images = ops.from_host(w.images);
    // As `braid train` steps them: laid out end to end, one zeroing and one AdamW per group.
    flat = nn::FlatParameters(ops, nn::trainable_members(model.parameters(), states));
  }

  float step(nn::Ops& ops, const Workload& w, const BraidDevice& device) {
    const auto t0 = Clock::now();
    flat.zero_grads(ops);
    const Tensor* image_batch = images.data.empty() ? nullptr : &images;
    const float loss =
        model.clip ? model.clip->step(ops, images, w.text, true) : model.chain->step(ops, image_batch, w.text, 0, true);
    const auto t1 = Clock::now();
    flat.adamw_step(ops, kAdamW);
    if (model.clip) model.clip->loss->clamp_after_step(ops);
    device.wait();
    forward_backward_s += std::chrono::duration<double>(t1 - t0).count();
    optimizer_s += std::chrono::duration<double>(Clock::now() - t1).count();
    return loss;
  }
};

struct SideResult {
  long long params = 0;
  double median_s = 0.0;
  double first_loss = 0.0, second_loss = 0.0;
  std::string line;  // the peer's output line
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

SideResult time_braid(BraidTrainer& trainer, nn::Ops& ops, const BraidDevice& device, const Workload& w, int warmup,
                      int steps) {
  SideResult r;
  r.params = trainer.model.store.numel();
  std::vector<double> times;
  for (int i = 0; i < warmup + steps; ++i) {
    const auto t0 = Clock::now();
    const float loss = trainer.step(ops, w, device);
    const double took = std::chrono::duration<double>(Clock::now() - t0).count();
    if (i == 0) r.first_loss = loss;
    if (i == 1) r.second_loss = loss;
    if (i >= warmup) times.push_back(took);
  }
  r.median_s = median(times);
  return r;
}

template <typename T>
void write_raw(const std::filesystem::path& path, std::span<const T> values) {
  std::ofstream f(path, std::ios::binary | std::ios::app);
  f.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size() * sizeof(T)));
  if (!f) throw std::runtime_error("cannot write " + path.string());
}

// The peer's inputs: the model's modules, the batch, the step counts and AdamW's settings,
// braid's parameter list and initial values, the images and the token ids.
void write_exchange(const std::filesystem::path& dir, const Workload& w, const nn::Model& model, int warmup,
                    int steps) {
  nlohmann::json spec = {{"topology", w.run.model.topology == spec::Topology::contrastive ? "contrastive" : "chain"},
                         {"batch", w.batch},
                         {"channels", w.channels},
                         {"image_size", w.side},
                         {"text_tokens", w.tokens},
                         {"warmup", warmup},
                         {"steps", steps},
                         {"lr", kAdamW.lr},
                         {"beta1", kAdamW.beta1},
                         {"beta2", kAdamW.beta2},
                         {"eps", kAdamW.eps},
                         {"weight_decay", kAdamW.weight_decay}};
  for (const auto& m : w.run.model.modules)
    spec["modules"].push_back({{"name", m.name},
                               {"role", spec::role_name(m.role)},
                               {"modality", spec::modality_name(m.modality)},
                               {"inputs", m.inputs},
                               {"layers", m.layers},
                               {"hidden", m.hidden},
                               {"ffn", m.ffn},
                               {"heads", m.heads},
                               {"causal", m.causal},
                               {"vocab", m.vocab},
                               {"patch_size", m.patch_size},
                               {"channels", m.channels},
                               {"max_image_size", m.max_image_size},
                               {"max_positions", m.max_positions},
                               {"embed_dim", m.embed_dim}});
  for (const nn::Parameter* p : model.parameters()) {
    spec["parameters"].push_back({{"name", p->name}, {"shape", p->value.shape}});
    write_raw<float>(dir / "params.bin", p->value.data);
  }
  std::ofstream(dir / "spec.json") << spec.dump(1) << "\n";
  write_raw<float>(dir / "images.bin", w.images.data);
  write_raw<int32_t>(dir / "tokens.bin", w.text.ids);
}

// PyTorch on the same device: the CPU for cpu and host, the GPU for cuda; eager, or under
// torch.compile with `compiled`.
SideResult run_peer(const std::string& python, const std::filesystem::path& dir, int threads,
                    const std::string& malloc_env, const std::string& device, bool compiled, bool tf32) {
  const std::string t = std::to_string(threads);
  const std::string cmd = malloc_env + "OMP_NUM_THREADS=" + t + " OPENBLAS_NUM_THREADS=" + t + " " + quoted(python) +
                          " bench/train_peer.py --dir " + quoted(dir.string()) + " --threads " + t + " --device " +
                          (device == "cuda" ? "cuda" : "cpu") + (compiled ? " --compile" : "") +
                          (tf32 ? " --tf32" : "") + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) throw std::runtime_error("cannot run " + cmd);
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, pipe)) out += buf;
  if (pclose(pipe) != 0) throw std::runtime_error("the peer failed: " + cmd + "\n" + out);
  SideResult r;
  const auto at = out.find("peer params=");
  if (at == std::string::npos ||
      std::sscanf(out.c_str() + at, "peer params=%lld first_loss=%lf second_loss=%lf median_step_s=%lf", &r.params,
                  &r.first_loss, &r.second_loss, &r.median_s) != 4)
    throw std::runtime_error("no result line from the peer:\n" + out);
  r.line = out.substr(at, out.find('\n', at) - at);
  return r;
}

// Removes the folder of the exchanged files however the run ends.

// The 1-minute load average, printed with the figures: on a shared host, others' work skews
// them (PyTorch's OpenMP threads most: they spin-wait for a busy core).
double load_average() {
  double load = -1.0;
  std::ifstream("/proc/loadavg") >> load;
  return load;
}

// The GPUs' dense float32 and TF32 tensor-core peaks from NVIDIA's data sheets (TF32: half
// the figure quoted "with sparsity"): the MFU denominator when --peak-tflops does not give
// one, for the math both sides run. First match of the device name.
struct Peak {
  const char* name_contains;
  double fp32_tflops, tf32_tflops;
};
constexpr Peak kPeaks[] = {{"H100 PCIe", 51.2, 378.0},
                           {"H100", 66.9, 494.5},
                           {"H200", 66.9, 494.5},
                           {"A100", 19.5, 156.0},
                           {"L40S", 91.6, 183.0}};

double peak_tflops(const Options& o, const BraidDevice& device) {
  if (o.peak_tflops > 0 || !device.backend || device.backend->device().type != nn::DeviceType::cuda)
    return o.peak_tflops;
  for (const Peak& p : kPeaks)
    if (device.backend->info().name.find(p.name_contains) != std::string::npos)
      return o.tf32 ? p.tf32_tflops : p.fp32_tflops;
  return 0.0;
}

// The speed goal of a row against PyTorch eager (the issues' figures): the host ops >= 1x;
// on a GPU, the launch-bound tiny models >= 2x and a GPT-2-sized decoder >= 0.95x. The
// emulated device (--device host) has none: it measures the device path on a host.
double goal_for(const std::string& device, const std::string& model) {
  if (device == "cpu") return 1.0;
  if (device == "cuda") return model.rfind("tiny-", 0) == 0 ? 2.0 : 0.95;
  return 0.0;
}

struct Row {
  std::string model;
  int threads = 0;
  int64_t batch = 0;
  double goal = 0.0;              // 0: none
  double flops_per_sample = 0.0;  // model FLOPs, forward + backward (the cost model's)
  SideResult braid;
  std::optional<SideResult> peer, compiled;  // PyTorch eager, and under torch.compile
  double ratio() const { return peer ? peer->median_s / braid.median_s : 0.0; }
  double compiled_ratio() const { return compiled ? compiled->median_s / braid.median_s : 0.0; }
  bool met() const { return goal <= 0.0 || (peer && ratio() >= goal); }
  double mfu(double peak_tflops) const {
    return peak_tflops > 0 ? flops_per_sample * static_cast<double>(batch) / braid.median_s / (peak_tflops * 1e12)
                           : 0.0;
  }
};

void print_profile(const Workload& w, int threads, const BraidTrainer& trainer, const nn::TimedOps& timed, int steps) {
  std::printf("\nbraid %s, %d threads: per step (mean of %d), forward+backward %.3f ms, AdamW + clamp %.3f ms\n",
              w.name.c_str(), threads, steps, 1e3 * trainer.forward_backward_s / steps,
              1e3 * trainer.optimizer_s / steps);
  const auto by_op = timed.by_op();
  std::vector<std::pair<std::string, nn::OpTimes>> ops(by_op.begin(), by_op.end());
  std::sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  double total = 0.0;
  for (const auto& op : ops) total += op.second.seconds;
  for (const auto& [name, t] : ops)
    std::printf("  %-28s %8.3f ms %5.1f%%  %5ld calls\n", name.c_str(), 1e3 * t.seconds / steps,
                100.0 * t.seconds / total, t.calls / steps);
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  if (o.tf32) ::setenv("BRAID_CUDA_TF32", "1", 1);  // read where the backend's stream takes its cuBLAS handle
  try {
    const int steps = o.quick ? 10 : 100, warmup = o.quick ? 2 : 10;
    const std::string malloc_env = o.system_malloc ? std::string() : keep_freed_memory();
    const double load_before = load_average();
    const auto python = find_torch_python(BRAID_BENCH_PYTHON3);
    // A device backend's ops start once per process, with the first thread count; a GPU
    // has no thread count to vary.
    const std::vector<int> thread_counts = o.device == "cpu" ? o.threads : std::vector<int>{o.threads.front()};
    std::vector<Row> rows;
    std::string failure, device_text;
    double peak = 0.0;
    for (const std::string& name : o.models) {
      const Workload w = make_workload(name);
      for (int threads : thread_counts) {
        nn::set_blas_threads(threads);
        const BraidDevice device = open_device(o.device, threads);
        device_text = device.description;
        peak = peak_tflops(o, device);
        nn::Ops& ops = *device.ops;
        BraidTrainer trainer(w.run.model);
        Row row{
            name, threads,      w.batch,     goal_for(o.device, name), cost::CostModel(w.run).model_flops_per_sample(),
            {},   std::nullopt, std::nullopt};
        const TempDir dir("braid-train");
        if (python) write_exchange(dir.path, w, trainer.model, warmup, steps);  // the initial weights
        trainer.place(ops, w);
        row.braid = time_braid(trainer, ops, device, w, warmup, steps);
        auto check_peer = [&](const SideResult& peer, const char* flavour) {
          if (peer.params != row.braid.params)
            failure += name + ": PyTorch's model has " + std::to_string(peer.params) + " parameters, braid's " +
                       std::to_string(row.braid.params) + "\n";
          auto check_loss = [&](const char* which, double braid_loss, double torch_loss, double tolerance) {
            if (relative(braid_loss, torch_loss) <= tolerance) return;
            char text[240];
            std::snprintf(text, sizeof text,
                          "%s, %d threads: %s losses differ beyond %.0e: braid %.9g, PyTorch (%s) %.9g\n", name.c_str(),
                          threads, which, tolerance, braid_loss, flavour, torch_loss);
            failure += text;
          };
          check_loss("first-step", row.braid.first_loss, peer.first_loss, o.first_loss_tolerance());
          check_loss("second-step", row.braid.second_loss, peer.second_loss, o.second_loss_tolerance());
        };
        if (python) {
          row.peer = run_peer(*python, dir.path, threads, malloc_env, o.device, false, o.tf32);
          check_peer(*row.peer, "eager");
          if (o.compile) {
            row.compiled = run_peer(*python, dir.path, threads, malloc_env, o.device, true, o.tf32);
            check_peer(*row.compiled, "torch.compile");
          }
        }
        // Each row as it is measured, so a run cut short keeps what it finished.
        std::fprintf(stderr, "train_bench: %s, %d thread(s): braid %.3f ms a step", name.c_str(), threads,
                     1e3 * row.braid.median_s);
        if (row.peer) std::fprintf(stderr, ", PyTorch %.3f ms (%.2fx)", 1e3 * row.peer->median_s, row.ratio());
        if (row.compiled)
          std::fprintf(stderr, ", torch.compile %.3f ms (%.2fx)", 1e3 * row.compiled->median_s, row.compiled_ratio());
        std::fprintf(stderr, "\n");
        if (o.profile) {  // a second model, so the timed run starts from the same weights
          BraidTrainer profiled(w.run.model);
          profiled.place(ops, w);
          nn::TimedOps timed(ops, [&device] { device.wait(); });
          for (int i = 0; i < warmup; ++i) profiled.step(ops, w, device);
          profiled.forward_backward_s = profiled.optimizer_s = 0.0;
          for (int i = 0; i < steps; ++i) profiled.step(timed, w, device);
          if (!o.json) print_profile(w, threads, profiled, timed, steps);
        }
        rows.push_back(std::move(row));
      }
    }

    bool met = true;
    for (const Row& r : rows) met = met && r.met();
    if (o.json) {
      nlohmann::json out = {{"bench", "train"},
                            {"quick", o.quick},
                            {"device", o.device},
                            {"braid_ops", device_text},
                            {"steps", steps},
                            {"warmup", warmup},
                            {"timing", "median"},
                            {"malloc", o.system_malloc ? "glibc defaults" : "trim 256 MiB, mmap 32 MiB"},
                            {"peak_tflops", peak},
                            {"torch", python.has_value()},
                            {"load_average_before", load_before},
                            {"load_average_after", load_average()},
                            {"rows", nlohmann::json::array()}};
      for (const Row& r : rows) {
        nlohmann::json j = {{"model", r.model},
                            {"threads", r.threads},
                            {"batch", r.batch},
                            {"params", r.braid.params},
                            {"goal_ratio", r.goal},
                            {"model_flops_per_sample", r.flops_per_sample},
                            {"braid_step_s", r.braid.median_s},
                            {"braid_samples_per_s", r.batch / r.braid.median_s},
                            {"braid_first_loss", r.braid.first_loss},
                            {"braid_second_loss", r.braid.second_loss}};
        if (peak > 0) j["braid_mfu"] = r.mfu(peak);
        if (r.peer) {
          j["torch_params"] = r.peer->params;
          j["torch_step_s"] = r.peer->median_s;
          j["torch_samples_per_s"] = r.batch / r.peer->median_s;
          j["torch_first_loss"] = r.peer->first_loss;
          j["torch_second_loss"] = r.peer->second_loss;
          j["ratio"] = r.ratio();
        }
        if (r.compiled) {
          j["torch_compile_step_s"] = r.compiled->median_s;
          j["compile_ratio"] = r.compiled_ratio();
        }
        out["rows"].push_back(j);
      }
      out["goal_met"] = python ? nlohmann::json(met) : nlohmann::json(nullptr);
      std::printf("%s\n", out.dump(1).c_str());
    } else {
      std::printf(
          "\nbraid training step (forward + backward + AdamW) vs PyTorch on the same device, float32 (%s);\n"
          "braid: %s\nmedian of %d steps after %d warm-up; samples/s = batch / median step time; malloc on both "
          "sides: %s;\nload average %.2f before, %.2f after\n\n",
          o.tf32 ? "TF32 GEMMs on both sides" : "no TF32", device_text.c_str(), steps, warmup,
          o.system_malloc ? "glibc defaults" : "trim threshold 256 MiB, mmap threshold 32 MiB", load_before,
          load_average());
      if (python)
        std::printf(
            "check: same parameters (names, counts); losses of steps 1 and 2 within %.0e and %.0e of PyTorch's\n",
            o.first_loss_tolerance(), o.second_loss_tolerance());
      else
        std::printf("check against PyTorch: skipped: no torch\n");
      std::printf("  %-10s %7s %5s %9s %10s %10s %11s %11s %8s  %s\n", "model", "threads", "batch", "params",
                  "braid_ms", "torch_ms", "braid_sps", "torch_sps", "ratio", "goal (vs eager)");
      for (const Row& r : rows) {
        char goal[64] = "none (emulated device)";
        if (r.goal > 0)
          std::snprintf(goal, sizeof goal, ">= %.2gx: %s", r.goal,
                        !r.peer   ? "skipped: no torch"
                        : r.met() ? "met"
                                  : "MISSED");
        if (!r.peer) {
          std::printf("  %-10s %7d %5lld %9lld %10.3f %10s %11.1f %11s %8s  %s\n", r.model.c_str(), r.threads,
                      static_cast<long long>(r.batch), r.braid.params, 1e3 * r.braid.median_s, "-",
                      r.batch / r.braid.median_s, "-", "-", goal);
          continue;
        }
        std::printf("  %-10s %7d %5lld %9lld %10.3f %10.3f %11.1f %11.1f %7.2fx  %s\n", r.model.c_str(), r.threads,
                    static_cast<long long>(r.batch), r.braid.params, 1e3 * r.braid.median_s, 1e3 * r.peer->median_s,
                    r.batch / r.braid.median_s, r.batch / r.peer->median_s, r.ratio(), goal);
      }
      for (const Row& r : rows) {
        if (r.compiled)
          std::printf("  %s: torch.compile %.3f ms a step, braid %.2fx of it\n", r.model.c_str(),
                      1e3 * r.compiled->median_s, r.compiled_ratio());
        if (peak > 0)
          std::printf("  %s: %.2f TFLOP/s model FLOPs, MFU %.1f%% of %.1f TFLOP/s\n", r.model.c_str(),
                      r.flops_per_sample * static_cast<double>(r.batch) / r.braid.median_s / 1e12, 100 * r.mfu(peak),
                      peak);
      }
      for (const Row& r : rows)
        if (r.peer)
          std::printf("  %s, %d threads: loss braid %.6f -> %.6f, PyTorch %.6f -> %.6f (first two steps)\n",
                      r.model.c_str(), r.threads, r.braid.first_loss, r.braid.second_loss, r.peer->first_loss,
                      r.peer->second_loss);
      if (python) std::printf("  %s (%s)\n", rows.back().peer->line.c_str(), python->c_str());
    }
    if (!failure.empty()) {
      std::fprintf(stderr, "train_bench: braid and PyTorch did not run the same model:\n%s", failure.c_str());
      return 1;
    }
    return met || o.quick || !python ? 0 : 1;  // the quick ctest entry asserts no wall-clock bound
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_bench: %s\n", e.what());
    return 1;
  }
}
