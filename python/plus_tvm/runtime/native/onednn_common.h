// What the oneDNN kernels share: config parsing, tensor checks, the engine and per-thread
// streams, and a bounded cache of packed weights that holds its source tensors.
#ifndef PLUS_TVM_NATIVE_ONEDNN_COMMON_H_
#define PLUS_TVM_NATIVE_ONEDNN_COMMON_H_

#include <oneapi/dnnl/dnnl.hpp>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/string.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace plus_native {

namespace ffi = tvm::ffi;
using dnnl::algorithm;
using dnnl::memory;

// ------------------------------------------------------------------------------------ engine

inline dnnl::engine& Engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

inline dnnl::stream& Stream() {
  thread_local dnnl::stream strm(Engine());
  return strm;
}

// This thread's scratchpad for primitives created with scratchpad_mode::user (oneDNN's own is
// shared by the threads of a process), grown to the largest size asked for.
inline void* Scratchpad(size_t bytes) {
  thread_local std::vector<uint64_t> buffer;
  size_t words = (bytes + 63) / 8 + 8;
  if (buffer.size() < words) buffer.resize(words);
  uintptr_t p = reinterpret_cast<uintptr_t>(buffer.data());
  return reinterpret_cast<void*>((p + 63) & ~uintptr_t(63));  // 64-byte aligned
}

// ------------------------------------------------------------------------------------ config

// The activations of ../_common.py (ACTIVATIONS).
enum class Activation { kNone, kRelu, kRelu6, kGelu, kGeluTanh, kSilu, kSigmoid, kTanh };

inline bool ActivationOf(const std::string& name, Activation* act) {
  static const std::pair<const char*, Activation> kKnown[] = {
      {"none", Activation::kNone},         {"relu", Activation::kRelu},
      {"relu6", Activation::kRelu6},       {"gelu", Activation::kGelu},
      {"gelu_tanh", Activation::kGeluTanh}, {"silu", Activation::kSilu},
      {"sigmoid", Activation::kSigmoid},   {"tanh", Activation::kTanh}};
  for (const auto& [known, value] : kKnown) {
    if (name == known) {
      *act = value;
      return true;
    }
  }
  return false;
}

inline bool IsActivation(const std::string& name) {
  Activation act;
  return ActivationOf(name, &act);
}

// Appends ``act`` to ``ops`` as oneDNN post-ops and the indices of the PReLU post-ops it used to
// ``prelu`` (each takes one zero as its weight). oneDNN's ReLU and clip compute max(x, 0),
// which turns NaN into 0 where torch returns NaN; with ``nan`` they are built from PReLU with a
// zero slope (x > 0 ? x : 0 * x, which keeps NaN) instead: relu = prelu, then x * 1 + 0 (-0
// becomes +0); relu6 = 6 - relu(6 - relu(x)), exact for x >= 3 and within half an ulp of 6
// (2.4e-7) below. Infinities give NaN there (0 * inf), never a number. The forms cost 1.2-1.3x
// the convolution, so the convolution kernel runs oneDNN's own first, under the NaN guard
// (nan_guard.h), and these only when a NaN reached the activation.
inline void AppendActivation(dnnl::post_ops* ops, const std::string& act, bool nan,
                             std::vector<int>* prelu) {
  auto eltwise = [&](algorithm alg, float alpha, float beta) {
    ops->append_eltwise(alg, alpha, beta);
  };
  auto zero_slope = [&]() {
    prelu->push_back(ops->len());
    ops->append_prelu(0);
  };
  if (act == "none") return;
  if (act == "relu" && nan) {
    zero_slope();
    eltwise(algorithm::eltwise_linear, 1.f, 0.f);
  } else if (act == "relu") {
    eltwise(algorithm::eltwise_relu, 0.f, 0.f);
  } else if (act == "relu6" && nan) {
    zero_slope();
    eltwise(algorithm::eltwise_linear, -1.f, 6.f);
    zero_slope();
    eltwise(algorithm::eltwise_linear, -1.f, 6.f);
  } else if (act == "relu6") {
    eltwise(algorithm::eltwise_clip_v2, 0.f, 6.f);
  } else if (act == "silu") {
    eltwise(algorithm::eltwise_swish, 1.f, 0.f);
  } else if (act == "gelu") {
    eltwise(algorithm::eltwise_gelu_erf, 0.f, 0.f);
  } else if (act == "gelu_tanh") {
    eltwise(algorithm::eltwise_gelu_tanh, 0.f, 0.f);
  } else if (act == "sigmoid") {
    eltwise(algorithm::eltwise_logistic, 0.f, 0.f);
  } else if (act == "tanh") {
    eltwise(algorithm::eltwise_tanh, 0.f, 0.f);
  }
}

