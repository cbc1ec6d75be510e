// plus.attention on oneDNN, called by TVM's VM without Python.
//
// The fast path of ``plus.attention`` (../attention.py holds the contract and the reference):
// CPU tensors of one dtype the Python kernel names as native (``native_dtypes()``), q / k / v
// in ``bhsd`` or ``bshd`` (read in place through strides: no
// transposes), an optional additive mask broadcast to [B, H, Sq, Sk], an optional causal mask
// (top-left aligned, as torch's is_causal), the result written straight into ``out`` in
// ``bhsd`` or ``bshd``. Three primitives: scores = q @ k^T * scale + masks (one matmul, the
// scale and the masks as post-ops) into this thread's scratch buffer, softmax over the keys in
// place, out = scores @ v (one matmul). torch's CPU flash attention takes 430-480 us at BERT's
// shape (12 heads, 128 tokens, 64 dims); these three take about 200 us.
//
// In bfloat16 / float16 the scores accumulate and stay in float32 (scale and masks added in
// float32), the softmax computes in float32 and rounds the probabilities once to the dtype,
// and the second matmul accumulates them with v in float32 and rounds once into ``out``: as
// torch's CPU flash attention in half precision (float32 scores and softmax, probabilities
// rounded for the product with v). The mask is in the call's dtype or float32.
//
// k and v may have fewer heads than q (grouped-query attention: query head h reads kv head
// h / (H / Hkv)): every tensor is seen as [B, Hkv, H / Hkv, S, D] and k, v broadcast over the
// third dim, so no head is repeated. ``cache=1`` (a decode step): k and v are the KV cache's
// [T, B, Hkv, D] views, read in place through strides, whose last position is the new token's
// slot; the new token's keys and values (two more inputs, one position) are copied into that
// slot first.
//
// A bfloat16 call on a CPU without bfloat16 instructions (bfloat16 not among the kernel's
// ``native_dtypes()``: cpu_features) computes in float32 (oneDNN would emulate bfloat16). One
// query runs the direct loop below, which widens as it reads; more (WidensHalf: from
// ../_common.py's WIDEN_MIN_ROWS queries, as the Python kernel's widened_half decides) widen q,
// k, v (and a bfloat16 mask) into this thread's scratch, run the float32 primitives on them (the
// plan of a float32 call of that shape) and round the float32 result once into ``out``: the
// probabilities are not rounded (they are where the CPU computes bfloat16, as in torch's flash
// attention), so the error is float32's rounded once, below torch's. Fewer queries, and float16
// calls, go to the Python kernel, which decides alike.
//
// One query position (a decode step, Sq == 1) runs a direct loop instead (DecodeAttention): the
// keys' length grows by one every step, so a oneDNN plan keyed by the shapes would be created
// anew at every call (three primitives, 100-900 us at 8 heads of 32 dims, more than the
// attention itself). Per (batch, head): the scores over the keys (dot products over D,
// vectorised), the softmax, and the probabilities' weighted sum of v, each row of k and v read
// once through strides; batch x heads split over OpenMP's threads when there is enough work.
// Numerics as the primitives': float32 scores, scale and masks, float32 softmax, the
// probabilities rounded once to a half call's dtype, float32 accumulation with v, one rounding
// into ``out``.

#include <cmath>
#include <limits>
#include <utility>

#include "onednn_common.h"

namespace plus_native {
namespace {

struct AttentionConfig {
  bool bshd = false;      // q, k, v are [B, S, H, D] (else [B, H, S, D])
  bool out_bshd = false;  // out likewise
  bool has_scale = false;
  float scale = 1.f;
  bool causal = false;
  bool mask = false;
  bool zero_masked = false;  // a query whose mask row is all -inf gets 0 (SDPA's safe softmax)
  bool cache = false;        // k, v are [T, B, Hkv, D] caches; k_new, v_new fill the last slot
  bool slot = false;         // a slot tensor names the position instead: not run natively
  bool known = false;  // every item understood (a key and value of the kernel's spec)
  bool native = false;

