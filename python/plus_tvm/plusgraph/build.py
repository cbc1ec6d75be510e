"""Build +Graphs from TIR loop nests: +Loops per block, merge primitives 1-3, collapse (4).

Every block of a PrimFunc is a *basic operator*: its block iterators are its loops (spatial
ones parallelizable, reduction ones not), the operations of its body are the loop's operations
(``dot`` / ``reduceSum`` / ``reduceMax`` / ``reduceMin`` for reductions, ``add``, ``exp`` ...
otherwise), and its loads and store give the tensors it reads and writes. Because +Loops come
from TIR, a user's ``call_tir`` PrimFunc gets them exactly like a legalized Relax op.

Operators are merged one after another through their *hub tensors* (paper 000, §4.1): for each
loop of the incoming operator that indexes a dimension of a tensor already in the subgraph, the
subgraph loop over that dimension is ``prev_loop`` and

1. both parallelizable, same size                 -> merged (primitive 1);
2. prev parallelizable, cur not, same size        -> merged, now non-parallelizable (2);
3. prev non-parallelizable (or no counterpart)    -> a new loop (3).

An *epilogue* (it reads subgraph outputs) looks its loops up among the loops that wrote the hub
tensor; a *prologue* (it writes a subgraph input) among the loops that read it. Parallel
iterators are taken in the nesting order of their counterparts, which makes a transpose merge
with the loops it permutes. Finally ``collapse`` applies primitive 4: a loop whose only nested
loop has the same parallelism and touches exactly the same tensors absorbs it (``B*L``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import tvm
from tvm import tirx

from ..tir_blocks import BlockInfo, block_infos, expr_ops
from .loops import PlusGraph, PlusLoop, Size


@dataclass(frozen=True)
class TensorAccess:
    """A tensor access: for each tensor dimension, the position of the block iterator that
    indexes it bare, or None (an expression, a constant, a unit dimension)."""

    tensor: str
    dims: tuple[int | None, ...]


@dataclass(frozen=True)
class LoopOperator:
    """One TIR block seen as a basic operator of +Loops (paper 000, section 4.1)."""

    name: str
    sizes: tuple[Size, ...]  # per block iterator (unit iterators are dropped)
    reduce: tuple[bool, ...]
    ops: tuple[str, ...]
    reads: tuple[TensorAccess, ...]
    writes: tuple[TensorAccess, ...]

    @property
    def is_skeleton(self) -> bool:
        return any(self.reduce)


# ----------------------------------------------------------------------------- TIR -> LoopOperator
def _size(extent: tvm.ir.Expr) -> Size:
    if isinstance(extent, tirx.IntImm):
        return int(extent)
    return str(extent).replace(" ", "")


def loop_operators(func: tirx.PrimFunc, names: list[str], prefix: str) -> list[LoopOperator]:
    """The basic operators of ``func`` in program order.

    ``names`` names the PrimFunc's parameters (inputs then outputs) with the subgraph's tensor
    names; buffers allocated inside are called ``<prefix>.<buffer>``.
    """
    tensor_of: dict[int, str] = {p.id_: n for p, n in zip(func.params, names)}

    def name(buf: object) -> str:
        key = buf.id_
        if key not in tensor_of:
            tensor_of[key] = f"{prefix}.{getattr(buf, 'name', 'buf')}"
        return tensor_of[key]

    return [_operator(info, name, prefix) for info in block_infos(func)]


def _operator(info: BlockInfo, name, prefix: str) -> LoopOperator:  # noqa: ANN001
    reduce = info.reduces
    ops: list[str] = []
    writes: list[TensorAccess] = []
    for store in info.stores:
        writes.append(TensorAccess(name(store.buffer), info.index_dims(list(store.indices))))
        if any(reduce):
            op = info.reduction_op(store)
            if op not in ops:
                ops.append(op)
        for op in expr_ops(store.value):
            if op not in ops and not (any(reduce) and op in ("add", "max", "min")):
                ops.append(op)
    reads = [
        TensorAccess(name(load.source), info.index_dims(list(load.indices)))
        for _, load in info.reads
    ]
    return LoopOperator(
        name=f"{prefix}.{info.name}",
        sizes=tuple(_size(iv.dom.extent) for iv in info.loops),
        reduce=reduce,
        ops=tuple(ops),
        reads=tuple(dict.fromkeys(reads)),
        writes=tuple(dict.fromkeys(writes)),
    )


# ------------------------------------------------------------------------------- the builder
@dataclass(eq=False)
class _Loop:
    size: Size
    parallel: bool
    parent: _Loop | None
    ops: list[str] = field(default_factory=list)
    children: list[_Loop] = field(default_factory=list)
    tensors: set[str] = field(default_factory=set)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)

    def depth(self) -> int:
        return 0 if self.parent is None else 1 + self.parent.depth()


class PlusGraphBuilder:
    """Accumulates basic operators into one subgraph's +Graph (the merge primitives)."""

    def __init__(self) -> None:
        self._roots: list[_Loop] = []
        self._writer: dict[str, dict[int, _Loop]] = {}  # tensor -> dim -> loop that wrote it
        self._reader: dict[str, dict[int, _Loop]] = {}  # tensor -> dim -> first loop reading it

    # -- public --------------------------------------------------------------------------
    def add(self, op: LoopOperator, *, prologue: bool = False) -> None:
        """Merge ``op`` as an epilogue (default) or as a prologue of the subgraph."""
        cands: list[_Loop | None] = [None] * len(op.sizes)
        accesses = op.writes if prologue else op.reads
        table = self._reader if prologue else self._writer
        for acc in accesses:
            known = table.get(acc.tensor, {})
            for dim, pos in enumerate(acc.dims):
                if pos is not None and cands[pos] is None and dim in known:
                    cands[pos] = known[dim]
        order = self._order(op, cands)
        parent: _Loop | None = None
        chosen: list[_Loop] = [None] * len(op.sizes)  # type: ignore[list-item]
        for pos in order:
            size, red, cand = op.sizes[pos], op.reduce[pos], cands[pos]
            siblings = self._roots if parent is None else parent.children
            ok = cand is not None and _below(cand, parent) and cand.size == size
            if prologue:
                # the producer's loop is prev_loop: a reduction in it cannot merge (3)
                ok = ok and not red
            else:
                ok = ok and cand.parallel
            if ok:
                loop = cand
                if red:
                    loop.parallel = False  # primitive 2
            else:
                loop = _Loop(size, not red, parent)  # primitive 3 / no counterpart
                if prologue:
                    siblings.insert(0, loop)
                else:
                    siblings.append(loop)
            chosen[pos] = loop
            parent = loop
        inner = parent
        if inner is not None:
            for name in op.ops:
                if name not in inner.ops:
                    inner.ops.append(name)
        for acc in (*op.reads, *op.writes):
            for pos in acc.dims:
                if pos is not None:
                    chosen[pos].tensors.add(acc.tensor)
        self._record(op, chosen, inner)

    def graph(self, *, collapse_loops: bool = True) -> PlusGraph:
        """The +Graph so far (with primitive 4 applied unless ``collapse_loops`` is False)."""
        sets: dict[int, frozenset[str]] = {}

        def freeze(loop: _Loop) -> PlusLoop:
            frozen = _freeze(loop, freeze)
            sets[id(frozen)] = frozenset(loop.tensors)
            return frozen

        graph = PlusGraph(tuple(freeze(r) for r in self._roots))
        return collapse(graph, sets) if collapse_loops else graph

    # -- internals -----------------------------------------------------------------------
    def _order(self, op: LoopOperator, cands: list[_Loop | None]) -> list[int]:
        """Spatial iterators in the nesting order of their counterparts, reductions last."""

        def key(pos: int) -> tuple[int, int, int]:
            cand = cands[pos]
            depth = cand.depth() if cand is not None else 1 << 20
            return (int(op.reduce[pos]), depth if not op.reduce[pos] else 0, pos)

        return sorted(range(len(op.sizes)), key=key)

    def _record(self, op: LoopOperator, chosen: list[_Loop], inner: _Loop | None) -> None:
        for acc in op.writes:
            self._writer[acc.tensor] = {
                d: chosen[p] for d, p in enumerate(acc.dims) if p is not None
            }
            if inner is not None and acc.tensor not in inner.outputs:
                inner.outputs.append(acc.tensor)
        for acc in op.reads:
            known = self._reader.setdefault(acc.tensor, {})
            for d, p in enumerate(acc.dims):
                if p is not None:
                    known.setdefault(d, chosen[p])
            if inner is not None and acc.tensor not in inner.inputs:
                inner.inputs.append(acc.tensor)

    def copy(self) -> PlusGraphBuilder:
        """An independent copy (identification tries an extension and may drop it)."""
        clone = PlusGraphBuilder()
        mapping: dict[int, _Loop] = {}

        def dup(loop: _Loop, parent: _Loop | None) -> _Loop:
            new = _Loop(
                loop.size,
                loop.parallel,
                parent,
                list(loop.ops),
                [],
                set(loop.tensors),
                list(loop.inputs),
                list(loop.outputs),
            )
            mapping[id(loop)] = new
            new.children = [dup(c, new) for c in loop.children]
            return new

        clone._roots = [dup(r, None) for r in self._roots]
        clone._writer = {
            t: {d: mapping[id(lp)] for d, lp in m.items()} for t, m in self._writer.items()
        }
        clone._reader = {
            t: {d: mapping[id(lp)] for d, lp in m.items()} for t, m in self._reader.items()
        }
        return clone


