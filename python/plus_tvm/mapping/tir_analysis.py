"""Derive the mapping class of a TIR PrimFunc from its blocks' index maps.

This is what lets user-written ``call_tir`` functions and already fused kernels take part in
mapping-type fusion: nothing about the operator name is needed, only how each block's stores
index its loads (paper 004, section 3.1.1, read off the loop nest).

Per block:

- a reduction iterator (extent > 1)                                  -> ManyToMany
- per load of the stored value, compared with the store's indices:
  - indices that read another buffer (a gather)                      -> Reorganize
  - the load does not depend on every spatial iterator               -> a broadcast side input
  - same indices, same buffer shape                                  -> OneToOne
  - bare iterators, same set, another order                          -> Shuffle
  - affine and injective (slice, pad, concat piece, expand_dims)     -> Reorganize
  - otherwise: folded indices (div/mod); as many input elements as
    output elements is a reshape (Reorganize), fewer is tile/repeat  -> OneToMany
  The block's class is the most complex class among loads that depend on every spatial
  iterator; when no load does (broadcast_to, outer broadcasting) or there is no load at all
  (fills, arange), it is OneToMany.
- A PrimFunc with no analysable block (opaque extern code: sort, scans) is NotFuse.

The PrimFunc's class is the most complex class of its blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import tirx
from tvm.s_tir import SBlock, SBlockRealize

from .classes import MapPattern, most_complex

_DATA_PAR = 0
_Load = tvm.ir.TensorLoad  # TIR buffer loads are ``ir.TensorLoad`` nodes in TVM 0.27
_FIELDS = ("a", "b", "value", "condition", "true_value", "false_value", "base", "body")
_LIST_FIELDS = ("args", "indices")


# ------------------------------------------------------------------------------------ walkers
def _walk_expr(expr: object, visit: Callable[[object], None]) -> None:
    """Pre-order walk over an expression's operands (generic over node classes)."""
    visit(expr)
    for name in _FIELDS:
        child = getattr(expr, name, None)
        if isinstance(child, tvm.ir.Expr):
            _walk_expr(child, visit)
    for name in _LIST_FIELDS:
        for child in getattr(expr, name, None) or ():
            if isinstance(child, tvm.ir.Expr):
                _walk_expr(child, visit)


def _blocks(stmt: tirx.Stmt) -> Iterator[SBlock]:
    """Every block under ``stmt`` (the root block itself included)."""
    if isinstance(stmt, SBlockRealize):
        yield stmt.block
        yield from _blocks(stmt.block.body)
    elif isinstance(stmt, SBlock):
        yield stmt
        yield from _blocks(stmt.body)
    elif isinstance(stmt, tirx.SeqStmt):
        for s in stmt.seq:
            yield from _blocks(s)
    elif isinstance(stmt, tirx.IfThenElse):
        yield from _blocks(stmt.then_case)
        if stmt.else_case is not None:
            yield from _blocks(stmt.else_case)
    elif hasattr(stmt, "body") and isinstance(stmt.body, tirx.Stmt):
        yield from _blocks(stmt.body)  # For, While, LetStmt, AttrStmt, DeclBuffer, ...


def _stores(stmt: tirx.Stmt) -> Iterator[tirx.BufferStore]:
    """Stores directly in a block body (not inside nested blocks)."""
    if isinstance(stmt, tirx.BufferStore):
        yield stmt
    elif isinstance(stmt, tirx.SeqStmt):
        for s in stmt.seq:
            yield from _stores(s)
    elif isinstance(stmt, tirx.IfThenElse):
        yield from _stores(stmt.then_case)
        if stmt.else_case is not None:
            yield from _stores(stmt.else_case)
    elif isinstance(stmt, (SBlockRealize, SBlock)):
        return
    elif hasattr(stmt, "body") and isinstance(stmt.body, tirx.Stmt):
        yield from _stores(stmt.body)


def stores_any(func: tirx.PrimFunc, match: Callable[[object], bool]) -> bool:
    """Whether a value stored by a block of ``func`` (body or init) has a node ``match``
    accepts: the cheap check a TIR rewrite makes before rebuilding a PrimFunc."""
    found: list = []

    def look(e: object) -> None:
        if not found and match(e):
            found.append(e)

    for block in _blocks(func.body):
        for part in (block.body, block.init):
            for store in _stores(part) if part is not None else ():
                _walk_expr(store.value, look)
        if found:
            return True
    return False


def _loads(expr: tvm.ir.Expr) -> list:
    """Loads of ``expr`` that are values, not indices of another load."""
    found: list = []
    inner: set[int] = set()

    def visit(node: object) -> None:
        if isinstance(node, _Load):
            for idx in node.indices:
                _walk_expr(idx, lambda n: inner.add(id(n)) if isinstance(n, _Load) else None)
            found.append(node)

    _walk_expr(expr, visit)
    return [ld for ld in found if id(ld) not in inner]


