"""plus_tvm: an extension of Apache TVM's Relax flow.

Public API (DESIGN.md section 3): :func:`from_torch`, :func:`from_onnx`, :class:`Options`,
:func:`pipeline` (also ``relax.get_pipeline("plus")``), :func:`compile` returning a
:class:`CompiledModel`, :func:`inspect`, and :func:`load` for exported models.
"""

from __future__ import annotations

from .threads import configure_tvm_pool

configure_tvm_pool()  # before TVM's pool starts: no pinning, every core (plus_tvm.threads)

from . import runtime as runtime  # registers library kernels
from ._version import __version__
from .compiler import CompiledModel, InputSpec, compile, inspect, load
from .errors import (
    InputError,
    ModelLoadError,
    OptionsError,
    PlusError,
    TargetError,
    UnknownModelError,
    UnsupportedOperatorError,
)
from .frontend import from_onnx, from_torch
from .mapping import MapPattern
from .options import Options
from .pipeline import pipeline

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
    "from_onnx",
    "from_torch",
    "inspect",
    "load",
    "pipeline",
]
