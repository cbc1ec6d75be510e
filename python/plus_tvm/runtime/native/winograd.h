// Winograd convolution for the native conv2d kernel, F(2x2, 3x3) and F(4x4, 3x3) (Lavin and
// Gray, "Fast Algorithms for Convolutional Neural Networks", CVPR 2016).
//
// A 3x3, stride 1, undilated, ungrouped convolution computes each m x m output tile from an
// a x a input tile (a = m + 2) with a^2 multiplications per (input, output) channel pair instead
// of 9 m^2 (16 instead of 36 for m = 2, 36 instead of 144 for m = 4):
//
//   Y = A^T [ (G g G^T) . (B^T d B) ] A,   summed over input channels,
//
// which turns the convolution into a^2 independent GEMMs, [tiles x C] x [C x O], one per position
// of the transformed tile (run as one batched oneDNN matmul on weights transformed and packed
// once), between an input transform and an output transform that both stream the activations
// once. Channels last (NHWC) keeps every transform a loop over contiguous channels. The tiles
// are processed in chunks: on small layers each chunk's steps spread over the OpenMP team
// (transformed input and products in the last-level cache); on large thin ones each thread runs
// whole chunks alone, its transformed input and products in its L2 (see the constants).
//
// The output transform also applies the epilogue (bias, with a BatchNorm already folded into
// weights and bias; act; residual add; post_act) for the activations this file computes
// itself: none, ReLU and ReLU6, NaN kept as in torch (a trailing SiLU is the caller's pass). It
// also checks every convolution value: an infinity or a NaN met on the way makes Run return
// false (the transforms subtract infinities and spread a value over the tile), and the kernel
// then has the call computed another way.
//
// Where each runs (Suits) and how it is chunked are decided by measurement (a CPU where
// thinner layers run faster directly may say so in runtime/conv2d.py's WINOGRAD_MIN_CHANNELS,
// and the compiler then asks for winograd=0 there). This project's Zen 5 machine, one thread,
// one process per algorithm (every size forced), best of two processes' best of 9 (ms;
// 2026-11-28, bias + ReLU, NHWC):
//
//   layer (C->O @ HxW)   direct    F(2x2)          F(4x4)
//   32->32 @112            1.33      2.14 0.62x      0.98 1.35x   (direct: too thin)
//   64->64 @112            4.88      5.25 0.93x      2.82 1.73x   (-> F(4x4))
//   64->64 @56             1.07      1.22 0.88x      0.52 2.07x   (-> F(4x4))
//   64->64 @28             0.269     0.315 0.85x     0.154 1.75x  (-> F(4x4))
//   64->64 @14             0.070     0.088 0.79x     0.060 1.16x  (-> F(4x4))
//   64->64 @7              0.020     0.034 0.59x     0.029 0.69x  (direct)
//   128->128 @56           4.20      3.60 1.17x      1.70 2.48x   (-> F(4x4))
//   128->128 @28           0.98      0.82 1.19x      0.42 2.34x   (-> F(4x4))
//   128->128 @14           0.241     0.221 1.09x     0.146 1.65x  (-> F(4x4))
//   128->128 @7            0.059     0.079 0.75x     0.058 1.01x  (direct)
//   256->256 @28           3.98      2.63 1.52x      1.53 2.61x   (-> F(4x4))
//   256->256 @14           0.91      0.65 1.40x      0.43 2.10x   (-> F(4x4))
//   256->256 @7            0.214     0.212 1.01x     0.149 1.43x  (direct: too few tiles)
//   512->512 @14           3.61      2.40 1.51x      2.42 1.49x   (-> F(4x4))
//   512->512 @7            0.80      0.78 1.02x      1.55 0.52x   (direct)
//
// (Measured before on Zen 4, with transforms that did not vectorize, F(4x4) lost to F(2x2)
// on 14x14 outputs and to the direct convolution on thin layers: its output transform was
// more than half of its time, its input transform scalar.) F(4x4) does a quarter of the direct multiplications; its
// transformed weights are 4x the direct ones, so with few tiles (7x7 outputs: 4) its GEMMs
// stream more weight bytes than they compute with. F(2x2) is left for outputs of fewer 4x4
// tiles but enough 2x2 ones. Max abs error on outputs up to 7: direct 1e-5, F(2x2) 4e-6,
// F(4x4) 3e-5 to 1e-4 (its transforms multiply by up to 8 and divide by 24). Chunks per thread
// instead of the team's took F(2x2) 128->128 @112 from 0.85x to 1.16x and 256->256 @56 from
// 1.25x to 1.43x (Zen 4), and lost on the small layers.
#ifndef PLUS_TVM_NATIVE_WINOGRAD_H_
#define PLUS_TVM_NATIVE_WINOGRAD_H_

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "onednn_common.h"