def _vars(expr: tvm.ir.Expr) -> set[tirx.Var]:
    out: set[tirx.Var] = set()
    _walk_expr(expr, lambda n: out.add(n) if isinstance(n, tirx.Var) else None)
    return out


def _has_load(expr: tvm.ir.Expr) -> bool:
    hits: list[object] = []
    _walk_expr(expr, lambda n: hits.append(n) if isinstance(n, _Load) else None)
    return bool(hits)


# ----------------------------------------------------------------------------------- analysis
@dataclass(frozen=True)
class AccessClass:
    """How one load relates to the store it feeds."""

    pattern: MapPattern
    covers_all: bool  # depends on every spatial iterator (not a broadcast side input)
    rank_only: bool = False  # the output's elements at the output's indices, rank differs


def _shape(buffer: tirx.Var) -> list:
    """Shape of a buffer: in TVM 0.27 buffers are variables of ``BufferType``."""
    return list(buffer.ty.shape)


def _numel(buffer: tirx.Var) -> tvm.ir.Expr:
    total: tvm.ir.Expr = tirx.IntImm("int64", 1)
    for dim in _shape(buffer):
        total = (
            total * tirx.Cast("int64", dim)
            if not isinstance(dim, tirx.IntImm)
            else (total * tirx.IntImm("int64", int(dim)))
        )
    return total


def _affine_injective(indices: list, spatial: set[tirx.Var]) -> bool:
    """Each index uses at most one spatial iterator, each iterator exactly one index, and no
    index folds (div/mod): ``c * v + k`` forms, which read every input element at most once."""
    seen: set[tirx.Var] = set()
    for idx in indices:
        if any(isinstance(n, _FOLDING) for n in _nodes(idx)):
            return False
        used = _vars(idx) & spatial
        if len(used) > 1 or used & seen:
            return False
        seen |= used
    return seen == spatial


_FOLDING = (tirx.FloorDiv, tirx.FloorMod, tirx.Div, tirx.Mod)


def _nodes(expr: tvm.ir.Expr) -> list[object]:
    out: list[object] = []
    _walk_expr(expr, out.append)
    return out


def _same_index(a: tvm.ir.Expr, b: tvm.ir.Expr, unit: frozenset[tirx.Var]) -> bool:
    """Structural equality, with iterators of extent 1 equal to the constant 0."""

    def norm(e: tvm.ir.Expr) -> object:
        if isinstance(e, tirx.Var) and e in unit:
            return 0
        if isinstance(e, tirx.IntImm) and int(e) == 0:
            return 0
        return e

    na, nb = norm(a), norm(b)
    if isinstance(na, int) or isinstance(nb, int):
        return isinstance(na, int) and isinstance(nb, int)
    return tvm_ffi.structural_equal(na, nb, map_free_vars=False)


def _drop_units(li: list, unit: frozenset[tirx.Var], wi: list) -> bool:
    """Whether ``li`` and ``wi`` are equal once unit iterators and zeros are removed."""

    def keep(e: tvm.ir.Expr) -> bool:
        return not (
            (isinstance(e, tirx.Var) and e in unit) or (isinstance(e, tirx.IntImm) and int(e) == 0)
        )

    a, b = [e for e in li if keep(e)], [e for e in wi if keep(e)]
    return len(a) == len(b) and all(
        tvm_ffi.structural_equal(x, y, map_free_vars=False) for x, y in zip(a, b)
    )


def classify_access(
    source: tirx.Var,
    indices: list,
    store: tirx.BufferStore,
    spatial: set[tirx.Var],
    unit: frozenset[tirx.Var] = frozenset(),
) -> AccessClass:
    """The mapping class of one load (of ``source`` at ``indices``) with respect to the store
    whose value it feeds, given the block's spatial iterators (and those of extent 1)."""
    li, wi = list(indices), list(store.indices)
    if any(_has_load(i) for i in li):
        return AccessClass(MapPattern.Reorganize, True)  # gather: data-dependent index
    used: set[tirx.Var] = set()
    for i in li:
        used |= _vars(i) & spatial
    if used != spatial:
        return AccessClass(MapPattern.OneToMany, False)
    src_shape, dst_shape = _shape(source), _shape(store.buffer)
    same_shape = len(src_shape) == len(dst_shape) and all(
        tvm_ffi.structural_equal(a, b) for a, b in zip(src_shape, dst_shape)
    )
    if len(li) == len(wi) and same_shape and all(_same_index(a, b, unit) for a, b in zip(li, wi)):
        return AccessClass(MapPattern.OneToOne, True)
    if _drop_units(li, unit, wi):
        # x[i, j] stored to y[i, 0, j] (or b[j] added to x[0, j]): the same elements, another
        # rank -- expand_dims / squeeze alone, a broadcast operand beside an identity load.
        return AccessClass(MapPattern.Reorganize, True, rank_only=True)
    bare = all(isinstance(i, tirx.Var) for i in li) and all(isinstance(i, tirx.Var) for i in wi)
    if (
        bare
        and len(li) == len(wi)
        and {*li} == {*wi}
        and not all(x.same_as(y) for x, y in zip(li, wi))
    ):
        return AccessClass(MapPattern.Shuffle, True)
    if _affine_injective(li, spatial):
        return AccessClass(MapPattern.Reorganize, True)
    analyzer = tvm.sym.Analyzer()
    if analyzer.can_prove(_numel(source) >= _numel(store.buffer)):
        return AccessClass(MapPattern.Reorganize, True)  # reshape-like: a bijection
    return AccessClass(MapPattern.OneToMany, True)  # folded and smaller: tile / repeat


