"""What the CUDA-graph staging passes share (``StageGraphInputs``, ``StageGraphOutputs``): the
lowered-IR forms they read and write, the copy kernel, and variable substitution in A-normal
form. ``static_shape`` and ``tensor_bytes`` also serve ``FoldStaticSubgraphs`` and the
capture report.

They run at the start of phase 6, on ``main`` after ``CallTIRRewrite`` (one non-dataflow block,
explicit ``R.builtin.alloc_tensor`` outputs; a kernel is a call to a PrimFunc ``GlobalVar``, a
library kernel a ``R.call_packed`` of an ``ExternFunc``, the output last), and before
``StaticPlanBlockMemory``, which then plans the staging buffers like any other.
"""

from __future__ import annotations

import tvm
from tvm import relax, te

STAGE_PREFIX = "plus_stage_copy_"  # the name of every staging copy kernel starts with it


def static_shape(ty: object) -> tuple[int, ...] | None:
    """The static shape of a tensor type, or None (symbolic, unknown, not a tensor)."""
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None  # (no shape, or one held by a shape-valued variable)
    dims = []
    for d in ty.shape.values:
        if not isinstance(d, tvm.tirx.IntImm):
            return None
        dims.append(int(d))
    return tuple(dims)


def tensor_bytes(ty: relax.TensorType) -> int:
    """Bytes of a statically shaped tensor as stored (a bool is one byte)."""
    shape = static_shape(ty) or ()
    count = 1
    for d in shape:
        count *= d
    return count * max(1, tvm.DataType(str(ty.dtype)).bits // 8)


def is_library_call(value: relax.Expr) -> bool:
    """A ``call_packed`` of a library kernel (an ``ExternFunc`` that is not a VM builtin)."""
    return (
        isinstance(value, relax.Call)
        and isinstance(value.op, relax.ExternFunc)
        and not str(value.op.global_symbol).startswith("vm.builtin")
    )


def is_kernel_call(value: relax.Expr, mod: tvm.IRModule) -> bool:
    """A call to a PrimFunc of ``mod`` (a generated kernel, after ``CallTIRRewrite``)."""
    return (
        isinstance(value, relax.Call)
        and isinstance(value.op, tvm.ir.GlobalVar)
        and value.op in mod
        and isinstance(mod[value.op], tvm.tirx.PrimFunc)
    )


def staged_copy(
    mod: tvm.IRModule,
    src: relax.Var,
    name: str,
    target: tvm.target.Target,
    dedicated: bool = False,
) -> tuple[tvm.IRModule, relax.Var, list[relax.VarBinding]]:
    """The bindings that copy ``src`` into a fresh tensor named ``name`` (one copy kernel
    launch), ``mod`` with that kernel, and the new tensor's var. The bindings are typed when the
    function is rebuilt (:func:`with_main`).

    The tensor is an ``R.builtin.alloc_tensor`` that ``StaticPlanBlockMemory`` plans like any
    intermediate, or with ``dedicated`` a storage of its own (``R.memory.alloc_storage``, which
    the planner leaves alone and ``RewriteCUDAGraph`` lifts as static): no kernel after its last
    reader may reuse the bytes, so a capture region reading it gives the same result when it
    runs twice in one call (a measured decision, a capture that failed and runs again)."""
    mod, copy = copy_kernel(mod, src.ty, target)
    dims = static_shape(src.ty)
    shape = relax.ShapeExpr([tvm.tirx.IntImm("int64", d) for d in dims])
    dst = relax.Var(name, src.ty)
    dtype = str(src.ty.dtype)
    bindings = []
    if dedicated:
        storage = relax.Var(f"{name}_storage", relax.ObjectType())
        size = relax.ShapeExpr([tvm.tirx.IntImm("int64", tensor_bytes(src.ty))])
        bindings.append(
            relax.VarBinding(storage, relax.op.memory.alloc_storage(size, 0, "global", "uint8"))
        )
        alloc = relax.op.memory.alloc_tensor(storage, 0, shape, dtype)
    else:
        alloc = relax.op.builtin.alloc_tensor(shape, dtype, 0, "global")
    bindings += [
        relax.VarBinding(dst, alloc),
        relax.VarBinding(relax.Var(f"{name}_copy", relax.AnyType()), relax.Call(copy, [src, dst])),
    ]
    return mod, dst, bindings


def copy_kernel(
    mod: tvm.IRModule, ty: relax.TensorType, target: tvm.target.Target
) -> tuple[tvm.IRModule, tvm.ir.GlobalVar]:
    """``mod`` with a PrimFunc copying a tensor of ``ty`` (scheduled for GPU targets), and its
    GlobalVar; one kernel per shape and dtype."""
    shape = static_shape(ty)
    name = STAGE_PREFIX + "x".join(map(str, shape or (0,))) + "_" + str(ty.dtype)
    for gvar in mod.get_global_vars():
        if gvar.name_hint == name:
            return mod, gvar
    src = te.placeholder(shape, str(ty.dtype), name="src")
    dst = te.compute(shape, lambda *i: src(*i), name="dst")
    func = te.create_prim_func([src, dst]).with_attr("global_symbol", name)
    if target.kind.name in ("cuda", "rocm", "vulkan", "metal", "opencl"):
        from tvm.s_tir import dlight as dl

        with target:
            sch = dl.gpu.Fallback().apply(func, target, False)
        sch = sch[0] if isinstance(sch, list) else sch
        func = sch.mod["main"].with_attr("tir.is_scheduled", True)
    bb = relax.BlockBuilder(
        tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs, global_infos=mod.global_infos)
    )
    gvar = bb.add_func(func, name)  # (a typed GlobalVar)
    return bb.get(), gvar


