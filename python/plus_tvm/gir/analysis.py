"""Split a fused memory-intensive PrimFunc into basic operators (paper 002, section 6).

Each block of the fused kernel becomes one basic operator: element-wise, broadcast, reduce or
transpose, with what it reads, what it writes and how many rows/elements it touches. The kernel
as a whole gets a *row structure*:

- ``row``: every reduction reduces trailing axes of what it reads, and every block starts with
  the same leading spatial axes (LayerNorm, RMSNorm, softmax, row sums);
- ``column``: one reduction over leading (non-trailing) axes, the rest element-wise (column sums,
  batch statistics);
- ``elementwise``: no reduction (activations, residual adds, transposes).

A kernel that fits none of these, that contracts operands (matmul, convolution: an operand
reused across outputs along a reduction; compute-intensive), gathers, or is already scheduled
(blocks not directly under their own loop nest) gives ``None`` and the GIR rules decline it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import tvm
from tvm import s_tir, tirx

from ..errors import TVM_REFUSAL
from ..tir_blocks import SPATIAL, BlockInfo, count_ops, expr_vars, gathers, is_data_parallel
from ..tir_blocks.rebuild import (
    rebuilt_block,
    replace_blocks,
    simplify_indices,
    substitute,
    tvm_structural_equal,
)

SYMBOLIC_GUESS = 1024  # extent assumed for a symbolic size in the performance model


@dataclass
class OperandRead:
    """One load of a buffer by a memory operator."""

    buffer: str
    kind: str  # "same" (the store's indices), "broadcast" (fewer iterators), "permute", "other"
    trailing: bool  # the block's innermost iterator indexes the buffer's last axis


@dataclass
class MemoryOperator:
    """One basic memory operator (one TIR block; paper 002, section 6)."""

    block: str
    kind: str  # "ewise" | "broadcast" | "reduce" | "transpose"
    output: str
    output_is_param: bool
    spatial: list[int]  # extents of spatial iterators (symbolic -> SYMBOLIC_GUESS)
    reduce: list[int]  # extents of reduction iterators
    dom: str  # "S"/"R" per iterator
    accesses: list[OperandRead]
    flops: int  # arithmetic nodes per element
    transcendental: int
    dtype_bytes: int = 4
    trailing_reduce: bool = True
    shared: bool = False  # computes row-independent data (a weight's cast): inlined

    @property
    def inputs(self) -> list[str]:
        return list(dict.fromkeys(a.buffer for a in self.accesses))


@dataclass
class Kernel:
    """A fused kernel as basic operators with its row structure."""

    structure: str  # "row" | "column" | "elementwise"
    ops: list[MemoryOperator]
    rows: int  # rows (row kernels), output columns (column kernels), elements (elementwise)
    row_len: int  # elements per row (reduction length; 1 for elementwise)
    num_leading: int  # leading spatial axes that are rows
    params: list[str]
    intermediates: list[str]
    symbolic: bool = False
    consumers: dict[str, list[str]] = field(default_factory=dict)
    copies: dict[str, str] = field(default_factory=dict)  # layout-copy block -> copied output
    sizes: dict[str, int] = field(default_factory=dict)  # elements of every buffer

    def depends(self, later: str, earlier: str) -> bool:
        """Whether block ``later`` (transitively) reads what block ``earlier`` writes."""
        producer = {o.output: o.block for o in self.ops}
        todo, seen = [later], set()
        while todo:
            b = todo.pop()
            if b == earlier:
                return True
            if b in seen:
                continue
            seen.add(b)
            todo += [producer[i] for i in self.op(b).inputs if i in producer]
        return False

    def op(self, block: str) -> MemoryOperator:
        return next(o for o in self.ops if o.block == block)


def _extent(e: tvm.ir.Expr) -> tuple[int, bool]:
    if isinstance(e, tirx.IntImm):
        return int(e), False
    return SYMBOLIC_GUESS, True


def _pos(items: list, v: object) -> int:
    return next((i for i, x in enumerate(items) if x.same_as(v)), -1)


def _classify(ld: object, store: tirx.BufferStore, spatial_vars: list, unit: list) -> str:
    """How a load relates to its block's iterators (unit-extent iterators and constant zeros
    dropped, so a ``[1, n, m]`` operand of an ``[n, m]`` output still counts as the same)."""
    li, si = list(ld.indices), list(store.indices)
    if len(li) == len(si) and all(tvm_structural_equal(a, b) for a, b in zip(li, si)):
        return "same"
    kept = [
        i
        for i in li
        if not (isinstance(i, tirx.IntImm) and int(i) == 0)
        and not (isinstance(i, tirx.Var) and _pos(unit, i) >= 0)
    ]
    spatial = [v for v in spatial_vars if _pos(unit, v) < 0]
    if all(isinstance(i, tirx.Var) for i in kept):
        where = [_pos(spatial, i) for i in kept]
        if all(w >= 0 for w in where) and len(set(where)) == len(where):
            if len(where) == len(spatial):
                return "same" if where == sorted(where) else "permute"
            return "broadcast" if where == sorted(where) else "other"
    if len(li) == len(si) and all(_shifted(a, b) for a, b in zip(li, si)):
        return "shift"  # a window at a constant offset (a pad reading its source)
    used = set()
    for idx in li:
        used |= expr_vars(idx)
    if not all(any(u.same_as(v) for u in used) for v in spatial):
        return "broadcast" if all(isinstance(i, tirx.Var) for i in kept) else "other"
    return "other"


def _shifted(index: object, store_index: object) -> bool:
    """``index`` is ``store_index`` plus or minus a constant (or the same, or a constant)."""
    if isinstance(index, tirx.IntImm) or tvm_structural_equal(index, store_index):
        return True
    if isinstance(index, (tirx.Add, tirx.Sub)) and isinstance(index.b, tirx.IntImm):
        return tvm_structural_equal(index.a, store_index)
    return False


def normalize(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """Fold layout epilogues into the kernel: a final block that only copies another block's
    result into the output under another shape (``reshape``, ``squeeze``) is inlined into its
    producer (``reverse_compute_inline``), so that the producer writes the output directly."""
    func = simplify_indices(func)
    try:
        sch = s_tir.Schedule(func)
        root = sch.get_sblock("root")
    except TVM_REFUSAL:  # not a schedulable function: analysed as it is
        return func
    _align_unit_ranks(sch, root)
    redirected = _copies_of_copies(sch, root, func)
    if redirected:
        func = replace_blocks(sch.mod["main"], redirected)
        sch = s_tir.Schedule(func)
        root = sch.get_sblock("root")
    _inline_layout_prologues(sch, root, func)
    changed = True
    while changed:
        changed = False
        blocks = sch.get_child_blocks(root)
        for brv in reversed(blocks[1:]):
            if not _copies_to_output(sch.get(brv), func):
                continue
            try:
                (producer,) = sch.get_producers(brv)
                if len(sch.get_consumers(producer)) != 1:
                    # TVM's reverse_compute_inline does not check that the producer has no
                    # other consumer: it would leave that one reading a buffer no block
                    # writes any more
                    continue
                sch.reverse_compute_inline(brv)
                changed = True
                break
            except TVM_REFUSAL:  # not invertible, or several producers (ValueError)
                continue
    return sch.mod["main"]


def _copies_of_copies(sch: s_tir.Schedule, root: object, func: tirx.PrimFunc) -> dict:
    """Blocks to replace so that a value returned under several shapes (a norm's output as
    ``[1, n, d]`` and as ``[n, d]``: two copies of one intermediate into two outputs) is
    copied once from the intermediate and then from that first output: the first copy can
    then be folded into the value's block, the others are layout copies of an output
    (``_layout_copies``). Only copies over the same iterators reading the same element (after
    ``_align_unit_ranks``) are redirected."""
    new: dict = {}
    for brv in sch.get_child_blocks(root):
        if _copies_to_output(sch.get(brv), func) or not is_data_parallel(sch.get(brv)):
            continue
        copies = [c for c in sch.get_consumers(brv) if _copies_to_output(sch.get(c), func)]
        if len(copies) < 2 or len(copies) != len(sch.get_consumers(brv)):
            continue
        first = sch.get(copies[0])
        for crv in copies[1:]:
            other = sch.get(crv)
            if _static_extents(other) != _static_extents(first) or _static_extents(first) is None:
                continue
            to_first = {a.var: b.var for a, b in zip(other.iter_vars, first.iter_vars)}
            if not all(
                tvm_structural_equal(substitute(a, to_first), b)
                for a, b in zip(other.body.value.indices, first.body.value.indices)
            ):
                continue
            to_other = {b.var: a.var for a, b in zip(other.iter_vars, first.iter_vars)}
            indices = [substitute(i, to_other) for i in first.body.indices]
            load = tirx.BufferLoad(first.body.buffer, indices)
            region = tirx.BufferRegion(
                first.body.buffer, [tvm.ir.Range.from_min_extent(i, 1) for i in indices]
            )
            store = tirx.BufferStore(other.body.buffer, load, other.body.indices)
            new[other.name_hint] = rebuilt_block(other, body=store, reads=[region])
    return new


def _align_unit_ranks(sch: s_tir.Schedule, root: object) -> None:
    """Give a data-parallel block the leading unit iterators the kernel's other blocks have
    (a norm returned as ``[1, n, d]`` and as ``[n, d]``: the ``[n, d]`` block iterates
    ``[1, n, d]`` too), so that every block of a row kernel has the same row axes."""
    blocks = sch.get_child_blocks(root)
    extents = [_static_extents(sch.get(b)) for b in blocks]
    spatial = [e for b, e in zip(blocks, extents) if e is not None and is_data_parallel(sch.get(b))]
    if not spatial:
        return
    ref = max(spatial, key=len)
    for brv, ext in zip(blocks, extents):
        pad = len(ref) - len(ext) if ext is not None else 0
        if pad <= 0 or not is_data_parallel(sch.get(brv)):
            continue
        if any(e != 1 for e in ref[:pad]) or ref[pad:] != ext:
            continue
        try:
            sch.transform_block_layout(brv, _leading_units(pad, len(ext)))
        except TVM_REFUSAL:  # the block keeps its iterators
            continue


def _leading_units(pad: int, ndim: int) -> tirx.IndexMap:
    zeros = [tirx.const(0, "int64")] * pad
    return tirx.IndexMap.from_func(lambda *v: [*zeros, *v], ndim=ndim)


def _static_extents(block: object) -> list[int] | None:
    ext = [iv.dom.extent for iv in block.iter_vars]
    return [int(e) for e in ext] if all(isinstance(e, tirx.IntImm) for e in ext) else None


def _copies_to_output(block: object, func: tirx.PrimFunc) -> bool:
    """The block only copies a value into one of the kernel's parameters."""
    body = block.body
    return (
        isinstance(body, tirx.BufferStore)
        and block.init is None
        and isinstance(body.value, tvm.ir.TensorLoad)
        and any(body.buffer.same_as(p) for p in func.params)
    )