// The weight of every zero-slope PReLU post-op.
inline memory ZeroSlope() {
  static float zero = 0.f;
  static memory slope(memory::desc({1}, memory::data_type::f32, memory::format_tag::a),
                      Engine(), &zero);
  return slope;
}

inline bool ParseInts(const std::string& text, int64_t* out, int count) {
  std::vector<int64_t> values;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      values.push_back(std::stoll(item, &used));
      if (used != item.size()) return false;
    } catch (const std::exception&) {
      return false;
    }
  }
  if (values.size() == 1) values.assign(count, values[0]);
  if (count == 4 && values.size() == 2) values = {values[0], values[1], values[0], values[1]};
  if (static_cast<int>(values.size()) != count) return false;
  std::copy(values.begin(), values.end(), out);
  return true;
}

inline bool ParseFlag(const std::string& text, bool* out) {
  if (text != "0" && text != "1") return false;
  *out = text == "1";
  return true;
}

inline bool ParseFloat(const std::string& text, float* out) {
  try {
    size_t used = 0;
    *out = std::stof(text, &used);
    return used == text.size();
  } catch (const std::exception&) {
    return false;
  }
}

// Calls ``visit(key, value)`` for every ``key=value`` item of a config string; false when an
// item is malformed or ``visit`` refuses it.
template <typename Visit>
bool ForEachItem(const std::string& text, Visit visit) {
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ';')) {
    if (item.empty()) continue;
    size_t eq = item.find('=');
    if (eq == std::string::npos) return false;
    if (!visit(item.substr(0, eq), item.substr(eq + 1))) return false;
  }
  return true;
}

// ------------------------------------------------------------------------------------ tensors

// The oneDNN data type of a DLPack element type (float32, bfloat16, float16); false for any
// other. Which of them a kernel takes is not decided here: see KernelBase::CallType.
inline bool DataTypeOf(DLDataType t, memory::data_type* out) {
  if (t.lanes != 1) return false;
  if (t.code == kDLFloat && t.bits == 32) {
    *out = memory::data_type::f32;
  } else if (t.code == kDLBfloat && t.bits == 16) {
    *out = memory::data_type::bf16;
  } else if (t.code == kDLFloat && t.bits == 16) {
    *out = memory::data_type::f16;
  } else {
    return false;
  }
  return true;
}

// The oneDNN data type of a dtype name as Python writes it ("float32", "bfloat16", "float16").
inline bool DataTypeNamed(const std::string& name, memory::data_type* out) {
  if (name == "float32") {
    *out = memory::data_type::f32;
  } else if (name == "bfloat16") {
    *out = memory::data_type::bf16;
  } else if (name == "float16") {
    *out = memory::data_type::f16;
  } else {
    return false;
  }
  return true;
}

inline const char* DataTypeName(memory::data_type dt) {
  switch (dt) {
    case memory::data_type::f32:
      return "float32";
    case memory::data_type::bf16:
      return "bfloat16";
    case memory::data_type::f16:
      return "float16";
    default:
      return "other";
  }
}

// A CPU tensor in its dense row-major layout (any element type).
inline bool IsCpuCompact(const DLTensor* t) {
  if (t == nullptr || t->device.device_type != kDLCPU) return false;
  if (t->strides != nullptr) {
    int64_t expected = 1;
    for (int i = t->ndim - 1; i >= 0; --i) {
      if (t->shape[i] != 1 && t->strides[i] != expected) return false;
      expected *= t->shape[i];
    }
  }
  return true;
}

