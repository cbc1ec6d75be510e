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
    dtype_of,
    half_accumulation,
    is_view_keeping_last,
    pre_binding,
    rounds_to,
    shape_of,
    take_add,
    widened,
)


def _weight_operand(ctx: Ctx, rhs: relax.Expr) -> tuple[relax.Expr, str] | None:
    """The weight behind a matmul's right operand: ``W`` as [K, N] or ``permute(W)`` of an
    nn.Linear weight [N, K]."""
    if ctx.is_weight(rhs) and len(shape_of(rhs)) == 2:
        return rhs, "kn"
    # the transpose of a weight, in the subgraph or anywhere in the block: the call reads
    # the weight itself (a transpose left outside, as the prefill's LM head over its last
    # position has it, is then read by nothing and goes)
    found = ctx.member_call(rhs) or ctx.block_call(rhs)
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


class _Epilogue:
    """What a GEMM call absorbs after the matmul, in the match's order: views keeping the
    rows, a bias, an activation (an op or written out), a residual; with ``with_norm`` a
    LayerNorm over the last axis ends it (the sum before it handed out as a second output
    where it is read again: pre-LN blocks carry it on as the next residual)."""

    def __init__(self, ctx: Ctx, gemm: int, n: int, with_norm: bool) -> None:
        self.ctx = ctx
        self.gemm = gemm
        self.n = n
        self.with_norm = with_norm
        self.cur = gemm
        self.absorbed = [gemm]
        # a half-precision GEMM accumulates in float32: its bias comes widened, and one
        # astype rounds to the half dtype; the call then computes in that dtype throughout
        self.half = half_accumulation(ctx, gemm)
        self.rounded = self.half is None
        self.bias: relax.Expr | None = None
        self.residual: relax.Expr | None = None
        self.act = "none"
        self.norm: relax.Call | None = None
        self.extra: list[int] = []
        # a half model's LayerNorm runs in float32 between two casts: widened, then rounded
        self.widened = self.norm_rounded = False

    def done(self) -> bool:
        """The LayerNorm (rounded back, in a half model) ends the chain."""
        return self.norm is not None and (self.half is None or self.norm_rounded)

    def walk(self) -> None:
        while not self.done():
            nxt = self._next()
            # (a half model's activation is a float32 op between casts: it starts with the
            # widening cast)
            widening = nxt is not None and self.rounded and self.ctx.op(nxt) == "relax.astype"
            if (nxt is None or widening) and self._written_out_activation():
                continue
            if nxt is None:
                return
            if not self._absorb(nxt):
                return
            self.absorbed.append(nxt)
            self.cur = nxt

    def _next(self) -> int | None:
        nxt = self.ctx.follow(self.cur)
        if nxt is None and not self.rounded:
            # a half GEMM's rounding the subgraph left out (a one-row GEMM of a batched
            # operand, the prefill's LM head, matches alone): its sole reader anywhere
            after = self.ctx.follow_outside(self.cur)
            if after is not None and rounds_to(self.ctx, after, self.half):
                return after
        if nxt is None and self.with_norm and self.cur != self.gemm and self.norm is None:
            # the sum is read again: the LayerNorm still comes in, the sum a second output
            readers = self.ctx.match.readers.get(self.cur, ())
            nxt = next((c for c in readers if self._leads_to_norm(c)), None)
            if nxt is not None:
                self.extra.append(self.cur)
        return nxt

    def _leads_to_norm(self, index: int) -> bool:
        """``index`` is the LayerNorm, or in a half model the cast widening its input."""
        if self.ctx.op(index) == "relax.nn.layer_norm":
            return True
        after = self.ctx.follow(index)
        return (
            self.half is not None
            and self.ctx.op(index) == "relax.astype"
            and after is not None
            and self.ctx.op(after) == "relax.nn.layer_norm"
        )

    def _may_activate(self) -> bool:
        return not self.with_norm and self.act == "none" and self.residual is None

    def _written_out_activation(self) -> bool:
        if not self._may_activate():
            return False
        found = recognise_activation(self.ctx, self.cur, self.absorbed)
        if found is None:
            return False
        self.act, self.cur, ops = found
        self.absorbed.extend(ops)
        return True

    def _absorb(self, nxt: int) -> bool:
        ctx = self.ctx
        op = ctx.op(nxt)
        if is_view_keeping_last(ctx, nxt):
            return True
        if not self.rounded:  # the float32 accumulator: a widened bias, then the rounding
            if op == "relax.add":
                return self._add(nxt)
            self.rounded = rounds_to(ctx, nxt, self.half)
            return self.rounded
        if self.norm is not None:  # (a half model's) the float32 LayerNorm's rounding
            self.norm_rounded = rounds_to(ctx, nxt, self.half)
            return self.norm_rounded
        if op == "relax.astype" and self.half is not None and self.with_norm:
            widens = dtype_of(ctx.call(nxt).args[0]) == self.half
            self.widened = widens and dtype_of(ctx.var(nxt)) == "float32" and not self.widened
            return self.widened
        if op == "relax.add":
            return self._add(nxt)
        if op in ACTIVATIONS and self._may_activate():
            self.act = ACTIVATIONS[op]
            return True
        if op == "relax.nn.layer_norm" and self.with_norm and self.widened == bool(self.half):
            call = ctx.call(nxt)
            rank = len(shape_of(ctx.var(nxt)))
            if [int(a) for a in call.attrs.axes] not in ([-1], [rank - 1]):
                return False
            self.norm = call
            return True
        return False

    def _add(self, nxt: int) -> bool:
        n = self.n
        found = classify_add(
            self.ctx,
            self.cur,
            nxt,
            lambda shape: bool(shape) and shape[-1] == n and all(d == 1 for d in shape[:-1]),
            can_bias=self.bias is None and self.residual is None and self.act == "none",
            can_residual=self.residual is None and self.rounded,
            widened_from=None if self.rounded else self.half,
        )
        return take_add(self, found)


