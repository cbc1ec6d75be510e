// Reads the version counters of many torch tensors in one pass (../../compiled_model.py's
// _Followed: has a weight the model copied changed in place since it was copied?).
//
// Python's ``t._version`` costs about 0.7 us per tensor right after a model ran (a getattr, a
// virtual call and three cold pointers per tensor, one tensor after the other); MobileNetV2's
// 314 followed tensors took 150-250 us a call, 3-5% of its run. Here the loop has no Python in it
// and the out-of-order core overlaps the misses of neighbouring tensors: 35-40 us.
//
// Built apart from plus_native.so (that library has no torch dependency; this one needs torch's
// and Python's headers), loaded with ctypes.PyDLL: called holding the GIL.

#include <Python.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>

extern "C" {

// The position of the first tensor in ``tensors`` (a list of torch.Tensor, checked by the caller)
// whose version differs from ``seen[i]``; -1 when none did, -2 when ``tensors`` is not a list.
// A tensor without a version counter (an inference tensor) reads as version 0.
__attribute__((visibility("default"))) int64_t plus_first_changed(PyObject* tensors,
                                                                  const uint64_t* seen) {
  if (!PyList_Check(tensors)) return -2;
  Py_ssize_t n = PyList_GET_SIZE(tensors);
  for (Py_ssize_t i = 0; i < n; ++i) {
    const at::Tensor& tensor = THPVariable_Unpack(PyList_GET_ITEM(tensors, i));
    const c10::VariableVersion& counter = tensor.unsafeGetTensorImpl()->version_counter();
    uint64_t version = counter.enabled() ? counter.current_version() : 0;
    if (version != seen[i]) return i;
  }
  return -1;
}

}  // extern "C"
