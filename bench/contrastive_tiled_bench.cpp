// Tiled contrastive-loss benchmark (Inf-CL): braid's tiled kernel (core/nn/contrastive_tiled,
// what braid_contrastive_forward/backward run, called here the way they call it: forward,
// then backward from the forward's stats) against the naive N x N formulation (every logit
// stored, row and column softmaxes, three GEMMs), in the same run, on the same inputs:
// one process (n = N, local and gathered rows the same memory), E = 512, float32.
//  - time of forward + backward, median of the runs;
//  - memory beyond the inputs and gradients: the heap each allocates at its peak (every
//    operator new of this process, tracked) and the growth of the peak RSS (VmHWM, reset
//    through /proc/self/clear_refs before each run);
//  - the two agree within 1e-5 (max |a - b| / max |b| of the loss, both gradients and
//    d loss / d logit_scale), or the run fails.
// --big adds N = 65,536 (where the naive logits alone would take 16 GiB), tiled only:
// forward and backward time, and the memory beyond inputs and gradients, which must stay
// under 1 GiB or the run fails.
//
// usage: contrastive_tiled_bench [--quick] [--big] [--threads T] [--tile W] [--format table|json]
//   full: N = 2048, 4096, 8192, median of 3 runs of each, alternating, after the memory
//   runs; quick (what ctest runs): N = 512, 1024, one run. It asserts no wall-clock bound.
//   T: threads of the passes and of OpenBLAS (default: every hardware thread).
//   W: the kernel's tile (default 0: its default, 512 columns).
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/quick_flag.hpp"
#include "core/nn/blas.hpp"
#include "core/nn/contrastive_tiled.hpp"
#include "core/nn/float4.hpp"
#include "core/nn/parallel.hpp"

// ---- heap accounting: every operator new/delete of this process --------------------
namespace {
std::atomic<long long> heap_now{0}, heap_peak{0};
void note_alloc(void* p) {
  const long long now = heap_now += static_cast<long long>(malloc_usable_size(p));
  long long peak = heap_peak.load();
  while (now > peak && !heap_peak.compare_exchange_weak(peak, now)) {
  }
}
}  // namespace

void* operator new(std::size_t n) {
  void* p = std::malloc(n ? n : 1);
  if (!p) throw std::bad_alloc();
  note_alloc(p);
  return p;
}
// GCC pairs an inlined standard allocator's `new` with this free() and warns; they match.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept {
  if (!p) return;
  heap_now -= static_cast<long long>(malloc_usable_size(p));
  std::free(p);
}
#pragma GCC diagnostic pop
void operator delete(void* p, std::size_t) noexcept { operator delete(p); }

namespace {

using namespace braid;
using Clock = std::chrono::steady_clock;

constexpr double kTolerance = 1e-5;
constexpr double kBigLimitMib = 1024.0;
constexpr int64_t kE = 512;

struct Options {
  bool quick = false, big = false, json = false;
  int threads = 0;
  int64_t tile = 0;
};

Options parse(int argc, char** argv) {
  Options o;
  constexpr const char* kUsage =
      "usage: contrastive_tiled_bench [--quick] [--big] [--threads T] [--tile W] [--format table|json]\n";
  bench::exit_on_help(argc, argv, kUsage);
  auto usage = [] {
    std::fprintf(stderr, "%s", kUsage);
    std::exit(2);
  };
  auto number = [&](const char* text, long low, long high) {
    char* end = nullptr;
    const long v = std::strtol(text, &end, 10);
    if (*end != '\0' || v < low || v > high) usage();
    return v;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") {
      o.quick = true;
    } else if (arg == "--big") {
      o.big = true;
    } else if (arg == "--threads" && i + 1 < argc) {
      o.threads = static_cast<int>(number(argv[++i], 1, 1024));
    } else if (arg == "--tile" && i + 1 < argc) {
      o.tile = number(argv[++i], 0, 1 << 20);
    } else if (arg == "--format" && i + 1 < argc) {
      const std::string f = argv[++i];
      if (f != "table" && f != "json") usage();
      o.json = f == "json";
    } else {
      usage();
    }
  }
  if (o.threads == 0) o.threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return o;
}

// ---- memory -------------------------------------------------------------------------

