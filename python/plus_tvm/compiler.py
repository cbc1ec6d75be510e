"""``plus_tvm.compile``, ``CompiledModel`` and ``plus_tvm.inspect``.

Compilation runs the pipeline's phases 1-4 first, reads the statistics from that module (kernels
after fusion and scheduling, before lowering erases ``call_tir``), then builds the rest with
``tvm.compile``. ``pipeline="tvm"`` runs TVM's own default pipeline for the target, split at the
same point, so both report comparable numbers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
import time

import tvm
from tvm import relax

from . import avoiding_options, interrupt, quiet, schedule_fallback
from .compile_inputs import resolve_inputs
from .compiled_model import CompiledModel, ModelIO, WeightSource, load, share_tied_weights
from .cuda_graph_report import cuda_graph_report
from .errors import (
    TVM_REFUSAL,
    InternalCompileError,
    ModelLoadError,
    OutputWriteError,
    PlusError,
    service_error,
)
from .frontend import num_inputs
from .index_inputs import index_input_ranges
from .ir_dump import PhaseDumper
from .loader import LoadedModel, load_model
from .options import Options
from .pipeline import PHASE_NAMES, phase_passes, schedule_phase
from .progress import CompileProgress
from .schedule_fallback import BeforeSchedule
from .signature import SIGNATURE_FUNCTION, InputSpec, signature_text
from .stats import PipelineRecorder, contraction_flops, count_ops, host_nodes, kernel_stats
from .target import resolve_target, target_name
from .torch_branch_guards import speculated_branches
from .tvm_default import tvm_post_lowering_passes, tvm_pre_lowering_passes

__all__ = ["CompiledModel", "InputSpec", "compile", "input_specs", "inspect", "load"]

PIPELINES = ("plus", "tvm")


def input_specs(mod: tvm.IRModule) -> list[InputSpec]:
    """The model inputs of ``main`` (the parameters before ``num_input``)."""
    main = mod["main"]
    ranges = index_input_ranges(mod)
    specs = []
    for param in main.params[: num_inputs(mod)]:
        ty = param.ty
        if not isinstance(ty, relax.TensorType):
            raise ModelLoadError(f"input {param.name} is not a tensor ({ty})")
        if ty.shape is not None:
            dims: tuple | None = tuple(
                int(d) if isinstance(d, tvm.tirx.IntImm) else str(d) for d in ty.shape.values
            )
        elif ty.ndim >= 0:
            dims = (None,) * ty.ndim
        else:
            dims = None
        sizes = _symbolic_sizes(main, dims)
        specs.append(InputSpec(param.name, dims, str(ty.dtype), ranges.get(param.name), sizes))
    return specs


def _symbolic_sizes(main: relax.Function, dims: tuple | None) -> tuple:
    """``(name, low, high)`` of each bare symbolic dim in ``dims`` that ``main`` bounds (from a
    ``Dim``'s min and max); a bound it does not give is None."""
    from .symbolic_bounds import lower_bounds, upper_bounds

    lower, upper = lower_bounds(main), upper_bounds(main)
    named = dict.fromkeys(d for d in dims or () if isinstance(d, str))
    return tuple((d, lower.get(d), upper.get(d)) for d in named if d in lower or d in upper)


_PRE_LOWERING = PHASE_NAMES[:4]
_POST = PHASE_NAMES[4:]


# --------------------------------------------------------------------------------------- stats
def pre_lowering(
    loaded: LoadedModel,
    target: tvm.target.Target,
    options: Options,
    pipeline: str,
    dumper: PhaseDumper | None = None,
    recorder: PipelineRecorder | None = None,
    progress: CompileProgress | None = None,
    before_schedule: BeforeSchedule | None = None,
) -> tuple[tvm.IRModule, dict[str, object]]:
    """Run phases 1-4 (or TVM's equivalent) on a loaded model and collect the statistics: the
    module :func:`compile` hands to code generation, and :func:`inspect`'s stats.

    ``options`` are the resolved ones (:func:`plus_tvm.compile_inputs.resolve_inputs`): they
    are used as given. ``recorder`` collects the passes' reports (a new one if not given);
    ``before_schedule`` keeps the module phase 4 starts from (the build's fallback)."""
    if pipeline not in PIPELINES:
        raise PlusError(f"unknown pipeline {pipeline!r}; choose one of {list(PIPELINES)}")
    start = time.perf_counter()
    recorder = recorder or PipelineRecorder()
    tracker = _PassTracker(progress)
    instruments = [recorder, tracker] + ([dumper] if dumper is not None else [])
    instruments += [before_schedule] if before_schedule is not None else []
    passes = (
        phase_passes(target, options, _PRE_LOWERING)
        if pipeline == "plus"
        else tvm_pre_lowering_passes(target)
    )
    with _context(instruments), target, _naming_the_pass(tracker, options):
        mod = tvm.transform.Sequential(passes, name=f"{pipeline}.pre_lowering")(loaded.mod)
    ops = count_ops(loaded.mod)
    kstats = kernel_stats(mod)
    kernels = int(kstats["kernels"])
    stats = {
        "model": loaded.name,
        "target": target_name(target),
        "pipeline": pipeline,
        "ops": ops,
        "gemm_flops": contraction_flops(loaded.mod),
        "kernels": kernels,
        "fusion_ratio": round(ops / kernels, 4) if kernels else float(ops),
        "library_calls": kstats["library_calls"],
        "patterns": dict((recorder.dispatch or {}).get("library", {})),
        **({"dispatch": recorder.dispatch} if recorder.dispatch is not None else {}),
        "groups": recorder.groups,
        **({"fusion_explain": recorder.explain} if recorder.explain is not None else {}),
        **({"fusion_cost": recorder.fusion_cost} if recorder.fusion_cost is not None else {}),
        **({"schedule": recorder.schedule} if recorder.schedule is not None else {}),
        "kernel_names": kstats["kernel_names"],
        **({"host_nodes": hosts} if (hosts := host_nodes(loaded.mod)) else {}),
        **({"speculated_branches": b} if (b := speculated_branches(loaded.mod)) else {}),
        "options": options.to_dict(),
        "compile_s": time.perf_counter() - start,
    }
    return mod, stats


def _graphs(target: tvm.target.Target, pipeline: str) -> bool:
    return pipeline == "plus" and target.kind.name == "cuda"


def _post_lowering(
    mod: tvm.IRModule, target: tvm.target.Target, options: Options, instruments: list
) -> tvm.IRModule:
    """Phases 5-6 as Relax passes only (no code generation): what :func:`inspect` runs to see
    the CUDA-graph passes' result."""
    tracker = _PassTracker()
    with _context([*instruments, tracker]), target, _naming_the_pass(tracker, options):
        return tvm.transform.Sequential(phase_passes(target, options, _POST))(mod)


def _cuda_graph_stats(recorder: PipelineRecorder, options: Options) -> dict[str, object]:
    """``stats["cuda_graph"]`` from what the build's CUDA-graph passes recorded; an analysis
    TVM refuses is reported there, never fatal."""
    try:
        return cuda_graph_report(recorder.captured, options.cuda_graph)
    except TVM_REFUSAL as err:
        return _refused(options, err)


def _refused(options: Options, err: Exception) -> dict[str, object]:
    first = str(err).strip().splitlines()[-1:] or [type(err).__name__]
    return {"mode": options.cuda_graph, "error": f"capture analysis failed: {first[0]}"}


def _context(instruments: list) -> tvm.transform.PassContext:
    """A PassContext adding our instruments to the caller's config and instruments."""
    cur = tvm.transform.PassContext.current()
    return tvm.transform.PassContext(
        opt_level=cur.opt_level,
        config=dict(cur.config),
        instruments=list(cur.instruments) + instruments,
    )


@tvm.instrument.pass_instrument
class _PassTracker:
    """Remembers which passes are running (a pass that raises is never "after"), so that an
    internal error can name its phase and pass."""

    def __init__(self, progress: CompileProgress | None = None) -> None:
        self.running: list[str] = []
        self.progress = progress

    def run_before_pass(self, mod: tvm.IRModule, info: tvm.transform.PassInfo) -> None:
        del mod
        self.running.append(info.name)
        if self.progress is not None:
            self.progress.update(self.where())

    def run_after_pass(self, mod: tvm.IRModule, info: tvm.transform.PassInfo) -> None:
        del mod
        if self.running and self.running[-1] == info.name:
            self.running.pop()

    def parts(self) -> tuple[str | None, str | None]:
        """The innermost running phase (``plus.<phase>``) and pass, None where there is none."""
        phases = [n[len("plus.") :] for n in self.running if n.startswith("plus.")]
        passes = [n for n in self.running if not n.startswith(("plus.", "tvm_", "plus_"))]
        return (phases[-1] if phases else None, passes[-1] if passes else None)

    def where(self) -> str:
        phase_name, pass_name = self.parts()
        phase = f"phase {phase_name}" if phase_name else "pipeline"
        return f"{phase}, pass {pass_name}" if pass_name else phase


@contextlib.contextmanager
def _naming_the_pass(
    tracker: _PassTracker, options: Options | None = None, codegen: bool = False
):
    """Turn an unexpected error inside a pass into an :class:`InternalCompileError` naming the
    phase and the pass, and the option that avoids it unless ``options`` (the compile's) has
    it already (user errors and interrupts pass through unchanged)."""
    try:
        yield
    except (PlusError, KeyboardInterrupt, MemoryError):
        raise
    except Exception as err:  # noqa: BLE001 - re-raised, naming the phase and the pass
        interrupt.check()
        found = service_error(err)  # a pass met a bad constant (an index out of range)
        if found is not None:
            raise found from None
        lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
        reason = f"{type(err).__name__}: {lines[-1] if lines else ''}"
        where = tracker.where() if tracker.running else ("code generation" if codegen else "?")
        avoid = avoiding_options.hint(*tracker.parts(), options) if tracker.running else ""
        raise InternalCompileError(f"internal error in {where}: {reason}{avoid}") from err


def inspect(
    mod_or_model: object,
    target: object = "llvm",
    options: Options | None = None,
    *,
    pipeline: str = "plus",
    example_args: object = None,
    example_kwargs: dict | None = None,
    dynamic_shapes: object = None,
) -> dict[str, object]:
    """Statistics of compiling ``mod_or_model`` (no machine code is generated).

    Returns the stats dict of DESIGN.md section 3: ``model``, ``target``, ``pipeline``, ``ops``,
    ``kernels``, ``fusion_ratio``, ``library_calls``, ``patterns``, ``groups``, ``compile_s``.
    """
    options = options or Options()
    with interrupt.guard(), quiet.filtered(not options.verbose):
        if options.dump_ir:
            _writable_folder(options.dump_ir, "dump_ir")
        export = {"example_kwargs": example_kwargs, "dynamic_shapes": dynamic_shapes}
        loaded = _load(mod_or_model, example_args, options, export)
        tgt = resolve_target(target)
        options = resolve_inputs(tgt, options)
        dumper = PhaseDumper(options.dump_ir, PHASE_NAMES) if options.dump_ir else None
        recorder = PipelineRecorder()
        progress = CompileProgress(loaded.name)
        try:
            mod, stats = pre_lowering(loaded, tgt, options, pipeline, dumper, recorder, progress)
            if _graphs(tgt, pipeline):  # the CUDA-graph passes run for their report
                stats["cuda_graph"] = _capture_report(mod, tgt, options, recorder, dumper)
        finally:
            progress.close()
        return stats


def _capture_report(
    mod: tvm.IRModule,
    target: tvm.target.Target,
    options: Options,
    recorder: PipelineRecorder,
    dumper: PhaseDumper | None,
) -> dict[str, object]:
    """``stats["cuda_graph"]`` of :func:`inspect`: phases 5-6 run as Relax passes for it."""
    try:
        _post_lowering(mod, target, options, [recorder, *([dumper] if dumper else [])])
    except InternalCompileError as err:
        if not isinstance(err.__cause__, TVM_REFUSAL):
            raise
        return _refused(options, err.__cause__)  # as the build would fail
    return _cuda_graph_stats(recorder, options)


def compile(  # noqa: A001 - the public name of the contract
    model: object,
    target: object = "llvm",
    example_args: object = None,
    options: Options | None = None,
    *,
    pipeline: str = "plus",
    example_kwargs: dict | None = None,
    dynamic_shapes: object = None,
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
    example_args : tuple or dict, optional
        Example inputs for torch modules (a dict: keyword inputs by name).
    options : Options, optional
        Pipeline settings (``train_mode``: what a torch module in training mode gets).
    example_kwargs : dict, optional
        Example keyword inputs for torch modules (``torch.export.export``'s ``kwargs``).
    dynamic_shapes : optional
        Passed to ``torch.export.export`` (``{"x": {0: torch.export.Dim("batch")}}``): the
        compiled model takes any size of those dims (within the ``Dim``'s bounds).

    Returns
    -------
    CompiledModel
    """
    options = options or Options()
    with interrupt.guard(), quiet.filtered(not options.verbose):
        export = {"example_kwargs": example_kwargs, "dynamic_shapes": dynamic_shapes}
        return _compile(model, target, example_args, options, pipeline, export)


def _compile(
    model: object,
    target: object,
    example_args: object,
    options: Options,
    pipeline: str,
    export: dict,
) -> CompiledModel:
    if options.dump_ir:
        _writable_folder(options.dump_ir, "dump_ir")
    tgt = resolve_target(target)
    loaded = _load(model, example_args, options, export)
    weight_names = [p.name for p in loaded.mod["main"].params[num_inputs(loaded.mod) :]]
    missing = [n for n in weight_names if n not in loaded.params]
    if missing:
        more = " ..." if len(missing) > 5 else ""
        raise ModelLoadError(
            f"{loaded.name}: no values for weight parameter(s) {missing[:5]}{more}; "
            "pass (IRModule, params) as the frontends return them"
        )
    start = time.perf_counter()
    options = resolve_inputs(tgt, options)
    dumper = PhaseDumper(options.dump_ir, PHASE_NAMES) if options.dump_ir else None
    recorder = PipelineRecorder()
    progress = CompileProgress(loaded.name)
    fallback = pipeline == "plus" and options.schedule_fallback
    before = BeforeSchedule() if fallback else None
    try:
        mod, stats = pre_lowering(
            loaded, tgt, options, pipeline, dumper, recorder, progress, before
        )
        post = (
            phase_passes(tgt, options, _POST)
            if pipeline == "plus"
            else tvm_post_lowering_passes(tgt)
        )
        tracker = _PassTracker(progress)
        instruments = [recorder, tracker] + ([dumper] if dumper is not None else [])
        specs = input_specs(loaded.mod)
        mod = with_signature(mod, signature_text(specs, len(weight_names)))
        with _context(instruments), _naming_the_pass(tracker, options, codegen=True):
            executable, fallbacks = schedule_fallback.build(
                mod,
                tgt,
                tvm.transform.Sequential(post, name=f"{pipeline}.post"),
                before.mod if before is not None else None,
                lambda m: tvm.transform.Sequential(schedule_phase(tgt, options, tvm_rules=True))(m),
            )
    finally:
        progress.close()
    if fallbacks:  # kernels whose plus schedule TVM could not build: built with TVM's own
        stats["schedule_fallbacks"] = [f.to_dict() for f in fallbacks]
    if _graphs(tgt, pipeline):
        stats["cuda_graph"] = _cuda_graph_stats(recorder, options)
    stats["compile_s"] = round(time.perf_counter() - start, 3)
    params = [loaded.params[name] for name in weight_names]
    sources = [
        WeightSource(*loaded.weight_tensors[n]) if n in loaded.weight_tensors else None
        for n in weight_names
    ]
    params = share_tied_weights(params, sources)
    baked = [WeightSource(name, tensor) for name, tensor in loaded.baked_tensors]
    names = model_io_names(loaded, specs)
    source = dataclasses.replace(loaded, params={})  # (the weights: held by the model alone)
    return CompiledModel(executable, tgt, params, specs, stats, source, sources, baked, io=names)


def model_io_names(loaded: LoadedModel, specs: list[InputSpec]) -> ModelIO:
    """The names a compiled model's inputs and outputs are called by, and the outputs'
    structure (the model's own where the frontend read them, else the Relax function's)."""
    from . import output_structure
    from .loader import output_count

    structure = loaded.output_structure or output_structure.flat(output_count(loaded.mod))
    return ModelIO(
        loaded.input_names or [s.name for s in specs],
        loaded.output_names or output_structure.leaf_names(structure),
        structure,
    )


def with_signature(mod: tvm.IRModule, text: str) -> tvm.IRModule:
    """``mod`` with the function :data:`SIGNATURE_FUNCTION` returning ``text``: the executable
    then carries its own signature, which ``plus_tvm.load`` compares with the model's json."""
    bb = relax.BlockBuilder()
    with bb.function(SIGNATURE_FUNCTION, []):
        bb.emit_func_output(tvm.ir.StringImm(text))
    out = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs, global_infos=mod.global_infos)
    out[SIGNATURE_FUNCTION] = bb.get()[SIGNATURE_FUNCTION]
    return out


def _load(model: object, example_args: object, options: Options, export: dict) -> LoadedModel:
    """The model imported (a torch module exported with ``export``'s ``example_kwargs`` and
    ``dynamic_shapes``), in the precision the options ask for."""
    from .reduced_precision import in_precision

    loaded = load_model(
        model,
        example_args,
        train_mode=options.train_mode,
        host_fallback=options.host_fallback,
        **export,
    )
    converted = in_precision(loaded, options.precision)
    if converted is loaded:
        return loaded
    # (the same inputs and outputs: their names and structure are the model's)
    names = ("input_names", "output_names", "output_structure")
    return dataclasses.replace(converted, **{n: getattr(loaded, n) for n in names})


def _writable_folder(folder: str, what: str) -> None:
    """Create ``folder`` if needed and check it can be written, before any work is done."""
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as err:
        raise OutputWriteError(f"{what}: cannot create folder {folder}: {err.strerror}") from None
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise OutputWriteError(f"{what}: folder {folder} is not writable: {err.strerror}") from None
