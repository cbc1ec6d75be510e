// bfloat16 GEMV on CPUs without bfloat16 GEMM instructions (AVX2 + FMA, no AVX512-BF16 / AMX).
//
// A decode step's linears have one row per sequence: at batch 1 (and 2) each is a GEMV, which
// streams its weight once and does two FLOPs per weight element, so it runs at the memory's
// speed or not at all. bfloat16 halves the bytes, but on such a CPU torch's bfloat16 GEMV is far
// from that speed (scripts/bench_half_gemv.py), and widening the weight to float32
// (what the GEMMs of 3+ rows do, ``_common.widened_half``) streams twice the bytes. Here the
// bfloat16 weight is read as stored ([N, K] as nn.Linear holds it, ``w=nk``, or [K, N] as
// GPT-2's Conv1D, ``w=kn``), 16 elements a 32-byte load, widened to float32 in registers by
// 16-bit shifts (bfloat16 is float32's upper half: the even elements of a load are its 32-bit
// lanes shifted left by 16, the odd ones its lanes with the low half masked off), and
// multiplied and summed in float32 with FMA. The row ``x`` is widened once per call into a
// buffer (for ``nk`` its elements reordered, even then odd in each block of 16, to match).
//
// Work is split over the calling thread's OpenMP team (the threads torch and oneDNN use):
// ``nk`` by output rows (each thread streams a contiguous run of whole weight rows, one after
// the other), ``kn`` by K (each thread streams a contiguous run of weight rows into a float32 partial
// sum of every output; the partials are then summed in thread order and finished per column
// range).
//
// Results as torch's op-by-op graph rounds them (runtime/linear.py's reference): the float32
// dot product plus the bias rounded to bfloat16 once (torch's ``addmm``), then the activation
// computed in float32 on that and rounded, then the residual added in float32 and rounded. The
// sums' order differs from torch's, as float32 sums of another order do (an output can differ by
// one bfloat16 ulp where the float32 sum falls near a rounding boundary). ``plus.linear_layernorm``
// (GPT-2's projections with the residual and the next LayerNorm) runs the same GEMV for its
// sum, rounded, then the layer normalization as torch's half ``layer_norm`` (float32 statistics
// and arithmetic, one rounding).
//
// The native plus.linear and plus.linear_layernorm (onednn_linear.cc) call this first for every
// call where the CPU computes no bfloat16 (their dtypes lack it); a call this file does not
// take goes on as before (to the Python kernel, which calls it too: runtime/linear.py).

#include "gemv_half.h"

#include <omp.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

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
// below this many weight bytes a call runs on the calling thread alone (an OpenMP fork and join
// costs a few microseconds; 128 KiB streams in about as long)
constexpr int64_t kSerialBelowBytes = 128 << 10;
// how far ahead of its loads a weight stream prefetches, in elements (2 KiB: measured best of
// 512-2048 on this project's AVX2 EPYC for both layouts)
constexpr int64_t kPrefetch = 1024;

enum class Act { kNone, kRelu, kRelu6, kGelu, kGeluTanh, kSilu, kSigmoid, kTanh };

bool ActOf(const std::string& name, Act* act) {
  static const std::pair<const char*, Act> kActs[] = {
      {"none", Act::kNone}, {"relu", Act::kRelu},         {"relu6", Act::kRelu6},
      {"gelu", Act::kGelu}, {"gelu_tanh", Act::kGeluTanh}, {"silu", Act::kSilu},
      {"sigmoid", Act::kSigmoid}, {"tanh", Act::kTanh}};
  for (const auto& [known, value] : kActs) {
    if (name == known) {
      *act = value;
      return true;
    }
  }
  return false;
}

// plus.linear's config (runtime/linear.py's LINEAR_SPEC); ``ok`` false for anything else.
struct GemvConfig {
  bool kn = false;
  bool bias = false;
  bool residual = false;
  int64_t parts = 1;
  Act act = Act::kNone;
  bool ok = false;
  int inputs() const { return static_cast<int>(1 + parts * (1 + bias) + residual); }
};

