"""PropagateNaN: float ``max`` / ``min`` in TIR return NaN when an operand is NaN, as torch does.

TVM's code generators lower ``max(a, b)`` to ``a > b ? a : b``, which drops a NaN in ``a``: a
ReLU (``max(x, 0)``), a clip, ``maximum`` / ``minimum``, a max pool or a max reduction turns a
NaN input into a finite number, so a model fed a NaN returns finite outputs where torch eager
returns NaN. This pass rewrites every float ``max(a, b)`` in every block into
``isnan(a) ? a : (isnan(b) ? b : max(a, b))`` (and ``min`` alike). It runs after scheduling, so
schedule rules still see ``max`` as a reduction operator; the cost is two unordered compares
per element of memory-bound kernels.

On GPU targets, blocks with reduction iterators keep their ``max`` / ``min``: TVM's
cross-thread reduction lowering must recognise the combiner.
"""

from __future__ import annotations

import tvm
from plus_tvm.tir_expr import map_stmt
from tvm import s_tir, tirx


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
        functions = {}
        changed = False
        for gvar, func in mod.functions_items():
            if isinstance(func, tirx.PrimFunc):
                new = self.rewrite(func)
                changed |= new is not None
                func = new if new is not None else func
            functions[gvar] = func
        if not changed:
            return mod
        return tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)

    def rewrite(self, func: tirx.PrimFunc) -> tirx.PrimFunc | None:
        """``func`` with NaN-propagating ``max`` / ``min``, or None when it has none."""
        if not _has_float_minmax(func):
            return None
        sch = s_tir.Schedule(func)
        changed = False
        for sref in _block_srefs(sch):
            block = sch.get(sref)
            if self.keep_reductions and any(int(iv.iter_type) != 0 for iv in block.iter_vars):
                continue
            body = map_stmt(block.body, _nan_minmax)
            init = map_stmt(block.init, _nan_minmax) if block.init is not None else None
            if body.same_as(block.body) and (init is None or init.same_as(block.init)):
                continue
            new = s_tir.SBlock(
                block.iter_vars,
                block.reads,
                block.writes,
                block.name_hint,
                body,
                init,
                block.alloc_buffers,
                block.match_buffers,
                block.annotations,
            )
            sch.state.replace(sref, new, {block: new})
            changed = True
        return sch.mod["main"] if changed else None


def _nan_minmax(e: tvm.ir.Expr) -> tvm.ir.Expr | None:
    if not isinstance(e, (tirx.Max, tirx.Min)) or "float" not in str(e.ty):
        return None
    a, b = e.a, e.b
    return tirx.Select(tirx.isnan(a), a, tirx.Select(tirx.isnan(b), b, e))


def _block_srefs(sch: s_tir.Schedule) -> list:
    """Every block of the scheduled function, children before parents."""
    out = []

    def visit(block_rv) -> None:
        for child in sch.get_child_blocks(block_rv):
            visit(child)
        out.append(sch.get_sref(block_rv))

    visit(sch.get_sblock("root"))
    return out


def _has_float_minmax(func: tirx.PrimFunc) -> bool:
    from plus_tvm.mapping.tir_analysis import _blocks, _stores, _walk_expr

    found: list = []

    def look(e: object) -> None:
        if isinstance(e, (tirx.Max, tirx.Min)) and "float" in str(e.ty):
            found.append(e)

    for block in _blocks(func.body):
        for part in (block.body, block.init):
            for store in _stores(part) if part is not None else ():
                _walk_expr(store.value, look)
        if found:
            return True
    return False
