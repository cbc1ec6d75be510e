"""CanonicalizeBatchMatmul: batched matmuls in the form whose loops line up with their
neighbours', so that the +Graph of a batch above 1 is the +Graph of batch 1 repeated.

**Flattened operands.** torch's decomposition of a 4-D ``q @ k^T`` (attention over ``[B, H, S,
D]``) flattens both operands to ``[B*H, S, D]``, multiplies, and reshapes the ``[B*H, S, S]``
result back to ``[B, H, S, S]`` for the mask and the softmax. With a batch of 1 the unit ``B``
disappears and every loop of the attention is ``H``; with ``B > 1`` the product runs over one
loop of ``B*H`` and the mask over two loops ``B`` and ``H``, which no +Graph primitive can
merge, so nothing matched the attention entry (BERT, OPT, T5 at batch 2: batched GEMMs and a TIR
softmax, twice the kernels). ``matmul(reshape(A), reshape(B))`` where both reshapes only flatten
the same leading dimensions is ``reshape(matmul(A, B))``: this pass rewrites it so, and the
loops of the product are the mask's (``SimplifyViews`` then folds the reshape with the one after
it). A ``permute_dims(.., [0, 2, 1])`` of such a reshape (BLOOM flattens heads itself, then
transposes k in 3-D) is the same transpose of the source's last two axes.

**Broadcast weights.** torch decomposes ``linear`` of a 3-D input it cannot view as 2-D (the
attention's output after its head transposes, batch above 1) into ``matmul(x,
broadcast_to(W^T, [B, K, N]))``: a batched GEMM by a copied weight, which no linear entry takes
(BERT at batch 2: the attention's output projection, its bias, residual and LayerNorm left as
a ``plus.matmul`` and TIR). A broadcast that only adds leading dimensions to the right operand
is what ``matmul`` does by itself: ``matmul(x, W^T)``.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ._dataflow_rewrite import (
    NestedRewrite,
    op_name,
    rewrite_nested,
    same_dims,
    tensor_dims,
)


@tvm.transform.module_pass(opt_level=0, name="CanonicalizeBatchMatmul")
class CanonicalizeBatchMatmul:
    """Rewrite ``matmul`` of operands that flatten the same batch dimensions (docstring).

    Attributes
    ----------
    rewritten : int
        After a run: the matmuls now over the unflattened operands.
    """

    def __init__(self) -> None:
        self.rewritten = 0

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        self.rewritten = 0
        return rewrite_nested(mod, self._start)

    def _start(self, block: relax.DataflowBlock, _func: relax.Function) -> NestedRewrite:
        """The rewrite of one block (its state: what the block binds)."""
        value_of = {b.var: b.value for b in block.bindings}
        return lambda b, _bb: self._unflatten(b, value_of)

    def _unflatten(self, binding: relax.VarBinding, value_of: dict) -> relax.Expr | None:
        call = binding.value
        if op_name(call) != "relax.matmul" or tensor_dims(binding.var) is None:
            return None
        weight = _unbroadcast(call.args[1], value_of)
        if weight is not None and len(tensor_dims(call.args[0]) or []) >= len(tensor_dims(weight)):
            self.rewritten += 1
            return relax.Call(call.op, [call.args[0], weight], call.attrs, call.ty_args)
        sources = [_flattened_source(a, value_of) for a in call.args]
        if any(s is None for s in sources):
            return None
        (a, a_dims), (b, b_dims) = sources
        if not same_dims(a_dims[:-2], b_dims[:-2]):
            return None
        self.rewritten += 1
        product = relax.Call(call.op, [a, b], call.attrs, call.ty_args)
        return relax.op.reshape(product, binding.var.ty.shape)


def _axes(call: relax.Call) -> list[int] | None:
    axes = call.attrs.axes
    return None if axes is None else [int(a) for a in axes]


def _unbroadcast(expr: relax.Expr, value_of: dict) -> relax.Expr | None:
    """The source of ``expr = broadcast_to(src, [..., K, N])`` when the broadcast only adds
    leading dimensions to a 2-D ``src``; else None."""
    value = value_of.get(expr) if isinstance(expr, relax.Var) else None
    if op_name(value) != "relax.broadcast_to":
        return None
    src = value.args[0]
    dims, out = tensor_dims(src), tensor_dims(expr)
    if dims is None or out is None or len(dims) != 2 or len(out) <= 2:
        return None
    return src if same_dims(dims, out[-2:]) else None


def _flattened_source(expr: relax.Expr, value_of: dict) -> tuple[relax.Expr, list] | None:
    """(source, its dims) when ``expr`` is a 3-D ``reshape`` of a tensor of rank > 3 that
    flattens its leading dimensions and keeps the last two; or the transpose of the last two
    axes of one (BLOOM's k^T: the source transposed the same way), or a cast of one."""
    value = value_of.get(expr) if isinstance(expr, relax.Var) else None
    if op_name(value) == "relax.broadcast_to" and same_dims(
        tensor_dims(value.args[0]) or [], tensor_dims(expr) or [None]
    ):
        return _flattened_source(value.args[0], value_of)  # torch's same-shape expand
    if op_name(value) == "relax.astype":  # a cast of one (BLOOM in bfloat16: k^T as float32)
        found = _flattened_source(value.args[0], value_of)
        return None if found is None else (relax.op.astype(found[0], value.attrs.dtype), found[1])
    if op_name(value) == "relax.permute_dims" and _axes(value) == [0, 2, 1]:
        found = _flattened_source(value.args[0], value_of)
        if found is None:
            return None
        src, dims = found
        n = len(dims)
        swapped = relax.op.permute_dims(src, [*range(n - 2), n - 1, n - 2])
        return swapped, [*dims[:-2], dims[-1], dims[-2]]
    if op_name(value) != "relax.reshape":
        return None
    src = value.args[0]
    flat, dims = tensor_dims(expr), tensor_dims(src)
    if flat is None or dims is None or len(flat) != 3 or len(dims) <= 3:
        return None
    if not same_dims(flat[1:], dims[-2:]):
        return None
    analyzer = tvm.sym.Analyzer()
    batch = dims[0]
    for d in dims[1:-2]:
        batch = batch * d
    if not analyzer.can_prove_equal(batch, flat[0]):
        return None
    return src, dims