namespace plus_native {

class Winograd {
 public:
  enum class Act { kNone, kRelu, kRelu6 };
  // Where each tile size runs (the tables above): the fewer of the input and output channels,
  // and the number of output tiles of that size, all images together.
  static constexpr int64_t kMinChannels = 128;    // F(2x2)
  static constexpr int64_t kMinTiles = 40;
  static constexpr int64_t kMinChannels4 = 64;    // F(4x4)
  static constexpr int64_t kMinTiles4 = 16;
  // Chunks: with V and M of the whole layer within kTeamBytes, or more than kThreadMaxChannels
  // channels in and out together, chunks of about kChunkBytes each (V or M) run one after the
  // other, each step on the whole OpenMP team; otherwise each thread takes whole chunks of
  // about kThreadBytes (V and M together, in its L2) and runs them alone.
  static constexpr size_t kChunkBytes = size_t(4) << 20;
  static constexpr size_t kTeamBytes = size_t(8) << 20;
  static constexpr int64_t kThreadMaxChannels = 512;
  static constexpr size_t kThreadBytes = size_t(512) << 10;

  // The activation ``name`` as this file computes it; false for one it does not.
  static bool ActOf(const std::string& name, Act* act) {
    if (name == "none") *act = Act::kNone;
    else if (name == "relu") *act = Act::kRelu;
    else if (name == "relu6") *act = Act::kRelu6;
    else return false;
    return true;
  }

  // Whether a convolution takes this path, and with which output tile (``m``, 2 or 4): 3x3,
  // stride 1, dilation 1, groups 1, enough channels and tiles (the constants above),
  // activations this file computes (set in ``act`` and ``post_act``). ``out`` is [n, oh, ow, o].
  static bool Suits(int64_t c, const int64_t* out, int64_t kh, int64_t kw, const int64_t* stride,
                    const int64_t* dilation, int64_t groups, const std::string& act_name,
                    const std::string& post_act_name, Act* act, Act* post_act, int* m) {
    if (kh != 3 || kw != 3 || stride[0] != 1 || stride[1] != 1 || dilation[0] != 1 ||
        dilation[1] != 1 || groups != 1 || !ActOf(act_name, act) ||
        !ActOf(post_act_name, post_act)) {
      return false;
    }
    auto tiles = [&](int64_t size) {
      return out[0] * ((out[1] + size - 1) / size) * ((out[2] + size - 1) / size);
    };
    int64_t narrow = std::min(c, out[3]);
    if (narrow >= kMinChannels4 && tiles(4) >= kMinTiles4) {
      *m = 4;
    } else if (narrow >= kMinChannels && tiles(2) >= kMinTiles) {
      *m = 2;
    } else {
      return false;
    }
    return true;
  }

  int tile() const { return m_; }

