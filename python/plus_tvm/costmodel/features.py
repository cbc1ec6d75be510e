"""What the learned cost model sees of a kernel: fixed-order feature vectors read off the shared
TIR analysis (:mod:`plus_tvm.tir_blocks`) and off a library call's operands.

A **TIR kernel** is described before scheduling (the PrimFunc a decision sees: an operator
legalized alone, or a fused group), together with the schedule setting it will get (``gir``)
and the machine it runs on (vector lanes, threads). A **library call** is described by its
kernel, its work (the ``dot`` flops of its +Graph) and its operands' sizes. Magnitudes enter as
``log2(1 + x)``: kernel times span five orders of magnitude and trees split on ratios.

Each vector is a plain dict in the order of :data:`TIR_FEATURES` / :data:`LIBRARY_FEATURES`;
both lists are stored with a trained model, so a model never reads a vector built in another
order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import tvm
from tvm import tirx

from ..tir_blocks import block_infos, blocks, count_ops, gathers, written_params
from .dispatch_cost import size_value

#: reduction kinds, as ordinal codes (0: the kernel reduces nothing)
REDUCTIONS = ("", "reduceSum", "reduceMax", "reduceMin", "reduceProd", "dot")

TIR_FEATURES = (
    "flops",  # arithmetic operations of the stored values times their loop points
    "transcendental",  # exp / tanh / erf / ... times their loop points
    "points",  # iteration points of all blocks
    "bytes_in",  # bytes of the parameters the kernel reads
    "bytes_out",  # bytes of the parameters it writes
    "bytes_local",  # bytes of the buffers it allocates between its blocks
    "blocks",
    "reduction_blocks",
    "reduce_extent",  # largest product of one block's reduction extents
    "spatial_extent",  # largest product of one block's spatial extents
    "inner_extent",  # extent of the innermost loop of the last block (vectorization)
    "reduction",  # code of the heaviest reduction kind (REDUCTIONS)
    "gather",  # some load's index reads memory
    "intensity",  # flops per byte of parameters
    "gir",  # the pipeline schedules memory kernels (GIR / ParallelSpatial) or leaves them
    "lanes",  # fp32 vector lanes of the target
    "threads",  # TVM's thread pool
)

LIBRARY_FEATURES = (
    "kernel",  # position of the kernel's name in the model's ``kernels`` list (-1: unknown)
    "flops",
    "reduce",  # flops per output element over two: a GEMM's K, a convolution's C*kh*kw/groups
    "bytes_in",
    "bytes_out",
    "inputs",  # tensor operands
    "out_rows",  # output elements over its last dimension
    "out_cols",  # the output's last dimension
    "intensity",
    "native",  # runs in the C++ kernels (no Python crossing)
    "threads",
)


@dataclass(frozen=True)
class KernelContext:
    """What a vector says of where the kernel runs: the schedule setting of memory kernels
    (``gir``), fp32 vector lanes and TVM's threads."""

    gir: bool
    lanes: int
    threads: int


def _log(x: float) -> float:
    return math.log2(1.0 + max(float(x), 0.0))


def _static(extent: object, sizes: Mapping[str, int]) -> int | None:
    if isinstance(extent, tirx.IntImm):
        return int(extent)
    return size_value(str(extent), sizes)


def _numel(shape: Sequence, sizes: Mapping[str, int]) -> int | None:
    n = 1
    for dim in shape:
        value = _static(dim, sizes)
        if value is None:
            return None
        n *= value
    return n


def _bytes(buffer: object, sizes: Mapping[str, int]) -> int | None:
    n = _numel(buffer.shape, sizes)
    return None if n is None else n * tvm.runtime.DataType(str(buffer.dtype)).bits // 8


