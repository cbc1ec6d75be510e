"""Row-kernel binders: ``torch.layer_norm``, ``torch.rms_norm`` (RMSNorm / T5LayerNorm, op or
decomposed: power or x*x, mean, + eps, rsqrt, multiply, multiply by gamma) and
``torch.softmax`` (with a preceding multiply by a scalar as ``scale``)."""

from __future__ import annotations

from tvm import relax

from ...runtime.layer_norm import LAYER_NORM_SPEC
from ...runtime.log_softmax import LOG_SOFTMAX_SPEC
from ...runtime.rms_norm import RMS_NORM_SPEC
from ...runtime.softmax import SOFTMAX_SPEC
from .common import Ctx, LibraryCall, pre_binding, shape_of

_SAME_DTYPE_CAST = "relax.astype"


def _last_axis(axes: object, rank: int) -> bool:
    vals = [int(a) for a in axes] if axes is not None else []
    return vals in ([-1], [rank - 1])


def bind_layer_norm(ctx: Ctx, members: tuple[int, ...]) -> LibraryCall | None:
    for i in members:
        if ctx.op(i) != "relax.nn.layer_norm":
            continue
        call = ctx.call(i)
        rank = len(shape_of(ctx.var(i)))
        if not _last_axis(call.attrs.axes, rank):
            return None
        args = [call.args[0]]
        cfg = {
            "gamma": bool(call.attrs.scale),
            "beta": bool(call.attrs.center),
            "eps": float(call.attrs.epsilon),
            "axes": 1,
        }
        if call.attrs.scale:
            args.append(call.args[1])
        if call.attrs.center:
            args.append(call.args[2])
        return LibraryCall(LAYER_NORM_SPEC, args, cfg, i, [i])
    return None


def _skip_casts(ctx: Ctx, expr: relax.Expr) -> relax.Expr:
    while True:
        found = ctx.member_call(expr)
        if found is None or ctx.op(found[0]) != _SAME_DTYPE_CAST:
            return expr
        src = found[1].args[0]
        if str(src.ty.dtype) != str(ctx.var(found[0]).ty.dtype):
            return expr
        expr = src


def bind_rms_norm(ctx: Ctx, members: tuple[int, ...]) -> LibraryCall | None:
    for i in members:
        if ctx.op(i) == "relax.nn.rms_norm":
            call = ctx.call(i)
            if not _last_axis(call.attrs.axes, len(shape_of(ctx.var(i)))):
                return None
            cfg = {"gamma": True, "eps": float(call.attrs.epsilon)}
            return LibraryCall(RMS_NORM_SPEC, [call.args[0], call.args[1]], cfg, i, [i])
    # decomposed: mean(x*x or x**2, -1, keepdims) + eps -> rsqrt -> x * r (-> * gamma)
    mean = next((i for i in members if ctx.op(i) == "relax.mean"), None)
    if mean is None:
        return None
    mcall = ctx.call(mean)
    rank = len(shape_of(mcall.args[0]))
    if not _last_axis(mcall.attrs.axis, rank) or not mcall.attrs.keepdims:
        return None
    sq = ctx.member_call(_skip_casts(ctx, mcall.args[0]))
    if sq is None:
        return None
    si, scall = sq
    if ctx.op(si) == "relax.power" and ctx.is_scalar_const(scall.args[1]) == 2.0:
        x = scall.args[0]
    elif ctx.op(si) == "relax.multiply" and scall.args[0].same_as(scall.args[1]):
        x = scall.args[0]
    else:
        return None
    x = _skip_casts(ctx, x)
    absorbed = [si, mean]
    cur = mean
    eps = None
    r = None
    while r is None:
        nxt = ctx.follow(cur)
        if nxt is None:
            return None
        op, call = ctx.op(nxt), ctx.call(nxt)
        if op == "relax.add" and eps is None:
            other = call.args[1] if call.args[0].same_as(ctx.var(cur)) else call.args[0]
            eps = ctx.is_scalar_const(other)
            if eps is None:
                return None
        elif op == "relax.rsqrt" and eps is not None:
            r = nxt
        else:
            return None
        absorbed.append(nxt)
        cur = nxt
    nxt = ctx.follow(cur)
    if nxt is None or ctx.op(nxt) != "relax.multiply":
        return None
    call = ctx.call(nxt)
    other = call.args[1] if call.args[0].same_as(ctx.var(cur)) else call.args[0]
    if not _skip_casts(ctx, other).same_as(x):
        return None
    absorbed.append(nxt)
    cur = nxt
    args = [x]
    cfg: dict[str, object] = {"gamma": False, "eps": float(eps)}
    nxt = ctx.follow(cur)
    if (
        nxt is not None
        and ctx.op(nxt) == _SAME_DTYPE_CAST
        and str(ctx.call(nxt).args[0].ty.dtype) == str(ctx.var(nxt).ty.dtype)
    ):
        absorbed.append(nxt)
        cur = nxt
        nxt = ctx.follow(cur)
    if nxt is not None and ctx.op(nxt) == "relax.multiply":
        call = ctx.call(nxt)
        gamma = call.args[1] if call.args[0].same_as(ctx.var(cur)) else call.args[0]
        gshape = shape_of(gamma)
        n = shape_of(x)[-1]
        if (
            gshape
            and gshape[-1] == n
            and all(d == 1 for d in gshape[:-1])
            and ctx.defined_before(gamma, nxt)
        ):
            if len(gshape) != 1:
                pre = [pre_binding("plus_gamma", relax.op.reshape(gamma, [n]))]
                gamma = pre[0][0]
            else:
                pre = []
            cfg["gamma"] = True
            args.append(gamma)
            absorbed.append(nxt)
            return LibraryCall(RMS_NORM_SPEC, args, cfg, nxt, absorbed, pre)
    return LibraryCall(RMS_NORM_SPEC, args, cfg, cur, absorbed)


def bind_softmax(ctx: Ctx, members: tuple[int, ...]) -> LibraryCall | None:
    for i in members:
        if ctx.op(i) != "relax.nn.softmax":
            continue
        call = ctx.call(i)
        rank = len(shape_of(ctx.var(i)))
        if int(call.attrs.axis) not in (-1, rank - 1):
            return None
        return LibraryCall(SOFTMAX_SPEC, [call.args[0]], {"axis": -1, "scale": 1.0}, i, [i])
    return None


def bind_log_softmax(ctx: Ctx, members: tuple[int, ...]) -> LibraryCall | None:
    for i in members:
        if ctx.op(i) != "relax.nn.log_softmax":
            continue
        call = ctx.call(i)
        if int(call.attrs.axis) not in (-1, len(shape_of(ctx.var(i))) - 1):
            return None
        return LibraryCall(LOG_SOFTMAX_SPEC, [call.args[0]], {"axis": -1}, i, [i])
    return None


# the warehouse implementation names this module binds
BINDS = {
    "torch.layer_norm": bind_layer_norm,
    "torch.log_softmax": bind_log_softmax,
    "torch.rms_norm": bind_rms_norm,
    "torch.softmax": bind_softmax,
}
