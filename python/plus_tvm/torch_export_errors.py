"""What a failed ``torch.export`` of the user's module says to the user.

The common failure on real models is a Python branch on a tensor's value (``if
mask.any().item():``, ``if bool(t):``): torch.export captures one graph for every input and
stops with "Could not guard on data-dependent expression Eq(u0, 1)", a message about sympy
symbols whose useful part, the user's source line, sits near the end of a long graph dump
("Caused by: (transformers/models/longformer/modeling_longformer.py:549 in forward)").
Longformer meets it (``if is_global_attn:``, computed from the global attention mask).
:func:`export_failure_message` names that line and says what to change; any other failure
keeps its first line.
"""

from __future__ import annotations

import re

__all__ = ["export_failure_message"]

_CAUSED_BY = re.compile(r"Caused by: \(([^)]*)\)")
_GUARD = re.compile(r"Could not guard on data-dependent expression ([^\n]*?)(?: \(unhinted|\.|$)")


def export_failure_message(name: str, err: BaseException) -> str:
    """``torch.export failed for NAME: ...``: for a branch on a tensor's value, where it is
    and what to do about it; otherwise the error's first line."""
    text = str(err).strip()
    first = text.splitlines()[0] if text else type(err).__name__
    guard = _GUARD.search(text)
    if guard is None or "data-dependent" not in text:
        return f"torch.export failed for {name}: {first}"
    where = _CAUSED_BY.search(text)
    at = f" at {where.group(1)}" if where else ""
    return (
        f"torch.export failed for {name}: the model branches on the value of a tensor{at} "
        f"(a Python `if` on `.item()` or `bool(tensor)`; torch says: could not guard on "
        f"data-dependent expression {guard.group(1).strip()}). One compiled graph serves every "
        "input, so such a branch cannot be compiled: write it with torch.where / torch.cond, "
        "or take the branch outside the compiled module"
    )
