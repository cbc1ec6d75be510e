// plus.conv2d on oneDNN, called by TVM's VM without crossing into Python.
//
// The fast path of the ``plus.conv2d`` library kernel (../conv2d.py holds the contract and the
// reference implementation): CPU tensors of one dtype the Python kernel names as native
// (``native_dtypes()``) in the channels-last layout (``layout=nhwc``: x
// ``[N, H, W, C]``, out ``[N, OH, OW, O]``; the weight as the model holds it, OIHW), with the
// bias, a folded inference BatchNorm, the activation, the residual add and an activation after
// it as oneDNN post-ops, and asymmetric padding done by the convolution itself. The result is
// written straight into the VM's output buffer. Anything else (another layout, dtype or device, a
// config key this file does not know, a shape it cannot check) goes to the Python implementation
// the kernel was created with, which raises the errors. With ``nan=1`` (the default) a ReLU /
// ReLU6 runs as oneDNN's own (max / min) under the NaN guard (nan_guard.h), and again in the
// NaN-keeping form only when a NaN reached it. A SiLU that is the last operation runs as a pass
// over the output after the convolution (silu_pass.h: oneDNN's swish post-op is slower).
//
// In bfloat16 / float16 the convolution accumulates in float32 and every epilogue computes in
// float32 before the one rounding into ``out``: the BatchNorm is not folded into the half
// weight (that rounds it once more than torch, which rounds the convolution's result and runs
// the BatchNorm in float32) but applied as two per-channel float32 post-ops, ``* s`` and
// ``+ (bias - mean) * s + beta``, ``s = gamma / sqrt(var + eps)``, computed once per set of
// parameter tensors. Winograd and the SiLU pass are float32 only (their code is).
//
// Caches: parsed configs by config string; primitives by (config, input shape, weight shape);
// packed (and BatchNorm-folded) weights by (primitive, data pointers of the weight tensors),
// holding their source tensors (see PackCache). One mutex guards them; primitives execute
// outside it, each thread on its own stream.

#include "onednn_common.h"
#include "nan_guard.h"
#include "silu_pass.h"
#include "winograd.h"

#include <cmath>

namespace plus_native {
namespace {

struct ConvConfig {
  int64_t stride[2] = {1, 1};
  int64_t padding[4] = {0, 0, 0, 0};  // top, left, bottom, right
  int64_t dilation[2] = {1, 1};
  int64_t groups = 1;
  bool bias = false;
  bool residual = false;
  bool prepack = true;
  bool bn = false;
  float bn_eps = 1e-5f;
  bool nhwc = false;
  bool nan = true;  // NaN propagates through the activations (as in torch)
  bool winograd = true;  // a 3x3 layer may run as Winograd F(2x2 or 4x4, 3x3) (winograd.h)
  std::string act = "none";
  std::string post_act = "none";
  bool known = false;   // every item understood (a key and value of the kernel's spec)
  bool native = false;  // every key understood and the combination supported here

