"""Batched GEMM binder (``torch.matmul``): a matmul of two activations; a transpose of the last
two axes of an operand becomes ``ta`` / ``tb``, a following multiply by a scalar ``scale``. A
half-precision matmul accumulating in float32 (how half models are imported) takes its one
rounding back to the half dtype with it: the call computes in that dtype (a float32 result no
kernel returns stays TIR)."""

from __future__ import annotations

from ...runtime.matmul import MATMUL_SPEC
from .common import Ctx, LibraryCall, half_accumulation, permute_axes, rounds_to, shape_of


def _operand(ctx: Ctx, expr) -> tuple[object, bool]:  # noqa: ANN001
    found = ctx.member_call(expr)
    if found is not None and ctx.op(found[0]) == "relax.permute_dims":
        axes = permute_axes(found[1])
        rank = len(shape_of(expr))
        if axes is not None and rank >= 2 and axes == [*range(rank - 2), rank - 1, rank - 2]:
            return found[1].args[0], True
    return expr, False


def bind_matmul(ctx: Ctx, members: tuple[int, ...]) -> LibraryCall | None:
    for i in members:
        if ctx.op(i) != "relax.matmul":
            continue
        call = ctx.call(i)
        if len(shape_of(call.args[0])) < 2 or len(shape_of(call.args[1])) < 2:
            return None
        a, ta = _operand(ctx, call.args[0])
        b, tb = _operand(ctx, call.args[1])
        absorbed = [i]
        cur = i
        half = half_accumulation(ctx, i)
        if half is not None:  # the float32 product's rounding
            nxt = ctx.follow(cur)
            if nxt is None or not rounds_to(ctx, nxt, half):
                return None
            absorbed.append(nxt)
            cur = nxt
        scale = 1.0
        nxt = ctx.follow(cur)
        if nxt is not None and ctx.op(nxt) in ("relax.multiply", "relax.divide"):
            c = ctx.call(nxt)
            if c.args[0].same_as(ctx.var(cur)):
                k = ctx.is_scalar_const(c.args[1])
                if k is not None and k != 0.0:
                    scale = k if ctx.op(nxt) == "relax.multiply" else 1.0 / k
                    absorbed.append(nxt)
                    cur = nxt
        cfg = {"ta": ta, "tb": tb, "scale": scale, "bias": False}
        return LibraryCall(MATMUL_SPEC, [a, b], cfg, cur, absorbed)
    return None


# the warehouse implementation names this module binds
BINDS = {"torch.matmul": bind_matmul}