  // x [n, h, w, c] -> y [n, oh, ow, o]; ``pad`` top, left, bottom, right; ``m``: output tiles
  // m x m, F(2x2, 3x3) or F(4x4, 3x3).
  Winograd(int64_t n, int64_t h, int64_t w, int64_t c, int64_t o, const int64_t* pad, Act act,
           Act post_act, int m)
      : m_(m), a_(m + 2), p_(a_ * a_), h_(h), w_(w), c_(c), o_(o), act_(act),
        post_act_(post_act) {
    pad_t_ = pad[0];
    pad_l_ = pad[1];
    oh_ = h + pad[0] + pad[2] - 2;
    ow_ = w + pad[1] + pad[3] - 2;
    th_ = (oh_ + m - 1) / m;
    tw_ = (ow_ + m - 1) / m;
    tiles_ = n * th_ * tw_;
    no_bias_.assign(o, 0.f);
    size_t whole = size_t(p_) * tiles_ * (c + o) * sizeof(float);  // V and M of every tile
    per_thread_ = c + o <= kThreadMaxChannels && whole > kTeamBytes;
    int64_t most =
        per_thread_
            ? std::clamp<int64_t>(kThreadBytes / (p_ * (c + o) * sizeof(float)), 8, 256)
            : std::max<int64_t>(16, kChunkBytes / (p_ * std::max(c, o) * sizeof(float)));
    int64_t chunks = (tiles_ + most - 1) / most;
    chunk_ = (tiles_ + chunks - 1) / chunks;
    auto f32 = memory::data_type::f32;
    // V [tile][p][c] and M [tile][p][o] in memory (p = (m + 2)^2 tile positions), read as p
    // matrices by the matmul
    v_desc_ = memory::desc({p_, chunk_, c}, f32, memory::dims{c, p_ * c, 1});
    m_desc_ = memory::desc({p_, chunk_, o}, f32, memory::dims{o, p_ * o, 1});
    u_plain_ = memory::desc({p_, c, o}, f32, memory::format_tag::abc);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    auto pd = dnnl::matmul::primitive_desc(
        Engine(), v_desc_, memory::desc({p_, c, o}, f32, memory::format_tag::any), m_desc_, attr);
    u_desc_ = pd.weights_desc();
    scratchpad_ = pd.scratchpad_desc();
    matmul_ = dnnl::matmul(pd);
  }

  const memory::desc& weights_desc() const { return u_desc_; }

  // The weights ``g`` (OIHW, [o, c, 3, 3]) transformed (G g G^T) and packed for the matmul.
  memory Pack(const float* g) const {
    std::vector<float> u(p_ * c_ * o_);
    for (int64_t oc = 0; m_ == 4 && oc < o_; ++oc) {
      for (int64_t ic = 0; ic < c_; ++ic) PackTile4(g + (oc * c_ + ic) * 9, u.data(), ic, oc);
    }
    for (int64_t oc = 0; m_ == 2 && oc < o_; ++oc) {
      for (int64_t ic = 0; ic < c_; ++ic) {
        const float* k = g + (oc * c_ + ic) * 9;
        float t[4][3];
        for (int j = 0; j < 3; ++j) {
          t[0][j] = k[j];
          t[1][j] = 0.5f * (k[j] + k[3 + j] + k[6 + j]);
          t[2][j] = 0.5f * (k[j] - k[3 + j] + k[6 + j]);
          t[3][j] = k[6 + j];
        }
        for (int i = 0; i < 4; ++i) {
          float r[4] = {t[i][0], 0.5f * (t[i][0] + t[i][1] + t[i][2]),
                        0.5f * (t[i][0] - t[i][1] + t[i][2]), t[i][2]};
          for (int j = 0; j < 4; ++j) u[((i * 4 + j) * c_ + ic) * o_ + oc] = r[j];
        }
      }
    }
    memory plain(u_plain_, Engine(), u.data());
    memory packed(u_desc_, Engine());
    dnnl::stream& strm = Stream();
    dnnl::reorder(plain, packed).execute(strm, plain, packed);
    strm.wait();
    return packed;
  }

