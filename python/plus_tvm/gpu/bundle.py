"""Compile here, run there: pack zoo models compiled for CUDA with a runtime-only TVM.

The GPU machine this project is lent at times has torch (CUDA) but no apache-tvm, and a call to
it carries at most 64 MiB. :func:`build_bundle` (on the CPU machine) compiles zoo models for
``cuda`` (sm_90 by default) in several variants (plus with ``cuda_graph=off`` / ``always`` /
``auto``, TVM's default CUDA pipeline) and writes one folder:

- ``manifest.json``: the bundle's models, variants, compile figures, versions, and per variant
  the argument shapes of every TIR kernel (``gpu_check --kernels`` times them one by one);
- ``models/NAME/VARIANT.so`` (+ ``.json``, ``.params``): each exported with
  ``weights="external"``, so the weights come from the torch model rebuilt on the GPU side
  (:func:`plus_tvm.load` with ``weights=``) and only derived constants travel;
- ``models/NAME/inputs.npz``: three input sets; ``models/NAME/state.pt``: the torch state dict
  where it is small (tiny models), else a fingerprint of it, which the GPU side checks after
  rebuilding the model from the same seed (BatchNorm statistics are baked into the code);
- ``runtime/``: TVM's Python package without its compiler library, and the tvm-ffi wheel for
  the GPU machine's Python (fetched from PyPI with pip);
- ``run.sh``: installs that runtime under /tmp and runs :mod:`plus_tvm.gpu.check`.

The folder stays under :data:`LIMIT_BYTES` or :func:`build_bundle` fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .. import zoo
from ..errors import PlusError
from ..options import Options

LIMIT_BYTES = 64 * 1024 * 1024 - 4 * 1024 * 1024  # a device call carries 64 MiB: keep 4 spare
STATE_LIMIT_BYTES = 4 * 1024 * 1024  # state dicts up to this size travel; larger: fingerprint
INPUT_SEEDS = (11, 12, 13)
WEIGHT_SEED = 0
GPU_PYTHON = "3.12"  # the GPU machine's python3 (device KINDS.md)


@dataclass(frozen=True)
class Variant:
    """One way of compiling: a name, the pipeline and its options."""

    name: str
    pipeline: str
    options: Options | None


VARIANTS = {
    "plus-off": Variant("plus-off", "plus", Options(cuda_graph="off")),
    "plus-always": Variant("plus-always", "plus", Options(cuda_graph="always")),
    "plus-auto": Variant("plus-auto", "plus", Options(cuda_graph="auto")),
    "plus-gir": Variant("plus-gir", "plus", Options(gir="on", cuda_graph="always")),
    "tvm": Variant("tvm", "tvm", None),
}
DEFAULT_VARIANTS = ("plus-off", "plus-always", "plus-auto", "tvm")


def fingerprint(state: dict) -> dict[str, list[float]]:
    """A per-tensor fingerprint of a state dict: sum and sum of squares, in float64."""
    out = {}
    for name, tensor in state.items():
        t = tensor.detach().to(torch.float64)
        out[name] = [float(t.sum()), float((t * t).sum())]
    return out


def build_bundle(
    out: str,
    models: Sequence[str],
    variants: Sequence[str] = DEFAULT_VARIANTS,
    arch: str = "sm_90",
    log: object = print,
) -> dict:
    """Compile ``models`` for CUDA ``arch`` in ``variants`` and pack them into ``out``."""
    from ..compiler import compile as plus_compile  # needs TVM's compiler library

    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise PlusError(f"unknown variant(s) {unknown}; known: {', '.join(VARIANTS)}")
    for name in models:
        zoo.get(name)  # unknown names fail before any work
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(os.path.join(out, "models"))
    target = {"kind": "cuda", "arch": arch}
    manifest: dict = {
        "format": "plus_tvm.gpu_bundle/1",
        "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        "target": target,
        "versions": _versions(),
        "models": {},
    }
    for name in models:
        entry = zoo.get(name)
        folder = os.path.join(out, "models", name)
        os.makedirs(folder)
        model = entry.build(WEIGHT_SEED)
        example = entry.example_inputs(WEIGHT_SEED)
        inputs = [entry.example_inputs(s) for s in INPUT_SEEDS]
        np.savez(
            os.path.join(folder, "inputs.npz"),
            **{f"set{k}_{i}": t.numpy() for k, ins in enumerate(inputs) for i, t in enumerate(ins)},
        )
        state = model.state_dict()
        record: dict = {
            "family": entry.family,
            "description": entry.description,
            "seed": WEIGHT_SEED,
            "input_sets": len(inputs),
            "num_inputs": len(example),
            "fingerprint": fingerprint(state),
            "state": None,
            "variants": {},
        }
        if sum(t.numel() * t.element_size() for t in state.values()) <= STATE_LIMIT_BYTES:
            torch.save(state, os.path.join(folder, "state.pt"))
            record["state"] = "state.pt"
        for vname in variants:
            variant = VARIANTS[vname]
            start = time.perf_counter()
            compiled = plus_compile(
                model, target, example, options=variant.options, pipeline=variant.pipeline
            )
            lib = os.path.join(folder, f"{vname}.so")
            compiled.export_library(lib, weights="external")
            record["variants"][vname] = {
                "library": os.path.relpath(lib, out),
                "compile_s": round(time.perf_counter() - start, 2),
                "kernels": compiled.stats.get("kernels"),
                "library_calls": compiled.stats.get("library_calls"),
                # what gpu_check --kernels times kernel by kernel (kernel_timing)
                "kernel_signatures": _kernel_signatures(model, example, target, variant),
            }
            log(f"[gpu_bundle] {name} {vname}: {record['variants'][vname]['compile_s']} s")
        manifest["models"][name] = record
    _pack_runtime(os.path.join(out, "runtime"))
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    _write_runner(out)
    size = folder_bytes(out)
    manifest["bytes"] = size
    if size > LIMIT_BYTES:
        raise PlusError(
            f"the bundle {out} is {size / 2**20:.1f} MiB, over {LIMIT_BYTES / 2**20:.0f} MiB: "
            "pack fewer or smaller models"
        )
    return manifest


def _kernel_signatures(model: object, example: list, target: dict, variant: Variant) -> dict:
    """The TIR kernels of ``variant``'s build and their argument shapes (phases 1-4 again)."""
    from ..compile_inputs import resolve_inputs
    from ..compiler import pre_lowering
    from ..kernel_timing import signatures
    from ..loader import load_model
    from ..target import resolve_target

    tgt = resolve_target(target)
    options = resolve_inputs(tgt, variant.options or Options())
    mod, _ = pre_lowering(load_model(model, example), tgt, options, variant.pipeline)
    return signatures(mod)


