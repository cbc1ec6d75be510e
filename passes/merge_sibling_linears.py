"""MergeSiblingLinears: library linears that read the same input become one GEMM.

After ``PlusDispatch``, a transformer layer's Q, K and V projections (and a gated MLP's gate
and up projections) are separate ``plus.linear`` calls on one activation. Each is a GEMM with
N = hidden size, where oneDNN alone measured below its speed on one with N = 3 x hidden (2
cores, M = 128, K = 768: 203 GFLOP/s for N = 768, 249 for N = 2304). End to end the merge
measured within noise on that machine (models alternated in one process: BERT-base 0.98-1.01x,
T5-small 1.01x, LLaMA 1.02x), so ``Options.merge_linears`` is off by default. The calls of a group
become one ``plus.linear`` with ``parts=P`` whose output holds the parts side by side; each
former result is a ``strided_slice`` of it (a copy of that part, fused into its consumer by the
later phases). The library joins the weights once (``PrepackCache.get_joined``), so no weight
is concatenated per run.

A group: ``plus.linear`` calls in one dataflow block on one input (the same variable, or
reshapes of one variable to the same shape), with the same weight layout, bias flag,
activation and dtype, no residual,
``prepack=1`` and weights (and biases) that are function parameters, so every argument exists
before the first call of the group, where the merged call is placed.
"""

from __future__ import annotations

import tvm
from plus_tvm.runtime.linear import LINEAR_SPEC
from tvm import relax

from ._dataflow_rewrite import op_name

KERNEL = LINEAR_SPEC.kernel


def _linear_call(value: relax.Expr):
    """(args, config) of a single-output ``call_dps_packed("plus.linear", ...)``, or None."""
    if op_name(value) != "relax.call_dps_packed":
        return None
    func, packed = value.args[0], value.args[1]
    if not isinstance(func, relax.ExternFunc) or str(func.global_symbol) != KERNEL:
        return None
    if not isinstance(packed, relax.Tuple) or not isinstance(value.ty, relax.TensorType):
        return None
    args = list(packed.fields)
    if not args or not isinstance(args[-1], tvm.ir.StringImm):
        return None
    try:
        cfg = LINEAR_SPEC.parse(args[-1].value)
    except ValueError:
        return None
    return args[:-1], cfg


def _static_dims(ty: relax.TensorType) -> list[int] | None:
    shape = getattr(ty, "shape", None)
    if shape is None or not hasattr(shape, "values"):
        return None
    dims = [d.value if isinstance(d, tvm.tirx.IntImm) else None for d in shape.values]
    return None if None in dims else dims


def _source(x: relax.Var, defs: dict) -> relax.Var:
    """What ``x`` views: importers reshape the activation once per linear (``x.view(-1, K)``
    three times for Q, K and V), so siblings read different variables of one tensor."""
    while True:
        value = defs.get(x.id_)
        if op_name(value) != "relax.reshape" or not isinstance(value.args[0], relax.Var):
            return x
        x = value.args[0]


def _group_key(binding: relax.VarBinding, params: set, defs: dict) -> tuple | None:
    found = _linear_call(binding.value)
    if found is None:
        return None
    args, cfg = found
    if cfg.parts != 1 or cfg.residual or not cfg.prepack:
        return None
    x, rest = args[0], args[1:]
    if not isinstance(x, relax.Var) or not all(
        isinstance(a, relax.Var) and a.id_ in params for a in rest
    ):
        return None
    dims = _static_dims(binding.value.ty)
    if dims is None or not dims:
        return None
    x_dims = _static_dims(x.ty)
    if x_dims is None:
        return None
    source = _source(x, defs).id_
    return (source, tuple(x_dims), cfg.w, cfg.bias, cfg.act, str(binding.value.ty.dtype))


def _config_text(cfg, parts: int) -> str:
    return LINEAR_SPEC.format({**cfg._asdict(), "parts": parts})


def _merge_block(block: relax.DataflowBlock, params: set, bb: relax.BlockBuilder):
    groups: dict[tuple, list[int]] = {}
    defs = {b.var.id_: b.value for b in block.bindings if isinstance(b, relax.VarBinding)}
    for i, binding in enumerate(block.bindings):
        if isinstance(binding, relax.VarBinding):
            key = _group_key(binding, params, defs)
            if key is not None:
                groups.setdefault(key, []).append(i)
    merged_at: dict[int, list[int]] = {
        members[0]: members for members in groups.values() if len(members) > 1
    }
    if not merged_at:
        return None
    dropped = {i for members in merged_at.values() for i in members}
    bindings = []
    for i, binding in enumerate(block.bindings):
        members = merged_at.get(i)
        if members is None:
            if i not in dropped:
                bindings.append(binding)
            continue
        bindings += _merged(block, members, bb)
    return relax.DataflowBlock(bindings)


def _merged(block: relax.DataflowBlock, members: list[int], bb: relax.BlockBuilder) -> list:
    calls = [_linear_call(block.bindings[i].value) for i in members]
    cfg = calls[0][1]
    x = calls[0][0][0]
    weights = [args[1] for args, _ in calls]
    biases = [args[2] for args, _ in calls] if cfg.bias else []
    widths = [_static_dims(block.bindings[i].value.ty)[-1] for i in members]
    first_ty = block.bindings[members[0]].value.ty
    dims = _static_dims(first_ty)
    out_ty = relax.TensorType([*dims[:-1], sum(widths)], first_ty.dtype)
    args = [x, *weights, *biases, tvm.ir.StringImm(_config_text(cfg, len(members)))]
    joined_var = relax.DataflowVar("plus_joined", out_ty)
    out = [relax.VarBinding(joined_var, bb.normalize(relax.call_dps_packed(KERNEL, args, out_ty)))]
    axis = len(dims) - 1
    start = 0
    for i, width in zip(members, widths):
        part = relax.op.strided_slice(joined_var, [axis], [start], [start + width])
        out.append(relax.VarBinding(block.bindings[i].var, bb.normalize(part)))
        start += width
    return out


@tvm.transform.module_pass(opt_level=0, name="MergeSiblingLinears")
class MergeSiblingLinears:
    """Merge ``plus.linear`` calls on one input into a ``parts=P`` call (module docstring)."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        functions = {}
        changed = False
        for gvar, func in mod.functions_items():
            if isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr):
                new = _merge_function(func)
                changed |= new is not func
                func = new
            functions[gvar] = func
        if not changed:
            return mod
        new_mod = tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)
        return relax.transform.Normalize()(new_mod)


def _merge_function(func: relax.Function) -> relax.Function:
    params = {p.id_ for p in func.params}
    bb = relax.BlockBuilder()
    blocks, changed = [], False
    for block in func.body.blocks:
        new = _merge_block(block, params, bb) if isinstance(block, relax.DataflowBlock) else None
        changed |= new is not None
        blocks.append(new if new is not None else block)
    if not changed:
        return func
    body = relax.SeqExpr(blocks, func.body.body)
    return relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs)
