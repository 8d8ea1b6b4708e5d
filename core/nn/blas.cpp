#include "core/nn/blas.hpp"

#include <cblas.h>

#include <climits>
#include <string>

#include "core/common/error.hpp"

namespace braid::nn {
namespace {

blasint checked(int64_t v) {
  if (v < 0 || v > INT_MAX)
    throw Error(Status::unsupported, "gemm: dimension " + std::to_string(v) + " does not fit the BLAS integer");
  return static_cast<blasint>(v);
}

}  // namespace

void set_blas_threads(int threads) { openblas_set_num_threads(threads < 1 ? 1 : threads); }

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // nothing to multiply; BLAS would reject the leading dimensions of empty operands
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, checked(m),
              checked(n), checked(k), alpha, a, checked(lda), b, checked(ldb), beta, c, checked(ldc));
}

}  // namespace braid::nn