  int inputs() const { return 3 + 2 * cache + mask; }
};

AttentionConfig ParseAttentionConfig(const std::string& text) {
  AttentionConfig cfg;
  bool ok = ForEachItem(text, [&](const std::string& key, const std::string& value) {
    if (key == "layout") {
      cfg.bshd = value == "bshd";
      return value == "bshd" || value == "bhsd";
    }
    if (key == "out_layout") {
      cfg.out_bshd = value == "bshd";
      return value == "bshd" || value == "bhsd";
    }
    if (key == "scale") {
      cfg.has_scale = true;
      return ParseFloat(value, &cfg.scale);
    }
    if (key == "causal") return ParseFlag(value, &cfg.causal);
    if (key == "mask") return ParseFlag(value, &cfg.mask);
    if (key == "zero_masked") return ParseFlag(value, &cfg.zero_masked);
    if (key == "cache") return ParseFlag(value, &cfg.cache);
    if (key == "slot") return ParseFlag(value, &cfg.slot);
    return false;
  });
  cfg.known = ok;
  cfg.native = ok && !cfg.slot;
  return cfg;
}

enum class Layout { kBHSD, kBSHD, kTBHD };

// [B, H, S, D] of a compact tensor in ``layout`` and its strides (in elements)
void HeadDims(const DLTensor* t, Layout layout, int64_t dims[4], int64_t strides[4]) {
  const int64_t* x = t->shape;
  if (layout == Layout::kBHSD) {
    int64_t d[4] = {x[0], x[1], x[2], x[3]}, st[4] = {x[1] * x[2] * x[3], x[2] * x[3], x[3], 1};
    std::copy_n(d, 4, dims), std::copy_n(st, 4, strides);
  } else if (layout == Layout::kBSHD) {
    int64_t d[4] = {x[0], x[2], x[1], x[3]}, st[4] = {x[1] * x[2] * x[3], x[3], x[2] * x[3], 1};
    std::copy_n(d, 4, dims), std::copy_n(st, 4, strides);
  } else {  // [T, B, H, D]
    int64_t d[4] = {x[1], x[2], x[0], x[3]}, st[4] = {x[2] * x[3], x[3], x[1] * x[2] * x[3], 1};
    std::copy_n(d, 4, dims), std::copy_n(st, 4, strides);
  }
}

// the [B, G, H / G, S, D] view of a tensor of H heads in ``layout`` (G: the kv heads; k and v
// have H == G); ``transposed``: [B, G, H / G, D, S] (k^T)
memory::desc Heads(const DLTensor* t, Layout layout, int64_t groups, bool transposed,
                   memory::data_type dt) {
  int64_t dims[4], st[4];
  HeadDims(t, layout, dims, st);
  int64_t r = dims[1] / groups;
  if (transposed) {
    return memory::desc({dims[0], groups, r, dims[3], dims[2]}, dt,
                        memory::dims{st[0], st[1] * r, st[1], st[3], st[2]});
  }
  return memory::desc({dims[0], groups, r, dims[2], dims[3]}, dt,
                      memory::dims{st[0], st[1] * r, st[1], st[2], st[3]});
}

// ``d`` without its third dim when that is 1 (every head its own kv head): oneDNN's fast
// matmuls take 4-D batches, a 5-D one with a broadcast dim may run its reference code
memory::desc Squeezed(const memory::desc& d, bool squeeze) {
  if (!squeeze) return d;
  memory::dims dims = d.get_dims(), st = d.get_strides();
  return memory::desc({dims[0], dims[1], dims[3], dims[4]}, d.get_data_type(),
                      memory::dims{st[0], st[1], st[3], st[4]});
}


// ----------------------------------------------------------------- bfloat16 <-> float32

inline float HalfToF32(uint16_t x) {  // bfloat16 bits
  uint32_t u = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t F32ToHalf(float f) {  // bfloat16, round to nearest even (NaN kept quiet)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t nan = (u & 0x7fffffffu) > 0x7f800000u;  // (no branch: vectorises in NarrowBf16Block)
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(nan ? (u >> 16) | 0x40u : rounded);
}

// The queries (Sq: the rows each widened k and v serve) from which a bfloat16 call computes in
// float32 on a CPU without bfloat16 instructions: ../_common.py's WIDEN_MIN_ROWS["bfloat16"] (the
// Python kernel decides with widened_half; tests/test_widened_attention.py checks they agree)
constexpr int64_t kWidenMinRows = 3;

// Whether a call in ``dt`` with ``rows`` queries computes in float32 on q, k, v widened per call,
// rounded once into out: bfloat16 on a CPU that does not compute it (``native``: the dtypes it
// does), from kWidenMinRows queries. float16: the Python kernel's.
bool WidensHalf(const std::vector<memory::data_type>& native, memory::data_type dt, int64_t rows) {
  return dt == memory::data_type::bf16 && rows >= kWidenMinRows &&
         std::find(native.begin(), native.end(), dt) == native.end();
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void WidenBf16Block(
    const uint16_t* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = HalfToF32(x[i]);
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void NarrowBf16Block(
    const float* x, uint16_t* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = F32ToHalf(x[i]);
}

// ``n`` bfloat16 values widened to float32 (exact) or float32 rounded to bfloat16, in blocks
// split over OpenMP's threads when there are several
constexpr int64_t kConvertBlock = 1 << 15;

void WidenBf16(const void* x, float* y, int64_t n) {
  const uint16_t* h = static_cast<const uint16_t*>(x);
  const int64_t blocks = (n + kConvertBlock - 1) / kConvertBlock;
#pragma omp parallel for schedule(static) if (blocks > 1)
  for (int64_t b = 0; b < blocks; ++b) {
    int64_t at = b * kConvertBlock;
    WidenBf16Block(h + at, y + at, std::min(kConvertBlock, n - at));
  }
}

void NarrowBf16(const float* x, void* y, int64_t n) {
  uint16_t* h = static_cast<uint16_t*>(y);
  const int64_t blocks = (n + kConvertBlock - 1) / kConvertBlock;
#pragma omp parallel for schedule(static) if (blocks > 1)
  for (int64_t b = 0; b < blocks; ++b) {
    int64_t at = b * kConvertBlock;
    NarrowBf16Block(x + at, h + at, std::min(kConvertBlock, n - at));
  }
}

// ------------------------------------------------------------------------ decode (Sq == 1)

// How many keys (rows of k or v, [T, B, Hkv, D] apart by B * Hkv * D elements) ahead the decode
// loops prefetch: the rows of one (batch, head) are far apart, beyond what the hardware's
// stream prefetchers follow
constexpr int64_t kKeysAhead = 4;

template <typename T>
inline void PrefetchRow(const T* row, int64_t n) {
  for (int64_t i = 0; i < n; i += 64 / static_cast<int64_t>(sizeof(T))) __builtin_prefetch(row + i);
}

inline float Wide(float x) { return x; }
inline float Wide(uint16_t x) { return HalfToF32(x); }

// s[j] = q . k_j for the ``sk`` keys ``stride`` elements apart (q in float32; k float32 or
// bfloat16), one function call per (batch, head) rather than per key
template <typename T>
__attribute__((target_clones("avx512f", "avx2", "default"))) void Scores(
    const float* q, const T* k, int64_t stride, int64_t sk, int64_t d, float* s) {
  for (int64_t j = 0; j < sk; ++j) {
    const T* row = k + j * stride;
    if (j + kKeysAhead < sk) PrefetchRow(row + kKeysAhead * stride, d);
    float acc = 0.f;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < d; ++i) acc += q[i] * Wide(row[i]);
    s[j] = acc;
  }
}

// acc[i] += p[j] * v_j[i] over the ``sk`` rows of v ``stride`` elements apart
template <typename T>
__attribute__((target_clones("avx512f", "avx2", "default"))) void WeightedRows(
    const float* p, const T* v, int64_t stride, int64_t sk, int64_t dv, float* acc) {
  for (int64_t j = 0; j < sk; ++j) {
    const T* row = v + j * stride;
    if (j + kKeysAhead < sk) PrefetchRow(row + kKeysAhead * stride, dv);
    const float pj = p[j];
#pragma omp simd
    for (int64_t i = 0; i < dv; ++i) acc[i] += pj * Wide(row[i]);
  }
}

struct DecodeArgs {
  const char* q;
  const char* k;
  const char* v;
  char* out;
  const char* mask = nullptr;
  bool mask_half = false;  // the mask in bfloat16 (else float32)
  int64_t mask_dims[4] = {1, 1, 1, 1};  // broadcast to [B, H, 1, Sk]
  int64_t qs[4], ks[4], vs[4], os[4];   // [B, H, S, D] strides of each, in elements
  int64_t B, H, G, SK, D, DV;           // G: kv heads
  float scale;
  bool half;  // bfloat16 (else float32)
  bool causal;
};

// softmax(q k^T * scale + mask) v for one query position of every (batch, head)
void DecodeAttention(const DecodeArgs& a) {
  const int64_t tasks = a.B * a.H, rep = a.H / a.G, elem = a.half ? 2 : 4;
  const int64_t work = tasks * a.SK * (a.D + a.DV);
  const int64_t m3 = a.mask_dims[3], m2 = a.mask_dims[2] * m3, m1 = a.mask_dims[1] * m2;
#pragma omp parallel for schedule(static) if (work >= 65536)
  for (int64_t t = 0; t < tasks; ++t) {
    thread_local std::vector<float> buffer;
    const int64_t b = t / a.H, h = t % a.H, g = h / rep;
    if (static_cast<int64_t>(buffer.size()) < a.SK + a.D + a.DV) buffer.resize(a.SK + a.D + a.DV);
    float* s = buffer.data();
    float* qf = s + a.SK;
    float* acc = qf + a.D;
    const char* qrow = a.q + (b * a.qs[0] + h * a.qs[1]) * elem;
    const char* kbase = a.k + (b * a.ks[0] + g * a.ks[1]) * elem;
    const char* vbase = a.v + (b * a.vs[0] + g * a.vs[1]) * elem;
    if (a.half) {
      const uint16_t* qh = reinterpret_cast<const uint16_t*>(qrow);
      for (int64_t d = 0; d < a.D; ++d) qf[d] = HalfToF32(qh[d]);
      Scores(qf, reinterpret_cast<const uint16_t*>(kbase), a.ks[2], a.SK, a.D, s);
    } else {
      Scores(reinterpret_cast<const float*>(qrow), reinterpret_cast<const float*>(kbase), a.ks[2],
             a.SK, a.D, s);
    }
    // scale, masks, the softmax in float32
    const int64_t mrow = (a.mask_dims[0] == 1 ? 0 : b) * m1 + (a.mask_dims[1] == 1 ? 0 : h) * m2;
    const float ninf = -std::numeric_limits<float>::infinity();
    float top = ninf;
    for (int64_t j = 0; j < a.SK; ++j) {
      float x = s[j] * a.scale;
      if (a.mask != nullptr) {
        int64_t at = mrow + (m3 == 1 ? 0 : j);
        x += a.mask_half ? HalfToF32(reinterpret_cast<const uint16_t*>(a.mask)[at])
                         : reinterpret_cast<const float*>(a.mask)[at];
      }
      if (a.causal && j > 0) x = ninf;  // top-left aligned: query 0 sees key 0
      s[j] = x;
      top = std::max(top, x);
    }
    float sum = 0.f;
    for (int64_t j = 0; j < a.SK; ++j) {
      s[j] = std::exp(s[j] - top);
      sum += s[j];
    }
    const float inv = 1.f / sum;
    for (int64_t d = 0; d < a.DV; ++d) acc[d] = 0.f;
    for (int64_t j = 0; j < a.SK; ++j) {  // the probabilities (in the call's dtype)
      s[j] = a.half ? HalfToF32(F32ToHalf(s[j] * inv)) : s[j] * inv;
    }
    if (a.half) {
      WeightedRows(s, reinterpret_cast<const uint16_t*>(vbase), a.vs[2], a.SK, a.DV, acc);
    } else {
      WeightedRows(s, reinterpret_cast<const float*>(vbase), a.vs[2], a.SK, a.DV, acc);
    }
    char* orow = a.out + (b * a.os[0] + h * a.os[1]) * elem;
    if (a.half) {
      uint16_t* o = reinterpret_cast<uint16_t*>(orow);
      for (int64_t d = 0; d < a.DV; ++d) o[d] = F32ToHalf(acc[d]);
    } else {
      std::memcpy(orow, acc, a.DV * 4);
    }
  }
}

struct Plan {
  dnnl::matmul scores;
  dnnl::softmax_forward softmax;
  dnnl::matmul context;
  // s: the float32 scores; p: the probabilities in the call's dtype (s itself in float32)
  memory::desc q, kt, v, out, s, p, mask, causal_mask, scratch_scores, scratch_softmax,
      scratch_context;
  int mask_arg = 0, causal_arg = 0;
  std::vector<float> causal;  // the additive causal mask [Sq, Sk], when asked for
};

class Attention : public KernelBase {
 public:
  using KernelBase::KernelBase;

  void operator()(ffi::PackedArgs args, ffi::Any* rv) {
    int64_t start = NowNs();
    Call call;
    const AttentionConfig* cfg = Begin(args, &configs_, ParseAttentionConfig, &call);
    if (cfg == nullptr) return Fallback(args, rv);
    const DLTensor* q = call.inputs[0];
    const DLTensor* k = call.inputs[1];
    const DLTensor* v = call.inputs[2];
    const DLTensor* k_new = cfg->cache ? call.inputs[3] : nullptr;
    const DLTensor* v_new = cfg->cache ? call.inputs[4] : nullptr;
    const DLTensor* mask = cfg->mask ? call.inputs[3 + 2 * cfg->cache] : nullptr;
    const DLTensor* out = call.out;
    const auto f32 = memory::data_type::f32;
    memory::data_type dt, mask_dt = f32;
    // bfloat16 on a CPU that does not compute it (not among dtypes_) runs in float32: one query
    // (a decode step) in the direct loop, which widens as it reads; more queries on q, k, v
    // widened per call, where WidensHalf says so; anything else goes to Python
    bool emulated = false;
    if (!CallType(q, &dt)) {
      if (!(IsCpuCompact(q) && DataTypeOf(q->dtype, &dt) && dt == memory::data_type::bf16)) {
        return Fallback(args, rv);
      }
      emulated = true;
    }
    for (const DLTensor* t : {k, v, out}) {
      if (!IsCpuCompactOf(t, dt)) return Fallback(args, rv);
    }
    if (cfg->cache && (!IsCpuCompactOf(k_new, dt) || !IsCpuCompactOf(v_new, dt))) {
      return Fallback(args, rv);
    }
    if (mask != nullptr) {
      mask_dt = IsCpuCompactOf(mask, dt) ? dt : memory::data_type::f32;
      if (!IsCpuCompactOf(mask, mask_dt)) return Fallback(args, rv);
    }
    if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4 || out->ndim != 4) {
      return Fallback(args, rv);
    }
    int64_t dims[4][4], strides[4][4];  // [B, H, S, D] of q, k, v, out
    const DLTensor* ts[4] = {q, k, v, out};
    Layout layouts[4];
    for (int i = 0; i < 4; ++i) {
      bool bshd = i < 3 ? cfg->bshd : cfg->out_bshd;
      layouts[i] = (i == 1 || i == 2) && cfg->cache ? Layout::kTBHD
                   : bshd                           ? Layout::kBSHD
                                                    : Layout::kBHSD;
      HeadDims(ts[i], layouts[i], dims[i], strides[i]);
    }
    // k and v share their heads, q and out theirs, a multiple of k's (grouped-query)
    bool agree = dims[0][0] == dims[1][0] && dims[0][0] == dims[2][0] && dims[0][0] == dims[3][0] &&
                 dims[1][1] > 0 && dims[0][1] % dims[1][1] == 0 && dims[1][1] == dims[2][1] &&
                 dims[0][1] == dims[3][1] && dims[1][2] == dims[2][2] &&
                 dims[0][2] == dims[3][2] && dims[0][3] == dims[1][3] &&
                 dims[2][3] == dims[3][3];
    if (!agree || (mask != nullptr && mask->ndim > 4)) return Fallback(args, rv);
    if (cfg->cache && (dims[1][2] < 1 || NumelOf(k_new) != dims[1][0] * dims[1][1] * dims[1][3] ||
                       NumelOf(v_new) != dims[2][0] * dims[2][1] * dims[2][3])) {
      return Fallback(args, rv);
    }
    int64_t sq = dims[0][2], sk = dims[1][2];
    if (mask != nullptr) {  // broadcastable to [B, H, Sq, Sk]
      const int64_t full[4] = {dims[0][0], dims[0][1], sq, sk};
      for (int i = 0; i < mask->ndim; ++i) {
        int64_t size = mask->shape[mask->ndim - 1 - i];
        if (size != 1 && size != full[3 - i]) return Fallback(args, rv);
      }
    }
    if (cfg->causal && sq > sk) return Fallback(args, rv);  // rows with no key: torch's NaN
    if (sq == 1 && (dt == f32 || dt == memory::data_type::bf16)) {
      if (cfg->cache) WriteSlot(k, k_new, v, v_new);
      DecodeArgs a;
      a.q = reinterpret_cast<const char*>(DataOf(q));
      a.k = reinterpret_cast<const char*>(DataOf(k));
      a.v = reinterpret_cast<const char*>(DataOf(v));
      a.out = reinterpret_cast<char*>(DataOf(out));
      if (mask != nullptr) {
        a.mask = reinterpret_cast<const char*>(DataOf(mask));
        a.mask_half = mask_dt != memory::data_type::f32;
        for (int i = 0; i < mask->ndim; ++i) a.mask_dims[4 - mask->ndim + i] = mask->shape[i];
      }
      std::copy_n(strides[0], 4, a.qs), std::copy_n(strides[1], 4, a.ks);
      std::copy_n(strides[2], 4, a.vs), std::copy_n(strides[3], 4, a.os);
      a.B = dims[0][0], a.H = dims[0][1], a.G = dims[1][1], a.SK = sk;
      a.D = dims[0][3], a.DV = dims[2][3];
      a.scale = cfg->has_scale ? cfg->scale : 1.f / std::sqrt(static_cast<float>(a.D));
      a.half = dt != memory::data_type::f32;
      a.causal = cfg->causal;
      DecodeAttention(a);
      if (cfg->zero_masked && mask != nullptr) {
        ZeroMaskedRows(mask, mask_dt, out, dims[3], cfg->out_bshd);
      }
      return Done(start);
    }

    // widened: the primitives of a float32 call of this shape (on the widened copies)
    const bool widened = emulated;
    if (widened && !WidensHalf(dtypes_, dt, sq)) {
      return Fallback(args, rv);
    }
    const memory::data_type cdt = widened ? f32 : dt, cmask_dt = widened ? f32 : mask_dt;
    IntKey key;
    key.Add(reinterpret_cast<int64_t>(cfg));
    key.Add(static_cast<int64_t>(cdt));
    key.Add(static_cast<int64_t>(cmask_dt));
    for (int i = 0; i < 4; ++i) {
      for (int j = 0; j < 4; ++j) key.Add(dims[i][j]);
    }
    if (mask != nullptr) {
      for (int i = 0; i < mask->ndim; ++i) key.Add(mask->shape[i]);
    }
    std::shared_ptr<Plan> plan = FindOrMake(&plans_, key, [&]() {
      return MakePlan(*cfg, layouts, dims[1][1], q, k, v, out, mask, sq, sk, cdt, cmask_dt);
    });
    if (plan == nullptr) return Fallback(args, rv);  // oneDNN has no primitive for it
    if (cfg->cache) WriteSlot(k, k_new, v, v_new);
    std::shared_ptr<void> owner = plan;
    // this thread's scratch: the scores, the probabilities (in a half call), q, k, v, out and a
    // half mask in float32 (widened), then each primitive's own scratchpad after them
    auto aligned = [](size_t bytes) { return (bytes + 63) & ~size_t(63); };
    bool separate = cdt != f32;
    size_t p_at = aligned(plan->s.get_size());
    size_t offset = separate ? p_at + aligned(plan->p.get_size()) : p_at;
    const DLTensor* wide[5] = {q, k, v, out, mask_dt != f32 ? mask : nullptr};
    size_t wide_at[5] = {};
    for (int i = 0; i < 5 && widened; ++i) {
      if (wide[i] == nullptr) continue;
      wide_at[i] = offset;
      offset += aligned(NumelOf(wide[i]) * 4);
    }
    size_t scratch = std::max({plan->scratch_scores.get_size(), plan->scratch_softmax.get_size(),
                               plan->scratch_context.get_size()});
    char* base = static_cast<char*>(Scratchpad(offset + scratch + 256));
    char* probs = separate ? base + p_at : base;
    // the data each primitive reads and writes: the call's tensors, or their float32 copies
    void* data[5] = {DataOf(q), DataOf(k), DataOf(v), DataOf(out),
                     mask != nullptr ? DataOf(mask) : nullptr};
    for (int i = 0; i < 5 && widened; ++i) {
      if (wide[i] == nullptr) continue;
      data[i] = base + wide_at[i];
      if (i != 3) WidenBf16(DataOf(wide[i]), static_cast<float*>(data[i]), NumelOf(wide[i]));
    }
    ExecArgs first;
    first.Add(DNNL_ARG_SRC, ThreadMemory(owner, 0, plan->q, data[0]));
    first.Add(DNNL_ARG_WEIGHTS, ThreadMemory(owner, 1, plan->kt, data[1]));
    first.Add(DNNL_ARG_DST, ThreadMemory(owner, 2, plan->s, base));
    if (mask != nullptr) first.Add(plan->mask_arg, ThreadMemory(owner, 3, plan->mask, data[4]));
    if (cfg->causal) {
      first.Add(plan->causal_arg,
                ThreadMemory(owner, 4, plan->causal_mask, plan->causal.data()));
    }
    AddScratch(&first, owner, 5, plan->scratch_scores, base + offset);
    Execute(plan->scores, first);
    ExecArgs second;
    second.Add(DNNL_ARG_SRC, ThreadMemory(owner, 6, plan->s, base));
    second.Add(DNNL_ARG_DST, ThreadMemory(owner, 7, plan->p, probs));
    AddScratch(&second, owner, 8, plan->scratch_softmax, base + offset);
    Execute(plan->softmax, second);
    ExecArgs third;
    third.Add(DNNL_ARG_SRC, ThreadMemory(owner, 9, plan->p, probs));
    third.Add(DNNL_ARG_WEIGHTS, ThreadMemory(owner, 10, plan->v, data[2]));
    third.Add(DNNL_ARG_DST, ThreadMemory(owner, 11, plan->out, data[3]));
    AddScratch(&third, owner, 12, plan->scratch_context, base + offset);
    Execute(plan->context, third);
    if (widened) NarrowBf16(static_cast<const float*>(data[3]), DataOf(out), NumelOf(out));
    if (cfg->zero_masked && mask != nullptr) {
      ZeroMaskedRows(mask, mask_dt, out, dims[3], cfg->out_bshd);
    }
    Done(start);
  }

 protected:
  void DropBound() override {}
  void DropPlans() override { plans_.clear(); }
  size_t NumPlans() override { return plans_.size(); }

 private:
  // the new token into the cache's last slot: one [B, Hkv, D] row of k and of v
  static void WriteSlot(const DLTensor* k, const DLTensor* k_new, const DLTensor* v,
                        const DLTensor* v_new) {
    const int64_t elem = k->dtype.bits / 8;
    for (auto [cache, fresh] : {std::pair{k, k_new}, std::pair{v, v_new}}) {
      int64_t row = NumelOf(fresh) * elem;
      std::memcpy(reinterpret_cast<char*>(DataOf(cache)) + (cache->shape[0] - 1) * row,
                  DataOf(fresh), row);
    }
  }

  // rows [b, h, i, :] of ``out`` whose mask row (broadcast to [B, H, Sq, Sk]) is all -inf
  // become 0, as SDPA's safe softmax returns (the softmax of such a row is NaN)
  static void ZeroMaskedRows(const DLTensor* mask, memory::data_type mask_dt,
                             const DLTensor* out, const int64_t* bhsd, bool out_bshd) {
    int64_t md[4] = {1, 1, 1, 1};
    for (int i = 0; i < mask->ndim; ++i) md[4 - mask->ndim + i] = mask->shape[i];
    const int64_t st2 = md[3], st1 = md[2] * st2, st0 = md[1] * st1;
    // the mask widened to float32 (a half call's), the output zeroed bytewise (0 in any dtype)
    std::vector<float> wide;
    const float* m = static_cast<const float*>(DataOf(mask));
    if (mask_dt != memory::data_type::f32) {
      wide.resize(NumelOf(mask));
      WidenToF32(DataOf(mask), mask_dt, NumelOf(mask), wide.data());
      m = wide.data();
    }
    char* o = reinterpret_cast<char*>(DataOf(out));
    const int64_t elem = out->dtype.bits / 8;
    const int64_t B = bhsd[0], H = bhsd[1], S = bhsd[2], D = bhsd[3];
    const float ninf = -std::numeric_limits<float>::infinity();
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t i = 0; i < S; ++i) {
          const float* row = m + (md[0] == 1 ? 0 : b) * st0 + (md[1] == 1 ? 0 : h) * st1 +
                             (md[2] == 1 ? 0 : i) * st2;
          bool all = true;
          for (int64_t j = 0; j < md[3] && all; ++j) all = row[j] == ninf;
          if (!all) continue;
          int64_t at = out_bshd ? ((b * S + i) * H + h) * D : ((b * H + h) * S + i) * D;
          std::memset(o + at * elem, 0, D * elem);
        }
      }
    }
  }

