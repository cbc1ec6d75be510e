"""Conv1dAsConv2d: a 1-D convolution as a 2-D one over a height of 1.

The convolution warehouse entries and their library kernels are 2-D. A ``conv1d`` (Whisper's
and wav2vec2's stems, Mamba's and Hyena's short causal filters) matched none of them and ran as
TVM's legalized loop nest, unscheduled on CPU: 26-36 ms for Whisper-base's stem where torch
takes under 1 ms. ``conv1d(x[N, C, W], w[O, C/g, K])`` computes exactly
``squeeze(conv2d(x[N, C, 1, W], w[O, C/g, 1, K]), 2)`` with the width's stride, padding and
dilation and a height of 1 everywhere, so this pass rewrites it into that; the 2-D entries
(pointwise, padded, grouped, depthwise) then apply, and so does the channels-last layout plan.

The ``squeeze`` then sinks below the element-wise operators that read the result alone (the
bias add the importer emits after every ``conv1d``, activations, a residual add of another
such result), each operand given the unit axis it needs for the same broadcast; the
convolution's epilogue (bias, activation, residual) is then right behind the ``conv2d``, where
the library call absorbs it, instead of a separate kernel after a view. Only the NCW / OIW
layouts torch and ONNX produce are rewritten.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ._dataflow_rewrite import (
    ELEMENTWISE_OPS,
    NestedRewrite,
    op_name,
    rewrite_nested,
    use_counts,
)

_UNIT_AXIS = 2  # the height of the NCHW result


@tvm.transform.module_pass(opt_level=0, name="Conv1dAsConv2d")
class Conv1dAsConv2d:
    """Rewrite ``relax.nn.conv1d`` (NCW / OIW) into ``conv2d`` over a unit height and sink
    the ``squeeze`` of that height below the element-wise operators after it.

    Attributes
    ----------
    rewritten, sunk : int
        After a run: the convolutions rewritten; the element-wise operators moved above the
        ``squeeze``.
    """

    def __init__(self) -> None:
        self.rewritten = 0
        self.sunk = 0

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        self.rewritten = self.sunk = 0
        # the 3-D results nothing reads any more dropped
        return rewrite_nested(mod, self._start)

    def _start(self, block: relax.DataflowBlock, func: relax.Function) -> NestedRewrite:
        """The rewrite of one block (its state: what the block binds, use counts)."""
        uses = use_counts(block, func.body.body)
        four: dict = {}  # 3-D result var -> the var of its 4-D form

        def rewrite(b: relax.VarBinding, bb: relax.BlockBuilder) -> relax.Expr | None:
            new4 = self._conv(b.value, four)
            if new4 is None:
                new4 = self._sink(b.value, four, uses)
            if new4 is None:
                return None
            four[b.var] = bb.emit(new4)  # bound once, whoever reads it next
            return relax.op.squeeze(four[b.var], [_UNIT_AXIS])

        return rewrite

    def _conv(self, call: relax.Expr, four: dict) -> relax.Expr | None:
        if op_name(call) != "relax.nn.conv1d":
            return None
        at = call.attrs
        out_layout = str(at.out_layout) or "NCW"
        if (str(at.data_layout), str(at.kernel_layout), out_layout) != ("NCW", "OIW", "NCW"):
            return None
        (stride,), (dilation,) = list(at.strides), list(at.dilation)
        pad = [int(p) for p in at.padding]
        left, right = (pad[0], pad[0]) if len(pad) == 1 else (pad[0], pad[1])
        x, w = call.args
        self.rewritten += 1
        return relax.op.nn.conv2d(
            four[x] if x in four else relax.op.expand_dims(x, _UNIT_AXIS),  # conv after conv
            relax.op.expand_dims(w, _UNIT_AXIS),
            strides=[1, int(stride)],
            padding=[0, left, 0, right],
            dilation=[1, int(dilation)],
            groups=int(at.groups),
            data_layout="NCHW",
            kernel_layout="OIHW",
            out_dtype=at.out_dtype,  # None (ONNX: the input's dtype) stays None
        )

    def _sink(self, call: relax.Expr, four: dict, uses: dict) -> relax.Expr | None:
        """``op(..)`` over the 4-D forms when an operand is a squeezed result read only here;
        other operands get the unit axis where the same broadcast needs it."""
        if op_name(call) not in ELEMENTWISE_OPS or not _rank_is(call, 3):
            return None
        args, lifted = [], False
        for a in call.args:
            if isinstance(a, relax.DataflowVar) and a in four and uses.get(a, 0) == 1:
                args.append(four[a])
                lifted = True
            elif not isinstance(getattr(a, "ty", None), relax.TensorType):
                args.append(a)  # attributes passed as values (clip's bounds)
            elif a.ty.ndim in (0, 1):
                args.append(a)  # broadcasts along the width: unchanged
            elif a.ty.ndim in (2, 3):
                args.append(relax.op.expand_dims(a, a.ty.ndim - 1))  # [.., C, W] -> [.., C, 1, W]
            else:
                return None
        if not lifted:
            return None
        self.sunk += 1
        return relax.Call(call.op, args, call.attrs, call.ty_args)


def _rank_is(call: relax.Call, rank: int) -> bool:
    ty = getattr(call, "ty", None)
    return isinstance(ty, relax.TensorType) and ty.ndim == rank