// A dense CPU tensor of element type ``dt``.
inline bool IsCpuCompactOf(const DLTensor* t, memory::data_type dt) {
  memory::data_type actual;
  return IsCpuCompact(t) && DataTypeOf(t->dtype, &actual) && actual == dt;
}

inline bool IsCpuF32Compact(const DLTensor* t) {
  return IsCpuCompactOf(t, memory::data_type::f32);
}

// ``n`` bfloat16 / float16 / float32 values widened to float32 into ``out``.
inline void WidenToF32(const void* data, memory::data_type dt, int64_t n, float* out) {
  if (dt == memory::data_type::f32) {
    std::copy_n(static_cast<const float*>(data), n, out);
    return;
  }
  const uint16_t* bits = static_cast<const uint16_t*>(data);
  for (int64_t i = 0; i < n; ++i) {
    uint32_t word;
    if (dt == memory::data_type::bf16) {
      word = uint32_t(bits[i]) << 16;
    } else {  // IEEE half: sign, 5-bit exponent, 10-bit mantissa
      uint32_t sign = uint32_t(bits[i] & 0x8000) << 16;
      uint32_t exp = (bits[i] >> 10) & 0x1f;
      uint32_t man = bits[i] & 0x3ff;
      if (exp == 0x1f) {
        word = sign | 0x7f800000u | (man << 13);  // inf / NaN
      } else if (exp != 0) {
        word = sign | ((exp + 112) << 23) | (man << 13);
      } else if (man == 0) {
        word = sign;
      } else {  // subnormal: normalize
        int shift = 0;
        while (!(man & 0x400)) {
          man <<= 1;
          ++shift;
        }
        word = sign | (uint32_t(113 - shift) << 23) | ((man & 0x3ff) << 13);
      }
    }
    std::memcpy(&out[i], &word, sizeof(float));
  }
}

inline float* DataOf(const DLTensor* t) {
  return reinterpret_cast<float*>(static_cast<char*>(t->data) + t->byte_offset);
}

inline int64_t NumelOf(const DLTensor* t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; ++i) n *= t->shape[i];
  return n;
}

// The tensors of ``(*tensors, config, out[, second_out])`` (no allocation: the VM calls this
// per kernel).
struct Call {
  static constexpr int kMaxInputs = 12;
  const DLTensor* inputs[kMaxInputs] = {};
  int num_inputs = 0;
  const DLTensor* out = nullptr;
  const DLTensor* extra_out = nullptr;  // a second output, when the kernel has one
  std::string_view config;
  ffi::String config_ref;  // keeps ``config`` alive
};

inline bool SplitCall(ffi::PackedArgs args, Call* call) {
  int n = args.size();
  int at = -1;  // the config string: the last argument that is one
  for (int i = n - 2; i >= 0 && i >= n - 3; --i) {
    if (args[i].try_cast<ffi::String>().has_value()) {
      at = i;
      break;
    }
  }
  if (at < 0 || at > Call::kMaxInputs) return false;
  call->config_ref = args[at].cast<ffi::String>();
  call->config = std::string_view(call->config_ref.data(), call->config_ref.size());
  auto out = args[at + 1].try_cast<DLTensor*>();
  if (!out.has_value()) return false;
  call->out = *out;
  if (at + 2 < n) {
    auto extra = args[at + 2].try_cast<DLTensor*>();
    if (!extra.has_value()) return false;
    call->extra_out = *extra;
  }
  call->num_inputs = at;
  for (int i = 0; i < at; ++i) {
    auto t = args[i].try_cast<DLTensor*>();
    if (!t.has_value()) return false;
    call->inputs[i] = *t;
  }
  return true;
}

// Parsed configs by their text, looked up without allocating (the key views the stored text).
template <typename Config>
class ConfigCache {
 public:
  template <typename Parse>
  const Config* Get(std::string_view text, Parse parse) {
    auto it = entries_.find(text);
    if (it != entries_.end()) return &it->second->config;
    auto entry = std::make_unique<Entry>();
    entry->text = std::string(text);
    entry->config = parse(entry->text);
    const Config* config = &entry->config;
    std::string_view key(entry->text);
    entries_.emplace(key, std::move(entry));
    return config;
  }

