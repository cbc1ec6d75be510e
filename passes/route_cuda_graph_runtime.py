"""RouteCUDAGraphRuntime: capture regions replay through ``plus.cuda_graph.run_or_capture``.

TVM's ``vm.builtin.cuda_graph.run_or_capture`` has no fallback (a capture that fails raises on
every call) and decides nothing. This pass, last of phase 6's CUDA-graph part, points every
capture call at plus_tvm's runtime function (``plus_tvm.runtime.cuda_graph``), which calls
TVM's builtin, falls back to running the region without a graph when capture fails, and with
``measure`` times the region with and without its graph over its first calls and keeps the
faster (``cuda_graph=auto``). It adds three fields after the region index: the capture
function's name, a key of the module (its structural hash and the options digest: the decision
cache's key) and flags: ``FLAG_MEASURE``, and ``FLAG_NO_RERUN`` for a region that must not run
twice in one call (``rerun_safe``: it reads a tensor whose bytes it may overwrite).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax

from ..runtime.cuda_graph import FLAG_MEASURE, FLAG_NO_RERUN
from ._capture_calls import (
    PLUS_RUN_OR_CAPTURE,
    TVM_RUN_OR_CAPTURE,
    bindings,
    capture_call,
    rerun_safe,
    rewrite_capture_calls,
)


@tvm.transform.module_pass(opt_level=0, name="RouteCUDAGraphRuntime")
class RouteCUDAGraphRuntime:
    """Route capture calls through plus_tvm's runtime (module docstring).

    Parameters
    ----------
    measure : bool
        Decide per region on the GPU by measurement on first call (``cuda_graph=auto``).
    options_digest : str
        Part of the module key: the build's ``Options.digest()``.
    """

    def __init__(self, measure: bool, options_digest: str = "") -> None:
        self.measure = measure
        self.options_digest = options_digest

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        key = f"{tvm_ffi.structural_hash(mod) & 0xFFFFFFFFFFFF:012x}-{self.options_digest}"
        builtin = relax.ExternFunc(PLUS_RUN_OR_CAPTURE)
        unsafe = set()  # regions that must not run twice in one call
        for _, func in mod.functions_items():
            if isinstance(func, relax.Function):
                for b in bindings(func):
                    found = capture_call(b.value)
                    if found is not None and not rerun_safe(mod, func, found):
                        unsafe.add(found.region)

        def route(call: relax.Call, capture) -> relax.Expr | None:
            if capture.builtin != TVM_RUN_OR_CAPTURE:
                return None
            fields = [
                capture.region,
                capture.args,
                capture.index,
                tvm.ir.StringImm(capture.region.name_hint),
                tvm.ir.StringImm(key),
                relax.prim_value(
                    (FLAG_MEASURE if self.measure else 0)
                    | (FLAG_NO_RERUN if capture.region in unsafe else 0)
                ),
            ]
            if capture.shape is not None:
                fields.append(capture.shape)
            return relax.Call(call.op, [builtin, relax.Tuple(fields)], call.attrs, call.ty_args)

        return rewrite_capture_calls(mod, route)
