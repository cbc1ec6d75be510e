"""ParallelSpatialLLVM: the fallback for CPU kernels no GIR plan covers.

A fused kernel that GIR declines (a tiny contraction in front of a large element-wise block: a
squeeze-excite's expand convolution + sigmoid fused into the multiply that scales the
activation) would otherwise run every loop nest serially and unvectorized: 0.35 ms for the
112x112x32 scale of EfficientNet-B0's first block, where the same multiply scheduled takes
0.03 ms. First, blocks that only move data (a reshape, transpose, slice, concatenation or
negation: loads with at most ``MOVE_OPS`` cheap operations, every consumer data-parallel) are
inlined into their consumers, so that a chain like LLaMA's rotary embedding (reshape, transpose,
two slices, negate, concatenate, two multiplies and an add: nine full-size buffers) reads its
input once and writes its output once; nothing costly is recomputed. A kernel of element-wise
blocks alone with one output (a chain between two library calls under a prefill's symbolic
batch and length: GPT-2's written-out GELU, SwiGLU) goes further: every intermediate is inlined
into the output except a function's float32 argument or bfloat16-rounded result, which are
computed a row at a time inside the output's parallel loop, and ``exp`` / ``tanh`` / ``erf`` /
``sigmoid`` become vector arithmetic (``plus_tvm.gir.lowering.vectorizable_math``).

Then the large spatial blocks iterate in parallel: their leading loops are fused into one
``parallel`` loop over TVM's pool and, where the innermost loop's extent is a multiple of the
vector width, that loop is split and vectorized.

A large reduction block (GIR declines those over half-precision buffers: a bfloat16 model's
max-pool, its float32 softmax between casts, and windows read at an offset: every padded pool)
runs its spatial loops in parallel the same way; each output's reduction keeps its order, so
the result is bit for bit the serial one. Where its innermost spatial loop walks every buffer
contiguously (a channels-last pool's channel), that loop is split into vectors whose lanes
move inside the reduction loops: one lane per output, no reduction across lanes, each vector
of outputs set once and then updated in a register over the window. A padding block in front
of such a reduction (``if_then_else`` on the indices only, not on the channel) is inlined into
it rather than written out: ResNet's stem pool took 0.13 ms with the padded copy and 8 lanes,
0.065 with neither (ONNX Runtime: 0.066). A norm or softmax over rows (reductions along the
last axis in front of one element-wise output, as a prefill's LayerNorm, RMSNorm or softmax
between casts) instead runs a row at a time inside the output's parallel loop, each reduction
summed in vector lanes and then across them: its order changes, as in GIR's row kernels.
Vectors are as wide as the target's (16 float32 lanes on AVX-512), halved until they divide
the loop. Small blocks (below ``min_elements``) and already-scheduled kernels are left alone; a
kernel with no large block is declined (``None``).
"""

from __future__ import annotations

import math

import tvm
from plus_tvm.errors import TVM_REFUSAL
from plus_tvm.gir.lowering import has_math, vectorizable_math
from plus_tvm.gir.model import target_lanes
from plus_tvm.tir_blocks import (
    REDUCTION,
    SPATIAL,
    BlockInfo,
    count_ops,
    has_load,
    if_then_else,
    is_data_parallel,
    loads,
    nodes,
    stores,
)
from plus_tvm.tir_blocks.rebuild import simplify_indices, substitute
from tvm import s_tir, tirx

from .reasoned_rule import OPAQUE, ReasonedRule

# at most this many cheap operations (a negation, a select of a concatenation) per element in a
# block that counts as moving data; anything transcendental never does
MOVE_OPS = 2


