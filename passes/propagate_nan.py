"""PropagateNaN: float ``max`` / ``min`` in TIR return NaN when an operand is NaN, as torch does.

TVM's code generators lower ``max(a, b)`` to ``a > b ? a : b``, which drops a NaN in ``a``: a
ReLU (``max(x, 0)``), a clip, ``maximum`` / ``minimum``, a max pool or a max reduction turns a
NaN input into a finite number, so a model fed a NaN returns finite outputs where torch eager
returns NaN. This pass rewrites every float ``max(a, b)`` in every block into
``isnan(a) ? a : (isnan(b) ? b : max(a, b))``, or against a number ``c`` (ReLU, clip)
``a < c ? c : a`` (``min`` alike), one compare that is false for a NaN ``a``. It runs after
scheduling, so schedule rules still see ``max`` as a reduction operator; the cost is at most
two integer tests of the operands' bits per element (``_isnan``: vectorized as the max is).

On GPU targets, blocks with reduction iterators keep their ``max`` / ``min``: TVM's
cross-thread reduction lowering must recognise the combiner.
"""

from __future__ import annotations

import tvm
from plus_tvm.tir_blocks import has_load, if_then_else, nodes, stores_any
from plus_tvm.tir_blocks.rebuild import map_blocks
from tvm import tirx

from ._prim_func_rewrite import rewrite_prim_funcs


@tvm.transform.module_pass(opt_level=0, name="PropagateNaN")
class PropagateNaN:
    """Make float ``max`` / ``min`` of every PrimFunc propagate NaN (module docstring).

    Parameters
    ----------
    keep_reductions : bool
        Leave blocks with reduction iterators alone (for GPU targets).
    """

    def __init__(self, keep_reductions: bool = False) -> None:
        self.keep_reductions = keep_reductions

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return rewrite_prim_funcs(mod, self.rewrite)

    def rewrite(self, func: tirx.PrimFunc) -> tirx.PrimFunc | None:
        """``func`` with NaN-propagating ``max`` / ``min``, or None when it has none."""
        if not _has_float_minmax(func):
            return None
        keep = _is_reduction if self.keep_reductions else None
        body = map_blocks(func.body, _nan_minmax, keep)
        return None if body.same_as(func.body) else func.with_body(body)


def _is_reduction(block: object) -> bool:
    return any(int(iv.iter_type) != 0 for iv in block.iter_vars)


def _nan_minmax(e: tvm.ir.Expr) -> tvm.ir.Expr | None:
    if not isinstance(e, (tirx.Max, tirx.Min)) or "float" not in str(e.ty):
        return None
    dtype = str(e.ty)
    if dtype in _HALF:
        return _half_nan_minmax(e, dtype)
    # an operand that is more than a load or a constant is bound once (``Let``): it is used
    # three times below, and it may hold ``Let`` bindings of its own that must stay unique
    lets = []
    operands = []
    for k, operand in enumerate((e.a, e.b)):
        if _cheap(operand):
            operands.append(operand)
        else:
            var = tirx.Var(f"nan_operand{k}", str(operand.ty))
            lets.append((var, operand))
            operands.append(var)
    a, b = operands
    if _number(a) and not _number(b):
        a, b = b, a
    if _number(b):
        # against a number, one compare: ``a < b ? b : a`` (max) is false for a NaN ``a``, so
        # it returns ``a``; for ``-0.0`` against ``0.0`` it returns ``-0.0``, as torch's relu
        # and clamp do. The isnan form's Let + nested Select, inlined into long GIR chains,
        # sent TVM's LLVM code generation into minutes of simplification (a 10-operation
        # chain: 146 s, now 1.9 s)
        keep = tirx.LT(a, b) if isinstance(e, tirx.Max) else tirx.GT(a, b)
        out = tirx.Select(keep, b, a)
    else:
        out = tirx.Select(_isnan(a), a, tirx.Select(_isnan(b), b, type(e)(a, b)))
    for var, value in reversed(lets):
        out = tirx.Let(var, value, out)
    return out


