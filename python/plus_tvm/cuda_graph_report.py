"""``stats["cuda_graph"]``: what CUDA-graph capture covers in a CUDA build, and why the rest not.

The report is read off the module the pipeline's phase 6 recorded right after its CUDA-graph
passes (staging, memory planning, TVM's ``RewriteCUDAGraph``, with ``auto`` the selection, whose
estimates ``SelectCUDAGraphRegions`` leaves in a module attribute): nothing is run again, and
``plus-tvm inspect MODEL --target cuda`` runs the Relax passes without generating code, so it
prints the report on a machine without a GPU. A capture region is
a function that ``main`` hands to ``run_or_capture``; its kernels (calls of PrimFuncs) and
library calls (``call_packed`` of a library kernel) are captured. The staging copies (one per
staged input or output, PyGraph 4.1) are not model kernels: they are counted in
``staging_copies`` and ``bytes_staged_per_replay``. Every model kernel ``main`` still launches
itself gets a reason:

- ``not worth a graph (estimate)``: ``cuda_graph=auto`` un-captured its region
  (``SelectCUDAGraphRegions``; ``selection`` lists each region's estimate);
- ``reads a model input``: function inputs are never static;
- ``writes the returned tensor``: the output is allocated per call, outside the planner;
- ``symbolic size``: a size the rewrite was not told to capture per value;
- ``between host-side builtins``: none of the above, the region was cut by a host call.

``bytes_staged_per_replay`` is what the staging copies move per run (inputs and outputs);
``graph_memory_bytes`` the static buffers the regions' graphs hold (planned storage the graphs
replay into; the memory a capture takes on the GPU is in ``plus_tvm.runtime.cuda_graph.status``).
``not_rerun_safe`` names the regions flagged as overwriting a tensor they read (``rerun_safe``): a
capture failing there fails its call (later calls run without the graph). Weights are static
arguments of the graphs (``num_input``): never copied on replay.
A ``cuda_graph=off`` build runs no capture pass: its report says so (``enabled`` false) and
nothing more.
"""

from __future__ import annotations

import json

import tvm
from tvm import relax

from .frontend import num_inputs
from .passes._capture_calls import bindings, capture_call
from .passes._graph_staging import (
    STAGE_PREFIX,
    is_kernel_call,
    is_library_call,
    static_shape,
    tensor_bytes,
)
from .passes.select_cuda_graph_regions import SELECTION_ATTR
from .runtime.cuda_graph import FLAG_NO_RERUN

GET_CACHED_ALLOC = "vm.builtin.cuda_graph.get_cached_alloc"
NOT_WORTH = "not worth a graph (estimate)"


def cuda_graph_report(captured: tvm.IRModule | None, mode: str) -> dict[str, object]:
    """The capture report of a CUDA build.

    Parameters
    ----------
    captured : tvm.IRModule or None
        The module as phase 6's CUDA-graph passes left it (``RouteCUDAGraphRuntime``'s
        result); None where the build ran none (``cuda_graph=off``).
    mode : str
        The build's ``cuda_graph`` option.
    """
    if captured is None:
        return {"mode": mode, "enabled": False}
    report = _analyse(captured, mode)
    attrs = captured.attrs if captured.attrs is not None else {}
    selection = attrs.get(SELECTION_ATTR)
    if selection is not None:
        report["selection"] = json.loads(str(selection))
        if report["selection"].get("plain"):
            for item in report["outside"]:
                item["reason"] = NOT_WORTH
    return report


