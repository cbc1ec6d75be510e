// Linears of one to eight rows (a decode step's) streamed at the memory's speed on AVX2 + FMA
// CPUs, bfloat16 and float32; gemv.cc holds the why and the how.
#ifndef PLUS_TVM_NATIVE_GEMV_H_
#define PLUS_TVM_NATIVE_GEMV_H_

#include <tvm/ffi/function.h>

namespace plus_native {

// Whether the native plus.linear (a kernel whose dtypes include bfloat16 when
// ``native_bf16``) hands its bfloat16 calls of one to eight rows to HalfGemvLinear: on CPUs
// without bfloat16 GEMM instructions, unless a test or benchmark forced the answer
// (``gemv_half_force``).
bool HalfGemvWanted(bool native_bf16);

// Runs a ``plus.linear`` call (its packed arguments: ``x, w_1..w_P, [b_1..b_P], [residual],
// config, out``; runtime/linear.py) as a bfloat16 GEMV when it is one this file computes: every
// tensor bfloat16, dense, on the CPU, x of one to eight rows, a config it reads, an AVX2 + FMA
// CPU. Returns false, having written nothing, for any other call.
bool HalfGemvLinear(tvm::ffi::PackedArgs args);

// The same for a ``plus.linear_layernorm`` call (``x, w, [bias], [residual], [gamma], [beta],
// config, out, [sum_out]``; runtime/linear_layernorm.py): the GEMV's sum rounded to bfloat16
// (into ``sum_out`` when the call has it), then its layer normalization in float32, rounded.
bool HalfGemvLinearNorm(tvm::ffi::PackedArgs args);

// A float32 ``plus.linear`` (``norm`` false) or ``plus.linear_layernorm`` call of two to eight
// rows (as ``gemv_float_force`` allows) run as the float32 GEMV; false, having written
// nothing, for any other call.
bool FloatGemvLinear(tvm::ffi::PackedArgs args, bool norm);

}  // namespace plus_native

#endif  // PLUS_TVM_NATIVE_GEMV_H_
