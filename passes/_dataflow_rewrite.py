"""The skeleton shared by passes that rewrite bindings of Relax dataflow blocks one by one
(``SimplifyViews``, ``FoldPadIntoConv``): walk every Relax function, rebuild only what changed,
return the input module itself when nothing did (never mutated)."""

from __future__ import annotations

from collections.abc import Callable

import tvm
import tvm_ffi
from tvm import relax

# element-wise Relax operators: every tensor operand broadcasts to the result, whose rank is
# the operands' (a view moved past one keeps the values; Conv1dAsConv2d, SinkRowReshapes)
ELEMENTWISE_OPS = frozenset(
    (
        "relax.add",
        "relax.subtract",
        "relax.multiply",
        "relax.divide",
        "relax.power",
        "relax.maximum",
        "relax.minimum",
        "relax.nn.relu",
        "relax.nn.gelu",
        "relax.nn.gelu_tanh",
        "relax.nn.silu",
        "relax.nn.leakyrelu",
        "relax.sigmoid",
        "relax.tanh",
        "relax.exp",
        "relax.sqrt",
        "relax.rsqrt",
        "relax.astype",
        "relax.clip",
    )
)

# (binding, block-local state, block builder for typing new calls) -> new value or None
BindingRewrite = Callable[[relax.VarBinding, dict, relax.BlockBuilder], "relax.Expr | None"]


def op_name(value: relax.Expr) -> str:
    """The operator name of a call to a Relax op, else ``""``."""
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
        return value.op.name
    return ""


def rewrite_bindings(
    mod: tvm.IRModule,
    rewrite: BindingRewrite,
    finish: Callable[[tvm.IRModule], tvm.IRModule],
) -> tvm.IRModule:
    """Apply ``rewrite`` to every dataflow binding of every Relax function of ``mod``.

    ``rewrite`` returns the binding's new value, or ``None`` to keep it; it gets a state dict
    that lives for one dataflow block (what earlier bindings of the block were) and a
    ``BlockBuilder`` to type new calls. When something changed, the new module goes through
    ``finish`` (normalization, clean-up passes); otherwise ``mod`` is returned as it is.
    """
    return map_functions(mod, lambda func: _rewrite_function(func, rewrite), finish)


def normalize_and_clean(mod: tvm.IRModule) -> tvm.IRModule:
    """The usual ``finish``: normalize the rebuilt functions, drop bindings nothing reads."""
    return relax.transform.DeadCodeElimination()(relax.transform.Normalize()(mod))


def map_functions(
    mod: tvm.IRModule,
    fn: Callable[[relax.Function], relax.Function],
    finish: Callable[[tvm.IRModule], tvm.IRModule] | None = None,
) -> tvm.IRModule:
    """``fn`` on every Relax function of ``mod`` with a body (it returns the function itself
    when nothing changes); ``mod`` itself when nothing did, else the new module through
    ``finish``. ``mod`` is never mutated."""
    functions = {}
    changed = False
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr):
            new = fn(func)
            changed |= new is not func
            func = new
        functions[gvar] = func
    if not changed:
        return mod
    out = tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)
    return finish(out) if finish is not None else out


def _rewrite_function(func: relax.Function, rewrite: BindingRewrite) -> relax.Function:
    bb = relax.BlockBuilder()  # types new calls; the module is never normalized in place
    blocks = []
    changed = False
    for block in func.body.blocks:
        if not isinstance(block, relax.DataflowBlock):
            blocks.append(block)
            continue
        state: dict = {}
        bindings = []
        for binding in block.bindings:
            new = rewrite(binding, state, bb)
            if new is not None:
                changed = True
                binding = relax.VarBinding(binding.var, new)
            bindings.append(binding)
        blocks.append(relax.DataflowBlock(bindings))
    if not changed:
        return func
    body = relax.SeqExpr(blocks, func.body.body)
    return relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs)