  int inputs() const { return 2 + bias + 4 * bn + residual; }
};

ConvConfig ParseConvConfig(const std::string& text) {  // NOLINT: a parser, used by ConfigCache
  ConvConfig cfg;
  bool ok = ForEachItem(text, [&](const std::string& key, const std::string& value) {
    if (key == "stride") return ParseInts(value, cfg.stride, 2);
    if (key == "padding") return ParseInts(value, cfg.padding, 4);
    if (key == "dilation") return ParseInts(value, cfg.dilation, 2);
    if (key == "groups") return ParseInts(value, &cfg.groups, 1);
    if (key == "bias") return ParseFlag(value, &cfg.bias);
    if (key == "residual") return ParseFlag(value, &cfg.residual);
    if (key == "prepack") return ParseFlag(value, &cfg.prepack);
    if (key == "bn") return ParseFlag(value, &cfg.bn);
    if (key == "bn_eps") return ParseFloat(value, &cfg.bn_eps);
    if (key == "nan") return ParseFlag(value, &cfg.nan);
    if (key == "winograd") return ParseFlag(value, &cfg.winograd);
    if (key == "layout") {
      cfg.nhwc = value == "nhwc";
      return value == "nhwc" || value == "nchw";
    }
    if (key == "act") {
      cfg.act = value;
      return IsActivation(value);
    }
    if (key == "post_act") {
      cfg.post_act = value;
      return IsActivation(value);
    }
    return false;  // a key of a newer contract: the Python side knows it
  });
  cfg.known = ok;
  cfg.native = ok && cfg.nhwc && cfg.prepack && cfg.groups >= 1;
  return cfg;
}

// One primitive of a plan and what its post-ops take.
struct Variant {
  dnnl::convolution_forward primitive;
  memory::desc scratchpad;
  int residual_arg = 0;
  std::vector<int> prelu;  // post-ops whose weight is the zero slope
};

struct Plan {
  memory::desc src, weights, user_weights, bias, dst;
  memory::data_type dt = memory::data_type::f32;  // of every tensor of the call
  // a half call's BatchNorm as post-ops: the binary post-ops' arguments, the desc of both
  bool bn_post_ops = false;
  int bn_scale_arg = 0, bn_shift_arg = 0;
  memory::desc bn_channels;
  Variant exact;          // the activations as the config asks
  Variant fast;           // with oneDNN's own ReLU / clip, run under the NaN guard
  bool guarded = false;   // fast exists, takes the same packed weights and passed Verified
  bool silu_pass = false;  // the trailing SiLU is not a post-op: SiluInPlace over the output
  std::shared_ptr<Winograd> winograd;  // set: the layer runs as Winograd instead
};

// What one call needs beyond its tensors: the primitive and the packed weights.
using Bound = BoundPlan<Plan>;

class Conv2d : public KernelBase {
 public:
  using KernelBase::KernelBase;

