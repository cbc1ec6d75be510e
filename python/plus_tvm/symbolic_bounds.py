"""The declared ranges of a Relax function's symbolic sizes, defined once.

TVM's frontends record a ``torch.export.Dim``'s ``min`` and ``max`` (or an ONNX symbolic
dimension's declared bound) as function attributes mapping the shape variable's name to an
integer; memory planning reads the upper bound. ``DeclareCaptureVars``,
``ProveSlicesInbound``, ``PlusDispatch`` (``typical_sizes``) and the compiled model's input
signature read them through here.
"""

from __future__ import annotations

import math

from tvm import relax

LOWER_BOUND_ATTR = "tir_var_lower_bound"
UPPER_BOUND_ATTR = "tir_var_upper_bound"


def lower_bounds(func: relax.Function) -> dict[str, int]:
    """``{shape variable name: smallest size}`` as ``func`` declares it."""
    return _table(func, LOWER_BOUND_ATTR)


def upper_bounds(func: relax.Function) -> dict[str, int]:
    """``{shape variable name: largest size}`` as ``func`` declares it."""
    return _table(func, UPPER_BOUND_ATTR)


def typical_sizes(func: relax.Function) -> dict[str, int]:
    """A size to price each bounded symbolic dimension at: the geometric middle of its declared
    range (1..512 -> 23), where a cost linear in the size is off by the same factor at either
    end. Dimensions without an upper bound are left out."""
    lower = lower_bounds(func)
    return {
        name: max(1, round(math.sqrt(max(lower.get(name, 1), 1) * high)))
        for name, high in upper_bounds(func).items()
    }


def _table(func: relax.Function, key: str) -> dict[str, int]:
    attrs = func.attrs
    if attrs is None or key not in attrs:
        return {}
    return {str(name): int(value) for name, value in attrs[key].items()}