def _inline_layout_prologues(sch: s_tir.Schedule, root: object, func: tirx.PrimFunc) -> None:
    """Inline blocks that only copy a kernel input under another layout (the transpose of a
    weight before a matrix-vector product) into the reductions that read them, so the
    reduction reads the input where it lies and its rows become contiguous."""
    params = [p for p in func.params if hasattr(p.ty, "shape")]
    for brv in list(sch.get_child_blocks(root)):
        block = sch.get(brv)
        body = block.body
        if not isinstance(body, tirx.BufferStore) or block.init is not None:
            continue
        if any(body.buffer.same_as(p) for p in params):
            continue
        src = body.value
        if not isinstance(src, tvm.ir.TensorLoad) or not any(src.source.same_as(p) for p in params):
            continue
        consumers = sch.get_consumers(brv)
        if not consumers or not all(
            any(int(iv.iter_type) == 2 for iv in sch.get(c).iter_vars) for c in consumers
        ):
            continue
        try:
            sch.compute_inline(brv)
        except TVM_REFUSAL:  # not inlinable: analysed as it is
            continue


def _layout_copies(sch: s_tir.Schedule, blocks: list, func: tirx.PrimFunc) -> dict[str, str]:
    """Trailing blocks that copy an output of the kernel into another output under another
    shape (a LayerNorm returned both as ``[1, n, d]`` and reshaped to ``[n, d]``): not basic
    operators, but a second store of a value the kernel already has in registers."""
    written: dict[str, str] = {}
    out: dict[str, str] = {}
    params = [p for p in func.params if hasattr(p.ty, "shape")]
    for brv in blocks:
        block = sch.get(brv)
        body = block.body
        if not isinstance(body, tirx.BufferStore):
            written.clear()  # only a trailing run of copies
            out.clear()
            continue
        is_param = any(body.buffer.same_as(p) for p in params)
        src = body.value
        if (
            is_param
            and block.init is None
            and isinstance(src, tvm.ir.TensorLoad)
            and src.source.name in written
            and all(int(iv.iter_type) == 0 for iv in block.iter_vars)
        ):
            out[block.name_hint] = src.source.name
            continue
        out.clear()
        if is_param:
            written[body.buffer.name] = block.name_hint
    return out


