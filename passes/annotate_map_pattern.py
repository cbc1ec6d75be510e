"""AnnotateMapPattern: store each PrimFunc's mapping class (paper 004) as its ``map_pattern``.

The class is computed from the PrimFunc's blocks (:func:`plus_tvm.mapping.analyze_primfunc`), so
kernels that came from Relax operators, user-written ``call_tir`` functions and already fused
kernels are all classified the same way. Runs after ``LegalizeOps``, next to TVM's
``AnnotateTIROpPattern``; the fusion pass reads the attribute.
"""

from __future__ import annotations

import tvm
from tvm import tirx

ATTR = "map_pattern"


@tvm.transform.module_pass(opt_level=0, name="AnnotateMapPattern")
class AnnotateMapPattern:
    """Set the ``map_pattern`` attribute (an int, ``MapPattern`` value) on every PrimFunc.

    Parameters
    ----------
    overwrite : bool
        Recompute the class of PrimFuncs that already carry the attribute (default: keep it, so
        a user can pin the class of a hand-written kernel).
    """

    def __init__(self, overwrite: bool = False) -> None:
        self.overwrite = overwrite

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        from plus_tvm.mapping import analyze_primfunc

        functions = {}
        changed = False
        for gvar, func in mod.functions_items():
            if isinstance(func, tirx.PrimFunc) and (
                self.overwrite or func.attrs is None or ATTR not in func.attrs
            ):
                func = func.with_attr(ATTR, int(analyze_primfunc(func)))
                changed = True
            functions[gvar] = func
        if not changed:
            return mod
        return tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)
