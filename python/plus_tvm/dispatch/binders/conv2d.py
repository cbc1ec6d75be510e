"""Convolution binder (``torch.conv2d``): NCHW / OIHW conv2d with a weight, then a bias add
(a [1, C, 1, 1] or [C, 1, 1] weight), an activation and a residual add as kernel epilogues."""

from __future__ import annotations

from tvm import relax

from .common import Ctx, LibraryCall, activation_of, classify_add, pre_binding, shape_of


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
        stats: list[relax.Expr] | None = None
        while True:
            nxt = ctx.sole_consumer(cur, absorbed, anywhere=stats is not None)
            if nxt is None and stats is None and act == "none" and residual is None:
                folded = _batch_norm_after(ctx, cur, absorbed)
                if folded is not None:  # conv -> batch_norm -> [0]: folded into the conv
                    stats, eps, bn_index, item_index = folded
                    cfg["bn"], cfg["bn_eps"] = True, eps
                    absorbed += [bn_index, item_index]
                    cur = item_index
                    continue
            if nxt is None:
                break
            op, c = ctx.op(nxt), ctx.call(nxt)
            if op == "relax.add":
                found = classify_add(
                    ctx,
                    cur,
                    nxt,
                    lambda shape, c=c_out: shape in ([1, c, 1, 1], [c, 1, 1]),
                    can_bias=bias is None and act == "none" and residual is None,
                    can_residual=residual is None,
                )
                if found is None:
                    break
                if found[0] == "bias":
                    bias = found[1]
                else:
                    residual = found[1]
            elif activation_of(op, c) is not None and act == "none" and residual is None:
                act = activation_of(op, c)
            else:
                break
            absorbed.append(nxt)
            cur = nxt
        if bias is not None:
            pre.append(pre_binding("plus_bias", relax.op.reshape(bias, [c_out])))
            args.append(pre[-1][0])
            cfg["bias"] = True
        if stats is not None:
            args.extend(stats)
        if residual is not None:
            args.append(residual)
            cfg["residual"] = True
        cfg["act"] = act
        return LibraryCall("plus.conv2d", args, cfg, cur, absorbed, pre)
    return None


def _batch_norm_after(ctx: Ctx, cur: int, absorbed: list[int]):  # noqa: ANN202
    """(statistics, eps, bn binding, item binding) for ``bn = batch_norm(cur, ...); y =
    bn[0]`` with weight statistics, channel axis 1, and nothing else using ``bn``."""
    bn = ctx.sole_consumer(cur, absorbed, anywhere=True)
    if bn is None or ctx.op(bn) != "relax.nn.batch_norm":
        return None
    call = ctx.call(bn)
    at = call.attrs
    if int(at.axis) != 1 or not all(ctx.is_weight(a) for a in call.args[1:5]):
        return None
    if not (bool(at.center) and bool(at.scale)) or getattr(at, "training", False):
        return None
    node = ctx.g.nodes[bn]
    if bn in ctx.g.outside_uses or len(node.consumers) != 1:
        return None
    item = node.consumers[0]
    value = ctx.value(item)
    if not isinstance(value, relax.TupleGetItem) or int(value.index) != 0 or item in absorbed:
        return None
    gamma, beta, mean, var = call.args[1:5]
    return [gamma, beta, mean, var], float(at.epsilon), bn, item
