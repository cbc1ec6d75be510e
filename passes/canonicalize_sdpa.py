"""CanonicalizeSDPA: transformers' default attention, as torch decomposes it, in the form the
attention warehouse entry matches (PluS: variants of one computation hit the same entry).

``F.scaled_dot_product_attention`` reaches Relax as its math decomposition:

- ``q * sqrt(scale)`` and ``k^T * sqrt(scale)`` before the product (each operand scaled);
- after ``softmax(s)``, the "safe softmax" fix-up that returns 0 for a row whose scores are all
  ``-inf``: ``where(not(any(s != -inf, -1)), 0, softmax(s))``, which reads the scores a second
  time (an extra reduction) and gives ``softmax`` two consumers.

This pass moves scalar factors of ``matmul`` operands, through the views between them, onto the
product (``(q c1) @ (k^T c2) = (q @ k^T) c1 c2``), and computes the fix-up's row condition from
the additive mask instead of the scores: with finite ``q @ k^T`` a row of ``s = q @ k^T + mask``
is all ``-inf`` exactly when the mask's row is; without a mask (Whisper's cross-attention) no
row is, and the fix-up is dropped. The fix-up is kept (a library kernel absorbing it
zeroes those rows: ``zero_masked`` of ``plus.attention``), so the program computes the same
values whether or not the attention is dispatched. Runs in phase 1 before ``PlusDispatch``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import tvm
from tvm import relax

from ._dataflow_rewrite import (
    NestedRewrite,
    op_name,
    rewrite_nested,
    use_counts,
)

# ``all(x == -inf, -1, keepdims)`` as torch's safe softmax writes it, outermost first, down to
# ``x == -inf``: ``not(bool(max(int8(not(x == -inf)), -1, keepdims)))``
ROW_CONDITION_OPS = (
    "relax.logical_not",
    "relax.astype",
    "relax.max",
    "relax.astype",
    "relax.logical_not",
)
_VIEWS = frozenset(
    (
        "relax.reshape",
        "relax.permute_dims",
        "relax.broadcast_to",
        "relax.expand_dims",
        "relax.squeeze",
    )
)


@tvm.transform.module_pass(opt_level=0, name="CanonicalizeSDPA")
class CanonicalizeSDPA:
    """Hoist operand scales of matmuls; the safe-softmax condition from the mask (module
    docstring).

    Attributes
    ----------
    hoisted, conditions : int
        After a run: matmuls whose operand scales moved onto the product; safe-softmax
        conditions recomputed from the mask.
    """

    def __init__(self) -> None:
        self.hoisted = 0
        self.conditions = 0

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        self.hoisted = self.conditions = 0
        return rewrite_nested(mod, self._start)

    def _start(self, block: relax.DataflowBlock, func: relax.Function) -> NestedRewrite:
        """The rewrite of one block (its state: what the block binds, use counts)."""
        value_of = {b.var: b.value for b in block.bindings}
        uses = use_counts(block, func.body.body)

        def rewrite(b: relax.VarBinding, _bb: relax.BlockBuilder) -> relax.Expr | None:
            new = self._hoist(b.value, value_of, uses)
            return new if new is not None else self._safe_softmax(b.value, value_of)

        return rewrite

    # ------------------------------------------------------------------ (q c1) @ (k^T c2)
    def _hoist(self, value: relax.Expr, value_of: dict, uses: dict) -> relax.Expr | None:
        if op_name(value) != "relax.matmul":
            return None
        fa, a = _unscale(value.args[0], value_of, uses)
        fb, b = _unscale(value.args[1], value_of, uses)
        if fa is None and fb is None:
            return None
        dtype = str(value.ty.dtype) if isinstance(value.ty, relax.TensorType) else "float32"
        if not dtype.startswith(("float", "bfloat")):
            return None
        self.hoisted += 1
        product = relax.Call(value.op, [a, b], value.attrs)
        factor = (1.0 if fa is None else fa) * (1.0 if fb is None else fb)
        if factor == 1.0:  # OPT scales q itself and passes scale=1: the product alone
            return product
        return relax.op.multiply(product, relax.const(factor, dtype))

    # ------------------------------------------------------------------ safe softmax
    def _safe_softmax(self, value: relax.Expr, value_of: dict) -> relax.Expr | None:
        """``where(all(s == -inf, -1), 0, softmax(s))`` with the condition read off the mask."""
        if op_name(value) != "relax.where" or len(value.args) != 3:
            return None
        cond, zero, probs = value.args
        soft = value_of.get(probs)
        if op_name(soft) != "relax.nn.softmax" or not _is_zero(zero, probs, value_of):
            return None
        scores = soft.args[0]
        row = row_condition_source(cond, value_of.get)
        if row is None or not row.same_as(scores):
            return None
        mask = _additive_mask(scores, value_of)
        if mask is None:
            if not _is_product(scores, value_of):
                return None
            # no mask: finite scores are never a row of -inf, the fix-up is the identity
            self.conditions += 1
            return probs
        self.conditions += 1
        dtype = str(probs.ty.dtype)
        return relax.op.where(_all_neg_inf_rows(mask), relax.const(0.0, dtype), probs)


def _scalar(expr: relax.Expr) -> float | None:
    """A finite, non-zero float scalar constant (a scale), else None."""
    value = _scalar_value(expr)
    if value is None or expr.value.numpy().dtype.kind != "f":
        return None
    return value if math.isfinite(value) and value != 0.0 else None


def _unscale(expr: relax.Expr, value_of: dict, uses: dict) -> tuple[float | None, relax.Expr]:
    """(factor, unscaled operand): the scalar multiplies / divides behind views, each used
    once, all of them (OPT scales q itself, then SDPA scales it by ``sqrt(1)`` again); (None,
    ``expr``) when there is none."""
    chain: list[relax.Call] = []  # the views, outermost first
    factor = None
    cur = expr
    while True:
        while (
            isinstance(cur, relax.Var)
            and uses.get(cur, 0) == 1
            and op_name(value_of.get(cur)) in _VIEWS
        ):
            chain.append(value_of[cur])
            cur = value_of[cur].args[0]
        found = _scalar_factor(cur, value_of, uses)
        if found is None:
            break
        c, cur = found
        factor = c if factor is None else factor * c
    if factor is None:
        return None, expr
    return factor, _replay(chain, cur)


def _scalar_factor(expr: relax.Expr, value_of: dict, uses: dict) -> tuple[float, relax.Expr] | None:
    """(c, x) when ``expr``, used once, is ``x * c``, ``c * x`` or ``x / c``."""
    if not (isinstance(expr, relax.Var) and uses.get(expr, 0) == 1):
        return None
    inner = value_of.get(expr)
    op = op_name(inner)
    if op == "relax.multiply":
        for i in (0, 1):
            c = _scalar(inner.args[1 - i])
            if c is not None:
                return c, inner.args[i]
    if op == "relax.divide":
        c = _scalar(inner.args[1])
        if c is not None:
            return 1.0 / c, inner.args[0]
    return None


def _replay(chain: list[relax.Call], source: relax.Expr) -> relax.Expr:
    out = source
    for call in reversed(chain):
        out = relax.Call(call.op, [out, *call.args[1:]], call.attrs, call.ty_args)
    return out


def _is_zero(expr: relax.Expr, probs: relax.Var, value_of: dict) -> bool:
    value = value_of.get(expr)
    if op_name(value) == "relax.full_like" and value.args[0].same_as(probs):
        return _scalar_value(value.args[1]) == 0.0
    return _scalar_value(expr) == 0.0


def _scalar_value(expr: relax.Expr) -> float | None:
    if isinstance(expr, tvm.ir.expr.Constant):
        arr = expr.value.numpy()
        if arr.size == 1:
            return float(arr.reshape(()))
    return None


def _follow(expr: relax.Expr, value_of: dict, op: str) -> relax.Call | None:
    value = value_of.get(expr)
    return value if op_name(value) == op else None


def row_condition_source(
    cond: relax.Expr, definition: Callable[[relax.Expr], relax.Expr | None]
) -> relax.Expr | None:
    """``x`` when ``cond`` is ``all(x == -inf, -1, keepdims)`` in the operators of torch's safe
    softmax (``ROW_CONDITION_OPS``, then ``x == -inf``), else None. ``definition`` gives the
    value an expression is bound to (None when it is not bound in the block); shared by this
    pass (the scores) and the attention binder (the mask)."""
    cur = cond
    for op in (*ROW_CONDITION_OPS, "relax.equal"):
        call = definition(cur)
        if op_name(call) != op:
            return None
        if op == "relax.max":
            axes = [int(a) for a in (call.attrs.axis or [])]
            rank = len(call.args[0].ty.shape.values)
            if axes not in ([-1], [rank - 1]) or not call.attrs.keepdims:
                return None
        cur = call.args[0]
    return cur if _scalar_value(call.args[1]) == -math.inf else None


def _additive_mask(scores: relax.Expr, value_of: dict) -> relax.Expr | None:
    """The additive mask of ``scores = product + mask`` (the operand that is not the scaled
    product), or None."""
    add = _follow(scores, value_of, "relax.add")
    if add is None:
        return None
    for i in (0, 1):
        if _is_product(add.args[i], value_of):
            return add.args[1 - i]
    return None


def _is_product(expr: relax.Expr, value_of: dict) -> bool:
    value = value_of.get(expr)
    while op_name(value) in _VIEWS or op_name(value) == "relax.multiply":
        value = value_of.get(value.args[0])
    return op_name(value) == "relax.matmul"


def _all_neg_inf_rows(mask: relax.Expr) -> relax.Expr:
    """``all(mask == -inf, -1, keepdims)`` in the decomposition's own operators."""
    dtype = str(mask.ty.dtype)
    finite = relax.op.logical_not(relax.op.equal(mask, relax.const(-math.inf, dtype)))
    any_finite = relax.op.max(relax.op.astype(finite, "int8"), axis=[-1], keepdims=True)
    return relax.op.logical_not(relax.op.astype(any_finite, "bool"))