  void operator()(ffi::PackedArgs args, ffi::Any* rv) {
    int64_t start = NowNs();
    Call call;
    const ConvConfig* cfg = Begin(args, &configs_, ParseConvConfig, &call);
    if (cfg == nullptr) return Fallback(args, rv);
    const DLTensor* const* t = call.inputs;
    const DLTensor* x = t[0];
    const DLTensor* w = t[1];
    const DLTensor* y = call.out;
    memory::data_type dt;
    if (!CallType(x, &dt) || !IsCpuCompactOf(y, dt) || y->ndim != 4 || x->ndim != 4 ||
        w->ndim != 4) {
      return Fallback(args, rv);
    }
    for (int i = 1; i < call.num_inputs; ++i) {
      if (!IsCpuCompactOf(t[i], dt)) return Fallback(args, rv);
    }
    int k = 2;
    const DLTensor* bias = cfg->bias ? t[k++] : nullptr;
    const DLTensor* stats[4] = {nullptr, nullptr, nullptr, nullptr};
    for (int s = 0; cfg->bn && s < 4; ++s) stats[s] = t[k++];
    const DLTensor* residual = cfg->residual ? t[k++] : nullptr;
    if (!ShapesAgree(*cfg, x, w, bias, stats, residual, y)) return Fallback(args, rv);

    IntKey key;
    key.Add(reinterpret_cast<int64_t>(cfg));
    key.Add(static_cast<int64_t>(dt));
    for (int i = 0; i < 4; ++i) key.Add(x->shape[i]);
    for (int i = 0; i < 4; ++i) key.Add(w->shape[i]);
    for (const DLTensor* weight : {w, bias, stats[0], stats[1], stats[2], stats[3]}) {
      key.Add(weight != nullptr ? reinterpret_cast<int64_t>(DataOf(weight)) : 0);
    }
    Bound bound = FindOrMake(&bound_, key, [&]() {
      Bound made;
      made.plan = GetPlan(*cfg, x, w, dt);
      made.packed = GetPacked(args, made.plan, *cfg, w, bias, stats);
      return made;
    });
    if (!bound) return Fallback(args, rv);  // oneDNN has no primitive for it
    const Plan& plan = *bound.plan;
    if (plan.winograd != nullptr) {
      const float* b = bound.packed->parts.size() > 1
                           ? static_cast<const float*>(bound.packed->parts[1].get_data_handle())
                           : (bias != nullptr ? DataOf(bias) : nullptr);
      int64_t begin = NowNs();
      bool finite = plan.winograd->Run(DataOf(x), bound.packed->parts[0], b,
                                       residual != nullptr ? DataOf(residual) : nullptr,
                                       DataOf(y));
      counters_.execute_ns += NowNs() - begin;
      counters_.winograd += 1;
      counters_.winograd4 += plan.winograd->tile() == 4;
      // an infinity or a NaN met on the way: the Python kernel (torch's direct convolution)
      // computes the call again, torch's result whatever the values
      if (!finite) {
        Done(start);
        return Fallback(args, rv);
      }
      return Finish(plan, y, start);
    }
    std::shared_ptr<void> owner = bound.plan;
    auto run = [&](const Variant& variant, int scratch_slot) {
      ExecArgs exec;
      exec.Add(DNNL_ARG_SRC, ThreadMemory(owner, 0, plan.src, DataOf(x)));
      exec.Add(DNNL_ARG_WEIGHTS, bound.packed->parts[0]);
      exec.Add(DNNL_ARG_DST, ThreadMemory(owner, 1, plan.dst, DataOf(y)));
      if (plan.bn_post_ops) {  // a half call's BatchNorm (its bias inside the shift)
        exec.Add(plan.bn_scale_arg, bound.packed->parts[1]);
        exec.Add(plan.bn_shift_arg, bound.packed->parts[2]);
      } else if (bound.packed->parts.size() > 1) {
        exec.Add(DNNL_ARG_BIAS, bound.packed->parts[1]);  // folded with the BatchNorm
      } else if (bias != nullptr) {
        exec.Add(DNNL_ARG_BIAS, ThreadMemory(owner, 2, plan.bias, DataOf(bias)));
      }
      if (residual != nullptr) {
        exec.Add(variant.residual_arg, ThreadMemory(owner, 3, plan.dst, DataOf(residual)));
      }
      exec.AddScratchpad(owner, variant.scratchpad, scratch_slot);
      exec.AddZeroSlopes(variant.prelu);
      Execute(variant.primitive, exec);
    };
    if (plan.guarded && NanGuardAvailable()) {
      counters_.guarded += 1;
      run(plan.fast, -2);
      if (TakeInvalidFlags() == 0) return Finish(plan, y, start);
      counters_.nan_reruns += 1;  // a NaN reached the activation: the NaN-keeping form
    }
    run(plan.exact, -1);
    Finish(plan, y, start);
  }

 protected:
  void DropBound() override { bound_.clear(); }
  void DropPlans() override { plans_.clear(); }
  size_t NumPlans() override { return plans_.size(); }

  // The call's last step: the SiLU pass where the plan has one.
  void Finish(const Plan& plan, const DLTensor* y, int64_t start) {
    if (plan.silu_pass) {
      int64_t begin = NowNs();
      SiluInPlace(DataOf(y), NumelOf(y));
      counters_.execute_ns += NowNs() - begin;
      counters_.silu_passes += 1;
    }
    Done(start);
  }

 private:
  static bool ShapesAgree(const ConvConfig& cfg, const DLTensor* x, const DLTensor* w,
                          const DLTensor* bias, const DLTensor* const* stats,
                          const DLTensor* residual, const DLTensor* y) {
    int64_t oc = w->shape[0];
    if (x->shape[3] != w->shape[1] * cfg.groups || oc % cfg.groups != 0) return false;
    if (bias != nullptr && NumelOf(bias) != oc) return false;
    for (int s = 0; s < 4; ++s) {
      if (stats[s] != nullptr && NumelOf(stats[s]) != oc) return false;
    }
    int64_t sizes[2];
    for (int d = 0; d < 2; ++d) {
      int64_t span = x->shape[1 + d] + cfg.padding[d] + cfg.padding[d + 2] -
                     cfg.dilation[d] * (w->shape[2 + d] - 1) - 1;
      if (span < 0 || cfg.stride[d] < 1 || cfg.dilation[d] < 1) return false;
      sizes[d] = span / cfg.stride[d] + 1;
    }
    if (y->shape[0] != x->shape[0] || y->shape[1] != sizes[0] || y->shape[2] != sizes[1] ||
        y->shape[3] != oc) {
      return false;
    }
    if (residual == nullptr) return true;
    if (residual->ndim != 4) return false;
    for (int i = 0; i < 4; ++i) {
      if (residual->shape[i] != y->shape[i]) return false;
    }
    return true;
  }

