"""StageGraphOutputs: a returned tensor gets a planned buffer and one copy, so that its writer
is captured.

TVM's ``RewriteCUDAGraph`` leaves outside the graph every kernel writing storage that the
function returns (the caller keeps it, so it cannot be a static buffer of the graph). When that
writer is a library kernel (GPT-2's LM head ``plus.linear``, ViT's last ``plus.linear_layernorm``),
it runs as a crossing into Python on every call. This pass (PyGraph section 4.1, "outputs likewise
where it pays") makes the writer fill a buffer that ``StaticPlanBlockMemory`` plans (the returned
tensor is now a copy of it, made by one copy kernel at the end of ``main``, outside the graph):
a launch and the output's bytes instead of a crossing. A returned tensor written by a generated
kernel is staged too unless ``generated`` is off (the copy replaces its launch, and every kernel
of the model is then in the graph); tensors of symbolic shape are left alone.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ._graph_staging import (
    is_kernel_call,
    is_library_call,
    lowered_main,
    staged_copy,
    static_shape,
    tensor_bytes,
    uses,
    with_main,
)


@tvm.transform.module_pass(opt_level=0, name="StageGraphOutputs")
class StageGraphOutputs:
    """Stage the returned tensors written by library kernels (module docstring).

    Parameters
    ----------
    target : tvm.target.Target
        Where the copy kernel runs (scheduled for GPU targets).
    generated : bool
        Also stage a returned tensor written by a generated kernel (the writer is captured
        and a copy launches instead of it: no launch saved, but the region keeps every kernel
        and the output's copy is one device-to-device transfer).

    Attributes
    ----------
    staged : dict
        After a run: returned tensor name -> bytes copied per call.
    """

    def __init__(self, target: tvm.target.Target, generated: bool = True) -> None:
        self.target = target
        self.generated = generated
        self.staged: dict[str, int] = {}

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        self.staged = {}
        func = lowered_main(mod)
        if func is None or not isinstance(func.body.body, relax.Var):
            return mod
        bindings = [b for block in func.body.blocks for b in block.bindings]
        value_of = {b.var: b.value for b in bindings}
        returned = _returned(func.body.body, value_of)
        chosen = [r for r in returned if self._pays(r, bindings, value_of, mod)]
        if not chosen:
            return mod
        tail = []
        mapping = {}
        for tensor in chosen:
            mod, out, bindings = staged_copy(mod, tensor, f"{tensor.name}_out", self.target)
            tail += bindings
            mapping[tensor] = out
            self.staged[tensor.name] = tensor_bytes(tensor.ty)
        result = func.body.body
        if result in mapping:
            result = mapping[result]
        else:  # a tuple of results: a new tuple with the staged ones replaced
            fields = [mapping.get(f, f) for f in value_of[result].fields]
            result = relax.Var(f"{result.name}_staged", result.ty)
            tail.append(relax.VarBinding(result, relax.Tuple(fields)))
        blocks = list(func.body.blocks)
        blocks[-1] = relax.BindingBlock(list(blocks[-1].bindings) + tail)
        body = relax.SeqExpr(blocks, result)
        new = relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs)
        return with_main(mod, new)

    def _pays(self, tensor: relax.Var, bindings: list, value_of: dict, mod: tvm.IRModule) -> bool:
        if static_shape(tensor.ty) is None:
            return False
        root = tensor
        while isinstance(value_of.get(root), relax.Var):  # aliases (gv = alloc21)
            root = value_of[root]
        for b in bindings:  # the first call reading the fresh allocation is its writer
            if root in uses(b.value) and (is_library_call(b.value) or is_kernel_call(b.value, mod)):
                return self.generated or is_library_call(b.value)
        return False


def _returned(result: relax.Var, value_of: dict) -> list[relax.Var]:
    value = value_of.get(result)
    if isinstance(value, relax.Tuple):
        return [f for f in value.fields if isinstance(f, relax.Var)]
    return [result]
