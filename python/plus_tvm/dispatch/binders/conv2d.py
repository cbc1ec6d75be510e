"""Convolution binder (``torch.conv2d``): a 2-D convolution in NCHW or NHWC with an OIHW weight,
then what the library applies on the way out: a bias add (a weight of the channel count that
broadcasts along the channel axis), a folded inference BatchNorm, an activation, a residual add
and an activation after it."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import tvm
from tvm import relax

from ...runtime.conv2d import CONV2D_SPEC
from .activation import recognise_activation
from .common import (
    Ctx,
    LibraryCall,
    activation_of,
    classify_add,
    dtype_of,
    half_accumulation,
    pre_binding,
    rounds_to,
    shape_of,
    take_add,
    widened,
)

# data layout -> (config value, channel axis of the activations)
_LAYOUTS = {"NCHW": ("nchw", 1), "NHWC": ("nhwc", 3)}


def bind_conv2d(ctx: Ctx, members: tuple[int, ...]) -> LibraryCall | None:
    for i in members:
        if ctx.op(i) != "relax.nn.conv2d":
            continue
        return _bind(ctx, i)
    return None


def _bind(ctx: Ctx, i: int) -> LibraryCall | None:
    call = ctx.call(i)
    at = call.attrs
    layout = str(at.data_layout)
    if layout not in _LAYOUTS or str(at.kernel_layout) != "OIHW":
        return None
    if str(at.out_layout) not in (layout, ""):
        return None
    x, w = call.args
    if not ctx.is_weight_view(w):  # a 1-D convolution's weight comes as a [O, I, 1, K] view
        return None
    name, axis = _LAYOUTS[layout]
    c_out = shape_of(w)[0]
    pad = [int(p) for p in at.padding]
    if len(pad) == 2:
        pad = [pad[0], pad[1], pad[0], pad[1]]
    elif len(pad) == 1:
        pad = pad * 4
    cfg: dict[str, object] = {
        "stride": [int(s) for s in at.strides],
        "padding": pad,
        "dilation": [int(d) for d in at.dilation],
        "groups": int(at.groups),
        "layout": name,
    }
    if not ctx.propagate_nan:
        cfg["nan"] = False
    c_in = shape_of(w)[1] * int(at.groups)
    if not ctx.settings.conv_winograd or min(c_in, c_out) < ctx.settings.winograd_min_channels:
        cfg["winograd"] = False
    epilogue = _Epilogue(ctx, i, c_out, axis)
    epilogue.walk()
    if not epilogue.rounded:
        return None  # (a half convolution's float32 result: no kernel returns it)
    args: list[relax.Expr] = [x, w]
    pre: list = []
    if epilogue.bias is not None:
        pre.append(pre_binding("plus_bias", relax.op.reshape(epilogue.bias, [c_out])))
        args.append(pre[-1][0])
        cfg["bias"] = True
    if epilogue.stats is not None:
        args.extend(epilogue.stats)
        cfg["bn"], cfg["bn_eps"] = True, epilogue.eps
    if epilogue.residual is not None:
        args.append(epilogue.residual)
        cfg["residual"] = True
    for key in ("act", "post_act"):
        if getattr(epilogue, key) != "none":
            cfg[key] = getattr(epilogue, key)
    return LibraryCall(CONV2D_SPEC, args, cfg, epilogue.cur, epilogue.absorbed, pre)


class _Epilogue:
    """The chain of consumers after the convolution that the call absorbs, in order: a bias or
    a BatchNorm, an activation, a residual add, an activation."""

    def __init__(self, ctx: Ctx, conv: int, channels: int, axis: int) -> None:
        self.ctx = ctx
        # a half convolution accumulates in float32: a widened bias, then one rounding
        self.half = half_accumulation(ctx, conv)
        self.rounded = self.half is None
        self.channels = channels
        self.axis = axis
        self.cur = conv
        self.absorbed = [conv]
        self.bias: relax.Expr | None = None
        self.stats: list[relax.Expr] | None = None
        self.eps = 1e-5
        self.act = "none"
        self.residual: relax.Expr | None = None
        self.post_act = "none"

    def bias_fits(self, shape: list) -> bool:
        """A weight of ``channels`` values laid along the channel axis of the result (rank 4,
        right-aligned broadcasting)."""
        if None in shape or math.prod(shape) != self.channels or len(shape) > 4:
            return False
        padded = [1] * (4 - len(shape)) + list(shape)
        return padded[self.axis] == self.channels

    def walk(self) -> None:
        ctx = self.ctx
        while not self.rounded:  # a half convolution's float32 accumulator: bias, rounding
            nxt = ctx.follow(self.cur)
            if nxt is None:
                return
            if ctx.op(nxt) == "relax.add":
                if not self.absorb(nxt):
                    return
            elif rounds_to(ctx, nxt, self.half):
                self.rounded = True
            else:
                return
            self.absorbed.append(nxt)
            self.cur = nxt
        while True:
            # past a folded BatchNorm (which +Graphs do not cover) the chain leaves the match
            nxt = ctx.follow_outside(self.cur) if self.stats is not None else ctx.follow(self.cur)
            # (a half model's BatchNorm starts with the widening cast, which the match may hold)
            if (nxt is None or self.half is not None) and self.stats is None:
                if self.act == "none" and self.residual is None and self.batch_norm():
                    continue
            # (a half model's written-out activation starts with its widening cast)
            if (nxt is None or ctx.op(nxt) == "relax.astype") and self.written_out_activation():
                continue
            if nxt is None or not self.absorb(nxt):
                return
            self.absorbed.append(nxt)
            self.cur = nxt

    def written_out_activation(self) -> bool:
        """An activation written out as operators (``x * sigmoid(x)``) where one may go."""
        slot = "act" if self.residual is None else "post_act"
        if getattr(self, slot) != "none" or (slot == "act" and self.act != "none"):
            return False
        found = recognise_activation(self.ctx, self.cur, self.absorbed, anywhere=True)
        if found is None:
            return False
        act, self.cur, ops = found
        setattr(self, slot, act)
        self.absorbed.extend(ops)
        return True

    def absorb(self, nxt: int) -> bool:
        ctx = self.ctx
        op, c = ctx.op(nxt), ctx.call(nxt)
        if op == "relax.add":
            found = classify_add(
                ctx,
                self.cur,
                nxt,
                self.bias_fits,
                can_bias=self.bias is None and self.act == "none" and self.residual is None,
                can_residual=self.residual is None and self.rounded,
                widened_from=None if self.rounded else self.half,
            )
            return take_add(self, found)
        act = activation_of(op, c)
        if act is None:
            return False
        if self.residual is None and self.act == "none":
            self.act = act
            return True
        if self.residual is not None and self.post_act == "none":
            self.post_act = act
            return True
        return False

    def batch_norm(self) -> bool:
        """``bn = batch_norm(cur, ...); y = bn[0]`` with weight statistics on the channel axis
        and nothing else using ``bn``: folded into the convolution. In a half model the
        BatchNorm computes in float32 between two casts (``astype(cur, "float32")``, the
        statistics widened, ``astype(bn[0], half)``): the call takes the half statistics and
        computes it in float32 on the convolution's result (the kernel does not fold it into
        the half weight, which would round it once more than torch does)."""
        ctx = self.ctx
        start, widen = self.cur, []
        if self.half is not None:
            cast = ctx.follow_outside(start)
            if cast is None or not self._widens(cast):
                return False
            start, widen = cast, [cast]
        bn = ctx.follow_outside(start)
        if bn is None or ctx.op(bn) != "relax.nn.batch_norm":
            return False
        call = ctx.call(bn)
        at = call.attrs
        stats = list(call.args[1:5])
        if self.half is not None:
            stats = [self._half_stat(a) for a in stats]
        if int(at.axis) % 4 != self.axis or not all(
            a is not None and ctx.is_weight(a) for a in stats
        ):
            return False
        if not (bool(at.center) and bool(at.scale)) or getattr(at, "training", False):
            return False
        node = ctx.g.nodes[bn]
        if bn in ctx.g.outside_uses or len(node.consumers) != 1:
            return False
        item = node.consumers[0]
        value = ctx.value(item)
        if not isinstance(value, relax.TupleGetItem) or int(value.index) != 0:
            return False
        if item in self.absorbed:
            return False
        ends = [item]
        if self.half is not None:  # the float32 BatchNorm's rounding back to the half dtype
            rounding = ctx.follow_outside(item)
            if rounding is None or not rounds_to(ctx, rounding, self.half):
                return False
            ends.append(rounding)
        self.stats = stats
        self.eps = float(at.epsilon)
        self.absorbed += [*widen, bn, *ends]
        self.cur = ends[-1]
        return True

    def _half_stat(self, expr: relax.Expr) -> relax.Expr | None:
        """A half BatchNorm's statistic in the half dtype: the tensor behind its widening, or
        a float32 constant the compiler widened, narrowed back where that is exact (else
        None: the BatchNorm stays an element-wise kernel)."""
        source = widened(self.ctx, expr, self.half)
        if source is not None or not isinstance(expr, tvm.ir.expr.Constant):
            return source
        if dtype_of(expr) != "float32":
            return None
        wide = expr.value.numpy()
        narrow = wide.astype(ml_dtypes.bfloat16 if self.half == "bfloat16" else np.float16)
        if not np.array_equal(narrow.astype(np.float32), wide, equal_nan=True):
            return None
        return relax.const(narrow, self.half)

    def _widens(self, index: int) -> bool:
        """Binding ``index`` is ``astype(cur, "float32")`` of the half result."""
        ctx = self.ctx
        return (
            ctx.op(index) == "relax.astype"
            and ctx.call(index).args[0].same_as(ctx.var(self.cur))
            and str(ctx.var(index).ty.dtype) == "float32"
        )


# the warehouse implementation names this module binds
BINDS = {"torch.conv2d": bind_conv2d}
