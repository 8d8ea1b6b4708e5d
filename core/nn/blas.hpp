// The one file that sees cblas.h: a row-major float GEMM, C = alpha op(A) op(B) + beta C,
// with op(A) m x k, op(B) k x n and leading dimensions in elements.
#pragma once

#include <cstdint>

namespace braid::nn {

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// OpenBLAS's threads in this process (its default: one per core it may run on). Its results
// can depend on them: on its Haswell kernels a GEMM's bits change with how its threads split
// the output, so runs that must agree bit for bit use the same count.
void set_blas_threads(int threads);

}  // namespace braid::nn
