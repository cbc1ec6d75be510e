"""ONNX ``SoftmaxCrossEntropyLoss`` (opset 12+): TVM 0.27 has no converter for it.

``log_prob = log_softmax(scores, axis=1)`` and the negative log-likelihood of the labels
(:func:`.negative_log_likelihood_loss.nll_loss`), with the optional second output
``log_prob``.
"""

from __future__ import annotations

from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from ._common import emit
from .negative_log_likelihood_loss import _reduction, nll_loss


class SoftmaxCrossEntropyLoss(OnnxOpConverter):
    """``SoftmaxCrossEntropyLoss(scores, labels[, weights]) -> loss[, log_prob]``."""

    @classmethod
    def _impl_v12(cls, bb, inputs, attr, params):
        del params
        log_prob = emit(bb, relax.op.nn.log_softmax(inputs[0], axis=1))
        weight = inputs[2] if len(inputs) > 2 else None
        ignore = attr.get("ignore_index")
        loss = nll_loss(
            bb,
            log_prob,
            inputs[1],
            weight,
            _reduction(attr),
            ignore,
            weight_when_unweighted=ignore is not None,
        )
        if attr["tvm_custom"]["num_outputs"] > 1:
            return relax.Tuple([loss, log_prob])
        return loss
