// libbraid-cuda.so: the CUDA device plugin, through interface v2 (memory, streams,
// events, ops: ops.cpp) and v1 (devices and a self-test) for older braids. It links the
// CUDA runtime statically, so it loads on machines without a driver and says so instead
// of failing; cuBLAS comes from the toolkit's shared library.
//
// GEMMs run in strict fp32 (CUBLAS_PEDANTIC_MATH). BRAID_CUDA_TF32=1 asks for TF32
// tensor-core GEMMs instead (10-bit mantissas in, fp32 accumulation: about 1e-3 relative
// error, several times the fp32 throughput); the frozen interface has no option for it, so the
// variable is read where a stream's cuBLAS handle is taken, and init refuses a value other
// than 0 or 1. Every other kernel stays fp32.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "braid_device_v1.h"
#include "cuda_backend.hpp"

#define BRAID_PLUGIN_EXPORT __attribute__((visibility("default")))

namespace {

int fail(cudaError_t err, const char* what, char* error, size_t size) {
  if (error && size) std::snprintf(error, size, "%s: %s (%s)", what, cudaGetErrorString(err), cudaGetErrorName(err));
  return static_cast<int>(err);
}

bool tf32_requested(std::string* problem) {
  return braid_cuda::env_switch(braid_cuda::kTf32Switch, braid_cuda::kTf32Meaning, problem);
}

int init(char* error, size_t size) {
  for (auto [name, meaning] : {std::pair{braid_cuda::kTf32Switch, braid_cuda::kTf32Meaning},
                               {braid_cuda::kFusedAttentionSwitch, braid_cuda::kFusedAttentionMeaning}}) {
    std::string problem;
    braid_cuda::env_switch(name, meaning, &problem);
    if (!problem.empty()) {
      if (error && size) std::snprintf(error, size, "%s", problem.c_str());
      return BRAID_DEVICE_INVALID_ARGUMENT;
    }
  }
  int driver = 0;
  cudaError_t err = cudaDriverGetVersion(&driver);
  if (err != cudaSuccess) return fail(err, "cudaDriverGetVersion", error, size);
  if (driver == 0) {
    if (error && size) std::snprintf(error, size, "no CUDA driver is installed");
    return static_cast<int>(cudaErrorInsufficientDriver);
  }
  return 0;
}

int device_count(int32_t* count, char* error, size_t size) {
  if (!count) {
    if (error && size) std::snprintf(error, size, "cuda backend: device_count: count is NULL");
    return BRAID_DEVICE_INVALID_ARGUMENT;
  }
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  *count = 0;
  if (err == cudaErrorNoDevice) return 0;  // a driver but no GPU: zero devices, not an error
  if (err != cudaSuccess) return fail(err, "cudaGetDeviceCount", error, size);
  *count = n;
  return 0;
}

int device_properties(int32_t index, braid_device_properties_v1* out, char* error, size_t size) {
  if (!out || out->struct_size < sizeof(braid_device_properties_v1)) {
    if (error && size) std::snprintf(error, size, "properties struct_size too small");
    return static_cast<int>(cudaErrorInvalidValue);
  }
  cudaDeviceProp p{};
  cudaError_t err = cudaGetDeviceProperties(&p, index);
  if (err != cudaSuccess) return fail(err, "cudaGetDeviceProperties", error, size);
  // The name says how GEMMs run, so every report that names the device says it too.
  const std::string name = std::string(p.name) + (tf32_requested(nullptr) ? " (TF32 GEMMs)" : "");
  std::snprintf(out->name, sizeof out->name, "%.*s", static_cast<int>(sizeof out->name - 1), name.c_str());
  out->memory_bytes = p.totalGlobalMem;
  out->multiprocessors = p.multiProcessorCount;
  out->compute_major = p.major;
  out->compute_minor = p.minor;
  out->pci_bus_id = p.pciBusID;
  return 0;
}

void finalize() {}

// ---- interface v2: memory from each device's stream-ordered pool ----

using braid_cuda::guarded;

int device_properties_v2(int32_t index, braid_device_properties_v2* out, char* error, size_t size) {
  if (!out || out->struct_size < sizeof(braid_device_properties_v2)) {
    if (error && size) std::snprintf(error, size, "properties struct_size too small");
    return BRAID_DEVICE_INVALID_ARGUMENT;
  }
  braid_device_properties_v1 v1{};
  v1.struct_size = sizeof v1;
  // v1's codes are CUDA's, and cudaErrorInvalidValue (1) would read as the caller's mistake.
  if (int rc = device_properties(index, &v1, error, size)) return 1000 + rc;
  std::memcpy(out->name, v1.name, sizeof out->name);
  out->memory_bytes = v1.memory_bytes;
  out->multiprocessors = v1.multiprocessors;
  out->compute_major = v1.compute_major;
  out->compute_minor = v1.compute_minor;
  out->pci_bus_id = v1.pci_bus_id;
  out->host_memory = 0;
  return 0;
}

// What alloc handed out, for the statistics; the memory itself is the pool's.
struct Accounting {
  std::mutex mutex;
  std::map<void*, size_t> sizes;
  braid_device_memory_stats_v2 stats{};
};

Accounting& accounting(int32_t device) {
  static std::mutex mutex;
  static std::map<int32_t, Accounting> per_device;
  std::lock_guard lock(mutex);
  return per_device[device];
}

cudaStream_t native(braid_device_stream_v2 stream) { return stream ? stream->stream : nullptr; }

int alloc(int32_t device, size_t bytes, braid_device_stream_v2 stream, void** ptr, char* error, size_t size) {
  return guarded(error, size, [&] {
    if (!ptr) braid_cuda::invalid("cuda backend: alloc: ptr is NULL");
    const braid_cuda::DeviceScope scope(device);
    Accounting& a = accounting(device);
    std::lock_guard lock(a.mutex);
    *ptr = nullptr;
    if (stream && stream->device == device)  // the stream's free blocks, if it keeps them
      *ptr = braid_cuda::stream_alloc(stream, bytes, "cudaMallocAsync");
    else
      // Rounded as stream_alloc rounds: a stream that keeps the block when it is freed serves it
      // again for any request of that rounded size.
      braid_cuda::check(cudaMallocFromPoolAsync(ptr, braid_cuda::FreeBlocks::rounded(bytes), braid_cuda::pool(device),
                                                native(stream)),
                        "cudaMallocAsync");
    a.sizes[*ptr] = bytes;
    a.stats.in_use += bytes;
    a.stats.peak_in_use = std::max(a.stats.peak_in_use, a.stats.in_use);
    ++a.stats.allocations;
  });
}

int release(int32_t device, void* ptr, braid_device_stream_v2 stream, char* error, size_t size) {
  return guarded(error, size, [&] {
    if (!ptr) return;
    const braid_cuda::DeviceScope scope(device);
    Accounting& a = accounting(device);
    std::lock_guard lock(a.mutex);
    auto it = a.sizes.find(ptr);
    if (it == a.sizes.end())
      braid_cuda::invalid("cuda backend: free of a pointer it did not allocate (or freed already)");
    const size_t bytes = it->second;
    a.stats.in_use -= bytes;
    a.sizes.erase(it);
    if (stream && stream->device == device)
      braid_cuda::stream_free(stream, ptr, bytes);
    else
      braid_cuda::check(cudaFreeAsync(ptr, native(stream)), "cudaFreeAsync");
  });
}

int memory_stats(int32_t device, braid_device_memory_stats_v2* out, char* error, size_t size) {
  return guarded(error, size, [&] {
    if (!out || out->struct_size < sizeof(braid_device_memory_stats_v2))
      braid_cuda::invalid("cuda backend: memory stats struct_size too small");
    const braid_cuda::DeviceScope scope(device);
    cudaMemPool_t pool = braid_cuda::pool(device);
    Accounting& a = accounting(device);
    std::lock_guard lock(a.mutex);
    braid_device_memory_stats_v2 s = a.stats;
    uint64_t reserved = 0;
    braid_cuda::check(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved),
                      "cudaMemPoolGetAttribute");
    s.reserved = reserved;
    s.struct_size = out->struct_size;
    *out = s;
  });
}

