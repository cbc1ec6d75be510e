"""Cost figures the dispatcher uses to predict whether a library call beats a TIR kernel.

:func:`call_overhead_us` is the fixed cost of one ``R.call_dps_packed`` into these kernels
(VM -> Python -> DLPack -> torch), measured once per process; :func:`library_gflops` the
throughput of a kernel at a representative shape: a constant measured with
``scripts/bench_kernels.py`` and documented below, or, on request (``measure=True`` or
``PLUS_TVM_MEASURE_LIBRARY=1``), measured once per process on this CPU. The constant is the
default because a measurement on a shared machine can come out 10x low when another process
runs at the same moment (seen here), and a dispatch decision should not depend on that.
A call is predicted to take ``call_overhead_us() + flops / library_gflops(kernel, kind) / 1e3``
microseconds (:func:`library_time_us`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from .. import env
from ..errors import TVM_FAILURE, is_refusal
from ._common import LibraryKernel
from ._torch import torch
from .linear import LINEAR_SPEC

OVERHEAD_FALLBACK_US = 15.0
# the call whose overhead is measured: a plain 4x4 linear (the kernel's spec checks the keys)
OVERHEAD_CONFIG = LINEAR_SPEC.format({"w": "nk", "prepack": False})


def time_us(fn: Callable[[], object], runs: int, warmup: int = 5, best: bool = False) -> float:
    """Median (or, with ``best``, minimum) wall time of ``fn`` in microseconds.

    The minimum is what a throughput estimate wants on a shared machine: other processes only
    ever add time.
    """
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.min(times) if best else np.median(times)) * 1e6


class _Measurements:
    """Lazily measured, per-process figures."""

    def __init__(self) -> None:
        self.overhead: float | None = None
        self.gflops: dict[tuple[str, str], float] = {}

    def call_overhead_us(self) -> float:
        if self.overhead is None:
            try:
                self.overhead = _measure_overhead()
            except (*TVM_FAILURE, OSError) as err:  # no LLVM, a VM failure: the documented one
                if isinstance(err, TVM_FAILURE) and not is_refusal(err):
                    raise
                self.overhead = OVERHEAD_FALLBACK_US
        return self.overhead

    def library_gflops(self, kernel: str, target_kind: str, measure: bool) -> float:
        from . import KERNELS

        declared = KERNELS.get(kernel)
        if target_kind == "cuda":
            return declared.cuda_gflops if declared is not None else 1000.0
        table = declared.cpu_gflops if declared is not None else 10.0
        if not measure or declared is None or type(declared).probe is LibraryKernel.probe:
            return table
        key = (kernel, target_kind)
        if key not in self.gflops:
            try:
                self.gflops[key] = _measure_cpu_gflops(kernel)
            except (*TVM_FAILURE, OSError) as err:  # fails at run time too; keep the table
                if isinstance(err, TVM_FAILURE) and not is_refusal(err):
                    raise
                self.gflops[key] = table
        return self.gflops[key]


MEASURED = _Measurements()


def tiny_linear_module(n: int = 4):
    """A Relax module ``main(x, w) = plus.linear(x, w)`` on ``n x n`` float32."""
    import tvm
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, n), "float32"))
    w = relax.Var("w", relax.TensorType((n, n), "float32"))
    with bb.function("main", [x, w]):
        out = bb.emit(
            relax.call_dps_packed(
                LINEAR_SPEC.kernel,
                [x, w, tvm.ir.StringImm(OVERHEAD_CONFIG)],
                out_ty=relax.TensorType((n, n), "float32"),
            )
        )
        bb.emit_func_output(out)
    return bb.get()


def _measure_overhead() -> float:
    """Median VM call of a 4x4 ``plus.linear`` minus the same linear called in torch."""
    import tvm
    from tvm import relax

    from ..target import resolve_target
    from . import KERNELS

    exe = tvm.compile(tiny_linear_module(), target=resolve_target("llvm"))
    vm = relax.VirtualMachine(exe, tvm.cpu())
    xs = np.random.rand(4, 4).astype("float32")
    x, w = tvm.runtime.tensor(xs), tvm.runtime.tensor(xs)
    vm.set_input("main", x, w)
    tx, tw, tout = torch.from_numpy(xs), torch.from_numpy(xs), torch.empty(4, 4)
    kernel = KERNELS[LINEAR_SPEC.kernel]

    def through_vm() -> None:
        vm.invoke_stateful("main")

    def direct() -> None:
        kernel.run(kernel.spec.parse(OVERHEAD_CONFIG), (tx, tw), tout)

    # the lowest of several block medians: robust to other processes on a shared machine
    vm_us = min(time_us(through_vm, 100) for _ in range(5))
    direct_us = min(time_us(direct, 100) for _ in range(5))
    return max(vm_us - direct_us, 0.0)


def _measure_cpu_gflops(kernel: str) -> float:
    """Throughput of ``kernel`` on torch tensors at the shape its :meth:`probe` declares."""
    from . import KERNELS

    # a private instance, so that its packed weights do not mix with the registered kernel's
    k = type(KERNELS[kernel])()
    g = torch.Generator().manual_seed(0)
    inputs, config, out, flops = k.probe(lambda *shape: torch.randn(*shape, generator=g))
    cfg = k.spec.parse(config)
    # the lowest of several block minima, spread out so that one busy moment does not decide
    seconds = (
        min(time_us(lambda: k.run(cfg, inputs, out), 5, warmup=2, best=True) for _ in range(5))
        / 1e6
    )
    return flops / seconds / 1e9


def call_overhead_us() -> float:
    """Fixed cost in microseconds of one VM call into a ``plus.*`` library kernel.

    Measured once per process, on first use (compiles a one-call Relax function, about a
    second): the median VM invocation of ``plus.linear`` on 4x4 minus the median of the same
    kernel body called directly on torch tensors.

    Returns
    -------
    float
        Microseconds per call; 15.0 if the measurement cannot run.
    """
    return MEASURED.call_overhead_us()


def library_gflops(kernel: str, target_kind: str = "llvm", measure: bool | None = None) -> float:
    """Expected throughput of a library kernel, in GFLOP/s.

    Parameters
    ----------
    kernel : str
        A ``plus.*`` kernel name (unknown names get a low default).
    target_kind : str
        ``"llvm"`` or ``"cuda"`` (a documented constant; nothing is measured on CUDA).
    measure : bool, optional
        On ``llvm``, measure the GEMM-like kernels once per process at a BERT-base or
        ResNet-50 shape (about 0.1 s) instead of returning the documented constant. Defaults
        to the environment variable ``PLUS_TVM_MEASURE_LIBRARY=1``.

    Returns
    -------
    float
        GFLOP/s.
    """
    if measure is None:
        measure = env.measure_library()
    return MEASURED.library_gflops(kernel, target_kind, measure)


def library_time_us(kernel: str, flops: float, target_kind: str = "llvm") -> float:
    """Predicted time of one library call, for comparing against a TIR kernel's estimate.

    Parameters
    ----------
    kernel : str
        The ``plus.*`` kernel name.
    flops : float
        Floating-point operations of the call (``2*M*K*N`` for a GEMM).
    target_kind : str
        ``"llvm"`` or ``"cuda"``.

    Returns
    -------
    float
        ``call_overhead_us() + flops / library_gflops(kernel, target_kind) / 1e3``
        microseconds (the overhead is the CPU-side crossing; on CUDA it overlaps with device
        work unless the call is on the critical path).
    """
    return call_overhead_us() + flops / library_gflops(kernel, target_kind) / 1e3
