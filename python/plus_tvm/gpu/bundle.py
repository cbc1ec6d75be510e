"""Compile here, run there: pack zoo models compiled for CUDA with a runtime-only TVM.

The GPU machine this project is lent at times has torch (CUDA) but no apache-tvm, and a call to
it carries at most 64 MiB. :func:`build_bundle` (on the CPU machine) compiles zoo models for
``cuda`` (sm_90 by default) in several variants (plus with ``cuda_graph=off`` / ``always`` /
``auto``, TVM's default CUDA pipeline), dtypes (``fp32``; ``bf16`` / ``fp16``: the model
as ``model.to(dtype)``, floating inputs in that dtype, integer inputs unchanged) and batch
sizes (the zoo's batch-1 inputs stacked: :func:`batch_inputs`) and writes one folder:

- ``manifest.json``: the bundle's models, and per model and unit (a dtype at a batch, keyed
  :func:`unit_label`: ``fp32`` at batch 1 as in format 2, ``fp32 b16`` at batch 16) its
  variants, compile figures, and per variant the argument shapes of every TIR kernel
  (``gpu_check --kernels`` times them one by one); versions;
- ``models/NAME/DTYPE/VARIANT.so`` (batch 1; ``models/NAME/bB/DTYPE/`` at batch B) (+
  ``.json``, ``.params``): each exported with ``weights="external"``, so the weights come from
  the torch model rebuilt on the GPU side (:func:`plus_tvm.load` with ``weights=``) and only
  derived constants travel (a second batch doubles the libraries, not the weights);
- ``models/NAME/inputs.npz``: three batch-1 input sets in float32 (cast to the dtype on both
  sides); the sets of larger batches are drawn again on the GPU side from their seeds
  (:func:`batch_inputs`; 16 images of 224 x 224 are 9.6 MB a set);
  ``models/NAME/state.pt``: the float32 torch state dict where it is small (tiny models), else
  a fingerprint of it, which the GPU side checks after rebuilding the model from the same seed
  (BatchNorm statistics are baked into the code), before it converts the model to each dtype;
- ``runtime/``: TVM's Python package without its compiler library, and the wheels of tvm-ffi
  and ml_dtypes (TVM's numpy bfloat16) for the GPU machine's Python (fetched with pip);
- ``calibration/``: the CUDA-graph cost calibration's chains of tiny kernels and library calls
  (:mod:`plus_tvm.gpu.calibration_libs`; ``run.sh OUT --calibrate`` runs
  :mod:`plus_tvm.gpu.calibrate_graph` alone, the check runs it first);
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
from ..env import child_environment
from ..errors import InternalCompileError, PlusError
from ..options import Options

LIMIT_BYTES = 64 * 1024 * 1024 - 4 * 1024 * 1024  # a device call carries 64 MiB: keep 4 spare
STATE_LIMIT_BYTES = 4 * 1024 * 1024  # state dicts up to this size travel; larger: fingerprint
INPUT_SEEDS = (11, 12, 13)
DTYPES = ("fp32", "bf16", "fp16")  # accuracy.DTYPE_NAMES: torch.float32 / bfloat16 / float16
WEIGHT_SEED = 0
GPU_PYTHON = "3.12"  # the GPU machine's python3 (device KINDS.md)
CALIBRATION = "calibration"  # the CUDA-graph calibration's libraries (calibration_libs)
ROW_SEED_STRIDE = 1000  # row k of a batch drawn with seed + k * stride (row 0: the batch-1 set)


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


def batch_inputs(entry: zoo.ZooEntry, seed: int, batch: int) -> list:
    """``entry``'s example inputs at ``batch``: row k is its batch-1 example drawn with seed
    ``seed + k * ROW_SEED_STRIDE`` (so row 0 is the batch-1 set, and rows differ: a kernel
    that mixes rows is caught), stacked along dimension 0."""
    if batch < 1:
        raise PlusError(f"batch {batch}: give a positive batch size")
    rows = [entry.example_inputs(seed + k * ROW_SEED_STRIDE) for k in range(batch)]
    return [torch.cat(parts) for parts in zip(*rows)]


def unit_label(dtype: str, batch: int) -> str:
    """The key of a dtype at a batch in the manifest and in gpu_check's results: ``fp32`` at
    batch 1 (as bundles of format 2), ``fp32 b16`` at batch 16."""
    return dtype if batch == 1 else f"{dtype} b{batch}"


def split_label(label: str) -> tuple[str, int]:
    """``(dtype, batch)`` of a :func:`unit_label`."""
    dtype, _, batch = label.partition(" b")
    return dtype, int(batch) if batch else 1


def _unit_folder(out: str, name: str, dtype: str, batch: int) -> str:
    base = os.path.join(out, "models", name)
    return os.path.join(base, dtype) if batch == 1 else os.path.join(base, f"b{batch}", dtype)


def fingerprint(state: dict) -> dict[str, list[float]]:
    """A per-tensor fingerprint of a state dict: sum and sum of squares, in float64."""
    out = {}
    for name, tensor in state.items():
        t = tensor.detach().to(torch.float64)
        out[name] = [float(t.sum()), float((t * t).sum())]
    return out


def cast_inputs(inputs: Sequence, dtype: str) -> list:
    """``inputs`` (torch tensors) in ``dtype`` where floating; integer inputs (token ids)
    unchanged."""
    from ..accuracy import DTYPE_NAMES

    want = getattr(torch, DTYPE_NAMES[dtype])
    return [t.to(want) if t.is_floating_point() else t for t in inputs]


def in_dtype(model: torch.nn.Module, inputs: Sequence, dtype: str) -> tuple:
    """``model`` and ``inputs`` in ``dtype`` (a copy of the model unless ``fp32``; inputs by
    :func:`cast_inputs`): what a user runs after ``model.to(dtype)``. The same on both
    machines."""
    import copy

    from ..accuracy import DTYPE_NAMES

    if dtype == "fp32":
        return model, list(inputs)
    converted = copy.deepcopy(model).eval().to(getattr(torch, DTYPE_NAMES[dtype]))
    return converted, cast_inputs(inputs, dtype)


def build_bundle(
    out: str,
    models: Sequence[str],
    variants: Sequence[str] = DEFAULT_VARIANTS,
    arch: str = "sm_90",
    log: object = print,
    dtypes: Sequence[str] = ("fp32",),
    isolate: bool = True,
    batches: Sequence[int] = (1,),
    lms: Sequence[str] = (),
    lm_limits: tuple[int, int] = (8, 256),
) -> dict:
    """Compile ``models`` for CUDA ``arch`` in ``variants``, ``dtypes`` (of :data:`DTYPES`)
    and ``batches`` and pack them into ``out``. A variant that fails to compile is recorded
    with its error (the GPU side reports it); with ``isolate`` each model, dtype and batch
    compiles in a child process, so that a crash of the compiler (a segfault in TVM) is
    recorded the same way.

    ``lms`` (``gpt2``, ``llama-150m``, or ``zoo:`` / ``arch:`` references): causal LMs
    compiled for generation (:func:`plus_tvm.compile_lm`, ``lm_limits`` = max batch and max
    length) in each dtype and exported with external weights under ``lms/``
    (:func:`plus_tvm.lm.gpu_bench.build_lms`; ``run.sh OUT --lm`` times them)."""
    from ..compiler import compile as plus_compile  # needs TVM's compiler library
    from ..lm import gpu_bench
    from .calibration_libs import build_calibration

    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise PlusError(f"unknown variant(s) {unknown}; known: {', '.join(VARIANTS)}")
    bad = [d for d in dtypes if d not in DTYPES]
    if bad or not dtypes or len(set(dtypes)) != len(dtypes):
        raise PlusError(f"dtypes {list(dtypes)}: give each once, of {', '.join(DTYPES)}")
    if (
        not batches
        or len(set(batches)) != len(batches)
        or not all(isinstance(b, int) and b >= 1 for b in batches)
    ):
        raise PlusError(f"batches {list(batches)}: give each positive batch size once")
    for name in models:
        zoo.get(name)  # unknown names fail before any work
    for name in lms:
        gpu_bench.reference(name)
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(os.path.join(out, "models"))
    target = {"kind": "cuda", "arch": arch}
    manifest: dict = {
        "format": "plus_tvm.gpu_bundle/2",
        "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        "target": target,
        "versions": _versions(),
        "dtypes": list(dtypes),
        "batches": list(batches),
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
            "dtypes": {},
        }
        if sum(t.numel() * t.element_size() for t in state.values()) <= STATE_LIMIT_BYTES:
            torch.save(state, os.path.join(folder, "state.pt"))
            record["state"] = "state.pt"
        for batch in batches:
            at_batch = example if batch == 1 else batch_inputs(entry, WEIGHT_SEED, batch)
            for dtype in dtypes:
                if isolate:
                    done = _compile_in_child(name, dtype, variants, arch, out, log, batch)
                else:
                    done = _compile_variants(
                        plus_compile,
                        name,
                        dtype,
                        model,
                        at_batch,
                        variants,
                        target,
                        out,
                        log,
                        batch,
                    )
                unit: dict = {"variants": done, "dtype": dtype, "batch": batch}
                if batch != 1:  # drawn again on the GPU side (batch_inputs)
                    unit["input_seeds"] = list(INPUT_SEEDS)
                record["dtypes"][unit_label(dtype, batch)] = unit
        manifest["models"][name] = record
    if lms:
        manifest["lms"] = gpu_bench.build_lms(
            out, list(lms), list(dtypes), target, lm_limits[0], lm_limits[1], log, WEIGHT_SEED
        )
    _pack_runtime(os.path.join(out, "runtime"))
    # the CUDA-graph calibration's chains (run.sh OUT --calibrate; gpu_check runs it first)
    build_calibration(os.path.join(out, CALIBRATION), target)
    manifest["calibration"] = CALIBRATION
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


def _compile_variants(
    plus_compile: object,
    name: str,
    dtype: str,
    model: torch.nn.Module,
    example: list,
    variants: Sequence[str],
    target: dict,
    out: str,
    log: object,
    batch: int = 1,
) -> dict:
    """Compile and export ``model`` in ``dtype`` (``example``: inputs at ``batch``) in each
    of ``variants``: their records."""
    model, example = in_dtype(model, example, dtype)
    folder = _unit_folder(out, name, dtype, batch)
    os.makedirs(folder)
    label = unit_label(dtype, batch)
    records = {}
    for vname in variants:
        variant = VARIANTS[vname]
        start = time.perf_counter()
        try:
            compiled = plus_compile(
                model, target, example, options=variant.options, pipeline=variant.pipeline
            )
        except (PlusError, InternalCompileError) as err:  # recorded: the GPU side reports it
            records[vname] = {
                "error": f"{type(err).__name__}: {err}",
                "compile_s": round(time.perf_counter() - start, 2),
            }
            log(f"[gpu_bundle] {name} {label} {vname}: FAILED {records[vname]['error']}")
            continue
        lib = os.path.join(folder, f"{vname}.so")
        compiled.export_library(lib, weights="external")
        records[vname] = {
            "library": os.path.relpath(lib, out),
            "compile_s": round(time.perf_counter() - start, 2),
            "kernels": compiled.stats.get("kernels"),
            "library_calls": compiled.stats.get("library_calls"),
            "bytes": folder_bytes(folder, prefix=f"{vname}.so"),
            # what gpu_check --kernels times kernel by kernel (kernel_timing)
            "kernel_signatures": _kernel_signatures(model, example, target, variant),
        }
        log(f"[gpu_bundle] {name} {label} {vname}: {records[vname]['compile_s']} s")
    return records


def _compile_in_child(
    name: str,
    dtype: str,
    variants: Sequence[str],
    arch: str,
    out: str,
    log: object,
    batch: int = 1,
) -> dict:
    """:func:`_compile_variants` in a child process (``python -m plus_tvm.gpu.bundle``, which
    rebuilds the model from the same seed); a child that dies records the death per variant."""
    result = os.path.join(out, "models", name, f".{dtype}-b{batch}.json")
    cmd = [sys.executable, "-m", "plus_tvm.gpu.bundle", name, dtype, ",".join(variants)]
    records = run_child([*cmd, arch, out, result, str(batch)], result, variants)
    if os.path.exists(result):
        os.remove(result)
    for vname, rec in records.items():
        if "died" in rec.get("error", ""):
            log(f"[gpu_bundle] {name} {unit_label(dtype, batch)} {vname}: FAILED {rec['error']}")
    return records


def run_child(cmd: list[str], result: str, variants: Sequence[str]) -> dict:
    """Run ``cmd``, which writes its records to the JSON file ``result``; where it dies or
    writes none, each of ``variants`` gets the error (the signal, or the last line it wrote)."""
    import signal

    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = child_environment()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package, env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    sys.stderr.write("".join(ln + "\n" for ln in proc.stderr.splitlines() if "[gpu_bundle]" in ln))
    if proc.returncode == 0 and os.path.exists(result):
        with open(result) as f:
            return json.load(f)
    if proc.returncode < 0:
        why = f"the compile process died of {signal.Signals(-proc.returncode).name}"
    else:
        last = proc.stderr.strip().splitlines()[-1:] or ["no message"]
        why = f"the compile process exited {proc.returncode}: {last[0]}"
    return {v: {"error": why} for v in variants}


def _child_main(argv: list[str]) -> int:
    """The child of :func:`_compile_in_child`: NAME DTYPE VARIANTS ARCH OUT RESULT BATCH."""
    from ..compiler import compile as plus_compile

    name, dtype, variants, arch, out, result, batch = argv
    entry = zoo.get(name)
    model = entry.build(WEIGHT_SEED)
    example = batch_inputs(entry, WEIGHT_SEED, int(batch))
    target = {"kind": "cuda", "arch": arch}
    records = _compile_variants(
        plus_compile,
        name,
        dtype,
        model,
        example,
        variants.split(","),
        target,
        out,
        lambda msg: print(msg, file=sys.stderr, flush=True),
        int(batch),
    )
    with open(result, "w") as f:
        json.dump(records, f)
    return 0


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


def folder_bytes(path: str, prefix: str = "") -> int:
    """The bytes of the files under ``path`` (only those whose name starts with ``prefix``)."""
    return sum(
        os.path.getsize(os.path.join(root, f))
        for root, _, files in os.walk(path)
        for f in files
        if f.startswith(prefix)
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
    import ml_dtypes

    ffi = _wheel("apache-tvm-ffi", tvm_ffi.__version__, folder)
    # TVM turns bfloat16 arrays into numpy through ml_dtypes (a dependency of apache-tvm)
    mld = _wheel("ml_dtypes", ml_dtypes.__version__, folder)
    with open(os.path.join(folder, "README"), "w") as f:
        f.write(
            f"tvm_runtime.tar.gz: apache-tvm {tvm.__version__} without libtvm_compiler.so\n"
            f"{os.path.basename(ffi)}: apache-tvm-ffi for CPython {GPU_PYTHON}\n"
            f"{os.path.basename(mld)}: ml_dtypes for CPython {GPU_PYTHON}\n"
        )


def _wheel(package: str, version: str, folder: str) -> str:
    """Download ``package``'s wheel for the GPU machine's Python (binary, manylinux x86-64)."""
    platforms = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64"]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", GPU_PYTHON, "--implementation", "cp", "-d", folder]
    for p in platforms:
        cmd += ["--platform", p]
    before = set(os.listdir(folder))
    proc = subprocess.run(
        [*cmd, f"{package}=={version}"], capture_output=True, text=True, timeout=600
    )
    wheels = [f for f in set(os.listdir(folder)) - before if f.endswith(".whl")]
    if proc.returncode != 0 or not wheels:
        raise PlusError(
            f"cannot download the {package} {version} wheel for CPython {GPU_PYTHON}: "
            f"{proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else 'no wheel'}"
        )
    return os.path.join(folder, wheels[0])


_RUNNER = """#!/bin/bash
# Run on the GPU machine from the repository root: bash {bundle}/run.sh OUT_DIR [gpu_check args]
# (or OUT_DIR --calibrate: the CUDA-graph costs alone; OUT_DIR --lm ...: the generation table)
set -e
here="$(cd "$(dirname "$0")" && pwd)"
site=/tmp/plus_tvm_site
mkdir -p "$site"
wheels=("$here"/runtime/apache_tvm_ffi-*.whl)
# ml_dtypes (numpy's bfloat16 for TVM) from the bundle only where the machine has none
python3 -c "import ml_dtypes" 2>/dev/null || wheels+=("$here"/runtime/ml_dtypes-*.whl)
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" \\
    "${{wheels[@]}}"
