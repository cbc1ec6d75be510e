"""GIRCUDA: memory-intensive kernels on CUDA through a GIR plan (paper 002, section 7).

The parallel unit of GIR is the warp; the plan chooses how many warps share one row
(``threads = 32 * units_per_row``) and where each intermediate lives. Lowering to TensorIR:

- rows -> ``blockIdx.x``; the threads of a row -> ``threadIdx.x`` with a strided
  (coalesced) split: thread ``t`` touches elements ``t, t + threads, ...``;
- a reduce gOperator with its WARP/BLOCK synchronizations -> a reduction loop bound to
  ``threadIdx.x``, which TVM lowers to warp shuffles (``__shfl_down_sync``) plus one shared
  memory exchange between warps;
- slices raised to CACHE -> ``shared`` buffers (row results, staged intermediates); an input
  that read-after-read merging staged -> ``cache_read`` into shared memory, loaded once;
- element-wise kernels -> one flat ``blockIdx.x x threadIdx.x`` loop; a transpose with a
  ``tile`` parameter is blocked ``tile x tile`` per thread block, staged through shared
  memory so both its global read and its global write are coalesced;
- column reductions -> one thread per output column, walking the reduced axis.

Whatever the rule declines goes to dlight's rules, which follow it in the pipeline.
"""

from __future__ import annotations

import tvm
from plus_tvm import interrupt
from plus_tvm.errors import TVM_REFUSAL
from plus_tvm.gir.lowering import permuted_reads
from plus_tvm.gir.model import Machine
from plus_tvm.gir.search import REFUSED, Plan, plan_for_rule
from tvm import s_tir, tirx

from .reasoned_rule import ReasonedRule


class GIRCUDA(ReasonedRule):
    """GIR schedules for CUDA targets.

    Parameters
    ----------
    budget : int
        Most GIR candidates the search evaluates per kernel (0: all).
    machine : plus_tvm.gir.model.Machine, optional
        The performance model's figures (default: ``machine_for`` the target when applied).
    """

    def __init__(self, budget: int = 0, machine: Machine | None = None) -> None:
        self.budget = budget
        self.machine = machine

    def apply_with_reason(self, func: tirx.PrimFunc, target: tvm.target.Target):
        """The schedule, or ``None`` and why (from the same analysis: ``ApplyScheduleRules``
        reports the reason as ``schedule.declined_because``)."""
        why: list[str] = []
        p = plan_for_rule(func, target, "cuda", self.budget, self.machine, why)
        if p is None:
            return None, why[0] if why else "no GIR plan"
        try:
            return lower(p.func or func, p), None
        except TVM_REFUSAL:  # a primitive refused: dlight's rules take it
            interrupt.check()
            return None, REFUSED


def _spatial(sch: s_tir.Schedule, block) -> bool:
    return all(int(iv.iter_type) == 0 for iv in sch.get(block).iter_vars)


def lower(func: tirx.PrimFunc, p: Plan) -> s_tir.Schedule:
    sch = s_tir.Schedule(func)
    k = p.kernel
    if k.structure == "row":
        _lower_row(sch, p)
    elif k.structure == "column":
        _lower_column(sch, p)
    else:
        _lower_elementwise(sch, p)
    return sch


def _inline(sch: s_tir.Schedule, p: Plan) -> None:
    for op in reversed(p.kernel.ops):
        if op.kind == "reduce" or op.output_is_param:
            continue
        if op.shared or p.placement.get(op.output, "inline") == "inline":
            sch.compute_inline(sch.get_sblock(op.block))


def _thread_split(sch: s_tir.Schedule, loops, threads: int):
    """Fuse ``loops`` and split them so ``threadIdx.x`` strides over the elements."""
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    outer, tx = sch.split(fused, [None, threads])
    sch.reorder(tx, outer)
    sch.bind(tx, "threadIdx.x")
    return outer


