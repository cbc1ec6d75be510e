// Winograd F(2x2, 3x3) convolution for the native conv2d kernel (Lavin and Gray, "Fast
// Algorithms for Convolutional Neural Networks", CVPR 2016).
//
// A 3x3, stride 1, undilated, ungrouped convolution computes each 2x2 output tile from a 4x4
// input tile with 16 multiplications per (input, output) channel pair instead of 36:
//
//   Y = A^T [ (G g G^T) . (B^T d B) ] A,   summed over input channels,
//
// which turns the convolution into 16 independent GEMMs, [tiles x C] x [C x O], one per position
// of the 4x4 transformed tile (run as one batched oneDNN matmul on weights transformed and
// packed once), between an input transform and an output transform that both stream the
// activations once. Channels last (NHWC) keeps every transform a loop over contiguous channels.
// The tiles are processed in chunks: on small layers each chunk's steps spread over the OpenMP
// team (transformed input and products in the last-level cache); on large thin ones each thread
// runs whole chunks alone, its transformed input and products in its L2 (see the constants).
//
// The output transform also applies the epilogue (bias, with a BatchNorm already folded into
// weights and bias; act; residual add; post_act) for the activations this file computes
// itself: none, ReLU and ReLU6, NaN kept as in torch. It also checks every convolution value:
// an infinity or a NaN met on the way makes Run return false (the transforms subtract
// infinities, so the result can differ from the direct convolution's), and the kernel then
// has the call computed another way.
//
// Where it runs (Suits) and how it is chunked are decided by measurement: this project's 2-core
// Zen 4 machine, one process alternating oneDNN's direct convolution and this one on the same
// layer (NHWC, bias, ReLU, median of 15 rounds, caches shared with the other layer as in a
// model; 2026-11-27):
//
//   layer (C->O @ HxW)   direct ms   Winograd ms
//   128->128 @112         16.0        13.9      1.16x   (chunks per thread)
//   128->128 @56           3.96        3.61     1.10x   (chunks per thread)
//   128->128 @28           0.97        0.79     1.22x
//   256->256 @56          15.8        11.1      1.43x   (chunks per thread)
//   256->256 @28           3.88        2.66     1.46x
//   256->256 @14           0.92        0.60     1.54x
//   512->512 @28          15.5         9.54     1.63x
//   512->512 @14           3.73        2.28     1.64x
//
// and where it does not run: 64 channels lose at every size tried (64->64 @56 0.51-0.72x, @224
// 0.49-0.76x: the transforms cost in proportion to C + O, the GEMMs to C x O, and oneDNN's GEMMs
// are slow at K, N = 64), and so do layers of few tiles (512->512 @7, 16 tiles: 0.91x; the
// transformed weights, 16/9 the size of the direct ones, are read for little work). Chunks per
// thread instead of the team's (below) took 128->128 @112 from 0.85x to 1.16x and 256->256 @56
// from 1.25x to 1.43x, and lost on the small layers (256->256 @14 1.41x against 1.54x). Max abs
// error 3e-6 of outputs up to 0.9.
#ifndef PLUS_TVM_NATIVE_WINOGRAD_H_
#define PLUS_TVM_NATIVE_WINOGRAD_H_

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "onednn_common.h"

namespace plus_native {

class Winograd {
 public:
  enum class Act { kNone, kRelu, kRelu6 };
  static constexpr int64_t kMinChannels = 128;  // input and output channels (table above)
  static constexpr int64_t kMinTiles = 40;       // 2x2 output tiles, all images together
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

  // Whether a convolution takes this path: 3x3, stride 1, dilation 1, groups 1, at least
  // kMinChannels input and output channels and kMinTiles output tiles, activations this file
  // computes (set in ``act`` and ``post_act``). ``out`` is [n, oh, ow, o].
  static bool Suits(int64_t c, const int64_t* out, int64_t kh, int64_t kw, const int64_t* stride,
                    const int64_t* dilation, int64_t groups, const std::string& act_name,
                    const std::string& post_act_name, Act* act, Act* post_act) {
    int64_t tiles = out[0] * ((out[1] + 1) / 2) * ((out[2] + 1) / 2);
    return kh == 3 && kw == 3 && stride[0] == 1 && stride[1] == 1 && dilation[0] == 1 &&
           dilation[1] == 1 && groups == 1 && c >= kMinChannels && out[3] >= kMinChannels &&
           tiles >= kMinTiles && ActOf(act_name, act) && ActOf(post_act_name, post_act);
  }

