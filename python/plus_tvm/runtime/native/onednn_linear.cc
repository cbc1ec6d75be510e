// plus.linear and plus.linear_layernorm on oneDNN's matmul, called by TVM's VM without Python.
//
// The fast paths of the two GEMM kernels (../linear.py and ../linear_layernorm.py hold the
// contracts and the reference implementations): CPU tensors all of one element type among
// those the Python kernel names as native (``native_dtypes()``: float32, and bfloat16 where the
// CPU computes it natively), one weight (``parts=1``) in either layout (``w=nk`` as nn.Linear
// holds it, or ``w=kn``), reordered once into oneDNN's blocked layout; the bias, the activation
// and the residual add as post-ops; the result written straight into the VM's output.
// plus.linear_layernorm then normalizes the sum with oneDNN's layer normalization (into
// ``out``; the sum itself stays in the second output when the call asks for it). Every other
// call goes to the Python kernel the native one was created with.
//
// In bfloat16 / float16 the matmul accumulates in float32, adds the bias and runs the post-ops
// in float32 and rounds once into the output (what torch's half ``addmm`` and the Python
// kernel's oneDNN call do); the layer normalization reads the rounded sum and computes in
// float32 (gamma and beta widened per call: oneDNN 3.2 takes them in float32 only), rounding
// once, as torch's half ``layer_norm``.
//
// Primitives are made per (config, M, K, N): M, the rows, changes with a symbolic batch or
// sequence length. The weight is packed once per (weight, layout) for the first M seen, and
// primitives for other M take that packed layout when oneDNN can (else they pack their own).

#include "gemv.h"
#include "linear_config.h"
#include "onednn_common.h"

namespace plus_native {
namespace {

LinearConfig ParseLinear(const std::string& text) { return ParseLinearConfig(text, false); }
LinearConfig ParseLinearNorm(const std::string& text) { return ParseLinearConfig(text, true); }

struct Plan {
  dnnl::matmul primitive;
  memory::desc src, weights, user_weights, bias, dst, scratchpad;
  int residual_arg = 0;
  std::vector<int> prelu;
  // plus.linear_layernorm's normalization of the GEMM's result
  dnnl::layer_normalization_forward norm;
  memory::desc norm_stats, norm_scale, norm_scratchpad;
};

using Bound = BoundPlan<Plan>;

template <bool kNorm>
class LinearKernel : public KernelBase {
 public:
  using KernelBase::KernelBase;

