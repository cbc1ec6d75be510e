"""Convolution binder (``torch.conv2d``): NCHW / OIHW conv2d with a weight, then a bias add
(a [1, C, 1, 1] or [C, 1, 1] weight), an activation and a residual add as kernel epilogues."""

from __future__ import annotations

from tvm import relax

from .common import ACTIVATIONS, Ctx, LibraryCall, pre_binding, same_shape, shape_of


def bind_conv2d(ctx: Ctx, members: tuple[int, ...]) -> LibraryCall | None:
    for i in members:
        if ctx.op(i) != "relax.nn.conv2d":
            continue
        call = ctx.call(i)
        at = call.attrs
        if str(at.data_layout) != "NCHW" or str(at.kernel_layout) != "OIHW":
            return None
        if str(at.out_layout) not in ("NCHW", ""):
            return None
        x, w = call.args
        if not ctx.is_weight(w):
            return None
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
            "bias": False,
            "residual": False,
            "act": "none",
        }
        args: list[relax.Expr] = [x, w]
        pre: list = []
        absorbed = [i]
        cur = i
        bias = residual = None
        act = "none"
        while True:
            nxt = ctx.sole_consumer(cur, absorbed)
            if nxt is None:
                break
            op, c = ctx.op(nxt), ctx.call(nxt)
            if op == "relax.add":
                other = c.args[1] if c.args[0].same_as(ctx.var(cur)) else c.args[0]
                oshape = shape_of(other)
                if (
                    bias is None
                    and act == "none"
                    and residual is None
                    and ctx.is_weight(other)
                    and oshape in ([1, c_out, 1, 1], [c_out, 1, 1])
                ):
                    bias = other
                elif (
                    residual is None
                    and same_shape(other, ctx.var(nxt))
                    and ctx.defined_before(other, nxt)
                ):
                    residual = other
                else:
                    break
            elif op in ACTIVATIONS and act == "none" and residual is None:
                act = ACTIVATIONS[op]
            else:
                break
            absorbed.append(nxt)
            cur = nxt
        if bias is not None:
            pre.append(pre_binding("plus_bias", relax.op.reshape(bias, [c_out])))
            args.append(pre[-1][0])
            cfg["bias"] = True
        if residual is not None:
            args.append(residual)
            cfg["residual"] = True
        cfg["act"] = act
        return LibraryCall("plus.conv2d", args, cfg, cur, absorbed, pre)
    return None