  // x [n, h, w, c] -> y [n, oh, ow, o]; ``pad`` top, left, bottom, right.
  Winograd(int64_t n, int64_t h, int64_t w, int64_t c, int64_t o, const int64_t* pad, Act act,
           Act post_act)
      : h_(h), w_(w), c_(c), o_(o), act_(act), post_act_(post_act) {
    pad_t_ = pad[0];
    pad_l_ = pad[1];
    oh_ = h + pad[0] + pad[2] - 2;
    ow_ = w + pad[1] + pad[3] - 2;
    th_ = (oh_ + 1) / 2;
    tw_ = (ow_ + 1) / 2;
    tiles_ = n * th_ * tw_;
    no_bias_.assign(o, 0.f);
    size_t whole = size_t(16) * tiles_ * (c + o) * sizeof(float);  // V and M of every tile
    per_thread_ = c + o <= kThreadMaxChannels && whole > kTeamBytes;
    int64_t most =
        per_thread_
            ? std::clamp<int64_t>(kThreadBytes / (16 * (c + o) * sizeof(float)), 8, 256)
            : std::max<int64_t>(16, kChunkBytes / (16 * std::max(c, o) * sizeof(float)));
    int64_t chunks = (tiles_ + most - 1) / most;
    chunk_ = (tiles_ + chunks - 1) / chunks;
    auto f32 = memory::data_type::f32;
    // V [tile][16][c] and M [tile][16][o] in memory, read as 16 matrices by the matmul
    v_desc_ = memory::desc({16, chunk_, c}, f32, memory::dims{c, 16 * c, 1});
    m_desc_ = memory::desc({16, chunk_, o}, f32, memory::dims{o, 16 * o, 1});
    u_plain_ = memory::desc({16, c, o}, f32, memory::format_tag::abc);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    auto pd = dnnl::matmul::primitive_desc(
        Engine(), v_desc_, memory::desc({16, c, o}, f32, memory::format_tag::any), m_desc_, attr);
    u_desc_ = pd.weights_desc();
    scratchpad_ = pd.scratchpad_desc();
    matmul_ = dnnl::matmul(pd);
  }

  const memory::desc& weights_desc() const { return u_desc_; }

  // The weights ``g`` (OIHW, [o, c, 3, 3]) transformed (G g G^T) and packed for the matmul.
  memory Pack(const float* g) const {
    std::vector<float> u(16 * c_ * o_);
    for (int64_t oc = 0; oc < o_; ++oc) {
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
    size_t v_size = size_t(16) * chunk_ * c_, m_size = size_t(16) * chunk_ * o_;
    if (v.size() < v_size) v.resize(v_size);
    if (m.size() < m_size) m.resize(m_size);
    if (zero.size() < static_cast<size_t>(c_)) zero.assign(c_, 0.f);
    int64_t t0 = k * chunk_, count = std::min(chunk_, tiles_ - t0);
    float* vd = v.data();
    const float* zd = zero.data();
    if (team) {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < count; ++i) InputTile(x, t0 + i, zd, vd + i * 16 * c_);
    } else {
      for (int64_t i = 0; i < count; ++i) InputTile(x, t0 + i, zd, vd + i * 16 * c_);
    }
    if (count < chunk_) {  // the rows past the last tile: zeros, never read back
      std::memset(vd + count * 16 * c_, 0, (chunk_ - count) * 16 * c_ * sizeof(float));
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
        finite &= OutputTileAt(md + i * 16 * o_, t0 + i, bias, residual, y);
      }
    } else {
      for (int64_t i = 0; i < count; ++i) {
        finite &= OutputTileAt(md + i * 16 * o_, t0 + i, bias, residual, y);
      }
    }
    return finite ? 0 : kNonFinite;
  }

  static float Apply(Act act, float v) {
    if (act == Act::kNone || v != v) return v;  // NaN stays NaN
    v = v > 0.f ? v : 0.f;
    return act == Act::kRelu6 && v > 6.f ? 6.f : v;
  }

  // v[xi][c] = (B^T d B)[xi] for the 4x4 input tile d of tile t (``zero``: c zeros, the
  // padding).
  void InputTile(const float* x, int64_t t, const float* zero, float* v) const {
    int64_t img = t / (th_ * tw_), ty = t / tw_ % th_, tx = t % tw_;
    const float* d[4][4];
    for (int i = 0; i < 4; ++i) {
      for (int j = 0; j < 4; ++j) {
        int64_t r = 2 * ty - pad_t_ + i, q = 2 * tx - pad_l_ + j;
        bool inside = r >= 0 && r < h_ && q >= 0 && q < w_;
        d[i][j] = inside ? x + ((img * h_ + r) * w_ + q) * c_ : zero;
      }
    }
    TransformTile(d, c_, v);
  }

  __attribute__((target_clones("avx512f", "avx2", "default"))) static void TransformTile(
      const float* const (*d)[4], int64_t c, float* out) {
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
    float* out[4];
    const float* res[4];
    for (int p = 0; p < 4; ++p) {
      int64_t r = 2 * ty + p / 2, q = 2 * tx + p % 2;
      int64_t at = ((img * oh_ + r) * ow_ + q) * o_;
      bool inside = r < oh_ && q < ow_;
      out[p] = inside ? y + at : spill.data();
      res[p] = residual == nullptr ? nullptr : inside ? residual + at : residual;
    }
    return OutputTile(m, o_, bias, res, act_, post_act_, out);
  }

  // One tile's 2x2 outputs, channel by channel: A^T M A written out (no multiplication by
  // A's zeros, so an output depends only on the inputs of its own 3x3 window: a NaN spreads
  // exactly as in the direct convolution), then the epilogue. False when a convolution value
  // (with the bias, before the activation) was infinite or NaN.
  __attribute__((target_clones("avx512f", "avx2", "default"))) static bool OutputTile(
      const float* m, int64_t o, const float* bias, const float* const* res, Act act,
      Act post_act, float* const* out) {
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
        y0 = Apply(act, y0);
        y1 = Apply(act, y1);
        if (res[0] != nullptr) {
          y0 += res[2 * i][ch];
          y1 += res[2 * i + 1][ch];
        }
        out[2 * i][ch] = Apply(post_act, y0);
        out[2 * i + 1][ch] = Apply(post_act, y1);
      }
    }
    return probe == probe;
  }

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