GemvConfig ParseGemv(const std::string& text) {
  GemvConfig cfg;
  bool prepack = true;  // read and ignored: a GEMV reads the weight as stored
  bool ok = ForEachItem(text, [&](const std::string& key, const std::string& value) {
    if (key == "w") {
      cfg.kn = value == "kn";
      return value == "kn" || value == "nk";
    }
    if (key == "bias") return ParseFlag(value, &cfg.bias);
    if (key == "residual") return ParseFlag(value, &cfg.residual);
    if (key == "prepack") return ParseFlag(value, &prepack);
    if (key == "parts") return ParseInts(value, &cfg.parts, 1);
    if (key == "act") return ActOf(value, &cfg.act);
    return false;
  });
  cfg.ok = ok && cfg.parts >= 1 && cfg.parts <= kMaxParts && !(cfg.parts > 1 && cfg.residual);
  return cfg;
}

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
float Activate(float v, Act act) {
  switch (act) {
    case Act::kRelu:
      return std::isnan(v) ? v : (v > 0.f ? v : 0.f);
    case Act::kRelu6:
      return std::isnan(v) ? v : std::min(std::max(v, 0.f), 6.f);
    case Act::kGelu:
      return 0.5f * v * (1.f + std::erf(v * 0.70710678118654752f));
    case Act::kGeluTanh: {
      float inner = 0.79788456080286536f * (v + 0.044715f * v * v * v);
      return 0.5f * v * (1.f + std::tanh(inner));
    }
    case Act::kSilu:
      return v / (1.f + std::exp(-v));
    case Act::kSigmoid:
      return 1.f / (1.f + std::exp(-v));
    case Act::kTanh:
      return std::tanh(v);
    case Act::kNone:
      break;
  }
  return v;
}

struct Part {
  const uint16_t* w = nullptr;
  const uint16_t* bias = nullptr;
  int64_t n = 0;       // its outputs
  int64_t offset = 0;  // its first column in ``out``
};

struct Problem {
  int rows = 1;
  int64_t k = 0;
  int64_t n_total = 0;
  bool kn = false;
  Act act = Act::kNone;
  const uint16_t* residual = nullptr;
  uint16_t* out = nullptr;
  Part parts[kMaxParts];
  int num_parts = 0;
  const float* x = nullptr;  // [rows][k] widened (``nk``: each block of 16 even, then odd)
  float* partial = nullptr;  // ``kn``: [threads][rows][max part n]
  int64_t max_n = 0;
};

// out[r, part's column n] from the float32 sum ``acc``, rounded where torch's graph rounds
inline void Finish(const Problem& p, const Part& part, int r, int64_t n, float acc) {
  float v = acc;
  if (part.bias != nullptr) v += Widen(part.bias[n]);
  uint16_t y = Round(v);
  if (p.act != Act::kNone) y = Round(Activate(Widen(y), p.act));
  int64_t at = r * p.n_total + part.offset + n;
  if (p.residual != nullptr) y = Round(Widen(y) + Widen(p.residual[at]));
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

// Where column ``c`` of a ``kn`` partial sum lies: blocks of 16 hold their even columns, then
// their odd ones (the order of a load's widened halves); the columns past the last whole block
// lie in order.
inline int64_t KnSlot(int64_t c, int64_t n) {
  int64_t nv = n & ~int64_t(15);
  if (c >= nv) return c;
  int64_t i = c & 15;
  return (c & ~int64_t(15)) + ((i & 1) ? 8 + (i >> 1) : (i >> 1));
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

// ``w=nk``: outputs [begin, end) of ``part``, each the dot product of a weight row with x, one
// row after the other. One stream of loads with a prefetch ahead of it: measured on this
// project's AVX2 EPYC (768 x 32000, 2 threads) at the read bandwidth (19.3 GB/s, a plain read
// 17.7), where four rows interleaved (four streams) reach 12.4 and no prefetch 15.6-17.9.
template <int R>
__attribute__((target("avx2,fma"))) void NkRange(const Problem& p, const Part& part,
                                                 int64_t begin, int64_t end) {
  const int64_t k = p.k, kv = k & ~int64_t(15);
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  for (int64_t n = begin; n < end; ++n) {
    const uint16_t* w = part.w + n * k;
    __m256 even[R], odd[R];  // the sums of the even and the odd elements (two chains each)
    for (int r = 0; r < R; ++r) even[r] = odd[r] = _mm256_setzero_ps();
    for (int64_t kk = 0; kk < kv; kk += 16) {
      _mm_prefetch(reinterpret_cast<const char*>(w + kk + kPrefetch), _MM_HINT_T0);
      __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + kk));
      __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
      __m256 wo = _mm256_castsi256_ps(_mm256_and_si256(v, high));
      for (int r = 0; r < R; ++r) {
        even[r] = _mm256_fmadd_ps(we, _mm256_loadu_ps(p.x + r * k + kk), even[r]);
        odd[r] = _mm256_fmadd_ps(wo, _mm256_loadu_ps(p.x + r * k + kk + 8), odd[r]);
      }
    }
    for (int r = 0; r < R; ++r) {
      float s = HorizontalSum(_mm256_add_ps(even[r], odd[r]));
      for (int64_t kk = kv; kk < k; ++kk) s += p.x[r * k + kk] * Widen(w[kk]);
      Finish(p, part, r, n, s);
    }
  }
}

