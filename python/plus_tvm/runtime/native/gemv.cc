// Linears of one to eight rows (a decode step's: one row per sequence) on AVX2 + FMA CPUs, in
// bfloat16 (on CPUs without bfloat16 GEMM instructions) and float32.
//
// A decode step's linears have one row per sequence: each streams its weight once and does 2M
// FLOPs per weight element (M rows), so at decode's batch sizes (M <= 8) it runs at the memory's
// speed or not at all. oneDNN's GEMM does well at one float32 row but at 2-8 rows runs at 35-90
// GFLOP/s on this project's AVX2 EPYC (scripts/bench_gemv.py): 1.5-2x the weight's streaming
// time. bfloat16 halves the bytes, but on such a CPU torch's bfloat16 GEMV is far from that
// speed, and widening the weight to float32 (what the GEMMs of more rows do,
// ``_common.widened_half``) streams twice the bytes. Here the weight is read as stored ([N, K] as
// nn.Linear holds it, ``w=nk``, or [K, N] as GPT-2's Conv1D, ``w=kn``), 16 elements a step (one
// 32-byte load of bfloat16, widened to float32 in registers by 16-bit shifts: bfloat16 is
// float32's upper half, so the even elements of a load are its 32-bit lanes shifted left by 16
// and the odd ones its lanes with the low half masked off; two loads of float32), multiplied by
// every row and summed in float32 with FMA. The rows ``x`` are widened once per call into a
// buffer (bfloat16 ``nk``: each block of 16 reordered, even then odd, to match the halves).
//
// Work is split over the calling thread's OpenMP team (the threads torch and oneDNN use):
// ``nk`` by output rows (each thread streams a contiguous run of whole weight rows, one after
// the other), ``kn`` by K (each thread streams a contiguous run of weight rows into a float32
// partial sum of every output; the partials are then summed in thread order and finished per
// column range).
//
// Results as torch's op-by-op graph rounds them (runtime/linear.py's reference): the float32
// dot product plus the bias rounded to the call's dtype once (torch's ``addmm``), then the
// activation computed in float32 on that and rounded, then the residual added in float32 and
// rounded (float32: no rounding). The sums' order differs from torch's, as float32 sums of another
// order do (a bfloat16 output can differ by one ulp where the float32 sum falls near a rounding
// boundary). ``plus.linear_layernorm`` (GPT-2's projections with the residual and the next
// LayerNorm) runs the same GEMV for its sum, rounded, then the layer normalization as torch's
// ``layer_norm`` (float32 statistics and arithmetic, one rounding).
//
// The native plus.linear and plus.linear_layernorm (onednn_linear.cc) call this first: bfloat16
// calls of one to eight rows where the CPU computes no bfloat16 (their dtypes lack it), float32
// calls of two to eight rows; a call this file does not take goes on as before (bfloat16: to the
// Python kernel, which calls it too: runtime/linear.py).

#include "gemv.h"

#include <omp.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

#include "linear_config.h"
#include "onednn_common.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define PLUS_NATIVE_GEMV_AVX2 1
#else
#define PLUS_NATIVE_GEMV_AVX2 0
#endif

