"""SinkRowReshapes: a reshape that regroups rows moves below the row-wise operators after it.

A linear layer runs on ``[B*S, K]`` rows and its result goes back to ``[B, S, N]`` before the
bias add, activation, residual add and LayerNorm that follow it; the next linear flattens the
rows again. With ``B = 1`` the regrouping only adds a unit dimension, which the +Graph builder
drops, and the GEMM's row loop is the epilogue's. With ``B > 1`` the ``[B*S]`` loop of the GEMM
and the ``B`` and ``S`` loops of its epilogue cannot be merged (no +Graph primitive splits a
loop), so the epilogue matched nothing: BERT at batch 2 ran its GELUs, residual adds and
LayerNorms as TIR kernels after each linear instead of inside the call.

For ``r = reshape(x, S)`` keeping the last dimension, and ``y = f(r, ...)`` with ``f`` element-
wise, or a LayerNorm / RMSNorm / softmax / reduction over the last axis, ``y`` is ``reshape(f(x,
...), S')``: each other operand takes, per group of dimensions the reshape regroups, either
``x``'s dimensions (it is complete there: a residual) or ones (it broadcasts there: a mean kept
with ``keepdims``, BLOOM's ALiBi ``[B*H, 1, S]`` -> ``[B, H, 1, S]``), and stays as it is where
it broadcasts along the last axis only (a bias, gamma, a scalar); an operand broadcast over part
of a group (no such reshape exists) stops the sinking. Repeated, the reshape travels down the
chain to the next operator that needs its shape, where ``SimplifyViews`` folds it into the next
flattening. Only single-use reshapes that regroup rows of more than one element move (a
reshape read twice would be computed both ways; one that only adds or drops unit dimensions,
batch 1, is already transparent to the +Graph builder and stays). Sizes may be symbolic (a
generation step's batch and length): groups of dimensions are found by the analyzer proving
their products equal, and only a flattening moves then (see ``_row_reshape``).
"""

from __future__ import annotations

import tvm
from tvm import relax

from ._dataflow_rewrite import (
    ELEMENTWISE_OPS,
    NestedRewrite,
    op_name,
    rewrite_nested,
    same_dims,
    tensor_dims,
    use_counts,
)

# operators over the last axis only (checked on their attributes)
ROW_OPS = frozenset(
    ("relax.nn.layer_norm", "relax.nn.rms_norm", "relax.nn.softmax", "relax.mean", "relax.sum")
)


@tvm.transform.module_pass(opt_level=0, name="SinkRowReshapes")
class SinkRowReshapes:
    """Move row-regrouping reshapes below row-wise operators (module docstring).

    Attributes
    ----------
    sunk : int
        After a run: the operators that now run on the rows before the reshape.
    """

    def __init__(self) -> None:
        self.sunk = 0

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        self.sunk = 0
        return rewrite_nested(mod, self._start)

    def _start(self, block: relax.DataflowBlock, func: relax.Function) -> NestedRewrite:
        """The rewrite of one block (its state: what the block binds, use counts)."""
        uses = use_counts(block, func.body.body)
        rows: dict = {}  # var bound to a row-regrouping reshape -> (its source, its dims)

        def rewrite(b: relax.VarBinding, bb: relax.BlockBuilder) -> relax.Expr | None:
            found = _row_reshape(b.value)
            if found is not None:
                rows[b.var] = found
            new = self._sink(b, rows, uses)
            if new is None:
                return None
            inner = bb.emit(new[0])  # a binding of its own: the next operator reads it
            rows[b.var] = (inner, tensor_dims(inner))
            return relax.op.reshape(inner, new[1])

        return rewrite

    def _sink(
        self, binding: relax.VarBinding, rows: dict, uses: dict
    ) -> tuple[relax.Expr, list] | None:
        call = binding.value
        op = op_name(call)
        out = tensor_dims(binding.var)
        if out is None or not (op in ELEMENTWISE_OPS or (op in ROW_OPS and _last_axis(call))):
            return None
        tensors = [a for a in call.args if isinstance(getattr(a, "ty", None), relax.TensorType)]
        lead = next(
            (
                a
                for a in tensors
                if isinstance(a, relax.DataflowVar) and a in rows and uses.get(a, 0) == 1
            ),
            None,
        )
        if lead is None:
            return None
        source, x_dims = rows[lead]
        r_dims = tensor_dims(lead)
        if not same_dims(out[:-1], r_dims[:-1]):  # the result has the reshape's rows
            return None
        args = []
        for a in call.args:
            if a.same_as(lead):
                args.append(source)
            elif not isinstance(getattr(a, "ty", None), relax.TensorType):
                args.append(a)
            else:
                moved = _operand(a, r_dims, x_dims, op in ROW_OPS and a is not call.args[0])
                if moved is None:
                    return None
                args.append(moved)
        self.sunk += 1
        inner = relax.Call(call.op, args, call.attrs, call.ty_args)
        return inner, out


