"""``plus_tvm.compile``, ``CompiledModel`` and ``plus_tvm.inspect``.

Compilation runs the pipeline's phases 1-4 first, reads the statistics from that module (kernels
after fusion and scheduling, before lowering erases ``call_tir``), then builds the rest with
``tvm.compile``. ``pipeline="tvm"`` runs TVM's own default pipeline for the target, split at the
same point, so both report comparable numbers.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from .errors import InputError, ModelLoadError, PlusError
from .frontend import num_inputs
from .loader import LoadedModel, load_model
from .options import Options
from .pipeline import (
    PHASE_NAMES,
    dump_phase,
    phase_passes,
    tvm_post_lowering_passes,
    tvm_pre_lowering_passes,
)
from .stats import FusionRecorder, count_ops, kernel_stats
from .target import device_for, resolve_target, target_name

PIPELINES = ("plus", "tvm")
_PRE_LOWERING = PHASE_NAMES[:4]
_POST = PHASE_NAMES[4:]


@dataclass(frozen=True)
class InputSpec:
    """Name, shape (ints, or str for symbolic dims) and dtype of one model input."""

    name: str
    shape: tuple[int | str, ...]
    dtype: str

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}


def input_specs(mod: tvm.IRModule) -> list[InputSpec]:
    """The model inputs of ``main`` (the parameters before ``num_input``)."""
    main = mod["main"]
    specs = []
    for param in main.params[: num_inputs(mod)]:
        ty = param.ty
        if not isinstance(ty, relax.TensorType) or ty.shape is None:
            raise ModelLoadError(f"input {param.name} is not a tensor of known rank ({ty})")
        dims = tuple(int(d) if isinstance(d, tvm.tirx.IntImm) else str(d) for d in ty.shape.values)
        specs.append(InputSpec(param.name, dims, str(ty.dtype)))
    return specs


# --------------------------------------------------------------------------------------- stats
def _pre_lowering(
    loaded: LoadedModel,
    target: tvm.target.Target,
    options: Options,
    pipeline: str,
    dumper: _PhaseDumper | None = None,
) -> tuple[tvm.IRModule, dict[str, object]]:
    """Run phases 1-4 (or TVM's equivalent) and collect the statistics."""
    if pipeline not in PIPELINES:
        raise PlusError(f"unknown pipeline {pipeline!r}; choose one of {list(PIPELINES)}")
    start = time.perf_counter()
    recorder = FusionRecorder()
    instruments = [recorder] + ([dumper] if dumper is not None else [])
    passes = (
        phase_passes(target, options, _PRE_LOWERING)
        if pipeline == "plus"
        else tvm_pre_lowering_passes(target)
    )
    with _context(instruments), target:
        mod = tvm.transform.Sequential(passes, name=f"{pipeline}.pre_lowering")(loaded.mod)
    ops = count_ops(loaded.mod)
    kstats = kernel_stats(mod)
    kernels = int(kstats["kernels"])
    stats = {
        "model": loaded.name,
        "target": target_name(target),
        "pipeline": pipeline,
        "ops": ops,
        "kernels": kernels,
        "fusion_ratio": round(ops / kernels, 4) if kernels else float(ops),
        "library_calls": kstats["library_calls"],
        "patterns": dict((recorder.dispatch or {}).get("library", {})),
        **({"dispatch": recorder.dispatch} if recorder.dispatch is not None else {}),
        "groups": recorder.groups,
        **({"fusion_explain": recorder.explain} if recorder.explain is not None else {}),
        "kernel_names": kstats["kernel_names"],
        "options": options.to_dict(),
        "compile_s": time.perf_counter() - start,
    }
    return mod, stats


def _context(instruments: list) -> tvm.transform.PassContext:
    """A PassContext adding our instruments to the caller's config and instruments."""
    cur = tvm.transform.PassContext.current()
    return tvm.transform.PassContext(
        opt_level=cur.opt_level,
        config=dict(cur.config),
        instruments=list(cur.instruments) + instruments,
    )


@tvm.instrument.pass_instrument
class _PhaseDumper:
    """Writes the IR after each pipeline phase to ``<folder>/<n>_<phase>.py``, numbered in
    pipeline order across the two halves that :func:`compile` runs."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.count = 0

    def run_after_pass(self, mod: tvm.IRModule, info: tvm.transform.PassInfo) -> None:
        if info.name.startswith("plus.") and info.name[5:] in PHASE_NAMES:
            self.count += 1
            dump_phase(self.folder, self.count, info.name, mod)


def inspect(
    mod_or_model: object,
    target: object = "llvm",
    options: Options | None = None,
    *,
    pipeline: str = "plus",
    example_args: object = None,
) -> dict[str, object]:
    """Statistics of compiling ``mod_or_model`` (no machine code is generated).

    Returns the stats dict of DESIGN.md section 3: ``model``, ``target``, ``pipeline``, ``ops``,
    ``kernels``, ``fusion_ratio``, ``library_calls``, ``patterns``, ``groups``, ``compile_s``.
    """
    loaded = load_model(mod_or_model, example_args)
    _, stats = _pre_lowering(loaded, resolve_target(target), options or Options(), pipeline)
    return stats


def compile(  # noqa: A001 - the public name of the contract
    model: object,
    target: object = "llvm",
    example_args: object = None,
    options: Options | None = None,
    *,
    pipeline: str = "plus",
) -> CompiledModel:
    """Compile a model with the plus pipeline (or TVM's, ``pipeline="tvm"``).

    Parameters
    ----------
    model : object
        Anything :func:`plus_tvm.loader.load_model` accepts: ``"zoo:NAME"``, an ONNX path or
        proto, a torch module (with ``example_args``), an exported program, an IRModule or
        ``(IRModule, params)``.
    target : str, dict or tvm.target.Target
        ``"llvm"`` (host CPU), ``"cuda"``, a JSON dict, or a Target.
    example_args : tuple, optional
        Example inputs for torch modules.
    options : Options, optional
        Pipeline settings.

    Returns
    -------
    CompiledModel
    """
    options = options or Options()
    tgt = resolve_target(target)
    loaded = load_model(model, example_args)
    weight_names = [p.name for p in loaded.mod["main"].params[num_inputs(loaded.mod) :]]
    missing = [n for n in weight_names if n not in loaded.params]
    if missing:
        more = " ..." if len(missing) > 5 else ""
        raise ModelLoadError(
            f"{loaded.name}: no values for weight parameter(s) {missing[:5]}{more}; "
            "pass (IRModule, params) as the frontends return them"
        )
    start = time.perf_counter()
    dumper = _PhaseDumper(options.dump_ir) if options.dump_ir else None
    mod, stats = _pre_lowering(loaded, tgt, options, pipeline, dumper)
    post = (
        phase_passes(tgt, options, _POST) if pipeline == "plus" else tvm_post_lowering_passes(tgt)
    )
    with _context([dumper] if dumper is not None else []):
        executable = tvm.compile(
            mod, tgt, relax_pipeline=tvm.transform.Sequential(post, name=f"{pipeline}.post")
        )
    stats["compile_s"] = round(time.perf_counter() - start, 3)
    params = [loaded.params[name] for name in weight_names]
    return CompiledModel(executable, tgt, params, input_specs(loaded.mod), stats, loaded)


# ------------------------------------------------------------------------------- CompiledModel
class CompiledModel:
    """A compiled model: call it with numpy arrays or torch tensors, get numpy arrays back.

    Weights are moved to the device once, at construction. Inputs are checked against the
    signature (count, dtype, rank, static dims, consistent symbolic dims) before running.
    """

    def __init__(
        self,
        executable: object,
        target: tvm.target.Target,
        params: list,
        inputs: list[InputSpec],
        stats: dict[str, object],
        source: LoadedModel | None = None,
    ) -> None:
        self.executable = executable
        self.target = target
        self.device = device_for(target)
        self.inputs = inputs
        self.stats = stats
        self.source = source
        self._weights = params
        self._vm_state: tuple | None = None  # (vm, weights on the device), made on first run

    def _vm(self) -> tuple:
        """The VM and the weights on the device, created on first use: a model compiled for a
        GPU on a machine without one can still be inspected and exported."""
        if self._vm_state is None:
            if not self.device.exist:
                raise PlusError(
                    f"cannot run a model compiled for {target_name(self.target)}: "
                    f"no {self.device} on this machine (export_library works without one)"
                )
            vm = relax.VirtualMachine(self.executable, self.device)
            weights = [tvm.runtime.tensor(_as_numpy(p), self.device) for p in self._weights]
            self._vm_state = (vm, weights)
        return self._vm_state

    # -------------------------------------------------------------------------------- running
    def __call__(self, *inputs: object) -> np.ndarray | tuple[np.ndarray, ...]:
        return _to_numpy(self.run_prepared(self.prepare(*inputs)))

    def prepare(self, *inputs: object) -> list:
        """Check inputs and place them on the device (separate so benchmarks can time runs)."""
        arrays = self.check_inputs(inputs)
        self._vm()  # fail clearly before touching a missing device
        return [tvm.runtime.tensor(a, self.device) for a in arrays]

    def run_prepared(self, prepared: list) -> object:
        """Run on inputs from :meth:`prepare`; returns TVM tensors (synchronised)."""
        vm, weights = self._vm()
        out = vm["main"](*prepared, *weights)
        self.device.sync()
        return out

    def check_inputs(self, inputs: tuple) -> list[np.ndarray]:
        """Validate inputs against the model signature; returns them as numpy arrays."""
        if len(inputs) != len(self.inputs):
            names = ", ".join(s.name for s in self.inputs)
            raise InputError(
                f"model takes {len(self.inputs)} input(s) ({names}), got {len(inputs)}"
            )
        arrays = []
        bound: dict[str, int] = {}
        for spec, value in zip(self.inputs, inputs):
            arr = _as_numpy(value)
            if str(arr.dtype) != spec.dtype:
                raise InputError(f"input {spec.name}: expected dtype {spec.dtype}, got {arr.dtype}")
            wrong_shape = InputError(
                f"input {spec.name}: expected shape {_shape(spec.shape)}, got {tuple(arr.shape)}"
            )
            if arr.ndim != len(spec.shape):
                raise wrong_shape
            for dim, size in zip(spec.shape, arr.shape):
                if isinstance(dim, int) and dim != size:
                    raise wrong_shape
                if isinstance(dim, str):
                    if bound.setdefault(dim, size) != size:
                        raise InputError(
                            f"input {spec.name}: symbolic dim {dim} is {size} here but "
                            f"{bound[dim]} in an earlier input"
                        )
            arrays.append(np.asarray(arr, order="C"))  # keeps 0-d arrays 0-d
        return arrays

    # ------------------------------------------------------------------------------- saving
    def export_library(self, path: str) -> str:
        """Write the compiled library to ``path`` and the weights and signature beside it.

        ``path`` gets the shared library, ``path + ".params"`` the weights (TVM param-dict
        format), ``path + ".json"`` the target, inputs and stats. :func:`load` reads them back.
        """
        path = os.fspath(path)
        self.executable.export_library(path)
        params = {f"p{i}": tvm.runtime.tensor(_as_numpy(p)) for i, p in enumerate(self._weights)}
        with open(path + ".params", "wb") as f:
            f.write(tvm.runtime.save_param_dict(params))
        meta = {
            "format": "plus_tvm.compiled/1",
            "target": json.loads(str(self.target)),
            "inputs": [s.to_dict() for s in self.inputs],
            "num_params": len(self._weights),
            "stats": self.stats,
        }
        with open(path + ".json", "w") as f:
            json.dump(meta, f, indent=1, default=str)
        return path

    # ------------------------------------------------------------------------------ display
    def __repr__(self) -> str:
        s = self.stats
        return (
            f"CompiledModel({s.get('model')!r}, target={s.get('target')!r}, "
            f"pipeline={s.get('pipeline')!r}, ops={s.get('ops')}, kernels={s.get('kernels')})"
        )

    def _repr_html_(self) -> str:
        from .report import stats_html

        return stats_html(self.stats)


def load(path: str) -> CompiledModel:
    """Load a model written by :meth:`CompiledModel.export_library` (in any process)."""
    path = os.fspath(path)
    for need in (path, path + ".params", path + ".json"):
        if not os.path.exists(need):
            raise ModelLoadError(f"compiled model file missing: {need}")
    with open(path + ".json") as f:
        meta = json.load(f)
    if meta.get("format") != "plus_tvm.compiled/1":
        raise ModelLoadError(f"{path}.json is not a plus_tvm compiled-model description")
    with open(path + ".params", "rb") as f:
        blob = tvm.runtime.load_param_dict(f.read())
    params = [blob[f"p{i}"] for i in range(meta["num_params"])]
    executable = tvm.runtime.load_module(path)
    target = tvm.target.Target(meta["target"])
    inputs = [InputSpec(d["name"], tuple(d["shape"]), d["dtype"]) for d in meta["inputs"]]
    return CompiledModel(executable, target, params, inputs, meta["stats"])


# ----------------------------------------------------------------------------------- helpers
def _shape(dims: tuple) -> str:
    return "(" + ", ".join(str(d) for d in dims) + ")"


def _as_numpy(value: object) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # torch tensor
        return value.detach().cpu().numpy()
    if isinstance(value, tvm.runtime.Tensor):
        return value.numpy()
    return np.asarray(value)


def _to_numpy(out: object) -> np.ndarray | tuple:
    if isinstance(out, tvm.runtime.Tensor):
        return out.numpy()
    if isinstance(out, (list, tuple)) or hasattr(out, "__len__"):
        return tuple(_to_numpy(o) for o in out)
    if hasattr(out, "numpy"):
        return out.numpy()
    return np.asarray(out)