tar -C "$site" -xzf "$here/runtime/tvm_runtime.tar.gz"
export PYTHONPATH="$site:$(pwd)/python" TVM_USE_RUNTIME_LIB=1 PYTHONUNBUFFERED=1
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${{LD_LIBRARY_PATH:-}}"
out="$1"; shift
if [ "${{1:-}}" = "--calibrate" ]; then  # the CUDA-graph costs alone (plus_tvm.gpu.calibrate_graph)
    shift
    exec python3 -m plus_tvm.gpu.calibrate_graph run --libs "$here/calibration" --out "$out" "$@"
fi
if [ "${{1:-}}" = "--lm" ]; then  # issue 38's generation table (plus_tvm.lm.gpu_bench)
    exec python3 -m plus_tvm.lm.gpu_bench run --bundle "$here" --out "$out" "$@"
fi
set +e
# a kernel that crashes kills the process: go on after the model and dtype it was running
# (gpu_check --resume records it as crashed), at most 4 times
resume=()
for attempt in 1 2 3 4 5; do
    python3 -m plus_tvm.gpu.check --bundle "$here" --out "$out" "${{resume[@]}}" "$@"
    rc=$?
    [ "$rc" -lt 128 ] && exit "$rc"
    echo "[run.sh] gpu_check died (exit $rc); resuming after what it was running" >&2
    resume=(--resume)
done
exit "$rc"
"""


def _write_runner(out: str) -> None:
    path = os.path.join(out, "run.sh")
    with open(path, "w") as f:
        f.write(_RUNNER.format(bundle=os.path.basename(out)))
    os.chmod(path, 0o755)


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
