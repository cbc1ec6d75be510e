"""GIRLLVM: memory-intensive kernels on CPU through a GIR plan (paper 002, lowered to TensorIR).

The rule plans the kernel with :func:`plus_tvm.gir.plan` (templates, algorithm 1, performance
model) and realises the chosen graph as an ``s_tir.Schedule``:

- the parallel primitive becomes a ``parallel`` loop over rows (a CPU core is the unit);
- gOperator merging decides where each intermediate lives: ``inline`` (merged away, computed in
  registers where it is used: ``compute_inline``), ``reg``/``cache`` (a row-local buffer:
  ``compute_at`` under the row loop, so it never reaches memory) or ``global`` (not fused);
- a reduction becomes one partial per SIMD lane (``rfactor`` over the vector lanes, a
  vectorized loop) followed by the lane-crossing combine, the WARP-scope synchronization of the
  graph; row results stay in registers;
- element-wise gOperators become vectorized loops of the plan's vector width; a transpose is
  blocked in ``tile x tile`` blocks that stay in cache (the CACHE slice of its template);
- column reductions keep ``col_tile`` adjacent outputs in vector registers while walking the
  reduced axis.

Float32 ``exp``/``sigmoid`` are mapped to vectorizable arithmetic first
(:func:`plus_tvm.gir.lowering.vectorizable_math`). The rule declines (returns ``None``) what it
does not plan, and tries a plainer lowering of the same plan before giving up.
"""

from __future__ import annotations

import tvm
from plus_tvm import interrupt
from plus_tvm.errors import TVM_REFUSAL
from plus_tvm.gir.lowering import permuted_reads, staged_blocks, vectorizable_math
from plus_tvm.gir.model import Machine
from plus_tvm.gir.search import REFUSED, Plan, PlanRanker, plan_for_rule
from plus_tvm.tir_blocks import walk_expr
from plus_tvm.tir_blocks.rebuild import tvm_structural_equal
from tvm import s_tir, tirx

from .reasoned_rule import ReasonedRule, with_note


class GIRLLVM(ReasonedRule):
    """GIR schedules for llvm targets.

    Parameters
    ----------
    budget : int
        Most GIR candidates the search evaluates per kernel (0: all).
    fast_math : bool
        Map float32 ``exp``/``sigmoid`` to vectorizable polynomials.
    machine : plus_tvm.gir.model.Machine, optional
        The performance model's figures (default: ``machine_for`` the target when applied).
    ranker : plus_tvm.gir.search.PlanRanker, optional
        Picks among the performance model's best plans by predicted time (the learned cost
        model's ``LearnedPlanRanker``); default: the performance model's best.
    """

    def __init__(
        self,
        budget: int = 0,
        fast_math: bool = True,
        machine: Machine | None = None,
        ranker: PlanRanker | None = None,
    ):
        self.budget = budget
        self.fast_math = fast_math
        self.machine = machine
        self.ranker = ranker

    def apply_with_reason(self, func: tirx.PrimFunc, target: tvm.target.Target):
        """The schedule, or ``None`` and why (from the same analysis: ``ApplyScheduleRules``
        reports the reason as ``schedule.declined_because``)."""
        why: list[str] = []
        p = plan_for_rule(func, target, "llvm", self.budget, self.machine, why, self.ranker)
        if p is None:
            return None, why[0] if why else "no GIR plan"
        sch = self.lower_plan(func, p)
        if sch is None:
            return None, REFUSED
        if p.predicted:  # a ranker chose: its predictions beside the performance model's
            sch = with_note(
                sch,
                {
                    "gir_plan": p.params,
                    "ranked_by": "learned",
                    "plans": [
                        {
                            "params": params,
                            "predicted_us": round(us, 3),
                            "estimate_us": round(estimate_us, 3),
                        }
                        for us, params, estimate_us in p.predicted
                    ],
                },
            )
        return sch, None

    def lower_plan(self, func: tirx.PrimFunc, p: Plan) -> s_tir.Schedule | None:
        """The schedule of plan ``p`` of ``func``: the most vectorized lowering TVM's schedule
        primitives accept, or ``None`` when they refuse every one."""
        # TVM's vectorizer emits int8 vectors into bool buffers (a dtype mismatch): kernels
        # touching booleans keep the plan's parallel structure but no vectors
        levels = (0,) if _touches_bool(func) else (2, 1, 0)
        for level in levels:
            try:
                return lower(p.func or func, p, level, self.fast_math)
            except TVM_REFUSAL:  # a primitive refused: try a plainer lowering
                interrupt.check()
                continue
        return None


