"""ProveSlicesInbound: slices of a symbolic length keep a symbolic shape Relax can follow.

``torch.export`` with a ``Dim`` on the sequence axis gives TVM's importer ``strided_slice``
calls with ``assume_inbound=False``: their output length is clamped (``T.min(s, 64)`` for
``x[:, :s]`` of a 64-long position table, ``T.min(1, s)`` for ``x[:, :1]``), and the shapes of
everything computed from two such slices can no longer be matched: ``subtract`` of a
``(1, T.min(s, T.min(1, s) + s))`` and a ``(1, T.max(T.min(1, s) + s - 1, 0))`` tensor has an
unknown shape, and TVM's passes then fail (``emit_te now only supports Tensor that has
ShapeExpr shape`` in FoldConstant, ``non-symbolic shape is not supported`` in the sort/scan
dispatch). Transformers' BERT, GPT-2 and LLaMA all build their position ids and masks this way.

The function says how large each symbolic dimension can be (``tir_var_lower_bound`` /
``tir_var_upper_bound``, set by the importer from the ``Dim``'s ``min`` and ``max``; every
dimension is at least 0). With those bounds an analyzer proves, per slice and axis, that
``0 <= begin <= end <= extent`` for a positive constant stride; a slice proved on every axis
is rewritten with ``assume_inbound=True``, whose length is ``end - begin`` (rounded up by the
stride) without clamps, and every binding after it is re-typed so the simpler shapes flow on.
A slice that cannot be proved keeps its clamps (its result is unchanged either way: the
rewrite only drops clamps that are no-ops for every allowed size).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator

from ..symbolic_bounds import lower_bounds, upper_bounds
from ._dataflow_rewrite import map_functions, op_name


@tvm.transform.module_pass(opt_level=0, name="ProveSlicesInbound")
class ProveSlicesInbound:
    """Rewrite provably in-bound ``strided_slice`` calls to ``assume_inbound=True``."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return map_functions(mod, _per_function)


def _per_function(func: relax.Function) -> relax.Function:
    if not relax.analysis.defined_symbolic_vars(func):
        return func  # static shapes: the clamps are folded at compile time already
    if not any(
        op_name(b.value) == "relax.strided_slice" and not bool(b.value.attrs.assume_inbound)
        for block in func.body.blocks
        for b in block.bindings
        if isinstance(b, relax.VarBinding)
    ):
        return func
    rewriter = _Rewriter(_bounded_analyzer(func))
    new = rewriter.visit_expr(func)
    if not rewriter.rewritten:
        return func
    # the body's shapes are now more precise than the declared return type: deduce it again
    return relax.Function(new.params, new.body, None, new.is_pure, new.attrs, new.span)


def _bounded_analyzer(func: relax.Function) -> tvm.sym.Analyzer:
    """An analyzer that knows each symbolic dimension's range from the function's bounds."""
    lower = lower_bounds(func)
    upper = upper_bounds(func)
    analyzer = tvm.sym.Analyzer()
    for var in relax.analysis.defined_symbolic_vars(func):
        lo = max(lower.get(var.name, 0), 0)  # a dimension is never negative
        hi = upper.get(var.name)
        bound = tvm.sym.ConstIntBound(lo, hi if hi is not None else tvm.sym.ConstIntBound.POS_INF)
        analyzer.update(var, bound, override=True)
    return analyzer


@mutator
class _Rewriter(PyExprMutator):
    """Rebuilds a function; provable slices lose their clamps, later bindings are re-typed."""

    def __init__(self, analyzer: tvm.sym.Analyzer) -> None:
        super().__init__()
        self.analyzer = analyzer
        self.rewritten = 0

    def visit_call_(self, op: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(op)
        if op_name(call) != "relax.strided_slice" or bool(call.attrs.assume_inbound):
            return call
        if not self._inbound(call):
            return call
        self.rewritten += 1
        data, axes, begin, end = call.args[:4]
        strides = call.args[4] if len(call.args) > 4 else None
        return relax.op.strided_slice(data, axes, begin, end, strides, assume_inbound=True)

    def visit_shape_expr_(self, op: relax.ShapeExpr) -> relax.Expr:
        # shapes the importer computed from clamped lengths (``reshape(x, [T.min(s, 64)])``)
        values = [self.analyzer.simplify(v) for v in op.values]
        if all(tvm_ffi.structural_equal(new, old) for new, old in zip(values, op.values)):
            return op
        self.rewritten += 1
        return relax.ShapeExpr(values)

    def _inbound(self, call: relax.Call) -> bool:
        shape = _static_rank_shape(call.args[0])
        if shape is None:
            return False
        axes = _prim_values(call.args[1])
        begin = _prim_values(call.args[2])
        end = _prim_values(call.args[3])
        one = tirx.IntImm("int64", 1)
        strides = _prim_values(call.args[4]) if len(call.args) > 4 else [one] * len(axes or [])
        if None in (axes, begin, end, strides) or not (
            len(axes) == len(begin) == len(end) == len(strides)
        ):
            return False
        for axis, b, e, s in zip(axes, begin, end, strides):
            if not isinstance(axis, tirx.IntImm) or not isinstance(s, tirx.IntImm):
                return False
            if int(s) <= 0:
                return False  # a backward slice: its clamps are not modelled here
            extent = shape[int(axis) % len(shape)]
            for fact in (b >= 0, b <= e, e <= extent):
                if not self.analyzer.can_prove(fact):
                    return False
        return True


def _static_rank_shape(expr: relax.Expr) -> list | None:
    shape = getattr(expr.ty, "shape", None)
    if not isinstance(shape, relax.ShapeExpr):
        return None
    return list(shape.values)


def _prim_values(expr: relax.Expr) -> list | None:
    """A tuple of integer expressions -> its fields, else None."""
    if not isinstance(expr, relax.Tuple):
        return None
    out = []
    for field in expr.fields:
        ty = getattr(field, "ty", None)
        if not isinstance(ty, tvm.ir.PrimType) or not str(ty.dtype).startswith("int"):
            return None
        out.append(field)
    return out
