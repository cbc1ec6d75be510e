"""Counting what a compilation did: operators, kernels, library calls, fused groups.

Definitions (DESIGN.md section 3):

- ``ops``: Relax operator call sites in ``main`` right after import (the papers' #Ops).
- ``kernels``: kernel launches per inference after compilation, i.e. ``call_tir`` (and its
  in-place / with-grad forms) plus ``call_dps_packed`` reachable from ``main``, counted after
  ``RewriteDataflowReshape`` so a reshape lowered to a view is not a kernel (PluS's #Layers).
- ``fusion_ratio``: ops / kernels.
"""

from __future__ import annotations

import json
import re
from collections import Counter

import tvm
from tvm import relax

_KERNEL_OPS = frozenset(
    {
        "relax.call_tir",
        "relax.call_tir_inplace",
        "relax.call_tir_with_grad",
        "relax.call_dps_packed",
    }
)
_LIBRARY_OPS = frozenset({"relax.call_dps_packed"})
# the nodes the importer sent to the host: ONNX nodes run by ONNX's reference implementation
# (onnx_import/host_nodes.py, "#index 'name' of type Op: why") and torch nodes run by torch eager
# (torch_host_fallback.py, "node 'name' (File ...) of torch operator aten::op.overload: ..."); a
# JSON list on the imported module, ``stats["host_nodes"]`` after compile
HOST_NODES_ATTR = "plus.host_nodes"


def host_nodes(mod: tvm.IRModule) -> list[str]:
    """The nodes of an imported model that run on the host (ONNX or torch), in graph order."""
    text = mod.attrs.get(HOST_NODES_ATTR) if mod.attrs is not None else None
    return json.loads(str(text)) if text is not None else []


def _op_name(call: relax.Call) -> str | None:
    return call.op.name if isinstance(call.op, tvm.ir.Op) else None


def _calls(func: relax.Function) -> list[relax.Call]:
    found: list[relax.Call] = []
    relax.analysis.post_order_visit(
        func.body, lambda e: found.append(e) if isinstance(e, relax.Call) else None
    )
    return found


def count_ops(mod: tvm.IRModule, func: str = "main") -> int:
    """Relax operator call sites in ``func`` (every ``Call`` whose callee is a Relax ``Op``; the
    index checks the frontend adds are guards, not the model's operators)."""
    from .index_inputs import is_index_check

    return sum(1 for c in _calls(mod[func]) if _op_name(c) is not None and not is_index_check(c))


def _static(expr: relax.Expr) -> list[int] | None:
    from .dispatch.binders.common import shape_of

    dims = shape_of(expr)
    return dims if dims and None not in dims else None


def _prod(values: list[int]) -> int:
    out = 1
    for v in values:
        out *= v
    return out


def contraction_flops(mod: tvm.IRModule, func: str = "main") -> int:
    """Floating-point operations of the matrix products and convolutions in ``func``.

    ``matmul``: ``2 * prod(output) * K``; ``conv1d/2d/3d``: ``2 * prod(output) * (input channels
    / groups) * prod(kernel window)``. Calls with a symbolic size are not counted (0).
    """
    total = 0
    for call in _calls(mod[func]):
        name = _op_name(call)
        if name not in ("relax.matmul", "relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d"):
            continue
        out, a, b = _static(call), _static(call.args[0]), _static(call.args[1])
        if out is None or a is None or b is None:
            continue
        if name == "relax.matmul":
            total += 2 * _prod(out) * a[-1]
        else:
            layout = str(call.attrs.kernel_layout)  # e.g. OIHW: I is in-channels per group
            window = [n for axis, n in zip(layout, b) if axis not in "OI"]
            total += 2 * _prod(out) * b[layout.index("I")] * _prod(window)
    return total


def op_histogram(mod: tvm.IRModule, func: str = "main") -> dict[str, int]:
    """Operator name -> number of call sites in ``func``."""
    names = (_op_name(c) for c in _calls(mod[func]))
    return dict(Counter(n for n in names if n is not None).most_common())


def _callee_name(call: relax.Call) -> str:
    target = call.args[0]
    if isinstance(target, tvm.ir.GlobalVar):
        return target.name_hint
    if isinstance(target, relax.ExternFunc):
        return str(target.global_symbol)
    return type(target).__name__