def _touches_bool(func: tirx.PrimFunc) -> bool:
    sch = s_tir.Schedule(func)
    buffers = [p for p in func.params if hasattr(p.ty, "shape")]
    buffers += list(sch.get(sch.get_sblock("root")).alloc_buffers)
    return any("bool" in str(getattr(b.ty, "dtype", "")) for b in buffers)


def _extent(sch: s_tir.Schedule, loop) -> int | None:
    ext = sch.get(loop).extent
    return int(ext) if isinstance(ext, tirx.IntImm) else None


def _vector_split(sch: s_tir.Schedule, loop, vector: int, allow_tail: bool):
    """Split ``loop`` so its inner part is a vector of ``vector`` lanes (or the largest power
    of two dividing a constant extent); returns (outer, inner) or None."""
    ext = _extent(sch, loop)
    lanes = vector
    if ext is not None:
        if ext <= vector:
            return (None, loop) if ext >= 2 else None
        while lanes >= 2 and ext % lanes:
            lanes //= 2
        if lanes < 2:
            if not allow_tail:
                return None
            lanes = vector
    elif not allow_tail:
        return None
    outer, inner = sch.split(loop, [None, lanes])
    return outer, inner


def _vectorize_inner(sch: s_tir.Schedule, block, first_inner: int, vector: int, level: int):
    loops = sch.get_loops(block)[first_inner:]
    if not loops or level == 0:
        return
    inner = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    split = _vector_split(sch, inner, vector, allow_tail=level >= 2)
    if split is not None:
        sch.vectorize(split[1])


def lower(func: tirx.PrimFunc, p: Plan, level: int = 2, fast_math: bool = True):
    """The schedule of plan ``p``: level 2 vectorizes everything (tails predicated), 1 only
    exact vectors, 0 keeps the parallel structure and placement but no vectors."""
    sch = s_tir.Schedule(func)
    math = fast_math and level > 0
    k = p.kernel
    if k.structure == "row":
        _lower_row(sch, p, level, math)
    elif k.structure == "column":
        _lower_column(sch, p, level, math)
    else:
        _lower_elementwise(sch, p, level, math)
    return sch


def _inline_spatial(
    sch: s_tir.Schedule, p: Plan, keep: set[str], math: bool, stage: bool = True
) -> set[str]:
    """Inline, last first, the spatial intermediates that the GIR graph merged away, then
    (``math``) map the merged expressions' functions to vector arithmetic: after inlining,
    so the mapping sees how deep the functions of a chain nest. With ``math`` and ``stage``,
    the intermediates whose inlining would nest those functions stay (``staged_blocks``) for
    the caller to compute next to their consumers; returns their names."""
    k = p.kernel
    merged = [
        op.block
        for op in k.ops
        if op.kind != "reduce"
        and not op.output_is_param
        and not op.shared
        and op.block not in keep
        and p.placement.get(op.output, "inline") == "inline"
    ]
    staged = staged_blocks(sch, merged) if math and stage else set()
    for op in reversed(k.ops):
        if op.kind == "reduce" or op.output_is_param or op.block in keep | staged:
            continue
        if op.shared or p.placement.get(op.output, "inline") == "inline":
            sch.compute_inline(sch.get_sblock(op.block))
    if math:
        vectorizable_math(sch)
    return staged