int copy(void* dst, const void* src, size_t bytes, int32_t kind, braid_device_stream_v2 stream, char* error,
         size_t size) {
  return guarded(error, size, [&] {
    cudaMemcpyKind k =
        kind == BRAID_COPY_HOST_TO_DEVICE   ? cudaMemcpyHostToDevice
        : kind == BRAID_COPY_DEVICE_TO_HOST ? cudaMemcpyDeviceToHost
        : kind == BRAID_COPY_DEVICE_TO_DEVICE
            ? cudaMemcpyDeviceToDevice
            : (braid_cuda::invalid("cuda backend: unknown copy kind " + std::to_string(kind)), cudaMemcpyDefault);
    if (bytes && (!dst || !src))
      braid_cuda::invalid(std::string("cuda backend: copy: ") + (dst ? "src" : "dst") + " is NULL");
    if (bytes) braid_cuda::check(cudaMemcpyAsync(dst, src, bytes, k, native(stream)), "copy");
  });
}

int memset_zero(void* dst, size_t bytes, braid_device_stream_v2 stream, char* error, size_t size) {
  return guarded(error, size, [&] {
    if (bytes && !dst) braid_cuda::invalid("cuda backend: memset_zero: dst is NULL");
    if (bytes) braid_cuda::check(cudaMemsetAsync(dst, 0, bytes, native(stream)), "cudaMemsetAsync");
  });
}