 private:
  struct Entry {
    std::string text;
    Config config;
  };
  std::unordered_map<std::string_view, std::unique_ptr<Entry>> entries_;
};

// A fixed-size key of integers (shapes, pointers) for the per-call caches.
struct IntKey {
  static constexpr int kMax = 24;
  int64_t v[kMax] = {};
  int n = 0;
  void Add(int64_t x) {
    if (n < kMax) v[n] = x;
    ++n;
  }
  bool operator==(const IntKey& o) const {
    return n == o.n && std::equal(v, v + std::min(n, kMax), o.v);
  }
};

struct IntKeyHash {
  size_t operator()(const IntKey& k) const {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < std::min(k.n, IntKey::kMax); ++i) {
      h ^= static_cast<uint64_t>(k.v[i]);
      h *= 1099511628211ull;
    }
    return static_cast<size_t>(h ^ (h >> 29));
  }
};

// ------------------------------------------------------------------------------------ weights

// Weights reordered once into a primitive's preferred layout (with any folding done first).
struct Packed {
  std::vector<ffi::Tensor> sources;  // held: their addresses cannot be reused meanwhile
  std::vector<uintptr_t> pointers;   // the data pointers the entry was made from
  std::vector<memory> parts;         // what the kernel executes with
  size_t bytes = 0;
};

// Packed forms keyed by a string the kernel builds (primitive + source pointers), bounded in
// bytes (the oldest entries are dropped first, and re-packed if needed again). Not locked: the
// kernel that owns it holds its own mutex around every use.
class PackCache {
 public:
  std::shared_ptr<Packed> Find(const std::string& key) const {
    auto it = entries_.find(key);
    return it == entries_.end() ? nullptr : it->second;
  }

  // Returns how many older entries were dropped to stay within the budget.
  int Insert(const std::string& key, std::shared_ptr<Packed> entry) {
    bytes_ += entry->bytes;
    entries_[key] = std::move(entry);
    order_.push_back(key);
    int dropped = 0;
    while (bytes_ > budget_ && entries_.size() > 1) {
      const std::string victim = order_.front();
      order_.pop_front();
      auto it = entries_.find(victim);
      if (it == entries_.end() || victim == key) continue;
      bytes_ -= it->second->bytes;
      entries_.erase(it);
      ++dropped;
    }
    return dropped;
  }

  void Forget(uintptr_t ptr) {
    for (auto it = entries_.begin(); it != entries_.end();) {
      const auto& p = it->second->pointers;
      if (std::find(p.begin(), p.end(), ptr) != p.end()) {
        bytes_ -= it->second->bytes;
        it = entries_.erase(it);
      } else {
        ++it;
      }
    }
  }

  void Clear() {
    entries_.clear();
    order_.clear();
    bytes_ = 0;
  }

  void SetBudget(size_t bytes) { budget_ = bytes; }
  size_t size() const { return entries_.size(); }
  size_t bytes() const { return bytes_; }

 private:
  std::unordered_map<std::string, std::shared_ptr<Packed>> entries_;
  std::deque<std::string> order_;
  size_t bytes_ = 0;
  size_t budget_ = size_t(4096) << 20;
};

// A plan and the packed weights one call site binds it to (the per-call cache's entry); empty
// (false) when there is none.
template <typename Plan>
struct BoundPlan {
  std::shared_ptr<Plan> plan;
  std::shared_ptr<Packed> packed;
  explicit operator bool() const { return plan != nullptr; }
};

// Hold the ffi::Tensor objects among ``args`` whose data pointers are in ``pointers``.
inline void HoldSources(ffi::PackedArgs args, Packed* entry) {
  for (int i = 0; i < args.size(); ++i) {
    auto held = args[i].try_cast<ffi::Tensor>();
    if (!held.has_value()) continue;
    auto ptr = reinterpret_cast<uintptr_t>(DataOf((*held).GetDLTensorPtr()));
    if (std::find(entry->pointers.begin(), entry->pointers.end(), ptr) != entry->pointers.end()) {
      entry->sources.push_back(*held);
    }
  }
}