def _lower_row(sch: s_tir.Schedule, p: Plan, level: int, math: bool) -> None:
    k = p.kernel
    vector = p.params["vector"]
    shared = {o.output for o in p.kernel.ops if o.shared}  # inlined weights, whatever the plan
    if any(w == "global" and t not in shared for t, w in p.placement.items()):
        raise ValueError("a row kernel with a materialized intermediate is not fused here")
    _inline_spatial(sch, p, set(), math)
    lead = k.num_leading
    rfactored = []
    for op in k.ops:
        if op.kind != "reduce":
            continue
        block = sch.get_sblock(op.block)
        _merge_unit_loops(sch, block, lead)
        loops = sch.get_loops(block)
        red = loops[lead:]
        r = sch.fuse(*red) if len(red) > 1 else red[0]
        if level == 0:
            continue
        # lanes must divide the row: a predicated tail inside a vectorized rfactor block
        # reads past the row (TVM does not mask it), so odd and symbolic rows stay scalar
        split = _vector_split(sch, r, vector * p.params.get("acc", 1), allow_tail=False)
        if split is None or split[0] is None:
            continue
        rf = sch.rfactor(split[1], 0)
        rfactored.append(rf)
    out, first = _anchor(sch, set(k.copies))
    loops = sch.get_loops(out)
    row = sch.fuse(*loops[:lead]) if lead > 1 else loops[0]
    _parallel(sch, p, row)
    if _spatial(sch, out):
        _vectorize_inner(sch, out, 1, vector, level)
    all_blocks = sch.get_child_blocks(sch.get_sblock("root"))
    blocks = [b for b in all_blocks if sch.get(b).name_hint not in k.copies]
    if first:  # several outputs: the first is the anchor, the rest follow it row by row
        for brv in blocks[1:]:
            sch.reverse_compute_at(brv, row, preserve_unit_loops=False)
    else:
        for brv in reversed(blocks[:-1]):
            sch.compute_at(brv, row, preserve_unit_loops=False)
    for brv in all_blocks:  # layout copies of an output: stored from the same row loop
        if sch.get(brv).name_hint in k.copies:
            sch.reverse_compute_at(brv, row, preserve_unit_loops=False)
    rf_names = {sch.get(b).name_hint for b in rfactored}
    for brv in sch.get_child_blocks(row):
        name = sch.get(brv).name_hint
        loops = sch.get_loops(brv)
        if name in rf_names:
            # loops (row, lane, chunk) -> (row, chunk, lane): one partial per vector lane
            sch.reorder(loops[-1], loops[-2])
            sch.vectorize(sch.get_loops(brv)[-1])
        elif _spatial(sch, brv) and len(loops) > 1:
            _vectorize_inner(sch, brv, 1, vector, level)


def _merge_unit_loops(sch: s_tir.Schedule, block, lead: int) -> None:
    """Fuse the unit-extent spatial loops that follow the ``lead`` row loops of a reduction
    (``keepdims``) into the last row loop, so only reduced loops follow the rows."""
    loops = sch.get_loops(block)
    ivs = sch.get(block).iter_vars
    units = []
    for pos in range(lead, min(len(loops), len(ivs))):
        if int(ivs[pos].iter_type) != 0:
            break
        if _extent(sch, loops[pos]) != 1:
            raise ValueError("a spatial loop of extent above one after the rows")
        units.append(loops[pos])
    if units:
        sch.fuse(loops[lead - 1], *units)


def _anchor(sch: s_tir.Schedule, copies: set):
    """The block whose row loop carries the kernel, and whether it is the first block.

    One output: the last block, everything else is computed under its row loop. Several
    outputs (a residual sum returned beside its LayerNorm): TensorIR moves no output block
    under another block's loop, so the first block must be the first output, and the other
    blocks follow it under its row loop (``reverse_compute_at``) -- one kernel writes every
    output."""
    root = sch.get_sblock("root")
    blocks = [b for b in sch.get_child_blocks(root) if sch.get(b).name_hint not in copies]
    outputs = {sch.get(b).name_hint for b in sch.get_output_blocks(root)} - copies
    if len(outputs) == 1:
        if sch.get(blocks[-1]).name_hint not in outputs:
            raise ValueError("the last block does not write the output")
        return blocks[-1], False
    if sch.get(blocks[0]).name_hint not in outputs:
        raise ValueError("several outputs, and the first block is not one of them")
    return blocks[0], True


def _parallel(sch: s_tir.Schedule, p: Plan, loop) -> None:
    """The parallel primitive: a parallel loop over cores, unless the plan runs on one core."""
    if not p.params.get("serial"):
        sch.parallel(loop)


def _flat(block: s_tir.SBlock) -> bool:
    """Whether every load of ``block`` uses the store's own indices and nothing branches on
    an index: then the loop nest is one contiguous stream and can be fused and vectorized.
    A select counts too, even on values only (the clamp of a fast ``exp``): three nested
    ``exp`` on 512x1024 ran in 0.59 ms as a kept nest that LLVM vectorizes, 1.37 ms fused
    and vectorized by TensorIR."""
    store = block.body
    if not isinstance(store, tirx.BufferStore):
        return False
    found = []

    def visit(node: object) -> None:
        if isinstance(node, tvm.ir.TensorLoad):
            same = len(node.indices) == len(store.indices) and all(
                tvm_structural_equal(a, b) for a, b in zip(node.indices, store.indices)
            )
            if not same:
                found.append(node)
        elif isinstance(node, tirx.Select) or (
            isinstance(node, tvm.ir.Call)
            and isinstance(node.op, tvm.ir.Op)
            and node.op.name.endswith("if_then_else")
        ):
            found.append(node)

    walk_expr(store.value, visit)
    return not found