  void operator()(ffi::PackedArgs args, ffi::Any* rv) {
    int64_t start = NowNs();
    // a decode step's linears (gemv.cc, parts too): float32 of two to eight rows, bfloat16 of
    // one to eight on a CPU without bfloat16 GEMM instructions; the weight streamed as stored
    if (FloatGemvLinear(args, kNorm) ||
        (HalfGemvWanted(native_bf16_) &&
         (kNorm ? HalfGemvLinearNorm(args) : HalfGemvLinear(args)))) {
      return Done(start);
    }
    Call call;
    const LinearConfig* cfg =
        Begin(args, &configs_, kNorm ? ParseLinearNorm : ParseLinear, &call, /*extra_out_ok=*/kNorm);
    if (cfg == nullptr) return Fallback(args, rv);
    const DLTensor* const* t = call.inputs;
    const DLTensor* x = t[0];
    const DLTensor* w = t[1];
    int k = 2;
    const DLTensor* bias = cfg->bias ? t[k++] : nullptr;
    const DLTensor* residual = cfg->residual ? t[k++] : nullptr;
    const DLTensor* gamma = cfg->gamma ? t[k++] : nullptr;
    const DLTensor* beta = cfg->beta ? t[k++] : nullptr;
    const DLTensor* y = call.out;
    const DLTensor* sum = call.extra_out;
    if ((sum != nullptr) != (kNorm && cfg->sum_out)) return Fallback(args, rv);
    memory::data_type dt;
    if (!CallType(x, &dt)) return Fallback(args, rv);
    for (int i = 1; i < call.num_inputs; ++i) {
      if (!IsCpuCompactOf(t[i], dt)) return Fallback(args, rv);
    }
    if (!IsCpuCompactOf(y, dt) || (sum != nullptr && !IsCpuCompactOf(sum, dt))) {
      return Fallback(args, rv);
    }
    if (w->ndim != 2 || x->ndim < 1 || y->ndim != x->ndim) return Fallback(args, rv);
    int64_t kdim = cfg->kn ? w->shape[0] : w->shape[1];
    int64_t n = cfg->kn ? w->shape[1] : w->shape[0];
    if (x->shape[x->ndim - 1] != kdim || y->shape[y->ndim - 1] != n) return Fallback(args, rv);
    int64_t m = NumelOf(x) / std::max<int64_t>(kdim, 1);
    if (m == 0 || kdim == 0 || NumelOf(y) != m * n) return Fallback(args, rv);
    for (const DLTensor* v : {bias, gamma, beta}) {
      if (v != nullptr && NumelOf(v) != n) return Fallback(args, rv);
    }
    if (residual != nullptr && NumelOf(residual) != m * n) return Fallback(args, rv);
    if (sum != nullptr && NumelOf(sum) != m * n) return Fallback(args, rv);

    IntKey key;
    key.Add(reinterpret_cast<int64_t>(cfg));
    key.Add(m);
    key.Add(kdim);
    key.Add(n);
    key.Add(reinterpret_cast<int64_t>(DataOf(w)));
    key.Add(static_cast<int64_t>(dt));
    Bound bound = FindOrMake(&bound_, key, [&]() {
      Bound made;
      made.plan = GetPlan(*cfg, m, kdim, n, dt);
      made.packed = GetPacked(args, made.plan, *cfg, w, kdim, n, dt);
      return made;
    });
    if (!bound) return Fallback(args, rv);  // oneDNN has no primitive for it
    const Plan& plan = *bound.plan;
    std::shared_ptr<void> owner = bound.plan;
    // the GEMM writes the sum where the call wants it: the second output, or out itself
    void* gemm_out = sum != nullptr ? DataOf(sum) : DataOf(y);
    ExecArgs gemm;
    gemm.Add(DNNL_ARG_SRC, ThreadMemory(owner, 0, plan.src, DataOf(x)));
    gemm.Add(DNNL_ARG_WEIGHTS, bound.packed->parts[0]);
    gemm.Add(DNNL_ARG_DST, ThreadMemory(owner, 1, plan.dst, gemm_out));
    if (bias != nullptr) gemm.Add(DNNL_ARG_BIAS, ThreadMemory(owner, 2, plan.bias, DataOf(bias)));
    if (residual != nullptr) {
      gemm.Add(plan.residual_arg, ThreadMemory(owner, 3, plan.dst, DataOf(residual)));
    }
    gemm.AddScratchpad(owner, plan.scratchpad);
    gemm.AddZeroSlopes(plan.prelu);
    Execute(plan.primitive, gemm);
    if (kNorm) {
      ExecArgs norm;
      norm.Add(DNNL_ARG_SRC, ThreadMemory(owner, 4, plan.dst, gemm_out));
      norm.Add(DNNL_ARG_DST, ThreadMemory(owner, 5, plan.dst, DataOf(y)));
      // oneDNN's scale and shift are float32: a half call's gamma / beta widened here
      thread_local std::vector<float> widened;
      if (dt != memory::data_type::f32) widened.resize(2 * n);
      auto f32_of = [&](const DLTensor* v, int64_t at) -> void* {
        if (dt == memory::data_type::f32) return DataOf(v);
        WidenToF32(DataOf(v), dt, n, widened.data() + at);
        return widened.data() + at;
      };
      if (gamma != nullptr) {
        norm.Add(DNNL_ARG_SCALE, ThreadMemory(owner, 6, plan.norm_scale, f32_of(gamma, 0)));
      }
      if (beta != nullptr) {
        norm.Add(DNNL_ARG_SHIFT, ThreadMemory(owner, 7, plan.norm_scale, f32_of(beta, n)));
      }
      if (plan.norm_scratchpad.get_size() > 0) {
        norm.Add(DNNL_ARG_SCRATCHPAD, ThreadMemory(owner, 8, plan.norm_scratchpad,
                                                   Scratchpad(plan.norm_scratchpad.get_size())));
      }
      Execute(plan.norm, norm);
    }
    Done(start);
  }

 protected:
  void DropBound() override { bound_.clear(); }
  void DropPlans() override { plans_.clear(); }
  size_t NumPlans() override { return plans_.size(); }

 private:
  // ``dt``: the element type of every tensor of the call (the matmul accumulates in float32)
  std::shared_ptr<Plan> GetPlan(const LinearConfig& cfg, int64_t m, int64_t kdim, int64_t n,
                                memory::data_type dt) {
    IntKey key;
    key.Add(reinterpret_cast<int64_t>(&cfg));
    key.Add(m);
    key.Add(kdim);
    key.Add(n);
    key.Add(static_cast<int64_t>(dt));
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second;
    using tag = memory::format_tag;
    auto f32 = memory::data_type::f32;
    auto plan = std::make_shared<Plan>();
    plan->src = memory::desc({m, kdim}, dt, tag::ab);
    plan->dst = memory::desc({m, n}, dt, tag::ab);
    plan->bias = memory::desc({1, n}, dt, tag::ab);
    plan->user_weights = memory::desc({kdim, n}, dt, cfg.kn ? tag::ab : tag::ba);
    dnnl::post_ops ops;
    AppendActivation(&ops, cfg.act, cfg.nan, &plan->prelu);
    if (cfg.residual) {
      plan->residual_arg = DNNL_ARG_ATTR_MULTIPLE_POST_OP(ops.len()) | DNNL_ARG_SRC_1;
      ops.append_binary(algorithm::binary_add, plan->dst);
    }
    dnnl::primitive_attr attr;
    attr.set_post_ops(ops);
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    // the packed layout the weight already has, when an earlier M chose one
    auto shared = weight_layouts_.find(WeightKey(cfg, kdim, n, dt));
    dnnl::matmul::primitive_desc pd;
    bool made = false;
    if (shared != weight_layouts_.end()) {
      try {
        pd = MakeMatmul(cfg, plan.get(), shared->second, attr);
        made = true;
      } catch (const dnnl::error&) {
        made = false;  // oneDNN wants another layout at this M: pack for it
      }
    }
    if (!made) pd = MakeMatmul(cfg, plan.get(), memory::desc({kdim, n}, dt, tag::any), attr);
    plan->weights = pd.weights_desc();
    plan->scratchpad = pd.scratchpad_desc();
    plan->primitive = dnnl::matmul(pd);
    weight_layouts_.emplace(WeightKey(cfg, kdim, n, dt), plan->weights);
    if (cfg.norm) {
      auto flags = dnnl::normalization_flags::none;
      if (cfg.gamma) flags |= dnnl::normalization_flags::use_scale;
      if (cfg.beta) flags |= dnnl::normalization_flags::use_shift;
      dnnl::primitive_attr norm_attr;
      norm_attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      auto npd = dnnl::layer_normalization_forward::primitive_desc(
          Engine(), dnnl::prop_kind::forward_inference, plan->dst, plan->dst, cfg.eps, flags,
          norm_attr);
      plan->norm_scale = memory::desc({n}, f32, tag::a);
      plan->norm_scratchpad = npd.scratchpad_desc();
      plan->norm = dnnl::layer_normalization_forward(npd);
    }
    plans_.emplace(key, plan);
    return plan;
  }

