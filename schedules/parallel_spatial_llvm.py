"""ParallelSpatialLLVM: the fallback for CPU kernels no GIR plan covers.

A fused kernel that GIR declines (a tiny contraction in front of a large element-wise block: a
squeeze-excite's expand convolution + sigmoid fused into the multiply that scales the
activation) would otherwise run every loop nest serially and unvectorized: 0.35 ms for the
112x112x32 scale of EfficientNet-B0's first block, where the same multiply scheduled takes
0.03 ms. First, blocks that only move data (a reshape, transpose, slice, concatenation or
negation: loads with at most ``MOVE_OPS`` cheap operations, every consumer data-parallel) are
inlined into their consumers, so that a chain like LLaMA's rotary embedding (reshape, transpose,
two slices, negate, concatenate, two multiplies and an add: nine full-size buffers) reads its
input once and writes its output once; nothing costly is recomputed. Then the large spatial
blocks iterate in parallel: their leading loops are fused into one ``parallel`` loop over TVM's
pool and, where the innermost loop's extent is a multiple of the vector width, that loop is
split and vectorized. Reductions, small blocks (below ``min_elements``) and already-scheduled
kernels are left alone; a kernel with no large spatial block is declined (``None``).
"""

from __future__ import annotations

import math

import tvm
from plus_tvm.errors import TVM_REFUSAL
from plus_tvm.tir_blocks import BlockInfo, count_ops, is_data_parallel
from plus_tvm.tir_blocks.rebuild import simplify_indices
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
    lanes : int
        Vector width of the innermost loop, in elements.
    min_parallel : int
        Leading loops are fused until their extent reaches this (or every loop but the last).
    """

    def __init__(self, min_elements: int = 16384, lanes: int = 8, min_parallel: int = 16) -> None:
        self.min_elements = min_elements
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
        if self._inline_data_movement(sch, blocks):
            blocks = sch.get_child_blocks(sch.get_sblock("root"))
        changed = False  # a large block runs parallel (inlining alone does not make it ours)
        for brv in blocks:
            try:
                changed |= self._schedule_block(sch, brv)
            except TVM_REFUSAL:  # a primitive refused this block: it keeps its loops
                continue
        if changed:
            return sch, None
        return None, (
            f"no data-parallel block with a static loop nest of {self.min_elements} elements "
            "or more (reductions keep their order)"
        )

    @staticmethod
    def _inline_data_movement(sch: s_tir.Schedule, blocks: list) -> bool:
        """Inline every block that only moves data into its consumers (module docstring)."""
        inlined = False
        for brv in blocks:
            block = sch.get(brv)
            if not _moves_data(block):
                continue
            try:
                consumers = sch.get_consumers(brv)
                if not consumers or not all(is_data_parallel(sch.get(c)) for c in consumers):
                    continue
                sch.compute_inline(brv)  # refused for a block writing an output
                inlined = True
            except TVM_REFUSAL:
                continue
        return inlined

    def _schedule_block(self, sch: s_tir.Schedule, brv: object) -> bool:
        block = sch.get(brv)
        if not is_data_parallel(block):
            return False  # reductions (and opaque iterators) keep their order
        loops = sch.get_loops(brv)
        if not loops or len(loops) != len(block.iter_vars):
            return False  # not one loop per iterator: scheduled already
        extents = [sch.get(loop).extent for loop in loops]
        if not all(isinstance(e, tirx.IntImm) for e in extents):
            return False
        sizes = [int(e) for e in extents]
        if math.prod(sizes) < self.min_elements:
            return False
        last = sizes[-1]
        vector = len(loops) > 1 and last % self.lanes == 0
        lead = loops[:-1] if len(loops) > 1 else loops
        count, extent = 0, 1
        for size in sizes[: len(lead)]:
            count += 1
            extent *= size
            if extent >= self.min_parallel:
                break
        outer = sch.fuse(*lead[:count]) if count > 1 else lead[0]
        sch.parallel(outer)
        if vector:
            _, inner = sch.split(loops[-1], [None, self.lanes])
            sch.vectorize(inner)
        return True


def _moves_data(block: object) -> bool:
    """A spatial block with one store whose value is loads and at most ``MOVE_OPS`` cheap
    operations (reshape, transpose, slice, concatenate, negate, cast)."""
    if not is_data_parallel(block) or block.alloc_buffers or block.match_buffers:
        return False
    info = BlockInfo(block)
    if len(info.stores) != 1:
        return False
    ops, transcendental = count_ops(info.stores[0].value, indices=False)
    return transcendental == 0 and ops <= MOVE_OPS