// ``w=kn``: acc[r][slot] = sum over k in [k0, k1) of x[r, k] * w[k, column], every column
template <int R>
__attribute__((target("avx2,fma"))) void KnPartial(const Problem& p, const Part& part,
                                                   int64_t k0, int64_t k1, float* acc) {
  const int64_t n = part.n, nv = n & ~int64_t(15);
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  std::fill(acc, acc + R * n, 0.f);
  int64_t kk = k0;
  for (; kk + 2 <= k1; kk += 2) {
    const uint16_t* a = part.w + kk * n;
    const uint16_t* b = a + n;
    __m256 xa[R], xb[R];
    for (int r = 0; r < R; ++r) {
      xa[r] = _mm256_set1_ps(p.x[r * p.k + kk]);
      xb[r] = _mm256_set1_ps(p.x[r * p.k + kk + 1]);
    }
    for (int64_t j = 0; j < nv; j += 16) {
      _mm_prefetch(reinterpret_cast<const char*>(a + j + kPrefetch), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(b + j + kPrefetch), _MM_HINT_T0);
      __m256i va = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + j));
      __m256i vb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + j));
      __m256 ea = _mm256_castsi256_ps(_mm256_slli_epi32(va, 16));
      __m256 oa = _mm256_castsi256_ps(_mm256_and_si256(va, high));
      __m256 eb = _mm256_castsi256_ps(_mm256_slli_epi32(vb, 16));
      __m256 ob = _mm256_castsi256_ps(_mm256_and_si256(vb, high));
      for (int r = 0; r < R; ++r) {
        float* at = acc + r * n + j;
        __m256 se = _mm256_loadu_ps(at), so = _mm256_loadu_ps(at + 8);
        se = _mm256_fmadd_ps(eb, xb[r], _mm256_fmadd_ps(ea, xa[r], se));
        so = _mm256_fmadd_ps(ob, xb[r], _mm256_fmadd_ps(oa, xa[r], so));
        _mm256_storeu_ps(at, se);
        _mm256_storeu_ps(at + 8, so);
      }
    }
    for (int64_t j = nv; j < n; ++j) {
      for (int r = 0; r < R; ++r) {
        acc[r * n + j] += p.x[r * p.k + kk] * Widen(a[j]) + p.x[r * p.k + kk + 1] * Widen(b[j]);
      }
    }
  }
  for (; kk < k1; ++kk) {
    const uint16_t* a = part.w + kk * n;
    for (int64_t j = 0; j < n; ++j) {
      for (int r = 0; r < R; ++r) acc[r * n + KnSlot(j, n)] += p.x[r * p.k + kk] * Widen(a[j]);
    }
  }
}