def _spatial(sch: s_tir.Schedule, block) -> bool:
    return all(int(iv.iter_type) == 0 for iv in sch.get(block).iter_vars)


def _lower_column(sch: s_tir.Schedule, p: Plan, level: int, math: bool) -> None:
    k = p.kernel
    red_op = next(o for o in k.ops if o.kind == "reduce")
    keep = {o.block for o in k.ops if k.depends(o.block, red_op.block)}
    _inline_spatial(sch, p, keep, math, stage=False)  # a kept producer would stay unscheduled
    block = sch.get_sblock(red_op.block)
    loops = sch.get_loops(block)
    ns = red_op.dom.count("S")
    col_extents = [_extent(sch, lp) for lp in loops[:ns]]  # the output axes, before fusing
    col = sch.fuse(*loops[:ns]) if ns > 1 else loops[0]
    red = loops[ns:]
    r = sch.fuse(*red) if len(red) > 1 else red[0]
    if p.params.get("split_k"):
        # multi-unit template: every core reduces a contiguous block of rows into a partial
        # per column (rfactor over the unit axis), then the partials are reduced per column
        ko, ki = sch.split(r, [p.params["split_k"], None])
        rf = sch.rfactor(ko, 0)
        rl = sch.get_loops(rf)  # (col, unit, row-in-block)
        sch.reorder(rl[1], rl[2], rl[0])
        sch.parallel(rl[1])  # split_k is never serial
        if level > 0:
            split = _vector_split(sch, rl[0], 4 * p.params["vector"], allow_tail=level >= 2)
            rows = _extent(sch, rl[2])
            if split is not None and split[0] is not None and rows and rows % 8 == 0:
                # 8 rows at a time per tile of columns: the tile's partials stay in vector
                # registers for 8 rows, and 8 row streams move along together
                ro, ri = sch.split(rl[2], [None, 8])
                sch.reorder(ro, split[0], ri, split[1])
                sch.unroll(ri)
            if split is not None:
                sch.vectorize(split[1])
        loops = sch.get_loops(block)  # (col, unit)
        col, r = loops[0], loops[1]
    tile = _box_tile(p.params.get("col_tile", p.params["vector"]), col_extents)
    ext = _extent(sch, col)
    if tile is None or (ext is not None and ext <= tile):
        outer, inner = None, col
    else:
        outer, inner = sch.split(col, [None, tile])
    sch.reorder(*([outer] if outer is not None else []), r, inner)
    if outer is not None:
        _parallel(sch, p, outer)
        # the tile's accumulators stay in registers while the reduced axis is walked
        acc = sch.cache_write(block, 0, "local")
        sch.reverse_compute_at(acc, outer, preserve_unit_loops=False)
    if level > 0 and _extent(sch, inner) is not None:  # LLVM vectorizes constant extents only
        if ext is None or tile is None or ext % min(tile, ext) == 0 or level >= 2:
            sch.vectorize(inner)
    # epilogues (a mean's division) follow the tile of columns they read; placed before the
    # accumulators' store is split into vectors: TensorIR sizes an epilogue by the region its
    # producer's loops cover, ignoring their tail predicate (a 125-column tile stored in 8 x 16
    # lanes gave the epilogue 128 columns, three of them the next tile's, read from another
    # core before it wrote them: wrong results, a race)
    epilogues = [
        sch.get_sblock(op.block)
        for op in k.ops
        if op.block != red_op.block and k.depends(op.block, red_op.block)
    ]
    if outer is not None:
        for epi in epilogues:  # all placed first, each after the one it reads
            sch.reverse_compute_at(epi, outer, preserve_unit_loops=True)
    for epi in epilogues:
        _vectorize_inner(sch, epi, 1 if outer is not None else 0, p.params["vector"], level)
    if outer is not None and level > 0:
        _vectorize_inner(sch, acc, 1, p.params["vector"], level)