class ParallelSpatialLLVM(ReasonedRule):
    """Parallel (and, where it divides, vectorized) spatial blocks for llvm targets.

    Parameters
    ----------
    min_elements : int
        Smallest block (points of its loop nest) worth a parallel launch.
    lanes : int, optional
        Vector width of the innermost loop, in elements; by default the target's vector width
        in the block's widest element type.
    min_parallel : int
        Leading loops are fused until their extent reaches this (or every loop but the last).
    min_static : int
        Smallest static part of a nest over two symbolic sizes or more worth scheduling.
    """

    def __init__(
        self,
        min_elements: int = 16384,
        lanes: int | None = None,
        min_parallel: int = 16,
        min_static: int = 256,
    ) -> None:
        self.min_elements = min_elements
        self.min_static = min_static
        self.lanes = lanes
        self.min_parallel = min_parallel

    def apply_with_reason(self, func: tirx.PrimFunc, target: tvm.target.Target):
        """The schedule, or ``None`` and why (``ApplyScheduleRules`` reports it)."""
        if target.kind.name != "llvm":
            return None, f"a {target.kind.name} target"
        # a fused reshape reads ``x[0, (j // d + i) % n, j % d]`` where it means ``x[0, i, j]``:
        # left so, the vectorized loop gathers element by element (a half model's Q/K/V split
        # took 17% of GPT-2's bfloat16 time)
        found = self.root_blocks(simplify_indices(func))
        if found is None:
            return None, OPAQUE
        sch, blocks = found
        vector_bits = 32 * target_lanes(target)
        if _fuse_elementwise(sch, blocks):
            blocks = sch.get_child_blocks(sch.get_sblock("root"))
            if len(blocks) > 1 and self._rows_of_output(sch, blocks, vector_bits):
                return sch, None
        elif self._inline_data_movement(sch, blocks):
            blocks = sch.get_child_blocks(sch.get_sblock("root"))
        if _row_kernel(sch, blocks) and self._rows_of_output(sch, blocks, vector_bits):
            return sch, None
        changed = False  # a large block runs parallel (inlining alone does not make it ours)
        for brv in blocks:
            try:
                changed |= self._schedule_block(sch, brv, vector_bits)
            except TVM_REFUSAL:  # a primitive refused this block: it keeps its loops
                continue
        if changed:
            return sch, None
        return None, (
            f"no block with a static loop nest of {self.min_elements} elements or more (or "
            "over two symbolic sizes)"
        )

    def _rows_of_output(self, sch: s_tir.Schedule, blocks: list, vector_bits: int) -> bool:
        """The output block scheduled, and the blocks in front of it (a function's float32
        argument or result; a norm's row reductions) computed inside its parallel loop, a row
        at a time: a buffer of one row, not of the whole tensor. A row reduction sums in
        vector lanes (``_lanes_of_reduction``). ``False`` (nothing changed) where the output is
        not scheduled."""
        output = blocks[-1]
        try:
            if not self._schedule_block(sch, output, vector_bits):
                return False
        except TVM_REFUSAL:
            return False
        row = sch.get_loops(output)[0]
        if not sch.get(row).kind == tirx.ForKind.PARALLEL:
            return False
        factored = set()  # the partial sums' blocks of the row reductions summed in lanes
        for brv in blocks[:-1]:
            if sch.get(brv).init is not None:
                factored.add(_lanes_of_reduction(sch, brv, vector_bits // 32))
        out = sch.get(output)
        kept = [
            b for b in sch.get_child_blocks(sch.get_sblock("root")) if not sch.get(b).same_as(out)
        ]
        kept.reverse()
        for k, brv in enumerate(kept):
            try:
                sch.compute_at(brv, row, preserve_unit_loops=False)
            except TVM_REFUSAL:  # this one and its producers stay whole blocks in front
                for rest in kept[k:]:
                    try:
                        self._schedule_block(sch, rest, vector_bits)
                    except TVM_REFUSAL:  # (it keeps its loops)
                        continue
                return True
            block = sch.get(brv)
            own = _loops_below(sch, brv, row)  # (none: one value per row, as a norm's scale)
            if block.name_hint in factored and len(own) == 2:  # (lane, chunk) -> (chunk, lane)
                sch.reorder(own[1], own[0])
                sch.vectorize(own[0])
                continue
            if block.init is not None or not own:
                continue  # a reduction left serial, the sum of the lanes, a row's scalar
            inner = own[-1]
            extent = sch.get(inner).extent
            lanes = _dividing(
                self._lanes(block, vector_bits),
                int(extent) if isinstance(extent, tirx.IntImm) else None,
            )
            if lanes:
                sch.vectorize(sch.split(inner, [None, lanes])[1])
        return True

    @staticmethod
    def _inline_data_movement(sch: s_tir.Schedule, blocks: list) -> bool:
        """Inline every block that only moves data into its consumers (module docstring)."""
        inlined = False
        for brv in blocks:
            block = sch.get(brv)
            if not _moves_data(block):
                continue
            try:
                consumers = [sch.get(c) for c in sch.get_consumers(brv)]
                if not consumers or not all(
                    is_data_parallel(c) or (c.init is not None and _keeps_lanes(block))
                    for c in consumers
                ):
                    continue
                sch.compute_inline(brv)  # refused for a block writing an output
                inlined = True
            except TVM_REFUSAL:
                continue
        return inlined

    def _static_loops(self, sch: s_tir.Schedule, brv: object) -> tuple[list, list] | None:
        """The block's loops and their extents (an int, or ``None`` for a symbolic one): one
        loop per iterator, in the iterators' order, the nest at least ``min_elements`` points;
        else ``None``. A nest over symbolic sizes counts as large when its extents name two
        sizes or more (a batch and a length: a prefill's ``[b, n, 3072]``) over at least
        ``min_static`` static points, and its innermost loop is static; a single symbolic size
        (a decode step's batch) does not."""
        block = sch.get(brv)
        loops = sch.get_loops(brv)
        if not loops or len(loops) != len(block.iter_vars):
            return None  # not one loop per iterator: scheduled already
        extents = [sch.get(loop).extent for loop in loops]
        for extent, iv in zip(extents, block.iter_vars):
            if not tvm.sym.Analyzer().can_prove_equal(iv.dom.extent, extent):
                return None  # the loops do not map one to one onto the iterators
        sizes = [int(e) if isinstance(e, tirx.IntImm) else None for e in extents]
        static = math.prod(s for s in sizes if s is not None)
        if None not in sizes:
            return (list(loops), sizes) if static >= self.min_elements else None
        names = {v.name for e in extents for v in nodes(e) if isinstance(v, tirx.Var)}
        if sizes[-1] is None or len(names) < 2 or static < self.min_static:
            return None
        return list(loops), sizes

    def _schedule_block(self, sch: s_tir.Schedule, brv: object, vector_bits: int) -> bool:
        block = sch.get(brv)
        lanes = self._lanes(block, vector_bits)
        if not is_data_parallel(block):
            return self._schedule_reduction(sch, brv, lanes)
        found = self._static_loops(sch, brv)
        if found is None:
            return False
        loops, sizes = found
        lanes = _dividing(lanes, sizes[-1]) if len(loops) > 1 else 0
        lead = loops[:-1] if len(loops) > 1 else loops
        self._parallel(sch, lead, sizes)
        if lanes:
            _, inner = sch.split(loops[-1], [None, lanes])
            sch.vectorize(inner)
        return True

    def _lanes(self, block: object, vector_bits: int) -> int:
        """Lanes of one vector of the block's widest element type (or ``lanes`` as given)."""
        if self.lanes is not None:
            return self.lanes
        stores = BlockInfo(block).stores
        dtypes = [st.buffer.dtype for st in stores]
        dtypes += [str(ld.ty) for st in stores for ld in loads(st.value)]
        bits = max((tvm.DataType(d).bits for d in dtypes), default=32)
        return max(vector_bits // max(bits, 8), 1)  # a bool is a byte in memory

    def _schedule_reduction(self, sch: s_tir.Schedule, brv: object, lanes: int) -> bool:
        """Parallel spatial loops around an unchanged reduction order; the innermost spatial
        loop split into vectors whose lanes run inside the reduction loops where every access
        is contiguous in it, each vector of outputs set once in front of the reduction."""
        block = sch.get(brv)
        kinds = [int(iv.iter_type) for iv in block.iter_vars]
        if block.init is None or any(k not in (SPATIAL, REDUCTION) for k in kinds):
            return False  # an ordered or opaque iterator
        count = kinds.index(REDUCTION)
        if count == 0 or any(k != REDUCTION for k in kinds[count:]):
            return False  # not spatial loops around reduction loops
        found = self._static_loops(sch, brv)
        if found is None:
            return False
        loops, sizes = found
        spatial, reduction = loops[:count], loops[count:]
        lane = block.iter_vars[count - 1].var
        contiguous = count > 1 and _contiguous_in(block, lane)
        lanes = _dividing(lanes, sizes[count - 1]) if contiguous and _lanes_build(block) else 0
        if lanes:
            outer, inner = sch.split(spatial[-1], [None, lanes])
            sch.reorder(outer, *reduction, inner)
            sch.vectorize(inner)
            spatial = spatial[:-1]
        self._parallel(sch, spatial, sizes)
        if lanes:
            # the outputs set in front of the window, not tested for the first step in it
            init = sch.decompose_reduction(brv, reduction[0])
            sch.vectorize(sch.get_loops(init)[-1])
        return True

    def _parallel(self, sch: s_tir.Schedule, lead: list, sizes: list) -> None:
        """Fuse the leading loops until their extent reaches ``min_parallel`` (all of them
        where one is symbolic: a batch of 1 must not be the whole parallel loop); run it
        parallel."""
        count, extent = 0, 1
        symbolic = None in sizes[: len(lead)]
        for size in sizes[: len(lead)]:
            count += 1
            extent *= size or 1
            if extent >= self.min_parallel and not symbolic:
                break
        outer = sch.fuse(*lead[:count]) if count > 1 else lead[0]
        sch.parallel(outer)


def _fuse_elementwise(sch: s_tir.Schedule, blocks: list) -> bool:
    """In a kernel of element-wise blocks with one output (a chain between two library calls:
    GPT-2's written-out GELU, SwiGLU's SiLU and product, a half model's casts around them),
    inline every intermediate into its consumers except (as a buffer, computed a row at a
    time by ``_rows_of_output``):

    - a function read by several consumers (computed once);
    - a function's float32 argument widened from bfloat16 (the fast functions bind their
      argument with ``Let``, and TVM's bfloat16 legalization does not reach into one);
    - a function whose value reaches a rounding to bfloat16 through the blocks inlined after
      it (TVM's rounding uses its operand twice, and ``VectorizeLoop`` then refuses the
      ``Let`` bound twice: SwiGLU's ``bf16(x * sigmoid(x))``).

    Then the functions become vector arithmetic. Returns whether it applied (otherwise only
    data movement is inlined). A bfloat16 GELU of GPT-2's prefill, ``[8 * 128, 3072]``, took
    11.4 ms with every intermediate a buffer and TVM's scalar ``tanh``; 0.46 ms now."""
    infos = [sch.get(b) for b in blocks]
    if len(blocks) < 2 or not all(is_data_parallel(b) for b in infos):
        return False
    consumers = [[sch.get(c).name_hint for c in sch.get_consumers(b)] for b in blocks]
    if sum(1 for c in consumers if not c) != 1 or consumers[-1]:
        return False  # several outputs (a split), or the output not last
    math = {b.name_hint for b in infos if has_math(b)}
    keep: set[str] = set()
    rounds: dict[str, bool] = {}  # the block's value reaches a bfloat16 rounding, inlined
    for block, users in reversed(list(zip(infos, consumers))):
        name = block.name_hint
        through = any(rounds[c] for c in users if c not in keep)
        if users and name in math and (len(users) > 1 or through):
            keep.add(name)
        elif users and _widens_bfloat16(block) and set(users) & math:
            keep.add(name)
        rounds[name] = _touches(block, "bfloat16") or (name not in keep and through)
    for brv, block in reversed(list(zip(blocks[:-1], infos[:-1]))):
        if block.name_hint in keep:
            continue
        try:
            sch.compute_inline(brv)
        except TVM_REFUSAL:  # (a block whose consumers read it over another nest)
            continue
    if not any(
        has_math(b) and _touches(b, "bfloat16")
        for b in (sch.get(r) for r in sch.get_child_blocks(sch.get_sblock("root")))
    ):  # (else TVM's own functions stay: a function under a rounding in its own block)
        vectorizable_math(sch)
    return True


def _loops_below(sch: s_tir.Schedule, brv: object, row: object) -> list:
    """The loops of block ``brv`` inside loop ``row``."""
    loops = sch.get_loops(brv)
    at = next(i for i, loop in enumerate(loops) if sch.get(loop).same_as(sch.get(row)))
    return loops[at + 1 :]


def _row_kernel(sch: s_tir.Schedule, blocks: list) -> bool:
    """A norm or softmax over rows: one output block, last and element-wise, in front of it
    element-wise blocks and reductions over their trailing iterators, at least one."""
    infos = [sch.get(b) for b in blocks]
    if len(blocks) < 2 or not is_data_parallel(infos[-1]) or sch.get_consumers(blocks[-1]):
        return False
    if any(not sch.get_consumers(b) for b in blocks[:-1]):
        return False  # several outputs
    reductions = [b for b in infos if not is_data_parallel(b)]
    for block in reductions:
        kinds = [int(iv.iter_type) for iv in block.iter_vars]
        if block.init is None or REDUCTION not in kinds:
            return False
        first = kinds.index(REDUCTION)
        if first == 0 or any(k != REDUCTION for k in kinds[first:]):
            return False
        last = block.iter_vars[-1].var
        reads = [ld for st in BlockInfo(block).stores for ld in loads(st.value)]
        if not any(ld.indices and _uses(ld.indices[-1], last) for ld in reads):
            return False  # not along a row (a pool's window: its lanes are the channels)
    return bool(reductions)


def _lanes_of_reduction(sch: s_tir.Schedule, brv: object, lanes: int) -> str | None:
    """Sum the row reduction ``brv`` over its last loop in ``lanes`` partial sums, one per
    vector lane, then the lanes (``rfactor``); returns the partial sums' block name, or
    ``None`` where it stays serial (an extent the lanes do not divide, TVM's refusal). A
    float32 row of 768 was a chain of 768 dependent additions (LayerNorm over GPT-2's
    bfloat16 rows, [8 * 128, 768]: 1.3 ms, 0.2 now). The order of the additions changes (as
    in GIR's row kernels and oneDNN's): a row's sum differs from the serial one in its last
    bits."""
    loop = sch.get_loops(brv)[-1]
    extent = sch.get(loop).extent
    lanes = _dividing(lanes, int(extent) if isinstance(extent, tirx.IntImm) else None)
    if not lanes or int(extent) == lanes:
        return None
    try:
        _, inner = sch.split(loop, [None, lanes])
        rf = sch.rfactor(inner, 0)
    except TVM_REFUSAL:
        return None
    return sch.get(rf).name_hint


def _widens_bfloat16(block: object) -> bool:
    """``block`` stores ``float32(x)`` of a bfloat16 ``x``: kept as a float32 buffer where a
    function reads it, since the fast functions bind their argument with ``Let`` and TVM's
    bfloat16 legalization does not reach into one (``plus_tvm.gir.lowering._touches_bf16``)."""
    store = BlockInfo(block).stores[0]
    value = store.value
    return (
        str(store.buffer.dtype) == "float32"
        and isinstance(value, tirx.Cast)
        and str(value.value.ty) == "bfloat16"
    )


def _touches(block: object, dtype: str) -> bool:
    store = BlockInfo(block).stores[0]
    return str(store.buffer.dtype) == dtype or any(
        isinstance(n, tirx.Cast) and str(n.ty) == dtype for n in nodes(store.value)
    )


def _lanes_build(block: object) -> bool:
    """Whether TVM 0.27 builds the reduction ``block`` with its lanes as vectors: a bfloat16
    accumulator updated by arithmetic (a mixture of experts' sum of its experts' bfloat16
    outputs) fails its bfloat16 legalization as a vector ("dtype mismatch on BufferStore: ...
    bfloat16x32"), so it keeps one lane; a maximum (a bfloat16 max-pool) builds."""
    store = BlockInfo(block).stores[0]
    if str(store.buffer.dtype) != "bfloat16":
        return True
    return not any(isinstance(n, (tirx.Add, tirx.Sub, tirx.Mul)) for n in nodes(store.value))


def _dividing(lanes: int, extent: int | None) -> int:
    """The widest of ``lanes``, ``lanes / 2``, ... (at least 4) dividing ``extent``; else 0
    (and for a symbolic extent)."""
    if extent is None:
        return 0
    while lanes >= 4 and extent % lanes:
        lanes //= 2
    return lanes if lanes >= 4 else 0


def _contiguous_in(block: object, var: tirx.Var) -> bool:
    """Every buffer access of ``block`` either ignores ``var`` or has it as its last index with
    stride 1 (and in no other index): lanes over ``var`` read and write consecutive elements."""
    analyzer = tvm.sym.Analyzer()
    step = {var: var + 1}
    body = BlockInfo(block).stores
    accesses = [*body, *(ld for st in body for ld in loads(st.value)), *stores(block.init)]
    if len(body) != 1:
        return False  # one update per output element (what the lanes vectorize)
    for access in accesses:
        indices = list(access.indices)
        uses = [_uses(i, var) for i in indices]
        if not any(uses):
            continue
        if not uses[-1] or any(uses[:-1]):
            return False
        if not analyzer.can_prove_equal(substitute(indices[-1], step) - indices[-1], 1):
            return False
    return True


def _uses(expr: tvm.ir.Expr, var: tirx.Var) -> bool:
    return any(n.same_as(var) for n in nodes(expr) if isinstance(n, tirx.Var))


def _moves_data(block: object) -> bool:
    """A spatial block with one store whose value is loads and at most ``MOVE_OPS`` cheap
    operations (reshape, transpose, slice, concatenate, negate, cast, a padding's select)."""
    if not is_data_parallel(block) or block.alloc_buffers or block.match_buffers:
        return False
    info = BlockInfo(block)
    if len(info.stores) != 1:
        return False
    ops, transcendental = count_ops(info.stores[0].value, indices=False)
    return transcendental == 0 and ops <= MOVE_OPS


def _padding_test(value: tvm.ir.Expr) -> tvm.ir.Expr | None:
    """The condition of ``if_then_else(condition, a, b)`` when it reads no buffer."""
    parts = if_then_else(value)
    if parts is None or has_load(parts[0]):
        return None
    return parts[0]


def _keeps_lanes(block: object) -> bool:
    """Inlined into a reduction, ``block`` leaves its lanes contiguous and uniform: it stores
    and loads along its last iterator alone with stride 1 at the last index, and any padding
    test ignores that iterator (a test across lanes would make the vector loop scalar)."""
    if not block.iter_vars:
        return False
    last = block.iter_vars[-1].var
    store = BlockInfo(block).stores[0]
    if not _contiguous_in(block, last):
        return False
    indices = list(store.indices)
    if not indices or not indices[-1].same_as(last):
        return False
    test = _padding_test(store.value)
    return test is None or not _uses(test, last)