// Thread ``t`` of ``threads``' share of the call (every thread of the team runs it: the
// barriers are the team's)
template <int R>
void RunThread(const Problem& p, int t, int threads) {
  for (int i = 0; i < p.num_parts; ++i) {
    const Part& part = p.parts[i];
    int64_t begin, end;
    if (!p.kn) {
      Split(part.n, t, threads, 4, &begin, &end);
      NkRange<R>(p, part, begin, end);
      continue;
    }
    const int64_t stride = R * p.max_n;  // one thread's partial sums
    Split(p.k, t, threads, 2, &begin, &end);
    KnPartial<R>(p, part, begin, end, p.partial + t * stride);
#pragma omp barrier
    Split(part.n, t, threads, 16, &begin, &end);
    for (int r = 0; r < R; ++r) {
      for (int64_t c = begin; c < end; ++c) {
        int64_t slot = r * part.n + KnSlot(c, part.n);
        float s = p.partial[slot];
        for (int u = 1; u < threads; ++u) s += p.partial[u * stride + slot];
        Finish(p, part, r, c, s);
      }
    }
#pragma omp barrier
  }
}

template <int R>
void Run(const Problem& p, int threads) {
  if (threads <= 1) return RunThread<R>(p, 0, 1);
#pragma omp parallel num_threads(threads)
  RunThread<R>(p, omp_get_thread_num(), omp_get_num_threads());
}

#else  // not x86-64: every call goes to the Python kernel

bool Avx2Fma() { return false; }
template <int R>
void Run(const Problem&, int) {}

#endif

std::atomic<int> g_force{-1};  // gemv_half_force: -1 as the CPU says, 0 never, 1 always
std::atomic<int64_t> g_calls{0};
std::atomic<int64_t> g_ns{0};

bool IsBf16Dense(const DLTensor* t) {
  return IsCpuCompact(t) && t->dtype.code == kDLBfloat && t->dtype.bits == 16 &&
         t->dtype.lanes == 1;
}

}  // namespace

bool HalfGemvWanted(bool native_bf16) {
  int force = g_force.load(std::memory_order_relaxed);
  return force < 0 ? !native_bf16 : force == 1;
}

namespace {

// The GEMV of ``call``'s first tensors (``x, w_1..w_P, [b_1..b_P], [residual]`` as ``cfg``
// says) into ``target``, which has ``like``'s shape ([..., N], the call's output); false, with
// nothing written, for a call it does not compute.
bool Gemv(const Call& call, const GemvConfig& cfg, const DLTensor* like, uint16_t* target) {
  for (int i = 0; i < cfg.inputs(); ++i) {
    if (!IsBf16Dense(call.inputs[i])) return false;
  }
  const DLTensor* x = call.inputs[0];
  if (!IsBf16Dense(like) || x->ndim < 1 || like->ndim < 1) return false;
  Problem p;
  p.k = x->shape[x->ndim - 1];
  if (p.k <= 0) return false;
  int64_t rows = NumelOf(x) / p.k;
  if (rows < 1 || rows > 2) return false;
  p.rows = static_cast<int>(rows);
  p.kn = cfg.kn;
  p.act = cfg.act;
  p.num_parts = static_cast<int>(cfg.parts);
  int64_t bytes = 0;
  for (int i = 0; i < p.num_parts; ++i) {
    const DLTensor* w = call.inputs[1 + i];
    if (w->ndim != 2 || w->shape[p.kn ? 0 : 1] != p.k) return false;
    Part& part = p.parts[i];
    part.w = reinterpret_cast<const uint16_t*>(DataOf(w));
    part.n = w->shape[p.kn ? 1 : 0];
    if (part.n <= 0) return false;
    part.offset = p.n_total;
    p.n_total += part.n;
    p.max_n = std::max(p.max_n, part.n);
    bytes += 2 * part.n * p.k;
    if (cfg.bias) {
      const DLTensor* b = call.inputs[1 + p.num_parts + i];
      if (NumelOf(b) != part.n) return false;
      part.bias = reinterpret_cast<const uint16_t*>(DataOf(b));
    }
  }
  if (like->shape[like->ndim - 1] != p.n_total || NumelOf(like) != rows * p.n_total) {
    return false;
  }
  if (cfg.residual) {
    const DLTensor* res = call.inputs[1 + p.num_parts * (1 + cfg.bias)];
    if (NumelOf(res) != rows * p.n_total) return false;
    p.residual = reinterpret_cast<const uint16_t*>(DataOf(res));
  }
  p.out = target;

  // x widened once (before any output is written: ``out`` may share its memory)
  thread_local std::vector<float> xbuf;
  thread_local std::vector<float> partial;
  xbuf.resize(rows * p.k);
  const uint16_t* xs = reinterpret_cast<const uint16_t*>(DataOf(x));
  const int64_t kv = p.k & ~int64_t(15);
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* src = xs + r * p.k;
    float* dst = xbuf.data() + r * p.k;
    if (p.kn) {
      for (int64_t i = 0; i < p.k; ++i) dst[i] = Widen(src[i]);
      continue;
    }
    for (int64_t b = 0; b < kv; b += 16) {
      for (int i = 0; i < 8; ++i) {
        dst[b + i] = Widen(src[b + 2 * i]);
        dst[b + 8 + i] = Widen(src[b + 2 * i + 1]);
      }
    }
    for (int64_t i = kv; i < p.k; ++i) dst[i] = Widen(src[i]);
  }
  p.x = xbuf.data();
  int threads = bytes < kSerialBelowBytes || omp_in_parallel() ? 1 : omp_get_max_threads();
  if (p.kn) {
    partial.resize(static_cast<size_t>(threads) * rows * p.max_n);
    p.partial = partial.data();
  }
  if (rows == 1) {
    Run<1>(p, threads);
  } else {
    Run<2>(p, threads);
  }
  return true;
}

