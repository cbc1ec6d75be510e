"""Attention binder (``torch.sdpa``): permute + matmul + scale + mask + softmax + matmul +
permute (PluS S1/S6) as one ``plus.attention`` call.

The scale (a multiply or divide by a scalar), the additive mask and the head permutes of the
inputs and the output become kernel parameters (``scale``, ``mask``, ``layout`` /
``out_layout``); whatever computes the mask stays as TIR before the call. SDPA's safe softmax
(a ``where`` zeroing the rows whose mask is all ``-inf``, as ``CanonicalizeSDPA`` leaves it)
becomes ``zero_masked``.

Keys and values with fewer heads than the queries, repeated by ``repeat_kv`` (grouped-query
attention), are passed unrepeated. A decode step's keys and values that are the KV cache with
the new token in its last position (``where(last, new, permute(cache))``, the select of
``lm.step_module.slot_layer``) are passed as the cache itself, read in place by the kernel,
and the new token's (``cache=1``): neither the select nor the permute is computed. In the
bucketed decode (``LMStep(slot=True)``) the slot is an int64 tensor input ``[1]`` anywhere in
the cache (``where(arange(T) == slot, new, permute(cache))``): it is passed too (``slot=1``),
the kernel writes the new token there.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ...runtime.attention import ATTENTION_SPEC
from .common import (
    HALF_DTYPES,
    Ctx,
    LibraryCall,
    dtype_of,
    half_accumulation,
    permute_axes,
    pre_binding,
    shape_of,
)

_VIEWS = {"relax.reshape", "relax.expand_dims", "relax.squeeze", "relax.broadcast_to"}


def _view_chain(ctx: Ctx, expr: relax.Expr) -> list[relax.Expr]:
    """``expr`` and the tensors it views, outermost first (reshapes and broadcasts that keep
    the element count; a real broadcast ends the chain)."""
    chain = [expr]
    while True:
        found = ctx.block_call(expr)
        if found is None or ctx.op(found[0]) not in _VIEWS:
            return chain
        src = found[1].args[0]
        if not _same_count(src, ctx.var(found[0])):
            return chain  # a real broadcast (or one not provably a view: symbolic dims)
        expr = src
        chain.append(expr)


def _strip_views(ctx: Ctx, expr: relax.Expr) -> relax.Expr:
    return _view_chain(ctx, expr)[-1]


def _same_count(a: relax.Expr, b: relax.Expr) -> bool:
    """Whether ``a`` and ``b`` provably have as many elements (symbolic dims compared as
    expressions: a GQA broadcast ``[b, 2, 1, s, d] -> [b, 2, 2, s, d]`` is no view)."""
    counts = []
    for ty in (a.ty, b.ty):
        if not isinstance(ty, relax.TensorType) or ty.shape is None:
            return False
        counts.append(tvm.tirx.const(1, "int64"))
        for d in ty.shape.values:
            counts[-1] = counts[-1] * d
    return tvm.sym.Analyzer().can_prove_equal(*counts)


def _numel(expr: relax.Expr) -> int | None:
    shape = shape_of(expr)
    if not shape or any(d is None for d in shape):
        return None
    out = 1
    for d in shape:
        out *= d
    return out


def _head_input(ctx: Ctx, expr: relax.Expr) -> tuple[relax.Expr, relax.Expr] | None:
    """(bshd tensor or None, bhsd tensor) behind an attention operand."""
    # the innermost 4-D view: q of a packed QKV projection is squeeze(strided_slice(5-D))
    t = next((e for e in reversed(_view_chain(ctx, expr)) if len(shape_of(e)) == 4), None)
    if t is None:
        return None
    found = ctx.block_call(t)
    if found is not None and ctx.op(found[0]) == "relax.permute_dims":
        if permute_axes(found[1]) == [0, 2, 1, 3]:
            return found[1].args[0], t
    return None, t


def _head_broadcast(source: relax.Expr, result: relax.Expr) -> object | None:
    """The head count when ``result`` broadcasts ``source``, a 4-D tensor of one head (axis
    1), to several and changes nothing else (multi-query attention: Falcon's k and v), else
    None. Sizes may be symbolic (a decode step's batch and length)."""
    src, dst = _dims(source), _dims(result)
    if src is None or dst is None or len(src) != 4 or len(dst) != 4:
        return None
    analyzer = tvm.sym.Analyzer()
    if not analyzer.can_prove_equal(src[1], 1) or analyzer.can_prove_equal(dst[1], 1):
        return None
    if not _equal_dims([src[i] for i in (0, 2, 3)], [dst[i] for i in (0, 2, 3)]):
        return None
    return dst[1]


def _bias_of_heads(bias: relax.Expr, scores: list, q: list, pre: list) -> relax.Expr | None:
    """A bias added to ``[B*H, Sq, Sk]`` scores (BLOOM's ALiBi, ``[B*H, 1, Sk]``) as the
    ``[B, H, Sq, Sk]`` mask of the call, through a pre-binding; None when sizes are unknown."""
    if len(scores) != 3 or len(q) != 4 or None in scores or None in q:
        return None
    b, h = q[0], q[1]
    if scores[0] != b * h:
        return None
    pre.append(pre_binding("plus_bias", relax.op.broadcast_to(bias, scores)))
    pre.append(pre_binding("plus_bias", relax.op.reshape(pre[-1][0], [b, h, *scores[1:]])))
    return pre[-1][0]


# fill values whose sum with any score below 1e31 rounds to the fill value itself (float32)
_SWAMPING = -1e37


def _where_as_mask(
    ctx: Ctx, call: relax.Call, scores: relax.Expr, position: int, pre: list
) -> relax.Expr | None:
    """``where(c, s, low)`` (or ``where(c, low, s)``) on the scores ``s`` as the additive mask
    ``where(c, 0, low)`` (``where(c, low, 0)``), emitted before the call; None unless ``low``
    is ``-inf`` or, in float32, so low that ``s + low == low`` (exact then), and ``c`` is
    defined before the attention."""
    cond, a, b = call.args
    if a.same_as(scores):
        fill, keep_first = b, True
    elif b.same_as(scores):
        fill, keep_first = a, False
    else:
        return None
    low = ctx.is_scalar_const(fill)
    dtype = str(scores.ty.dtype)
    if low is None or not (low == float("-inf") or (dtype == "float32" and low <= _SWAMPING)):
        return None
    if not ctx.defined_before(cond, position) or len(shape_of(cond)) > 4:
        return None
    zero, fill_c = relax.const(0.0, dtype), relax.const(low, dtype)
    mask = relax.op.where(cond, zero, fill_c) if keep_first else relax.op.where(cond, fill_c, zero)
    pre.append(pre_binding("plus_mask", mask))
    return pre[-1][0]


def _rows_of_neg_inf(ctx: Ctx, cond: relax.Expr, mask: relax.Expr) -> bool:
    """``cond`` is ``all(mask == -inf, -1, keepdims)`` as ``CanonicalizeSDPA`` writes it."""
    from ...passes.canonicalize_sdpa import row_condition_source

    def definition(expr: relax.Expr) -> relax.Expr | None:
        found = ctx.block_call(expr)
        return found[1] if found is not None else None

    source = row_condition_source(cond, definition)
    return source is not None and source.same_as(mask)


def _dims(expr: relax.Expr) -> list | None:
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    return list(ty.shape.values)


def _equal_dims(a: list | None, b: list | None) -> bool:
    if a is None or b is None or len(a) != len(b):
        return False
    analyzer = tvm.sym.Analyzer()
    return all(analyzer.can_prove_equal(x, y) for x, y in zip(a, b))


def _repeat_kv_source(ctx: Ctx, t: relax.Expr) -> relax.Expr:
    """The ``[B, Hkv, S, D]`` tensor that ``t`` repeats head by head (transformers'
    ``repeat_kv``: ``expand(b, kv, rep, s, d).reshape(b, kv * rep, s, d)``), else ``t``."""
    found = ctx.block_call(t)
    if found is None or ctx.op(found[0]) != "relax.reshape":
        return t
    wide = ctx.block_call(found[1].args[0])
    if wide is None or ctx.op(wide[0]) != "relax.broadcast_to":
        return t
    one, many, out = _dims(wide[1].args[0]), _dims(ctx.var(wide[0])), _dims(t)
    if one is None or many is None or out is None or len(one) != 5 or len(out) != 4:
        return t
    b, kv, rep, s, d = many
    if not _equal_dims(one, [b, kv, 1, s, d]) or not _equal_dims(out, [b, kv * rep, s, d]):
        return t
    source = next(
        (e for e in _view_chain(ctx, wide[1].args[0]) if _equal_dims(_dims(e), [b, kv, s, d])),
        None,
    )
    return t if source is None else source


def _is_last_position(ctx: Ctx, cond: relax.Expr, length: object) -> bool:
    """``cond`` is ``(arange(length) == length - 1)[:, None]``: true at the last position."""
    dims = _dims(cond)
    if not _equal_dims(dims, [length, 1]):
        return False
    found = ctx.block_call(cond)
    if found is None or ctx.op(found[0]) not in _VIEWS:
        return False
    found = ctx.block_call(found[1].args[0])
    if found is None or ctx.op(found[0]) != "relax.equal":
        return False
    positions, last = found[1].args
    at = ctx.block_call(positions)
    if at is None or ctx.op(at[0]) != "relax.arange" or len(at[1].args) != 3:
        return False
    start, end, step = at[1].args
    if not all(isinstance(a.ty, tvm.ir.PrimType) for a in (start, end, step, last)):
        return False  # (a scalar argument is the integer expression itself in TVM 0.27)
    analyzer = tvm.sym.Analyzer()
    return (
        analyzer.can_prove_equal(start, 0)
        and analyzer.can_prove_equal(step, 1)
        and analyzer.can_prove_equal(end, length)
        and analyzer.can_prove_equal(last, length - 1)
    )


def _slot_position(ctx: Ctx, cond: relax.Expr, length: object) -> relax.Var | None:
    """The slot tensor when ``cond`` is ``(arange(length) == slot)[:, None]`` with ``slot`` an
    int64 input of the function holding one position (the bucketed decode's), else None."""
    if not _equal_dims(_dims(cond), [length, 1]):
        return None
    found = ctx.block_call(cond)
    if found is None or ctx.op(found[0]) not in _VIEWS:
        return None
    found = ctx.block_call(found[1].args[0])
    if found is None or ctx.op(found[0]) != "relax.equal":
        return None
    positions, slot = found[1].args
    at = ctx.block_call(positions)
    if at is None or ctx.op(at[0]) != "relax.arange" or len(at[1].args) != 3:
        return None
    if not isinstance(slot, relax.Var) or ctx.index(slot) is not None:
        return None  # (a function input: defined before the attention, one for every layer)
    if dtype_of(slot) != "int64" or not _equal_dims(_dims(slot), [1]):
        return None
    start, end, step = at[1].args
    if not all(isinstance(a.ty, tvm.ir.PrimType) for a in (start, end, step)):
        return None
    analyzer = tvm.sym.Analyzer()
    if not (
        analyzer.can_prove_equal(start, 0)
        and analyzer.can_prove_equal(step, 1)
        and analyzer.can_prove_equal(end, length)
    ):
        return None
    return slot


def _cache_append(
    ctx: Ctx, t: relax.Expr
) -> tuple[relax.Expr, relax.Expr, relax.Var | None] | None:
    """(cache, new, slot) when ``t`` (``[B, H, T, D]``) is the cache (``[T, B, H, D]``) with
    one position replaced by ``new`` (``[B, H, 1, D]``): ``where(last, new, permute(cache))``
    (``slot`` None: the last position) or ``where(arange(T) == slot, ...)`` with a slot
    tensor input (:func:`_slot_position`)."""
    found = ctx.block_call(t)
    if found is None or ctx.op(found[0]) != "relax.where":
        return None
    cond, new, old = found[1].args
    perm = ctx.block_call(old)
    if perm is None or ctx.op(perm[0]) != "relax.permute_dims":
        return None
    if permute_axes(perm[1]) != [1, 2, 0, 3]:
        return None
    cache = perm[1].args[0]
    if not _written_safely(ctx, cache, perm[0], found[0]):
        return None
    dims = _dims(cache)
    if dims is None or len(dims) != 4 or not _equal_dims(_dims(t), _dims(old)):
        return None
    length, b, h, d = dims
    if not _equal_dims(_dims(new), [b, h, 1, d]):
        return None
    slot = None if _is_last_position(ctx, cond, length) else _slot_position(ctx, cond, length)
    if slot is None and not _is_last_position(ctx, cond, length):
        return None
    return cache, _compact_new(ctx, new), slot


def _written_safely(ctx: Ctx, cache: relax.Expr, permute: int, select: int) -> bool:
    """The kernel may write the new token into ``cache``'s slot: ``cache`` is an input of the
    function (not a value of the block) read only by ``permute``, whose value only ``select``
    reads (nothing else sees the slot change)."""
    if not isinstance(cache, relax.Var) or ctx.index(cache) is not None:
        return False
    if ctx.g.sole_reader(permute) != select:
        return False
    readers = [
        node.index
        for node in ctx.g.nodes
        if node.call is not None and any(a.same_as(cache) for a in node.call.args)
    ]
    return readers == [permute]


def _compact_new(ctx: Ctx, new: relax.Expr) -> relax.Expr:
    """``new`` (``[B, H, 1, D]``) or the ``[B, 1, H, D]`` tensor it permutes: the same
    elements in the same order (one position), without the permute."""
    found = ctx.block_call(new)
    if found is not None and ctx.op(found[0]) == "relax.permute_dims":
        if permute_axes(found[1]) == [0, 2, 1, 3]:
            return found[1].args[0]
    return new


def _upcast_source(ctx: Ctx, expr: relax.Expr) -> relax.Expr | None:
    """The half tensor ``expr`` casts to float32, else None (BLOOM in bfloat16 multiplies
    float32 casts of its bfloat16 q and k^T: products of half values are exact in float32, so
    that is the half product accumulated in float32)."""
    found = ctx.block_call(expr)
    if found is None or ctx.op(found[0]) != "relax.astype" or dtype_of(expr) != "float32":
        return None
    source = found[1].args[0]
    return source if dtype_of(source) in HALF_DTYPES else None


def _upcast_half(ctx: Ctx, m1: int) -> str | None:
    """The half dtype when both operands of the product ``m1`` are float32 casts of it."""
    sources = [_upcast_source(ctx, a) for a in ctx.call(m1).args]
    if any(s is None for s in sources) or dtype_of(sources[0]) != dtype_of(sources[1]):
        return None
    return dtype_of(sources[0])


def _in_dtype(ctx: Ctx, mask: relax.Expr, dtype: str, pre: list) -> relax.Expr | None:
    """``mask`` in the attention's ``dtype``: as it is, or (a float32 mask of a half
    attention) cast back where it is a float32 cast of a ``dtype`` tensor through views, which
    the cast back keeps exactly (BLOOM's ALiBi); None otherwise."""
    if dtype_of(mask) == dtype:
        return mask
    sources = [_upcast_source(ctx, e) for e in _view_chain(ctx, mask)]
    if not any(s is not None and dtype_of(s) == dtype for s in sources):
        return None
    pre.append(pre_binding("plus_mask", relax.op.astype(mask, dtype)))
    return pre[-1][0]


def _operands(ctx: Ctx, m1: int) -> tuple[tuple, tuple, object | None] | None:
    """(q, k, heads) of the scores' matmul ``q @ k^T``: q and k each (bshd tensor or None,
    bhsd tensor); ``heads`` is q's head count where k^T is k's one head broadcast to every
    head of q (multi-query attention), k then the tensor of one head, else None."""
    c1 = ctx.call(m1)
    q_arg, kt_arg = c1.args[0], c1.args[1]
    upcast = [_upcast_source(ctx, a) for a in (q_arg, kt_arg)]
    if all(u is not None for u in upcast) and dtype_of(upcast[0]) == dtype_of(upcast[1]):
        q_arg, kt_arg = upcast  # (the half operands: the same float32 product)
    q = _head_input(ctx, q_arg)
    kt = _strip_views(ctx, kt_arg)
    found = ctx.block_call(kt)
    heads = None  # multi-query: k^T of one head broadcast to every head of q
    if found is not None and ctx.op(found[0]) == "relax.broadcast_to":
        heads = _head_broadcast(found[1].args[0], ctx.var(found[0]))
        found = ctx.block_call(found[1].args[0]) if heads is not None else None
    if q is None or found is None or ctx.op(found[0]) != "relax.permute_dims":
        return None
    # k^T of the heads, or of heads folded into the batch (BLOOM: [B*H, D, S] from [B*H, S, D])
    if permute_axes(found[1]) not in ([0, 1, 3, 2], [0, 2, 1]):
        return None
    k = _head_input(ctx, found[1].args[0])
    if k is None:
        return None
    return q, k, heads


class _Scores:
    """The chain from the scores' matmul to the output's matmul, in the match's order:
    views, a scale, additive masks (or a masked_fill as one), the softmax, SDPA's safe-softmax
    ``where``. :meth:`walk` is False where an operator on the way has no kernel parameter."""

    def __init__(self, ctx: Ctx, m1: int, q: tuple, pre: list) -> None:
        self.ctx = ctx
        self.q = q
        self.pre = pre
        # a half-precision attention: the products accumulate in float32, the softmax runs
        # in float32, and casts between the two dtypes come between (SDPA does the same)
        self.half = half_accumulation(ctx, m1)
        self.cur = m1
        self.absorbed = [m1]
        self.scale = 1.0
        self.masks: list[relax.Expr] = []
        self.softmax = False
        self.zero_masked = False
        self.m2: int | None = None

    def walk(self) -> bool:
        while self.m2 is None:
            nxt = self.ctx.follow(self.cur)
            if nxt is None or not self._absorb(nxt):
                return False
            self.absorbed.append(nxt)
            self.cur = nxt
        return True

    def _other(self, call: relax.Call) -> relax.Expr:
        """The operand of a binary op that is not the chain's value."""
        return call.args[1] if call.args[0].same_as(self.ctx.var(self.cur)) else call.args[0]

    def _absorb(self, nxt: int) -> bool:
        ctx = self.ctx
        op, call = ctx.op(nxt), ctx.call(nxt)
        if op in _VIEWS and _numel(call.args[0]) == _numel(ctx.var(nxt)):
            return True
        if op == "relax.astype":
            return _between(self.half, call.args[0], ctx.var(nxt))
        if op in ("relax.multiply", "relax.divide") and not self.softmax and not self.masks:
            return self._scale(op, call)
        if op == "relax.add" and not self.softmax:
            return self._additive_mask(nxt, call)
        if op == "relax.where" and not self.softmax:
            # masked_fill of the scores with a value so low that adding it gives the same
            # value (GPT-Neo's causal and local windows: ``where(window, s, finfo.min)``)
            mask = _where_as_mask(ctx, call, ctx.var(self.cur), nxt, self.pre)
            self.masks += [mask] if mask is not None else []
            return mask is not None
        if op == "relax.nn.softmax" and not self.softmax:
            rank = len(shape_of(ctx.var(nxt)))
            self.softmax = int(call.attrs.axis) in (-1, rank - 1)
            return self.softmax
        if op == "relax.where" and not self.zero_masked and len(self.masks) == 1:
            return self._safe_softmax(nxt, call)
        if op == "relax.matmul" and self.softmax:
            probs = ctx.var(self.cur)
            if _strip_views(ctx, call.args[0]).same_as(probs) or call.args[0].same_as(probs):
                self.m2 = nxt
                return True
        return False

    def _scale(self, op: str, call: relax.Call) -> bool:
        c = self.ctx.is_scalar_const(self._other(call))
        if c is None or (op == "relax.divide" and not call.args[0].same_as(self.ctx.var(self.cur))):
            return False
        self.scale = self.scale * c if op == "relax.multiply" else self.scale / c
        return True

    def _additive_mask(self, nxt: int, call: relax.Call) -> bool:
        other = self._other(call)
        if not self.ctx.defined_before(other, nxt):
            return False
        if len(shape_of(other)) == 3:  # a bias of heads folded into the batch (ALiBi)
            scores = shape_of(self.ctx.var(self.cur))
            other = _bias_of_heads(other, scores, shape_of(self.q[1]), self.pre)
        if other is None or len(shape_of(other)) != 4:
            return False
        self.masks.append(other)  # T5: a position bias, then the padding mask
        return True

    def _safe_softmax(self, nxt: int, call: relax.Call) -> bool:
        """SDPA's safe softmax (CanonicalizeSDPA): rows whose mask is all -inf give 0."""
        ctx = self.ctx
        cond, zero, probs = call.args
        if not probs.same_as(ctx.var(self.cur)) or ctx.is_scalar_const(zero) != 0.0:
            return False
        if not _rows_of_neg_inf(ctx, cond, self.masks[0]) or not ctx.defined_before(cond, nxt):
            return False
        self.zero_masked = True
        return True


def _between(half: str | None, source: relax.Expr, result: relax.Expr) -> bool:
    """A cast between a half dtype and float32, either way (a half attention's)."""
    pair = {dtype_of(source), dtype_of(result)}
    return half is not None and pair == {half, "float32"}


def _output_views(
    ctx: Ctx, cur: int, absorbed: list[int], half: str | None
) -> tuple[int, str]:
    """Views and the head permute after the output's matmul that the call writes directly
    (and, for a half attention, the rounding of its float32 product): (the last one
    absorbed, ``out_layout``); appends them to ``absorbed``."""
    out_layout = "bhsd"
    while (nxt := ctx.follow(cur)) is not None and out_layout == "bhsd":
        op, call = ctx.op(nxt), ctx.call(nxt)
        if op == "relax.astype" and _between(half, call.args[0], ctx.var(nxt)):
            pass
        elif op in _VIEWS and _numel(call.args[0]) == _numel(ctx.var(nxt)):
            if len(shape_of(ctx.var(nxt))) not in (3, 4):
                break
        elif (
            op == "relax.permute_dims"
            and permute_axes(call) == [0, 2, 1, 3]
            and len(shape_of(ctx.var(cur))) == 4
        ):
            out_layout = "bshd"
        else:
            break
        absorbed.append(nxt)
        cur = nxt
    return cur, out_layout


def _kv_source(ctx: Ctx, t: relax.Expr) -> relax.Expr:
    """The ``[B, Hkv, S, D]`` tensor whose heads ``t`` repeats for the heads of q: through
    ``repeat_kv`` (grouped-query) or a broadcast of one head (multi-query), else ``t``."""
    source = _repeat_kv_source(ctx, t)
    if not source.same_as(t):
        return source
    found = ctx.block_call(t)
    if found is not None and ctx.op(found[0]) == "relax.broadcast_to":
        if _head_broadcast(found[1].args[0], t) is not None:
            return found[1].args[0]
    return t


def _tensors(
    ctx: Ctx, q: tuple, k: tuple, v: tuple, heads: object | None, pre: list
) -> tuple[str, list, bool] | None:
    """(layout, [q, k, v] or [q, k cache, v cache, k new, v new], whether from the cache):
    k and v with their own heads where ``repeat_kv`` or a broadcast repeats them for q (the
    kernel maps each query head to its kv head), the cache where they are a decode step's
    cache with the new token in its slot. ``heads``: k is one head that the scores broadcast
    to that many (multi-query)."""
    k_src = k[1] if heads is not None else _kv_source(ctx, k[1])
    v_src = _kv_source(ctx, v[1])
    kv_heads = [(_dims(t) or [None, None])[1] for t in (k_src, v_src)]
    if any(h is None for h in kv_heads) or not tvm.sym.Analyzer().can_prove_equal(*kv_heads):
        if heads is None:  # only one of them repeated: both as the product reads them
            k_src, v_src = k[1], v[1]
        else:  # k broadcast in the scores, v not from one head: k broadcast once as v's
            b, _, s, d = _dims(k[1])
            pre.append(pre_binding("plus_k", relax.op.broadcast_to(k[1], [b, heads, s, d])))
            return "bhsd", [q[1], pre[-1][0], v[1]], False
    k_app, v_app = _cache_append(ctx, k_src), _cache_append(ctx, v_src)
    if k_app is not None and v_app is not None and _same_slot(k_app[2], v_app[2]):
        layout, qt = ("bshd", q[0]) if q[0] is not None else ("bhsd", q[1])
        slot = [] if k_app[2] is None else [k_app[2]]
        return layout, [qt, k_app[0], v_app[0], k_app[1], v_app[1], *slot], True
    if not k_src.same_as(k[1]) or not v_src.same_as(v[1]):
        k, v = _head_input(ctx, k_src), _head_input(ctx, v_src)
        if k is None or v is None:
            return None
    if all(t[0] is not None for t in (q, k, v)):
        return "bshd", [q[0], k[0], v[0]], False
    return "bhsd", [q[1], k[1], v[1]], False


def _same_slot(a: relax.Var | None, b: relax.Var | None) -> bool:
    """Keys and values are written at the same slot (both the last position, or one tensor)."""
    return (a is None and b is None) or (a is not None and b is not None and a.same_as(b))


def bind_attention(ctx: Ctx, members: tuple[int, ...]) -> LibraryCall | None:
    m1 = next((i for i in members if ctx.op(i) == "relax.matmul"), None)
    operands = _operands(ctx, m1) if m1 is not None else None
    if operands is None:
        return None
    q, k, heads = operands
    pre: list[tuple[relax.Var, relax.Expr]] = []
    scores = _Scores(ctx, m1, q, pre)
    scores.half = scores.half or _upcast_half(ctx, m1)
    if not scores.walk():
        return None
    v = _head_input(ctx, ctx.call(scores.m2).args[1])
    if v is None:
        return None
    absorbed = scores.absorbed
    cur, out_layout = _output_views(ctx, scores.cur, absorbed, scores.half)
    if len(shape_of(ctx.var(cur))) != 4:
        return None
    found = _tensors(ctx, q, k, v, heads, pre)
    if found is None:
        return None
    layout, tensors, cache = found
    if any(
        not ctx.defined_before(t, cur) or t.same_as(ctx.var(cur))
        for t in tensors
        if all(not t.same_as(var) for var, _ in pre)
    ):
        return None
    dtype = dtype_of(tensors[0])
    masks = [_in_dtype(ctx, m, dtype, pre) for m in scores.masks]
    if any(m is None for m in masks):
        return None  # (a float32 mask of a half attention that the half dtype would round)
    mask = masks[0] if masks else None
    for extra in masks[1:]:  # several additive masks are summed once, in TIR, before the call
        binding = pre_binding("plus_mask", relax.op.add(mask, extra))
        pre.append(binding)
        mask = binding[0]
    cfg = {
        "layout": layout,
        "out_layout": out_layout,
        "scale": float(scores.scale),
        "causal": False,
        "mask": mask is not None,
    }
    if scores.zero_masked:
        cfg["zero_masked"] = True
    if cache:
        cfg["cache"] = True
        if len(tensors) == 6:  # (the bucketed decode's slot tensor, after k_new and v_new)
            cfg["slot"] = True
    args = [*tensors] + ([mask] if mask is not None else [])
    return LibraryCall(ATTENTION_SPEC, args, cfg, cur, absorbed, pre)


# the warehouse implementation names this module binds
BINDS = {"torch.sdpa": bind_attention, "torch.sdpa_flash": bind_attention}
