"""Rebuild TIR expressions and block bodies bottom-up with a replacement function.

TVM 0.27 has no Python ``StmtExprMutator``; this covers what block bodies hold after
legalization and scheduling: arithmetic and comparison nodes, ``Select``, ``Cast``, ``Let``,
calls, loads, and the statements ``BufferStore``, ``SeqStmt``, ``IfThenElse``, ``For``,
``LetStmt`` (a binding, without body in 0.27) and ``Evaluate``. :func:`map_stmt` leaves nested
blocks alone; :func:`map_blocks` walks a whole PrimFunc body, blocks included (without
``s_tir.Schedule``, whose verifier refuses some kernels that compile fine).
"""

from __future__ import annotations

from collections.abc import Callable

import tvm
from tvm import tirx
from tvm.ir.prim.expr import BinaryOpExpr

from .symbolic_divmod import fold_divmod

Replace = Callable[[tvm.ir.Expr], "tvm.ir.Expr | None"]


def map_expr(e: tvm.ir.Expr, replace: Replace, memo: dict | None = None) -> tvm.ir.Expr:
    """``e`` with ``replace`` applied to every node after its operands (``None``: keep).

    A node shared by several parents (an expression tree is a DAG: GIR's fast ``exp`` binds
    ``Let exp_x`` once and uses the node twice) maps to one shared result, so a ``Let`` is
    never duplicated into two definitions of its variable.
    """
    memo = {} if memo is None else memo
    key = e.__chandle__()
    hit = memo.get(key)
    if hit is not None:
        return hit[1]
    new = _rebuild(e, replace, memo)
    out = replace(new)
    out = new if out is None else out
    memo[key] = (e, out)  # keeps ``e`` alive, so its address is not reused while mapping
    return out


def _rebuild(e: tvm.ir.Expr, replace: Replace, memo: dict) -> tvm.ir.Expr:
    if isinstance(e, BinaryOpExpr):
        a, b = map_expr(e.a, replace, memo), map_expr(e.b, replace, memo)
        return e if a.same_as(e.a) and b.same_as(e.b) else type(e)(a, b)
    if isinstance(e, tirx.Not):
        a = map_expr(e.a, replace, memo)
        return e if a.same_as(e.a) else tirx.Not(a)
    if isinstance(e, tirx.Select):
        c = map_expr(e.condition, replace, memo)
        t = map_expr(e.true_value, replace, memo)
        f = map_expr(e.false_value, replace, memo)
        same = c.same_as(e.condition) and t.same_as(e.true_value) and f.same_as(e.false_value)
        return e if same else tirx.Select(c, t, f)
    if isinstance(e, tirx.Cast):
        v = map_expr(e.value, replace, memo)
        return e if v.same_as(e.value) else tirx.Cast(str(e.ty), v)
    if isinstance(e, tirx.Let):
        v, b = map_expr(e.value, replace, memo), map_expr(e.body, replace, memo)
        return e if v.same_as(e.value) and b.same_as(e.body) else tirx.Let(e.var, v, b)
    if isinstance(e, tvm.ir.Call) and isinstance(e.op, tvm.ir.Op):
        args = [map_expr(a, replace, memo) for a in e.args]
        if all(x.same_as(y) for x, y in zip(args, e.args)):
            return e
        return tvm.ir.Call(e.op, args, ret_ty=e.ty)
    if isinstance(e, tvm.ir.TensorLoad):
        indices = [map_expr(i, replace, memo) for i in e.indices]
        if all(x.same_as(y) for x, y in zip(indices, e.indices)):
            return e
        return tirx.BufferLoad(e.source, indices)
    return e  # leaves: Var, IntImm, FloatImm, Ramp, Broadcast, StringImm


