// Contrastive-loss benchmark: CLIP's loss forward + backward in braid (core/nn HostOps)
// against the open_clip formulation in PyTorch (bench/contrastive_peer.py), on the same
// inputs, sizes and thread count, in the same run:
//  1. single device: image and text embeddings N x D, L2 normalisation, logits with the
//     learnable logit scale, symmetric cross-entropy; gradients of both embeddings and of the
//     scale. Goal: braid >= 1.3x PyTorch at N = 4096, D = 512.
//  2. one rank of R in the distributed local-loss form (n = N/R local rows against all N
//     gathered ones; open_clip's local_loss + gather_with_grad): the per-rank cost, without
//     the communication.
// Both sides' loss and gradients (of the last timed step) are compared, max |a - b| / max |b|
// per tensor; a difference above 1e-4 fails the run. Without an importable torch, braid's figures are
// printed and the comparison says "skipped: no torch".
//
// usage: contrastive_bench [--quick | --big] [--threads T] [--device cpu|host|cuda] [--tf32]
//   full: N = 4096, D = 512, median of 7 after 2 warm-up; quick: N = 512, median of 3 after 1
//   (what ctest runs; it asserts no wall-clock bound, only the comparison); big: N = 32768,
//   D = 1024, median of 5 after 1 (the GPU goal: >= 1.3x and less peak memory than PyTorch).
//   --device: cpu (default) braid's host ops called directly; host: the same ops through the
//   device interface (libbraid-host.so); cuda: the CUDA backend, against PyTorch on the GPU
//   (TF32 off on both), with each side's peak device memory beyond the inputs.
//   --tf32 (with --device cuda): TF32 tensor-core GEMMs on both sides (BRAID_CUDA_TF32=1 for
//   braid, allow_tf32 for PyTorch); the comparison's tolerance is then 1e-2, for the GEMMs'
//   10-bit mantissas.
//   T: threads for braid, OpenBLAS and PyTorch alike (default: every hardware thread).
//   The peer runs under the first of $BRAID_PYTHON, CMake's Python3, python3 and
//   /usr/bin/python3 (Debian's python3-torch) that imports torch.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench/peer_support.hpp"
#include "bench/quick_flag.hpp"
#include "core/nn/device_ops.hpp"
#include "core/nn/host_ops.hpp"

extern "C" void openblas_set_num_threads(int);  // braid_nn links OpenBLAS

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

constexpr double kGoal = 1.3;

struct Options {
  bool quick = false, big = false, tf32 = false;
  int threads = 0;
  std::string device = "cpu";
  // How far braid's results may be from PyTorch's, max |a - b| / max |b| per tensor.
  double tolerance() const { return tf32 ? 1e-2 : 1e-4; }
};

Options parse(int argc, char** argv) {
  Options o;
  constexpr const char* kUsage =
      "usage: contrastive_bench [--quick | --big] [--threads T] [--device cpu|host|cuda] [--tf32]\n";
  bench::exit_on_help(argc, argv, kUsage);
  auto usage = [] {
    std::fprintf(stderr, "%s", kUsage);
    std::exit(2);
  };
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") {
      o.quick = true;
    } else if (arg == "--big") {
      o.big = true;
    } else if (arg == "--tf32") {
      o.tf32 = true;
    } else if (arg == "--device" && i + 1 < argc) {
      o.device = argv[++i];
      if (o.device != "cpu" && o.device != "host" && o.device != "cuda") usage();
    } else if (arg == "--threads" && i + 1 < argc) {
      char* end = nullptr;
      const long t = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || t < 1 || t > 1024) usage();
      o.threads = static_cast<int>(t);
    } else {
      usage();
    }
  }
  if (o.quick && o.big) usage();
  if (o.tf32 && o.device != "cuda") {
    std::fprintf(stderr, "contrastive_bench: --tf32 needs --device cuda (the host ops compute in fp32)\n");
    std::exit(2);
  }
  if (o.threads == 0) o.threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return o;
}

// Uniform in [-1, 1) from a 64-bit LCG (Knuth's MMIX constants): the same on every platform.
Tensor lcg_tensor(int64_t rows, int64_t cols, uint64_t& state) {
  Tensor t({rows, cols});
  for (float& x : t.data) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    x = static_cast<float>(static_cast<double>(state >> 40) / 8388608.0 - 1.0);
  }
  return t;
}

Tensor rows_of(const Tensor& t, int64_t first, int64_t count) {
  const int64_t d = t.dim(1);
  return Tensor({count, d}, std::vector<float>(t.data.begin() + first * d, t.data.begin() + (first + count) * d));
}