  static void AddScratch(ExecArgs* exec, const std::shared_ptr<void>& owner, int slot,
                         const memory::desc& desc, void* data) {
    if (desc.get_size() > 0) exec->Add(DNNL_ARG_SCRATCHPAD, ThreadMemory(owner, slot, desc, data));
  }

  static std::shared_ptr<Plan> MakePlan(const AttentionConfig& cfg, const Layout* layouts,
                                        int64_t groups, const DLTensor* q, const DLTensor* k,
                                        const DLTensor* v, const DLTensor* out,
                                        const DLTensor* mask, int64_t sq, int64_t sk,
                                        memory::data_type dt, memory::data_type mask_dt) {
    auto plan = std::make_shared<Plan>();
    auto f32 = memory::data_type::f32;
    plan->q = Heads(q, layouts[0], groups, false, dt);
    plan->kt = Heads(k, layouts[1], groups, true, dt);
    plan->v = Heads(v, layouts[2], groups, false, dt);
    plan->out = Heads(out, layouts[3], groups, false, dt);
    memory::dims qdims = plan->q.get_dims();  // [B, G, R, Sq, D]
    int64_t b = qdims[0], r = qdims[2], d = qdims[4];
    bool mha = r == 1;
    plan->q = Squeezed(plan->q, mha);
    plan->kt = Squeezed(plan->kt, mha);
    plan->v = Squeezed(plan->v, mha);
    plan->out = Squeezed(plan->out, mha);
    plan->s = Squeezed(memory::desc({b, groups, r, sq, sk}, f32, memory::format_tag::abcde), mha);
    plan->p = Squeezed(memory::desc({b, groups, r, sq, sk}, dt, memory::format_tag::abcde), mha);
    float scale = cfg.has_scale ? cfg.scale : 1.f / std::sqrt(static_cast<float>(d));
    dnnl::post_ops ops;
    ops.append_eltwise(algorithm::eltwise_linear, scale, 0.f);
    if (mask != nullptr) {
      memory::dims m4(4, 1);
      for (int i = 0; i < mask->ndim; ++i) m4[4 - mask->ndim + i] = mask->shape[i];
      // its heads (1 or H) split as the scores' [G, R]
      memory::dims mdims = m4[1] == 1 ? memory::dims{m4[0], 1, 1, m4[2], m4[3]}
                                      : memory::dims{m4[0], groups, r, m4[2], m4[3]};
      plan->mask = Squeezed(memory::desc(mdims, mask_dt, memory::format_tag::abcde), mha);
      plan->mask_arg = DNNL_ARG_ATTR_MULTIPLE_POST_OP(ops.len()) | DNNL_ARG_SRC_1;
      ops.append_binary(algorithm::binary_add, plan->mask);
    }
    if (cfg.causal) {  // top-left aligned: query i sees keys 0..i
      plan->causal.assign(sq * sk, 0.f);
      for (int64_t i = 0; i < sq; ++i) {
        for (int64_t j = i + 1; j < sk; ++j) {
          plan->causal[i * sk + j] = -std::numeric_limits<float>::infinity();
        }
      }
      plan->causal_mask =
          Squeezed(memory::desc({1, 1, 1, sq, sk}, f32, memory::format_tag::abcde), mha);
      plan->causal_arg = DNNL_ARG_ATTR_MULTIPLE_POST_OP(ops.len()) | DNNL_ARG_SRC_1;
      ops.append_binary(algorithm::binary_add, plan->causal_mask);
    }
    dnnl::primitive_attr attr;
    attr.set_post_ops(ops);
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    auto spd = dnnl::matmul::primitive_desc(Engine(), plan->q, plan->kt, plan->s, attr);
    plan->scores = dnnl::matmul(spd);
    plan->scratch_scores = spd.scratchpad_desc();
    dnnl::primitive_attr plain;
    plain.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    auto smpd = dnnl::softmax_forward::primitive_desc(
        Engine(), dnnl::prop_kind::forward_inference, algorithm::softmax_accurate, plan->s,
        plan->p, mha ? 3 : 4, plain);
    plan->softmax = dnnl::softmax_forward(smpd);
    plan->scratch_softmax = smpd.scratchpad_desc();
    auto cpd = dnnl::matmul::primitive_desc(Engine(), plan->p, plan->v, plan->out, plain);
    plan->context = dnnl::matmul(cpd);
    plan->scratch_context = cpd.scratchpad_desc();
    return plan;
  }

  ConfigCache<AttentionConfig> configs_;
  std::unordered_map<IntKey, std::shared_ptr<Plan>, IntKeyHash> plans_;
};

// ``attention_create_detached(fallback, dtypes)``: a kernel as ``attention_create`` makes it, for
// a CPU computing ``dtypes`` natively, but not the process's instance (no stats, clear or
// forget reach it): the tests run either CPU's answer through it on any host
ffi::Function CreateDetached(ffi::Function fallback, ffi::String dtypes) {
  auto kernel = std::make_shared<Attention>(std::move(fallback), std::string(dtypes));
  return ffi::Function::FromPacked(
      [kernel](ffi::PackedArgs args, ffi::Any* rv) { (*kernel)(args, rv); });
}

}  // namespace
}  // namespace plus_native

TVM_FFI_DLL_EXPORT_TYPED_FUNC(attention_create_detached, plus_native::CreateDetached);
PLUS_NATIVE_EXPORT_KERNEL(attention, Attention);
PLUS_NATIVE_EXPORT_PARSER(attention, ParseAttentionConfig);
