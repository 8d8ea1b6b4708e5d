// What `braid calibrate` measures on one process: the reference ops of core/nn timed at a
// ladder of sizes (GEMMs through the linear op, element-wise kernels, attention) and the
// memory bandwidth, while every process of the launch measures the same case at once (the
// caller holds them in step), so shared caches, memory channels and oversubscribed cores
// show in the figures as they do in a training step.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace braid::nn {
class DeviceBackend;
}

namespace braid::calibrate {

// One timed case: what was run, how much work it is, and the seconds one run took.
struct Timing {
  std::string what;
  double work = 0;  // FLOPs (GEMMs, attention) or bytes moved (memory, element-wise)
  double seconds = 0;
};

struct ComputeOptions {
  int threads = 1;     // host threads per process, as `braid train --threads`
  bool quick = false;  // smaller ladders and shorter timings (tests, CI)
  // The device the ops run on (nn::DeviceOps, its stream waited for after every call), or
  // null for the host ops called directly. A GPU gets ladders of GPU-sized cases.
  std::shared_ptr<nn::DeviceBackend> device;
};

// Calls `between(case index, case count, name)` before each case; the caller uses it to
// keep the processes in step (a barrier) and to show progress.
using CaseHook = std::function<void(int index, int count, const std::string& what)>;

// The middle of the repeats of a measurement (the upper one of an even count), so that a
// repeat the host's other work slowed does not move it; 0 for none.
double median(std::vector<double> repeats);

// The time of one call of `run`: repeats it for at least `min_seconds` per batch, and
// returns the median over `batches` batches of the mean call time. On a device, `run` only
// queues work: `wait` (the stream's) follows every `group` calls, so that the calls run back
// to back as a training step's ops do, and a call costs its run or its launch, not a wait.
double time_call(const std::function<void()>& run, double min_seconds, int batches = 5,
                 const std::function<void()>& wait = {}, int group = 1);

// Forward + backward of the linear op (y = x W^T; dx and dW) at a ladder of shapes, from
// the per-head products of small attention up to the largest layers a host trains.
std::vector<Timing> measure_gemms(const ComputeOptions& o, const CaseHook& between);
// One case of that ladder: the linear op's forward + backward (no bias) of `rows` x `width`
// activations through a `width` x `width` weight, in seconds.
double time_linear(const ComputeOptions& o, std::int64_t rows, std::int64_t width);
// Triad a = b + s c over arrays far larger than the caches: bytes/s of one process (on a
// GPU, a device-to-device copy of 1 GiB: bytes read and written).
Timing measure_memory_bandwidth(const ComputeOptions& o, const CaseHook& between);
// Layer norm and GELU, forward and then backward as cases of their own (named "element-wise
// forward/backward ..."), at a ladder of sizes; work is the bytes the cost model charges them
// (a backward: twice its forward's); AdamW's step over as many parameters ("optimizer ...",
// work: 32 bytes a parameter, as the cost model charges a float32 step); and the residual add
// ("streaming add ...", work: 12 bytes an element).
std::vector<Timing> measure_elementwise(const ComputeOptions& o, const CaseHook& between);
// What measure_elementwise's case names begin with: fit() sorts the cases into tables by them.
inline constexpr const char* kElementwiseForward = "element-wise forward";
inline constexpr const char* kElementwiseBackward = "element-wise backward";
inline constexpr const char* kOptimizerStep = "optimizer";
inline constexpr const char* kStreamingAdd = "streaming add";
inline constexpr int kElementwiseCasesPerSize = 4;
// braid's attention op (the host's materialised softmax): forward and backward calls over a
// batch of samples and heads, each reported per head of one sample (the call's time and FLOPs
// over batch x heads: the host op runs head by head, so its speed follows one head's size),
// FLOPs as fused kernels count them (4 s^2 d forward, 2.5x that backward). The backward reads
// its saved inputs out of the caches, as in a step.
std::vector<Timing> measure_attention(const ComputeOptions& o, const CaseHook& between);

// What a host core takes to make one sample of braid's dataset (core/data/shapes.hpp), as a
// data worker of braid train does: rendered at a ladder of image sides (work: its pixels;
// named "render ...") and described without its image (work 1; named "describe"). Always on
// the host's CPU, whatever `o.device`: the workers render there.
std::vector<Timing> measure_samples(const ComputeOptions& o, const CaseHook& between);
inline constexpr const char* kRenderSample = "render";
inline constexpr const char* kDescribeSample = "describe";
int sample_case_count(const ComputeOptions& o);

// How many cases each measure_* runs (for a progress bar that knows its end), and how many
// of them measure_gemms runs.
int compute_case_count(const ComputeOptions& o);
int gemm_case_count(const ComputeOptions& o);

}  // namespace braid::calibrate