def tir_features(
    func: tirx.PrimFunc,
    *,
    gir: bool,
    lanes: int,
    threads: int,
    sizes: Mapping[str, int] | None = None,
) -> dict[str, float] | None:
    """The feature vector of an unscheduled PrimFunc, symbolic extents taken from ``sizes``;
    None when an extent stays symbolic or the function has no block that stores."""
    sizes = sizes or {}
    infos = block_infos(func)
    if not infos:
        return None
    flops = trans = points = 0.0
    reduce_extent = spatial_extent = 0
    reduction = 0
    reduction_blocks = 0
    gather = False
    for info in infos:
        spatial = reduce = 1
        for iv, reduces in zip(info.loops, info.reduces, strict=True):
            extent = _static(iv.dom.extent, sizes)
            if extent is None:
                return None
            if reduces:
                reduce *= extent
            else:
                spatial *= extent
        ops = tr = 0
        for store in info.stores:
            o, t = count_ops(store.value, indices=False)
            ops, tr = ops + o, tr + t
            gather = gather or gathers(store.value)
            if info.accumulates or reduce > 1:
                code = REDUCTIONS.index(info.reduction_op(store))
                reduction = max(reduction, code)
        if reduce > 1:
            reduction_blocks += 1
        block_points = spatial * reduce
        points += block_points
        flops += ops * block_points
        trans += tr * block_points
        reduce_extent = max(reduce_extent, reduce)
        spatial_extent = max(spatial_extent, spatial)
    last = infos[-1].loops
    inner = _static(last[-1].dom.extent, sizes) if last else 1
    written = written_params(func)
    bytes_in = bytes_out = 0
    for k, param in enumerate(func.params):
        buffer = param.ty  # a buffer parameter's type carries its shape and dtype
        if not hasattr(buffer, "shape"):
            continue
        size = _bytes(buffer, sizes)
        if size is None:
            return None
        if k in written:
            bytes_out += size
        else:
            bytes_in += size
    local = 0
    for block in blocks(func.body):
        for buffer in block.alloc_buffers:
            size = _bytes(buffer, sizes)
            local += size or 0
    values = {
        "flops": _log(flops),
        "transcendental": _log(trans),
        "points": _log(points),
        "bytes_in": _log(bytes_in),
        "bytes_out": _log(bytes_out),
        "bytes_local": _log(local),
        "blocks": float(len(infos)),
        "reduction_blocks": float(reduction_blocks),
        "reduce_extent": _log(reduce_extent),
        "spatial_extent": _log(spatial_extent),
        "inner_extent": _log(inner or 1),
        "reduction": float(reduction),
        "gather": float(gather),
        "intensity": flops / max(bytes_in + bytes_out, 1),
        "gir": float(gir),
        "lanes": float(lanes),
        "threads": float(threads),
    }
    return {name: values[name] for name in TIR_FEATURES}


