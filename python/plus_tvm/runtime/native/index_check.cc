// ``plus.check_indices`` without leaving C++ (runtime/index_check.py holds the contract).
//
// The check runs at every call of a model with an indexing op: each decode step of a language
// model calls it once per gather of the token ids and positions. Through Python each call cost
// the VM -> Python crossing, a numpy view and a TVM tensor made in Python (30-40 us, several
// per step). Here an in-range call reads the indices, copies them into a new tensor and
// returns it (well under a microsecond for a decode step's ids); everything else goes to the
// Python check it was created with: an index out of range (the Python check finds it again
// and raises the error naming the op, node, value, position and input: one message, one
// place), another device or dtype, strided indices, a config or extents it does not read.

#include <tvm/ffi/container/shape.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/string.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string_view>

namespace plus_native {
namespace {

namespace ffi = tvm::ffi;

// The returned copy's memory (64-byte aligned, as TVM's CPU allocations are).
struct CpuAlloc {
  void AllocData(DLTensor* tensor) {
    size_t bytes = (ffi::GetDataSize(*tensor) + 63) / 64 * 64;
    tensor->data = std::aligned_alloc(64, bytes > 0 ? bytes : 64);
    if (tensor->data == nullptr) throw std::bad_alloc();
  }
  void FreeData(DLTensor* tensor) { std::free(tensor->data); }
};

// ``neg`` and ``last`` of a config (``key=value;...``, the keys of index_check._KEYS; a later
// item overrides an earlier one, as Python's dict of the items does). ``known`` false: a key
// the Python check refuses (it raises for it).
struct Flags {
  bool known = true;
  bool negative = false;
  bool last = false;
};

Flags ParseFlags(std::string_view text) {
  Flags flags;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(';', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view part = text.substr(start, end - start);
    size_t eq = part.find('=');
    if (eq != std::string_view::npos) {
      std::string_view key = part.substr(0, eq), value = part.substr(eq + 1);
      if (key == "neg") {
        flags.negative = value == "1";
      } else if (key == "last") {
        flags.last = value == "1";
      } else if (key != "op" && key != "node" && key != "input") {
        flags.known = false;
      }
    }
    start = end + 1;
  }
  return flags;
}

bool IsCompact(const DLTensor* t) {
  if (t->strides == nullptr) return true;
  int64_t expected = 1;
  for (int i = t->ndim - 1; i >= 0; --i) {
    if (t->shape[i] != 1 && t->strides[i] != expected) return false;
    expected *= t->shape[i];
  }
  return true;
}

// Whether every index is in range: against ``extents[0]`` (``last`` false), or coordinate
// ``j`` of each index tuple (the last axis) against ``extents[j]``. The range is
// ``[-n, n)`` with ``negative``, else ``[0, n)``.
template <typename T>
bool InRange(const T* values, int64_t count, const int64_t* extents, int64_t width,
             bool negative) {
  if (width == 1) {
    const int64_t high = extents[0], low = negative ? -high : 0;
    bool ok = true;
    for (int64_t i = 0; i < count; ++i) {
      const int64_t v = static_cast<int64_t>(values[i]);
      ok &= (v >= low) & (v < high);
    }
    return ok;
  }
  for (int64_t i = 0; i < count; ++i) {
    const int64_t high = extents[i % width], low = negative ? -high : 0;
    const int64_t v = static_cast<int64_t>(values[i]);
    if (v < low || v >= high) return false;
  }
  return true;
}

class IndexCheck {
 public:
  explicit IndexCheck(ffi::Function fallback) : fallback_(std::move(fallback)) {}

  void operator()(ffi::PackedArgs args, ffi::Any* rv) {
    if (!Check(args, rv)) fallback_.CallPacked(args, rv);
  }

 private:
  // true: in range, ``rv`` holds the copy; false: the Python check decides.
  bool Check(ffi::PackedArgs args, ffi::Any* rv) {
    if (args.size() != 3) return false;
    auto indices = args[0].try_cast<DLTensor*>();
    auto extents = args[1].try_cast<ffi::Shape>();
    auto config = args[2].try_cast<ffi::String>();
    if (!indices.has_value() || !extents.has_value() || !config.has_value()) return false;
    const DLTensor* t = *indices;
    if (t->device.device_type != kDLCPU || !IsCompact(t)) return false;
    const DLDataType dt = t->dtype;
    if (dt.code != kDLInt || dt.lanes != 1 || (dt.bits != 32 && dt.bits != 64)) return false;
    const Flags flags = ParseFlags(std::string_view((*config).data(), (*config).size()));
    const ffi::Shape& ext = *extents;
    if (!flags.known || ext.size() == 0) return false;
    int64_t count = 1;
    for (int i = 0; i < t->ndim; ++i) count *= t->shape[i];
    int64_t width = 1;
    if (flags.last) {  // one coordinate per extent along the last axis
      if (t->ndim == 0 || t->shape[t->ndim - 1] != static_cast<int64_t>(ext.size())) return false;
      width = static_cast<int64_t>(ext.size());
    }
    const void* data = static_cast<const char*>(t->data) + t->byte_offset;
    if (count > 0) {
      const bool ok =
          dt.bits == 64
              ? InRange(static_cast<const int64_t*>(data), count, ext.data(), width, flags.negative)
              : InRange(static_cast<const int32_t*>(data), count, ext.data(), width,
                        flags.negative);
      if (!ok) return false;  // (the Python check names the offending index)
    }
    // a copy, not the input: the VM plans the input's storage as free after this call
    ffi::Tensor copy = ffi::Tensor::FromNDAlloc(
        CpuAlloc(), ffi::ShapeView(t->shape, static_cast<size_t>(t->ndim)), dt, t->device);
    if (count > 0) {
      std::memcpy(copy.data_ptr(), data, static_cast<size_t>(count) * (dt.bits / 8));
    }
    *rv = std::move(copy);
    return true;
  }

  ffi::Function fallback_;
};

// ``index_check_create(fallback) -> plus.check_indices``: the native check, handing what it does
// not run (and every index out of range) to ``fallback``, the Python check.
ffi::Function Create(ffi::Function fallback) {
  auto check = std::make_shared<IndexCheck>(std::move(fallback));
  return ffi::Function::FromPacked(
      [check](ffi::PackedArgs args, ffi::Any* rv) { (*check)(args, rv); });
}

// ``index_check_flags(config) -> int``: the flags the native check reads from ``config``
// (bit 0: neg, bit 1: last; -1: a key it does not know), for the tests of the parser.
int64_t FlagsOf(ffi::String config) {
  const Flags flags = ParseFlags(std::string_view(config.data(), config.size()));
  return flags.known ? (int64_t(flags.negative) | (int64_t(flags.last) << 1)) : -1;
}

}  // namespace
}  // namespace plus_native

TVM_FFI_DLL_EXPORT_TYPED_FUNC(index_check_create, plus_native::Create);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(index_check_flags, plus_native::FlagsOf);