// kB of a /proc/self/status line ("VmHWM:", "VmRSS:"), or -1.
long long status_kb(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) return std::atoll(line.c_str() + std::string(key).size());
  return -1;
}

struct Memory {
  double heap_mib = 0.0;  // tracked heap at the peak, beyond what was live before
  double rss_mib = -1.0;  // peak RSS growth; -1: the kernel does not let us reset the peak
};

// Sets VmHWM to the current RSS (Linux >= 4.0); false where that is not allowed.
bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

// Runs fn once and measures what it adds at its peak.
Memory measure(const std::function<void()>& fn) {
  const bool reset = reset_peak_rss();
  const long long rss_before = status_kb("VmRSS:");
  const long long before = heap_now.load();
  heap_peak = before;
  fn();
  Memory m;
  m.heap_mib = static_cast<double>(heap_peak.load() - before) / 1048576.0;
  const long long hwm = status_kb("VmHWM:");
  if (reset && rss_before >= 0 && hwm >= 0) m.rss_mib = static_cast<double>(hwm - rss_before) / 1024.0;
  return m;
}

double seconds_of(const std::function<void()>& fn) {
  const auto t0 = Clock::now();
  fn();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> times) {
  std::sort(times.begin(), times.end());
  const std::size_t m = times.size() / 2;
  return times.size() % 2 ? times[m] : (times[m - 1] + times[m]) / 2;
}

// ---- inputs and results ----------------------------------------------------------------

// N x E, uniform in [-1, 1) from a 64-bit LCG (Knuth's MMIX constants), rows L2-normalised.
std::vector<float> normalized_rows(int64_t rows, uint64_t& state) {
  std::vector<float> m(static_cast<std::size_t>(rows * kE));
  for (int64_t r = 0; r < rows; ++r) {
    double norm = 0.0;
    float* x = m.data() + r * kE;
    for (int64_t c = 0; c < kE; ++c) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      x[c] = static_cast<float>(static_cast<double>(state >> 40) / 8388608.0 - 1.0);
      norm += static_cast<double>(x[c]) * x[c];
    }
    for (int64_t c = 0; c < kE; ++c) x[c] = static_cast<float>(x[c] / std::sqrt(norm));
  }
  return m;
}

// A result's loss, d/ds and gradients (caller-allocated, so they do not count as memory).
struct Result {
  double loss = 0.0, d_scale = 0.0;
  std::vector<float> d_image, d_text;
  explicit Result(int64_t rows)
      : d_image(static_cast<std::size_t>(rows * kE), 0.0f), d_text(static_cast<std::size_t>(rows * kE), 0.0f) {}
};

double relative(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return diff / std::max(scale, 1e-30);
}

double max_error(const Result& tiled, const Result& naive) {
  return std::max({std::abs(tiled.loss - naive.loss) / std::abs(naive.loss), relative(tiled.d_image, naive.d_image),
                   relative(tiled.d_text, naive.d_text),
                   std::abs(tiled.d_scale - naive.d_scale) / std::abs(naive.d_scale)});
}

// ---- the two formulations -----------------------------------------------------------

// The kernel as the C ABI calls it: forward (stats out), then backward of the loss
// (1 / 2N) * sum of cross-entropies, gradients to the local views (one process).
void tiled(const std::vector<float>& image, const std::vector<float>& text, int64_t total, float s, int64_t tile,
           int threads, Result& out) {
  nn::ContrastiveProblem p;
  p.local_image = p.all_image = {image.data(), total, kE, kE};
  p.local_text = p.all_text = {text.data(), total, kE, kE};
  p.logit_scale = s;
  p.tile = tile;
  p.threads = threads;
  std::vector<float> lse(static_cast<std::size_t>(2 * total));
  const nn::ContrastiveStats stats{lse.data(), lse.data() + total};
  const double weight = 1.0 / (2.0 * static_cast<double>(total));
  out.loss = nn::contrastive_tiled_forward(p, stats) * weight;
  nn::ContrastiveGradViews grads;
  grads.local_image = {out.d_image.data(), total, kE, kE};
  grads.local_text = {out.d_text.data(), total, kE, kE};
  out.d_scale = nn::contrastive_tiled_backward(p, stats, weight, grads);
}