  std::shared_ptr<Plan> GetPlan(const ConvConfig& cfg, const DLTensor* x, const DLTensor* w,
                                memory::data_type dt) {
    IntKey key;
    key.Add(reinterpret_cast<int64_t>(&cfg));
    key.Add(static_cast<int64_t>(dt));
    for (int i = 0; i < 4; ++i) key.Add(x->shape[i]);
    for (int i = 0; i < 4; ++i) key.Add(w->shape[i]);
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second;

    using tag = memory::format_tag;
    auto f32 = memory::data_type::f32;
    int64_t n = x->shape[0], h = x->shape[1], wd = x->shape[2], c = x->shape[3];
    int64_t oc = w->shape[0], kh = w->shape[2], kw = w->shape[3], g = cfg.groups;
    int64_t oh = (h + cfg.padding[0] + cfg.padding[2] - cfg.dilation[0] * (kh - 1) - 1) /
                     cfg.stride[0] + 1;
    int64_t ow = (wd + cfg.padding[1] + cfg.padding[3] - cfg.dilation[1] * (kw - 1) - 1) /
                     cfg.stride[1] + 1;
    auto plan = std::make_shared<Plan>();
    const bool f32_call = dt == f32;
    plan->dt = dt;
    plan->bn_post_ops = cfg.bn && !f32_call;
    plan->src = memory::desc({n, c, h, wd}, dt, tag::nhwc);
    plan->dst = memory::desc({n, oc, oh, ow}, dt, tag::nhwc);
    memory::dims wdims =
        g > 1 ? memory::dims{g, oc / g, c / g, kh, kw} : memory::dims{oc, c, kh, kw};
    plan->user_weights = memory::desc(wdims, dt, g > 1 ? tag::goihw : tag::oihw);
    // the bias as the call gives it; a folded float32 call's BatchNorm bias is float32 too
    plan->bias = memory::desc({oc}, f32_call ? f32 : dt, tag::a);
    plan->bn_channels = memory::desc({1, oc, 1, 1}, f32, tag::abcd);
    // a SiLU with nothing after it: the pass after the primitive instead of the post-op (or of
    // the Winograd epilogue)
    std::string first_op = cfg.act, last_op = cfg.post_act;  // the post-ops' activations
    if (SiluPassAvailable() && f32_call) {
      std::string& last = last_op != "none" || cfg.residual ? last_op : first_op;
      if (last == "silu") {
        last = "none";
        plan->silu_pass = true;
      }
    }
    Winograd::Act act, post_act;
    int tile = 0;
    const int64_t out_dims[4] = {n, oh, ow, oc};
    if (cfg.winograd && f32_call && Winograd::Suits(c, out_dims, kh, kw, cfg.stride, cfg.dilation, g,
                                        first_op, last_op, &act, &post_act, &tile)) {
      plan->winograd =
          std::make_shared<Winograd>(n, h, wd, c, oc, cfg.padding, act, post_act, tile);
      plan->weights = plan->winograd->weights_desc();
      plans_.emplace(key, plan);
      return plan;
    }
    memory::desc weights_any(wdims, dt, tag::any);
    memory::dims strides{cfg.stride[0], cfg.stride[1]};
    memory::dims dilates{cfg.dilation[0] - 1, cfg.dilation[1] - 1};
    memory::dims pad_l{cfg.padding[0], cfg.padding[1]}, pad_r{cfg.padding[2], cfg.padding[3]};
    auto make = [&](bool nan, Variant* variant) {
      dnnl::post_ops ops;
      if (plan->bn_post_ops) {  // (the same indices in both variants: nothing comes before)
        plan->bn_scale_arg = DNNL_ARG_ATTR_MULTIPLE_POST_OP(ops.len()) | DNNL_ARG_SRC_1;
        ops.append_binary(algorithm::binary_mul, plan->bn_channels);
        plan->bn_shift_arg = DNNL_ARG_ATTR_MULTIPLE_POST_OP(ops.len()) | DNNL_ARG_SRC_1;
        ops.append_binary(algorithm::binary_add, plan->bn_channels);
      }
      AppendActivation(&ops, first_op, nan, &variant->prelu);
      if (cfg.residual) {
        variant->residual_arg = DNNL_ARG_ATTR_MULTIPLE_POST_OP(ops.len()) | DNNL_ARG_SRC_1;
        ops.append_binary(algorithm::binary_add, plan->dst);
      }
      AppendActivation(&ops, last_op, nan, &variant->prelu);
      dnnl::primitive_attr attr;
      attr.set_post_ops(ops);
      // the caller's scratchpad, one per thread: the library's own is shared between threads
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      auto kind = dnnl::prop_kind::forward_inference;
      auto direct = algorithm::convolution_direct;
      bool with_bias = (cfg.bias || cfg.bn) && !plan->bn_post_ops;
      auto pd = with_bias
                    ? dnnl::convolution_forward::primitive_desc(
                          Engine(), kind, direct, plan->src, weights_any, plan->bias, plan->dst,
                          strides, dilates, pad_l, pad_r, attr)
                    : dnnl::convolution_forward::primitive_desc(Engine(), kind, direct, plan->src,
                                                                weights_any, plan->dst, strides,
                                                                dilates, pad_l, pad_r, attr);
      variant->scratchpad = pd.scratchpad_desc();
      variant->primitive = dnnl::convolution_forward(pd);
      return pd.weights_desc();
    };
    plan->weights = make(cfg.nan, &plan->exact);
    if (cfg.nan && (NeedsNanGuard(first_op) || NeedsNanGuard(last_op)) &&
        NanGuardAvailable() && make(false, &plan->fast) == plan->weights) {
      std::unordered_map<int, memory::desc> args{
          {DNNL_ARG_SRC, plan->src}, {DNNL_ARG_WEIGHTS, plan->weights}, {DNNL_ARG_DST, plan->dst}};
      if ((cfg.bias || cfg.bn) && !plan->bn_post_ops) args.emplace(DNNL_ARG_BIAS, plan->bias);
      if (plan->bn_post_ops) {
        args.emplace(plan->bn_scale_arg, plan->bn_channels);
        args.emplace(plan->bn_shift_arg, plan->bn_channels);
      }
      if (cfg.residual) args.emplace(plan->fast.residual_arg, plan->dst);
      if (plan->fast.scratchpad.get_size() > 0) {
        args.emplace(DNNL_ARG_SCRATCHPAD, plan->fast.scratchpad);
      }
      plan->guarded = Verified(plan->fast.primitive, args);
    }
    plans_.emplace(key, plan);
    return plan;
  }