def library_features(
    kernel: str,
    flops: float,
    inputs: Sequence[tuple[Sequence[int], str]],
    output: tuple[Sequence[int], str],
    *,
    native: bool,
    threads: int,
) -> dict[str, object]:
    """The feature vector of one library call: ``inputs`` and ``output`` as (static shape,
    dtype). The kernel stays a name here; the model maps it to its position."""

    def nbytes(shape: Sequence[int], dtype: str) -> int:
        return math.prod(shape) * tvm.runtime.DataType(dtype).bits // 8

    bytes_in = sum(nbytes(s, d) for s, d in inputs)
    out_shape, out_dtype = output
    bytes_out = nbytes(out_shape, out_dtype)
    cols = out_shape[-1] if out_shape else 1
    return {
        "kernel": kernel,
        "flops": _log(flops),
        "reduce": _log(flops / 2 / max(math.prod(out_shape), 1)),
        "bytes_in": _log(bytes_in),
        "bytes_out": _log(bytes_out),
        "inputs": float(len(inputs)),
        "out_rows": _log(math.prod(out_shape) // max(cols, 1)),
        "out_cols": _log(cols),
        "intensity": flops / max(bytes_in + bytes_out, 1),
        "native": float(native),
        "threads": float(threads),
    }


SUBGRAPH_FEATURES = (
    "flops",  # summed over the operators
    "transcendental",
    "points",
    "bytes_in",  # the operators' inputs, intermediates included
    "bytes_out",  # the last operator's output
    "members",
    "reduce_extent",  # largest over the operators
    "spatial_extent",
    "reduction",
    "gather",
    "intensity",
    "gir",
    "lanes",
    "threads",
)


def amount(vector: Mapping[str, float], name: str) -> float:
    """A ``log2(1 + x)`` magnitude of ``vector`` back as ``x``."""
    return 2.0 ** vector[name] - 1.0


def subgraph_features(members: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """One vector for a subgraph's operators (each legalized alone, :func:`tir_features`): the
    TIR side of a library-vs-TIR choice, which the pipeline fuses into fewer kernels than
    operators (so a sum of per-operator predictions misprices it)."""

    def total(name: str) -> float:
        return _log(sum(amount(m, name) for m in members))

    first, last = members[0], members[-1]
    flops = sum(amount(m, "flops") for m in members)
    bytes_in = sum(amount(m, "bytes_in") for m in members)
    values = {
        "flops": _log(flops),
        "transcendental": total("transcendental"),
        "points": total("points"),
        "bytes_in": _log(bytes_in),
        "bytes_out": last["bytes_out"],
        "members": float(len(members)),
        "reduce_extent": max(m["reduce_extent"] for m in members),
        "spatial_extent": max(m["spatial_extent"] for m in members),
        "reduction": max(m["reduction"] for m in members),
        "gather": max(m["gather"] for m in members),
        "intensity": flops / max(bytes_in + amount(last, "bytes_out"), 1.0),
        "gir": first["gir"],
        "lanes": first["lanes"],
        "threads": first["threads"],
    }
    return {name: values[name] for name in SUBGRAPH_FEATURES}


def fused_features(
    members: Sequence[Mapping[str, float]], read_inside: float, kept_inside: float
) -> dict[str, float]:
    """The TIR vector of the kernel that fuses ``members`` (in program order): ``read_inside``
    bytes of their inputs come from other members, and ``kept_inside`` bytes of their outputs
    are read only inside the group (intermediates of the fused kernel)."""

    def total(name: str) -> float:
        return sum(amount(m, name) for m in members)

    flops = total("flops")
    bytes_in = max(total("bytes_in") - read_inside, 0.0)
    bytes_out = max(total("bytes_out") - kept_inside, 0.0)
    values = {
        "flops": _log(flops),
        "transcendental": _log(total("transcendental")),
        "points": _log(total("points")),
        "bytes_in": _log(bytes_in),
        "bytes_out": _log(bytes_out),
        "bytes_local": _log(total("bytes_local") + kept_inside),
        "blocks": sum(m["blocks"] for m in members),
        "reduction_blocks": sum(m["reduction_blocks"] for m in members),
        "reduce_extent": max(m["reduce_extent"] for m in members),
        "spatial_extent": max(m["spatial_extent"] for m in members),
        "inner_extent": members[-1]["inner_extent"],
        "reduction": max(m["reduction"] for m in members),
        "gather": max(m["gather"] for m in members),
        "intensity": flops / max(bytes_in + bytes_out, 1.0),
        "gir": members[0]["gir"],
        "lanes": members[0]["lanes"],
        "threads": members[0]["threads"],
    }
    return {name: values[name] for name in TIR_FEATURES}


CHOICE_FEATURES = (
    *(f"library_{name}" for name in LIBRARY_FEATURES),
    *(f"subgraph_{name}" for name in SUBGRAPH_FEATURES),
    "analytic_ratio",  # log2 of the analytic constants' TIR time over their library time
)


def choice_features(
    library: Mapping[str, object], members: Sequence[Mapping[str, float]], analytic_ratio: float
) -> dict[str, object]:
    """One library-vs-TIR choice as a vector: the call's, its subgraph's, and what the
    analytic constants predict (the learned model corrects them where this machine
    disagrees). The library kernel stays a name, as in :func:`library_features`."""
    sub = subgraph_features(members)
    values: dict[str, object] = {f"library_{k}": v for k, v in library.items()}
    values.update({f"subgraph_{k}": v for k, v in sub.items()})
    values["analytic_ratio"] = analytic_ratio
    return {name: values[name] for name in CHOICE_FEATURES}


#: GIR's kernel structures (``plus_tvm.gir.analysis.Kernel.structure``), as ordinal codes
STRUCTURES = ("row", "column", "elementwise")

GIR_PLAN_FEATURES = (
    *TIR_FEATURES,  # the kernel before scheduling (``gir`` set)
    "structure",  # code of the kernel's structure (STRUCTURES)
    "vector",  # the plan's vector width
    "tile",  # a transpose's cache tile (0: none)
    "col_tile",  # adjacent outputs a column reduction keeps in registers (0: not a column)
    "split_k",  # cores sharing a column reduction's reduced axis (0: none)
    "recompute",  # transcendental intermediates recomputed instead of staged
    "serial",  # the plan runs on one core
    "estimate",  # log2(1 + the GIR performance model's microseconds)
)


def gir_plan_features(
    kernel_vector: Mapping[str, float], structure: str, params: Mapping[str, object], seconds: float
) -> dict[str, float]:
    """One GIR plan of a kernel as a vector: the kernel's TIR vector (:func:`tir_features`
    with ``gir=True``), the plan's template parameters and the analytic model's estimate
    ``seconds`` (the learned model corrects it where this machine disagrees)."""
    values = dict(kernel_vector)
    values.update(
        structure=float(STRUCTURES.index(structure)),
        vector=float(params.get("vector", 0)),
        tile=float(params.get("tile", 0)),
        col_tile=float(params.get("col_tile", 0)),
        split_k=float(params.get("split_k", 0)),
        recompute=float(bool(params.get("recompute"))),
        serial=float(bool(params.get("serial"))),
        estimate=_log(seconds * 1e6),
    )
    return {name: values[name] for name in GIR_PLAN_FEATURES}