def _lower_row(sch: s_tir.Schedule, p: Plan) -> None:
    k = p.kernel
    shared = {o.output for o in p.kernel.ops if o.shared}  # inlined weights, whatever the plan
    if any(w == "global" and t not in shared for t, w in p.placement.items()):
        raise ValueError("a materialized intermediate needs a second kernel")
    threads = p.params["threads"]
    lead = k.num_leading
    _inline(sch, p)
    root = sch.get_sblock("root")
    all_blocks = sch.get_child_blocks(root)
    blocks = [b for b in all_blocks if sch.get(b).name_hint not in k.copies]
    outputs = {sch.get(b).name_hint for b in sch.get_output_blocks(root)} - set(k.copies)
    # one output: the last block carries the kernel and the rest is computed under it;
    # several (a residual sum beside its LayerNorm): the first block must be an output, and
    # the others follow it under its loop -- TensorIR moves no output under another's loop
    first = len(outputs) > 1
    out = blocks[0] if first else blocks[-1]
    if sch.get(out).name_hint not in outputs:
        raise ValueError("no output block to carry the kernel")
    staged_inputs = [b for b, where in p.placement.items() if where == "cache" and b in k.params]
    loops = sch.get_loops(out)
    bx = sch.fuse(*loops[:lead]) if lead > 1 else loops[0]
    sch.bind(bx, "blockIdx.x")
    if len(loops) > lead:
        _thread_split(sch, loops[lead:], threads)
    else:
        _, tx = sch.split(sch.add_unit_loop(out), [None, 1])
        sch.bind(tx, "threadIdx.x")
    others = blocks[1:] if first else list(reversed(blocks[:-1]))
    for brv in others:
        if sch.get(brv).name_hint not in outputs:  # outputs stay in global memory
            for i, _ in enumerate(sch.get(brv).writes):
                sch.set_scope(brv, i, "shared")
        if first:
            sch.reverse_compute_at(brv, bx, preserve_unit_loops=True)
        else:
            sch.compute_at(brv, bx, preserve_unit_loops=True)
        inner = sch.get_loops(brv)[1:]
        if _spatial(sch, brv):
            inner = [lp for lp in inner if _extent(sch, lp) != 1] or inner
        if inner:
            _thread_split(sch, inner, threads)
    for brv in all_blocks:  # layout copies of an output: stored by the same threads
        if sch.get(brv).name_hint in k.copies:
            sch.reverse_compute_at(brv, bx, preserve_unit_loops=True)
            inner = [lp for lp in sch.get_loops(brv)[1:] if _extent(sch, lp) != 1]
            if inner:
                _thread_split(sch, inner, threads)
    for name in staged_inputs:
        _stage_input(sch, name, bx, threads)


def _extent(sch: s_tir.Schedule, loop) -> int | None:
    ext = sch.get(loop).extent
    return int(ext) if isinstance(ext, tirx.IntImm) else None


def _stage_input(sch: s_tir.Schedule, name: str, bx, threads: int) -> None:
    """Read-after-read merging staged input ``name``: load its row into shared memory once."""
    readers = []
    for brv in sch.get_child_blocks(bx):
        for i, region in enumerate(sch.get(brv).reads):
            if region.source.name == name.split("#")[0]:
                readers.append((brv, i))
                break
    if len(readers) < 2:
        return
    first, index = readers[0]
    cache = sch.cache_read(first, index, "shared", consumer_blocks=[b for b, _ in readers])
    sch.compute_at(cache, bx, preserve_unit_loops=True)
    loops = sch.get_loops(cache)[1:]
    if loops:
        _thread_split(sch, loops, threads)


def _lower_column(sch: s_tir.Schedule, p: Plan) -> None:
    k = p.kernel
    red = next(o for o in k.ops if o.kind == "reduce")
    if any(k.depends(o.block, red.block) for o in k.ops if o.block != red.block):
        raise ValueError("column epilogues are left to dlight")
    _inline(sch, p)
    block = sch.get_sblock(red.block)
    loops = sch.get_loops(block)
    ns = red.dom.count("S")
    col = sch.fuse(*loops[:ns]) if ns > 1 else loops[0]
    bx, tx = sch.split(col, [None, p.params["col_tile"]])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")


def _lower_elementwise(sch: s_tir.Schedule, p: Plan) -> None:
    threads = p.params["threads"]
    tile = p.params.get("tile", 0)
    _inline(sch, p)
    for brv in sch.get_child_blocks(sch.get_sblock("root")):
        loops = sch.get_loops(brv)
        exts = [_extent(sch, lp) for lp in loops]
        permuted = permuted_reads(sch.get(brv))
        if (
            tile
            and permuted
            and len(loops) >= 2
            and all(e is not None and e % tile == 0 for e in exts[-2:])
        ):
            io, ii = sch.split(loops[-2], [None, tile])
            jo, ji = sch.split(loops[-1], [None, tile])
            sch.reorder(io, jo, ii, ji)
            bx = sch.fuse(*loops[:-2], io, jo)
            sch.bind(bx, "blockIdx.x")
            cache = sch.cache_read(brv, permuted[0], "shared")
            sch.compute_at(cache, bx, preserve_unit_loops=True)
            _thread_split(sch, [ii, ji], min(threads, tile * tile))
            _thread_split(sch, sch.get_loops(cache)[1:], min(threads, tile * tile))
            continue
        vector = p.params.get("vector", 1)
        last = exts[-1] if exts else None
        if vector > 1 and last is not None and last % vector == 0:
            # vector accesses (float4): each thread moves ``vector`` adjacent elements of the
            # innermost axis, so the access stays provably contiguous
            outer, vec = sch.split(loops[-1], [None, vector])
            fused = sch.fuse(*loops[:-1], outer) if len(loops) > 1 else outer
            bx, tx = sch.split(fused, [None, threads])
            sch.vectorize(vec)
        else:
            fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
            bx, tx = sch.split(fused, [None, threads])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
