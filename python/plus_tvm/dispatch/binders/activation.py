"""Recognise an activation written out as elementwise operators (GPT-2's ``gelu_new``
``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))``, ``x * sigmoid(x)`` ...).

The candidate is the largest set of subgraph operators fed only by the GEMM output and scalar
constants, with a single result. It is evaluated with numpy on probe points and compared with
each activation a library epilogue offers: whatever algebraic form a model writes, the same
function is recognised, and anything else stays TIR.
"""

from __future__ import annotations

import math

import numpy as np
from tvm import relax

from .common import Ctx

_UNARY = {
    "relax.tanh": np.tanh,
    "relax.exp": np.exp,
    "relax.sigmoid": lambda v: 1.0 / (1.0 + np.exp(-v)),
    "relax.sqrt": np.sqrt,
    "relax.rsqrt": lambda v: 1.0 / np.sqrt(v),
    "relax.negative": np.negative,
    "relax.erf": np.vectorize(math.erf),
    "relax.nn.relu": lambda v: np.maximum(v, 0.0),
    # (a half model's activations are float32 ops between casts: torch_half.FLOAT32_OPS)
    "relax.nn.gelu": lambda v: 0.5 * v * (1.0 + np.vectorize(math.erf)(v / math.sqrt(2.0))),
    "relax.nn.gelu_tanh": lambda v: (
        0.5 * v * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v**3)))
    ),
    "relax.nn.silu": lambda v: v / (1.0 + np.exp(-v)),
}
_BINARY = {
    "relax.add": np.add,
    "relax.subtract": np.subtract,
    "relax.multiply": np.multiply,
    "relax.divide": np.divide,
    "relax.power": np.power,
}
_REFERENCE = {
    "gelu": lambda v: 0.5 * v * (1.0 + np.vectorize(math.erf)(v / math.sqrt(2.0))),
    "gelu_tanh": lambda v: (
        0.5 * v * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v**3)))
    ),
    "silu": lambda v: v / (1.0 + np.exp(-v)),
    "relu": lambda v: np.maximum(v, 0.0),
    "sigmoid": lambda v: 1.0 / (1.0 + np.exp(-v)),
    "tanh": np.tanh,
}
_PROBE = np.linspace(-6.0, 6.0, 97)


_FLOATS = ("float16", "bfloat16", "float32", "float64")
# the rounding of a half model's constants (0.044715, sqrt(2/pi) of gelu_new): a unit in the
# last place of the dtype, the tolerance its written-out activation is compared with (bfloat16
# gelu_new is 3.4e-4 from the exact form at most on the probe points)
_CONSTANT_ULP = {"bfloat16": 2.0**-8, "float16": 2.0**-11}


def _float_cast(source: relax.Expr, result: relax.Expr) -> bool:
    """A cast between float dtypes: the same function of the GEMM's output, up to rounding."""
    return str(source.ty.dtype) in _FLOATS and str(result.ty.dtype) in _FLOATS


def _trailing_cast(ctx: Ctx, inside: list[int], dtype: str) -> bool:
    """The last operator taken is a cast away from ``dtype`` that nothing taken reads."""
    last = inside[-1]
    return (
        ctx.op(last) == "relax.astype"
        and str(ctx.var(last).ty.dtype) != dtype
        and not any(c in inside for c in ctx.g.nodes[last].consumers)
    )


def recognise_activation(
    ctx: Ctx, start: int, absorbed: list[int], anywhere: bool = False
) -> tuple[str, int, list[int]] | None:
    """(activation, result binding, bindings) when the operators after ``start`` compute one
    of the library's activations of ``start``'s value, else None. ``anywhere``: operators
    outside the match may take part (after a folded BatchNorm, which +Graphs do not cover)."""
    src = ctx.var(start)
    inside: list[int] = []
    values: dict[int, np.ndarray] = {src.id_: _PROBE}
    tolerance = 1e-5  # relative; the absolute one below is a tenth of it
    half_tolerance = 0.0
    frontier = sorted(c for c in ctx.g.nodes[start].consumers)
    pending = list(frontier)
    while pending:
        i = pending.pop(0)
        if i in inside or i in absorbed or i in ctx.taken:
            continue
        if i not in ctx.members and not anywhere:
            continue
        call = ctx.call(i)
        if call is None:
            continue
        op = ctx.op(i)
        operands = []
        for arg in call.args:
            if isinstance(arg, relax.Var) and arg.id_ in values:
                operands.append(values[arg.id_])
            elif (c := ctx.is_scalar_const(arg)) is not None:
                operands.append(np.float64(c))
                dtype = str(arg.ty.dtype) if isinstance(arg.ty, relax.TensorType) else ""
                half_tolerance = max(half_tolerance, _CONSTANT_ULP.get(dtype, 0.0))
            else:
                operands = None
                break
        if operands is None:
            continue
        with np.errstate(all="ignore"):
            if op in _UNARY and len(operands) == 1:
                result = _UNARY[op](operands[0])
            elif op in _BINARY and len(operands) == 2:
                result = _BINARY[op](*operands)
            elif op == "relax.astype" and _float_cast(call.args[0], ctx.var(i)):
                # (a half model computes pow in float32 between casts: GPT-2's gelu_new)
                result = operands[0]
            else:
                continue
        if np.ndim(result) == 0:
            continue
        inside.append(i)
        values[ctx.var(i).id_] = result
        pending.extend(sorted(ctx.g.nodes[i].consumers))
    # the result has the call's dtype: casts after it (a half model's rounding widened again
    # for the next float32 operator) are the next operator's
    dtype = str(src.ty.dtype)
    while inside and _trailing_cast(ctx, inside, dtype):
        inside.pop()
    if not inside:
        return None
    # a single result: every other operator is used only inside the set
    sinks = [
        i
        for i in inside
        if any(c not in inside for c in ctx.g.nodes[i].consumers) or i in ctx.g.outside_uses
    ]
    if len(sinks) != 1 or any(c not in inside for c in ctx.g.nodes[start].consumers):
        return None
    sink = sinks[0]
    if str(ctx.var(sink).ty.dtype) != dtype:
        return None
    got = values[ctx.var(sink).id_]
    rtol = max(tolerance, half_tolerance)
    atol = half_tolerance or tolerance / 10
    best = None  # the closest of the activations within the tolerance
    for name, ref in _REFERENCE.items():
        with np.errstate(all="ignore"):
            want = ref(_PROBE)
            if np.allclose(got, want, rtol=rtol, atol=atol):
                error = float(np.max(np.abs(got - want)))
                if best is None or error < best[0]:
                    best = (error, name)
    return None if best is None else (best[1], sink, sorted(inside))