// Rows [first, first + count) of `t` as a view of its memory, wherever it is (no copy).
Tensor rows_view(const Tensor& t, int64_t first, int64_t count) {
  const int64_t d = t.dim(1);
  Tensor v;
  v.shape = {count, d};
  v.data =
      nn::Storage::borrow(const_cast<float*>(t.ptr()) + first * d, static_cast<std::size_t>(count * d), t.device());
  return v;
}

// What one step hands back: the loss, d loss / dt, and the gradients of the raw embeddings.
struct StepResult {
  float loss = 0.0f;
  float dt = 0.0f;
  Tensor dimage, dtext;
};

// Single device: normalise, the loss with its gradients, the two gradient paths of each
// embedding added (local and gathered rows are the same tensor), normalisation backward.
StepResult single_step(nn::Ops& ops, const Tensor& image, const Tensor& text, float t) {
  Tensor image_n, text_n;
  ops.l2_normalize_forward(image, image_n);
  ops.l2_normalize_forward(text, text_n);
  nn::ContrastiveGrads g;
  StepResult r;
  r.loss = ops.contrastive_loss(image_n, text_n, image_n, text_n, 0, t, &g);
  ops.add(g.local_image, g.all_image);
  ops.add(g.local_text, g.all_text);
  ops.l2_normalize_backward(image, g.local_image, r.dimage);
  ops.l2_normalize_backward(text, g.local_text, r.dtext);
  r.dt = g.logit_scale_param;
  return r;
}

// One rank at rows [offset, offset + n): its raw rows, and every rank's normalised rows as
// the all-gather delivers them. The reduce-scatter is left out; its own contribution (the
// gathered gradient's rows [offset, offset + n)) is added, as that collective would.
StepResult local_step(nn::Ops& ops, const Tensor& image, const Tensor& text, const Tensor& all_image,
                      const Tensor& all_text, int64_t offset, float t) {
  const int64_t n = image.dim(0);
  Tensor image_n, text_n;
  ops.l2_normalize_forward(image, image_n);
  ops.l2_normalize_forward(text, text_n);
  nn::ContrastiveGrads g;
  StepResult r;
  r.loss = ops.contrastive_loss(image_n, text_n, all_image, all_text, offset, t, &g);
  ops.add(g.local_image, rows_view(g.all_image, offset, n));
  ops.add(g.local_text, rows_view(g.all_text, offset, n));
  ops.l2_normalize_backward(image, g.local_image, r.dimage);
  ops.l2_normalize_backward(text, g.local_text, r.dtext);
  r.dt = g.logit_scale_param;
  return r;
}

// Median seconds of `reps` calls after `warmup` calls; the last call's result in *last.
double median_seconds(int reps, int warmup, const std::function<StepResult()>& step, StepResult* last) {
  std::vector<double> times;
  for (int i = 0; i < warmup + reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    *last = step();
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i >= warmup) times.push_back(took);
  }
  std::sort(times.begin(), times.end());
  const std::size_t m = times.size() / 2;
  return times.size() % 2 ? times[m] : (times[m - 1] + times[m]) / 2;
}

void write_floats(const std::filesystem::path& path, const Tensor& t) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(t.ptr()), static_cast<std::streamsize>(t.data.size() * sizeof(float)));
  if (!f) throw std::runtime_error("cannot write " + path.string());
}

// The peer's file: loss, dt, then d image and d text with the shapes of `like`.
StepResult read_peer(const std::filesystem::path& path, const Tensor& like_image, const Tensor& like_text) {
  std::ifstream f(path, std::ios::binary);
  StepResult r;
  r.dimage = Tensor(like_image.shape);
  r.dtext = Tensor(like_text.shape);
  float head[2];
  f.read(reinterpret_cast<char*>(head), sizeof head);
  f.read(reinterpret_cast<char*>(r.dimage.ptr()), static_cast<std::streamsize>(r.dimage.data.size() * sizeof(float)));
  f.read(reinterpret_cast<char*>(r.dtext.ptr()), static_cast<std::streamsize>(r.dtext.data.size() * sizeof(float)));
  if (!f) throw std::runtime_error("the peer's " + path.string() + " is missing or short");
  r.loss = head[0];
  r.dt = head[1];
  return r;
}

double relative(const Tensor& a, const Tensor& b) {
  double diff = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < a.data.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a.data[i]) - b.data[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b.data[i])));
  }
  return diff / std::max(scale, 1e-30);
}

// Prints the four differences; true when all are within the tolerance. braid's local-loss
// share is (1/2N) of its rows' cross-entropies, open_clip's (1/2n): `factor` = N/n.
bool compare(const char* what, const StepResult& braid, const StepResult& peer, float factor, double tolerance) {
  auto scaled = [factor](Tensor t) {
    for (float& x : t.data) x *= factor;
    return t;
  };
  const double loss = relative(braid.loss * factor, peer.loss), dt = relative(braid.dt * factor, peer.dt);
  const double di = relative(scaled(braid.dimage), peer.dimage), dx = relative(scaled(braid.dtext), peer.dtext);
  const bool ok = std::max({loss, dt, di, dx}) <= tolerance;
  std::printf("  %-28s loss %.1e   d image %.1e   d text %.1e   d t %.1e   %s\n", what, loss, di, dx, dt,
              ok ? "ok" : "MISMATCH");
  return ok;
}

