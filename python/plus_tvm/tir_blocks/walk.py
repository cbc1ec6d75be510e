"""Walkers over TIR statements and expressions: blocks, their stores, the loads of a value.

TVM 0.27's Python API has no ``StmtExprVisitor``; these walk the node fields generically, which
covers what PrimFunc bodies hold after legalization, fusion and scheduling.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import tvm
from tvm import tirx
from tvm.s_tir import SBlock, SBlockRealize

Load = tvm.ir.TensorLoad  # TIR buffer loads are ``ir.TensorLoad`` nodes in TVM 0.27
_FIELDS = ("a", "b", "value", "condition", "true_value", "false_value", "base", "body")
_LIST_FIELDS = ("args", "indices")


def walk_expr(expr: object, visit: Callable[[object], None]) -> None:
    """Pre-order walk over an expression's operands (generic over node classes)."""
    visit(expr)
    for name in _FIELDS:
        child = getattr(expr, name, None)
        if isinstance(child, tvm.ir.Expr):
            walk_expr(child, visit)
    for name in _LIST_FIELDS:
        for child in getattr(expr, name, None) or ():
            if isinstance(child, tvm.ir.Expr):
                walk_expr(child, visit)


def nodes(expr: tvm.ir.Expr) -> list[object]:
    """Every node of ``expr``, pre-order."""
    out: list[object] = []
    walk_expr(expr, out.append)
    return out


def blocks(stmt: tirx.Stmt) -> Iterator[SBlock]:
    """Every block under ``stmt`` (the root block itself included)."""
    if isinstance(stmt, SBlockRealize):
        yield stmt.block
        yield from blocks(stmt.block.body)
    elif isinstance(stmt, SBlock):
        yield stmt
        yield from blocks(stmt.body)
    elif isinstance(stmt, tirx.SeqStmt):
        for s in stmt.seq:
            yield from blocks(s)
    elif isinstance(stmt, tirx.IfThenElse):
        yield from blocks(stmt.then_case)
        if stmt.else_case is not None:
            yield from blocks(stmt.else_case)
    elif hasattr(stmt, "body") and isinstance(stmt.body, tirx.Stmt):
        yield from blocks(stmt.body)  # For, While, LetStmt, AttrStmt, DeclBuffer, ...


def stores(stmt: tirx.Stmt, *, in_loops: bool = False) -> Iterator[tirx.BufferStore]:
    """Stores directly in a block body (not inside nested blocks); with ``in_loops`` only those
    under a ``For`` of ``stmt`` (the opaque code of ``te.extern`` kernels)."""
    yield from _stores(stmt, not in_loops)


def _stores(stmt: tirx.Stmt, take: bool) -> Iterator[tirx.BufferStore]:
    if isinstance(stmt, tirx.BufferStore):
        if take:
            yield stmt
    elif isinstance(stmt, tirx.SeqStmt):
        for s in stmt.seq:
            yield from _stores(s, take)
    elif isinstance(stmt, tirx.IfThenElse):
        yield from _stores(stmt.then_case, take)
        if stmt.else_case is not None:
            yield from _stores(stmt.else_case, take)
    elif isinstance(stmt, (SBlockRealize, SBlock)):
        return
    elif hasattr(stmt, "body") and isinstance(stmt.body, tirx.Stmt):
        yield from _stores(stmt.body, take or isinstance(stmt, tirx.For))


def loads(expr: tvm.ir.Expr) -> list:
    """Loads of ``expr`` that are values, not indices of another load."""
    found: list = []
    inner: set[int] = set()

    def visit(node: object) -> None:
        if isinstance(node, Load):
            for idx in node.indices:
                walk_expr(idx, lambda n: inner.add(id(n)) if isinstance(n, Load) else None)
            found.append(node)

    walk_expr(expr, visit)
    return [ld for ld in found if id(ld) not in inner]


def expr_vars(expr: tvm.ir.Expr) -> set[tirx.Var]:
    """The variables ``expr`` uses."""
    out: set[tirx.Var] = set()
    walk_expr(expr, lambda n: out.add(n) if isinstance(n, tirx.Var) else None)
    return out


def has_load(expr: tvm.ir.Expr) -> bool:
    """Whether ``expr`` reads memory."""
    return any(isinstance(n, Load) for n in nodes(expr))


def if_then_else(expr: object) -> tuple | None:
    """``(condition, then, otherwise)`` of a ``T.if_then_else`` call, else None."""
    if (
        isinstance(expr, tvm.ir.Call)
        and isinstance(expr.op, tvm.ir.Op)
        and expr.op.same_as(_IF_THEN_ELSE)
    ):
        return tuple(expr.args)
    return None


_IF_THEN_ELSE = tvm.ir.Op.get("prim.if_then_else")


def gathers(expr: tvm.ir.Expr) -> bool:
    """Whether a load in ``expr`` has an index that reads memory (``a[i[v]]``)."""
    return any(isinstance(n, Load) and any(has_load(i) for i in n.indices) for n in nodes(expr))


def stores_any(func: tirx.PrimFunc, match: Callable[[object], bool]) -> bool:
    """Whether a value stored by a block of ``func`` (body or init) has a node ``match``
    accepts: the cheap check a TIR rewrite makes before rebuilding a PrimFunc."""
    found: list = []

    def look(e: object) -> None:
        if not found and match(e):
            found.append(e)

    for block in blocks(func.body):
        for part in (block.body, block.init):
            for store in stores(part) if part is not None else ():
                walk_expr(store.value, look)
        if found:
            return True
    return False


def is_opaque(block: SBlock) -> bool:
    """A block without iterators that stores inside loops of its own: code from ``te.extern``
    or the IR builder (scatter, cumsum, sort), whose accesses TensorIR cannot see."""
    if block.iter_vars:
        return False
    return any(True for _ in stores(block.body, in_loops=True))


def static_shared_bytes(func: tirx.PrimFunc) -> int | None:
    """Bytes of the ``shared``-scope buffers the blocks of ``func`` allocate, as declared (CUDA's
    static ``__shared__`` arrays, at most 48 KiB per block on every NVIDIA GPU); ``None`` when a
    buffer's size is symbolic. Dynamic shared memory (``shared.dyn``) is not counted. On a
    scheduled function before lowering this is an upper bound: lowering compacts each buffer to
    the region one thread block touches."""
    total = 0
    for block in blocks(func.body):
        for buf in block.alloc_buffers:
            if buf.scope() != "shared":
                continue
            elems = 1
            for dim in buf.shape:
                if not isinstance(dim, tirx.IntImm):
                    return None
                elems *= int(dim)
            dtype = tvm.runtime.DataType(str(buf.dtype))
            total += elems * ((dtype.bits * dtype.lanes + 7) // 8)
    return total


def written_params(func: tirx.PrimFunc) -> set[int]:
    """Positions of the parameters (buffers) ``func`` writes, by declared block writes and by
    stores, opaque code included: a kernel's outputs in destination-passing style."""
    written: list = []
    for block in blocks(func.body):
        written += [region.source for region in block.writes]
        for part in (block.body, block.init):
            if part is not None:
                written += [s.buffer for s in stores(part)]
                written += [s.buffer for s in stores(part, in_loops=True)]
    return {i for i, p in enumerate(func.params) if any(w.same_as(p) for w in written)}
