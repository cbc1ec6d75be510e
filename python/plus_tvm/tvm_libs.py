"""Which of TVM's libraries this process has: the compiler too, or the runtime alone.

A deployed model needs only TVM's runtime library (``libtvm_runtime``, a few MB); the compiler
library (``libtvm_compiler``, about 260 MB with LLVM) is needed to compile. TVM falls back to the
runtime alone when the compiler library is missing or cannot load, or when
``TVM_USE_RUNTIME_LIB=1``; :func:`plus_tvm.load` and the library kernels work there, and the
compiler-side API says clearly that it is not available (:mod:`plus_tvm`).

A model compiled for CUDA on a machine without a CUDA driver carries its kernels as CUDA source
(TVM's fallback module), compiled by the ``tvm_callback_cuda_compile`` hook when the library is
loaded on a GPU. TVM's hook asks the compiler library for the current target, so on the runtime
alone it fails; :func:`load_runtime_sidecars` registers one that compiles for the GPU at hand.
"""

from __future__ import annotations

from pathlib import Path

import tvm
from tvm_ffi.libinfo import load_lib_ctypes

from . import env

# TVM's runtime sidecars: device runtimes (CUDA modules, streams, CUDA-graph builtins) and extra
# VM builtins. TVM loads them at import only when its compiler library loaded too.
_SIDECARS = ("tvm_runtime_cuda", "tvm_runtime_extra")


def compiler_available() -> bool:
    """Whether TVM's compiler library is loaded in this process."""
    return not tvm.base._RUNTIME_ONLY


def load_runtime_sidecars() -> list[str]:
    """Load TVM's runtime sidecar libraries when TVM itself did not (runtime-only mode).

    Returns the names of those that could not load (a machine without a CUDA driver cannot load
    the CUDA runtime: CUDA devices then report that they do not exist, as in a full TVM).
    """
    if compiler_available():
        return []
    loaded = tvm.base._LOADED_LIBS
    runtime_dir = Path(loaded["tvm_runtime"]._name).resolve().parent
    missing = []
    for name in _SIDECARS:
        if name in loaded:
            continue
        try:
            loaded[name] = load_lib_ctypes(
                package="tvm", target_name=name, extra_lib_paths=[runtime_dir], mode="RTLD_LOCAL"
            )
        except (OSError, RuntimeError):  # not shipped, or its driver library is absent
            missing.append(name)
    if "tvm_runtime_cuda" in loaded:
        _register_cuda_jit()
    return missing


def _register_cuda_jit() -> None:
    """Compile CUDA source at load for device 0's architecture, without the compiler library
    (NVRTC by default, or nvcc with ``TVM_CUDA_COMPILE_MODE=nvcc``, as TVM's own hook)."""
    import tvm_ffi
    from tvm.support import nvcc  # registers TVM's hook, replaced below

    def compile_for_this_gpu(code: str) -> bytes:
        arch = "sm_" + tvm.cuda(0).compute_version.replace(".", "")
        mode = env.cuda_compile_mode()
        fmt = "fatbin" if mode == "nvcc" else "cubin"
        return nvcc.compile_cuda(code, target_format=fmt, arch=arch, compiler=mode)

    tvm_ffi.register_global_func("tvm_callback_cuda_compile", compile_for_this_gpu, override=True)