def _cheap(e: tvm.ir.Expr) -> bool:
    """An operand used three times as it is: a load, constant or variable, a cast of one, or
    a padding's ``if_then_else`` of them on a test of the indices (a padded pool with its
    padding inlined). Bound by a ``Let`` instead, a cast from bfloat16 inside it came out wrong
    from TVM's bfloat16 legalization in a vectorized loop (a bfloat16 pool: 5e4 off)."""
    if isinstance(e, _PLAIN):
        return True
    if isinstance(e, tirx.Cast):
        return _cheap(e.value)
    parts = if_then_else(e)
    if parts is None:
        return False
    test, then, otherwise = parts
    return not has_load(test) and not _has_let(test) and _cheap(then) and _cheap(otherwise)


def _has_let(e: tvm.ir.Expr) -> bool:
    return any(isinstance(n, tirx.Let) for n in nodes(e))


def _half_nan_minmax(e: tvm.ir.Expr, dtype: str) -> tvm.ir.Expr:
    """The NaN-keeping min / max of half-precision operands: compared in float32 (TVM has no
    isnan for half types; exact, both are half values; not ``a != a``, which TVM's simplifier
    folds to false), the chosen one rounded back (exact too), with no ``Let`` (TVM's bfloat16
    legalization retypes expressions but not a Let's variable, and its vectorizer then bound
    one variable twice)."""
    a, b = tirx.Cast("float32", e.a), tirx.Cast("float32", e.b)
    if _number(e.a) and not _number(e.b):
        a, b = b, a
    if _number(e.a) or _number(e.b):
        keep = tirx.LT(a, b) if isinstance(e, tirx.Max) else tirx.GT(a, b)
        return tirx.Cast(dtype, tirx.Select(keep, b, a))
    both = type(e)(a, b)
    return tirx.Cast(dtype, tirx.Select(_isnan(a), a, tirx.Select(_isnan(b), b, both)))


_PLAIN = (tirx.Var, tvm.ir.TensorLoad, tirx.FloatImm, tirx.IntImm, tirx.Broadcast)
_HALF = ("float16", "bfloat16")


def _isnan(x: tvm.ir.Expr) -> tvm.ir.Expr:
    """``x`` is NaN, read from its bits: exponent all ones and a nonzero fraction, that is
    ``|bits| > bits(+inf)`` as an integer. TVM 0.27's vectorizer cannot vectorize
    ``tirx.isnan`` and scalarizes the whole loop around it (a max pool's 8 lanes became 8
    scalar compares and branches: 6x slower); its simplifier folds ``x != x`` to false and
    turns ``!(x <= inf)`` into ``x > inf``, false for a NaN. Integer operations are neither
    folded nor scalarized."""
    bits = _NAN_BITS.get(str(x.ty))
    if bits is None:  # (a float type of another width: TVM's own test)
        return tirx.isnan(x)
    ity = f"int{bits[0]}"
    raw = tirx.reinterpret(ity, x)
    magnitude = tirx.bitwise_and(raw, tirx.IntImm(ity, bits[1]))
    return tirx.GT(magnitude, tirx.IntImm(ity, bits[2]))


# per float type: integer width, the mask of everything but the sign, the bits of +inf
_NAN_BITS = {
    "float32": (32, 0x7FFFFFFF, 0x7F800000),
    "float64": (64, 0x7FFFFFFFFFFFFFFF, 0x7FF0000000000000),
}


def _number(e: object) -> bool:
    """A float constant that is not NaN (it can never be the NaN operand)."""
    return isinstance(e, tirx.FloatImm) and e.value == e.value


def _has_float_minmax(func: tirx.PrimFunc) -> bool:
    return stores_any(func, lambda e: isinstance(e, (tirx.Max, tirx.Min)) and "float" in str(e.ty))