struct Peer {
  double single_s = 0.0, local_s = 0.0;
  double single_mib = 0.0, local_mib = 0.0;  // peak device memory beyond the inputs (0 on the CPU)
  std::string line;
};

Peer run_peer(const std::string& python, const std::filesystem::path& dir, int64_t n, int64_t d, int ranks, int rank,
              float t, int threads, int reps, int warmup, bool cuda, bool tf32) {
  char t_text[32];
  std::snprintf(t_text, sizeof t_text, "%.9g", static_cast<double>(t));  // enough digits to round-trip the float
  const std::string env =
      "OMP_NUM_THREADS=" + std::to_string(threads) + " OPENBLAS_NUM_THREADS=" + std::to_string(threads) + " ";
  const std::string cmd = env + quoted(python) + " bench/contrastive_peer.py --dir " + quoted(dir.string()) + " --n " +
                          std::to_string(n) + " --dim " + std::to_string(d) + " --ranks " + std::to_string(ranks) +
                          " --rank " + std::to_string(rank) + " --t " + t_text + " --threads " +
                          std::to_string(threads) + " --reps " + std::to_string(reps) + " --warmup " +
                          std::to_string(warmup) + (cuda ? " --device cuda" : "") + (tf32 ? " --tf32" : "");
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) throw std::runtime_error("cannot run " + cmd);
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, pipe)) out += buf;
  if (pclose(pipe) != 0) throw std::runtime_error("the peer failed: " + cmd + "\n" + out);
  Peer p;
  const auto at = out.find("peer single_median_s=");
  if (at == std::string::npos ||
      std::sscanf(out.c_str() + at, "peer single_median_s=%lf local_median_s=%lf", &p.single_s, &p.local_s) != 2)
    throw std::runtime_error("no result line from the peer:\n" + out);
  p.line = out.substr(at, out.find('\n', at) - at);
  if (const auto peak = out.find("peak_mib=", at); peak != std::string::npos)
    std::sscanf(out.c_str() + peak, "peak_mib=%lf %lf", &p.single_mib, &p.local_mib);
  return p;
}

// What runs braid's side: the host ops called directly, or a device backend.
struct Runner {
  std::shared_ptr<nn::DeviceBackend> backend;  // null for --device cpu
  std::unique_ptr<nn::Ops> ops;
  Tensor on(const Tensor& host) const { return backend ? backend->upload(host) : host; }
  Tensor back(const Tensor& t) const { return backend && !t.device().is_host() ? backend->download(t) : t; }
  void wait() const {
    if (backend) backend->synchronize();
  }
  double in_use_mib() const { return backend ? static_cast<double>(backend->memory_stats().in_use) / (1 << 20) : 0.0; }
};

Runner make_runner(const Options& o) {
  Runner r;
  if (o.device == "cpu") {
    r.ops = std::make_unique<nn::HostOps>(o.threads);
    return r;
  }
  r.backend = nn::DeviceBackend::open_for_process(o.device, o.threads, 0);
  r.ops = std::make_unique<nn::DeviceOps>(r.backend);
  return r;
}