def map_stmt(
    s: tirx.Stmt,
    replace: Replace,
    memo: dict | None = None,
    nested: Callable[[tirx.Stmt], tirx.Stmt] | None = None,
    on_store: Callable[[tirx.BufferStore], tirx.Stmt | None] | None = None,
) -> tirx.Stmt:
    """``s`` with :func:`map_expr` applied to the values it stores, tests and evaluates.

    Nested blocks (and statements this function does not know) go to ``nested`` when given,
    else are left as they are. ``on_store(store)``, when given, replaces a whole store first
    (``None``: map its value as usual).
    """
    memo = {} if memo is None else memo
    if isinstance(s, tirx.BufferStore):
        new = on_store(s) if on_store is not None else None
        if new is not None:
            return new
        value = map_expr(s.value, replace, memo)
        return s if value.same_as(s.value) else tirx.BufferStore(s.buffer, value, s.indices)
    if isinstance(s, tirx.SeqStmt):
        seq = [map_stmt(x, replace, memo, nested, on_store) for x in s.seq]
        return s if all(x.same_as(y) for x, y in zip(seq, s.seq)) else tirx.SeqStmt(seq)
    if isinstance(s, tirx.IfThenElse):
        cond = map_expr(s.condition, replace, memo)
        then = map_stmt(s.then_case, replace, memo, nested, on_store)
        other = (
            map_stmt(s.else_case, replace, memo, nested, on_store)
            if s.else_case is not None
            else None
        )
        same = cond.same_as(s.condition) and then.same_as(s.then_case)
        same = same and (other is None or other.same_as(s.else_case))
        return s if same else tirx.IfThenElse(cond, then, other)
    if isinstance(s, tirx.For):
        body = map_stmt(s.body, replace, memo, nested, on_store)
        if body.same_as(s.body):
            return s
        return tirx.For(
            s.loop_var, s.min, s.extent, s.kind, body, s.thread_binding, s.annotations, s.step
        )
    if isinstance(s, tirx.LetStmt):  # a binding statement in 0.27 (no body)
        value = map_expr(s.value, replace, memo)
        return s if value.same_as(s.value) else tirx.LetStmt(s.var, value)
    if isinstance(s, tirx.Evaluate):
        value = map_expr(s.value, replace, memo)
        return s if value.same_as(s.value) else tirx.Evaluate(value)
    if isinstance(s, tirx.AttrStmt):
        body = map_stmt(s.body, replace, memo, nested, on_store)
        return s if body.same_as(s.body) else tirx.AttrStmt(s.node, s.attr_key, s.value, body)
    return nested(s) if nested is not None else s  # nested blocks and the rest


BlockFilter = Callable[[object], bool]


def map_blocks(s: tirx.Stmt, replace: Replace, keep: BlockFilter | None = None) -> tirx.Stmt:
    """``s`` (a PrimFunc body) with :func:`map_expr` applied inside every block.

    ``keep(block)`` true leaves that block's own body and init as they are (its nested blocks
    are still visited).
    """
    memo: dict = {}

    def on_block(block: object, visit: Callable) -> object:
        if keep is not None and keep(block):
            body = visit(block.body)
            return block if body.same_as(block.body) else rebuilt_block(block, body=body)
        return _mapped_block(block, replace, memo, visit)

    return _map_block_tree(s, on_block)


def map_block_stores(
    s: tirx.Stmt, on_store: Callable[[tirx.BufferStore], tirx.Stmt | None]
) -> tirx.Stmt:
    """``s`` (a PrimFunc body) with every store of every block body and init replaced by
    ``on_store(store)`` (``None``: kept)."""
    memo: dict = {}

    def on_block(block: object, visit: Callable) -> object:
        body = map_stmt(block.body, _unchanged, memo, visit, on_store)
        init = block.init
        if init is not None:
            init = map_stmt(init, _unchanged, memo, visit, on_store)
        if body.same_as(block.body) and (init is None or init.same_as(block.init)):
            return block
        return rebuilt_block(block, body=body, init=init)

    return _map_block_tree(s, on_block)


