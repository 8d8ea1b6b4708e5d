// A linear layer's forward with bias as one cuBLASLt call: y = x W^T + b, the bias added by
// the GEMM's epilogue, where a broadcast kernel then cublasSgemm (beta = 1) took two launches
// (about 400 a tiny-clip step). Each shape's algorithm is chosen once: the first of
// cuBLASLt's heuristic answers that splits no K (a split adds a reduction, and some reduce in
// place in an order that can vary), in the stream's math mode (strict fp32, or TF32 where the
// handle asks), among those that take the operands' alignment (cuBLASLt assumes 256 bytes
// unless told: parameters laid end to end and views start anywhere). A bias not on 16 bytes
// (the epilogue needs it), or a shape with no such algorithm, keeps the two launches.
#include <cublasLt.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "cuda_backend.hpp"

namespace braid_cuda {
namespace {

// The largest power of two up to 256 that divides the address.
uint32_t alignment(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 4 && address % a != 0) a /= 2;
  return a;
}

struct Shape {
  int32_t device;
  int64_t rows, out, in;
  bool tf32;
  uint32_t align_w, align_x, align_y;
  bool operator<(const Shape& o) const {
    return std::tie(device, rows, out, in, tf32, align_w, align_x, align_y) <
           std::tie(o.device, o.rows, o.out, o.in, o.tf32, o.align_w, o.align_x, o.align_y);
  }
};

// The descriptors of one shape (column-major, as cuBLASLt sees the row-major operands:
// D (out x rows) = W^T' (out x in) X' (in x rows) + bias), and its algorithm.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t w = nullptr, x = nullptr, y = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool usable = false;
};

class Plans {
 public:
  // Enqueues y = x W^T + b on the stream; false when the shape has no algorithm without a
  // split of K.
  bool run(braid_device_stream_s* s, int64_t rows, int64_t out, int64_t in, const float* x, const float* w,
           const float* bias, float* y) {
    if (alignment(bias) < 16) return false;
    cublasMath_t mode = CUBLAS_DEFAULT_MATH;
    check(cublasGetMathMode(s->blas, &mode), "cublasGetMathMode");
    const Shape shape{s->device,    rows,         out,         in, mode == CUBLAS_TF32_TENSOR_OP_MATH,
                      alignment(w), alignment(x), alignment(y)};
    std::lock_guard lock(mutex_);  // the bias pointer is set on a descriptor that shapes share
    cublasLtHandle_t lt = handle(s->device);
    Plan& plan = plan_for(lt, shape);
    if (!plan.usable) return false;
    check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias),
          "cublasLtMatmulDescSetAttribute (bias)");
    const float one = 1.0f, zero = 0.0f;
    check(cublasLtMatmul(lt, plan.desc, &one, w, plan.w, x, plan.x, &zero, y, plan.y, y, plan.y, &plan.algo, nullptr, 0,
                         s->stream),
          "cublasLtMatmul");
    return true;
  }

 private:
  cublasLtHandle_t handle(int32_t device) {
    cublasLtHandle_t& h = handles_[device];
    if (!h) check(cublasLtCreate(&h), "cublasLtCreate");
    return h;
  }

  Plan& plan_for(cublasLtHandle_t lt, const Shape& s) {
    auto [it, fresh] = plans_.try_emplace(s);
    Plan& p = it->second;
    if (!fresh) return p;
    check(cublasLtMatmulDescCreate(&p.desc, s.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F_PEDANTIC,
                                   CUDA_R_32F),
          "cublasLtMatmulDescCreate");
    const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose),
          "cublasLtMatmulDescSetAttribute (transa)");
    check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof keep),
          "cublasLtMatmulDescSetAttribute (transb)");
    check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue),
          "cublasLtMatmulDescSetAttribute (epilogue)");
    check(cublasLtMatrixLayoutCreate(&p.w, CUDA_R_32F, static_cast<uint64_t>(s.in), static_cast<uint64_t>(s.out), s.in),
          "cublasLtMatrixLayoutCreate (weight)");
    check(
        cublasLtMatrixLayoutCreate(&p.x, CUDA_R_32F, static_cast<uint64_t>(s.in), static_cast<uint64_t>(s.rows), s.in),
        "cublasLtMatrixLayoutCreate (x)");
    check(cublasLtMatrixLayoutCreate(&p.y, CUDA_R_32F, static_cast<uint64_t>(s.out), static_cast<uint64_t>(s.rows),
                                     s.out),
          "cublasLtMatrixLayoutCreate (y)");
    cublasLtMatmulPreference_t preference = nullptr;
    check(cublasLtMatmulPreferenceCreate(&preference), "cublasLtMatmulPreferenceCreate");
    const size_t no_workspace = 0;
    cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &no_workspace,
                                         sizeof no_workspace);
    for (auto [attribute, bytes] : {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, s.align_w},
                                    {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, s.align_x},
                                    {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, s.align_y},
                                    {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, s.align_y}})
      cublasLtMatmulPreferenceSetAttribute(preference, attribute, &bytes, sizeof bytes);
    constexpr int kAsked = 8;
    cublasLtMatmulHeuristicResult_t found[kAsked] = {};
    int count = 0;
    const cublasStatus_t status =
        cublasLtMatmulAlgoGetHeuristic(lt, p.desc, p.w, p.x, p.y, p.y, preference, kAsked, found, &count);
    cublasLtMatmulPreferenceDestroy(preference);
    for (int i = 0; status == CUBLAS_STATUS_SUCCESS && i < count && !p.usable; ++i) {
      int32_t splits = 0;
      size_t written = 0;
      if (found[i].state != CUBLAS_STATUS_SUCCESS ||
          cublasLtMatmulAlgoConfigGetAttribute(&found[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof splits,
                                               &written) != CUBLAS_STATUS_SUCCESS)
        continue;
      if (splits <= 1) {
        p.algo = found[i].algo;
        p.usable = true;
      }
    }
    return p;
  }

  std::mutex mutex_;
  std::map<int32_t, cublasLtHandle_t> handles_;
  std::map<Shape, Plan> plans_;
};

Plans& plans() {
  static Plans* p = new Plans;  // never destroyed: plugins unload after their last call
  return *p;
}

}  // namespace

bool linear_gemm_bias(braid_device_stream_s* s, int64_t rows, int64_t out, int64_t in, const float* x, const float* w,
                      const float* bias, float* y) {
  if (rows == 0 || out == 0 || in == 0) return false;  // the general path handles empty products
  return plans().run(s, rows, out, in, x, w, bias, y);
}

}  // namespace braid_cuda