  static dnnl::matmul::primitive_desc MakeMatmul(const LinearConfig& cfg, const Plan* plan,
                                                 const memory::desc& weights,
                                                 const dnnl::primitive_attr& attr) {
    if (cfg.bias) {
      return dnnl::matmul::primitive_desc(Engine(), plan->src, weights, plan->bias, plan->dst,
                                          attr);
    }
    return dnnl::matmul::primitive_desc(Engine(), plan->src, weights, plan->dst, attr);
  }

  static IntKey WeightKey(const LinearConfig& cfg, int64_t kdim, int64_t n,
                          memory::data_type dt) {
    IntKey key;
    key.Add(static_cast<int64_t>(dt));
    key.Add(cfg.kn);
    key.Add(kdim);
    key.Add(n);
    return key;
  }

  std::shared_ptr<Packed> GetPacked(ffi::PackedArgs args, const std::shared_ptr<Plan>& plan,
                                    const LinearConfig& cfg, const DLTensor* w, int64_t kdim,
                                    int64_t n, memory::data_type dt) {
    uintptr_t ptr = reinterpret_cast<uintptr_t>(DataOf(w));
    // keyed by the packed layout's bytes (plans at other M share it when the layout is equal)
    std::ostringstream key;
    key << ptr << '|' << static_cast<int>(dt) << '|' << cfg.kn << '|' << kdim << 'x' << n << '|'
        << static_cast<int>(plan->weights.get_format_kind()) << '|'
        << plan->weights.get_size() << '|' << WeightsSignature(plan->weights);
    auto hit = packed_.Find(key.str());
    if (hit != nullptr) return hit;
    auto entry = std::make_shared<Packed>();
    entry->pointers = {ptr};
    HoldSources(args, entry.get());
    dnnl::engine& eng = Engine();
    memory user(plan->user_weights, eng, DataOf(w));
    memory packed(plan->weights, eng);
    dnnl::stream& strm = Stream();
    dnnl::reorder(user, packed).execute(strm, user, packed);
    strm.wait();
    entry->parts.push_back(packed);
    entry->bytes = plan->weights.get_size();
    InsertPacked(key.str(), entry);
    return entry;
  }

  // What tells two packed layouts of one shape apart: the blocking of the weights' desc.
  static std::string WeightsSignature(const memory::desc& desc) {
    std::ostringstream os;
    if (desc.get_format_kind() == memory::format_kind::blocked) {
      for (auto s : desc.get_strides()) os << s << ',';
      os << '|';
      for (auto b : desc.get_inner_blks()) os << b << ',';
      os << '|';
      for (auto i : desc.get_inner_idxs()) os << i << ',';
    }
    return os.str();
  }

  const bool native_bf16_ = std::find(dtypes_.begin(), dtypes_.end(),
                                      memory::data_type::bf16) != dtypes_.end();
  ConfigCache<LinearConfig> configs_;
  std::unordered_map<IntKey, std::shared_ptr<Plan>, IntKeyHash> plans_;
  std::unordered_map<IntKey, Bound, IntKeyHash> bound_;
  std::unordered_map<IntKey, memory::desc, IntKeyHash> weight_layouts_;
};

using Linear = LinearKernel<false>;
using LinearLayerNorm = LinearKernel<true>;

}  // namespace
}  // namespace plus_native

PLUS_NATIVE_EXPORT_KERNEL(linear, Linear);
PLUS_NATIVE_EXPORT_KERNEL(linear_layernorm, LinearLayerNorm);
PLUS_NATIVE_EXPORT_PARSER(linear, ParseLinear);
PLUS_NATIVE_EXPORT_PARSER(linear_layernorm, ParseLinearNorm);