  std::shared_ptr<Packed> GetPacked(ffi::PackedArgs args, const std::shared_ptr<Plan>& plan,
                                    const ConvConfig& cfg, const DLTensor* w,
                                    const DLTensor* bias, const DLTensor* const* stats) {
    std::vector<uintptr_t> pointers{reinterpret_cast<uintptr_t>(DataOf(w))};
    if (cfg.bn) {
      if (bias != nullptr) pointers.push_back(reinterpret_cast<uintptr_t>(DataOf(bias)));
      for (int s = 0; s < 4; ++s) pointers.push_back(reinterpret_cast<uintptr_t>(DataOf(stats[s])));
    }
    std::ostringstream key;
    key << plan.get() << '|' << cfg.bn_eps;
    for (uintptr_t p : pointers) key << ',' << p;
    auto hit = packed_.Find(key.str());
    if (hit != nullptr) return hit;

    auto entry = std::make_shared<Packed>();
    entry->pointers = pointers;
    HoldSources(args, entry.get());
    if (plan->bn_post_ops) return PackHalf(entry, key.str(), plan, cfg, w, bias, stats);
    const float* source = DataOf(w);
    std::vector<float> folded;
    dnnl::engine& eng = Engine();
    memory folded_bias;
    if (cfg.bn) {  // W * s and (bias - mean) * s + beta, s = gamma / sqrt(var + eps)
      int64_t oc = w->shape[0], per_out = NumelOf(w) / oc;
      const float *gamma = DataOf(stats[0]), *beta = DataOf(stats[1]);
      const float *mean = DataOf(stats[2]), *var = DataOf(stats[3]);
      folded.resize(NumelOf(w));
      folded_bias = memory(plan->bias, eng);
      float* b = static_cast<float*>(folded_bias.get_data_handle());
      for (int64_t o = 0; o < oc; ++o) {
        float scale = gamma[o] / std::sqrt(var[o] + cfg.bn_eps);
        for (int64_t i = 0; i < per_out; ++i) {
          folded[o * per_out + i] = source[o * per_out + i] * scale;
        }
        float b0 = bias != nullptr ? DataOf(bias)[o] : 0.f;
        b[o] = (b0 - mean[o]) * scale + beta[o];
      }
      source = folded.data();
      entry->bytes += oc * sizeof(float);
    }
    if (plan->winograd != nullptr) {
      entry->parts.push_back(plan->winograd->Pack(source));
    } else {
      memory user(plan->user_weights, eng, const_cast<float*>(source));
      memory packed(plan->weights, eng);
      dnnl::stream& strm = Stream();
      dnnl::reorder(user, packed).execute(strm, user, packed);
      strm.wait();
      entry->parts.push_back(packed);
    }
    if (cfg.bn) entry->parts.push_back(folded_bias);
    entry->bytes += plan->weights.get_size();
    InsertPacked(key.str(), entry);
    return entry;
  }