namespace plus_native {
namespace {

constexpr int kMaxParts = 8;
// the most rows a call may have (decode's default max_batch); float32 calls from
// kFloatGemvMinRows on (one float32 row: oneDNN's GEMV already streams at the read bandwidth)
constexpr int kMaxRows = 8;
constexpr int64_t kFloatGemvMinRows = 2;
// below this many weight bytes a call runs on the calling thread alone (an OpenMP fork and join
// costs a few microseconds; 128 KiB streams in about as long)
constexpr int64_t kSerialBelowBytes = 128 << 10;
// how far ahead of its loads a weight stream prefetches, in bytes (measured best of 1-4 KiB on
// this project's AVX2 EPYC for both layouts, bfloat16)
constexpr int64_t kPrefetchBytes = 2048;
// ``kn``: the columns a pass over the thread's k range covers (its sums: 8 rows x 512 x 4 bytes)
constexpr int64_t kKnTile = 512;

inline float Widen(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// float32 to bfloat16, to nearest even (torch's rounding); NaN stays a (quiet) NaN
inline uint16_t Round(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// The activations of ../_common.py (apply_activation_) in float32, as torch computes them
float Activate(float v, Activation act) {
  switch (act) {
    case Activation::kRelu:
      return std::isnan(v) ? v : (v > 0.f ? v : 0.f);
    case Activation::kRelu6:
      return std::isnan(v) ? v : std::min(std::max(v, 0.f), 6.f);
    case Activation::kGelu:
      return 0.5f * v * (1.f + std::erf(v * 0.70710678118654752f));
    case Activation::kGeluTanh: {
      float inner = 0.79788456080286536f * (v + 0.044715f * v * v * v);
      return 0.5f * v * (1.f + std::tanh(inner));
    }
    case Activation::kSilu:
      return v / (1.f + std::exp(-v));
    case Activation::kSigmoid:
      return 1.f / (1.f + std::exp(-v));
    case Activation::kTanh:
      return std::tanh(v);
    case Activation::kNone:
      break;
  }
  return v;
}

// Where column ``c`` of a bfloat16 ``kn`` partial sum lies: blocks of 16 hold their even
// columns, then their odd ones (the order of a load's widened halves); the columns past the last
// whole block lie in order.
inline int64_t KnSlot(int64_t c, int64_t n) {
  int64_t nv = n & ~int64_t(15);
  if (c >= nv) return c;
  int64_t i = c & 15;
  return (c & ~int64_t(15)) + ((i & 1) ? 8 + (i >> 1) : (i >> 1));
}

// The element types: how a value is read as float32 and written back, where a 16-element load's
// two float32 halves come from, and the DLPack type.
struct Bf16 {
  using T = uint16_t;
  static constexpr bool kHalves = true;  // a load's halves are its even and odd elements
  static float Get(T v) { return Widen(v); }
  static T Put(float v) { return Round(v); }
  static int64_t Slot(int64_t c, int64_t n) { return KnSlot(c, n); }
  static bool Is(DLDataType t) { return t.code == kDLBfloat && t.bits == 16 && t.lanes == 1; }
};

struct F32 {
  using T = float;
  static constexpr bool kHalves = false;  // a load's halves are its first and last 8 elements
  static float Get(T v) { return v; }
  static T Put(float v) { return v; }
  static int64_t Slot(int64_t c, int64_t) { return c; }
  static bool Is(DLDataType t) { return t.code == kDLFloat && t.bits == 32 && t.lanes == 1; }
};

template <class E>
struct Part {
  const typename E::T* w = nullptr;
  const typename E::T* bias = nullptr;
  int64_t n = 0;       // its outputs
  int64_t offset = 0;  // its first column in ``out``
};

template <class E>
struct Problem {
  int rows = 1;
  int64_t k = 0;
  int64_t n_total = 0;
  bool kn = false;
  Activation act = Activation::kNone;
  const typename E::T* residual = nullptr;
  typename E::T* out = nullptr;
  Part<E> parts[kMaxParts];
  int num_parts = 0;
  const float* x = nullptr;  // [rows][x_ld] in float32 (bfloat16 ``nk``: each block of 16 even, then odd)
  int64_t x_ld = 0;          // a row's stride in ``x`` (PaddedStride of k)
  float* partial = nullptr;  // ``kn``: [threads][rows][acc_ld]
  int64_t max_n = 0;
  int64_t acc_ld = 0;  // ``kn``: a row's stride in ``partial`` (PaddedStride of max_n)
};

// The stride of a row of float32 scratch (the rows of x widened; ``kn``'s partial sums), at
// least ``n``: 512 bytes past a multiple of 4 KiB, so that the 8 rows at one column lie 512 bytes
// apart modulo 4 KiB. With rows a multiple of 4 KiB apart (GPT-2's 3072 columns, LLaMA's 2048)
// ``kn``'s loads of a row's sums wait on the stores of the row before it (the CPU matches loads
// to earlier stores on the address's low 12 bits: c_fc at 8 rows 2.3x slower) and the rows of x
// fall in one L1 set.
inline int64_t PaddedStride(int64_t n) {
  return n + ((128 - n % 1024) + 1024) % 1024;
}

// out[r, part's column n] from the float32 sum ``acc``, rounded where torch's graph rounds
template <class E>
inline void Finish(const Problem<E>& p, const Part<E>& part, int r, int64_t n, float acc) {
  float v = acc;
  if (part.bias != nullptr) v += E::Get(part.bias[n]);
  typename E::T y = E::Put(v);
  if (p.act != Activation::kNone) y = E::Put(Activate(E::Get(y), p.act));
  int64_t at = r * p.n_total + part.offset + n;
  if (p.residual != nullptr) y = E::Put(E::Get(y) + E::Get(p.residual[at]));
  p.out[at] = y;
}

// [begin, end) of ``count`` items for thread ``t`` of ``threads``, in multiples of ``align``
inline void Split(int64_t count, int t, int threads, int64_t align, int64_t* begin,
                  int64_t* end) {
  int64_t per = (count + threads - 1) / threads;
  per = (per + align - 1) / align * align;
  *begin = std::min(count, t * per);
  *end = std::min(count, *begin + per);
}

#if PLUS_NATIVE_GEMV_AVX2

bool Avx2Fma() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
}

__attribute__((target("avx2,fma"))) inline float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The 16 elements at ``w`` as two float32 vectors (E::kHalves says which elements each holds)
__attribute__((target("avx2,fma"))) inline void Load16(const uint16_t* w, __m256* a, __m256* b) {
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  *a = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  *b = _mm256_castsi256_ps(_mm256_and_si256(v, high));
}

__attribute__((target("avx2,fma"))) inline void Load16(const float* w, __m256* a, __m256* b) {
  *a = _mm256_loadu_ps(w);
  *b = _mm256_loadu_ps(w + 8);
}

// ``w=nk``: outputs [begin, end) of ``part``, each the dot products of a weight row with the R
// rows of x, one weight row after the other. One stream of loads with a prefetch ahead of it:
// measured on this project's AVX2 EPYC (bfloat16 768 x 32000, 2 threads) at the read bandwidth
// (19.3 GB/s, a plain read 17.7), where four weight rows interleaved (four streams) reach 12.4
// and no prefetch 15.6-17.9. Up to 4 rows each x row keeps two sums (the two halves of a load:
// two dependency chains); more rows keep one (their count alone fills the FMA pipes, and 16
// sums would not fit the 16 registers).
template <class E, int R>
__attribute__((target("avx2,fma"))) void NkRange(const Problem<E>& p, const Part<E>& part,
                                                 int64_t begin, int64_t end) {
  constexpr bool kTwo = R <= 4;
  constexpr int64_t kAhead = kPrefetchBytes / sizeof(typename E::T);
  const int64_t k = p.k, kv = k & ~int64_t(15);
  for (int64_t n = begin; n < end; ++n) {
    const typename E::T* w = part.w + n * k;
    __m256 lo[R], hi[R];
    for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm256_setzero_ps();
    for (int64_t kk = 0; kk < kv; kk += 16) {
      _mm_prefetch(reinterpret_cast<const char*>(w + kk + kAhead), _MM_HINT_T0);
      __m256 a, b;
      Load16(w + kk, &a, &b);
      for (int r = 0; r < R; ++r) {
        const float* x = p.x + r * p.x_ld + kk;
        if constexpr (kTwo) {
          lo[r] = _mm256_fmadd_ps(a, _mm256_loadu_ps(x), lo[r]);
          hi[r] = _mm256_fmadd_ps(b, _mm256_loadu_ps(x + 8), hi[r]);
        } else {
          lo[r] = _mm256_fmadd_ps(b, _mm256_loadu_ps(x + 8),
                                  _mm256_fmadd_ps(a, _mm256_loadu_ps(x), lo[r]));
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      float s = HorizontalSum(kTwo ? _mm256_add_ps(lo[r], hi[r]) : lo[r]);
      for (int64_t kk = kv; kk < k; ++kk) s += p.x[r * p.x_ld + kk] * E::Get(w[kk]);
      Finish(p, part, r, n, s);
    }
  }
}

// ``w=kn``: acc[r][slot] = sum over k in [k0, k1) of x[r, k] * w[k, column], every column.
// Columns in tiles of kKnTile (the R rows' sums of a tile, at most 16 KiB, stay in L1 while
// every k of the range passes over them), two k at a time, the next two weight rows of the tile
// prefetched.
template <class E, int R>
__attribute__((target("avx2,fma"))) void KnPartial(const Problem<E>& p, const Part<E>& part,
                                                   int64_t k0, int64_t k1, float* acc) {
  const int64_t n = part.n, nv = n & ~int64_t(15), ld = p.acc_ld;
  const int64_t pairs_end = k0 + (k1 - k0) / 2 * 2;
  std::fill(acc, acc + R * ld, 0.f);
  for (int64_t j0 = 0; j0 < nv; j0 += kKnTile) {
    const int64_t j1 = std::min(nv, j0 + kKnTile);
    for (int64_t kk = k0; kk < pairs_end; kk += 2) {
      const typename E::T* a = part.w + kk * n;
      const typename E::T* b = a + n;
      __m256 xa[R], xb[R];  // (more than 4 rows spill some: reloads, as the sums' are)
      for (int r = 0; r < R; ++r) {
        xa[r] = _mm256_set1_ps(p.x[r * p.x_ld + kk]);
        xb[r] = _mm256_set1_ps(p.x[r * p.x_ld + kk + 1]);
      }
      for (int64_t j = j0; j < j1; j += 16) {
        if (kk + 2 < pairs_end) {
          _mm_prefetch(reinterpret_cast<const char*>(a + 2 * n + j), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(b + 2 * n + j), _MM_HINT_T0);
        }
        __m256 a0, a1, b0, b1;
        Load16(a + j, &a0, &a1);
        Load16(b + j, &b0, &b1);
        for (int r = 0; r < R; ++r) {
          float* at = acc + r * ld + j;
          __m256 s0 = _mm256_loadu_ps(at), s1 = _mm256_loadu_ps(at + 8);
          s0 = _mm256_fmadd_ps(b0, xb[r], _mm256_fmadd_ps(a0, xa[r], s0));
          s1 = _mm256_fmadd_ps(b1, xb[r], _mm256_fmadd_ps(a1, xa[r], s1));
          _mm256_storeu_ps(at, s0);
          _mm256_storeu_ps(at + 8, s1);
        }
      }
    }
  }
  for (int64_t kk = k0; kk < pairs_end; kk += 2) {
    const typename E::T* a = part.w + kk * n;
    const typename E::T* b = a + n;
    for (int64_t j = nv; j < n; ++j) {
      for (int r = 0; r < R; ++r) {
        acc[r * ld + j] +=
            p.x[r * p.x_ld + kk] * E::Get(a[j]) + p.x[r * p.x_ld + kk + 1] * E::Get(b[j]);
      }
    }
  }
  for (int64_t kk = pairs_end; kk < k1; ++kk) {
    const typename E::T* a = part.w + kk * n;
    for (int64_t j = 0; j < n; ++j) {
      for (int r = 0; r < R; ++r) acc[r * ld + E::Slot(j, n)] += p.x[r * p.x_ld + kk] * E::Get(a[j]);
    }
  }
}

// Thread ``t`` of ``threads``' share of the call (every thread of the team runs it: the
// barriers are the team's)
template <class E, int R>
void RunThread(const Problem<E>& p, int t, int threads) {
  for (int i = 0; i < p.num_parts; ++i) {
    const Part<E>& part = p.parts[i];
    int64_t begin, end;
    if (!p.kn) {
      Split(part.n, t, threads, 4, &begin, &end);
      NkRange<E, R>(p, part, begin, end);
      continue;
    }
    const int64_t stride = R * p.acc_ld;  // one thread's partial sums
    Split(p.k, t, threads, 2, &begin, &end);
    KnPartial<E, R>(p, part, begin, end, p.partial + t * stride);
#pragma omp barrier
    Split(part.n, t, threads, 16, &begin, &end);
    for (int r = 0; r < R; ++r) {
      for (int64_t c = begin; c < end; ++c) {
        int64_t slot = r * p.acc_ld + E::Slot(c, part.n);
        float s = p.partial[slot];
        for (int u = 1; u < threads; ++u) s += p.partial[u * stride + slot];
        Finish(p, part, r, c, s);
      }
    }
#pragma omp barrier
  }
}

template <class E, int R>
void RunRows(const Problem<E>& p, int threads) {
  if (threads <= 1) return RunThread<E, R>(p, 0, 1);
#pragma omp parallel num_threads(threads)
  RunThread<E, R>(p, omp_get_thread_num(), omp_get_num_threads());
}

template <class E>
void Run(const Problem<E>& p, int threads) {
  switch (p.rows) {
    case 1: return RunRows<E, 1>(p, threads);
    case 2: return RunRows<E, 2>(p, threads);
    case 3: return RunRows<E, 3>(p, threads);
    case 4: return RunRows<E, 4>(p, threads);
    case 5: return RunRows<E, 5>(p, threads);
    case 6: return RunRows<E, 6>(p, threads);
    case 7: return RunRows<E, 7>(p, threads);
    default: return RunRows<E, kMaxRows>(p, threads);
  }
}

#else  // not x86-64: every call goes on to the other kernels

bool Avx2Fma() { return false; }
template <class E>
void Run(const Problem<E>&, int) {}

#endif

std::atomic<int> g_force{-1};  // gemv_half_force: -1 as the CPU says, 0 never, 1 always
std::atomic<int> g_force_f32{-1};  // gemv_float_force: -1 / 1 as the rows say, 0 never
std::atomic<int64_t> g_calls{0};
std::atomic<int64_t> g_ns{0};
std::atomic<int64_t> g_f32_calls{0};
std::atomic<int64_t> g_f32_ns{0};

template <class E>
bool IsDense(const DLTensor* t) {
  return IsCpuCompact(t) && E::Is(t->dtype);
}

// x widened once into ``dst``, rows ``ld`` apart (bfloat16 ``nk``: each block of 16 in the order
// of a load's halves)
template <class E>
void WidenRows(const typename E::T* xs, int64_t rows, int64_t k, int64_t ld, bool kn, float* dst) {
  const int64_t kv = k & ~int64_t(15);
  for (int64_t r = 0; r < rows; ++r) {
    const typename E::T* src = xs + r * k;
    float* row = dst + r * ld;
    if (kn || !E::kHalves) {
      for (int64_t i = 0; i < k; ++i) row[i] = E::Get(src[i]);
      continue;
    }
    for (int64_t b = 0; b < kv; b += 16) {
      for (int i = 0; i < 8; ++i) {
        row[b + i] = E::Get(src[b + 2 * i]);
        row[b + 8 + i] = E::Get(src[b + 2 * i + 1]);
      }
    }
    for (int64_t i = kv; i < k; ++i) row[i] = E::Get(src[i]);
  }
}

// The GEMV of ``call``'s first tensors (``x, w_1..w_P, [b_1..b_P], [residual]`` as ``cfg``
// says) into ``target``, which has ``like``'s shape ([..., N], the call's output), for x of
// ``min_rows`` to kMaxRows rows; false, with nothing written, for a call it does not compute.
template <class E>
bool Gemv(const Call& call, const LinearConfig& cfg, const DLTensor* like,
          typename E::T* target, int64_t min_rows) {
  for (int i = 0; i < cfg.linear_inputs(); ++i) {
    if (!IsDense<E>(call.inputs[i])) return false;
  }
  const DLTensor* x = call.inputs[0];
  if (!IsDense<E>(like) || x->ndim < 1 || like->ndim < 1) return false;
  Problem<E> p;
  p.k = x->shape[x->ndim - 1];
  if (p.k <= 0) return false;
  int64_t rows = NumelOf(x) / p.k;
  if (rows < min_rows || rows > kMaxRows) return false;
  p.rows = static_cast<int>(rows);
  p.kn = cfg.kn;
  p.act = cfg.activation;
  p.num_parts = static_cast<int>(cfg.parts);
  int64_t bytes = 0;
  for (int i = 0; i < p.num_parts; ++i) {
    const DLTensor* w = call.inputs[1 + i];
    if (w->ndim != 2 || w->shape[p.kn ? 0 : 1] != p.k) return false;
    Part<E>& part = p.parts[i];
    part.w = reinterpret_cast<const typename E::T*>(DataOf(w));
    part.n = w->shape[p.kn ? 1 : 0];
    if (part.n <= 0) return false;
    part.offset = p.n_total;
    p.n_total += part.n;
    p.max_n = std::max(p.max_n, part.n);
    bytes += static_cast<int64_t>(sizeof(typename E::T)) * part.n * p.k;
    if (cfg.bias) {
      const DLTensor* b = call.inputs[1 + p.num_parts + i];
      if (NumelOf(b) != part.n) return false;
      part.bias = reinterpret_cast<const typename E::T*>(DataOf(b));
    }
  }
  if (like->shape[like->ndim - 1] != p.n_total || NumelOf(like) != rows * p.n_total) {
    return false;
  }
  if (cfg.residual) {
    const DLTensor* res = call.inputs[1 + p.num_parts * (1 + cfg.bias)];
    if (NumelOf(res) != rows * p.n_total) return false;
    p.residual = reinterpret_cast<const typename E::T*>(DataOf(res));
  }
  p.out = target;

  // x widened once (before any output is written: ``out`` may share its memory)
  thread_local std::vector<float> xbuf;
  thread_local std::vector<float> partial;
  p.x_ld = PaddedStride(p.k);
  xbuf.resize(rows * p.x_ld);
  WidenRows<E>(reinterpret_cast<const typename E::T*>(DataOf(x)), rows, p.k, p.x_ld, p.kn,
               xbuf.data());
  p.x = xbuf.data();
  int threads = bytes < kSerialBelowBytes || omp_in_parallel() ? 1 : omp_get_max_threads();
  if (p.kn) {
    p.acc_ld = PaddedStride(p.max_n);
    partial.resize(static_cast<size_t>(threads) * rows * p.acc_ld);
    p.partial = partial.data();
  }
  Run<E>(p, threads);
  return true;
}

// A call's first argument is a tensor of E's type (every other call is turned away on this)
template <class E>
bool FirstIs(ffi::PackedArgs args) {
  if (args.size() < 3) return false;
  auto first = args[0].try_cast<DLTensor*>();
  return first.has_value() && E::Is((*first)->dtype);
}

// plus.linear's (``norm`` false) or plus.linear_layernorm's config, parsed once per distinct
// text; nullptr for one this file does not compute (at most kMaxParts parts, a residual only
// with one part)
const LinearConfig* GemvConfigOf(std::string_view text, bool norm) {
  static std::mutex mutex;
  static ConfigCache<LinearConfig> linear, layernorm;
  std::lock_guard<std::mutex> lock(mutex);
  const LinearConfig* cfg =
      norm ? layernorm.Get(text, [](const std::string& t) { return ParseLinearConfig(t, true); })
           : linear.Get(text, [](const std::string& t) { return ParseLinearConfig(t, false); });
  bool ok = cfg->known && cfg->parts >= 1 && cfg->parts <= kMaxParts &&
            !(cfg->parts > 1 && cfg->residual);
  return ok ? cfg : nullptr;
}

template <class E>
bool GemvLinear(ffi::PackedArgs args, int64_t min_rows) {
  if (!Avx2Fma() || !FirstIs<E>(args)) return false;
  Call call;
  if (!SplitCall(args, &call) || call.extra_out != nullptr) return false;
  const LinearConfig* cfg = GemvConfigOf(call.config, /*norm=*/false);
  if (cfg == nullptr || call.num_inputs != cfg->inputs()) return false;
  return Gemv<E>(call, *cfg, call.out, reinterpret_cast<typename E::T*>(DataOf(call.out)),
                 min_rows);
}

template <class E>
bool GemvLinearNorm(ffi::PackedArgs args, int64_t min_rows) {
  if (!Avx2Fma() || !FirstIs<E>(args)) return false;
  Call call;
  if (!SplitCall(args, &call)) return false;
  const LinearConfig* cfg = GemvConfigOf(call.config, /*norm=*/true);
  if (cfg == nullptr || call.num_inputs != cfg->inputs()) return false;
  if ((call.extra_out != nullptr) != cfg->sum_out) return false;
  const DLTensor* y = call.out;
  if (!IsDense<E>(y) || y->ndim < 1) return false;
  const int64_t n = y->shape[y->ndim - 1];
  const DLTensor* gamma = cfg->gamma ? call.inputs[cfg->linear_inputs()] : nullptr;
  const DLTensor* beta = cfg->beta ? call.inputs[cfg->inputs() - 1] : nullptr;
  for (const DLTensor* v : {gamma, beta}) {
    if (v != nullptr && (!IsDense<E>(v) || NumelOf(v) != n)) return false;
  }
  const DLTensor* sum = call.extra_out;
  if (sum != nullptr && (!IsDense<E>(sum) || NumelOf(sum) != NumelOf(y))) return false;
  using T = typename E::T;
  // the sum in the call's dtype (as torch's graph holds it): the second output, or a buffer
  thread_local std::vector<T> held;
  T* target;
  if (sum != nullptr) {
    target = reinterpret_cast<T*>(DataOf(sum));
  } else {
    held.resize(NumelOf(y));
    target = held.data();
  }
  if (!Gemv<E>(call, *cfg, y, target, min_rows)) return false;
  // torch's layer_norm of it: float32 statistics of the row, (s - mean) * rstd * gamma + beta
  // in float32, rounded once
  const T* g = gamma != nullptr ? reinterpret_cast<const T*>(DataOf(gamma)) : nullptr;
  const T* b = beta != nullptr ? reinterpret_cast<const T*>(DataOf(beta)) : nullptr;
  T* out = reinterpret_cast<T*>(DataOf(y));
  for (int64_t at = 0; at < NumelOf(y); at += n) {
    double total = 0.0;
    for (int64_t i = 0; i < n; ++i) total += E::Get(target[at + i]);
    const float mean = static_cast<float>(total / n);
    double squares = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      double d = E::Get(target[at + i]) - mean;
      squares += d * d;
    }
    const float rstd = 1.f / std::sqrt(static_cast<float>(squares / n) + cfg->eps);
    for (int64_t i = 0; i < n; ++i) {
      float v = (E::Get(target[at + i]) - mean) * rstd;
      if (g != nullptr) v *= E::Get(g[i]);
      if (b != nullptr) v += E::Get(b[i]);
      out[at + i] = E::Put(v);
    }
  }
  return true;
}

// Counts a call the GEMV ran (``ran``) in ``calls`` and ``ns``
bool Counted(bool ran, int64_t start, std::atomic<int64_t>* calls, std::atomic<int64_t>* ns) {
  if (ran) {
    *calls += 1;
    *ns += NowNs() - start;
  }
  return ran;
}

}  // namespace

bool HalfGemvWanted(bool native_bf16) {
  int force = g_force.load(std::memory_order_relaxed);
  return force < 0 ? !native_bf16 : force == 1;
}

bool HalfGemvLinear(ffi::PackedArgs args) {
  int64_t start = NowNs();
  return Counted(GemvLinear<Bf16>(args, 1), start, &g_calls, &g_ns);
}

bool HalfGemvLinearNorm(ffi::PackedArgs args) {
  int64_t start = NowNs();
  return Counted(GemvLinearNorm<Bf16>(args, 1), start, &g_calls, &g_ns);
}

bool FloatGemvLinear(ffi::PackedArgs args, bool norm) {
  int force = g_force_f32.load(std::memory_order_relaxed);
  if (force == 0) return false;
  int64_t start = NowNs();
  const int64_t min_rows = force == 1 ? 1 : kFloatGemvMinRows;
  bool ran = norm ? GemvLinearNorm<F32>(args, min_rows) : GemvLinear<F32>(args, min_rows);
  return Counted(ran, start, &g_f32_calls, &g_f32_ns);
}

namespace {

// For Python (runtime/linear.py): ``fn(x, w_1..w_P, [b..], [residual], config, out) -> bool``
ffi::Function GemvHalfFunction() {
  return ffi::Function::FromPacked(
      [](ffi::PackedArgs args, ffi::Any* rv) { *rv = HalfGemvLinear(args); });
}

// For tests and benchmarks: -1 the CPU decides (the native plus.linear's dtypes), 0 the native
// plus.linear never uses the bfloat16 GEMV (as on a bfloat16 CPU), 1 always (as on an AVX2 one);
// returns the previous mode
int64_t GemvHalfForce(int64_t mode) { return g_force.exchange(static_cast<int>(mode)); }

// For tests and benchmarks: -1 float32 calls of kFloatGemvMinRows to kMaxRows rows run the
// GEMV, 0 none (oneDNN runs them all), 1 every call of 1 to kMaxRows rows; returns the previous
// mode
int64_t GemvFloatForce(int64_t mode) { return g_force_f32.exchange(static_cast<int>(mode)); }

ffi::String GemvHalfStats() {
  std::ostringstream os;
  os << "{\"calls\": " << g_calls.load() << ", \"call_us\": " << g_ns.load() / 1000
     << ", \"float_calls\": " << g_f32_calls.load()
     << ", \"float_call_us\": " << g_f32_ns.load() / 1000 << ", \"max_rows\": " << kMaxRows
     << ", \"float_min_rows\": " << kFloatGemvMinRows
     << ", \"available\": " << (Avx2Fma() ? "true" : "false") << "}";
  return os.str();
}

}  // namespace
}  // namespace plus_native

TVM_FFI_DLL_EXPORT_TYPED_FUNC(gemv_half_function, plus_native::GemvHalfFunction);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gemv_half_force, plus_native::GemvHalfForce);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gemv_float_force, plus_native::GemvFloatForce);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gemv_half_stats, plus_native::GemvHalfStats);