  // y = post_act(act(conv(x, g) + bias) + residual); ``bias`` and ``residual`` may be null.
  // False when a convolution value (before the activation) came out infinite or NaN: then y is
  // not the direct convolution's result (the transforms subtract infinities, and an
  // activation can map what they made to a number) and the caller must compute it another way.
  bool Run(const float* x, const memory& u, const float* bias, const float* residual,
           float* y) const {
    if (bias == nullptr) bias = no_bias_.data();
    int64_t chunks = (tiles_ + chunk_ - 1) / chunk_;
    int status = 0;  // kNonFinite / kFailed bits
    if (!per_thread_) {
      for (int64_t k = 0; k < chunks; ++k) status |= RunChunk(x, u, k, bias, residual, y, true);
    } else {
#pragma omp parallel for schedule(dynamic) reduction(| : status)
      for (int64_t k = 0; k < chunks; ++k) {
        try {  // nothing may leave an OpenMP region
          status |= RunChunk(x, u, k, bias, residual, y, false);
        } catch (const dnnl::error&) {
          status |= kFailed;
        }
      }
    }
    if (status & kFailed) {
      throw dnnl::error(dnnl_runtime_error, "oneDNN could not run the Winograd matmul");
    }
    return (status & kNonFinite) == 0;
  }

 private:
  static constexpr int kNonFinite = 1, kFailed = 2;

  // Chunk ``k``: transform its tiles, multiply, transform back. ``team``: each step spreads
  // over the OpenMP team; otherwise all on this thread (the matmul then runs on it alone).
  // kNonFinite and kFailed bits.
  int RunChunk(const float* x, const memory& u, int64_t k, const float* bias,
                const float* residual, float* y, bool team) const {
    thread_local std::vector<float> v, m, zero;
    size_t v_size = size_t(p_) * chunk_ * c_, m_size = size_t(p_) * chunk_ * o_;
    if (v.size() < v_size) v.resize(v_size);
    if (m.size() < m_size) m.resize(m_size);
    if (zero.size() < static_cast<size_t>(c_)) zero.assign(c_, 0.f);
    int64_t t0 = k * chunk_, count = std::min(chunk_, tiles_ - t0);
    float* vd = v.data();
    const float* zd = zero.data();
    if (team) {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < count; ++i) InputTile(x, t0 + i, zd, vd + i * p_ * c_);
    } else {
      for (int64_t i = 0; i < count; ++i) InputTile(x, t0 + i, zd, vd + i * p_ * c_);
    }
    if (count < chunk_) {  // the rows past the last tile: zeros, never read back
      std::memset(vd + count * p_ * c_, 0, (chunk_ - count) * p_ * c_ * sizeof(float));
    }
    memory vm(v_desc_, Engine(), vd), mm(m_desc_, Engine(), m.data());
    ExecArgs exec;
    exec.Add(DNNL_ARG_SRC, vm);
    exec.Add(DNNL_ARG_WEIGHTS, u);
    exec.Add(DNNL_ARG_DST, mm);
    memory scratch;
    if (scratchpad_.get_size() > 0) {
      scratch = memory(scratchpad_, Engine(), Scratchpad(scratchpad_.get_size()));
      exec.Add(DNNL_ARG_SCRATCHPAD, scratch);
    }
    dnnl::stream& strm = Stream();
    if (dnnl_primitive_execute(matmul_.get(), strm.get(), exec.n, exec.args) != dnnl_success) {
      return kFailed;
    }
    strm.wait();
    const float* md = m.data();
    int finite = 1;
    if (team) {
#pragma omp parallel for schedule(static) reduction(& : finite)
      for (int64_t i = 0; i < count; ++i) {
        finite &= OutputTileAt(md + i * p_ * o_, t0 + i, bias, residual, y);
      }
    } else {
      for (int64_t i = 0; i < count; ++i) {
        finite &= OutputTileAt(md + i * p_ * o_, t0 + i, bias, residual, y);
      }
    }
    return finite ? 0 : kNonFinite;
  }

  // An activation as the bounds it clamps to (none: -inf, inf; ReLU: 0, inf; ReLU6: 0, 6).
  struct Clamp {
    float lo, hi;
    explicit Clamp(Act act)
        : lo(act == Act::kNone ? -std::numeric_limits<float>::infinity() : 0.f),
          hi(act == Act::kRelu6 ? 6.f : std::numeric_limits<float>::infinity()) {}
    // Both tests are false for a NaN, so it stays NaN (as in torch); selects, not branches:
    // the loops over channels vectorize without a mask built per element.
    float operator()(float v) const {
      v = v < lo ? lo : v;
      return v > hi ? hi : v;
    }
  };

