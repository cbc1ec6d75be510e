"""The module-level loop of the TIR rewrite passes: each PrimFunc rewritten or kept."""

from __future__ import annotations

from collections.abc import Callable

import tvm
from tvm import tirx


def rewrite_prim_funcs(
    mod: tvm.IRModule, rewrite: Callable[[tirx.PrimFunc], tirx.PrimFunc | None]
) -> tvm.IRModule:
    """``mod`` with every PrimFunc replaced by ``rewrite(func)`` (``None``: kept); ``mod``
    itself when nothing changed (the input module is never mutated)."""
    functions = {}
    changed = False
    for gvar, func in mod.functions_items():
        if isinstance(func, tirx.PrimFunc):
            new = rewrite(func)
            if new is not None and not new.same_as(func):
                func, changed = new, True
        functions[gvar] = func
    if not changed:
        return mod
    return tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)