def _box_tile(tile: int, extents: list) -> int | None:
    """The largest column tile up to ``tile`` whose columns form a box of the fused output
    axes (``extents``, outer to inner): a divisor of the innermost extent, or whole rows of it
    times a divisor of the next one, and so on. Only then is the region that a tile's
    accumulator write-back and epilogues cover exact; any other tile makes TensorIR
    over-approximate it and the results are wrong (found by the differential test: a mean
    over the middle axis of 8x8x5, a max under a transpose). ``None``: symbolic extents."""
    if len(extents) <= 1:
        return tile
    if any(e is None for e in extents):
        return None
    best, suffix = 1, 1
    for e in reversed(extents):
        for d in range(1, min(e, tile // suffix) + 1):
            if e % d == 0:
                best = max(best, suffix * d)
        suffix *= e
    return best


def _lower_elementwise(sch: s_tir.Schedule, p: Plan, level: int, math: bool) -> None:
    vector = p.params["vector"]
    tile = p.params.get("tile", 0)
    staged = _inline_spatial(sch, p, set(), math)
    anchors: dict[str, tuple] = {}  # block -> (loop its staged producers go under, vectorize)
    for brv in sch.get_child_blocks(sch.get_sblock("root")):
        if sch.get(brv).name_hint in staged:
            continue
        anchors[sch.get(brv).name_hint] = _schedule_elementwise(sch, p, brv, level, vector, tile)
    _compute_staged(sch, staged, anchors, vector, level)


def _schedule_elementwise(sch: s_tir.Schedule, p: Plan, brv, level: int, vector: int, tile: int):
    """Schedule one output block; returns (its outer loop, whether its inner loops are
    vectorized by TensorIR)."""
    loops = sch.get_loops(brv)
    exts = [_extent(sch, lp) for lp in loops]
    if tile and len(loops) >= 2 and all(e is not None and e >= tile for e in exts[-2:]):
        io, ii = sch.split(loops[-2], [None, tile])
        jo, ji = sch.split(loops[-1], [None, tile])
        sch.reorder(io, jo, ii, ji)
        outer = sch.fuse(*loops[:-2], io, jo)
        _parallel(sch, p, outer)
        # the template's CACHE slice: the transposed input's tile, read with contiguous
        # (vector) loads into a core-local buffer, then read transposed from L1
        for index in reversed(permuted_reads(sch.get(brv))):
            staged = sch.cache_read(brv, index, "local")
            sch.compute_at(staged, outer, preserve_unit_loops=False)
            if level > 0:
                _vectorize_inner(sch, staged, len(sch.get_loops(staged)) - 1, vector, level)
        if level > 0 and tile >= 2:
            split = _vector_split(sch, ji, vector, allow_tail=level >= 2)
            if split is not None:
                sch.vectorize(split[1])
        return outer, level > 0
    # a vector must not straddle two rows of the innermost axis, or the indices of the
    # fused loop stay divisions per lane (a 56-wide row in 16 lanes: 8x slower; narrower
    # vectors, 28-wide rows in 4 lanes: 3x slower than LLVM's own vectorization of the nest)
    odd_rows = exts[-1] is not None and exts[-1] % vector != 0
    if len(loops) > 1 and (odd_rows or not _flat(sch.get(brv))):
        # a pad's bounds test, a broadcast operand or an odd row: fusing every loop would
        # turn their indices into divisions per element (measured 25x slower on a pad).
        # The nest is kept: the outer loops run in parallel, the innermost is left to
        # LLVM's vectorizer (a conditional load does not vectorize in TensorIR)
        outer = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
        _parallel(sch, p, outer)
        return outer, False
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    if level > 0:
        split = _vector_split(sch, fused, vector, allow_tail=level >= 2)
        if split is not None and split[0] is not None:
            outer, inner = split
            _parallel(sch, p, outer)
            sch.vectorize(inner)
            return outer, True
    _parallel(sch, p, fused)
    return fused, False


def _compute_staged(
    sch: s_tir.Schedule, staged: set[str], anchors: dict, vector: int, level: int
) -> None:
    """Compute each staged intermediate under its consumer's outer loop, into a local
    buffer of the few vectors (or the row) that one iteration reads, consumers first."""
    blocks = [b for b in sch.get_child_blocks(sch.get_sblock("root"))]
    for brv in reversed(blocks):
        name = sch.get(brv).name_hint
        if name not in staged:
            continue
        consumers = [sch.get(c).name_hint for c in sch.get_consumers(brv)]
        anchor = next((anchors[c] for c in consumers if c in anchors), None)
        if anchor is None:
            raise ValueError(f"no scheduled consumer of the staged block {name}")
        loop, vectorized = anchor
        sch.compute_at(brv, loop, preserve_unit_loops=False)
        sch.set_scope(brv, 0, "local")
        anchors[name] = anchor
        if vectorized:
            at = sch.get(loop)
            depth = 1 + next(
                i for i, lp in enumerate(sch.get_loops(brv)) if sch.get(lp).same_as(at)
            )
            _vectorize_inner(sch, brv, depth, vector, level)