def folder_bytes(path: str) -> int:
    return sum(
        os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files
    )


def _versions() -> dict[str, str]:
    import tvm

    from .._version import __version__

    return {"plus_tvm": __version__, "tvm": tvm.__version__, "torch": torch.__version__}


def _pack_runtime(folder: str) -> None:
    """TVM's Python package less its compiler library and sources, and the tvm-ffi wheel."""
    import tvm
    import tvm_ffi

    os.makedirs(folder)
    tvm_dir = os.path.dirname(tvm.__file__)
    skipped = {"libtvm_compiler.so", "3rdparty", "src", "include", "web", "__pycache__"}

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return None if os.path.basename(info.name) in skipped else info

    with tarfile.open(os.path.join(folder, "tvm_runtime.tar.gz"), "w:gz") as tar:
        tar.add(tvm_dir, arcname="tvm", filter=keep)
    wheel = _ffi_wheel(tvm_ffi.__version__, folder)
    with open(os.path.join(folder, "README"), "w") as f:
        f.write(
            f"tvm_runtime.tar.gz: apache-tvm {tvm.__version__} without libtvm_compiler.so\n"
            f"{os.path.basename(wheel)}: apache-tvm-ffi for CPython {GPU_PYTHON}\n"
        )


def _ffi_wheel(version: str, folder: str) -> str:
    """Download the tvm-ffi wheel for the GPU machine's Python (binary, manylinux x86-64)."""
    platforms = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64"]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", GPU_PYTHON, "--implementation", "cp", "-d", folder]
    for p in platforms:
        cmd += ["--platform", p]
    proc = subprocess.run(
        [*cmd, f"apache-tvm-ffi=={version}"], capture_output=True, text=True, timeout=600
    )
    wheels = [f for f in os.listdir(folder) if f.endswith(".whl")]
    if proc.returncode != 0 or not wheels:
        raise PlusError(
            f"cannot download the apache-tvm-ffi {version} wheel for CPython {GPU_PYTHON}: "
            f"{proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else 'no wheel'}"
        )
    return os.path.join(folder, wheels[0])


_RUNNER = """#!/bin/bash
# Run on the GPU machine from the repository root: bash {bundle}/run.sh OUT_DIR [gpu_check args]
set -e
here="$(cd "$(dirname "$0")" && pwd)"
site=/tmp/plus_tvm_site
mkdir -p "$site"
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" \\
    "$here"/runtime/*.whl
tar -C "$site" -xzf "$here/runtime/tvm_runtime.tar.gz"
export PYTHONPATH="$site:$(pwd)/python" TVM_USE_RUNTIME_LIB=1 PYTHONUNBUFFERED=1
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${{LD_LIBRARY_PATH:-}}"
out="$1"; shift
exec python3 -m plus_tvm.gpu.check --bundle "$here" --out "$out" "$@"
"""


def _write_runner(out: str) -> None:
    path = os.path.join(out, "run.sh")
    with open(path, "w") as f:
        f.write(_RUNNER.format(bundle=os.path.basename(out)))
    os.chmod(path, 0o755)
