"""Rebuild TIR expressions and block bodies bottom-up with a replacement function.

TVM 0.27 has no Python ``StmtExprMutator``; this covers what block bodies hold after
legalization and scheduling: arithmetic and comparison nodes, ``Select``, ``Cast``, ``Let``,
calls, loads, and the statements ``BufferStore``, ``SeqStmt``, ``IfThenElse``, ``For``,
``LetStmt`` (a binding, without body in 0.27) and ``Evaluate``. Nested blocks are left alone
(each block is rewritten on its own).
"""

from __future__ import annotations

from collections.abc import Callable

import tvm
from tvm import tirx
from tvm.ir.prim.expr import BinaryOpExpr

Replace = Callable[[tvm.ir.Expr], "tvm.ir.Expr | None"]


def map_expr(e: tvm.ir.Expr, replace: Replace) -> tvm.ir.Expr:
    """``e`` with ``replace`` applied to every node after its operands (``None``: keep)."""
    new = _rebuild(e, replace)
    out = replace(new)
    return new if out is None else out


def _rebuild(e: tvm.ir.Expr, replace: Replace) -> tvm.ir.Expr:
    if isinstance(e, BinaryOpExpr):
        a, b = map_expr(e.a, replace), map_expr(e.b, replace)
        return e if a.same_as(e.a) and b.same_as(e.b) else type(e)(a, b)
    if isinstance(e, tirx.Not):
        a = map_expr(e.a, replace)
        return e if a.same_as(e.a) else tirx.Not(a)
    if isinstance(e, tirx.Select):
        c = map_expr(e.condition, replace)
        t = map_expr(e.true_value, replace)
        f = map_expr(e.false_value, replace)
        same = c.same_as(e.condition) and t.same_as(e.true_value) and f.same_as(e.false_value)
        return e if same else tirx.Select(c, t, f)
    if isinstance(e, tirx.Cast):
        v = map_expr(e.value, replace)
        return e if v.same_as(e.value) else tirx.Cast(str(e.ty), v)
    if isinstance(e, tirx.Let):
        v, b = map_expr(e.value, replace), map_expr(e.body, replace)
        return e if v.same_as(e.value) and b.same_as(e.body) else tirx.Let(e.var, v, b)
    if isinstance(e, tvm.ir.Call) and isinstance(e.op, tvm.ir.Op):
        args = [map_expr(a, replace) for a in e.args]
        if all(x.same_as(y) for x, y in zip(args, e.args)):
            return e
        return tvm.ir.Call(e.op, args, ret_ty=e.ty)
    if isinstance(e, tvm.ir.TensorLoad):
        indices = [map_expr(i, replace) for i in e.indices]
        if all(x.same_as(y) for x, y in zip(indices, e.indices)):
            return e
        return tvm.ir.TensorLoad(e.source, indices)
    return e  # leaves: Var, IntImm, FloatImm, Ramp, Broadcast, StringImm


def map_stmt(s: tirx.Stmt, replace: Replace) -> tirx.Stmt:
    """``s`` with :func:`map_expr` applied to the values it stores, tests and evaluates."""
    if isinstance(s, tirx.BufferStore):
        value = map_expr(s.value, replace)
        return s if value.same_as(s.value) else tirx.BufferStore(s.buffer, value, s.indices)
    if isinstance(s, tirx.SeqStmt):
        seq = [map_stmt(x, replace) for x in s.seq]
        return s if all(x.same_as(y) for x, y in zip(seq, s.seq)) else tirx.SeqStmt(seq)
    if isinstance(s, tirx.IfThenElse):
        cond = map_expr(s.condition, replace)
        then = map_stmt(s.then_case, replace)
        other = map_stmt(s.else_case, replace) if s.else_case is not None else None
        same = cond.same_as(s.condition) and then.same_as(s.then_case)
        same = same and (other is None or other.same_as(s.else_case))
        return s if same else tirx.IfThenElse(cond, then, other)
    if isinstance(s, tirx.For):
        body = map_stmt(s.body, replace)
        if body.same_as(s.body):
            return s
        return tirx.For(
            s.loop_var, s.min, s.extent, s.kind, body, s.thread_binding, s.annotations, s.step
        )
    if isinstance(s, tirx.LetStmt):  # a binding statement in 0.27 (no body)
        value = map_expr(s.value, replace)
        return s if value.same_as(s.value) else tirx.LetStmt(s.var, value)
    if isinstance(s, tirx.Evaluate):
        value = map_expr(s.value, replace)
        return s if value.same_as(s.value) else tirx.Evaluate(value)
    return s  # nested blocks, allocations, attributes: left as they are
