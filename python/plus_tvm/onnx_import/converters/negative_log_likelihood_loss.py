"""ONNX ``NegativeLogLikelihoodLoss`` (opset 12+): TVM 0.27 has no converter for it.

``loss[n, d...] = -input[n, target[n, d...], d...] * w`` with ``w = weight[target]`` (or 1),
zero where ``target == ignore_index``; reduced by ``none``, ``sum`` or ``mean`` (a weighted mean
divides by the sum of the weights), following ONNX's reference implementation, including its
rule that without a weight input an ``ignore_index`` of -1 averages over every element.
Ignored targets may lie outside ``[0, C)``: they are replaced by 0 before the gather, so no
read leaves the input.
"""

from __future__ import annotations

from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from ...errors import InputRefusedError
from ._common import emit, scalar


def _reduction(attr) -> str:
    value = attr.get("reduction", b"mean")
    return value.decode() if isinstance(value, bytes) else str(value)


def nll_loss(bb, log_prob, target, weight, reduction: str, ignore_index, weight_when_unweighted):
    """The loss of ``log_prob`` (N, C, d...) at ``target`` (N, d...).

    ``weight_when_unweighted``: whether, without a ``weight`` input, ignored elements are
    excluded from a mean (SoftmaxCrossEntropyLoss: whenever ``ignore_index`` is given;
    NegativeLogLikelihoodLoss: unless it is -1), as ONNX's reference implementations do.
    """
    if reduction not in ("none", "sum", "mean"):
        raise InputRefusedError(f"reduction must be none, sum or mean, got {reduction!r}")
    dtype = str(log_prob.ty.dtype)
    tdtype = str(target.ty.dtype)
    ignored = None
    index = target
    if ignore_index is not None:
        ignored = emit(bb, relax.op.equal(target, relax.const(int(ignore_index), tdtype)))
        index = emit(bb, relax.op.where(ignored, relax.const(0, tdtype), target))
    picked = emit(bb, relax.op.gather_elements(log_prob, relax.op.expand_dims(index, 1), axis=1))
    loss = emit(bb, relax.op.negative(relax.op.squeeze(picked, axis=[1])))
    if ignored is not None:
        loss = emit(bb, relax.op.where(ignored, scalar(0.0, dtype), loss))
    gathered = None
    if weight is not None:
        gathered = emit(bb, relax.op.take(weight, index, axis=0, mode="clip"))
        if ignored is not None:
            gathered = emit(bb, relax.op.where(ignored, scalar(0.0, dtype), gathered))
    elif weight_when_unweighted:
        gathered = (
            emit(bb, relax.op.where(ignored, scalar(0.0, dtype), scalar(1.0, dtype)))
            if ignored is not None
            else emit(bb, relax.op.ones_like(loss))
        )
    if gathered is not None:
        loss = emit(bb, relax.op.multiply(gathered, loss))
        if reduction == "mean":
            total = emit(bb, relax.op.sum(loss))
            return emit(bb, relax.op.divide(total, relax.op.sum(gathered)))
    if reduction == "mean":
        return emit(bb, relax.op.mean(loss))
    if reduction == "sum":
        return emit(bb, relax.op.sum(loss))
    return loss


class NegativeLogLikelihoodLoss(OnnxOpConverter):
    """``NegativeLogLikelihoodLoss(input, target[, weight])``."""

    @classmethod
    def _impl_v12(cls, bb, inputs, attr, params):
        del params
        weight = inputs[2] if len(inputs) > 2 else None
        ignore = attr.get("ignore_index")
        return nll_loss(
            bb,
            inputs[0],
            inputs[1],
            weight,
            _reduction(attr),
            ignore,
            weight_when_unweighted=ignore is None or int(ignore) != -1,
        )
