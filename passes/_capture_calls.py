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

_BUILTINS = (TVM_RUN_OR_CAPTURE, PLUS_RUN_OR_CAPTURE)


@dataclass(frozen=True)
class CaptureCall:
    """One capture call: the builtin it names, the capture function, its argument tuple, the
    region index and the optional shape of captured symbolic sizes."""

    builtin: str
    region: tvm.ir.GlobalVar
    args: relax.Tuple
    index: relax.Expr
    shape: relax.Expr | None


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
    return CaptureCall(name, fields[0], fields[1], fields[2], extra[0] if extra else None)


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
