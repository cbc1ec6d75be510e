"""StageGraphInputs: copy model inputs into planned buffers so that their readers are captured.

TVM's ``RewriteCUDAGraph`` never captures a kernel that reads a function input (an input's
address changes from call to call, and a graph replays the addresses it recorded), so every
reader of a model input runs outside the graph, and each one in the middle of the model splits
a capture region in two. A library kernel left outside costs a crossing into Python per call
(measured on an H100: ViT's patch convolution, a ``plus.conv2d`` reading ``pixel_values``).

This pass (PyGraph section 4.1, in Relax terms) gives such an input a buffer of its own, a
static storage no other tensor shares (PyGraph's static input placeholder: were the planner
to hand its bytes to a later intermediate, a region run twice in one call, as a measured
decision or a failed capture does, would read that intermediate as its input), fills it
with one copy kernel at the start of ``main`` (that copy is the only reader of the input: it
stays outside the graph) and makes every reader use the buffer. By default every input that
a kernel reads is staged (``min_readers=1``): a copy then launches where the reader would have
(BERT's embedding gather), and every kernel of the model can be captured; ``min_readers=2``
stages only inputs that a library kernel or several kernels read (each would otherwise end a
region). Inputs of symbolic shape are left alone (their buffer would not be static).
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
    substitute,
    tensor_bytes,
    uses,
    with_main,
)

_VIEWS = frozenset(("relax.reshape",))


@tvm.transform.module_pass(opt_level=0, name="StageGraphInputs")
class StageGraphInputs:
    """Stage the model inputs whose readers a CUDA graph should capture (module docstring).

    Parameters
    ----------
    target : tvm.target.Target
        Where the copy kernel runs (scheduled for GPU targets).
    min_readers : int
        Stage an input read by this many kernels or more (a library kernel reading it always
        stages it).
    own_storage : bool
        Give each staged buffer a storage of its own (default). ``False`` lets the planner share
        its bytes with later activations: less memory, but a region that then runs twice in
        one call reads a clobbered input, so ``RouteCUDAGraphRuntime`` marks such regions as
        not safe to run again.

    Attributes
    ----------
    staged : dict
        After a run: input name -> bytes copied per call.
    """

    def __init__(
        self, target: tvm.target.Target, min_readers: int = 1, own_storage: bool = True
    ) -> None:
        self.target = target
        self.min_readers = min_readers
        self.own_storage = own_storage
        self.staged: dict[str, int] = {}

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        self.staged = {}
        func = lowered_main(mod)
        if func is None:
            return mod
        num_input = int(func.attrs["num_input"]) if "num_input" in func.attrs else len(func.params)
        bindings = [b for block in func.body.blocks for b in block.bindings]
        chosen = [p for p in func.params[:num_input] if self._pays(p, bindings, mod)]
        if not chosen:
            return mod
        new_bindings = []
        mapping = {}
        for param in chosen:
            mod, staged, bindings = staged_copy(
                mod, param, f"{param.name}_staged", self.target, dedicated=self.own_storage
            )
            new_bindings += bindings
            mapping[param] = staged
            self.staged[param.name] = tensor_bytes(param.ty)
        blocks = []
        for i, block in enumerate(func.body.blocks):
            rebuilt = [
                relax.VarBinding(b.var, substitute(b.value, mapping)) for b in block.bindings
            ]
            blocks.append(relax.BindingBlock((new_bindings if i == 0 else []) + rebuilt))
        body = relax.SeqExpr(blocks, substitute(func.body.body, mapping))
        new = relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs)
        return with_main(mod, new)

    def _pays(self, param: relax.Var, bindings: list, mod: tvm.IRModule) -> bool:
        if static_shape(param.ty) is None:
            return False
        derived = {param}  # the input and its views
        readers = 0
        for b in bindings:
            read = [v for v in uses(b.value) if v in derived]
            if not read:
                continue
            if is_library_call(b.value):
                return True
            if is_kernel_call(b.value, mod):
                readers += 1
            elif isinstance(b.value, relax.Var) or _is_view(b.value):
                derived.add(b.var)
        return readers >= self.min_readers


def _is_view(value: relax.Expr) -> bool:
    return (
        isinstance(value, relax.Call)
        and isinstance(value.op, tvm.ir.Op)
        and value.op.name in _VIEWS
    )
