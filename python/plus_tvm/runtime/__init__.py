"""Library kernels reached through ``R.call_dps_packed`` (the Relax paper's call_dps_library).

Paper map: the library side of PluS's dispatch (paper 000; the warehouse entries name these
kernels, :mod:`plus_tvm.dispatch.binders` build their calls), and :mod:`.cuda_graph`, the
capture / replay runtime of PyGraph (paper 001) and the Relax paper's section 4.5.

Importing this package registers one TVM global function per kernel (the VM resolves names when
a ``VirtualMachine`` is built, so ``import plus_tvm`` does it). Every kernel follows::

    plus.<kernel>(*tensor_inputs, config: str, out)

with ``config`` as ``key=value`` pairs joined by ``;`` and optional tensor inputs present only
when their flag is set, in the order each kernel's module documents. One kernel per module: a
:class:`LibraryKernel` subclass declaring its name, config spec and cost, found by
:func:`_discover` (a new kernel file needs no table entry).

Weights are prepacked on first use and cached by identity (see :class:`PrepackCache`); a
weight mutated in place after its first call is not re-packed: call :func:`clear_caches`.
"""

from __future__ import annotations

import importlib
import pkgutil

import tvm_ffi

from ..threads import physical_cores
from . import cuda_graph, index_check, native, onnx_host, torch_host
from ._common import ConfigSpec, LibraryKernel, PrepackCache, to_torch
from .perf import call_overhead_us, library_gflops, library_time_us

# the runtime's own services
_NOT_KERNELS = frozenset(
    {"cpu_features", "cuda_graph", "index_check", "native", "onnx_host", "perf", "torch_host"}
)


def _discover() -> dict[str, LibraryKernel]:
    """One instance of every :class:`LibraryKernel` subclass defined in a module of this
    package (one kernel per file: a new kernel file needs no table entry), by kernel name."""
    kernels: dict[str, LibraryKernel] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_") or info.name in _NOT_KERNELS:
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for obj in vars(module).values():
            if (
                isinstance(obj, type)
                and issubclass(obj, LibraryKernel)
                and obj.__module__ == module.__name__
                and obj.name
            ):
                if obj.name in kernels:
                    raise RuntimeError(f"two library kernels named {obj.name}")
                kernels[obj.name] = obj()
    return kernels


KERNELS: dict[str, LibraryKernel] = _discover()


def register() -> None:
    """Register every kernel as a TVM global function (idempotent: re-registration overrides;
    a kernel with a native fast path in use keeps it)."""
    for name, kernel in KERNELS.items():
        tvm_ffi.register_global_func(name, native.installed(name) or kernel, override=True)
    cuda_graph.register()
    index_check.register()
    onnx_host.register()
    torch_host.register()


def use_native() -> bool:
    """Put the native kernels (``runtime/native``) in front of the Python ones, building them
    the first time on this machine; returns whether they are in use. Call before building a
    ``VirtualMachine`` for a CPU model (the VM resolves kernel names when it is built)."""
    return native.ensure(KERNELS)


def clear_caches() -> None:
    """Drop every prepacked weight (and the per-shape choices of ``plus.conv2d``).

    Call it after mutating weights in place, or to free the packed copies.
    """
    for kernel in KERNELS.values():
        kernel.clear()
    native.clear()


def forget_tensor(tensor: object) -> None:
    """Drop every cached form (packed, BatchNorm-folded) of ``tensor`` in every kernel.

    Called when a compiled model replaces a weight: the old buffer's packing must never be
    used again, and must not keep the old buffer alive.
    """
    ptr = to_torch(tensor).data_ptr()
    for kernel in KERNELS.values():
        kernel.forget(ptr)
    native.forget(ptr)


register()

__all__ = [
    "KERNELS",
    "ConfigSpec",
    "LibraryKernel",
    "PrepackCache",
    "call_overhead_us",
    "clear_caches",
    "forget_tensor",
    "library_gflops",
    "library_time_us",
    "native",
    "physical_cores",
    "register",
    "use_native",
]