// cuBLAS handles, kept per device once made: cublasDestroy synchronises the whole device,
// so a stream object that goes (a wrapped host stream, one per C ABI call) hands its handle
// back here instead, and the next one takes it.
class Handles {
 public:
  // A handle in the math mode BRAID_CUDA_TF32 asks for now (a pooled one may have served
  // a stream taken under another setting).
  cublasHandle_t take(int32_t device) {
    std::string problem;
    const bool tf32 = tf32_requested(&problem);
    if (!problem.empty()) braid_cuda::invalid(problem);
    cublasHandle_t h = nullptr;
    {
      std::lock_guard lock(mutex_);
      auto& free = free_[device];
      if (!free.empty()) {
        h = free.back();
        free.pop_back();
      }
    }
    if (!h) braid_cuda::check(cublasCreate(&h), "cublasCreate");
    const cublasStatus_t mode = cublasSetMathMode(h, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH);
    if (mode != CUBLAS_STATUS_SUCCESS) give_back(device, h);
    braid_cuda::check(mode, "cublasSetMathMode");
    return h;
  }
  void give_back(int32_t device, cublasHandle_t h) {
    std::lock_guard lock(mutex_);
    free_[device].push_back(h);
  }

 private:
  std::mutex mutex_;
  std::map<int32_t, std::vector<cublasHandle_t>> free_;
};

Handles& handles() {
  static Handles h;
  return h;
}

// A stream object with a cuBLAS handle over `native`, or over a new stream.
braid_device_stream_s* new_stream(int32_t device, cudaStream_t native_stream, bool owns) {
  const braid_cuda::DeviceScope scope(device);
  auto* s = new braid_device_stream_s{device, native_stream, nullptr, owns, nullptr};
  try {
    if (owns) {
      braid_cuda::check(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking), "cudaStreamCreate");
      s->free_blocks = std::make_unique<braid_cuda::FreeBlocks>();
    }
    s->blas = handles().take(device);
    braid_cuda::check(cublasSetStream(s->blas, s->stream), "cublasSetStream");
  } catch (...) {
    if (s->blas) handles().give_back(device, s->blas);
    if (owns && s->stream) cudaStreamDestroy(s->stream);
    delete s;
    throw;
  }
  return s;
}

int stream_create(int32_t device, braid_device_stream_v2* out, char* error, size_t size) {
  return guarded(error, size, [&] {
    if (!out) braid_cuda::invalid("cuda backend: stream_create: stream is NULL");
    *out = new_stream(device, nullptr, true);
  });
}