def map_bindings(
    mod: tvm.IRModule, rewrite: Callable[[relax.Expr], relax.Expr | None]
) -> tvm.IRModule:
    """``rewrite`` (a binding's value -> its new value, or None to keep it) on every variable
    binding of every block, dataflow or not, of every Relax function. The new calls are typed
    by a ``BlockBuilder`` (no nested pass runs on a module the caller still holds); ``mod``
    itself when nothing changed, never mutated."""

    def per_function(func: relax.Function) -> relax.Function:
        blocks, changed = [], False
        for block in func.body.blocks:
            rebuilt = []
            for b in block.bindings:
                new = rewrite(b.value) if isinstance(b, relax.VarBinding) else None
                changed |= new is not None
                rebuilt.append(relax.VarBinding(b.var, new) if new is not None else b)
            dataflow = isinstance(block, relax.DataflowBlock)
            blocks.append(relax.DataflowBlock(rebuilt) if dataflow else relax.BindingBlock(rebuilt))
        if not changed:
            return func
        body = relax.SeqExpr(blocks, func.body.body)
        return relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs, func.span)

    return map_functions(mod, per_function, typed_functions)


def typed_functions(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with its Relax functions typed by a ``BlockBuilder`` (struct info of rebuilt
    bodies), as a new module: no nested pass runs on a module the caller still holds."""
    bb = relax.BlockBuilder(mod)
    functions = {
        g: bb.normalize(f) if isinstance(f, relax.Function) else f for g, f in mod.functions_items()
    }
    return tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)


def use_counts(block: relax.DataflowBlock, result: relax.Expr) -> dict:
    """How often each variable is read by the block's bindings and ``result``."""
    counts: dict = {}

    def visit(expr: relax.Expr) -> None:
        if isinstance(expr, relax.Var):
            counts[expr] = counts.get(expr, 0) + 1
        elif isinstance(expr, relax.Call):
            for a in expr.args:
                visit(a)
        elif isinstance(expr, relax.Tuple):
            for f in expr.fields:
                visit(f)
        elif isinstance(expr, relax.TupleGetItem):
            visit(expr.tuple_value)

    for b in block.bindings:
        visit(b.value)
    visit(result)
    return counts


# (binding, block builder inside the block's scope) -> the binding's new value (calls may nest:
# the builder binds each nested call of its own), or None to keep the binding
NestedRewrite = Callable[[relax.VarBinding, relax.BlockBuilder], "relax.Expr | None"]


def rewrite_blocks_nested(
    func: relax.Function, start_block: Callable[[relax.DataflowBlock], NestedRewrite]
) -> relax.Function:
    """Rebuild every dataflow block of ``func`` through a ``BlockBuilder`` scope, asking the
    rewrite that ``start_block(block)`` returns (per-block state lives in it) for each
    binding's new value; nested calls of a new value become bindings of their own (ANF), and
    ``bb.emit`` inside the rewrite binds a value another rewrite reads. ``func`` itself when
    nothing changed."""
    blocks, changed = [], False
    for block in func.body.blocks:
        if not isinstance(block, relax.DataflowBlock):
            blocks.append(block)
            continue
        rewrite = start_block(block)
        bb = relax.BlockBuilder()
        bb._begin_dataflow_block()
        for b in block.bindings:
            new = rewrite(b, bb)
            if new is not None:
                b = relax.VarBinding(b.var, bb.normalize(new))
                changed = True
            bb.emit_normalized(b)
        blocks.append(bb._end_block())
    if not changed:
        return func
    body = relax.SeqExpr(blocks, func.body.body)
    return relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs, func.span)


def rewrite_nested(
    mod: tvm.IRModule,
    start_block: Callable[[relax.DataflowBlock, relax.Function], NestedRewrite],
) -> tvm.IRModule:
    """:func:`rewrite_blocks_nested` on every Relax function of ``mod`` (``start_block`` also
    gets the function: use counts need its result), then :func:`typed_and_clean`; ``mod``
    itself when nothing changed, never mutated."""

    def per_function(func: relax.Function) -> relax.Function:
        return rewrite_blocks_nested(func, lambda block: start_block(block, func))

    return map_functions(mod, per_function, typed_and_clean)


def typed_and_clean(mod: tvm.IRModule) -> tvm.IRModule:
    """``finish`` of the nested rewrites: typed functions, bindings nothing reads dropped."""
    return relax.transform.DeadCodeElimination()(typed_functions(mod))


def tensor_dims(expr: relax.Expr) -> list | None:
    """The dimensions (PrimExprs) of a tensor expression with a known shape, else None."""
    ty = getattr(expr, "ty", None)
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    values = getattr(ty.shape, "values", None)
    return list(values) if values is not None else None


def same_dims(xs: list, ys: list) -> bool:
    """Two lists of dimensions, structurally equal one by one."""
    return len(xs) == len(ys) and all(tvm_ffi.structural_equal(x, y) for x, y in zip(xs, ys))