def analyze(func: tirx.PrimFunc, why: list[str] | None = None) -> Kernel | None:
    """The kernel's basic operators and row structure, or ``None`` (not a GIR kernel; the
    reason is appended to ``why`` when given)."""

    def no(reason: str) -> None:
        if why is not None:
            why.append(reason)

    try:
        sch = s_tir.Schedule(func)
        root = sch.get_sblock("root")
        blocks = sch.get_child_blocks(root)
    except TVM_REFUSAL:  # opaque or unusual functions are simply not GIR kernels
        return no("not a schedulable function")
    if not blocks:
        return no("no blocks")
    names = _Names()
    params = {names(p): p for p in func.params if hasattr(p.ty, "shape")}
    ops: list[MemoryOperator] = []
    symbolic = False
    copies = _layout_copies(sch, blocks, func)
    for brv in blocks:
        block = sch.get(brv)
        if block.name_hint in copies:
            continue
        loops = sch.get_loops(brv)
        info = BlockInfo(block)
        if len(info.stores) != 1 or block.alloc_buffers or block.match_buffers:
            return no("a block with several stores or its own buffers")
        if len(loops) != len(block.iter_vars):
            return no("not one loop per block iterator (already scheduled)")
        store = info.stores[0]
        dom = "".join("S" if int(iv.iter_type) == SPATIAL else "R" for iv in block.iter_vars)
        if any(int(iv.iter_type) not in (0, 2) for iv in block.iter_vars):
            return no("an ordered or opaque block iterator")
        spatial_vars = [iv.var for iv in block.iter_vars if int(iv.iter_type) == SPATIAL]
        unit = list(info.units)  # the iterators of extent 1 (membership only)
        red_vars = [iv.var for iv in block.iter_vars if int(iv.iter_type) != SPATIAL]
        spatial, reduce = [], []
        for iv in block.iter_vars:
            ext, sym = _extent(iv.dom.extent)
            symbolic |= sym
            (spatial if int(iv.iter_type) == SPATIAL else reduce).append(ext)
        accesses = []
        trailing_reduce = True
        contraction = False
        for _, ld in info.reads:  # the reduction's own accumulator is not a read
            kind = _classify(ld, store, spatial_vars, unit)
            if kind == "other" and red_vars and all(isinstance(i, tirx.Var) for i in ld.indices):
                kind = "same"  # a reduction's input: the store's indices plus reduced axes
            last = ld.indices[-1] if len(ld.indices) else None
            inner = block.iter_vars[-1].var
            trailing = last is not None and inner in expr_vars(last)
            if red_vars and last is not None and not (expr_vars(last) & set(red_vars)):
                if any(expr_vars(i) & set(red_vars) for i in ld.indices):
                    trailing_reduce = False
            accesses.append(OperandRead(names(ld.source), kind, trailing))
            if (
                red_vars
                and not _covers_spatial(ld, [v for v in spatial_vars if _pos(unit, v) < 0])
                and _uses_any(ld, red_vars)
                and not _vector_operand(ld, red_vars, unit)
            ):
                # an operand reused across outputs along the reduction: a contraction
                # (matmul, convolution) -- compute-intensive, for libraries and dlight
                contraction = True
        if contraction:
            return no("a contraction (matmul, convolution): compute-bound")
        if any(a.kind == "other" for a in accesses) or gathers(store.value):
            # gathers, slices with offsets, reshapes: not a GIR basic operator
            return no("a gather, an offset slice or a reshaping read")
        if red_vars:
            kind = "reduce"
        elif any(a.kind == "permute" for a in accesses):
            kind = "transpose"
        elif any(a.kind == "broadcast" for a in accesses):
            kind = "broadcast"
        else:
            kind = "ewise"
        flops, trans = count_ops(store.value)
        ops.append(
            MemoryOperator(
                block=block.name_hint,
                kind=kind,
                output=names(store.buffer),
                output_is_param=names(store.buffer) in params,
                spatial=spatial,
                reduce=reduce,
                dom=dom,
                accesses=accesses,
                flops=max(flops, 1),
                transcendental=trans,
                dtype_bytes=_dtype_bytes(store.buffer),
                trailing_reduce=trailing_reduce,
            )
        )
    written = [o.output for o in ops]
    if len(set(written)) != len(written):
        return no("a buffer written by two blocks")
    intermediates = [o.output for o in ops if not o.output_is_param]
    consumers: dict[str, list[str]] = {}
    for o in ops:
        for b in o.inputs:
            consumers.setdefault(b, []).append(o.block)
    kernel = _structure(ops, symbolic)
    if kernel is None:
        return no("no row, column or element-wise structure")
    kernel.params = list(params)
    kernel.intermediates = intermediates
    kernel.consumers = consumers
    kernel.copies = copies
    sizes = {}
    for name, buf in params.items():
        total = 1
        for d in buf.ty.shape:
            total *= _extent(d)[0]
        sizes[name] = total
    for o in ops:
        total = 1
        for e in o.spatial:
            total *= e
        sizes[o.output] = total
    kernel.sizes = sizes
    return kernel


