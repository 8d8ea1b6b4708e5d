// A device self-test for `braid info --check` and the GPU tests: y = a*x + y on
// the device over a buffer large enough to use every SM, compared with the host.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace {

__global__ void axpy(int n, float a, const float* x, float* y) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) y[i] = a * x[i] + y[i];
}

int report(cudaError_t err, const char* what, char* error, size_t size) {
  if (error && size) std::snprintf(error, size, "%s: %s", what, cudaGetErrorString(err));
  return static_cast<int>(err);
}

}  // namespace

int braid_cuda_self_test(int32_t index, char* error, size_t size) {
  constexpr int n = 1 << 20;
  cudaError_t err = cudaSetDevice(index);
  if (err != cudaSuccess) return report(err, "cudaSetDevice", error, size);
  std::vector<float> x(n), y(n);
  for (int i = 0; i < n; ++i) {
    x[i] = float(i % 1000) * 0.5f;
    y[i] = float(i % 7);
  }
  float *dx = nullptr, *dy = nullptr;
  if ((err = cudaMalloc(&dx, n * sizeof(float))) != cudaSuccess) return report(err, "cudaMalloc", error, size);
  if ((err = cudaMalloc(&dy, n * sizeof(float))) != cudaSuccess) {
    cudaFree(dx);
    return report(err, "cudaMalloc", error, size);
  }
  err = cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  if (err == cudaSuccess) err = cudaMemcpy(dy, y.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  if (err == cudaSuccess) {
    axpy<<<256, 256>>>(n, 2.0f, dx, dy);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) err = cudaMemcpy(y.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost);
  cudaFree(dx);
  cudaFree(dy);
  if (err != cudaSuccess) return report(err, "axpy kernel", error, size);
  for (int i = 0; i < n; ++i) {
    float expected = 2.0f * (float(i % 1000) * 0.5f) + float(i % 7);
    if (std::fabs(y[i] - expected) > 1e-5f * std::fabs(expected) + 1e-6f) {
      if (error && size) std::snprintf(error, size, "axpy mismatch at %d: %g != %g", i, y[i], expected);
      return -1;
    }
  }
  return 0;
}