// A step's result with its tensors on the host, for the comparison.
StepResult to_host(const Runner& r, StepResult s) {
  s.dimage = r.back(s.dimage);
  s.dtext = r.back(s.dtext);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  try {
    const int64_t N = o.quick ? 512 : o.big ? 32768 : 4096, D = o.big ? 1024 : 512;
    const int ranks = 4, rank = 1, reps = o.quick ? 3 : o.big ? 5 : 7, warmup = o.quick || o.big ? 1 : 2;
    const int64_t n = N / ranks, offset = rank * n;
    const auto t = static_cast<float>(std::log(1.0 / 0.07));  // CLIP's initial temperature
    openblas_set_num_threads(o.threads);
    nn::HostOps host(o.threads);
    if (o.tf32) ::setenv("BRAID_CUDA_TF32", "1", 1);  // read where the backend's stream takes its cuBLAS handle
    const Runner run = make_runner(o);
    const bool cuda = o.device == "cuda";

    uint64_t state = 20240501;
    const Tensor image = lcg_tensor(N, D, state), text = lcg_tensor(N, D, state);
    Tensor all_image, all_text;  // what the all-gather of normalised rows delivers
    host.l2_normalize_forward(image, all_image);
    host.l2_normalize_forward(text, all_text);
    const Tensor local_image = rows_of(image, offset, n), local_text = rows_of(text, offset, n);

    std::printf(
        "braid contrastive loss, forward + backward: N=%lld, D=%lld, float32%s, %s, %d threads, median of %d "
        "after %d warm-up\n\n",
        static_cast<long long>(N), static_cast<long long>(D), o.tf32 ? " (TF32 GEMMs on both sides)" : "",
        o.device == "cpu" ? "host ops" : (o.device + " backend (" + run.backend->info().name + ")").c_str(), o.threads,
        reps, warmup);
    const Tensor image_d = run.on(image), text_d = run.on(text), all_image_d = run.on(all_image),
                 all_text_d = run.on(all_text), local_image_d = run.on(local_image), local_text_d = run.on(local_text);
    run.wait();
    StepResult single, local;
    double base = run.in_use_mib();
    const double single_s = median_seconds(
        reps, warmup,
        [&] {
          StepResult r = single_step(*run.ops, image_d, text_d, t);
          run.wait();
          return r;
        },
        &single);
    const double single_mib =
        run.backend ? static_cast<double>(run.backend->memory_stats().peak_in_use) / (1 << 20) - base : 0.0;
    single = to_host(run, std::move(single));
    base = run.in_use_mib();
    const double local_s = median_seconds(
        reps, warmup,
        [&] {
          StepResult r = local_step(*run.ops, local_image_d, local_text_d, all_image_d, all_text_d, offset, t);
          run.wait();
          return r;
        },
        &local);
    local = to_host(run, std::move(local));

    const auto python = find_torch_python(BRAID_BENCH_PYTHON3);
    std::optional<Peer> peer;
    bool same = true;
    if (python) {
      const TempDir dir("braid-contrastive");
      write_floats(dir.path / "image.bin", image);
      write_floats(dir.path / "text.bin", text);
      peer = run_peer(*python, dir.path, N, D, ranks, rank, t, o.threads, reps, warmup, cuda, o.tf32);
      std::printf("check against PyTorch on the same inputs (max |braid - torch| / max |torch|, tolerance %.0e):\n",
                  o.tolerance());
      same = compare("single device", single, read_peer(dir.path / "single.bin", image, text), 1.0f, o.tolerance()) &&
             same;
      const std::string what = "rank " + std::to_string(rank) + " of " + std::to_string(ranks);
      same = compare(what.c_str(), local, read_peer(dir.path / "local.bin", local_image, local_text),
                     static_cast<float>(ranks), o.tolerance()) &&
             same;
      std::printf("  %s (%s)\n\n", peer->line.c_str(), python->c_str());
    } else {
      std::printf("check against PyTorch: skipped: no torch\n\n");
    }

    std::printf("  %-34s %10s %10s %9s  %s\n", "form", "braid_s", "pytorch_s", "speedup", "goal");
    const std::string single_name = "single device (" + std::to_string(N) + " x " + std::to_string(N) + ")";
    const std::string local_name =
        "one rank of " + std::to_string(ranks) + " (" + std::to_string(n) + " x " + std::to_string(N) + ")";
    bool met = true;
    auto row = [&](const std::string& name, double braid_s, double peer_s, bool has_goal) {
      if (!peer) {
        std::printf("  %-34s %10.4f %10s %9s  %s\n", name.c_str(), braid_s, "-", "-",
                    has_goal ? ">= 1.3x: skipped: no torch" : "");
        return;
      }
      const double speedup = peer_s / braid_s;
      if (has_goal) met = met && speedup >= kGoal;
      std::printf("  %-34s %10.4f %10.4f %8.2fx  %s\n", name.c_str(), braid_s, peer_s, speedup,
                  has_goal ? (speedup >= kGoal ? ">= 1.3x: met" : ">= 1.3x: MISSED") : "(no goal)");
    };
    row(single_name, single_s, peer ? peer->single_s : 0.0, !o.quick);  // the goals are at full size
    row(local_name, local_s, peer ? peer->local_s : 0.0, false);
    if (cuda) {  // peak device memory beyond the inputs, single device
      const bool less = peer && single_mib < peer->single_mib;
      if (peer && !o.quick) met = met && less;
      std::printf("  %-34s %10.1f %10s %9s  %s\n", "single device peak MiB", single_mib,
                  peer ? std::to_string(static_cast<long long>(peer->single_mib)).c_str() : "-", "",
                  !peer  ? "below PyTorch's: skipped: no torch"
                  : less ? "below PyTorch's: met"
                         : "below PyTorch's: MISSED");
    }
    if (!same) {
      std::fprintf(stderr, "contrastive_bench: braid and PyTorch disagree beyond %.0e\n", o.tolerance());
      return 1;
    }
    return met || o.quick ? 0 : 1;  // the quick ctest entry asserts no wall-clock bound
  } catch (const std::exception& e) {
    std::fprintf(stderr, "contrastive_bench: %s\n", e.what());
    return 1;
  }
}
