"""SimplifyViews: fold chains of reshapes and drop same-shape broadcasts.

Importers emit ``reshape(reshape(x))`` and ``broadcast_to(x, shape_of_x)`` around every
attention head split; once library calls take the surrounding operators, such chains are left
between kernels. A single reshape lowers to a view (``RewriteDataflowReshape``), but a fused
chain of them becomes a copy kernel, so the chain is folded into one reshape of its source and
an identity broadcast (or a pad of zero widths) into its input.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax


def _same_shape(a: relax.Expr, b: relax.Expr) -> bool:
    sa, sb = getattr(a.ty, "shape", None), getattr(b.ty, "shape", None)
    if sa is None or sb is None or not hasattr(sa, "values") or not hasattr(sb, "values"):
        return False
    return len(sa.values) == len(sb.values) and all(
        tvm_ffi.structural_equal(x, y) for x, y in zip(sa.values, sb.values)
    )


def _zero_pad(value: relax.Expr) -> bool:
    """A ``nn.pad`` that pads nothing (importers emit them for TF-style "same" padding whose
    amount comes out zero): a copy kernel otherwise."""
    if _op(value) != "relax.nn.pad":
        return False
    widths = getattr(value.attrs, "pad_width", None)
    return widths is not None and all(int(w) == 0 for w in widths)


def _op(value: relax.Expr) -> str:
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
        return value.op.name
    return ""


@tvm.transform.module_pass(opt_level=0, name="SimplifyViews")
class SimplifyViews:
    """Fold ``reshape(reshape(x, a), b)`` into ``reshape(x, b)``; ``broadcast_to(x, shape(x))``,
    ``reshape(x, shape(x))`` and ``pad(x, 0...)`` into ``x``."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        functions = {}
        changed = False
        for gvar, func in mod.functions_items():
            if isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr):
                new = _simplify(func)
                changed |= new is not func
                func = new
            functions[gvar] = func
        if not changed:
            return mod
        out = tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)
        return relax.transform.CanonicalizeBindings()(relax.transform.Normalize()(out))


def _simplify(func: relax.Function) -> relax.Function:
    bb = relax.BlockBuilder()
    blocks = []
    changed = False
    for block in func.body.blocks:
        if not isinstance(block, relax.DataflowBlock):
            blocks.append(block)
            continue
        source: dict[int, relax.Expr] = {}  # reshape var -> the tensor it views
        bindings = []
        for binding in block.bindings:
            value = binding.value
            op = _op(value)
            if (op in ("relax.reshape", "relax.broadcast_to") or _zero_pad(value)) and _same_shape(
                value.args[0], binding.var
            ):
                bindings.append(relax.VarBinding(binding.var, value.args[0]))
                changed = True
                continue
            if op == "relax.reshape":
                inner = value.args[0]
                src = source.get(inner.id_) if isinstance(inner, relax.Var) else None
                if src is not None:
                    value = bb.normalize(relax.op.reshape(src, value.args[1]))
                    changed = True
                source[binding.var.id_] = value.args[0]
            bindings.append(relax.VarBinding(binding.var, value))
        blocks.append(relax.DataflowBlock(bindings))
    if not changed:
        return func
    body = relax.SeqExpr(blocks, func.body.body)
    return relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs)
