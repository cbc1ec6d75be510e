"""RecomputeReductionCUDA: a few reduced values scaling a large tensor, one thread per element.

A squeeze-excite's expand convolution fused into the multiply it gates (EfficientNet-B0's
first block: ``x[1, 32, 112, 112] * sigmoid(conv1x1(s[1, 8, 1, 1]) + b)``) is a reduction of
32 outputs over 8 inputs followed by a 401,408-element epilogue. dlight's reduction rules
size the grid by the reduction's outputs, so the epilogue ran on 2 thread blocks: 183 us on an
H200, where the multiply alone is a few microseconds of memory traffic.

This rule schedules such a kernel as the element-wise kernel it mostly is: every data-parallel
block but the output is inlined into its consumers, the output's loops are one flat
``blockIdx.x x threadIdx.x`` loop, and every reduction is computed under the thread loop in
registers (``local``), each thread recomputing the few reduced values its element reads (8
multiply-adds for that convolution). It takes a kernel only where that recomputation is cheap
and dlight's grid would be small:

- the output block is data-parallel with at least ``min_elements`` elements and at least
  ``min_ratio`` times as many as the reductions read and write together (the gate's
  reductions read a few hundred values; a norm or a softmax reduces the very tensor it
  scales, and is dlight's);
- every reduction has at most ``max_reduced`` outputs and a static reduced extent (dlight
  launches about one block per reduced output, 2 to 9 blocks for EfficientNet's gates on a
  132-multiprocessor GPU);
- the recomputed work, output elements times the reduced extents, is at most ``max_work``
  (a LayerNorm over long rows, where every element would redo its row, is left to dlight).
"""

from __future__ import annotations

import math

import tvm
from plus_tvm.errors import TVM_REFUSAL
from plus_tvm.tir_blocks import is_data_parallel
from tvm import s_tir, tirx

from .reasoned_rule import OPAQUE, ReasonedRule


class RecomputeReductionCUDA(ReasonedRule):
    """Small reductions recomputed per thread of a large element-wise epilogue (GPU targets).

    Parameters
    ----------
    threads : int
        Threads per block of the flat loop.
    min_elements : int
        Smallest output block taken.
    min_ratio : int
        Output elements per reduced output, at least.
    max_reduced : int
        Most outputs of one reduction.
    max_work : int
        Most multiply-adds recomputed over the whole kernel (output elements x reduced extent).
    """

    def __init__(
        self,
        threads: int = 256,
        min_elements: int = 16384,
        min_ratio: int = 64,
        max_reduced: int = 4096,
        max_work: int = 1 << 26,
    ) -> None:
        self.threads = threads
        self.min_elements = min_elements
        self.min_ratio = min_ratio
        self.max_reduced = max_reduced
        self.max_work = max_work

    def apply_with_reason(self, func: tirx.PrimFunc, target: tvm.target.Target):
        """The schedule, or ``None`` and why (``ApplyScheduleRules`` reports it)."""
        if "gpu" not in target.keys:
            return None, f"a {target.kind.name} target (not a GPU)"
        found = self.root_blocks(func)
        if found is None:
            return None, OPAQUE
        sch, blocks = found
        if len(blocks) < 2:
            return None, "a single block"
        output = blocks[-1]
        out_size = _static_points(sch, output)
        if not is_data_parallel(sch.get(output)) or out_size is None:
            return None, "the last block is not a static data-parallel loop nest"
        reductions = [b for b in blocks[:-1] if not is_data_parallel(sch.get(b))]
        if not reductions:
            return None, "no reduction"
        reduced_data, work = 0, 0
        for red in reductions:
            block = sch.get(red)
            spatial, reduced = _extents(block)
            read = _read_elements(block)
            if spatial is None or reduced is None or read is None:
                return None, f"block {block.name_hint} has a symbolic extent"
            if spatial > self.max_reduced:
                return None, f"reduction {block.name_hint} has {spatial} outputs (dlight's)"
            reduced_data += spatial + read
            work += out_size * reduced
        if out_size < self.min_elements or out_size < self.min_ratio * reduced_data:
            return None, (
                f"an epilogue of {out_size} elements over reductions of {reduced_data} elements "
                "read and written (a norm or softmax reduces the tensor it scales: dlight's)"
            )
        if work > self.max_work:
            return None, f"{work} recomputed multiply-adds (over {self.max_work})"
        try:
            return self._schedule(sch, blocks, reductions), None
        except TVM_REFUSAL as err:  # a primitive refused: the next rule takes the kernel
            return None, f"a schedule primitive refused ({type(err).__name__})"

    def _schedule(self, sch: s_tir.Schedule, blocks: list, reductions: list) -> s_tir.Schedule:
        names = {sch.get(r).name_hint for r in reductions}
        for brv in reversed(blocks[:-1]):
            if sch.get(brv).name_hint not in names:
                sch.compute_inline(brv)  # producers of the reductions and the epilogue alike
        output = sch.get_sblock(sch.get(blocks[-1]).name_hint)
        loops = sch.get_loops(output)
        fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
        bx, tx = sch.split(fused, [None, self.threads])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        for name in reversed([sch.get(r).name_hint for r in reductions]):
            red = sch.get_sblock(name)
            sch.compute_at(red, tx, preserve_unit_loops=True)
            sch.set_scope(red, 0, "local")
        return sch


def _static_points(sch: s_tir.Schedule, brv: object) -> int | None:
    loops = sch.get_loops(brv)
    extents = [sch.get(loop).extent for loop in loops]
    if not loops or not all(isinstance(e, tirx.IntImm) for e in extents):
        return None
    if len(loops) != len(sch.get(brv).iter_vars):
        return None  # scheduled already
    return math.prod(int(e) for e in extents)


def _read_elements(block: object) -> int | None:
    """Elements of the buffers ``block`` reads (its own accumulator left out), or ``None``."""
    total = 0
    written = {w.source.name for w in block.writes}
    for region in block.reads:
        if region.source.name in written:
            continue
        shape = region.source.shape
        if not all(isinstance(d, tirx.IntImm) for d in shape):
            return None
        total += math.prod(int(d) for d in shape)
    return total


def _extents(block: object) -> tuple[int | None, int | None]:
    """The block's data-parallel and reduced points (``None`` where symbolic)."""
    spatial, reduced = 1, 1
    for iv in block.iter_vars:
        ext = iv.dom.extent
        if not isinstance(ext, tirx.IntImm):
            return None, None
        if int(iv.iter_type) == 0:
            spatial *= int(ext)
        else:
            reduced *= int(ext)
    return spatial, reduced