// Counters every kernel reports through its stats function.
struct Counters {
  std::atomic<int64_t> calls{0};
  std::atomic<int64_t> fallbacks{0};
  std::atomic<int64_t> packs{0};
  std::atomic<int64_t> call_ns{0};     // inside the kernel, from entry to return
  std::atomic<int64_t> execute_ns{0};  // inside oneDNN's primitives
  std::atomic<int64_t> guarded{0};     // calls run in the fast form under the NaN guard
  std::atomic<int64_t> nan_reruns{0};  // of those, calls run again NaN-keeping (nan_guard.h)
  std::atomic<int64_t> winograd{0};    // calls run as Winograd (winograd.h)
  std::atomic<int64_t> winograd4{0};   // of those, calls with 4x4 output tiles
  std::atomic<int64_t> silu_passes{0};  // calls whose SiLU ran after the primitive (silu_pass.h)

  std::string Json() const {
    std::ostringstream os;
    os << "\"calls\": " << calls << ", \"fallbacks\": " << fallbacks << ", \"packs\": " << packs
       << ", \"call_us\": " << call_ns / 1000 << ", \"execute_us\": " << execute_ns / 1000
       << ", \"guarded\": " << guarded << ", \"nan_reruns\": " << nan_reruns
       << ", \"winograd\": " << winograd << ", \"winograd4\": " << winograd4
       << ", \"silu_passes\": " << silu_passes;
    return os.str();
  }
};

inline int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// ------------------------------------------------------------------------------------ calls

// This thread's memory object for ``slot`` of a primitive owned by ``owner``, its data handle
// set for the call (memory objects are made once per thread and primitive: a primitive may run
// in several threads at once). ``owner`` is held so that its address keys nothing else.
inline memory& ThreadMemory(const std::shared_ptr<void>& owner, int slot,
                            const memory::desc& desc, void* data) {
  thread_local std::unordered_map<IntKey, std::pair<std::shared_ptr<void>, memory>, IntKeyHash>
      table;
  IntKey key;
  key.Add(reinterpret_cast<int64_t>(owner.get()));
  key.Add(slot);
  auto it = table.find(key);
  if (it == table.end()) {
    it = table.emplace(key, std::make_pair(owner, memory(desc, Engine(), DNNL_MEMORY_NONE))).first;
  }
  it->second.second.set_data_handle(data);
  return it->second.second;
}

// The arguments of one primitive execution, built without allocating.
struct ExecArgs {
  dnnl_exec_arg_t args[16];
  int n = 0;
  void Add(int arg, const memory& mem) { args[n++] = {arg, mem.get()}; }
  // the per-thread scratchpad of a primitive created with scratchpad_mode::user
  // (``slot`` tells apart the memory objects of a plan's primitives)
  void AddScratchpad(const std::shared_ptr<void>& owner, const memory::desc& desc,
                     int slot = -1) {
    if (desc.get_size() == 0) return;
    Add(DNNL_ARG_SCRATCHPAD, ThreadMemory(owner, slot, desc, Scratchpad(desc.get_size())));
  }
  void AddZeroSlopes(const std::vector<int>& prelu) {
    for (int index : prelu) Add(DNNL_ARG_ATTR_MULTIPLE_POST_OP(index) | DNNL_ARG_WEIGHTS, ZeroSlope());
  }
};

// ------------------------------------------------------------------------------------ kernels

// What every native kernel shares: the Python kernel it falls back to, one mutex for its caches,
// its packed weights, its counters, and the cache management the Python side calls.
class KernelBase {
 public:
  // The fallback is a Python function: it is never released (at process exit, C++ destructors
  // run after Python has shut down, and releasing it then would crash).
  // ``dtypes``: the element types this kernel runs natively, comma-separated as Python names
  // them (the Python kernel's ``native_dtypes()``: the one list of them); calls in any other
  // go to the fallback.
  KernelBase(ffi::Function fallback, const std::string& dtypes)
      : fallback_(new ffi::Function(std::move(fallback))) {
    std::stringstream ss(dtypes);
    std::string name;
    while (std::getline(ss, name, ',')) {
      memory::data_type dt;
      if (DataTypeNamed(name, &dt)) dtypes_.push_back(dt);
    }
  }
  virtual ~KernelBase() = default;