  // v[xi][c] = (B^T d B)[xi] for the 4x4 input tile d of tile t (``zero``: c zeros, the
  // padding).
  void InputTile(const float* x, int64_t t, const float* zero, float* v) const {
    int64_t img = t / (th_ * tw_), ty = t / tw_ % th_, tx = t % tw_;
    const float* d[6][6];
    for (int i = 0; i < a_; ++i) {
      for (int j = 0; j < a_; ++j) {
        int64_t r = m_ * ty - pad_t_ + i, q = m_ * tx - pad_l_ + j;
        bool inside = r >= 0 && r < h_ && q >= 0 && q < w_;
        d[i][j] = inside ? x + ((img * h_ + r) * w_ + q) * c_ : zero;
      }
    }
    if (m_ == 4) return TransformTile4(d, c_, v);
    TransformTile(d, c_, v);
  }

  // F(2x2): the 4x4 input tile is d's top-left corner.
  __attribute__((target_clones("avx512f", "avx2", "default"))) static void TransformTile(
      const float* const (*d)[6], int64_t c, float* out) {
    // one restrict pointer per row read and per matrix written: the loop then vectorizes
    // (the rows of the padding are the same zeros, only read)
    const float* __restrict__ d00 = d[0][0];
    const float* __restrict__ d01 = d[0][1];
    const float* __restrict__ d02 = d[0][2];
    const float* __restrict__ d03 = d[0][3];
    const float* __restrict__ d10 = d[1][0];
    const float* __restrict__ d11 = d[1][1];
    const float* __restrict__ d12 = d[1][2];
    const float* __restrict__ d13 = d[1][3];
    const float* __restrict__ d20 = d[2][0];
    const float* __restrict__ d21 = d[2][1];
    const float* __restrict__ d22 = d[2][2];
    const float* __restrict__ d23 = d[2][3];
    const float* __restrict__ d30 = d[3][0];
    const float* __restrict__ d31 = d[3][1];
    const float* __restrict__ d32 = d[3][2];
    const float* __restrict__ d33 = d[3][3];
    float* __restrict__ o[16];
    for (int k = 0; k < 16; ++k) o[k] = out + k * c;
    float* __restrict__ o0 = o[0];
    float* __restrict__ o1 = o[1];
    float* __restrict__ o2 = o[2];
    float* __restrict__ o3 = o[3];
    float* __restrict__ o4 = o[4];
    float* __restrict__ o5 = o[5];
    float* __restrict__ o6 = o[6];
    float* __restrict__ o7 = o[7];
    float* __restrict__ o8 = o[8];
    float* __restrict__ o9 = o[9];
    float* __restrict__ o10 = o[10];
    float* __restrict__ o11 = o[11];
    float* __restrict__ o12 = o[12];
    float* __restrict__ o13 = o[13];
    float* __restrict__ o14 = o[14];
    float* __restrict__ o15 = o[15];
    for (int64_t ch = 0; ch < c; ++ch) {
      // B^T d: rows 0 - 2, 1 + 2, 2 - 1, 1 - 3, for each of the 4 columns
      float e00 = d00[ch] - d20[ch], e01 = d01[ch] - d21[ch], e02 = d02[ch] - d22[ch],
            e03 = d03[ch] - d23[ch];
      float e10 = d10[ch] + d20[ch], e11 = d11[ch] + d21[ch], e12 = d12[ch] + d22[ch],
            e13 = d13[ch] + d23[ch];
      float e20 = d20[ch] - d10[ch], e21 = d21[ch] - d11[ch], e22 = d22[ch] - d12[ch],
            e23 = d23[ch] - d13[ch];
      float e30 = d10[ch] - d30[ch], e31 = d11[ch] - d31[ch], e32 = d12[ch] - d32[ch],
            e33 = d13[ch] - d33[ch];
      // (B^T d) B: columns 0 - 2, 1 + 2, 2 - 1, 1 - 3 of each row
      o0[ch] = e00 - e02, o1[ch] = e01 + e02, o2[ch] = e02 - e01, o3[ch] = e01 - e03;
      o4[ch] = e10 - e12, o5[ch] = e11 + e12, o6[ch] = e12 - e11, o7[ch] = e11 - e13;
      o8[ch] = e20 - e22, o9[ch] = e21 + e22, o10[ch] = e22 - e21, o11[ch] = e21 - e23;
      o12[ch] = e30 - e32, o13[ch] = e31 + e32, o14[ch] = e32 - e31, o15[ch] = e31 - e33;
    }
  }

