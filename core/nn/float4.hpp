// Four floats at a time with GCC/Clang vector extensions, and a vectorised float exp: for the
// host ops' passes over logits (host_contrastive.cpp), element-wise ops (host_pointwise.cpp),
// the optimizer's and gradients' passes (host_ops.cpp) and embedding gradients.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(__SSE2__)
#include <emmintrin.h>
#elif defined(__ARM_NEON) && defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace braid::nn::f4 {

// Passes over rows of floats that work on four at a time with GCC/Clang vector extensions
// (SSE2 on any x86-64, NEON on arm64): explicit, so they do not hinge on what the
// auto-vectoriser accepts at -O2 (it rejects std::exp and most of these loops). Sums along a
// row keep one partial per lane in a fixed order, and pad the row's tail rather than do it in
// scalar; element-wise passes (each4) do their tail one element at a time.
typedef float F4 __attribute__((vector_size(16)));
typedef int32_t I4 __attribute__((vector_size(16)));
constexpr int64_t kWidth = 4;
constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

inline F4 splat(float x) { return F4{x, x, x, x}; }
inline F4 load(const float* p) {
  F4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, F4 v) { std::memcpy(p, &v, sizeof v); }
// The last count < 4 elements of a row, the other lanes `fill`; and their store.
inline F4 load_tail(const float* p, int64_t count, float fill) {
  F4 v = splat(fill);
  for (int64_t l = 0; l < count; ++l) v[l] = p[l];
  return v;
}
inline void store_tail(float* p, F4 v, int64_t count) {
  for (int64_t l = 0; l < count; ++l) p[l] = v[l];
}
inline F4 max4(F4 a, F4 b) { return a > b ? a : b; }
inline float max_lane(F4 v) { return std::max(std::max(v[0], v[1]), std::max(v[2], v[3])); }
inline double sum_lanes(F4 v) { return (static_cast<double>(v[0]) + v[1]) + (static_cast<double>(v[2]) + v[3]); }
// Float partial sums along a row move into a double every kFlush elements, so a lane adds up
// at most 64 terms in float whatever the row's length.
constexpr int64_t kFlush = 256;
inline void flush(F4& partial, double& total) {
  total += sum_lanes(partial);
  partial = F4{};
}

// exp(x) in float: Cephes' expf (reduction by ln 2, degree-6 polynomial), ~1 ulp. Below -87
// (near the smallest normal float) it returns 0 (the contrastive loss's logit - max: such
// terms vanish next to the max's 1), above 88 it returns e^88, not infinity (the GELU's
// 1 / (1 + e) stays finite and tiny). NaN stays NaN.
inline F4 exp4(F4 x) {
  F4 c = x > splat(-87.0f) ? x : splat(-87.0f);  // NaN fails the test: -87
  c = c < splat(88.0f) ? c : splat(88.0f);
  const F4 round = splat(12582912.0f);  // 1.5 * 2^23: adding and subtracting it rounds to an integer
  const F4 k = (c * splat(1.44269504088896341f) + round) - round;
  const F4 r = c - k * splat(0.693359375f) - k * splat(-2.12194440e-4f);
  F4 p = splat(1.9875691500e-4f);
  p = p * r + splat(1.3981999507e-3f);
  p = p * r + splat(8.3334519073e-3f);
  p = p * r + splat(4.1665795894e-2f);
  p = p * r + splat(1.6666665459e-1f);
  p = p * r + splat(5.0000001201e-1f);
  const F4 y = p * r * r + r + splat(1.0f);
  // c is in [-87, 88] (NaN became -87), so k is in [-126, 127] and k + 127 in [1, 254]: 2^k.
  const I4 biased = (__builtin_convertvector(k, I4) + 127) << 23;
  F4 two_k;
  std::memcpy(&two_k, &biased, sizeof two_k);
  const F4 e = x < splat(-87.0f) ? splat(0.0f) : y * two_k;
  return x != x ? x : e;
}

inline F4 min4(F4 a, F4 b) { return a < b ? a : b; }
inline float min_lane(F4 v) { return std::min(std::min(v[0], v[1]), std::min(v[2], v[3])); }

// The correctly rounded square root of each lane (IEEE 754, as std::sqrt's).
inline F4 sqrt4(F4 x) {
#if defined(__SSE2__)
  return F4(_mm_sqrt_ps(__m128(x)));
#elif defined(__ARM_NEON) && defined(__aarch64__)
  return F4(vsqrtq_f32(float32x4_t(x)));
#else
  return F4{std::sqrt(x[0]), std::sqrt(x[1]), std::sqrt(x[2]), std::sqrt(x[3])};
#endif
}

// Element-wise passes over `n` floats: four at a time, the last n % 4 one by one, so every
// element gets the very operations the scalar loop gives it (bit-identical results). At -O2
// GCC leaves such loops scalar when it cannot rule out aliasing, about 4x slower in cache.
template <typename Four, typename One>
inline void each4(int64_t n, Four&& four, One&& one) {
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) four(i);
  for (; i < n; ++i) one(i);
}

// y[i] += x[i].
inline void add_to(float* y, const float* x, int64_t n) {
  each4(
      n, [&](int64_t i) { store(y + i, load(y + i) + load(x + i)); }, [&](int64_t i) { y[i] += x[i]; });
}

}  // namespace braid::nn::f4