  // A half call's packed weight (reordered as it is) and its BatchNorm as float32 per-channel
  // scale and shift (the bias inside the shift): parts {weight, scale, shift}.
  std::shared_ptr<Packed> PackHalf(std::shared_ptr<Packed> entry, const std::string& key,
                                   const std::shared_ptr<Plan>& plan, const ConvConfig& cfg,
                                   const DLTensor* w, const DLTensor* bias,
                                   const DLTensor* const* stats) {
    dnnl::engine& eng = Engine();
    int64_t oc = w->shape[0];
    std::vector<float> p[4], b0(oc, 0.f);
    for (int s = 0; s < 4; ++s) {
      p[s].resize(oc);
      WidenToF32(DataOf(stats[s]), plan->dt, oc, p[s].data());
    }
    if (bias != nullptr) WidenToF32(DataOf(bias), plan->dt, oc, b0.data());
    memory scale(plan->bn_channels, eng), shift(plan->bn_channels, eng);
    float* sc = static_cast<float*>(scale.get_data_handle());
    float* sh = static_cast<float*>(shift.get_data_handle());
    for (int64_t o = 0; o < oc; ++o) {
      sc[o] = p[0][o] / std::sqrt(p[3][o] + cfg.bn_eps);
      sh[o] = (b0[o] - p[2][o]) * sc[o] + p[1][o];
    }
    memory user(plan->user_weights, eng, DataOf(w));
    memory packed(plan->weights, eng);
    dnnl::stream& strm = Stream();
    dnnl::reorder(user, packed).execute(strm, user, packed);
    strm.wait();
    entry->parts = {packed, scale, shift};
    entry->bytes = plan->weights.get_size() + 2 * oc * sizeof(float);
    InsertPacked(key, entry);
    return entry;
  }

  ConfigCache<ConvConfig> configs_;
  std::unordered_map<IntKey, std::shared_ptr<Plan>, IntKeyHash> plans_;
  std::unordered_map<IntKey, Bound, IntKeyHash> bound_;
};

}  // namespace
}  // namespace plus_native

PLUS_NATIVE_EXPORT_KERNEL(conv2d, Conv2d);
PLUS_NATIVE_EXPORT_PARSER(conv2d, ParseConvConfig);