def _leading_s(dom: str) -> int:
    return len(dom) - len(dom.lstrip("S"))


def row_lead(o: MemoryOperator) -> int:
    """Leading spatial iterators of a reduction that index its rows: unit-extent spatial
    iterators just before the reduced ones (a ``mean`` with ``keepdims``) belong to no row."""
    n = _leading_s(o.dom)
    while n > 1 and o.spatial[n - 1] == 1:
        n -= 1
    return n


def _structure(ops: list[MemoryOperator], symbolic: bool) -> Kernel | None:
    reductions = [o for o in ops if o.kind == "reduce"]
    last = ops[-1]
    if not last.output_is_param:
        return None
    if not reductions:
        total = 1
        for e in last.spatial:
            total *= e
        return Kernel("elementwise", ops, total, 1, len(last.spatial), [], [], symbolic)
    if any(a.kind == "shift" for o in ops for a in o.accesses):
        return None  # offset windows only in element-wise kernels
    if all(o.trailing_reduce and o.dom.endswith("R") for o in reductions):
        red_lead = {row_lead(o) for o in reductions}
        if len(red_lead) != 1:
            return None
        lead = red_lead.pop()
        if lead == 0 or any(e != 1 for o in reductions for e in o.spatial[lead:]):
            return None
        computed = {o.output for o in ops}
        shared: set[str] = set()
        for o in ops:
            if o.kind != "reduce" and (
                _leading_s(o.dom) < lead or o.spatial[:lead] != last.spatial[:lead]
            ):
                # no row axis: data prepared once for every row (a weight's cast), inlined;
                # it may read only kernel inputs and other such data
                o.shared = True
                shared.add(o.output)
                if o.output_is_param or any(
                    a.buffer in computed and a.buffer not in shared for a in o.accesses
                ):
                    return None
        rows = 1
        for e in last.spatial[:lead]:
            rows *= e
        row_len = 1
        for e in reductions[0].reduce:
            row_len *= e
        if any(o.spatial[:lead] != last.spatial[:lead] for o in ops if not o.shared):
            return None
        return Kernel("row", ops, rows, row_len, lead, [], [], symbolic)
    if len(reductions) == 1 and not reductions[0].trailing_reduce:
        red = reductions[0]
        if red.dom[0] != "S" or "S" in red.dom[red.dom.index("R") :]:
            return None
        cols = 1
        for e in red.spatial:
            cols *= e
        row_len = 1
        for e in red.reduce:
            row_len *= e
        return Kernel("column", ops, cols, row_len, len(red.spatial), [], [], symbolic)
    return None


