#include "capi/src/cuda_contrastive.hpp"

#include <memory>
#include <mutex>
#include <string>

#include "core/common/error.hpp"
#include "core/runtime/plugin_loader.hpp"

namespace braid::capi {
namespace {

// The CUDA plugin, loaded on first use and kept for the process's life.
const braid_device_plugin_v2& cuda_plugin() {
  static std::mutex mutex;
  static std::unique_ptr<runtime::DevicePlugin> plugin;
  std::lock_guard lock(mutex);
  if (!plugin) {
    auto loaded = runtime::load_device_plugin("cuda");
    if (!loaded->v2())
      throw Error(Status::plugin, loaded->path() + " implements device interface 1 only; CUDA tensors need 2");
    if (!loaded->unavailable_reason().empty())
      throw Error(Status::plugin, "CUDA tensors: the CUDA backend is unavailable: " + loaded->unavailable_reason());
    plugin = std::move(loaded);
  }
  return *plugin->v2();
}

void check(int rc, const char* error, const char* op) {
  if (rc == 0) return;
  throw Error(rc == BRAID_DEVICE_INVALID_ARGUMENT ? Status::invalid_argument : Status::plugin,
              std::string("cuda backend: ") + op + ": " + (error[0] ? error : "failed"));
}

// The caller's stream for the plugin's calls; the wrapper goes, the stream stays.
class WrappedStream {
 public:
  WrappedStream(const braid_device_plugin_v2& api, int32_t device, void* native) : api_(api) {
    char error[1024] = "";
    check(api_.stream_wrap(device, native, &stream_, error, sizeof error), error, "wrapping the stream");
  }
  ~WrappedStream() {
    char error[1024] = "";
    api_.stream_destroy(stream_, error, sizeof error);
  }
  WrappedStream(const WrappedStream&) = delete;
  WrappedStream& operator=(const WrappedStream&) = delete;
  braid_device_stream_v2 get() const { return stream_; }