// A call's first argument is a bfloat16 tensor (every other call is turned away on this)
bool FirstIsBf16(ffi::PackedArgs args) {
  if (args.size() < 3) return false;
  auto first = args[0].try_cast<DLTensor*>();
  return first.has_value() && (*first)->dtype.code == kDLBfloat;
}

// plus.linear_layernorm's config (runtime/linear_layernorm.py's LINEAR_LAYERNORM_SPEC)
struct NormConfig {
  GemvConfig gemv;  // its GEMM: bias, residual, no activation, one part
  bool gamma = false;
  bool beta = false;
  bool sum_out = false;
  float eps = 1e-5f;
  bool ok = false;
  int inputs() const { return gemv.inputs() + gamma + beta; }
};

NormConfig ParseNorm(const std::string& text) {
  NormConfig cfg;
  bool prepack = true;
  bool ok = ForEachItem(text, [&](const std::string& key, const std::string& value) {
    if (key == "w") {
      cfg.gemv.kn = value == "kn";
      return value == "kn" || value == "nk";
    }
    if (key == "bias") return ParseFlag(value, &cfg.gemv.bias);
    if (key == "residual") return ParseFlag(value, &cfg.gemv.residual);
    if (key == "gamma") return ParseFlag(value, &cfg.gamma);
    if (key == "beta") return ParseFlag(value, &cfg.beta);
    if (key == "sum_out") return ParseFlag(value, &cfg.sum_out);
    if (key == "eps") return ParseFloat(value, &cfg.eps);
    if (key == "prepack") return ParseFlag(value, &prepack);
    return false;
  });
  cfg.ok = cfg.gemv.ok = ok;
  return cfg;
}

template <typename Config, typename Parse>
const Config* CachedConfig(std::string_view text, Parse parse) {
  static std::mutex mutex;
  static ConfigCache<Config> configs;
  std::lock_guard<std::mutex> lock(mutex);
  return configs.Get(text, parse);
}

}  // namespace

bool HalfGemvLinear(ffi::PackedArgs args) {
  if (!Avx2Fma() || !FirstIsBf16(args)) return false;
  int64_t start = NowNs();
  Call call;
  if (!SplitCall(args, &call) || call.extra_out != nullptr) return false;
  const GemvConfig* cfg = CachedConfig<GemvConfig>(call.config, ParseGemv);
  if (!cfg->ok || call.num_inputs != cfg->inputs()) return false;
  if (!Gemv(call, *cfg, call.out, reinterpret_cast<uint16_t*>(DataOf(call.out)))) return false;
  g_calls += 1;
  g_ns += NowNs() - start;
  return true;
}

