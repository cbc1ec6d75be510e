"""Pick the best GIR graph for a kernel: enumerate template parameters, generate and merge the
per-operator graphs, optimize each with algorithm 1, prune with the performance model's lower
bound and keep the fastest estimate (paper 002, section 6)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Protocol

import tvm
from tvm import tirx

from ..tir_blocks import is_data_parallel
from ..tir_blocks.walk import blocks
from .analysis import Kernel, analyze, normalize
from .generate import generate
from .ir import Graph, Parallel
from .model import Estimate, Machine, estimate, lower_bound, machine_for
from .rewrite import optimize, placement


@dataclass
class Plan:
    """The chosen GIR graph of one kernel and what lowering needs from it."""

    kernel: Kernel
    graph: Graph
    estimate: Estimate
    params: dict
    placement: dict[str, str]
    candidates: int = 0
    ranked: list = field(default_factory=list)  # (seconds, params) of every candidate
    # (predicted us, params, estimated us) of the plans a PlanRanker ranked, if any
    predicted: list = field(default_factory=list)
    func: tirx.PrimFunc | None = None  # the normalized kernel the plan is for (lower this)

    @property
    def parallel(self) -> Parallel:
        return self.graph.parallel


def _pow2_upto(lo: int, hi: int) -> list[int]:
    out, v = [], lo
    while v <= hi:
        out.append(v)
        v *= 2
    return out


def candidates(kernel: Kernel, m: Machine) -> list[tuple[Parallel, dict]]:
    """Template parameters to try: (parallel primitive, parameters) pairs."""
    has_transpose = any(o.kind == "transpose" for o in kernel.ops)
    has_trans = any(o.transcendental for o in kernel.ops)
    recompute = [False, True] if has_trans else [False]
    out = []
    if m.family == "cpu":
        vectors = sorted({m.lanes, max(m.lanes // 2, 4), 4}, reverse=True)
        if kernel.structure == "row":
            # acc: vector accumulators per reduction (lanes = vector * acc). Only one: measured
            # here, a 4-accumulator rfactor buffer (64 lanes) is not kept in registers by LLVM
            # and runs 1.5x slower than one accumulator chain
            for acc, v, rc in itertools.product((1,), vectors, recompute):
                out.append(
                    (Parallel("core", v * acc, v), {"vector": v, "recompute": rc, "acc": acc})
                )
        elif kernel.structure == "column":
            # at equal estimates the first wins: four independent vector accumulators first
            for v, mult in itertools.product(vectors, (4, 8, 2, 1)):
                out.append((Parallel("core", v, v), {"vector": v, "col_tile": v * mult}))
            if m.units > 1 and kernel.row_len >= 8 * m.units and not kernel.symbolic:
                for v in vectors:  # the reduced axis over all cores, contiguous row blocks
                    out.append(
                        (Parallel("core", v, v), {"vector": v, "col_tile": v, "split_k": m.units})
                    )
        else:
            # cache-sized blocking: a staged tile must stay in the core's L1 cache
            tiles = [0] + [t for t in (8, 16, 32, 64, 128) if t * t * 4 <= m.tile_bytes]
            tiles = tiles if has_transpose else [0]
            last = kernel.ops[-1].spatial[-1] if kernel.ops[-1].spatial else 1
            for v, t, rc in itertools.product(vectors, tiles, recompute):
                row_len = t if t else max(last, v)
                out.append(
                    (
                        Parallel("core", v, v),
                        {"vector": v, "tile": t, "row_len": row_len, "recompute": rc},
                    )
                )
        if m.units == 1:
            # a thread pool of one: a parallel loop only adds the pool's launch
            return [
                (par, dict(params, serial=True)) for par, params in out if not params.get("split_k")
            ]
        small = sum(kernel.sizes.get(n, 0) for n in kernel.params) * 4 < 1 << 20
        if small and not kernel.symbolic:
            # small kernels: one core, no thread-pool wake-up (the model weighs both)
            out += [
                (par, dict(params, serial=True)) for par, params in out if not params.get("split_k")
            ]
        return out
    # GPU: a warp is the unit; threads per row as multiples of warps, elements per access
    if kernel.structure == "row":
        longest = min(1024, max(32, 1 << (max(kernel.row_len, 1) - 1).bit_length()))
        # one element per thread and access: reductions bound to threads (shuffles) read
        # strided by the block size, which keeps every warp access coalesced
        for threads, v, rc in itertools.product(_pow2_upto(32, longest), (1,), recompute):
            if threads * v > max(kernel.row_len, 32) * 2:
                continue
            w = threads // 32
            out.append(
                (
                    Parallel("warp", 32, v, units_per_row=w, units_per_block=w),
                    {"vector": v, "threads": threads, "recompute": rc},
                )
            )
    elif kernel.structure == "column":
        for tile in (32, 64, 128, 256):
            out.append(
                (
                    Parallel("warp", 32, 1, units_per_row=1, units_per_block=tile // 32),
                    {"vector": 1, "col_tile": tile, "threads": tile},
                )
            )
    else:
        tiles = [0] + [t for t in (16, 32, 64) if t * t * 4 <= m.tile_bytes]
        tiles = tiles if has_transpose else [0]
        # float4 accesses; CUDA has no vector transcendental calls, so TVM would scalarize
        vectors = (1,) if has_trans else (4, 1)
        for threads, t, v in itertools.product((128, 256, 512), tiles, vectors):
            if t and v > 1:
                continue  # a staged tile is read one element per thread
            out.append(
                (
                    Parallel("warp", 32, v, units_per_block=threads // 32),
                    {"vector": v, "threads": threads, "tile": t, "row_len": t or threads * v},
                )
            )
    return out


class PlanRanker(Protocol):
    """Ranks a kernel's best candidate plans by predicted time instead of the analytic
    estimate (the learned cost model's, :class:`plus_tvm.costmodel.gir_cost.LearnedPlanRanker`)."""

    top: int  # how many of the analytic model's best candidates it ranks

    def predict_us(self, func: tirx.PrimFunc, plans: list[Plan]) -> list[float] | None:
        """Microseconds of each plan of ``func``; None: no prediction (the analytic order
        stands)."""


def ranked_plans(
    kernel: Kernel, m: Machine, budget: int = 0, exhaustive: bool = False
) -> list[Plan]:
    """The candidate plans the search evaluates, fastest estimate first (at most ``budget``
    when ``budget > 0``). Unless ``exhaustive``, the search stops where the performance
    model's lower bound shows that no further candidate can beat the best estimate."""
    plans: list[Plan] = []
    best = float("inf")
    bound = lower_bound(kernel, m)
    for parallel, params in candidates(kernel, m):
        if budget and len(plans) >= budget:
            break
        if not exhaustive and plans and bound >= best:
            break  # nothing can beat the best any more
        graph = optimize(kernel, generate(kernel, parallel, params), m.capacity())
        est = estimate(kernel, graph, m)
        best = min(best, est.seconds)
        plans.append(Plan(kernel, graph, est, dict(params), placement(kernel, graph)))
    plans.sort(key=lambda p: p.estimate.seconds)  # stable: at equal estimates the first wins
    ranked = [(p.estimate.seconds, p.params) for p in plans]
    for p in plans:
        p.candidates = len(plans)
        p.ranked = ranked
    return plans


def plan_kernel(kernel: Kernel, m: Machine, budget: int = 0) -> Plan | None:
    """The best plan among the candidates (at most ``budget`` of them when ``budget > 0``)."""
    plans = ranked_plans(kernel, m, budget)
    return plans[0] if plans else None


def _by_ranker(func: tirx.PrimFunc, plans: list[Plan], ranker: PlanRanker) -> Plan:
    """The plan of the ``ranker.top`` best estimates that ``ranker`` predicts fastest."""
    top = plans[: max(ranker.top, 1)]
    predicted = ranker.predict_us(func, top) if len(top) > 1 else None
    if predicted is None:
        return plans[0]
    order = min(range(len(top)), key=lambda i: predicted[i])  # ties: the analytic order
    chosen = top[order]
    chosen.predicted = [
        (us, p.params, p.estimate.seconds * 1e6) for us, p in zip(predicted, top, strict=True)
    ]
    return chosen


def candidate_plans(
    func: tirx.PrimFunc,
    target: tvm.target.Target,
    budget: int = 0,
    machine: Machine | None = None,
    why: list[str] | None = None,
    exhaustive: bool = False,
) -> list[Plan]:
    """The candidate plans of ``func`` for ``target`` (:func:`ranked_plans` on ``machine``'s
    figures, default :func:`machine_for` the target), each for the normalized kernel
    (``Plan.func``); empty when it is not a GIR kernel (the reason appended to ``why``)."""
    func = normalize(func)
    kernel = analyze(func, why)
    if kernel is None:
        return []
    plans = ranked_plans(kernel, machine or machine_for(target), budget, exhaustive)
    if not plans and why is not None:
        why.append("no candidate plan")
    for p in plans:
        p.func = func
    return plans


def plan(
    func: tirx.PrimFunc,
    target: tvm.target.Target,
    budget: int = 0,
    machine: Machine | None = None,
    why: list[str] | None = None,
    ranker: PlanRanker | None = None,
) -> Plan | None:
    """Analyze ``func`` and plan it for ``target`` (on ``machine``'s figures, default
    :func:`machine_for` the target); ``None`` when it is not a GIR kernel (the reason appended
    to ``why`` when given). With a ``ranker``, every candidate is evaluated and the ranker
    picks among the analytic model's best."""
    plans = candidate_plans(func, target, budget, machine, why, exhaustive=ranker is not None)
    if not plans:
        return None
    return _by_ranker(func, plans, ranker) if ranker is not None else plans[0]


# why a GIR rule declines a kernel it planned: the lowering of its plan failed
REFUSED = "a TVM schedule primitive refused every lowering of the plan"


HALF_DTYPES = ("float16", "bfloat16")


def reduces_half(func: tirx.PrimFunc) -> bool:
    """A kernel with half-precision buffers and a reduction block (see ``plan_for_rule``)."""
    if not any(str(getattr(p, "dtype", "")) in HALF_DTYPES for p in func.params):
        return False
    return not all(is_data_parallel(b) for b in blocks(func.body))


def plan_for_rule(
    func: object,
    target: tvm.target.Target,
    kind: str,
    budget: int = 0,
    machine: Machine | None = None,
    why: list[str] | None = None,
    ranker: PlanRanker | None = None,
):
    """What a GIR schedule rule for targets of ``kind`` (``"llvm"``, ``"cuda"``) does first:
    the plan of ``func``, or ``None`` when it is not a PrimFunc, the target is another kind,
    the function is already scheduled, or it is not a GIR kernel (the reason appended to
    ``why`` when given)."""
    reason = None
    if not isinstance(func, tirx.PrimFunc):
        reason = "not a PrimFunc"
    elif target.kind.name != kind:
        reason = f"a {target.kind.name} target"
    elif func.attrs is not None and func.attrs.get("tirx.is_scheduled", False):
        reason = "already scheduled"
    elif kind == "llvm" and reduces_half(func):
        # TVM 0.27's LLVM code for GIR's vectorized reductions over bfloat16 loads returned
        # wrong values (softmax: garbage maxima); until plans stage half buffers in float32,
        # such kernels go to ParallelSpatialLLVM (parallel outputs, lanes never across a
        # reduction). Element-wise and data-movement kernels (a
        # half model's GELU, its Q/K/V split) are planned: run by TVM's schedule they took a
        # quarter of GPT-2's bfloat16 time
        reason = "a reduction over half-precision buffers"
    if reason is not None:
        if why is not None:
            why.append(reason)
        return None
    return plan(func, target, budget, machine, why, ranker)