def _below(loop: _Loop, ancestor: _Loop | None) -> bool:
    """``loop`` is nested (at any depth) in ``ancestor`` (None: the forest)."""
    if ancestor is None:
        return True
    node = loop.parent
    while node is not None:
        if node is ancestor:
            return True
        node = node.parent
    return False


def _freeze(loop: _Loop, freeze_child=None) -> PlusLoop:  # noqa: ANN001
    freeze_child = freeze_child or _freeze
    return PlusLoop(
        loop.size,
        loop.parallel,
        tuple(loop.ops),
        tuple(freeze_child(c) for c in loop.children),
        tuple(loop.inputs),
        tuple(loop.outputs),
    )


def collapse(graph: PlusGraph, tensors: dict[int, frozenset[str]] | None = None) -> PlusGraph:
    """Primitive 4: fold a loop into its only nested loop when both have the same parallelism
    and touch the same tensors (a batch matmul's ``[B, L, M, N, D]`` becomes
    ``[B*L, M, N, D]``). Without ``tensors`` (a parsed pattern) nothing is collapsed."""
    if tensors is None:
        return graph

    def fold(loop: PlusLoop) -> PlusLoop:
        children = tuple(fold(c) for c in loop.children)
        if len(loop.children) == 1:
            child = loop.children[0]
            same = tensors.get(id(loop)) == tensors.get(id(child))
            if same and child.parallel == loop.parallel:
                merged = children[0]
                ops = tuple(dict.fromkeys(loop.ops + merged.ops))
                return PlusLoop(
                    _product(loop.size, merged.size),
                    loop.parallel,
                    ops,
                    merged.children,
                    merged.inputs,
                    merged.outputs,
                )
        return PlusLoop(loop.size, loop.parallel, loop.ops, children, loop.inputs, loop.outputs)

    return PlusGraph(tuple(fold(r) for r in graph.roots))


def _product(a: Size, b: Size) -> Size:
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    return f"{a}*{b}"


def plusgraph_of(
    func: tirx.PrimFunc, names: list[str] | None = None, prefix: str = "f"
) -> PlusGraph:
    """The +Graph of one PrimFunc (all its blocks merged in program order)."""
    names = names or [getattr(p, "name", f"arg{i}") for i, p in enumerate(func.params)]
    builder = PlusGraphBuilder()
    for op in loop_operators(func, names, prefix):
        builder.add(op)
    return builder.graph()
