"""What one TIR block computes: its loops, its writes, its reads and how they index the loops.

The one analysis of a block that the three papers' models read, each in its own terms: the
mapping classes of paper 004 (``mapping/``), the +Loops of PluS (``plusgraph/``) and the basic
memory operators of PowerFusion (``gir/``). One rule for size-1 loops (:func:`is_unit`: a static
extent of 1), one reading of a reduction's operator, one index map per access.
"""

from __future__ import annotations

import functools

import tvm
from tvm import tirx
from tvm.s_tir import SBlock

from .walk import Load, blocks, loads, stores, walk_expr

SPATIAL = 0  # ``IterVar.iter_type`` of a data-parallel iterator
REDUCTION = 2  # ``IterVar.iter_type`` of a commutative reduction
TRANSCENDENTAL = frozenset(
    {
        "tirx.exp",
        "tirx.exp2",
        "tirx.erf",
        "tirx.tanh",
        "tirx.sigmoid",
        "tirx.log",
        "tirx.sqrt",
        "tirx.rsqrt",
        "tirx.pow",
        "tirx.sin",
        "tirx.cos",
    }
)
_ARITHMETIC = (tirx.Add, tirx.Sub, tirx.Mul, tirx.Div, tirx.Max, tirx.Min)
_OPERANDS = ("a", "b", "value", "condition", "true_value", "false_value")


def is_unit(iv: tirx.IterVar) -> bool:
    """An iterator of static extent 1: it indexes nothing, every analysis drops it."""
    extent = iv.dom.extent
    return isinstance(extent, tirx.IntImm) and int(extent) == 1


def is_data_parallel(block: object) -> bool:
    """Every iterator of ``block`` data-parallel and no init: not a reduction, no ordered or
    opaque iterator."""
    return block.init is None and all(int(iv.iter_type) == SPATIAL for iv in block.iter_vars)


class BlockInfo:
    """One block: its iterators sorted into loops and units, its stores and their reads.

    Attributes
    ----------
    block : SBlock
    loops : tuple of IterVar
        The iterators of extent other than 1, in block order (the block's loop nest).
    units : frozenset of Var
        The iterators of extent 1.
    stores : tuple of BufferStore
        The writes of the block body (not of nested blocks).
    reads : tuple of (BufferStore, TensorLoad)
        Each store with each load of its value, the store's own buffer (an accumulator) left
        out.
    accumulates : bool
        Some store reads its own buffer (a reduction's update).

    Stores and reads are walked on first use (a caller that only needs the loops pays for no
    expression walk).
    """

    def __init__(self, block: SBlock) -> None:
        self.block = block
        self.name: str = block.name_hint
        self.loops = tuple(iv for iv in block.iter_vars if not is_unit(iv))
        self.units = frozenset(iv.var for iv in block.iter_vars if is_unit(iv))
        self._positions = {iv.var.id_: k for k, iv in enumerate(self.loops)}
        self._analyzer: tvm.sym.Analyzer | None = None
        self._domain: dict = {}

    @functools.cached_property
    def stores(self) -> tuple[tirx.BufferStore, ...]:
        return tuple(stores(self.block.body))

    @functools.cached_property
    def _reads_and_accumulates(self) -> tuple[tuple, bool]:
        reads, accumulates = [], False
        for store in self.stores:
            for load in loads(store.value):
                if load.source.same_as(store.buffer):
                    accumulates = True
                else:
                    reads.append((store, load))
        return tuple(reads), accumulates

    @property
    def reads(self) -> tuple:
        return self._reads_and_accumulates[0]

    @property
    def accumulates(self) -> bool:
        return self._reads_and_accumulates[1]

    @property
    def reduces(self) -> tuple[bool, ...]:
        """Per loop, whether it is a commutative reduction."""
        return tuple(int(iv.iter_type) == REDUCTION for iv in self.loops)

    @property
    def data_parallel(self) -> bool:
        """Every loop is data-parallel (no reduction, no ordered or opaque iterator)."""
        return all(int(iv.iter_type) == SPATIAL for iv in self.loops)

    def reduction_op(self, store: tirx.BufferStore) -> str:
        """The reduction ``store`` performs (``C = f(C, ...)``): ``dot`` for a sum of products
        of two different tensors (a sum of squares, as in a variance, is a ``reduceSum``),
        ``reduceSum``, ``reduceMax``, ``reduceMin`` or ``reduceProd``."""
        value = store.value
        kind = type(value).__name__
        if kind == "Add":
            for side in (value.a, value.b):
                if isinstance(side, Load) and side.source.same_as(store.buffer):
                    continue
                if type(side).__name__ == "Mul" and _is_product(side):
                    return "dot"
            return "reduceSum"
        return {"Max": "reduceMax", "Min": "reduceMin", "Mul": "reduceProd"}.get(kind, "reduceSum")

    def index_dims(self, indices: list) -> tuple[int | None, ...]:
        """For each index of an access, the position in :attr:`loops` of the loop that indexes
        it bare, or None (an expression, a constant, a unit iterator).

        Indices are simplified under the iterator ranges first: a legalized reshape that only
        inserts or drops unit dimensions indexes with ``(i * 16 + j) // 16``-style expressions
        that fold back to ``i``; with symbolic sizes (which the simplifier cannot divide by)
        TVM's iterator-map detection recognizes the split of fused iterators.
        """
        analyzer = self._bound_analyzer()
        dims: list[int | None] = []
        for index in indices:
            if not isinstance(index, tirx.Var):
                index = analyzer.simplify(index)
            if not isinstance(index, tirx.Var) and self._domain:
                split = _split_iterator(index, self._domain, analyzer)
                index = split if split is not None else index
            dims.append(self._positions.get(index.id_) if isinstance(index, tirx.Var) else None)
        return tuple(dims)

    def _bound_analyzer(self) -> tvm.sym.Analyzer:
        if self._analyzer is None:
            analyzer = tvm.sym.Analyzer()
            for iv in self.block.iter_vars:
                analyzer.bind(iv.var, iv.dom)
            if not all(isinstance(iv.dom.extent, tirx.IntImm) for iv in self.block.iter_vars):
                self._domain = {iv.var: iv.dom for iv in self.loops}
            self._analyzer = analyzer
        return self._analyzer


