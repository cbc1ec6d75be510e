"""ONNX ``IsInf``: TVM's converter ignores ``detect_negative`` / ``detect_positive`` and flags
both infinities whatever they say (a silently wrong mask)."""

from __future__ import annotations

from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from ._common import emit, scalar


class IsInf(OnnxOpConverter):
    """``IsInf(X)`` with its two detection attributes."""

    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        del params
        x = inputs[0]
        negative = bool(int(attr.get("detect_negative", 1)))
        positive = bool(int(attr.get("detect_positive", 1)))
        inf = emit(bb, relax.op.isinf(x))
        if negative and positive:
            return inf
        if not negative and not positive:
            return emit(bb, relax.op.zeros_like(inf))
        sign = relax.op.greater if positive else relax.op.less
        side = emit(bb, sign(x, scalar(0.0, str(x.ty.dtype))))
        return emit(bb, relax.op.logical_and(inf, side))
