// SiLU (x * sigmoid(x)) over a convolution's output in place, as a pass after the primitive.
//
// oneDNN 3.2's swish post-op is slow on this kind of CPU: on EfficientNet-B0's layers (AMD Zen 4,
// two threads) it makes a depthwise 3x3 convolution on 32x112x112 take 165 us instead of 53, and
// the 16->96 pointwise one at 112x112 515 instead of 185; the convolution without it followed by
// this pass takes 99 and 323. So a convolution whose last operation is a SiLU runs without it and
// calls SiluInPlace, where the CPU has AVX-512 (checked at run time; elsewhere the post-op stays).
//
// x / (1 + exp(-x)) as torch computes it, exp(-x) = 2^t as a degree-6 polynomial of t's fraction
// times 2^round(t) (a division measured faster here than a reciprocal estimate with a Newton step
// and the sign select it needs: 11 against 15 cycles a vector). Relative error about 1e-6. Special
// values as torch: NaN stays NaN, +inf gives +inf, -inf gives NaN (-inf / inf), -100 gives -0.
#ifndef PLUS_TVM_NATIVE_SILU_PASS_H_
#define PLUS_TVM_NATIVE_SILU_PASS_H_

#include <omp.h>

#include <algorithm>
#include <cstdint>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define PLUS_NATIVE_SILU_PASS 1
#else
#define PLUS_NATIVE_SILU_PASS 0
#endif

namespace plus_native {

// Whether SiluInPlace can run on this CPU.
inline bool SiluPassAvailable() {
#if PLUS_NATIVE_SILU_PASS
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  return avx512;
#else
  return false;
#endif
}

#if PLUS_NATIVE_SILU_PASS
__attribute__((target("avx512f"))) inline __m512 SiluVector(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.f);
  __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(-1.44269504f));  // exp(-x) = 2^t
  // clamped: 2^128 is inf (as exp(-x) for x < -88.7), 2^-160 is 0; a NaN t becomes 128
  t = _mm512_max_ps(_mm512_min_ps(t, _mm512_set1_ps(128.f)), _mm512_set1_ps(-160.f));
  __m512 whole = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_sub_ps(t, whole);  // [-0.5, 0.5]
  __m512 p = _mm512_set1_ps(1.5403530e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504109e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022651e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718e-1f));
  p = _mm512_fmadd_ps(p, f, one);
  return _mm512_div_ps(x, _mm512_add_ps(one, _mm512_scalef_ps(p, whole)));
}

__attribute__((target("avx512f"))) inline void SiluSpan(float* data, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(data + i, SiluVector(_mm512_loadu_ps(data + i)));
  if (i < n) {
    __mmask16 tail = static_cast<__mmask16>((1u << (n - i)) - 1u);
    __m512 x = _mm512_maskz_loadu_ps(tail, data + i);
    _mm512_mask_storeu_ps(data + i, tail, SiluVector(x));
  }
}
#endif

// data[i] = silu(data[i]) for i < n; on the calling thread's OpenMP team when n is large enough
// to pay for starting it. Call only where SiluPassAvailable().
inline void SiluInPlace(float* data, int64_t n) {
#if PLUS_NATIVE_SILU_PASS
  constexpr int64_t kSerialBelow = 16384;  // about 4 us of work on one thread
  if (n < kSerialBelow || omp_in_parallel()) return SiluSpan(data, n);
#pragma omp parallel
  {
    int64_t threads = omp_get_num_threads(), me = omp_get_thread_num();
    int64_t per = (n / threads + 15) / 16 * 16;  // whole vectors, one span per thread
    int64_t begin = std::min(n, me * per), end = me + 1 == threads ? n : std::min(n, begin + per);
    if (begin < end) SiluSpan(data + begin, end - begin);
  }
#else
  (void)data;
  (void)n;
#endif
}

}  // namespace plus_native

#endif  // PLUS_TVM_NATIVE_SILU_PASS_H_
