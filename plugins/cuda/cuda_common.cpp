// The CUDA backend's shared helpers: view checks and row-major GEMMs on cuBLAS.
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

#include "cuda_backend.hpp"

namespace braid_cuda {

bool env_switch(const char* name, const char* meaning_of_1, std::string* problem) {
  const char* v = std::getenv(name);
  if (!v || !*v || std::string(v) == "0") return false;
  if (std::string(v) == "1") return true;
  if (problem) *problem = std::string(name) + " is '" + v + "'; set it to 1 (" + meaning_of_1 + ") or 0 (the default)";
  return false;
}

bool fused_attention_on() {
  static const bool on = env_switch(kFusedAttentionSwitch, kFusedAttentionMeaning, nullptr);
  return on;
}

int64_t numel(const Tensor& t) {
  int64_t n = 1;
  for (int32_t i = 0; i < t.rank; ++i) n *= t.shape[i];
  return n;
}

std::string shape_string(const Tensor& t) {
  std::string s = "(";
  for (int32_t i = 0; i < t.rank; ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
  return s + (t.rank == 1 ? ",)" : ")");
}

const Tensor& f32(const Tensor* t, const char* op, const char* what) {
  if (!t) invalid(std::string(op) + ": " + what + " is null");
  if (t->dtype != BRAID_DEVICE_F32) invalid(std::string(op) + ": " + what + " must be F32");
  if (t->rank < 0 || t->rank > BRAID_DEVICE_MAX_RANK)
    invalid(std::string(op) + ": " + what + " has rank " + std::to_string(t->rank));
  for (int32_t i = 0; i < t->rank; ++i)
    if (t->shape[i] < 0) invalid(std::string(op) + ": " + what + " has a negative dimension");
  if (!t->data && numel(*t) > 0) invalid(std::string(op) + ": " + what + " has no memory");
  return *t;
}

Tensor& f32(Tensor* t, const char* op, const char* what) {
  f32(static_cast<const Tensor*>(t), op, what);
  return *t;
}

void expect_shape(const Tensor& t, std::initializer_list<int64_t> shape, const char* op, const char* what) {
  bool same = static_cast<size_t>(t.rank) == shape.size();
  int32_t i = 0;
  for (int64_t d : shape) same = same && t.shape[i++] == d;
  if (!same) {
    Tensor want{};
    want.rank = static_cast<int32_t>(shape.size());
    i = 0;
    for (int64_t d : shape) want.shape[i++] = d;
    invalid(std::string(op) + ": " + what + " has shape " + shape_string(t) + " but " + shape_string(want) +
            " is expected");
  }
}

void expect_same_shape(const Tensor& t, const Tensor& like, const char* op, const char* what) {
  bool same = t.rank == like.rank;
  for (int32_t i = 0; same && i < t.rank; ++i) same = t.shape[i] == like.shape[i];
  if (!same)
    invalid(std::string(op) + ": " + what + " has shape " + shape_string(t) + " but " + shape_string(like) +
            " is expected");
}

int64_t features(const Tensor& t, const char* op, const char* what) {
  if (t.rank < 1 || t.shape[t.rank - 1] == 0)
    invalid(std::string(op) + ": " + what + " must have a non-empty last axis, got " + shape_string(t));
  return t.shape[t.rank - 1];
}

namespace {

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
cublasOperation_t op_of(bool trans) { return trans ? CUBLAS_OP_T : CUBLAS_OP_N; }

int as_int(int64_t v, const char* what) {
  if (v > INT32_MAX) invalid(std::string("gemm: ") + what + " exceeds cuBLAS's 32-bit sizes");
  return static_cast<int>(v);
}

// With k == 0 the product is empty: C = beta C, without asking cuBLAS (its leading
// dimensions would be 0).
bool empty_product(braid_device_stream_s* s, int64_t m, int64_t n, int64_t k, float beta, float* c, int64_t ldc,
                   int64_t batch, int64_t stride_c) {
  if (m == 0 || n == 0 || batch == 0) return true;
  if (k > 0) return false;
  if (beta == 0.0f)
    for (int64_t i = 0; i < batch; ++i)
      check(cudaMemset2DAsync(c + i * stride_c, static_cast<size_t>(ldc) * sizeof(float), 0,
                              static_cast<size_t>(n) * sizeof(float), static_cast<size_t>(m), s->stream),
            "cudaMemset2DAsync");
  else if (beta != 1.0f)
    invalid("gemm: an empty product with beta other than 0 or 1");
  return true;
}

}  // namespace

void gemm(braid_device_stream_s* s, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (empty_product(s, m, n, k, beta, c, ldc, 1, 0)) return;
  check(cublasSgemm(s->blas, op_of(trans_b), op_of(trans_a), as_int(n, "n"), as_int(m, "m"), as_int(k, "k"), &alpha, b,
                    as_int(ldb, "ldb"), a, as_int(lda, "lda"), &beta, c, as_int(ldc, "ldc")),
        "cublasSgemm");
}

void gemm_batched(braid_device_stream_s* s, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                  const float* a, int64_t lda, int64_t stride_a, const float* b, int64_t ldb, int64_t stride_b,
                  float beta, float* c, int64_t ldc, int64_t stride_c, int64_t batch) {
  if (empty_product(s, m, n, k, beta, c, ldc, batch, stride_c)) return;
  check(cublasSgemmStridedBatched(s->blas, op_of(trans_b), op_of(trans_a), as_int(n, "n"), as_int(m, "m"),
                                  as_int(k, "k"), &alpha, b, as_int(ldb, "ldb"), stride_b, a, as_int(lda, "lda"),
                                  stride_a, &beta, c, as_int(ldc, "ldc"), stride_c, as_int(batch, "batch")),
        "cublasSgemmStridedBatched");
}

void gemm_pointers(braid_device_stream_s* s, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                   float* const* a, int64_t lda, float* const* b, int64_t ldb, float beta, float* const* c, int64_t ldc,
                   int64_t batch) {
  if (m == 0 || n == 0 || batch == 0) return;
  if (k == 0) invalid("gemm: an empty product over pointer arrays");  // attention's heads are never empty
  check(cublasSgemmBatched(s->blas, op_of(trans_b), op_of(trans_a), as_int(n, "n"), as_int(m, "m"), as_int(k, "k"),
                           &alpha, const_cast<const float* const*>(b), as_int(ldb, "ldb"),
                           const_cast<const float* const*>(a), as_int(lda, "lda"), &beta, c, as_int(ldc, "ldc"),
                           as_int(batch, "batch")),
        "cublasSgemmBatched");
}

void* stream_alloc(braid_device_stream_s* s, size_t bytes, const char* what) {
  const size_t size = FreeBlocks::rounded(bytes);
  if (s->free_blocks)
    if (void* kept = s->free_blocks->take(size)) return kept;
  void* ptr = nullptr;
  cudaError_t err = cudaMallocFromPoolAsync(&ptr, size, pool(s->device), s->stream);
  if (err == cudaErrorMemoryAllocation && s->free_blocks) {  // the kept blocks may be what is missing
    cudaGetLastError();                                      // handled: no later launch check may see it
    s->free_blocks->release_all(s->stream);
    err = cudaMallocFromPoolAsync(&ptr, size, pool(s->device), s->stream);
  }
  if (err != cudaSuccess) cudaGetLastError();  // reported here, not by the next kernel's launch check
  check(err, what);
  return ptr;
}

void stream_free(braid_device_stream_s* s, void* ptr, size_t bytes) {
  if (!ptr) return;
  if (s->free_blocks && s->free_blocks->keep(ptr, FreeBlocks::rounded(bytes))) return;
  check(cudaFreeAsync(ptr, s->stream), "cudaFreeAsync");
}

cudaMemPool_t pool(int32_t device) {
  static std::mutex mutex;
  static std::map<int32_t, cudaMemPool_t> pools;
  std::lock_guard lock(mutex);
  if (auto it = pools.find(device); it != pools.end()) return it->second;
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t p = nullptr;
  check(cudaMemPoolCreate(&p, &props), "cudaMemPoolCreate");
  uint64_t keep = UINT64_MAX;  // never give freed memory back between steps
  const cudaError_t err = cudaMemPoolSetAttribute(p, cudaMemPoolAttrReleaseThreshold, &keep);
  if (err != cudaSuccess) cudaMemPoolDestroy(p);
  check(err, "cudaMemPoolSetAttribute");
  pools[device] = p;
  return p;
}

}  // namespace braid_cuda
