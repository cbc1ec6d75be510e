"""plus_tvm: an extension of Apache TVM's Relax flow.

Public API (DESIGN.md section 3): :func:`from_torch`, :func:`from_onnx`, :class:`Options`,
:func:`pipeline` (also ``relax.get_pipeline("plus")``), :func:`compile` returning a
:class:`CompiledModel`, :func:`inspect`, and :func:`load` for exported models.

With TVM's runtime library alone (a deployment: :mod:`plus_tvm.tvm_libs`) the runtime half is
here (:func:`load`, :class:`CompiledModel`, the library kernels of :mod:`plus_tvm.runtime`); the
compiler half raises :class:`PlusError` saying that TVM's compiler library is needed.
"""

from __future__ import annotations

from .threads import configure_tvm_pool

configure_tvm_pool()  # before TVM's pool starts: no pinning, every core (plus_tvm.threads)

from .tvm_libs import compiler_available, load_runtime_sidecars

load_runtime_sidecars()  # runtime-only TVM skips its CUDA runtime library: load it here

from . import fork_safety
from . import runtime as runtime  # registers library kernels

# a forked child runs models on one OpenMP thread, its kernels' plans made again, not hanging
fork_safety.register(runtime.clear_caches)
from ._version import __version__
from .compiled_model import CompiledModel, load
from .errors import (
    InputError,
    ModelLoadError,
    OptionsError,
    PlusError,
    TargetError,
    UnknownModelError,
    UnsupportedOperatorError,
)
from .lm.saved import export_lm, load_lm  # (runtime side: a saved CompiledLM)
from .options import Options
from .signature import InputSpec

# Names that need TVM's compiler library.
_COMPILER_API = ("MapPattern", "compile", "from_onnx", "from_torch", "inspect", "pipeline")

if compiler_available():
    from .compiler import compile, inspect
    from .frontend import from_onnx, from_torch
    from .lm import compile_lm as compile_lm
    from .mapping import MapPattern
    from .pipeline import pipeline
else:

    def __getattr__(name: str) -> object:
        if name in _COMPILER_API:
            raise PlusError(
                f"plus_tvm.{name} needs TVM's compiler library (libtvm_compiler), which is not "
                "loaded in this process (TVM runs on its runtime library alone: the library is "
                "absent, cannot load, or TVM_USE_RUNTIME_LIB=1). Compile where apache-tvm is "
                "fully installed and export_library(); plus_tvm.load() runs the result here."
            )
        raise AttributeError(f"module 'plus_tvm' has no attribute {name!r}")


__all__ = [
    "CompiledModel",
    "InputError",
    "InputSpec",
    "MapPattern",
    "ModelLoadError",
    "Options",
    "OptionsError",
    "PlusError",
    "TargetError",
    "UnknownModelError",
    "UnsupportedOperatorError",
    "__version__",
    "compile",
    "export_lm",
    "from_onnx",
    "from_torch",
    "inspect",
    "load",
    "load_lm",
    "pipeline",
]