def substitute(value: relax.Expr, mapping: dict) -> relax.Expr:
    """``value`` (a binding's value in A-normal form) with the vars of ``mapping`` replaced."""
    if isinstance(value, relax.Var):
        return mapping.get(value, value)
    if isinstance(value, relax.Call):
        args = [substitute(a, mapping) for a in value.args]
        if all(a.same_as(b) for a, b in zip(args, value.args)):
            return value
        return relax.Call(value.op, args, value.attrs, value.ty_args)
    if isinstance(value, relax.Tuple):
        fields = [substitute(f, mapping) for f in value.fields]
        if all(a.same_as(b) for a, b in zip(fields, value.fields)):
            return value
        return relax.Tuple(fields)
    if isinstance(value, relax.TupleGetItem):
        tup = substitute(value.tuple_value, mapping)
        return value if tup.same_as(value.tuple_value) else relax.TupleGetItem(tup, value.index)
    return value


def uses(value: relax.Expr) -> list[relax.Var]:
    """The vars a binding's value reads (A-normal form: one level deep)."""
    if isinstance(value, relax.Var):
        return [value]
    if isinstance(value, relax.Call):
        return [a for a in value.args if isinstance(a, relax.Var)]
    if isinstance(value, relax.Tuple):
        return [f for f in value.fields if isinstance(f, relax.Var)]
    if isinstance(value, relax.TupleGetItem) and isinstance(value.tuple_value, relax.Var):
        return [value.tuple_value]
    return []


def lowered_main(mod: tvm.IRModule) -> relax.Function | None:
    """``main`` when it has the lowered one-block form the staging passes rewrite."""
    if "main" not in [g.name_hint for g in mod.get_global_vars()]:
        return None
    func = mod["main"]
    if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
        return None
    if any(isinstance(b, relax.DataflowBlock) for b in func.body.blocks):
        return None  # not lowered yet
    return func


def with_main(mod: tvm.IRModule, func: relax.Function) -> tvm.IRModule:
    out = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs, global_infos=mod.global_infos)
    out[mod.get_global_var("main")] = relax.BlockBuilder(out).normalize(func)  # types new calls
    return out


def staging_copies(mod: tvm.IRModule, func: relax.Function) -> list[relax.Call]:
    """The staging copy calls of ``func`` (``copy(src, dst)``, src the staged tensor)."""
    return [
        b.value
        for block in func.body.blocks
        for b in block.bindings
        if is_kernel_call(b.value, mod) and b.value.op.name_hint.startswith(STAGE_PREFIX)
    ]