  // y = epilogue(A^T M A) for tile t from its products ``m`` (the parts of an edge tile past
  // the output go to this thread's scratch row). False when a convolution value was not finite.
  bool OutputTileAt(const float* m, int64_t t, const float* bias, const float* residual,
                    float* y) const {
    thread_local std::vector<float> spill;
    if (spill.size() < static_cast<size_t>(o_)) spill.resize(o_);
    int64_t img = t / (th_ * tw_), ty = t / tw_ % th_, tx = t % tw_;
    float* out[16];
    const float* res[16];
    for (int p = 0; p < m_ * m_; ++p) {
      int64_t r = m_ * ty + p / m_, q = m_ * tx + p % m_;
      int64_t at = ((img * oh_ + r) * ow_ + q) * o_;
      bool inside = r < oh_ && q < ow_;
      out[p] = inside ? y + at : spill.data();
      res[p] = residual == nullptr ? nullptr : inside ? residual + at : residual;
    }
    if (m_ == 4) return OutputTile4(m, o_, bias, res, act_, post_act_, out);
    return OutputTile(m, o_, bias, res, act_, post_act_, out);
  }

  // One tile's 2x2 outputs, channel by channel: A^T M A written out (no multiplication by
  // A's zeros, so an output depends only on the inputs of its own 3x3 window: a NaN spreads
  // exactly as in the direct convolution), then the epilogue. False when a convolution value
  // (with the bias, before the activation) was infinite or NaN.
  __attribute__((target_clones("avx512f", "avx2", "default"))) static bool OutputTile(
      const float* m, int64_t o, const float* bias, const float* const* res, Act act,
      Act post_act, float* const* out) {
    const Clamp first(act), last(post_act);
    float probe = 0.f;  // x * 0 is 0 for every number, NaN for an infinity or a NaN
    for (int64_t ch = 0; ch < o; ++ch) {
      float s[2][4];
      for (int b = 0; b < 4; ++b) {
        s[0][b] = m[(0 + b) * o + ch] + m[(4 + b) * o + ch] + m[(8 + b) * o + ch];
        s[1][b] = m[(4 + b) * o + ch] - m[(8 + b) * o + ch] - m[(12 + b) * o + ch];
      }
      float add = bias != nullptr ? bias[ch] : 0.f;
      for (int i = 0; i < 2; ++i) {
        float y0 = s[i][0] + s[i][1] + s[i][2];
        float y1 = s[i][1] - s[i][2] - s[i][3];
        if (bias != nullptr) {
          y0 += add;
          y1 += add;
        }
        probe += (y0 + y1) * 0.f;
        y0 = first(y0);
        y1 = first(y1);
        if (res[0] != nullptr) {
          y0 += res[2 * i][ch];
          y1 += res[2 * i + 1][ch];
        }
        out[2 * i][ch] = last(y0);
        out[2 * i + 1][ch] = last(y1);
      }
    }
    return probe == probe;
  }