bool HalfGemvLinearNorm(ffi::PackedArgs args) {
  if (!Avx2Fma() || !FirstIsBf16(args)) return false;
  int64_t start = NowNs();
  Call call;
  if (!SplitCall(args, &call)) return false;
  const NormConfig* cfg = CachedConfig<NormConfig>(call.config, ParseNorm);
  if (!cfg->ok || call.num_inputs != cfg->inputs()) return false;
  if ((call.extra_out != nullptr) != cfg->sum_out) return false;
  const DLTensor* y = call.out;
  if (!IsBf16Dense(y) || y->ndim < 1) return false;
  const int64_t n = y->shape[y->ndim - 1];
  const DLTensor* gamma = cfg->gamma ? call.inputs[cfg->gemv.inputs()] : nullptr;
  const DLTensor* beta = cfg->beta ? call.inputs[cfg->inputs() - 1] : nullptr;
  for (const DLTensor* v : {gamma, beta}) {
    if (v != nullptr && (!IsBf16Dense(v) || NumelOf(v) != n)) return false;
  }
  const DLTensor* sum = call.extra_out;
  if (sum != nullptr && (!IsBf16Dense(sum) || NumelOf(sum) != NumelOf(y))) return false;
  // the sum rounded to bfloat16 (as torch's graph holds it): the second output, or a buffer
  thread_local std::vector<uint16_t> held;
  uint16_t* target;
  if (sum != nullptr) {
    target = reinterpret_cast<uint16_t*>(DataOf(sum));
  } else {
    held.resize(NumelOf(y));
    target = held.data();
  }
  if (!Gemv(call, cfg->gemv, y, target)) return false;
  // torch's layer_norm of it: float32 statistics of the row, (s - mean) * rstd * gamma + beta
  // in float32, rounded once
  const uint16_t* g = gamma != nullptr ? reinterpret_cast<const uint16_t*>(DataOf(gamma)) : nullptr;
  const uint16_t* b = beta != nullptr ? reinterpret_cast<const uint16_t*>(DataOf(beta)) : nullptr;
  uint16_t* out = reinterpret_cast<uint16_t*>(DataOf(y));
  for (int64_t at = 0; at < NumelOf(y); at += n) {
    double total = 0.0;
    for (int64_t i = 0; i < n; ++i) total += Widen(target[at + i]);
    const float mean = static_cast<float>(total / n);
    double squares = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      double d = Widen(target[at + i]) - mean;
      squares += d * d;
    }
    const float rstd = 1.f / std::sqrt(static_cast<float>(squares / n) + cfg->eps);
    for (int64_t i = 0; i < n; ++i) {
      float v = (Widen(target[at + i]) - mean) * rstd;
      if (g != nullptr) v *= Widen(g[i]);
      if (b != nullptr) v += Widen(b[i]);
      out[at + i] = Round(v);
    }
  }
  g_calls += 1;
  g_ns += NowNs() - start;
  return true;
}

namespace {

// For Python (runtime/linear.py): ``fn(x, w_1..w_P, [b..], [residual], config, out) -> bool``
ffi::Function GemvHalfFunction() {
  return ffi::Function::FromPacked(
      [](ffi::PackedArgs args, ffi::Any* rv) { *rv = HalfGemvLinear(args); });
}

// For tests and benchmarks: -1 the CPU decides (the native plus.linear's dtypes), 0 the native
// plus.linear never uses the GEMV (as on a bfloat16 CPU), 1 always (as on an AVX2 one); returns
// the previous mode
int64_t GemvHalfForce(int64_t mode) { return g_force.exchange(static_cast<int>(mode)); }

ffi::String GemvHalfStats() {
  std::ostringstream os;
  os << "{\"calls\": " << g_calls.load() << ", \"call_us\": " << g_ns.load() / 1000
     << ", \"available\": " << (Avx2Fma() ? "true" : "false") << "}";
  return os.str();
}

}  // namespace
}  // namespace plus_native

TVM_FFI_DLL_EXPORT_TYPED_FUNC(gemv_half_function, plus_native::GemvHalfFunction);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gemv_half_force, plus_native::GemvHalfForce);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gemv_half_stats, plus_native::GemvHalfStats);