int stream_wrap(int32_t device, void* native_stream, braid_device_stream_v2* out, char* error, size_t size) {
  return guarded(error, size, [&] {
    if (!out) braid_cuda::invalid("cuda backend: stream_wrap: stream is NULL");
    *out = new_stream(device, static_cast<cudaStream_t>(native_stream), false);
  });
}

int stream_destroy(braid_device_stream_v2 s, char* error, size_t size) {
  return guarded(error, size, [&] {
    if (!s) return;
    const braid_cuda::DeviceScope scope(s->device);
    handles().give_back(s->device, s->blas);
    if (s->free_blocks) s->free_blocks->release_all(s->stream);
    const cudaError_t err = s->owns_stream ? cudaStreamDestroy(s->stream) : cudaSuccess;
    delete s;
    braid_cuda::check(err, "cudaStreamDestroy");
  });
}

int stream_synchronize(braid_device_stream_v2 s, char* error, size_t size) {
  return guarded(error, size, [&] { braid_cuda::check(cudaStreamSynchronize(native(s)), "cudaStreamSynchronize"); });
}

int event_create(int32_t device, braid_device_event_v2* out, char* error, size_t size) {
  return guarded(error, size, [&] {
    if (!out) braid_cuda::invalid("cuda backend: event_create: event is NULL");
    const braid_cuda::DeviceScope scope(device);
    auto* e = new braid_device_event_s{device, nullptr};
    cudaError_t err = cudaEventCreateWithFlags(&e->event, cudaEventDisableTiming);
    if (err != cudaSuccess) delete e;
    braid_cuda::check(err, "cudaEventCreate");
    *out = e;
  });
}

int event_destroy(braid_device_event_v2 e, char* error, size_t size) {
  return guarded(error, size, [&] {
    if (!e) return;
    braid_cuda::check(cudaEventDestroy(e->event), "cudaEventDestroy");
    delete e;
  });
}

void require_event(braid_device_event_v2 e) {
  if (!e) braid_cuda::invalid("cuda backend: a null event (make one with event_create)");
}

int event_record(braid_device_event_v2 e, braid_device_stream_v2 s, char* error, size_t size) {
  return guarded(error, size, [&] {
    require_event(e);
    braid_cuda::check(cudaEventRecord(e->event, native(s)), "cudaEventRecord");
  });
}

int stream_wait_event(braid_device_stream_v2 s, braid_device_event_v2 e, char* error, size_t size) {
  return guarded(error, size, [&] {
    require_event(e);
    braid_cuda::check(cudaStreamWaitEvent(native(s), e->event, 0), "cudaStreamWaitEvent");
  });
}

int event_synchronize(braid_device_event_v2 e, char* error, size_t size) {
  return guarded(error, size, [&] {
    require_event(e);
    braid_cuda::check(cudaEventSynchronize(e->event), "cudaEventSynchronize");
  });
}

}  // namespace

// In self_test.cu: runs y = a*x + y on the device and compares with the host.
int braid_cuda_self_test(int32_t index, char* error, size_t size);

namespace {}  // namespace

extern "C" BRAID_PLUGIN_EXPORT const braid_device_plugin_v1 braidDevicePlugin_v1 = {
    1, "cuda", init, device_count, device_properties, braid_cuda_self_test, finalize};

extern "C" BRAID_PLUGIN_EXPORT const braid_device_plugin_v2 braidDevicePlugin_v2 = {2,
                                                                                    "cuda",
                                                                                    init,
                                                                                    device_count,
                                                                                    device_properties_v2,
                                                                                    braid_cuda_self_test,
                                                                                    alloc,
                                                                                    release,
                                                                                    memory_stats,
                                                                                    copy,
                                                                                    memset_zero,
                                                                                    stream_create,
                                                                                    stream_destroy,
                                                                                    stream_wrap,
                                                                                    stream_synchronize,
                                                                                    event_create,
                                                                                    event_destroy,
                                                                                    event_record,
                                                                                    stream_wait_event,
                                                                                    event_synchronize,
                                                                                    braid_cuda_supports,
                                                                                    braid_cuda_attention_saved_shape,
                                                                                    &braid_cuda_ops,
                                                                                    finalize};
