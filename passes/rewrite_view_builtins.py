"""RewriteViewBuiltins: view-only host calls that would cut a CUDA-graph region become views the
capture rewrite can see through (PyGraph section 4.1, "incompatible operations hoisted").

TVM's sort/scan dispatch wraps a scan in ``R.call_packed("vm.builtin.reshape", x, shape)`` calls
(to the 2-D form ``gpu_2d_continuous_cumsum`` takes, and back). ``RewriteCUDAGraph`` treats such
a packed call as a host operation and ends the region there, so a model computing position ids
with a cumsum over its input (RoBERTa, XLM-R; GPT-2's mask before folding) splits into several
graphs with the scan and its neighbours launched outside. A reshape of a statically shaped
tensor is a view: this pass binds the tensor itself where the shape does not change, and
otherwise makes it ``R.reshape`` again, which the rewrite captures and VM lowering turns back
into the same builtin. Runs on lowered ``main`` before memory planning.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ._dataflow_rewrite import map_bindings
from ._graph_staging import static_shape

RESHAPE_BUILTIN = "vm.builtin.reshape"


@tvm.transform.module_pass(opt_level=0, name="RewriteViewBuiltins")
class RewriteViewBuiltins:
    """Static ``vm.builtin.reshape`` calls become aliases or ``R.reshape`` (module docstring).

    Attributes
    ----------
    rewritten : int
        After a run: how many calls were rewritten.
    """

    def __init__(self) -> None:
        self.rewritten = 0

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        self.rewritten = 0

        def count(value: relax.Expr) -> relax.Expr | None:
            new = _view(value)
            self.rewritten += new is not None
            return new

        return map_bindings(mod, count)


def _view(value: relax.Expr) -> relax.Expr | None:
    """The alias or ``R.reshape`` replacing a static ``vm.builtin.reshape`` call, else None."""
    if not (
        isinstance(value, relax.Call)
        and isinstance(value.op, relax.ExternFunc)
        and str(value.op.global_symbol) == RESHAPE_BUILTIN
        and len(value.args) == 2
        and isinstance(value.args[0], relax.Var)
        and isinstance(value.args[1], relax.ShapeExpr)
    ):
        return None
    src, shape = value.args
    before = static_shape(src.ty)
    after = [int(d) for d in shape.values if isinstance(d, tvm.tirx.IntImm)]
    if before is None or len(after) != len(shape.values):
        return None
    if tuple(after) == before:
        return src
    return relax.op.reshape(src, shape)