def kernel_calls(mod: tvm.IRModule, func: str = "main") -> list[tuple[str, str]]:
    """(kernel op, callee name) for each kernel launch reachable from ``func``, in program order.

    Calls to other Relax functions of the module (for instance outlined CUDA-graph regions or
    functions FuseTIR left unfused) are followed, so their kernels count too.
    """
    out: list[tuple[str, str]] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        for call in _calls(mod[name]):
            op = _op_name(call)
            if op in _KERNEL_OPS:
                out.append((op, _callee_name(call)))
            elif isinstance(call.op, tvm.ir.GlobalVar) and isinstance(mod[call.op], relax.Function):
                visit(call.op.name_hint)

    visit(func)
    return out


def kernel_stats(mod: tvm.IRModule, func: str = "main") -> dict[str, object]:
    """Kernel counts of a module that is fused but not yet lowered out of dataflow form."""
    mod = relax.transform.RewriteDataflowReshape()(mod)
    calls = kernel_calls(mod, func)
    library = [callee for op, callee in calls if op in _LIBRARY_OPS]
    return {
        "kernels": len(calls),
        "library_calls": len(library),
        "kernel_names": dict(Counter(_base_name(callee) for _, callee in calls).most_common()),
    }


_NUMBER_SUFFIX = re.compile(r"\d+$")


def _base_name(name: str) -> str:
    """``add3`` -> ``add``: legalization numbers repeated PrimFunc names."""
    stripped = _NUMBER_SUFFIX.sub("", name)
    return stripped.rstrip("_") or name


def fused_groups(mod: tvm.IRModule) -> list[dict[str, object]]:
    """The groups a fusion pass outlined: every ``Primitive`` Relax function and its members.

    Run on the module right after the fusion pass and before ``FuseTIR`` merges each group
    into a single PrimFunc.
    """
    groups = []
    for gvar, func in mod.functions_items():
        if not isinstance(func, relax.Function) or func.attrs is None:
            continue
        if not int(func.attrs.get("Primitive", 0)):
            continue
        members = [_base_name(_callee_name(c)) for c in _calls(func) if _op_name(c) in _KERNEL_OPS]
        groups.append({"name": gvar.name_hint, "ops": members})
    groups.sort(key=lambda g: g["name"])
    return groups


@tvm.instrument.pass_instrument
class PipelineRecorder:
    """Pass instrument that records what the pipeline's passes report as they run: the fused
    groups right after a fusion pass, the dispatch and schedule reports, the module after the
    CUDA-graph passes (``stats["cuda_graph"]`` reads it).

    Parameters
    ----------
    fusion_passes : tuple of str
        Names of the passes after which groups are read (``FuseOps`` and plus_tvm's own).
    """

    def __init__(self, fusion_passes: tuple[str, ...] = ("FuseOps", "DPFuseOps")) -> None:
        self.fusion_passes = fusion_passes
        self.groups: list[dict[str, object]] = []
        self.explain: list[str] | None = None
        self.fusion_cost: dict[str, object] | None = None
        self.dispatch: dict[str, object] | None = None
        self.schedule: dict[str, object] | None = None
        #: the module right after phase 6's CUDA-graph passes (None: they did not run)
        self.captured: tvm.IRModule | None = None

    def run_after_pass(self, mod: tvm.IRModule, info: tvm.transform.PassInfo) -> None:
        if info.name == "RouteCUDAGraphRuntime":
            self.captured = mod
        if info.name == "ApplyScheduleRules":
            report = mod.attrs.get("plus.schedule") if mod.attrs is not None else None
            self.schedule = json.loads(str(report)) if report is not None else None
        if info.name == "PlusDispatch":
            report = mod.attrs.get("plus.dispatch") if mod.attrs is not None else None
            self.dispatch = json.loads(str(report)) if report is not None else None
        if info.name in self.fusion_passes:
            self.groups = fused_groups(mod)
            from .passes.dp_fuse_ops import COST_ATTR, EXPLAIN_ATTR

            attrs = mod.attrs if mod.attrs is not None else {}
            notes = attrs.get(EXPLAIN_ATTR)
            self.explain = [str(n) for n in notes] if notes is not None else None
            priced = attrs.get(COST_ATTR)
            self.fusion_cost = json.loads(str(priced)) if priced is not None else None