 private:
  const braid_device_plugin_v2& api_;
  braid_device_stream_v2 stream_ = nullptr;
};

template <class T>
braid_device_tensor_v2 describe(const nn::RowsView<T>& v) {
  braid_device_tensor_v2 d{};
  d.data = const_cast<float*>(v.data);
  d.dtype = BRAID_DEVICE_F32;
  d.rank = 2;
  d.shape[0] = v.rows;
  d.shape[1] = v.cols;
  return d;
}

braid_device_tensor_v2 describe(const nn::ContrastiveStats& s, int64_t n) {
  return describe(nn::RowsView<float>{s.image_to_text, 2, n, n});
}

struct Inputs {
  braid_device_tensor_v2 li, lt, ai, at;
  explicit Inputs(const nn::ContrastiveProblem& p)
      : li(describe(p.local_image)), lt(describe(p.local_text)), ai(describe(p.all_image)), at(describe(p.all_text)) {}
};

void require_adjacent(const nn::ContrastiveStats& s, int64_t n) {
  if (s.text_to_image != s.image_to_text + n)
    throw Error(Status::unsupported, "CUDA tensors: stats must be one dense (2, n) tensor");
}

}  // namespace

double cuda_contrastive_forward(const nn::ContrastiveProblem& problem, const nn::ContrastiveStats& stats,
                                int32_t device, void* stream) {
  const auto& api = cuda_plugin();
  const int64_t n = problem.local_image.rows;
  require_adjacent(stats, n);
  const WrappedStream s(api, device, stream);
  Inputs in(problem);
  braid_device_tensor_v2 st = describe(stats, n);
  double sum = 0.0;
  char error[1024] = "";
  check(api.ops->contrastive_forward(s.get(), &in.li, &in.lt, &in.ai, &in.at, problem.row_offset, problem.logit_scale,
                                     problem.tile, &st, &sum, error, sizeof error),
        error, "contrastive_forward");
  return sum;
}

// Device memory for one call, from the plugin's pool, given back on the stream.
class Scratch {
 public:
  Scratch(const braid_device_plugin_v2& api, int32_t device, braid_device_stream_v2 stream, std::size_t bytes)
      : api_(api), device_(device), stream_(stream) {
    char error[1024] = "";
    check(api_.alloc(device, bytes, stream, &ptr_, error, sizeof error), error, "allocating scratch memory");
  }
  ~Scratch() {
    char error[1024] = "";
    api_.free(device_, ptr_, stream_, error, sizeof error);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  float* get() const { return static_cast<float*>(ptr_); }

 private:
  const braid_device_plugin_v2& api_;
  int32_t device_;
  braid_device_stream_v2 stream_;
  void* ptr_ = nullptr;
};

double cuda_contrastive_backward(const nn::ContrastiveProblem& problem, const nn::ContrastiveStats& stats,
                                 double weight, const nn::ContrastiveGradViews& grads, int32_t device, void* stream) {
  const auto& api = cuda_plugin();
  const int64_t n = problem.local_image.rows, e = problem.local_image.cols;
  require_adjacent(stats, n);
  const WrappedStream s(api, device, stream);
  Inputs in(problem);
  braid_device_tensor_v2 st = describe(stats, n);
  nn::RowsView<float> local[2] = {grads.local_image, grads.local_text};
  nn::RowsView<float> all[2] = {grads.all_image, grads.all_text};
  // Local and gathered rows in the same memory (one process): the header promises each
  // modality's whole gradient in one tensor, local_* (all_* without it), the other zeroed.
  // The backend splits it between the two, so a missing one gets scratch memory here and
  // the halves are added after the call.
  const bool one_process = n == problem.all_image.rows;  // a prefix view of more rows is not
  const bool same[2] = {one_process && problem.local_image.data == problem.all_image.data,
                        one_process && problem.local_text.data == problem.all_text.data};
  std::unique_ptr<Scratch> scratch[2];
  for (int m = 0; m < 2; ++m) {
    if (!same[m] || (!local[m].data && !all[m].data)) continue;
    nn::RowsView<float>& missing = local[m].data ? all[m] : local[m];
    if (missing.data) continue;
    scratch[m] = std::make_unique<Scratch>(api, device, s.get(), static_cast<std::size_t>(n * e) * sizeof(float));
    missing = {scratch[m]->get(), n, e, e};
  }
  braid_device_tensor_v2 g[4] = {describe(local[0]), describe(local[1]), describe(all[0]), describe(all[1])};
  const bool given[4] = {local[0].data != nullptr, local[1].data != nullptr, all[0].data != nullptr,
                         all[1].data != nullptr};
  double d_scale = 0.0;
  char error[1024] = "";
  check(api.ops->contrastive_backward(s.get(), &in.li, &in.lt, &in.ai, &in.at, problem.row_offset, problem.logit_scale,
                                      problem.tile, &st, weight, given[0] ? &g[0] : nullptr, given[1] ? &g[1] : nullptr,
                                      given[2] ? &g[2] : nullptr, given[3] ? &g[3] : nullptr, &d_scale, error,
                                      sizeof error),
        error, "contrastive_backward");
  const nn::RowsView<float> caller_local[2] = {grads.local_image, grads.local_text};
  for (int m = 0; m < 2; ++m) {
    if (!same[m] || !given[m] || !given[2 + m]) continue;
    const bool into_local = caller_local[m].data != nullptr;
    braid_device_tensor_v2& target = g[into_local ? m : 2 + m];
    braid_device_tensor_v2& other = g[into_local ? 2 + m : m];
    check(api.ops->add(s.get(), &target, &other, error, sizeof error), error, "contrastive_backward (sum)");
    check(api.memset_zero(other.data, static_cast<std::size_t>(n * e) * sizeof(float), s.get(), error, sizeof error),
          error, "contrastive_backward (zero)");
  }
  return d_scale;  // the additions stay ordered on the caller's stream
}

}  // namespace braid::capi