def _analyse(mod: tvm.IRModule, mode: str) -> dict[str, object]:
    main = mod["main"]
    inputs = set(main.params[: num_inputs(mod)])
    returned = _aliases(main, _returned_vars(main.body.body))
    regions: list[str] = []
    unsafe: list[str] = []
    captured = {"kernels": 0, "library_calls": 0}
    outside: list[dict[str, str]] = []
    total_library = 0
    staged = []
    for binding in bindings(main):
        value = binding.value
        capture = capture_call(value)
        region = capture.region if capture is not None else None
        if region is not None:
            regions.append(region.name_hint)
            if capture.flags & FLAG_NO_RERUN:  # RouteCUDAGraphRuntime's rerun_safe verdict
                unsafe.append(region.name_hint)
            for inner in bindings(mod[region]):
                if is_kernel_call(inner.value, mod) or is_library_call(inner.value):
                    library = is_library_call(inner.value)
                    captured["library_calls" if library else "kernels"] += 1
                    total_library += int(library)
            continue
        if _is_relax_call(value, mod):  # a region SelectCUDAGraphRegions un-captured
            for inner in bindings(mod[value.op]):
                library = is_library_call(inner.value)
                if library or is_kernel_call(inner.value, mod):
                    total_library += int(library)
                    name = _kernel_name(inner.value)
                    outside.append({"kernel": name, "reason": NOT_WORTH})
            continue
        library = is_library_call(value)
        if not (library or is_kernel_call(value, mod)):
            continue
        name = _kernel_name(value)
        if name.startswith(STAGE_PREFIX):
            staged.append(tensor_bytes(value.args[0].ty))
            continue
        total_library += int(library)
        outside.append({"kernel": name, "reason": _reason(value, inputs, returned)})
    kernels = captured["kernels"] + captured["library_calls"] + len(outside)
    return {
        "mode": mode,
        "enabled": mode != "off",
        "regions": len(regions),
        "kernels": kernels,
        "kernels_captured": captured["kernels"] + captured["library_calls"],
        "library_calls": total_library,
        "library_calls_captured": captured["library_calls"],
        "staging_copies": len(staged),
        "bytes_staged_per_replay": sum(staged),
        "graph_memory_bytes": _graph_memory(mod, main),
        # regions that may overwrite what they read: a failed capture there fails its call
        "not_rerun_safe": unsafe,
        "outside": outside,
    }


def _kernel_name(value: relax.Call) -> str:
    return str(value.op.global_symbol) if is_library_call(value) else value.op.name_hint


def _is_relax_call(value: relax.Expr, mod: tvm.IRModule) -> bool:
    return (
        isinstance(value, relax.Call)
        and isinstance(value.op, tvm.ir.GlobalVar)
        and value.op in mod
        and isinstance(mod[value.op], relax.Function)
    )


def _graph_memory(mod: tvm.IRModule, main: relax.Function) -> int:
    """Bytes of the static storage the capture regions' allocation functions hold."""
    total = 0
    for binding in bindings(main):
        value = binding.value
        if not (isinstance(value, relax.Call) and len(value.args) >= 2):
            continue
        builtin, packed = value.args[0], value.args[1]
        if not (
            isinstance(builtin, relax.ExternFunc) and str(builtin.global_symbol) == GET_CACHED_ALLOC
        ):
            continue
        alloc = packed.fields[0] if isinstance(packed, relax.Tuple) and packed.fields else None
        if not isinstance(alloc, tvm.ir.GlobalVar):
            continue
        for inner in bindings(mod[alloc]):
            call = inner.value
            if (
                isinstance(call, relax.Call)
                and isinstance(call.op, tvm.ir.Op)
                and call.op.name == "relax.memory.alloc_storage"
                and isinstance(call.args[0], relax.ShapeExpr)
            ):
                size = call.args[0].values[0]
                total += int(size) if isinstance(size, tvm.tirx.IntImm) else 0
    return total


def _returned_vars(expr: relax.Expr) -> set[relax.Var]:
    if isinstance(expr, relax.Tuple):
        return set().union(*(_returned_vars(f) for f in expr.fields)) if expr.fields else set()
    return {expr} if isinstance(expr, relax.Var) else set()


def _aliases(func: relax.Function, names: set[relax.Var]) -> set[relax.Var]:
    """``names`` and every variable bound to one of them (``lv = alloc``), transitively."""
    out = set(names)
    for binding in reversed(bindings(func)):
        if binding.var in out and isinstance(binding.value, relax.Var):
            out.add(binding.value)
    return out


def _reason(call: relax.Call, inputs: set, returned: set) -> str:
    args = list(call.args)
    if any(a in inputs for a in args):
        return "reads a model input"
    if args and args[-1] in returned:
        return "writes the returned tensor"
    if any(
        isinstance(a.ty, relax.TensorType) and static_shape(a.ty) is None
        for a in args
        if isinstance(a, relax.Var)
    ):
        return "symbolic size"
    return "between host-side builtins"
