"""Convolution binder (``torch.conv2d``): a 2-D convolution in NCHW or NHWC with an OIHW weight,
then what the library applies on the way out: a bias add (a weight of the channel count that
broadcasts along the channel axis), a folded inference BatchNorm, an activation, a residual add
and an activation after it."""

from __future__ import annotations

import math

from tvm import relax

from ...runtime.conv2d import CONV2D_SPEC
from .activation import recognise_activation
from .common import (
    Ctx,
    LibraryCall,
    activation_of,
    classify_add,
    half_accumulation,
    pre_binding,
    rounds_to,
    shape_of,
    take_add,
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
    if not ctx.settings.conv_winograd:
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
            if nxt is None and self.stats is None and self.act == "none" and self.residual is None:
                if self.batch_norm():
                    continue
            if nxt is None and self.written_out_activation():
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
        and nothing else using ``bn``: folded into the convolution."""
        ctx = self.ctx
        if self.half is not None:
            # folding into half-precision weights rounds them once more than torch does (it
            # runs the BatchNorm after the convolution): MobileNetV2 in float16 was 3x torch's
            # error; the BatchNorm stays an element-wise kernel in the model's dtype
            return False
        bn = ctx.follow_outside(self.cur)
        if bn is None or ctx.op(bn) != "relax.nn.batch_norm":
            return False
        call = ctx.call(bn)
        at = call.attrs
        if int(at.axis) % 4 != self.axis or not all(ctx.is_weight(a) for a in call.args[1:5]):
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
        self.stats = list(call.args[1:5])
        self.eps = float(at.epsilon)
        self.absorbed += [bn, item]
        self.cur = item
        return True


# the warehouse implementation names this module binds
BINDS = {"torch.conv2d": bind_conv2d}
