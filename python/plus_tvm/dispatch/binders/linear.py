"""GEMM binders: ``torch.linear`` (bias / activation / residual epilogues) and
``torch.linear_layernorm`` (GEMM + bias + residual + LayerNorm, PluS S2/S4)."""

from __future__ import annotations

import tvm_ffi
from tvm import relax

from ...runtime.linear import LINEAR_SPEC
from ...runtime.linear_layernorm import LINEAR_LAYERNORM_SPEC
from .activation import recognise_activation
from .common import (
    ACTIVATIONS,
    Ctx,
    LibraryCall,
    classify_add,
    is_view_keeping_last,
    pre_binding,
    shape_of,
)


def _weight_operand(ctx: Ctx, rhs: relax.Expr) -> tuple[relax.Expr, str] | None:
    """The weight behind a matmul's right operand: ``W`` as [K, N] or ``permute(W)`` of an
    nn.Linear weight [N, K]."""
    if ctx.is_weight(rhs) and len(shape_of(rhs)) == 2:
        return rhs, "kn"
    found = ctx.member_call(rhs)
    if found is not None and ctx.op(found[0]) == "relax.permute_dims":
        w = found[1].args[0]
        axes = found[1].attrs.axes
        if (
            ctx.is_weight(w)
            and len(shape_of(w)) == 2
            and (axes is None or list(map(int, axes)) == [1, 0])
        ):
            return w, "nk"
    return None


def _find_gemm(
    ctx: Ctx, members: tuple[int, ...]
) -> tuple[int, relax.Expr, relax.Expr, str] | None:
    for i in members:
        if ctx.op(i) != "relax.matmul":
            continue
        call = ctx.call(i)
        if call.attrs.out_dtype not in (None, "", "void") and str(call.attrs.out_dtype) != str(
            ctx.var(i).ty.dtype
        ):
            continue
        found = _weight_operand(ctx, call.args[1])
        if found is not None and len(shape_of(call.args[0])) >= 2:
            return i, call.args[0], found[0], found[1]
    return None


def _epilogue(
    ctx: Ctx, start: int, members: tuple[int, ...], with_norm: bool
) -> LibraryCall | None:
    gemm = _find_gemm(ctx, members)
    if gemm is None:
        return None
    index, x, w, layout = gemm
    n = shape_of(w)[0 if layout == "nk" else 1]
    cfg: dict[str, object] = {"w": layout, "bias": False, "residual": False}
    if not with_norm:
        cfg["act"] = "none"
    args: list[relax.Expr] = [x, w]
    bias = residual = None
    act = "none"
    absorbed = [index]
    cur = index
    norm = None
    extra: list[int] = []
    while True:
        nxt = ctx.sole_consumer(cur, absorbed)
        if nxt is None and with_norm and cur != index:
            # pre-LN blocks (GPT-2, ViT) carry the sum on as the next residual: take the
            # LayerNorm anyway and hand the sum out as a second output (multi-output rule)
            nxt = next(
                (
                    c
                    for c in ctx.g.nodes[cur].consumers
                    if c in ctx.members and ctx.op(c) == "relax.nn.layer_norm"
                ),
                None,
            )
            if nxt is not None:
                extra.append(cur)
        if nxt is None and not with_norm and act == "none" and residual is None:
            found = recognise_activation(ctx, cur, absorbed)  # an activation written out
            if found is not None:
                act, cur, ops = found
                absorbed.extend(ops)
                continue
        if nxt is None:
            break
        op = ctx.op(nxt)
        call = ctx.call(nxt)
        if is_view_keeping_last(ctx, nxt):
            absorbed.append(nxt)
            cur = nxt
            continue
        if op == "relax.add":
            found = classify_add(
                ctx,
                cur,
                nxt,
                lambda shape: bool(shape) and shape[-1] == n and all(d == 1 for d in shape[:-1]),
                can_bias=bias is None and residual is None and act == "none",
                can_residual=residual is None,
            )
            if found is None:
                break
            if found[0] == "bias":
                bias = found[1]
            else:
                residual = found[1]
            absorbed.append(nxt)
            cur = nxt
            continue
        if op in ACTIVATIONS and not with_norm and act == "none" and residual is None:
            act = ACTIVATIONS[op]
            absorbed.append(nxt)
            cur = nxt
            continue
        if op == "relax.nn.layer_norm" and with_norm:
            axes = [int(a) for a in call.attrs.axes]
            rank = len(shape_of(ctx.var(nxt)))
            if axes not in ([-1], [rank - 1]):
                break
            norm = (nxt, call)
            absorbed.append(nxt)
            cur = nxt
        break
    if with_norm and norm is None:
        return None
    if bias is not None:
        cfg["bias"] = True
        if len(shape_of(bias)) != 1:
            pre = [pre_binding("plus_bias", relax.op.reshape(bias, [n]))]
            bias = pre[0][0]
        else:
            pre = []
        args.append(bias)
    else:
        pre = []
    final = ctx.var(cur)
    rows = list(final.ty.shape.values[:-1])
    if not _same(list(x.ty.shape.values[:-1]), rows):
        # the kernel writes the final value's own shape: present x with its rows (a view), so
        # no reshape of the output is left behind (a function output cannot become a view)
        k = x.ty.shape.values[-1]
        pre.append(pre_binding("plus_x", relax.op.reshape(x, [*rows, k])))
        args[0] = pre[-1][0]
    if residual is not None:
        cfg["residual"] = True
        if not _same(list(residual.ty.shape.values), list(final.ty.shape.values)):
            pre.append(pre_binding("plus_residual", relax.op.reshape(residual, final.ty.shape)))
            residual = pre[-1][0]
        args.append(residual)
    if with_norm:
        _, ncall = norm
        gamma, beta = ncall.args[1], ncall.args[2]
        cfg.update(gamma=bool(ncall.attrs.scale), beta=bool(ncall.attrs.center))
        cfg["eps"] = float(ncall.attrs.epsilon)
        if ncall.attrs.scale:
            args.append(gamma)
        if ncall.attrs.center:
            args.append(beta)
        kernel = LINEAR_LAYERNORM_SPEC
        if extra:
            cfg["sum_out"] = True
    else:
        cfg["act"] = act
        kernel = LINEAR_SPEC
    del start
    return LibraryCall(kernel, args, cfg, cur, absorbed, pre, extra=extra)


def bind_linear(ctx: Ctx, members: tuple[int, ...]) -> LibraryCall | None:
    return _epilogue(ctx, members[0], members, with_norm=False)


def bind_linear_layernorm(ctx: Ctx, members: tuple[int, ...]) -> LibraryCall | None:
    return _epilogue(ctx, members[0], members, with_norm=True)


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(tvm_ffi.structural_equal(x, y) for x, y in zip(a, b))


# the warehouse implementation names this module binds
BINDS = {"torch.linear": bind_linear, "torch.linear_layernorm": bind_linear_layernorm}
