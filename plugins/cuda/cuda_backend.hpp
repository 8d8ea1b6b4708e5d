// What the CUDA backend's parts share: its streams (each with a cuBLAS handle), failures
// as exceptions inside the plugin (turned into the interface's codes at its boundary),
// checks of the tensor views, stream-ordered scratch memory, and row-major GEMMs.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <memory>
#include <new>
#include <string>

#include "braid_device_v2.h"
#include "free_blocks.hpp"

struct braid_device_stream_s {
  int32_t device = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;  // one handle per stream, bound to it
  bool owns_stream = true;        // false for a wrapped native stream (stream_wrap)
  // Blocks freed on the stream, for its next allocations: only on streams the plugin made,
  // whose end it sees (stream_destroy gives them back); a wrapped stream may end first.
  std::unique_ptr<braid_cuda::FreeBlocks> free_blocks;
};

struct braid_device_event_s {
  int32_t device = 0;
  cudaEvent_t event = nullptr;
};

namespace braid_cuda {

// An op's failure: code 1 (BRAID_DEVICE_INVALID_ARGUMENT) for the caller's mistakes,
// a CUDA or cuBLAS status otherwise.
struct Failure {
  int code;
  std::string message;
};

[[noreturn]] inline void invalid(const std::string& message) { throw Failure{BRAID_DEVICE_INVALID_ARGUMENT, message}; }

inline void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw Failure{1000 + static_cast<int>(err),
                  std::string(what) + ": " + cudaGetErrorString(err) + " (" + cudaGetErrorName(err) + ")"};
}

inline void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw Failure{2000 + static_cast<int>(status), std::string(what) + ": " + cublasGetStatusString(status)};
}

// Runs an entry point's body; returns 0, or the failure's code with its message.
template <typename F>
int guarded(char* error, size_t size, F&& body) {
  auto report = [&](int code, const std::string& message) {
    if (error && size) std::snprintf(error, size, "%s", message.c_str());
    return code;
  };
  try {
    body();
    return 0;
  } catch (const Failure& f) {
    return report(f.code, f.message);
  } catch (const std::bad_alloc&) {
    return report(3000, "cuda backend: out of host memory");
  } catch (...) {
    return report(3001, "cuda backend: unexpected failure");
  }
}