  void Forget(uintptr_t ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    packed_.Forget(ptr);
    DropBound();
  }

  void Clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    packed_.Clear();
    DropPlans();
    DropBound();
  }

  void SetBudget(int64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    packed_.SetBudget(static_cast<size_t>(bytes));
    DropBound();
  }

  std::string Stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::ostringstream os;
    os << "{" << counters_.Json() << ", \"dtypes\": [";
    for (size_t i = 0; i < dtypes_.size(); ++i) {
      os << (i ? ", " : "") << '"' << DataTypeName(dtypes_[i]) << '"';
    }
    os << "], \"primitives\": " << NumPlans()
       << ", \"packed\": " << packed_.size() << ", \"packed_bytes\": " << packed_.bytes() << "}";
    return os.str();
  }

 protected:
  void Fallback(ffi::PackedArgs args, ffi::Any* rv) {
    counters_.fallbacks += 1;
    fallback_->CallPacked(args, rv);
  }

  // Insert a packed entry; entries dropped to stay within the budget unpin the bound calls.
  void InsertPacked(const std::string& key, std::shared_ptr<Packed> entry) {
    if (packed_.Insert(key, std::move(entry)) > 0) DropBound();
    counters_.packs += 1;
  }

  // Executes ``primitive`` on this thread's stream with ``args``; adds the time to the counters.
  void Execute(const dnnl::primitive& primitive, const ExecArgs& exec) {
    dnnl::stream& strm = Stream();
    int64_t begin = NowNs();
    dnnl::error::wrap_c_api(
        dnnl_primitive_execute(primitive.get(), strm.get(), exec.n, exec.args),
        "oneDNN could not run a primitive");
    strm.wait();
    counters_.execute_ns += NowNs() - begin;
  }

  // The start every native call shares: the VM's arguments split, the config parsed once per
  // distinct string, and what every native path requires (a native config, as many inputs as it
  // names, a second output only where ``extra_out_ok``). nullptr: hand the call to Python.
  template <typename Config, typename Parse>
  const Config* Begin(ffi::PackedArgs args, ConfigCache<Config>* cache, Parse parse, Call* call,
                      bool extra_out_ok = false) {
    if (!SplitCall(args, call)) return nullptr;
    const Config* cfg;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      cfg = cache->Get(call->config, parse);
    }
    if (!cfg->native || call->num_inputs != cfg->inputs()) return nullptr;
    if (call->extra_out != nullptr && !extra_out_ok) return nullptr;
    return cfg;
  }

  // The element type of a call whose tensor ``t`` is dense on the CPU in a type this kernel
  // takes natively (false: hand the call to Python).
  bool CallType(const DLTensor* t, memory::data_type* dt) const {
    return IsCpuCompact(t) && DataTypeOf(t->dtype, dt) &&
           std::find(dtypes_.begin(), dtypes_.end(), *dt) != dtypes_.end();
  }

  void Done(int64_t start) {
    counters_.calls += 1;
    counters_.call_ns += NowNs() - start;
  }

  // The entry of ``cache`` for ``key`` (a plan, or a plan bound to packed weights), looked up
  // under the kernel's mutex and made by ``make()`` (under it too) on a miss. A oneDNN error in
  // ``make`` (no primitive for this shape) gives an empty entry and caches nothing, nor does an
  // empty entry ``make`` returns: the caller then hands the call to the Python kernel.
  template <typename Map, typename Make>
  typename Map::mapped_type FindOrMake(Map* cache, const typename Map::key_type& key, Make make) {
    using Entry = typename Map::mapped_type;
    std::lock_guard<std::mutex> lock(mutex_);
    auto hit = cache->find(key);
    if (hit != cache->end()) return hit->second;
    Entry entry;
    try {
      entry = make();
    } catch (const dnnl::error&) {
      return Entry();
    }
    if (entry) cache->emplace(key, entry);
    return entry;
  }

  virtual void DropBound() = 0;   // the per-call cache of (primitive, packed weights)
  virtual void DropPlans() = 0;   // primitives
  virtual size_t NumPlans() = 0;  // primitives made

  ffi::Function* fallback_;
  std::vector<memory::data_type> dtypes_;  // set at creation, read-only after
  std::mutex mutex_;
  PackCache packed_;
  Counters counters_;
};