def classify_block(block: SBlock) -> MapPattern | None:
    """The class of one block, or None for a block without computation (the root)."""
    stores = list(_stores(block.body))
    if not stores:
        return None
    iters = [iv for iv in block.iter_vars if not _is_unit(iv)]
    if any(int(iv.iter_type) != _DATA_PAR for iv in iters):
        return MapPattern.ManyToMany
    spatial = {iv.var for iv in iters}
    unit = frozenset(iv.var for iv in block.iter_vars if _is_unit(iv))
    classes: list[AccessClass] = []
    for store in stores:
        for load in _loads(store.value):
            if load.source.same_as(store.buffer):
                return MapPattern.ManyToMany  # accumulation into its own output
            classes.append(classify_access(load.source, load.indices, store, spatial, unit))
    identity = any(c.pattern == MapPattern.OneToOne for c in classes)
    covering = [c.pattern for c in classes if c.covers_all and not (identity and c.rank_only)]
    if not covering:
        return MapPattern.OneToMany  # every input is broadcast, or values are generated
    return most_complex(*covering)


def _is_unit(iv: tirx.IterVar) -> bool:
    extent = iv.dom.extent
    return isinstance(extent, tirx.IntImm) and int(extent) == 1


def analyze_primfunc(func: tirx.PrimFunc) -> MapPattern:
    """The mapping class of a PrimFunc: the most complex class among its blocks.

    A PrimFunc without any analysable block (opaque code from ``te.extern`` or the IR builder,
    such as sort or scan kernels) is ``NotFuse``.
    """
    if not _mergeable_buffers(func):
        return MapPattern.NotFuse
    blocks = list(_blocks(func.body))
    if any(_is_opaque(b) for b in blocks):
        return MapPattern.NotFuse
    classes = [c for c in (classify_block(b) for b in blocks) if c is not None]
    if not classes:
        return MapPattern.NotFuse
    return most_complex(*classes)


def _mergeable_buffers(func: tirx.PrimFunc) -> bool:
    """Whether every buffer parameter is a plain compact buffer (offset 0, no strides).

    The extern kernels of scatter / cumsum take buffers with a symbolic ``elem_offset``;
    FuseTIR cannot map them onto a fused kernel's buffers ("Inconsistent buffers ... mapped to
    the same relax var"), and TVM marks such kernels opaque.
    """
    for param in func.params:
        ty = param.ty
        if not hasattr(ty, "elem_offset"):
            continue  # a scalar parameter
        offset = ty.elem_offset
        if not (isinstance(offset, tirx.IntImm) and int(offset) == 0):
            return False
        if ty.strides is not None and len(ty.strides) > 0:
            return False
    return True


def _is_opaque(block: SBlock) -> bool:
    """A block without iterators that stores inside loops of its own: code from ``te.extern``
    or the IR builder (scatter, cumsum, sort), whose accesses TensorIR cannot see."""
    if block.iter_vars:
        return False
    return any(True for _ in _stores_in_loops(block.body))


def _stores_in_loops(stmt: tirx.Stmt, in_loop: bool = False) -> Iterator[tirx.BufferStore]:
    """Stores under a loop of ``stmt``, not inside nested blocks."""
    if isinstance(stmt, tirx.BufferStore):
        if in_loop:
            yield stmt
    elif isinstance(stmt, tirx.SeqStmt):
        for s in stmt.seq:
            yield from _stores_in_loops(s, in_loop)
    elif isinstance(stmt, tirx.IfThenElse):
        yield from _stores_in_loops(stmt.then_case, in_loop)
        if stmt.else_case is not None:
            yield from _stores_in_loops(stmt.else_case, in_loop)
    elif isinstance(stmt, (SBlockRealize, SBlock)):
        return
    elif hasattr(stmt, "body") and isinstance(stmt.body, tirx.Stmt):
        yield from _stores_in_loops(stmt.body, in_loop or isinstance(stmt, tirx.For))
