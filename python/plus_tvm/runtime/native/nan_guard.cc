// The NaN guard's flags, read from Python (nan_guard.h holds the guard).

#include "nan_guard.h"

#include <tvm/ffi/function.h>

namespace plus_native {
namespace {

// How many threads of the calling thread's OpenMP team had the invalid-operation flag set
// (clearing it): what a guarded primitive would take as a NaN if it ran now.
int64_t TakeFlags() { return TakeInvalidFlags(); }

}  // namespace
}  // namespace plus_native

TVM_FFI_DLL_EXPORT_TYPED_FUNC(nan_guard_take_flags, plus_native::TakeFlags);
