"""``stats["cuda_graph"]``: what CUDA-graph capture covers in a CUDA build, and why the rest not.

The report is read off the module TVM's ``RewriteCUDAGraph`` produces (phase 6 with
``cuda_graph=always``: staging, memory planning, rewrite), without generating code, so
``plus-tvm inspect MODEL --target cuda`` prints it on a machine without a GPU. A capture region is
a function that ``main`` hands to ``vm.builtin.cuda_graph.run_or_capture``; its kernels (calls of
PrimFuncs) and library calls (``call_packed`` of a library kernel) are captured. Every kernel
``main`` still launches itself gets a reason, from what the rewrite requires of a captured
kernel (static arguments with static sizes, allocated by the planner):

- ``stages a model input`` / ``stages a returned tensor``: a copy the staging passes put outside
  the graph by design (PyGraph 4.1: one copy, so its readers / writer are captured);
- ``reads a model input``: function inputs are never static;
- ``writes the returned tensor``: the output is allocated per call, outside the planner;
- ``symbolic size``: a size the rewrite was not told to capture per value;
- ``between host-side builtins``: none of the above, the region was cut by a host call.

``bytes_staged_per_replay`` is what the staging copies move per run (inputs and outputs).
The plan reported is the one ``cuda_graph=always`` builds; ``enabled`` says whether this build
uses it (with ``cuda_graph=off`` every kernel runs outside a graph).
"""

from __future__ import annotations

import tvm
from tvm import relax

from .frontend import num_inputs
from .options import Options
from .passes._graph_staging import is_kernel_call, is_library_call, static_shape, tensor_bytes

RUN_OR_CAPTURE = "vm.builtin.cuda_graph.run_or_capture"
STAGE_PREFIX = "plus_stage_copy_"


def cuda_graph_report(
    mod: tvm.IRModule, target: tvm.target.Target, options: Options
) -> dict[str, object]:
    """The capture report of a module after phases 1-4 (dataflow form), for ``target``.

    Parameters
    ----------
    mod : tvm.IRModule
        The module the pre-lowering phases returned.
    target : tvm.target.Target
        A CUDA target.
    options : Options
        The build's options (``cuda_graph`` gives ``enabled``; the plan analysed is the one
        ``always`` builds with these options).
    """
    from .pipeline import capture_passes, lower_phase

    passes = lower_phase(target, options) + capture_passes(target, options)
    with target:
        lowered = tvm.transform.Sequential(passes)(mod)
    return _analyse(lowered, options.cuda_graph)


def _analyse(mod: tvm.IRModule, mode: str) -> dict[str, object]:
    main = mod["main"]
    inputs = set(main.params[: num_inputs(mod)])
    returned = _aliases(main, _returned_vars(main.body.body))
    regions: list[str] = []
    captured = {"kernels": 0, "library_calls": 0}
    outside: list[dict[str, str]] = []
    total_library = 0
    staged = 0
    for binding in _bindings(main):
        value = binding.value
        region = _capture_region(value)
        if region is not None:
            regions.append(region.name_hint)
            for inner in _bindings(mod[region]):
                if is_kernel_call(inner.value, mod) or is_library_call(inner.value):
                    library = is_library_call(inner.value)
                    captured["library_calls" if library else "kernels"] += 1
                    total_library += int(library)
            continue
        library = is_library_call(value)
        if not (library or is_kernel_call(value, mod)):
            continue
        total_library += int(library)
        name = str(value.op.global_symbol) if library else value.op.name_hint
        reason = _reason(name, value, inputs, returned)
        if name.startswith(STAGE_PREFIX):
            staged += tensor_bytes(value.args[0].ty)
        outside.append({"kernel": name, "reason": reason})
    kernels = captured["kernels"] + captured["library_calls"] + len(outside)
    return {
        "mode": mode,
        "enabled": mode == "always",
        "regions": len(regions),
        "kernels": kernels,
        "kernels_captured": captured["kernels"] + captured["library_calls"],
        "library_calls": total_library,
        "library_calls_captured": captured["library_calls"],
        "bytes_staged_per_replay": staged,
        "outside": outside,
    }


def _bindings(func: relax.Function) -> list[relax.Binding]:
    return [b for block in func.body.blocks for b in block.bindings]


def _capture_region(value: relax.Expr) -> tvm.ir.GlobalVar | None:
    """The capture function of ``R.call_builtin_with_ctx(run_or_capture, (func, args, i))``."""
    if not (isinstance(value, relax.Call) and len(value.args) >= 2):
        return None
    builtin, packed = value.args[0], value.args[1]
    if not isinstance(builtin, relax.ExternFunc) or str(builtin.global_symbol) != RUN_OR_CAPTURE:
        return None
    if not isinstance(packed, relax.Tuple) or not packed.fields:
        return None
    first = packed.fields[0]
    return first if isinstance(first, tvm.ir.GlobalVar) else None


def _returned_vars(expr: relax.Expr) -> set[relax.Var]:
    if isinstance(expr, relax.Tuple):
        return set().union(*(_returned_vars(f) for f in expr.fields)) if expr.fields else set()
    return {expr} if isinstance(expr, relax.Var) else set()


def _aliases(func: relax.Function, names: set[relax.Var]) -> set[relax.Var]:
    """``names`` and every variable bound to one of them (``lv = alloc``), transitively."""
    out = set(names)
    for binding in reversed(_bindings(func)):
        if binding.var in out and isinstance(binding.value, relax.Var):
            out.add(binding.value)
    return out


def _reason(name: str, call: relax.Call, inputs: set, returned: set) -> str:
    args = list(call.args)
    if name.startswith(STAGE_PREFIX):
        return "stages a model input" if args[0] in inputs else "stages a returned tensor"
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