def _bind(ctx: Ctx, members: tuple[int, ...], with_norm: bool) -> LibraryCall | None:
    gemm = _find_gemm(ctx, members)
    if gemm is None:
        return None
    index, x, w, layout = gemm
    n = shape_of(w)[0 if layout == "nk" else 1]
    epi = _Epilogue(ctx, index, n, with_norm)
    epi.walk()
    if (with_norm and not epi.done()) or not epi.rounded:
        return None  # (a half GEMM's float32 result: no kernel returns it)
    cfg: dict[str, object] = {"w": layout, "bias": epi.bias is not None, "residual": False}
    args: list[relax.Expr] = [x, w]
    pre: list = []
    if epi.bias is not None:
        bias = epi.bias
        if len(shape_of(bias)) != 1:
            pre.append(pre_binding("plus_bias", relax.op.reshape(bias, [n])))
            bias = pre[-1][0]
        args.append(bias)
    final = ctx.var(epi.cur)
    rows = list(final.ty.shape.values[:-1])
    if not _same(list(x.ty.shape.values[:-1]), rows):
        # the kernel writes the final value's own shape: present x with its rows (a view), so
        # no reshape of the output is left behind (a function output cannot become a view)
        k = x.ty.shape.values[-1]
        pre.append(pre_binding("plus_x", relax.op.reshape(x, [*rows, k])))
        args[0] = pre[-1][0]
    if epi.residual is not None:
        cfg["residual"] = True
        residual = epi.residual
        if not _same(list(residual.ty.shape.values), list(final.ty.shape.values)):
            pre.append(pre_binding("plus_residual", relax.op.reshape(residual, final.ty.shape)))
            residual = pre[-1][0]
        args.append(residual)
    if not with_norm:
        cfg["act"] = epi.act
        return LibraryCall(LINEAR_SPEC, args, cfg, epi.cur, epi.absorbed, pre)
    norm = epi.norm
    cfg.update(gamma=bool(norm.attrs.scale), beta=bool(norm.attrs.center))
    cfg["eps"] = float(norm.attrs.epsilon)
    for on, param in ((norm.attrs.scale, norm.args[1]), (norm.attrs.center, norm.args[2])):
        if on:
            # (a half model widened its gamma / beta for the float32 LayerNorm)
            param = param if epi.half is None else widened(ctx, param, epi.half)
            if param is None:
                return None
            args.append(param)
    if epi.extra:
        cfg["sum_out"] = True
    return LibraryCall(
        LINEAR_LAYERNORM_SPEC, args, cfg, epi.cur, epi.absorbed, pre, extra=epi.extra
    )


def bind_linear(ctx: Ctx, members: tuple[int, ...]) -> LibraryCall | None:
    return _bind(ctx, members, with_norm=False)


def bind_linear_layernorm(ctx: Ctx, members: tuple[int, ...]) -> LibraryCall | None:
    return _bind(ctx, members, with_norm=True)


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(tvm_ffi.structural_equal(x, y) for x, y in zip(a, b))


# the warehouse implementation names this module binds
BINDS = {"torch.linear": bind_linear, "torch.linear_layernorm": bind_linear_layernorm}