// Makes `device` current for a scope and restores the caller's (a host framework's,
// through the C ABI) when it ends.
class DeviceScope {
 public:
  explicit DeviceScope(int32_t device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) {
      check(cudaSetDevice(device), "cudaSetDevice");
      switched_ = true;
    }
  }
  ~DeviceScope() {
    if (switched_) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

// An op's body on `stream`'s device; a null stream is the caller's mistake.
template <typename F>
int on_stream(braid_device_stream_s* stream, char* error, size_t size, F&& body) {
  return guarded(error, size, [&] {
    if (!stream) invalid("cuda backend: a null stream (make one with stream_create or stream_wrap)");
    const DeviceScope scope(stream->device);
    body();
  });
}

// The plugin's own stream-ordered pool on `device` (release threshold raised: what a step
// frees stays reserved for the next), separate from the device's default pool that a host
// framework may use with its own settings.
cudaMemPool_t pool(int32_t device);

using Tensor = braid_device_tensor_v2;

int64_t numel(const Tensor& t);
std::string shape_string(const Tensor& t);

// The backend's switches in the environment (the frozen interface has no options): unset,
// empty or 0: off; 1: on; anything else: off, and `problem` (if given) names the variable,
// its value and what 1 asks for. init refuses such a value.
bool env_switch(const char* name, const char* meaning_of_1, std::string* problem);
constexpr const char* kTf32Switch = "BRAID_CUDA_TF32";
constexpr const char* kTf32Meaning = "TF32 tensor-core GEMMs";
constexpr const char* kFusedAttentionSwitch = "BRAID_CUDA_FUSED_ATTENTION";
constexpr const char* kFusedAttentionMeaning = "the fused attention kernels";
// BRAID_CUDA_FUSED_ATTENTION as the process first read it: attention's saved shape, forward
// and backward must agree for as long as the process runs.
bool fused_attention_on();
// A non-null float32 view, or invalid(): "<op>: <what> ...".
const Tensor& f32(const Tensor* t, const char* op, const char* what);
Tensor& f32(Tensor* t, const char* op, const char* what);
void expect_shape(const Tensor& t, std::initializer_list<int64_t> shape, const char* op, const char* what);
void expect_same_shape(const Tensor& t, const Tensor& like, const char* op, const char* what);
// Size of the last axis (> 0) and the number of rows before it.
int64_t features(const Tensor& t, const char* op, const char* what);
inline float* data(const Tensor& t) { return static_cast<float*>(t.data); }

// Stream-ordered memory on the stream's device: a block the stream freed before (FreeBlocks),
// else the plugin's pool. `what` names the allocation in the error.
void* stream_alloc(braid_device_stream_s* stream, size_t bytes, const char* what);
// Gives `ptr` (of `bytes`, as allocated) back, ordered on the stream: to its free blocks, or to
// the pool.
void stream_free(braid_device_stream_s* stream, void* ptr, size_t bytes);

// Stream-ordered scratch memory, given back (stream-ordered) when it goes.
class Scratch {
 public:
  Scratch(braid_device_stream_s* stream, size_t bytes) : stream_(stream), bytes_(bytes) {
    if (bytes) ptr_ = stream_alloc(stream, bytes, "cudaMallocAsync (scratch)");
  }
  ~Scratch() {
    if (!ptr_) return;
    try {
      stream_free(stream_, ptr_, bytes_);
    } catch (...) {  // a destructor cannot throw (an op may be unwinding already): best effort
      cudaFreeAsync(ptr_, stream_->stream);
    }
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  float* f() const { return static_cast<float*>(ptr_); }
  double* d() const { return static_cast<double*>(ptr_); }
  float** pointers() const { return static_cast<float**>(ptr_); }

 private:
  braid_device_stream_s* stream_;
  size_t bytes_;
  void* ptr_ = nullptr;
};

// C (m x n) = alpha op(A) op(B) + beta C, all row-major, on the stream's handle (the
// host ops' gemm, same arguments). TF32 stays off: the handle uses pedantic fp32 math.
void gemm(braid_device_stream_s* s, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
// The same for `batch` problems at fixed strides (attention: one per head).
void gemm_batched(braid_device_stream_s* s, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                  const float* a, int64_t lda, int64_t stride_a, const float* b, int64_t ldb, int64_t stride_b,
                  float beta, float* c, int64_t ldc, int64_t stride_c, int64_t batch);
// A linear layer's y (rows x out) = x (rows x in) W^T + bias in one cuBLASLt call
// (bias_gemm.cpp); false, having enqueued nothing, when it cannot: the caller then broadcasts
// the bias and calls gemm with beta = 1.
bool linear_gemm_bias(braid_device_stream_s* s, int64_t rows, int64_t out, int64_t in, const float* x, const float* w,
                      const float* bias, float* y);
// The same for `batch` problems whose operands' pointers are in device arrays (attention's
// (sample, head) pairs, whose two strides one stride cannot cover).
void gemm_pointers(braid_device_stream_s* s, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                   float* const* a, int64_t lda, float* const* b, int64_t ldb, float beta, float* const* c, int64_t ldc,
                   int64_t batch);

}  // namespace braid_cuda

// The op table (ops.cu) and the backend's other entry points (cuda_device.cpp).
extern const braid_device_ops_v2 braid_cuda_ops;
int braid_cuda_supports(int32_t op);
int braid_cuda_attention_saved_shape(const braid_device_tensor_v2* q, const braid_device_tensor_v2* k, int64_t heads,
                                     int32_t causal, braid_device_tensor_v2* saved, char* error, size_t size);