// The N x N formulation: L = s I T^T stored whole; each row's and each column's
// log-sum-exp; dL = (softmax over the row + softmax over the column - 2 I) / 2N in place;
// dI = s dL T, dT = s dL^T I. The same vectorised exp as the kernel, threads over rows
// and column blocks.
void naive(const std::vector<float>& image, const std::vector<float>& text, int64_t total, float s, int threads,
           Result& out) {
  using namespace nn::f4;
  const auto n2 = static_cast<std::size_t>(total * total);
  std::vector<float> l(n2);
  nn::gemm(false, true, total, total, kE, s, image.data(), kE, text.data(), kE, 0.0f, l.data(), total);
  std::vector<float> row_lse(static_cast<std::size_t>(total)), col_lse(row_lse.size());
  const int64_t chunk = nn::chunk_for(20.0 * static_cast<double>(total));
  nn::parallel_for(threads, total, chunk, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* x = l.data() + i * total;
      const float m = *std::max_element(x, x + total);
      double sum = 0.0;
      int64_t j = 0;
      for (; j + kWidth <= total; j += kWidth) sum += sum_lanes(exp4(load(x + j) - splat(m)));
      for (; j < total; ++j) sum += std::exp(static_cast<double>(x[j]) - m);
      row_lse[static_cast<std::size_t>(i)] = static_cast<float>(m + std::log(sum));
    }
  });
  constexpr int64_t kBlock = 64;  // columns per task: each row contributes 64 contiguous floats
  nn::parallel_for(threads, (total + kBlock - 1) / kBlock, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> m(kBlock);
    std::vector<double> sum(kBlock);
    for (int64_t b = begin; b < end; ++b) {
      const int64_t j0 = b * kBlock, w = std::min(kBlock, total - j0);
      std::fill(m.begin(), m.end(), kMinusInf);
      std::fill(sum.begin(), sum.end(), 0.0);
      for (int64_t i = 0; i < total; ++i)
        for (int64_t j = 0; j < w; ++j) m[j] = std::max(m[j], l[i * total + j0 + j]);
      for (int64_t i = 0; i < total; ++i) {
        int64_t j = 0;
        for (; j + kWidth <= w; j += kWidth) {
          const F4 e = exp4(load(l.data() + i * total + j0 + j) - load(m.data() + j));
          for (int64_t k = 0; k < kWidth; ++k) sum[j + k] += e[k];
        }
        for (; j < w; ++j) sum[j] += std::exp(static_cast<double>(l[i * total + j0 + j]) - m[j]);
      }
      for (int64_t j = 0; j < w; ++j) col_lse[j0 + j] = static_cast<float>(m[j] + std::log(sum[j]));
    }
  });
  const double weight = 1.0 / (2.0 * static_cast<double>(total));
  double loss = 0.0;
  for (int64_t i = 0; i < total; ++i) loss += row_lse[i] + col_lse[i] - 2.0 * l[i * total + i];
  out.loss = loss * weight;
  std::vector<double> row_d(static_cast<std::size_t>(total));
  const F4 wt = splat(static_cast<float>(weight));
  nn::parallel_for(threads, total, chunk, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float* x = l.data() + i * total;
      const float diagonal = x[i];
      const F4 a = splat(row_lse[i]);
      double d = 0.0;
      int64_t j = 0;
      for (; j + kWidth <= total; j += kWidth) {
        const F4 v = load(x + j), g = (exp4(v - a) + exp4(v - load(col_lse.data() + j))) * wt;
        d += sum_lanes(g * v);
        store(x + j, g);
      }
      for (; j < total; ++j) {
        const double g =
            (std::exp(static_cast<double>(x[j]) - row_lse[i]) + std::exp(static_cast<double>(x[j]) - col_lse[j])) *
            weight;
        d += g * x[j];
        x[j] = static_cast<float>(g);
      }
      x[i] -= static_cast<float>(2.0 * weight);
      row_d[static_cast<std::size_t>(i)] = d - 2.0 * weight * diagonal;
    }
  });
  double d = 0.0;
  for (double x : row_d) d += x;
  out.d_scale = d / s;  // d logits / d s = logits / s
  nn::gemm(false, false, total, kE, total, s, l.data(), total, text.data(), kE, 0.0f, out.d_image.data(), kE);
  nn::gemm(true, false, total, kE, total, s, l.data(), total, image.data(), kE, 0.0f, out.d_text.data(), kE);
}

