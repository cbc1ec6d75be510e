"""ONNX ``LayerNormalization`` (opset 17+) with its ``Mean`` and ``InvStdDev`` outputs.

TVM's converter returns float scalar placeholders (``0``) for the second and third outputs, a
silently wrong result for any graph that reads them, and ignores ``stash_type`` (statistics of
float16 inputs computed in float32). Here ``Y`` is Relax's ``layer_norm`` over the axes from
``axis`` to the last (the form library dispatch and GIR recognise), computed in the stash type;
``Mean`` and ``InvStdDev`` are the statistics with the normalised axes kept as size 1, as the
specification says.
"""

from __future__ import annotations

from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from ...errors import InputRefusedError
from ._common import DTYPE_OF_ONNX, dims, emit, scalar


class LayerNormalization(OnnxOpConverter):
    """``LayerNormalization(X, Scale[, B]) -> Y[, Mean, InvStdDev]``."""

    @classmethod
    def _impl_v17(cls, bb, inputs, attr, params):
        del params
        x, gamma = inputs[0], inputs[1]
        beta = inputs[2] if len(inputs) > 2 and inputs[2] is not None else None
        rank = len(dims(x))
        axis = int(attr.get("axis", -1))
        axis = axis + rank if axis < 0 else axis
        if not 0 <= axis < rank:
            raise InputRefusedError(f"LayerNormalization axis {attr.get('axis')} for rank {rank}")
        axes = list(range(axis, rank))
        eps = float(attr.get("epsilon", 1e-5))
        dtype = str(x.ty.dtype)
        stash = DTYPE_OF_ONNX.get(int(attr.get("stash_type", 1)), "float32")
        compute = stash if dtype in ("float16", "bfloat16") else dtype

        def cast(t):
            if t is None or str(t.ty.dtype) == compute:
                return t
            return emit(bb, relax.op.astype(t, compute))

        xc, gc, bc = cast(x), cast(gamma), cast(beta)
        # Relax's layer_norm wants gamma / beta over exactly the normalised axes
        norm_shape = dims(x)[axis:]
        gc = emit(bb, relax.op.broadcast_to(gc, norm_shape))
        if bc is None:
            bc = emit(bb, relax.op.zeros(norm_shape, compute))
        else:
            bc = emit(bb, relax.op.broadcast_to(bc, norm_shape))
        y = emit(bb, relax.op.nn.layer_norm(xc, gc, bc, axes, eps))
        if compute != dtype:
            y = emit(bb, relax.op.astype(y, dtype))
        if attr["tvm_custom"]["num_outputs"] == 1:
            return y
        mean = emit(bb, relax.op.mean(xc, axes, keepdims=True))
        centred = emit(bb, relax.op.subtract(xc, mean))
        var = emit(bb, relax.op.mean(relax.op.multiply(centred, centred), axes, keepdims=True))
        inv = emit(bb, relax.op.rsqrt(relax.op.add(var, scalar(eps, compute))))
        return relax.Tuple([y, mean, inv])
