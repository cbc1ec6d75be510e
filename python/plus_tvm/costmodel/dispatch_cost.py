"""Library call or TIR? A roofline-style prediction per matched subgraph.

The work of a subgraph is read off its +Graph: every ``dot`` loop contributes two flops per
point of its loop nest; the bytes are those of the library call's tensors. A library call
costs its VM -> library crossing plus its work at the throughput its kernel declares
(``LibraryKernel.cpu_gflops`` / ``cuda_gflops``); the TIR alternative costs the same work at the
throughput of
the kernels the rest of the pipeline generates (``tir_gflops`` / ``tir_gbps``: untuned CPU TIR
reaches well under 1 GFLOP/s on a GEMM). The dispatcher keeps TIR when it is predicted faster:
tiny GEMMs, where the crossing dominates.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..plusgraph import PlusGraph, PlusLoop

_ARITH = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


def size_value(size: int | str, values: Mapping[str, int]) -> int | None:
    """A +Loop or tensor size (an int, or a symbolic expression as text: ``4*s70*16``) with
    the symbolic sizes in ``values`` put in; None when it names another or is not plain
    integer arithmetic."""
    if isinstance(size, int):
        return size
    try:
        tree = ast.parse(str(size).replace(" ", ""), mode="eval").body
    except SyntaxError:
        return None

    def value(node: ast.AST) -> int | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            return values.get(node.id)
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITH:
            a, b = value(node.left), value(node.right)
            if a is None or b is None or (b == 0 and type(node.op) in (ast.FloorDiv, ast.Mod)):
                return None
            return _ARITH[type(node.op)](a, b)
        return None

    return value(tree)


def work_of(graph: PlusGraph, sizes: Mapping[str, int] | None = None) -> float | None:
    """Flops of the ``dot`` loops of ``graph``, symbolic sizes taken from ``sizes``; None when
    a size is symbolic and not in ``sizes``."""
    total = 0.0

    def walk(loop: PlusLoop, extent: float) -> bool:
        nonlocal total
        size = size_value(loop.size, sizes or {})
        if size is None:
            return False
        extent *= size
        if "dot" in loop.ops:
            total += 2.0 * extent
        return all(walk(c, extent) for c in loop.children)

    if not all(walk(r, 1.0) for r in graph.roots):
        return None
    return total


@dataclass(frozen=True)
class DispatchCost:
    """Throughput figures of both sides (defaults: this project's 2-core CPU measurements)."""

    overhead_us: float = 10.0  # VM -> Python -> oneDNN crossing, 4x4 linear: 11.2-11.7 us
    # VM -> C++ (runtime/native) -> oneDNN: about 1 us in the kernel around the primitive
    # (MobileNetV2: 0.93 us per call) plus the VM's dispatch and oneDNN's OpenMP region; a whole
    # one-linear model measured 3.5-3.7 us slower per call native than as one TIR kernel
    # (4x4 and 16x16 linears at 2 rows)
    native_overhead_us: float = 4.0
    # the library's throughput; None: each kernel's own figure (``LibraryKernel.cpu_gflops`` /
    # ``cuda_gflops``, declared with the kernel)
    library_gflops: float | None = None
    library_gbps: float = 10.0
    tir_gflops: float = 0.3  # untuned TIR GEMM (BERT's FFN: 67 s for 14.5 GFLOP)
    tir_gbps: float = 1.0  # unscheduled TIR row kernels; GIR schedules reach ~10
    # a TIR kernel's own launch: the VM's call, TVM's thread pool waking (2 cores: 2-4 us)
    tir_overhead_us: float = 2.0
    # the size each symbolic dimension is priced at (see ``at_sizes``); unpriced symbolic
    # subgraphs are assumed large (library)
    sizes: tuple[tuple[str, int], ...] = field(default=())

    def at_sizes(self, sizes: Mapping[str, int]) -> DispatchCost:
        """The same figures, pricing symbolic dimensions at ``sizes``."""
        return dataclasses.replace(self, sizes=tuple(sorted(sizes.items())))


def predict_library_us(
    cost: DispatchCost,
    flops: float,
    nbytes: float,
    native: bool = False,
    kernel_gflops: float = 400.0,
) -> float:
    """``native``: the call runs in a native kernel (no Python crossing); ``kernel_gflops``:
    the kernel's declared throughput, used unless ``cost.library_gflops`` overrides it."""
    overhead = cost.native_overhead_us if native else cost.overhead_us
    gflops = cost.library_gflops if cost.library_gflops is not None else kernel_gflops
    return overhead + max(flops / (gflops * 1e3), nbytes / (cost.library_gbps * 1e3))


def predict_tir_us(cost: DispatchCost, flops: float, nbytes: float) -> float:
    work = max(flops / (cost.tir_gflops * 1e3), nbytes / (cost.tir_gbps * 1e3))
    return cost.tir_overhead_us + work


@dataclass(frozen=True)
class LearnedDispatchCost:
    """The library-vs-TIR choice priced by a learned model (``Options.cost_model="learned"``):
    a call at the model's library time, the TIR alternative at that time times the model's
    predicted TIR / library ratio of the choice (without a choice regressor: its time of the
    subgraph's operators, each legalized alone; vectors as ``PlusDispatch`` describes them for
    its machine). A subgraph the model cannot describe (a symbolic size without a declared
    range) is priced by ``fallback``."""

    model: object  # LearnedCostModel
    fallback: DispatchCost = field(default_factory=DispatchCost)
    sizes: tuple[tuple[str, int], ...] = field(default=())

    def at_sizes(self, sizes: Mapping[str, int]) -> LearnedDispatchCost:
        return dataclasses.replace(
            self,
            sizes=tuple(sorted(sizes.items())),
            fallback=self.fallback.at_sizes(sizes),
        )


def vector_prices(
    cost: DispatchCost, vector: Mapping[str, object], kernel_gflops: float
) -> tuple[float, float]:
    """The analytic library and TIR microseconds of a call, its work and operand bytes read
    back from its learned-model vector (``features.library_features``)."""
    flops = 2.0 ** float(vector["flops"]) - 1.0
    nbytes = 2.0 ** float(vector["bytes_in"]) - 1.0
    library = predict_library_us(cost, flops, nbytes, bool(vector["native"]), kernel_gflops)
    return library, predict_tir_us(cost, flops, nbytes)


def analytic_ratio(cost: DispatchCost, vector: Mapping[str, object], kernel_gflops: float) -> float:
    """``log2`` of :func:`vector_prices`' TIR time over its library time: the figure the
    learned choice regressor starts from."""
    library, tir = vector_prices(cost, vector, kernel_gflops)
    return math.log2(tir / library)
