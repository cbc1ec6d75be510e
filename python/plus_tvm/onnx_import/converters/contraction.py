"""ONNX ``MatMul``, ``Gemm``, ``Conv`` and ``ConvTranspose`` on half-precision tensors.

TVM 0.27's converters compute these in the tensors' dtype: a ``float16`` MatMul accumulates in
``float16`` (a 4096-long dot product loses about two decimal digits). ONNX Runtime's CPU
provider casts a half-precision node's inputs to ``float32``, runs the float32 kernel (bias,
``alpha`` and ``beta`` included) and casts the result back: one rounding, at the end.

Here a half-precision node keeps its half operands and gets ``out_dtype="float32"``
(accumulation in float32; the form the torch path gives half models, which plus_tvm's library
kernels match), its bias and scalings are applied in float32, and one ``astype`` rounds the
result to the node's dtype. Float32 and other dtypes keep TVM's converters unchanged.
"""

from __future__ import annotations

from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import Conv as TVMConv
from tvm.relax.frontend.onnx.onnx_frontend import ConvTranspose as TVMConvTranspose
from tvm.relax.frontend.onnx.onnx_frontend import Gemm as TVMGemm
from tvm.relax.frontend.onnx.onnx_frontend import MatMul as TVMMatMul

from ...errors import InputRefusedError
from .half_precision import half_dtype, to_float32

ACCUMULATOR = "float32"


def _half_operands(inputs) -> str | None:
    """The half dtype both operands share, or None (TVM's converter then runs as it is)."""
    a, b = inputs[0], inputs[1]
    dtype = half_dtype(a)
    return dtype if dtype is not None and half_dtype(b) == dtype else None


class MatMul(TVMMatMul):
    """``MatMul`` of half tensors accumulating in float32."""

    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        dtype = _half_operands(inputs)
        if dtype is None:
            return super()._impl_v13(bb, inputs, attr, params)
        product = relax.op.matmul(inputs[0], inputs[1], out_dtype=ACCUMULATOR)
        return relax.op.astype(bb.normalize(product), dtype)


class Gemm(TVMGemm):
    """``Gemm`` (``alpha * A' B' + beta * C``) of half tensors, computed in float32."""

    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        dtype = _half_operands(inputs)
        if dtype is None:
            return super()._impl_v13(bb, inputs, attr, params)
        a, b, c = inputs[0], inputs[1], inputs[2] if len(inputs) > 2 else None
        if attr.get("transA", 0):
            a = relax.op.permute_dims(a, [1, 0])
        if attr.get("transB", 0):
            b = relax.op.permute_dims(b, [1, 0])
        y = bb.normalize(relax.op.matmul(a, b, out_dtype=ACCUMULATOR))
        alpha, beta = float(attr.get("alpha", 1.0)), float(attr.get("beta", 1.0))
        if alpha != 1.0:
            y = relax.op.multiply(y, relax.const(alpha, ACCUMULATOR))
        if c is not None:
            c = to_float32(bb, c)
            if beta != 1.0:
                c = relax.op.multiply(c, relax.const(beta, ACCUMULATOR))
            y = relax.op.add(y, c)
        return relax.op.astype(bb.normalize(y), dtype)


# a convolution call rebuilt with another out_dtype: its op's constructor and attribute names
_CONVOLUTIONS = {
    "relax.nn.conv1d": relax.op.nn.conv1d,
    "relax.nn.conv2d": relax.op.nn.conv2d,
    "relax.nn.conv3d": relax.op.nn.conv3d,
    "relax.nn.conv1d_transpose": relax.op.nn.conv1d_transpose,
    "relax.nn.conv2d_transpose": relax.op.nn.conv2d_transpose,
    "relax.nn.conv3d_transpose": relax.op.nn.conv3d_transpose,
}
_ATTRS = ("strides", "padding", "output_padding", "dilation", "groups")
_LAYOUTS = ("data_layout", "kernel_layout", "out_layout")


def _accumulating(call: relax.Expr) -> relax.Expr:
    """``call`` (a convolution of TVM's converter) with ``out_dtype="float32"``."""
    name = getattr(getattr(call, "op", None), "name", None)
    make = _CONVOLUTIONS.get(name)
    if make is None:  # TVM's converter changed shape: refuse clearly rather than mis-convert
        raise InputRefusedError(f"expected a convolution from TVM's converter, got {name}")
    kwargs = {k: getattr(call.attrs, k) for k in _ATTRS if hasattr(call.attrs, k)}
    kwargs.update({k: str(getattr(call.attrs, k)) for k in _LAYOUTS})
    return make(call.args[0], call.args[1], **kwargs, out_dtype=ACCUMULATOR)


def _half_convolution(base, bb, inputs, attr, params):
    """TVM's convolution (no bias) accumulating in float32, the bias added in float32, one
    rounding to the half dtype; None when the operands are not half tensors."""
    dtype = _half_operands(inputs)
    if dtype is None:
        return None
    bias = inputs[2] if len(inputs) > 2 else None
    conv = _accumulating(bb.normalize(base(bb, [inputs[0], inputs[1], None], attr, params)))
    out = bb.normalize(conv)
    if bias is not None:
        ndim = out.ty.ndim
        bias = relax.op.reshape(to_float32(bb, bias), [1, -1] + [1] * (ndim - 2))
        out = bb.normalize(relax.op.add(out, bias))
    return relax.op.astype(out, dtype)


class Conv(TVMConv):
    """``Conv`` of half tensors accumulating in float32."""

    @classmethod
    def _impl_v11(cls, bb, inputs, attr, params):
        out = _half_convolution(super()._impl_v11, bb, inputs, attr, params)
        return super()._impl_v11(bb, inputs, attr, params) if out is None else out


class ConvTranspose(TVMConvTranspose):
    """``ConvTranspose`` of half tensors accumulating in float32."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        out = _half_convolution(super()._impl_v1, bb, inputs, attr, params)
        return super()._impl_v1(bb, inputs, attr, params) if out is None else out
