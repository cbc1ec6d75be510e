// The NaN guard: a primitive run with oneDNN's one-instruction ReLU / clip, which turn NaN into a
// number, and run again with the NaN-keeping form only when a NaN reached them.
//
// With ``nan=1`` a ReLU / ReLU6 post-op must return NaN for NaN, as torch does; oneDNN computes
// them with max / min, which return the other operand. The NaN-keeping form (AppendActivation in
// onednn_common.h: PReLU with a zero slope, ReLU6 as 6 - relu(6 - relu(x))) costs 1.2-1.3x the
// convolution on MobileNetV2's 112x112 layers. The guard runs the fast form and reads the x86
// invalid-operation flag (MXCSR bit 0, sticky, set whether or not the exception is masked):
// MAXPS / MINPS set it when an operand is a NaN, and an operation that makes a NaN from numbers
// (inf - inf, 0 * inf) sets it where the NaN is made. So a NaN that reached the activation, or was
// made on the way, leaves the flag set on the thread that computed it; a primitive whose flag
// stayed clear on every thread computed no NaN, and the fast result is the exact one. When it is
// set (a NaN, or an earlier unrelated operation that left the flag set) the primitive runs again
// in the NaN-keeping form.
//
// The flag is per thread: oneDNN runs a primitive on the calling thread's OpenMP team, so the
// guard reads (and clears) it on every thread of a team as large as oneDNN's (libgomp hands a
// thread's teams the same threads, in order). From inside an OpenMP region, or off x86, there is
// no guard and the NaN-keeping form runs. A kernel checks each fast primitive once when it makes
// it (Verified): clear on zeros, set on NaN; one that fails never runs fast.
#ifndef PLUS_TVM_NATIVE_NAN_GUARD_H_
#define PLUS_TVM_NATIVE_NAN_GUARD_H_

#include <omp.h>

#include "onednn_common.h"

#include <cstring>
#include <limits>
#include <string>
#include <unordered_map>

#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>
#define PLUS_NATIVE_NAN_GUARD 1
#else
#define PLUS_NATIVE_NAN_GUARD 0
#endif

namespace plus_native {

// Whether ``act`` is one whose NaN-keeping form differs from oneDNN's own (see the file comment).
inline bool NeedsNanGuard(const std::string& act) { return act == "relu" || act == "relu6"; }

// Whether the guard can run here: x86, and not inside an OpenMP region.
inline bool NanGuardAvailable() { return PLUS_NATIVE_NAN_GUARD && !omp_in_parallel(); }

// How many threads of the calling thread's OpenMP team had the invalid-operation flag set; clears
// it on each of them.
inline int TakeInvalidFlags() {
  int set = 0;
#if PLUS_NATIVE_NAN_GUARD
#pragma omp parallel num_threads(omp_get_max_threads()) reduction(+ : set)
  {
    unsigned csr = _mm_getcsr();
    if (csr & 1u) {
      set += 1;
      _mm_setcsr(csr & ~1u);
    }
  }
#endif
  return set;
}

// Whether ``primitive`` (made with the fast activations) leaves the flag clear on zeros and sets
// it on NaN: ``args`` names every memory it takes; the data of SRC (and of DST where a post-op
// reads it) is filled here, every other argument with zeros.
inline bool Verified(const dnnl::primitive& primitive,
                     const std::unordered_map<int, dnnl::memory::desc>& args) {
  if (!NanGuardAvailable()) return false;
  dnnl::stream& strm = Stream();
  std::unordered_map<int, dnnl::memory> mems;
  for (const auto& [arg, desc] : args) {
    dnnl::memory mem(desc, Engine());
    std::memset(mem.get_data_handle(), 0, desc.get_size());
    mems.emplace(arg, mem);
  }
  auto run = [&]() {
    primitive.execute(strm, mems);
    strm.wait();
  };
  TakeInvalidFlags();  // what earlier work left
  run();
  if (TakeInvalidFlags() != 0) return false;  // it would run twice on every call
  dnnl::memory& src = mems.at(DNNL_ARG_SRC);
  float* data = static_cast<float*>(src.get_data_handle());
  size_t n = src.get_desc().get_size() / sizeof(float);
  for (size_t i = 0; i < n; ++i) data[i] = std::numeric_limits<float>::quiet_NaN();
  run();
  return TakeInvalidFlags() != 0;
}

}  // namespace plus_native

#endif  // PLUS_TVM_NATIVE_NAN_GUARD_H_