  // F(4x4, 3x3), points 0, +-1, +-2 and infinity: U = G g G^T, V = B^T d B, Y = A^T M A with
  //   G = [1/4 0 0; -1/6 -1/6 -1/6; -1/6 1/6 -1/6; 1/24 1/12 1/6; 1/24 -1/12 1/6; 0 0 1],
  //   B^T = [4 0 -5 0 1 0; 0 -4 -4 1 1 0; 0 4 -4 -1 1 0; 0 -2 -1 2 1 0; 0 2 -1 -2 1 0;
  //          0 4 0 -5 0 1],
  //   A^T = [1 1 1 1 1 0; 0 1 -1 2 -2 0; 0 1 1 4 4 0; 0 1 -1 8 -8 1].
  // The weight transform in double, written to u[position][ic][oc].
  void PackTile4(const float* k, float* u, int64_t ic, int64_t oc) const {
    static const double g[6][3] = {{0.25, 0, 0},
                                   {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                                   {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                                   {1.0 / 24, 1.0 / 12, 1.0 / 6},
                                   {1.0 / 24, -1.0 / 12, 1.0 / 6},
                                   {0, 0, 1}};
    double t[6][3];
    for (int i = 0; i < 6; ++i) {
      for (int j = 0; j < 3; ++j) {
        t[i][j] = g[i][0] * k[j] + g[i][1] * k[3 + j] + g[i][2] * k[6 + j];
      }
    }
    for (int i = 0; i < 6; ++i) {
      for (int j = 0; j < 6; ++j) {
        double v = t[i][0] * g[j][0] + t[i][1] * g[j][1] + t[i][2] * g[j][2];
        u[((i * 6 + j) * c_ + ic) * o_ + oc] = static_cast<float>(v);
      }
    }
  }

  static constexpr int kLanes = 16;  // channels per block of the F(4x4) transforms

  // 16 floats as one value (GCC's vector extension: one AVX-512 register, two AVX2 ones, or
  // four SSE ones, as the clone is compiled for); loads and stores unaligned.
  typedef float Vec16 __attribute__((vector_size(64)));
  static Vec16 Load16(const float* p) {
    Vec16 v;
    std::memcpy(&v, p, sizeof(v));
    return v;
  }
  static void Store16(float* p, Vec16 v) { std::memcpy(p, &v, sizeof(v)); }

  // One row of B^T x B's 1-D step: (B^T x) for the six values x0..x5 (scalars or vectors).
  template <typename T>
  static void BT6(T x0, T x1, T x2, T x3, T x4, T x5, T* e) {
    e[0] = 4.f * x0 - 5.f * x2 + x4;
    e[1] = x3 + x4 - 4.f * (x1 + x2);
    e[2] = x4 - x3 + 4.f * (x1 - x2);
    e[3] = x4 - x2 + 2.f * (x3 - x1);
    e[4] = x4 - x2 + 2.f * (x1 - x3);
    e[5] = 4.f * x1 - 5.f * x3 + x5;
  }

  // v[p][c] = (B^T d B)[p] for a 6x6 input tile, 16 channels at a time (a vector each; the
  // last block of a channel count not a multiple of 16 channel by channel).
  __attribute__((target_clones("avx512f", "avx2", "default"))) static void TransformTile4(
      const float* const (*d)[6], int64_t c, float* out) {
    int64_t c0 = 0;
    for (; c0 + kLanes <= c; c0 += kLanes) {
      Vec16 e[6][6];  // e[i][j] = (B^T d)[i][j]
      for (int j = 0; j < 6; ++j) {
        Vec16 col[6];
        BT6(Load16(d[0][j] + c0), Load16(d[1][j] + c0), Load16(d[2][j] + c0),
            Load16(d[3][j] + c0), Load16(d[4][j] + c0), Load16(d[5][j] + c0), col);
        for (int i = 0; i < 6; ++i) e[i][j] = col[i];
      }
      for (int i = 0; i < 6; ++i) {
        Vec16 row[6];
        BT6(e[i][0], e[i][1], e[i][2], e[i][3], e[i][4], e[i][5], row);
        for (int j = 0; j < 6; ++j) Store16(out + (i * 6 + j) * c + c0, row[j]);
      }
    }
    for (int64_t ch = c0; ch < c; ++ch) {
      float e[6][6];
      for (int j = 0; j < 6; ++j) {
        float col[6];
        BT6(d[0][j][ch], d[1][j][ch], d[2][j][ch], d[3][j][ch], d[4][j][ch], d[5][j][ch], col);
        for (int i = 0; i < 6; ++i) e[i][j] = col[i];
      }
      for (int i = 0; i < 6; ++i) {
        float row[6];
        BT6(e[i][0], e[i][1], e[i][2], e[i][3], e[i][4], e[i][5], row);
        for (int j = 0; j < 6; ++j) out[(i * 6 + j) * c + ch] = row[j];
      }
    }
  }

  // One tile's 4x4 outputs from its 36 products, 16 channels at a time: A^T M A, then the
  // epilogue as OutputTile. (Here an output depends on the whole 6x6 input tile: a NaN or an
  // infinity reaches the probe, and the call is computed another way.)
  __attribute__((target_clones("avx512f", "avx2", "default"))) static bool OutputTile4(
      const float* m, int64_t o, const float* bias, const float* const* res, Act act,
      Act post_act, float* const* out) {
    const Clamp first(act), last(post_act);
    float probe[kLanes] = {};  // x * 0: 0 for every number, NaN for an infinity or a NaN
    for (int64_t c0 = 0; c0 < o; c0 += kLanes) {
      const int n = static_cast<int>(std::min<int64_t>(kLanes, o - c0));
      float s[4][6][kLanes];  // A^T M
      for (int b = 0; b < 6; ++b) {
        const float* __restrict__ r0 = m + (0 * 6 + b) * o + c0;
        const float* __restrict__ r1 = m + (1 * 6 + b) * o + c0;
        const float* __restrict__ r2 = m + (2 * 6 + b) * o + c0;
        const float* __restrict__ r3 = m + (3 * 6 + b) * o + c0;
        const float* __restrict__ r4 = m + (4 * 6 + b) * o + c0;
        const float* __restrict__ r5 = m + (5 * 6 + b) * o + c0;
        for (int l = 0; l < n; ++l) {
          float x0 = r0[l], x1 = r1[l], x2 = r2[l], x3 = r3[l], x4 = r4[l], x5 = r5[l];
          s[0][b][l] = x0 + x1 + x2 + x3 + x4;
          s[1][b][l] = x1 - x2 + 2.f * (x3 - x4);
          s[2][b][l] = x1 + x2 + 4.f * (x3 + x4);
          s[3][b][l] = x1 - x2 + 8.f * (x3 - x4) + x5;
        }
      }
      for (int i = 0; i < 4; ++i) {
        float y[4][kLanes];
        for (int l = 0; l < n; ++l) {
          float x0 = s[i][0][l], x1 = s[i][1][l], x2 = s[i][2][l], x3 = s[i][3][l],
                x4 = s[i][4][l], x5 = s[i][5][l];
          float add = bias != nullptr ? bias[c0 + l] : 0.f;
          y[0][l] = x0 + x1 + x2 + x3 + x4 + add;
          y[1][l] = x1 - x2 + 2.f * (x3 - x4) + add;
          y[2][l] = x1 + x2 + 4.f * (x3 + x4) + add;
          y[3][l] = x1 - x2 + 8.f * (x3 - x4) + x5 + add;
          probe[l] += (y[0][l] + y[1][l] + y[2][l] + y[3][l]) * 0.f;
        }
        for (int j = 0; j < 4; ++j) {
          float* __restrict__ dst = out[i * 4 + j] + c0;
          if (res[0] != nullptr) {
            const float* __restrict__ rp = res[i * 4 + j] + c0;
            for (int l = 0; l < n; ++l) dst[l] = last(first(y[j][l]) + rp[l]);
          } else {
            for (int l = 0; l < n; ++l) dst[l] = last(first(y[j][l]));
          }
        }
      }
    }
    float sum = 0.f;
    for (int l = 0; l < kLanes; ++l) sum += probe[l];
    return sum == sum;
  }

  int m_, a_, p_;  // output tile m x m, input tile a x a (a = m + 2), p = a * a positions
  int64_t h_, w_, c_, o_, oh_, ow_, th_, tw_, tiles_, chunk_;
  int64_t pad_t_ = 0, pad_l_ = 0;
  bool per_thread_ = false;  // each thread runs whole chunks (thin layers), else the team
  std::vector<float> no_bias_;  // o zeros, the bias of a call without one
  Act act_, post_act_;
  memory::desc v_desc_, m_desc_, u_plain_, u_desc_, scratchpad_;
  dnnl::matmul matmul_;
};

}  // namespace plus_native

#endif  // PLUS_TVM_NATIVE_WINOGRAD_H_