def expr_ops(expr: tvm.ir.Expr) -> list[str]:
    """Operation names of a value, in first-met order (not looking into indices): ``add``,
    ``mul``, ``exp`` ..."""
    names: list[str] = []

    def visit(node: object) -> None:
        if isinstance(node, (Load, tirx.Var, tirx.IntImm, tirx.FloatImm)):
            return
        if isinstance(node, tvm.ir.Call):
            name = str(getattr(node.op, "name", "call")).rsplit(".", 1)[-1]
            children = list(node.args)
        else:
            name = type(node).__name__.lower()
            children = [getattr(node, f, None) for f in _OPERANDS]
        if name not in names:
            names.append(name)
        for child in children:
            if isinstance(child, tvm.ir.Expr):
                visit(child)

    visit(expr)
    return names


def count_ops(expr: tvm.ir.Expr, *, indices: bool = True) -> tuple[int, int]:
    """Arithmetic operations and calls of a value, and how many of them are transcendental;
    with ``indices=False`` the index arithmetic inside loads is not counted (what the value
    computes, not where it reads)."""
    flops, trans = [0], [0]

    def visit(node: object) -> None:
        if isinstance(node, tvm.ir.Call) and isinstance(node.op, tvm.ir.Op):
            if node.op.name in TRANSCENDENTAL:
                trans[0] += 1
            flops[0] += 1
        elif isinstance(node, _ARITHMETIC):
            flops[0] += 1

    if indices:
        walk_expr(expr, visit)
    else:
        _walk_value(expr, visit)
    return flops[0], trans[0]


def _walk_value(expr: object, visit) -> None:  # noqa: ANN001
    """Pre-order over a value's operands, not into loads (their indices are addresses)."""
    visit(expr)
    if isinstance(expr, Load):
        return
    for name in _OPERANDS:
        child = getattr(expr, name, None)
        if isinstance(child, tvm.ir.Expr):
            _walk_value(child, visit)
    for child in getattr(expr, "args", None) or ():
        if isinstance(child, tvm.ir.Expr):
            _walk_value(child, visit)


def _is_product(mul: tvm.ir.Expr) -> bool:
    """Both factors read tensors, and not the same ones (``a[i, k] * b[k, j]``)."""
    left, right = _sources(mul.a), _sources(mul.b)
    return bool(left) and bool(right) and left != right


def _sources(expr: tvm.ir.Expr) -> frozenset[int]:
    return frozenset(load.source.id_ for load in loads(expr))


def _split_iterator(
    index: tvm.ir.Expr, domain: dict, analyzer: tvm.sym.Analyzer
) -> tirx.Var | None:
    """The iterator ``index`` selects when it splits fused iterators back apart, else None:
    ``((i*s + j)*s + k) // (s*s)`` is a split of the fused ``i, j, k`` whose lower factor and
    extent are those of ``i``."""
    found = tvm.sym.detect_iter_map([index], domain, check_level="surjective")
    if len(found.indices) != 1:
        return None
    expr = found.indices[0]
    if len(expr.args) != 1 or not analyzer.can_prove_equal(expr.base, 0):
        return None
    split = expr.args[0]
    return _split_source(split, analyzer) if analyzer.can_prove_equal(split.scale, 1) else None


def _split_source(split: tvm.sym.IterSplitExpr, analyzer: tvm.sym.Analyzer) -> tirx.Var | None:
    def equal(a: object, b: object) -> bool:
        return bool(analyzer.can_prove_equal(a, b))

    mark = split.source
    source = mark.source
    if isinstance(source, tirx.Var):
        whole = equal(split.lower_factor, 1) and equal(split.extent, mark.extent)
        return source if whole else None
    if isinstance(source, tvm.sym.IterSumExpr) and equal(source.base, 0):
        for part in source.args:  # the fused iterator whose stride and extent the split takes
            if equal(part.scale, split.lower_factor) and equal(part.extent, split.extent):
                return _split_source(part, analyzer)
    return None


def block_infos(func: tirx.PrimFunc) -> list[BlockInfo]:
    """Every block of ``func`` that stores something, in program order."""
    return [info for info in map(BlockInfo, blocks(func.body)) if info.stores]
