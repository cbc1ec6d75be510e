"""The form of a capture region after ``RewriteCUDAGraph``, shared by the passes that read or
change it (``SelectCUDAGraphRegions``, ``RouteCUDAGraphRuntime``) and ``stats["cuda_graph"]``.

TVM's rewrite binds, in the calling function::

    R.call_builtin_with_ctx("vm.builtin.cuda_graph.run_or_capture",
                            (capture_func, (args...), index[, shape]))

``RouteCUDAGraphRuntime`` points it at ``plus.cuda_graph.run_or_capture`` with three more
fields after ``index`` (name, module key, measure); both forms are capture calls here.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import relax

from ..runtime.cuda_graph import RUN_OR_CAPTURE as PLUS_RUN_OR_CAPTURE
from ..runtime.cuda_graph import TVM_RUN_OR_CAPTURE
from ..tir_blocks import written_params

_BUILTINS = (TVM_RUN_OR_CAPTURE, PLUS_RUN_OR_CAPTURE)


@dataclass(frozen=True)
class CaptureCall:
    """One capture call: the builtin it names, the capture function, its argument tuple, the
    region index, the optional shape of captured symbolic sizes, and the flags
    ``RouteCUDAGraphRuntime`` wrote (0 for TVM's builtin)."""

    builtin: str
    region: tvm.ir.GlobalVar
    args: relax.Tuple
    index: relax.Expr
    shape: relax.Expr | None
    flags: int = 0


def capture_call(value: relax.Expr) -> CaptureCall | None:
    """The capture call ``value`` is, or None."""
    if not (isinstance(value, relax.Call) and len(value.args) >= 2):
        return None
    builtin, packed = value.args[0], value.args[1]
    if not isinstance(builtin, relax.ExternFunc) or str(builtin.global_symbol) not in _BUILTINS:
        return None
    if not isinstance(packed, relax.Tuple) or len(packed.fields) < 3:
        return None
    fields = list(packed.fields)
    if not isinstance(fields[0], tvm.ir.GlobalVar) or not isinstance(fields[1], relax.Tuple):
        return None
    name = str(builtin.global_symbol)
    extra = fields[3:] if name == TVM_RUN_OR_CAPTURE else fields[6:]
    flags = int(fields[5].value) if name == PLUS_RUN_OR_CAPTURE and len(fields) > 5 else 0
    return CaptureCall(name, fields[0], fields[1], fields[2], extra[0] if extra else None, flags)


def bindings(func: relax.Function) -> list[relax.Binding]:
    """Every binding of ``func``'s body, in order."""
    return [b for block in func.body.blocks for b in block.bindings]


def rewrite_capture_calls(mod: tvm.IRModule, rewrite) -> tvm.IRModule:
    """``rewrite(call, capture)`` (a new value, or None to keep it) on every capture call of every
    Relax function; ``mod`` itself when nothing changed, never mutated."""
    from ._dataflow_rewrite import map_bindings

    def one(value: relax.Expr) -> relax.Expr | None:
        capture = capture_call(value)
        return rewrite(value, capture) if capture is not None else None

    return map_bindings(mod, one)


_ALLOC_TENSOR = "relax.memory.alloc_tensor"
_VIEWS = frozenset(("relax.memory.view", "relax.reshape"))


def rerun_safe(mod: tvm.IRModule, caller: relax.Function, capture: CaptureCall) -> bool:
    """Whether the region of ``capture`` gives the same result when it runs twice in one call
    (the runtime's fallback after a failed capture runs it again after TVM's run).

    It does unless a tensor the region *reads* was placed by ``caller`` (after memory planning)
    in a storage the region also places its own tensors in: the planner may have given those
    bytes to an activation the region writes after its last read, and the second run would read
    the activation. Parameters (weights, model inputs) and storages of their own are safe; a
    tensor counts as read when a call of the region passes it as an input before any call
    writes it (destination-passing: the outputs of a TIR kernel are the buffers it writes, a
    library call's is its last argument)."""
    region = mod[capture.region]
    if not isinstance(region, relax.Function):
        return True
    storage_of = _placement(caller)
    params = list(region.params)
    fields = list(capture.args.fields)
    if len(params) != len(fields):
        return False  # not the form RewriteCUDAGraph writes: assume the worst
    outer = dict(zip(params, fields))
    inner_storages = set()
    read_first = set()  # parameters the region reads before it writes them
    written = set()
    for b in bindings(region):
        value = b.value
        if not isinstance(value, relax.Call):
            continue
        if isinstance(value.op, tvm.ir.Op):
            if value.op.name == _ALLOC_TENSOR:
                inner_storages.add(value.args[0])
            continue  # other operators at this stage: shape and memory bookkeeping
        if isinstance(value.op, relax.ExternFunc) and str(value.op.global_symbol).startswith(
            "vm.builtin."
        ):
            continue  # host-side checks of shapes and types, no data read
        outputs = _outputs(mod, value)
        for i, arg in enumerate(value.args):
            if isinstance(arg, relax.Var) and i not in outputs and arg in outer:
                if arg not in written:
                    read_first.add(arg)
        written.update(value.args[i] for i in outputs)
    shared = {outer[p] for p in inner_storages if p in outer}
    return not any(storage_of.get(outer[p]) in shared for p in read_first)


def _outputs(mod: tvm.IRModule, call: relax.Call) -> set[int]:
    """Argument positions a kernel call writes: the buffers its PrimFunc writes, or a library
    call's last argument (destination-passing style, one output)."""
    if isinstance(call.op, tvm.ir.GlobalVar):
        func = mod[call.op]
        if isinstance(func, tvm.tirx.PrimFunc):
            return written_params(func)
    return {len(call.args) - 1} if call.args else set()


def _placement(func: relax.Function) -> dict[relax.Var, relax.Var]:
    """Tensor var -> the storage var it was placed in (through aliases and views)."""
    out: dict[relax.Var, relax.Var] = {}
    for b in bindings(func):
        value = b.value
        if isinstance(value, relax.Var) and value in out:
            out[b.var] = out[value]
        elif isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
            if value.op.name == _ALLOC_TENSOR and isinstance(value.args[0], relax.Var):
                out[b.var] = value.args[0]
            elif value.op.name in _VIEWS and value.args and value.args[0] in out:
                out[b.var] = out[value.args[0]]
    return out