// The process's instance of a kernel class (made by ``<prefix>_create``), never destroyed (see
// KernelBase), and the exported functions the Python side calls (runtime/native/__init__.py).
template <typename Kernel>
std::shared_ptr<Kernel>& InstanceOf() {
  static auto* instance = new std::shared_ptr<Kernel>();
  return *instance;
}

template <typename Kernel>
ffi::Function CreateKernel(ffi::Function fallback, const std::string& dtypes) {
  auto kernel = std::make_shared<Kernel>(std::move(fallback), dtypes);
  InstanceOf<Kernel>() = kernel;
  return ffi::Function::FromPacked(
      [kernel](ffi::PackedArgs args, ffi::Any* rv) { (*kernel)(args, rv); });
}

}  // namespace plus_native

#define PLUS_NATIVE_EXPORT_KERNEL(Prefix, Kernel)                                        \
  namespace plus_native {                                                                \
  namespace {                                                                            \
  ffi::Function Prefix##_create_impl(ffi::Function fallback, ffi::String dtypes) {       \
    return CreateKernel<Kernel>(std::move(fallback), std::string(dtypes));               \
  }                                                                                      \
  void Prefix##_forget_impl(int64_t ptr) {                                               \
    if (InstanceOf<Kernel>()) InstanceOf<Kernel>()->Forget(static_cast<uintptr_t>(ptr)); \
  }                                                                                      \
  void Prefix##_clear_impl() {                                                           \
    if (InstanceOf<Kernel>()) InstanceOf<Kernel>()->Clear();                             \
  }                                                                                      \
  void Prefix##_set_budget_impl(int64_t bytes) {                                         \
    if (InstanceOf<Kernel>()) InstanceOf<Kernel>()->SetBudget(bytes);                    \
  }                                                                                      \
  ffi::String Prefix##_stats_impl() {                                                    \
    return InstanceOf<Kernel>() ? InstanceOf<Kernel>()->Stats() : std::string("{}");     \
  }                                                                                      \
  }                                                                                      \
  }                                                                                      \
  TVM_FFI_DLL_EXPORT_TYPED_FUNC(Prefix##_create, plus_native::Prefix##_create_impl);     \
  TVM_FFI_DLL_EXPORT_TYPED_FUNC(Prefix##_forget, plus_native::Prefix##_forget_impl);     \
  TVM_FFI_DLL_EXPORT_TYPED_FUNC(Prefix##_clear, plus_native::Prefix##_clear_impl);       \
  TVM_FFI_DLL_EXPORT_TYPED_FUNC(Prefix##_set_budget, plus_native::Prefix##_set_budget_impl); \
  TVM_FFI_DLL_EXPORT_TYPED_FUNC(Prefix##_stats, plus_native::Prefix##_stats_impl)

// ``<prefix>_parse(config) -> int``: what the kernel's parser makes of a config string: 0 when
// an item is not understood (a key it does not know, a bad value), 1 when every item is but the
// config is not one it runs natively, 2 when it runs it (``cfg.native``). The Python kernel's
// spec is the contract (runtime/<kernel>.py); tests/test_kernel_contract.py checks through this
// that the parser takes exactly its keys and values, and decides ``native`` as the kernel's
// ``native_config`` does. ``Parse`` returns a config with ``known`` and ``native``.
#define PLUS_NATIVE_EXPORT_PARSER(Prefix, Parse)                              \
  namespace plus_native {                                                     \
  namespace {                                                                 \
  int64_t Prefix##_parse_impl(ffi::String text) {                             \
    const auto cfg = Parse(std::string(text));                                \
    return cfg.known ? 1 + static_cast<int64_t>(cfg.native) : 0;              \
  }                                                                           \
  }                                                                           \
  }                                                                           \
  TVM_FFI_DLL_EXPORT_TYPED_FUNC(Prefix##_parse, plus_native::Prefix##_parse_impl)

#endif  // PLUS_TVM_NATIVE_ONEDNN_COMMON_H_