// ---- the runs ---------------------------------------------------------------------------

struct Row {
  int64_t total = 0;
  double tiled_s = 0.0, naive_s = 0.0, error = 0.0;
  Memory tiled_memory, naive_memory;
  bool ok() const { return error <= kTolerance; }
};

struct Big {
  int64_t total = 0;
  double forward_s = 0.0, backward_s = 0.0;
  Memory memory;
  double loss = 0.0;
  bool ok() const { return memory.heap_mib < kBigLimitMib && (memory.rss_mib < 0 || memory.rss_mib < kBigLimitMib); }
};

double mib(double bytes) { return bytes / 1048576.0; }

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  // A fixed mmap threshold (glibc otherwise raises it after each free of a large block):
  // buffers of 1 MiB and more come from mmap and go back on free, so each measured run's
  // RSS growth counts its own buffers, not pages an earlier run left resident.
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  try {
    nn::set_blas_threads(o.threads);
    const float s = static_cast<float>(1.0 / 0.07);  // CLIP's initial temperature
    const std::vector<int64_t> sizes =
        o.quick ? std::vector<int64_t>{512, 1024} : std::vector<int64_t>{2048, 4096, 8192};
    const int reps = o.quick ? 1 : 3;
    if (!o.json) {
      std::printf(
          "braid tiled contrastive loss (Inf-CL) vs the naive N x N formulation: one process (n = N), E = %lld, "
          "float32,\nforward + backward, %d threads, tile %lld%s, median of %d; memory beyond inputs and gradients "
          "(heap: tracked\noperator new at the peak; RSS: peak growth)\n\n",
          static_cast<long long>(kE), o.threads, static_cast<long long>(o.tile), o.tile ? "" : " (default)", reps);
      std::printf("  %6s %9s %9s %8s %12s %12s %11s %11s %10s\n", "N", "tiled_s", "naive_s", "ratio", "tiled_heap",
                  "naive_heap", "tiled_rss", "naive_rss", "max_error");
      std::fflush(stdout);
    }
    std::vector<Row> rows;
    for (int64_t total : sizes) {
      uint64_t state = 20241017;
      const std::vector<float> image = normalized_rows(total, state), text = normalized_rows(total, state);
      Result a(total), b(total);
      Row row;
      row.total = total;
      // The memory runs are the warm-up (OpenBLAS's buffers and the gradients' pages are
      // touched by the first call of each before the second is measured).
      tiled(image, text, total, s, o.tile, o.threads, a);
      row.tiled_memory = measure([&] { tiled(image, text, total, s, o.tile, o.threads, a); });
      row.naive_memory = measure([&] { naive(image, text, total, s, o.threads, b); });
      std::vector<double> tiled_times, naive_times;  // alternating, so load changes hit both alike
      for (int rep = 0; rep < reps; ++rep) {
        tiled_times.push_back(seconds_of([&] { tiled(image, text, total, s, o.tile, o.threads, a); }));
        naive_times.push_back(seconds_of([&] { naive(image, text, total, s, o.threads, b); }));
      }
      row.tiled_s = median(tiled_times);
      row.naive_s = median(naive_times);
      row.error = max_error(a, b);
      rows.push_back(row);
      if (!o.json) {  // row by row: the large sizes take a while
        std::printf("  %6lld %9.3f %9.3f %7.2fx %8.1f MiB %8.1f MiB %7.1f MiB %7.1f MiB %10.1e %s\n",
                    static_cast<long long>(row.total), row.tiled_s, row.naive_s, row.naive_s / row.tiled_s,
                    row.tiled_memory.heap_mib, row.naive_memory.heap_mib, row.tiled_memory.rss_mib,
                    row.naive_memory.rss_mib, row.error, row.ok() ? "ok" : "MISMATCH");
        std::fflush(stdout);
      }
    }

    std::optional<Big> big;
    if (o.big) {
      Big r;
      r.total = 65536;
      uint64_t state = 20241017;
      const std::vector<float> image = normalized_rows(r.total, state), text = normalized_rows(r.total, state);
      Result out(r.total);  // gradients, touched
      nn::ContrastiveProblem p;
      p.local_image = p.all_image = {image.data(), r.total, kE, kE};
      p.local_text = p.all_text = {text.data(), r.total, kE, kE};
      p.logit_scale = s;
      p.tile = o.tile;
      p.threads = o.threads;
      std::vector<float> lse(static_cast<std::size_t>(2 * r.total));  // the stats: an output of the forward
      const nn::ContrastiveStats stats{lse.data(), lse.data() + r.total};
      nn::ContrastiveGradViews grads;
      grads.local_image = {out.d_image.data(), r.total, kE, kE};
      grads.local_text = {out.d_text.data(), r.total, kE, kE};
      const double weight = 1.0 / (2.0 * static_cast<double>(r.total));
      r.memory = measure([&] {
        auto t0 = Clock::now();
        r.loss = nn::contrastive_tiled_forward(p, stats) * weight;
        r.forward_s = std::chrono::duration<double>(Clock::now() - t0).count();
        t0 = Clock::now();
        nn::contrastive_tiled_backward(p, stats, weight, grads);
        r.backward_s = std::chrono::duration<double>(Clock::now() - t0).count();
      });
      big = r;
    }

    const bool same = std::all_of(rows.begin(), rows.end(), [](const Row& r) { return r.ok(); });
    if (o.json) {
      nlohmann::json out = {{"bench", "contrastive_tiled"},
                            {"quick", o.quick},
                            {"threads", o.threads},
                            {"E", kE},
                            {"tile", o.tile},
                            {"form", "one process, n = N, forward + backward"},
                            {"timing", "median"},
                            {"reps", reps},
                            {"tolerance", kTolerance},
                            {"rows", nlohmann::json::array()}};
      for (const Row& r : rows)
        out["rows"].push_back({{"N", r.total},
                               {"tiled_s", r.tiled_s},
                               {"naive_s", r.naive_s},
                               {"naive_over_tiled", r.naive_s / r.tiled_s},
                               {"tiled_heap_mib", r.tiled_memory.heap_mib},
                               {"naive_heap_mib", r.naive_memory.heap_mib},
                               {"tiled_rss_mib", r.tiled_memory.rss_mib},
                               {"naive_rss_mib", r.naive_memory.rss_mib},
                               {"max_relative_error", r.error},
                               {"same", r.ok()}});
      if (big)
        out["big"] = {{"N", big->total},
                      {"forward_s", big->forward_s},
                      {"backward_s", big->backward_s},
                      {"total_s", big->forward_s + big->backward_s},
                      {"heap_mib", big->memory.heap_mib},
                      {"rss_mib", big->memory.rss_mib},
                      {"limit_mib", kBigLimitMib},
                      {"loss", big->loss},
                      {"within_limit", big->ok()}};
      else
        out["big"] = nullptr;
      std::printf("%s\n", out.dump(1).c_str());
    } else {
      std::printf("  ratio: naive time / tiled time; the naive logits alone are N^2 floats (%.0f MiB at N = %lld)\n",
                  mib(4.0 * static_cast<double>(sizes.back()) * static_cast<double>(sizes.back())),
                  static_cast<long long>(sizes.back()));
      if (big) {
        std::printf(
            "\nN = %lld, tiled only: forward %.1f s, backward %.1f s, total %.1f s; beyond inputs (%.0f MiB) and "
            "gradients (%.0f MiB):\n  heap %.1f MiB, RSS %.1f MiB (limit %.0f MiB: %s); loss %.6f\n",
            static_cast<long long>(big->total), big->forward_s, big->backward_s, big->forward_s + big->backward_s,
            mib(2.0 * 4.0 * static_cast<double>(big->total * kE)),
            mib(2.0 * 4.0 * static_cast<double>(big->total * kE)), big->memory.heap_mib, big->memory.rss_mib,
            kBigLimitMib, big->ok() ? "met" : "EXCEEDED", big->loss);
      }
    }
    if (!same) {
      std::fprintf(stderr, "contrastive_tiled_bench: tiled and naive disagree beyond %.0e\n", kTolerance);
      return 1;
    }
    if (big && !big->ok()) {
      std::fprintf(stderr, "contrastive_tiled_bench: N = %lld used more than %.0f MiB beyond inputs and gradients\n",
                   static_cast<long long>(big->total), kBigLimitMib);
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "contrastive_tiled_bench: %s\n", e.what());
    return 1;
  }
}