class _Names:
    """Unique names for buffer variables (several buffers of a fused kernel share a name)."""

    def __init__(self) -> None:
        self.known: list[tuple[object, str]] = []

    def __call__(self, var: object) -> str:
        for v, name in self.known:
            if v.same_as(var):
                return name
        taken = {n for _, n in self.known}
        name, k = var.name, 1
        while name in taken:
            name, k = f"{var.name}#{k}", k + 1
        self.known.append((var, name))
        return name


def _covers_spatial(ld: object, spatial_vars: list) -> bool:
    used: set = set()
    for idx in ld.indices:
        used |= expr_vars(idx)
    return set(spatial_vars) <= used


def _vector_operand(ld: object, red_vars: list, unit: list) -> bool:
    """A load indexed only by reduction iterators (and unit-extent ones): the vector of a
    matrix-vector product, one row's worth of data reused by every row. The product reads its
    matrix once, so it is memory-bound (a GEMV: a row reduction of the matrix, not a
    contraction for a GEMM library)."""
    allowed = set(red_vars) | set(unit)
    used: set = set()
    for idx in ld.indices:
        used |= expr_vars(idx)
    return bool(used) and used <= allowed


def _uses_any(ld: object, iters: list) -> bool:
    return any(expr_vars(idx) & set(iters) for idx in ld.indices)


def _dtype_bytes(buffer: tirx.Var) -> int:
    dtype = buffer.ty.dtype
    dtype = getattr(dtype, "dtype", dtype)  # a PrimType wraps the dtype
    return max(int(dtype.bits) // 8, 1)