def simplify_indices(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every load's indices simplified within its block's iterator domains.

    Relax's ``FuseTIR`` leaves a reshape's index arithmetic as written: a ``[1, n, d]`` to
    ``[n, d]`` reshape reads ``x[0, (j // d + i) % n, j % d]``, which is ``x[0, i, j]`` for
    ``i < n, j < d``; analyses that classify reads by their indices then see a gather.
    Over symbolic sizes the analyzer keeps ``(i * n + j) % (b * n)``, which
    :func:`~plus_tvm.tir_blocks.symbolic_divmod.fold_divmod` folds.
    """

    def on_block(block: object, visit: Callable) -> object:
        analyzer = tvm.sym.Analyzer()  # per block: it knows this block's iterators only
        for iv in block.iter_vars:
            analyzer.bind(iv.var, iv.dom)
        extents = {iv.var: iv.dom.extent for iv in block.iter_vars if _is_zero(iv.dom.min)}

        def replace(e: tvm.ir.Expr) -> tvm.ir.Expr | None:
            if not isinstance(e, tvm.ir.TensorLoad):
                return None
            indices = [  # plain iterators stay (a unit one is not folded to 0)
                i
                if isinstance(i, (tirx.Var, tirx.IntImm))
                else fold_divmod(analyzer.simplify(i), extents)
                for i in e.indices
            ]
            if all(tvm_structural_equal(a, b) for a, b in zip(indices, e.indices)):
                return None
            return tirx.BufferLoad(e.source, indices)

        return _mapped_block(block, replace, {}, visit)

    body = _map_block_tree(func.body, on_block)
    return func if body.same_as(func.body) else func.with_body(body)


def replace_blocks(func: tirx.PrimFunc, new: dict) -> tirx.PrimFunc:
    """``func`` with the blocks named in ``new`` replaced by ``new[name]`` (an ``SBlock``)."""

    def on_block(block: object, visit: Callable) -> object:
        found = new.get(block.name_hint)
        return found if found is not None else _mapped_block(block, _unchanged, {}, visit)

    body = _map_block_tree(func.body, on_block)
    return func if body.same_as(func.body) else func.with_body(body)


def _is_zero(e: tvm.ir.Expr) -> bool:
    return isinstance(e, tirx.IntImm) and int(e) == 0


def _unchanged(e: tvm.ir.Expr) -> None:
    """The :data:`Replace` that keeps every node."""
    return None


def _map_block_tree(s: tirx.Stmt, on_block: Callable) -> tirx.Stmt:
    """``s`` with every block (nested ones through ``visit``) replaced by
    ``on_block(block, visit)``; statements around blocks are rebuilt only where one changed."""
    from tvm import s_tir

    memo: dict = {}

    def visit(node: tirx.Stmt) -> tirx.Stmt:
        if isinstance(node, s_tir.SBlockRealize):
            block = visit(node.block)
            if block.same_as(node.block):
                return node
            return s_tir.SBlockRealize(node.iter_values, node.predicate, block)
        if isinstance(node, s_tir.SBlock):
            return on_block(node, visit)
        return map_stmt(node, _unchanged, memo, visit)

    return visit(s)


def _mapped_block(block: object, replace: Replace, memo: dict, visit: Callable) -> object:
    """``block`` with :func:`map_expr` applied to its body and init (nested blocks through
    ``visit``); the same object where nothing changed."""
    body = map_stmt(block.body, replace, memo, visit)
    init = block.init
    if init is not None:
        init = map_stmt(init, replace, memo, visit)
    if body.same_as(block.body) and (init is None or init.same_as(block.init)):
        return block
    return rebuilt_block(block, body=body, init=init)


def tvm_structural_equal(a: object, b: object) -> bool:
    import tvm_ffi

    return tvm_ffi.structural_equal(a, b, map_free_vars=False)


def substitute(e: tvm.ir.Expr, vmap: dict) -> tvm.ir.Expr:
    """``e`` with each variable in ``vmap`` (keyed by the variable) replaced."""
    pairs = list(vmap.items())

    def replace(x: tvm.ir.Expr) -> tvm.ir.Expr | None:
        if isinstance(x, tirx.Var):
            return next((new for old, new in pairs if old.same_as(x)), None)
        return None

    return map_expr(e, replace)


def rebuilt_block(
    block: object,
    *,
    body: tirx.Stmt | None = None,
    init: tirx.Stmt | None = None,
    reads: list | None = None,
) -> object:
    """``block`` with the given fields replaced (the others kept)."""
    from tvm import s_tir

    return s_tir.SBlock(
        block.iter_vars,
        block.reads if reads is None else reads,
        block.writes,
        block.name_hint,
        block.body if body is None else body,
        block.init if init is None else init,
        block.alloc_buffers,
        block.match_buffers,
        block.annotations,
    )