def _row_reshape(value: relax.Expr) -> tuple[relax.Expr, list] | None:
    """(source, its dims) for a ``reshape`` keeping the last dimension (rows regrouped)."""
    if op_name(value) != "relax.reshape":
        return None
    src = value.args[0]
    dims = tensor_dims(src)
    out = getattr(value.args[1], "values", None)
    if dims is None or out is None or not dims or not len(out):
        return None
    analyzer = tvm.sym.Analyzer()
    if not analyzer.can_prove_equal(dims[-1], out[-1]):
        return None
    if not all(isinstance(d, tvm.tirx.IntImm) for d in [*dims, *out]) and len(out) >= len(dims):
        # with symbolic sizes only a flattening moves (BLOOM's [B, H, S, T] scores as [B*H,
        # S, T]): a linear's [B*S, N] rows regrouped as [B, S, N] and moved below its gated
        # activation left reshape copies between the element-wise kernels TVM no longer fused
        return None
    kept = [[d for d in ds if not analyzer.can_prove_equal(d, 1)] for ds in (dims, list(out))]
    if len(kept[0]) == len(kept[1]) and all(map(analyzer.can_prove_equal, *kept)):
        return None  # unit dimensions only: the +Graph builder drops them already
    return src, dims


def _operand(a: relax.Expr, r_dims: list, x_dims: list, parameter: bool) -> relax.Expr | None:
    """Operand ``a`` of an operator on ``r`` (dims ``r_dims``) moved onto ``x`` (``x_dims``):
    the same broadcast against ``x`` as against ``r``, or None when there is none."""
    dims = tensor_dims(a)
    if dims is None:
        return None
    if not dims or parameter:  # a scalar; LayerNorm's gamma / beta (over the last axis)
        return a if len(dims) <= 1 else None
    if len(dims) > len(r_dims):
        return None
    one = tvm.tirx.const(1, "int64")
    moved = _regrouped([one] * (len(r_dims) - len(dims)) + dims, r_dims, x_dims)
    if moved is None:
        return None
    analyzer = tvm.sym.Analyzer()
    tail, head = moved[len(moved) - len(dims) :], moved[: len(moved) - len(dims)]
    if all(map(analyzer.can_prove_equal, tail, dims)) and all(
        analyzer.can_prove_equal(d, 1) for d in head
    ):
        return a  # already broadcasts against x the same way (a bias over the last axis)
    return relax.op.reshape(a, moved)


def _regrouped(operand: list, r: list, x: list) -> list | None:
    """The operand's dims for ``x`` when ``r`` is ``x`` regrouped: per group of dims whose
    products agree, the operand is either complete there (it takes ``x``'s dims) or all ones
    (a broadcast: ones); any other operand (a partial broadcast inside a group) is None.
    BLOOM's ALiBi ``[B*H, 1, S]`` on scores ``[B*H, S, S]`` from ``[B, H, S, S]``: ``[B, H, 1,
    S]``; a residual: ``x``'s dims; one value per row ``[.., 1]``: ``x``'s rows and one.
    Sizes may be symbolic (a batch of any size): products are compared by the analyzer."""
    analyzer = tvm.sym.Analyzer()
    groups = _groups(r, x, analyzer)
    if groups is None:
        return None
    out: list = []
    for i0, i, j0, j in groups:
        part = operand[i0:i]
        if all(analyzer.can_prove_equal(d, 1) for d in part):
            out += [1] * (j - j0)
        elif all(map(analyzer.can_prove_equal, part, r[i0:i])):
            out += x[j0:j]
        else:
            return None
    return out if len(out) == len(x) else None


def _groups(r: list, x: list, analyzer: tvm.sym.Analyzer) -> list[tuple] | None:
    """``(i0, i, j0, j)`` per group: ``r[i0:i]`` and ``x[j0:j]`` have the same product, each
    group as short as it can be; unit dimensions left at the end of one side form groups
    with nothing of the other. None when the products never agree."""

    def prefix(dims: list) -> list:
        out = [tvm.tirx.const(1, "int64")]
        for d in dims:
            out.append(out[-1] * d)
        return out

    pr, px = prefix(r), prefix(x)
    groups: list[tuple] = []
    i = j = 0
    while i < len(r) and j < len(x):
        found = next(
            (
                (i1, j1)
                for i1 in range(i + 1, len(r) + 1)
                for j1 in range(j + 1, len(x) + 1)
                if analyzer.can_prove_equal(pr[i1], px[j1])
            ),
            None,
        )
        if found is None:
            return None
        groups.append((i, found[0], j, found[1]))
        i, j = found
    rest = [(k, k + 1, j, j) for k in range(i, len(r))]
    rest += [(i, i, k, k + 1) for k in range(j, len(x))]
    if not all(analyzer.can_prove_equal(d, 1) for d in r[i:] + x[j:]):
        return None
    return groups + rest


def _last_axis(call: relax.Call) -> bool:
    rank = len(tensor_dims(call.args[0]) or [])
    at = call.attrs
    if op_name(call) == "relax.nn.softmax":
        axes = [int(at.axis)]
    else:
        axes = [int(a) for a in (at.axes if hasattr(at, "axes") else at.axis) or []]
        if op_name(call) in ("relax.mean", "relax.sum") and not bool(at.keepdims):
            return False
    return rank > 0 and [a % rank for a in axes] == [rank - 1]


