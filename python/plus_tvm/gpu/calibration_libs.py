"""The CUDA-graph calibration's libraries, compiled on the CPU machine into a GPU bundle.

The GPU machine has TVM's runtime library alone, so what the calibration
(:mod:`plus_tvm.gpu.calibrate_graph`) runs through the VM is compiled here: one Relax module of
chains, each a function of one ``float32[32]`` input:

- ``kernels_N`` (N in :data:`KERNEL_CHAINS`): N launches of one tiny generated kernel
  (``y = x + 1``, TVM's CUDA codegen), each reading the previous one's output;
- ``library_N`` (N in :data:`LIBRARY_CHAINS`): N calls of the library kernel
  :data:`LIBRARY_KERNEL` (the VM -> Python -> torch crossing every library kernel pays).

The module is built twice through plus's own phases 5-6 (``lower``, ``finalize``), so the VM,
the planner and the CUDA-graph runtime are the ones a compiled model uses:

- ``plain.so``: ``cuda_graph=off``: every kernel launched from the host;
- ``graph.so`` (CUDA targets only): ``cuda_graph=always``: TVM's ``RewriteCUDAGraph`` captures
  each chain's kernels between the first (it reads the function's input) and the last (it
  writes the returned tensor), and the region replays through ``plus.cuda_graph.run_or_capture``.

``calibration.json`` records, per library and function, the kernels launched from the host,
the nodes of its capture regions and its library calls (read off the lowered IR, not assumed),
which the fit needs. Built for ``llvm`` too (``plain.so`` alone): the dry run on a CPU.
"""

from __future__ import annotations

import json
import os
import re
import time

import tvm
from tvm import relax

from ..options import Options
from .calibrate_graph import MANIFEST

KERNEL_CHAINS = (4, 16, 64, 128)
LIBRARY_CHAINS = (1, 4, 16, 64)
WIDTH = 32  # elements of the chains' tensor: one warp, a launch-bound kernel
LIBRARY_KERNEL = "plus.softmax"
LIBRARY_CONFIG = "axis=-1"
FORMAT = "plus_tvm.graph_calibration_libs/1"
_CHAIN = re.compile(r"^(kernels|library)_\d+$")


def _add_one(gpu: bool) -> tvm.tirx.PrimFunc:
    from tvm.script import tirx as T  # noqa: N812

    if gpu:

        @T.prim_func
        def add_one(x: T.Buffer((WIDTH,), "float32"), y: T.Buffer((WIDTH,), "float32")):
            T.func_attr({"tirx.noalias": True})
            for i in T.thread_binding(WIDTH, thread="threadIdx.x"):
                y[i] = x[i] + T.float32(1)

    else:

        @T.prim_func
        def add_one(x: T.Buffer((WIDTH,), "float32"), y: T.Buffer((WIDTH,), "float32")):
            T.func_attr({"tirx.noalias": True})
            for i in range(WIDTH):
                y[i] = x[i] + T.float32(1)

    return add_one


def calibration_module(target: tvm.target.Target) -> tvm.IRModule:
    """The chains (module docstring) for ``target``, in Relax after phase 4 (``call_tir`` of
    a scheduled kernel, ``call_dps_packed`` of the library kernel)."""
    tensor = relax.TensorType((WIDTH,), "float32")
    bb = relax.BlockBuilder()
    kernel = bb.add_func(_add_one(target.kind.name == "cuda"), "add_one")
    for n in KERNEL_CHAINS:
        x = relax.Var("x", tensor)
        with bb.function(f"kernels_{n}", [x], attrs={"num_input": 1}):
            h = x
            for _ in range(n):
                h = bb.emit(relax.call_tir(kernel, [h], tensor))
            bb.emit_func_output(h)
    library = relax.ExternFunc(LIBRARY_KERNEL)
    for n in LIBRARY_CHAINS:
        x = relax.Var("x", tensor)
        with bb.function(f"library_{n}", [x], attrs={"num_input": 1}):
            h = x
            for _ in range(n):
                args = [h, tvm.ir.StringImm(LIBRARY_CONFIG)]
                h = bb.emit(relax.call_dps_packed(library, args, tensor))
            bb.emit_func_output(h)
    return bb.get()


def function_counts(mod: tvm.IRModule) -> dict[str, dict[str, int]]:
    """Per Relax function of a lowered module (after phase 6): kernels launched from the host
    (``kernels_outside``), library calls from the host (``library_outside``), capture regions
    and the kernels and library calls captured in them (``region_nodes``)."""
    from ..passes._capture_calls import bindings, capture_call
    from ..passes._graph_staging import is_kernel_call, is_library_call

    counts = {}
    for gv, func in mod.functions_items():
        name = gv.name_hint
        if not _CHAIN.match(name):  # (the capture regions' own functions are counted inside)
            continue
        row = {"kernels_outside": 0, "library_outside": 0, "regions": 0, "region_nodes": 0}
        for b in bindings(func):
            capture = capture_call(b.value)
            if capture is not None:
                row["regions"] += 1
                inner = [c.value for c in bindings(mod[capture.region])]
                row["region_nodes"] += sum(
                    is_kernel_call(v, mod) or is_library_call(v) for v in inner
                )
            elif is_kernel_call(b.value, mod):
                row["kernels_outside"] += 1
            elif is_library_call(b.value):
                row["library_outside"] += 1
        counts[name] = row
    return counts


def lower_calibration(target: tvm.target.Target) -> dict[str, tuple[str, tvm.IRModule]]:
    """The chains through plus's phases 5-6, per library: ``plain`` (``cuda_graph=off``) and
    on CUDA ``graph`` (``always``): ``{variant: (cuda_graph mode, lowered module)}``."""
    from ..pipeline import phase_passes

    modes = {"plain": "off", "graph": "always"} if target.kind.name == "cuda" else {"plain": "off"}
    mod = calibration_module(target)
    out = {}
    for variant, mode in modes.items():
        passes = phase_passes(target, Options(cuda_graph=mode), ("lower", "finalize"))
        with target:
            out[variant] = (mode, tvm.transform.Sequential(passes)(mod))
    return out


def build_calibration(folder: str, target: str | dict | tvm.target.Target) -> dict:
    """Compile the chains for ``target`` into ``folder`` (``plain.so``; ``graph.so`` on CUDA)
    and write ``calibration.json``; returns it."""
    from ..target import resolve_target

    tgt = resolve_target(target)
    os.makedirs(folder, exist_ok=True)
    manifest: dict = {
        "format": FORMAT,
        "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        "target": _target_dict(tgt),
        "width": WIDTH,
        "kernel_chains": list(KERNEL_CHAINS),
        "library_chains": list(LIBRARY_CHAINS),
        "library_kernel": LIBRARY_KERNEL,
        "libraries": {},
    }
    for variant, (mode, lowered) in lower_calibration(tgt).items():
        executable = tvm.compile(lowered, tgt, relax_pipeline=tvm.transform.Sequential([]))
        lib = f"{variant}.so"
        executable.export_library(os.path.join(folder, lib))
        manifest["libraries"][variant] = {
            "library": lib,
            "cuda_graph": mode,
            "functions": function_counts(lowered),
        }
    with open(os.path.join(folder, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest


def _target_dict(target: tvm.target.Target) -> dict:
    attrs = dict(target.attrs)
    return {"kind": target.kind.name, **{k: str(v) for k, v in attrs.items() if k == "arch"}}
