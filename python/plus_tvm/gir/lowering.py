"""Helpers shared by the GIR lowering rules: instruction mapping and schedule utilities.

Instruction mapping (section 7 of paper 002: porting needs "instruction-to-instruction mappings
for computation"): LLVM turns ``exp`` on float vectors into one ``expf`` call per lane, which
makes every softmax compute-bound on CPU (``erf`` likewise). :func:`vectorizable_math` rewrites
float32 ``exp``, ``sigmoid`` and ``tanh`` into a Cody-Waite range reduction, a degree-6
polynomial and an exponent-field ``2^n`` (TOPI's ``fast_exp`` formula; relative error about
1e-7) and ``erf`` into Eigen's rational approximation (TOPI's ``fast_erf``), which LLVM
vectorizes like any arithmetic.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx

from ..tir_blocks import expr_vars, stores, walk_expr

_BINARY = (
    tirx.Add,
    tirx.Sub,
    tirx.Mul,
    tirx.Div,
    tirx.Max,
    tirx.Min,
    tirx.FloorDiv,
    tirx.FloorMod,
    tirx.EQ,
    tirx.NE,
    tirx.LT,
    tirx.LE,
    tirx.GT,
    tirx.GE,
    tirx.And,
    tirx.Or,
)


def _f32(v: float) -> tirx.FloatImm:
    return tirx.FloatImm("float32", v)


def _clamp(
    x: tvm.ir.Expr,
    low: float,
    high: float,
    var: tirx.Var,
    body: tvm.ir.Expr,
    overflow: float | None = None,
) -> tvm.ir.Expr:
    """``Let var = clamp(x, low, high) in body``, where a NaN ``x`` stays NaN: two ordered
    compares that are both false for NaN, rather than ``max`` / ``min`` (TVM's drop a NaN, and
    ``PropagateNaN``'s rewrite of them, nested in every inlined ``exp``, grows a fused chain's
    expression until TVM's simplifier takes minutes on it). Above ``overflow`` the result is
    ``+inf``, as the exact function's is in float32."""
    given = tirx.Var(f"{var.name}_in", "float32")
    lo, hi = _f32(low), _f32(high)
    clamped = tirx.Select(given < lo, lo, tirx.Select(given > hi, hi, given))
    value: tvm.ir.Expr = tirx.Let(var, clamped, body)
    if overflow is not None:
        value = tirx.Select(given > _f32(overflow), _f32(float("inf")), value)
    return tirx.Let(given, x, value)


def fast_exp(x: tvm.ir.Expr) -> tvm.ir.Expr:
    """``exp(x)`` for float32 from vectorizable arithmetic (``Let``-bound, no duplication;
    NaN in, NaN out)."""
    xv, nv, rv = (tirx.Var(name, "float32") for name in ("exp_x", "exp_n", "exp_r"))
    p = _f32(1.9875691500e-4)
    for c in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        p = p * rv + _f32(c)
    y = p * rv * rv + rv + _f32(1.0)
    bits = tirx.Cast("int32", nv) + tirx.IntImm("int32", 127)
    two_n = tirx.reinterpret("float32", tirx.LShift(bits, tirx.IntImm("int32", 23)))
    body = tirx.Let(rv, xv - nv * _f32(0.693359375) - nv * _f32(-2.12194440e-4), y * two_n)
    body = tirx.Let(nv, tirx.floor(xv * _f32(1.44269504088896341) + _f32(0.5)), body)
    # the clamp keeps 2^n a normal number; past log(FLT_MAX) the exact exp is +inf
    return _clamp(x, -88.3762626647949, 88.3762626647950, xv, body, overflow=88.72283935546875)


def fast_erf(x: tvm.ir.Expr) -> tvm.ir.Expr:
    """``erf(x)`` for float32: the rational approximation of Eigen / TOPI's ``fast_erf``."""
    xv, x2 = tirx.Var("erf_x", "float32"), tirx.Var("erf_x2", "float32")
    p = _f32(-2.72614225801306e-10)
    for c in (
        2.77068142495902e-08,
        -2.10102402082508e-06,
        -5.69250639462346e-05,
        -7.34990630326855e-04,
        -2.95459980854025e-03,
        -1.60960333262415e-02,
    ):
        p = x2 * p + _f32(c)
    q = _f32(-1.45660718464996e-05)
    for c in (
        -2.13374055278905e-04,
        -1.68282697438203e-03,
        -7.37332916720468e-03,
        -1.42647390514189e-02,
    ):
        q = x2 * q + _f32(c)
    body = tirx.Let(x2, xv * xv, xv * p / q)
    return _clamp(x, -4.0, 4.0, xv, body)


def fast_tanh(x: tvm.ir.Expr) -> tvm.ir.Expr:
    """``tanh(x) = 1 - 2 / (exp(2x) + 1)`` with :func:`fast_exp` (saturates correctly)."""
    return _f32(1.0) - _f32(2.0) / (fast_exp(x * _f32(2.0)) + _f32(1.0))


_FAST = {
    "tirx.exp": fast_exp,
    "tirx.erf": fast_erf,
    "tirx.tanh": fast_tanh,
    "tirx.sigmoid": lambda x: _f32(1.0) / (_f32(1.0) + fast_exp(tirx.Sub(_f32(0.0), x))),
}


def _invariant_divisor(e: tvm.ir.Expr, inner: list) -> bool:
    """A float division whose divisor is a load that does not depend on the ``inner``
    (vectorized) iterators: a row scalar broadcast over the row."""
    if not isinstance(e, tirx.Div) or not str(e.ty).startswith("float"):
        return False
    b = e.b
    if not isinstance(b, tvm.ir.TensorLoad):
        return False
    used = set()
    for idx in b.indices:
        used |= {id(v) for v in expr_vars(idx)}
    return not any(id(v) in used for v in inner)


FAST_NESTING = 1
"""How many replaced functions may nest in one expression (``exp(exp(x))`` is two): TVM's
simplifier inlines every pure ``Let`` into its body, so each level multiplies the expression
it walks by about 25 (the polynomial reads its argument that often), and LLVM code generation
of three levels took 17 s on a 64x32 kernel. Deeper calls keep the library function; GIR
stages such chains through a buffer so this rarely applies (``schedules/gir_llvm.py``)."""


def nesting_depth(e: tvm.ir.Expr) -> int:
    """The most replaced functions nested along one path of ``e`` (each is a ``Let`` chain
    whose first value is its argument): at most :data:`FAST_NESTING` after the rewrite."""
    if isinstance(e, tirx.Let):
        return max(nesting_depth(e.value) + 1, nesting_depth(e.body))
    kids: list[tvm.ir.Expr] = []
    if isinstance(e, _BINARY):
        kids = [e.a, e.b]
    elif isinstance(e, tirx.Cast | tirx.Not):
        kids = [e.value if isinstance(e, tirx.Cast) else e.a]
    elif isinstance(e, tirx.Select):
        kids = [e.condition, e.true_value, e.false_value]
    elif isinstance(e, tvm.ir.Call):
        kids = list(e.args)
    return max((nesting_depth(k) for k in kids), default=0)


class _MathRewriter:
    """Rebuilds one block's value with float32 ``exp``/``sigmoid``/``tanh``/``erf`` replaced
    (at most :data:`FAST_NESTING` deep, innermost first) and divisions by row scalars turned
    into multiplications; ``inner`` are the block's iterators that get vectorized."""

    def __init__(self, inner: list) -> None:
        self.inner = inner

    def _math(self, e: tvm.ir.Expr) -> tvm.ir.Expr | None:
        """Replacement of one call, or None."""
        if not isinstance(e, tvm.ir.Call) or not isinstance(e.op, tvm.ir.Op):
            return None
        if str(e.ty) != "float32":
            return None
        fn = _FAST.get(e.op.name)
        if fn is None:
            return None
        arg = self.rebuild(e.args[0])
        if nesting_depth(arg) >= FAST_NESTING or _touches_bf16(arg):
            return e if arg.same_as(e.args[0]) else tvm.ir.Call(e.op, [arg], ret_ty=e.ty)
        return fn(arg)

    def _reciprocal(self, e: tvm.ir.Expr) -> tvm.ir.Expr | None:
        """``a / s`` with ``s`` invariant in the vector loop becomes ``a * (1 / s)``: one
        division per row instead of one per element (the slowest vector instruction)."""
        if not _invariant_divisor(e, self.inner):
            return None
        one = tirx.FloatImm(str(e.ty), 1.0)
        return tirx.Mul(self.rebuild(e.a), tirx.Div(one, e.b))

    def rebuild(self, e: tvm.ir.Expr) -> tvm.ir.Expr:
        """``e`` with the replacements made (other nodes rebuilt as they are)."""
        new = self._math(e)
        if new is None and self.inner:
            new = self._reciprocal(e)
        if new is not None:
            return new
        if isinstance(e, _BINARY):
            a, b = self.rebuild(e.a), self.rebuild(e.b)
            return e if a.same_as(e.a) and b.same_as(e.b) else type(e)(a, b)
        if isinstance(e, tirx.Cast):
            v = self.rebuild(e.value)
            return e if v.same_as(e.value) else tirx.Cast(str(e.ty), v)
        if isinstance(e, tirx.Select):
            c, t = self.rebuild(e.condition), self.rebuild(e.true_value)
            return tirx.Select(c, t, self.rebuild(e.false_value))
        if isinstance(e, tirx.Let):
            return tirx.Let(e.var, self.rebuild(e.value), self.rebuild(e.body))
        if isinstance(e, tirx.Not):
            return tirx.Not(self.rebuild(e.a))
        if isinstance(e, tvm.ir.Call) and isinstance(e.op, tvm.ir.Op):
            args = [self.rebuild(a) for a in e.args]
            if all(a.same_as(b) for a, b in zip(args, e.args)):
                return e
            return tvm.ir.Call(e.op, args, ret_ty=e.ty)
        return e

    def has_work(self, e: tvm.ir.Expr) -> bool:
        hits: list[object] = []
        walk_expr(
            e,
            lambda n: (
                hits.append(n) if _math_target(n) or _invariant_divisor(n, self.inner) else None
            ),
        )
        return bool(hits)


def _touches_bf16(e: tvm.ir.Expr) -> bool:
    """Whether ``e`` holds a bfloat16 value (a load, a cast, arithmetic). The fast functions
    bind their argument with ``Let``, and TVM 0.27's bfloat16 legalization does not reach into
    a ``Let`` value: a cast there fails code generation ("BF16 needs to be storaged lowered
    first") and a load there reads the raw 16 bits as a number (a bfloat16 SiLU came out
    wrong). Such an argument keeps TVM's own ``exp`` / ``sigmoid`` / ``tanh``; float16 is a
    type LLVM has, and takes the fast functions."""
    hits: list[object] = []
    walk_expr(e, lambda n: hits.append(n) if str(getattr(n, "ty", "")) == "bfloat16" else None)
    return bool(hits)


def _math_target(n: object) -> bool:
    return (
        isinstance(n, tvm.ir.Call)
        and isinstance(n.op, tvm.ir.Op)
        and n.op.name in _FAST
        and str(n.ty) == "float32"
    )


def has_math(block: s_tir.SBlock) -> bool:
    found: list[object] = []
    walk_expr(block.body, lambda n: found.append(n) if _math_target(n) else None)
    return bool(found)


def staged_blocks(sch: s_tir.Schedule, merged: list[str]) -> set[str]:
    """Of the blocks ``merged`` (names, producers first) that a lowering inlines into their
    consumers, those to keep as a buffer instead, so that after inlining no expression nests
    the replaced functions of :func:`vectorizable_math`: a block with such a function in its
    merged expression stays when a consumer applies another one on top of it. The earliest
    such block is kept first, then the rest looked at again (a chain ``exp, *r, gelu`` keeps
    the ``exp`` and the ``erf``, not also the product that gelu reads twice). The kept blocks
    are computed next to their consumers, so every function of the chain stays vector
    arithmetic. Copies alone (an expression read twice) are left inlined: recomputing
    measured cheaper than a buffer (``e*e + e*y`` of ``e = exp(x)``: 0.45 vs 0.90 ms on
    512x1024)."""
    roots = sch.get_child_blocks(sch.get_sblock("root"))
    order = [sch.get(b).name_hint for b in roots]
    rv = dict(zip(order, roots))
    own = {n: has_math(sch.get(rv[n])) for n in order}
    names = set(merged)
    uses: dict[str, list[str]] = {n: [] for n in order}
    producers: dict[str, list[str]] = {n: [] for n in order}
    for n in order:
        for c in sch.get_consumers(rv[n]):
            uses[n].append(sch.get(c).name_hint)
            producers[sch.get(c).name_hint].append(n)
    # a block that reads bfloat16 (a half model's widening cast): inlined under a replaced
    # function it would put a bfloat16 value in the function's Let, which keeps TVM's own
    # scalar function (_touches_bf16); kept as a float32 buffer next to its consumer instead
    # (not in a kernel that transposes: its tiles' vector loops bound the fast functions'
    # Let twice, which TVM's VectorizeLoop refuses; such a kernel keeps TVM's functions)
    tiled = any(_transposes(sch.get(rv[n])) for n in order)
    reads_bf16 = {n: not tiled and _touches_bf16(sch.get(rv[n]).body) for n in order}
    staged: set[str] = set()

    def inlined(n: str) -> bool:
        return n in names and n not in staged

    while True:  # stage the earliest block that must be, then look again
        below: dict[str, bool] = {}
        for n in order:  # a replaced function in the expression merged into n
            below[n] = own[n] or any(below[q] for q in producers[n] if inlined(q))
        above: dict[str, bool] = {}
        for n in reversed(order):  # a function applied over n's expression
            above[n] = any(own[c] or (inlined(c) and above[c]) for c in uses[n])
        must = [n for n in order if inlined(n) and (below[n] or reads_bf16[n]) and above[n]]
        if not must:
            return staged
        staged.add(must[0])


def vectorizable_math(sch: s_tir.Schedule) -> int:
    """Rewrite float32 ``exp``/``sigmoid``/``tanh``/``erf`` and divisions by row scalars in
    every block of ``sch``; returns how many blocks changed. Works through
    ``ScheduleState.replace`` so block handles stay valid."""
    changed = 0
    for brv in sch.get_child_blocks(sch.get_sblock("root")):
        block = sch.get(brv)
        written = list(stores(block.body))
        if len(written) != 1 or not isinstance(block.body, tirx.BufferStore):
            continue
        store = written[0]
        spatial = [iv.var for iv in block.iter_vars if int(iv.iter_type) == 0]
        rewriter = _MathRewriter(spatial[-1:] if len(spatial) > 1 else [])
        if not rewriter.has_work(store.value):
            continue
        body = tirx.BufferStore(store.buffer, rewriter.rebuild(store.value), store.indices)
        new = s_tir.SBlock(
            block.iter_vars,
            block.reads,
            block.writes,
            block.name_hint,
            body,
            block.init,
            block.alloc_buffers,
            block.match_buffers,
            block.annotations,
        )
        sch.state.replace(sch.get_sref(brv), new, {block: new})
        changed += 1
    return changed


def _transposes(block: s_tir.SBlock) -> bool:
    """Whether a load of ``block`` walks its buffer in another order than the block's
    iterators. From the loads themselves, not the block's read regions: those keep a
    reshape's index arithmetic as FuseTIR wrote it (``x[(k // d + i * n + j) % (b * n), k % d]``
    names ``k`` first) after ``simplify_indices`` folded the load to ``x[i * n + j, k]``."""
    position = {iv.var: pos for pos, iv in enumerate(block.iter_vars)}
    found: list[object] = []
    walk_expr(block.body, lambda n: found.append(n) if isinstance(n, tvm.ir.TensorLoad) else None)
    for load in found:
        order = [position[v] for i in load.indices for v in expr_vars(i) if v in position]
        if order != sorted(order):
            return True
    return False


def permuted_reads(block: s_tir.SBlock) -> list[int]:
    """Indices of the reads of ``block`` that walk their buffer in another order than the
    block's iterators (transposes): the accesses cache-sized blocking stages."""
    out = []
    for index, region in enumerate(block.reads):
        if len(region.region) < 2:
            continue
        order = []
        for rng in region.region:
            for pos, iv in enumerate(block.iter_vars):
                if any(v.same_as(iv.var) for v in expr_vars(rng.min)):
                    order.append(pos)
        if order != sorted(order):
            out.append(index)
    return out
