"""One typed, frozen options object for every plus_tvm knob.

``Options`` is the single place where the pipeline's behaviour is configured. It is hashable and
has a stable :meth:`Options.digest` so it can key caches; the CLI sets any field with
``--opt KEY=VALUE``; a value outside a field's choices is rejected with a message naming them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import typing
from dataclasses import dataclass, field

from .errors import OptionsError

FUSION_CHOICES = ("dp", "tvm")
FUSION_SEARCH_CHOICES = ("dp", "greedy")
FUSION_RULES_CHOICES = ("mapping", "tvm")
CUDA_GRAPH_CHOICES = ("auto", "off", "always")
GIR_CHOICES = ("auto", "on", "off")
CONV_LAYOUT_CHOICES = ("auto", "nchw", "nhwc")
COST_MODEL_CHOICES = ("auto", "analytic", "learned")
FUSION_COST_CHOICES = ("bytes", "learned")
GIR_COST_CHOICES = ("analytic", "learned")
CPU_PARALLEL_CHOICES = ("openmp", "tvm")
PRECISION_CHOICES = ("fp32", "bf16", "fp16")
TRAIN_MODE_CHOICES = ("refuse", "eval")


@dataclass(frozen=True)
class Options:
    """Settings of the plus pipeline.

    Parameters
    ----------
    fusion : {"dp", "tvm"}
        Fusion algorithm of phase 3: the mapping-type plan search of paper 004 (``DPFuseOps``)
        or TVM's ``FuseOps``.
    fusion_search : {"dp", "greedy"}
        With ``fusion="dp"``: algorithm 2 of paper 004, or one greedy scan (ablation).
    fusion_rules : {"mapping", "tvm"}
        With ``fusion="dp"``: table 1's mapping-type rules, or TVM's op-pattern rules inside
        the plan search (the ablation's Rule_T; ``fusion=tvm`` is Rule_T with greedy search,
        TVM's own FuseOps).
    fusion_max_group_size : int
        Most kernels fused into one.
    fusion_alpha, fusion_beta : float
        Weights of the cost model (eq. 8): memory traffic (``alpha``; ``< 0`` normalises by
        the block's total traffic) and group-size variance (``beta``).
    fusion_seed : int
        Seed of algorithm 2's randomised scans (results are deterministic).
    fusion_explain : bool
        Report in the stats (``fusion_explain``) why each remaining dependence between two
        kernels was not fused: the rule, the size limit, convexity or the cost model.
    fusion_cost : {"bytes", "learned"}
        What prices a fusion plan: eq. 8 (the bytes crossing kernels, ``fusion_alpha`` /
        ``fusion_beta``) or the learned cost model's predicted time of each fused kernel (the
        model of ``cost_model_file``; ``stats["fusion_cost"]`` compares the two plans).
    dispatch : bool
        Phase 1: identify +Graphs and dispatch them to warehouse implementations.
    dispatch_cost_model : bool
        Keep TIR for a matched subgraph when the cost model predicts it faster than the
        library call (tiny GEMMs and rows, where the VM -> library crossing dominates); off:
        every subgraph an implementation can express becomes a library call.
    cost_model : {"auto", "analytic", "learned"}
        What prices the library-vs-TIR choice: the roofline constants of
        ``costmodel.DispatchCost``, or the xgboost kernel-time model ``plus-tvm calibrate``
        trains on this machine (its predicted times per choice in ``stats["dispatch"]
        ["decisions"]``); ``auto``: learned where this machine has been calibrated for the
        target (a model in the user's cache), else analytic (resolved at compile time).
    cost_model_file : str or None
        The learned model's file (``cost_model``, ``fusion_cost`` and ``gir_cost``); unset:
        this machine's calibration for the target kind in the user's cache, else the model
        shipped with the package (resolved at compile time).
    cost_model_id : str
        Hash of the learned model's file, filled in at compile time (it enters
        :meth:`digest`); empty where nothing uses a learned model.
    merge_linears : bool
        Phase 1, after dispatch: library linears on one input (Q/K/V, gate/up) become one GEMM
        over the joined weights (``MergeSiblingLinears``). Off by default: on the 2-core
        machine it measured within noise (BERT-base 0.98-1.01x, T5 1.01x, LLaMA 1.02x).
    warehouse : tuple of str
        Extra warehouse entry folders (``NAME.toml`` files, see ``plus_tvm.pattern_warehouse``),
        loaded after the shipped entries and the folders of ``warehouse_env``.
    warehouse_env : tuple of str or None
        The folders of ``$PLUS_TVM_WAREHOUSE``. None (default): read from the environment when
        compilation starts (:func:`plus_tvm.compile_inputs.resolve_inputs`), so that the options a
        compile ran with (``stats["options"]``, :meth:`digest`) name every folder it read.
    gir : {"auto", "on", "off"} or bool
        Phase 4: schedule memory-intensive kernels (norms, softmax, activations, transposes,
        reductions, matrix-vector products) through GIR plans of PowerFusion (paper 002):
        ``GIRLLVM`` on CPU, ``GIRCUDA`` before dlight's rules on GPU. ``"auto"`` (default):
        on for CPU targets, off for GPU targets (the CUDA schedules have been compiled and
        their source checked, but not yet run on a GPU). ``True``/``False`` mean on/off.
    gir_search_budget : int
        Most GIR candidate graphs the search evaluates per kernel (0: all of them; they are
        few, and the performance model's lower bound stops the search early).
    gir_cost : {"analytic", "learned"}
        What ranks a kernel's GIR plans on CPU: the performance model (paper 002's bytes per
        memory level, synchronizations, occupancy), or the learned cost model's ``gir_plan``
        regressor (the model of ``cost_model_file``) over the performance model's best four
        (``costmodel.gir_cost``; ``stats["gir_plans"]`` lists the predictions).
    gir_global_gbps, gir_cache_gbps : float
        CPU copy bandwidths (memory, and in cache per core; GB/s) of the GIR performance model.
        0 (default): the measurement ``python -m plus_tvm.gir.model`` stored for the target,
        else the model's defaults, read when compilation starts.
    gir_launch_us : float
        Microseconds the GIR performance model charges a parallel loop for its launch on the
        pool of ``cpu_parallel`` (so that small kernels run on one core). 0 (default): as the
        bandwidths, the stored measurement for that pool, else the default measured on the CI
        machine type (OpenMP 1 us, TVM's pool 30 us).
    threads : int
        Threads the CPU schedules plan their parallel loops for. 0 (default): the pool's when
        compilation starts (OpenMP's as torch sets it, or TVM's, which ``plus_tvm.threads``
        sizes).
    cpu_parallel : {"openmp", "tvm"}
        The thread pool the generated kernels' parallel loops run on, on CPU. ``"openmp"``
        (default): OpenMP's, the pool oneDNN (the library kernels) and torch use, so one team
        of threads runs the whole model, awake between kernels
        (``runtime/native/parallel_launch.cc``; TVM's pool where the native library is
        unavailable); ``"tvm"``: TVM's own pool, as TVM runs them.
    conv_layout : {"auto", "nchw", "nhwc"}
        Phase 1: the layout the convolutions and the operators between them run in.
        ``"nhwc"`` rewrites NCHW models to channels last (``ConvertToChannelsLast``; the layout
        changes once at the trunk's edges) and folds every zero pad, symmetric or not, into the
        convolution; ``"nchw"`` keeps the model's layout. ``"auto"`` (default): NHWC on CPU
        targets, where oneDNN's convolutions run channels last (MobileNetV2's 52 convolutions:
        1.6 ms NHWC against 9.8 ms through ATen in NCHW), NCHW on GPU targets (cuDNN, measured
        on an H100 in NCHW).
    cuda_graph : {"auto", "off", "always"}
        Phase 6 on CUDA targets (ignored elsewhere): capture static kernel runs into CUDA
        graphs (model inputs and outputs staged so every kernel can be). ``"auto"``
        (default): keep a region only where the compile-time estimate says its replay saves
        more than it costs (``SelectCUDAGraphRegions``), then on the GPU measure each kept
        region with and without its graph on first call and keep the faster, cached per GPU,
        module and options (``plus_tvm.runtime.cuda_graph``); ``"always"``: replay every
        region; ``"off"``: no graphs. A capture that fails at run time falls back to running
        the region without a graph, with one warning.
    cuda_graph_max_sizes : int
        Phase 6: a symbolic size whose bounds (``tir_var_upper_bound``, and
        ``tir_var_lower_bound`` or 1) allow at most this many values is captured per value (one
        graph per size, ``DeclareCaptureVars``); a wider or unbounded one ends the capture
        region (its kernels run without a graph). 0: never.
    cuda_graph_costs : str
        The launch and copy costs ``cuda_graph=auto``'s compile-time selection prices regions
        with (``costmodel.graph_cost``): ``"auto"`` (default): the calibration measured on the
        target's GPU (the target's ``model`` attribute, else its ``arch``) in
        ``cuda_graph_costs_file``, else the constants; a GPU name (``"NVIDIA H200"``): that
        GPU's calibration; ``"constants"``: the built-in figures. Resolved to a GPU name or
        ``"constants"`` when compilation starts (``stats["cuda_graph"]["selection"]["costs"]``).
    cuda_graph_costs_file : str or None
        A CUDA-graph calibration file (``run.sh OUT --calibrate`` writes ``graph_costs.json``
        on the GPU machine); None: the calibrations shipped with the package.
    fold_constants : bool
        Run ``FoldStaticSubgraphs`` in phase 1 (input-independent chains computed at compile
        time) and ``FoldConstant`` after legalization (TVM's default does the latter).
    conv_winograd : bool
        The native convolution computes a wide 3x3 stride-1 layer as Winograd F(4x4, 3x3) or
        F(2x2, 3x3), by its channels and output size (1.1-2.4x oneDNN's direct convolution on
        such layers here; ``runtime/native/winograd.h`` says where each runs); off: always
        direct.
    schedule_fallback : bool
        A kernel whose phase-4 schedule TVM's TIR lowering or code generation refuses is
        built with the schedule TVM's own pipeline gives it (none on CPU, dlight's on GPU),
        named in ``stats["schedule_fallbacks"]`` with its error and one warning
        (:mod:`plus_tvm.schedule_fallback`); off: such a kernel fails the compile.
    propagate_nan : bool
        Phase 4: float ``max`` / ``min`` in the generated kernels (ReLU, clip, max pooling,
        max reductions) return NaN when an operand is NaN, as torch does (``PropagateNaN``);
        off: TVM's semantics, which drop a NaN operand.
    precision : {"fp32", "bf16", "fp16"}
        Run a float32 torch model in reduced precision, as TensorRT's ``--fp16`` does: its
        weights converted once at compile time, matrix products and convolutions accumulating
        in float32, norms / softmax / reductions in float32 (one table:
        ``plus_tvm.torch_half.FLOAT32_OPS``), inputs and outputs still float32
        (:mod:`plus_tvm.reduced_precision`). ``fp32`` (default): the model's own dtypes.
    train_mode : {"refuse", "eval"}
        A torch module left in training mode whose graph behaves differently in training
        (dropout, batch norm with batch statistics): ``"refuse"`` (default) raises an error
        naming the module and saying to call ``model.eval()``; ``"eval"`` compiles an
        eval-mode copy (the user's module keeps its mode; the weights stay shared).
    host_fallback : bool
        A torch node whose ATen op has no converter runs on the host through torch eager (a
        graph break, warned once per op, listed in ``stats["host_nodes"]``;
        :mod:`plus_tvm.torch_host_fallback`), an ONNX node none converts through ONNX's
        reference implementation; off: such a node fails the compile, naming it.
    dump_ir : str or None
        Folder to which the IR after each pipeline phase is written (debugging aid).
    verbose : bool
        Keep every warning and native log line of a compile. Off (default): torch's and TVM's
        FutureWarning / DeprecationWarning are ignored and TVM's log lines about its own
        internals dropped (:mod:`plus_tvm.quiet`); anything else still reaches stderr.
    """

    fusion: str = "dp"
    fusion_search: str = "dp"
    fusion_rules: str = "mapping"
    fusion_max_group_size: int = 64
    fusion_alpha: float = -1.0
    fusion_beta: float = 0.0
    fusion_seed: int = 0
    fusion_explain: bool = False
    fusion_cost: str = "bytes"
    dispatch: bool = True
    dispatch_cost_model: bool = True
    cost_model: str = "auto"
    cost_model_file: str | None = None
    cost_model_id: str = ""
    merge_linears: bool = False
    warehouse: tuple[str, ...] = field(default_factory=tuple)
    warehouse_env: tuple[str, ...] | None = None
    gir: str = "auto"
    gir_search_budget: int = 0
    gir_cost: str = "analytic"
    gir_global_gbps: float = 0.0
    gir_cache_gbps: float = 0.0
    gir_launch_us: float = 0.0
    threads: int = 0
    cpu_parallel: str = "openmp"
    conv_layout: str = "auto"
    conv_winograd: bool = True
    cuda_graph: str = "auto"
    cuda_graph_max_sizes: int = 32
    cuda_graph_costs: str = "auto"
    cuda_graph_costs_file: str | None = None
    fold_constants: bool = True
    propagate_nan: bool = True
    schedule_fallback: bool = True
    precision: str = "fp32"
    train_mode: str = "refuse"
    host_fallback: bool = True
    dump_ir: str | None = None
    verbose: bool = False

    def __post_init__(self) -> None:
        for name in ("warehouse", "warehouse_env"):
            value = getattr(self, name)
            if isinstance(value, (list, str)):
                object.__setattr__(self, name, tuple([value] if isinstance(value, str) else value))
        _check_choice("fusion", self.fusion, FUSION_CHOICES)
        _check_choice("cuda_graph", self.cuda_graph, CUDA_GRAPH_CHOICES)
        _check_choice("conv_layout", self.conv_layout, CONV_LAYOUT_CHOICES)
        _check_choice("cpu_parallel", self.cpu_parallel, CPU_PARALLEL_CHOICES)
        _check_choice("precision", self.precision, PRECISION_CHOICES)
        _check_choice("train_mode", self.train_mode, TRAIN_MODE_CHOICES)
        _check_choice("cost_model", self.cost_model, COST_MODEL_CHOICES)
        gir = self.gir
        if isinstance(gir, bool):
            gir = "on" if gir else "off"
        elif isinstance(gir, str) and gir.lower() in _TRUE | _FALSE:
            gir = "on" if gir.lower() in _TRUE else "off"
        _check_choice("gir", gir, GIR_CHOICES)
        object.__setattr__(self, "gir", gir)
        _check_choice("fusion_search", self.fusion_search, FUSION_SEARCH_CHOICES)
        _check_choice("fusion_rules", self.fusion_rules, FUSION_RULES_CHOICES)
        _check_choice("fusion_cost", self.fusion_cost, FUSION_COST_CHOICES)
        _check_choice("gir_cost", self.gir_cost, GIR_COST_CHOICES)
        if not isinstance(self.fusion_max_group_size, int) or self.fusion_max_group_size < 1:
            raise OptionsError(
                f"option fusion_max_group_size must be a positive integer, "
                f"got {self.fusion_max_group_size!r}"
            )
        for name in ("gir_global_gbps", "gir_cache_gbps", "gir_launch_us"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise OptionsError(f"option {name} must be a non-negative number, got {value!r}")
            object.__setattr__(self, name, float(value))
        for name in ("gir_search_budget", "cuda_graph_max_sizes", "threads"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise OptionsError(f"option {name} must be a non-negative integer, got {value!r}")
        for name in (
            "dispatch",
            "dispatch_cost_model",
            "fold_constants",
            "merge_linears",
            "fusion_explain",
            "conv_winograd",
            "propagate_nan",
            "schedule_fallback",
            "host_fallback",
        ):
            if not isinstance(getattr(self, name), bool):
                raise OptionsError(
                    f"option {name} must be true or false, got {getattr(self, name)!r}"
                )
        for name in ("fusion_alpha", "fusion_beta"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise OptionsError(f"option {name} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise OptionsError(f"option {name} must be finite, got {value!r}")
            object.__setattr__(self, name, float(value))
        if not isinstance(self.fusion_seed, int) or isinstance(self.fusion_seed, bool):
            raise OptionsError(f"option fusion_seed must be an integer, got {self.fusion_seed!r}")
        if not isinstance(self.cuda_graph_costs, str) or not self.cuda_graph_costs:
            raise OptionsError(
                "option cuda_graph_costs must be 'auto', 'constants' or a calibrated GPU's "
                f"name, got {self.cuda_graph_costs!r}"
            )
        for name in ("cost_model_file", "dump_ir", "cuda_graph_costs_file"):  # a path, or None
            value = getattr(self, name)
            if isinstance(value, os.PathLike):
                object.__setattr__(self, name, os.fspath(value))
            elif value is not None and not isinstance(value, str):
                raise OptionsError(f"option {name} must be a path (a string), got {value!r}")
        if not isinstance(self.cost_model_id, str):
            raise OptionsError(f"option cost_model_id must be a string, got {self.cost_model_id!r}")
        for name in ("warehouse", "warehouse_env"):
            value = getattr(self, name)
            if value is None and name == "warehouse_env":
                continue
            if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
                raise OptionsError(f"option {name} must be folder paths (strings), got {value!r}")

    # ------------------------------------------------------------------ helpers
    def gir_enabled(self, target: object) -> bool:
        """Whether GIR schedules run for ``target`` (a ``tvm.target.Target``)."""
        if self.gir == "auto":
            return getattr(getattr(target, "kind", None), "name", "") == "llvm"
        return self.gir == "on"

    def channels_last(self, target: object) -> bool:
        """Whether convolutions run in NHWC for ``target`` (a ``tvm.target.Target``)."""
        if self.conv_layout == "auto":
            return getattr(getattr(target, "kind", None), "name", "") == "llvm"
        return self.conv_layout == "nhwc"

    def replace(self, **changes: object) -> Options:
        """Return a copy with some fields changed (validated like the constructor)."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise OptionsError(f"unknown option(s) {sorted(unknown)}; known: {field_names()}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, object]:
        """The options as a JSON-serialisable dict."""
        return {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def digest(self) -> str:
        """A stable hash of the options (same across processes and Python versions)."""
        text = json.dumps(self.to_dict(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @classmethod
    def from_pairs(cls, pairs: typing.Iterable[str], base: Options | None = None) -> Options:
        """Build options from ``KEY=VALUE`` strings (the CLI's ``--opt``).

        Values are parsed by the field's type: booleans accept true/false/1/0/yes/no, tuples take
        comma-separated items, ``none`` clears an optional field.
        """
        base = base or cls()
        hints = typing.get_type_hints(cls)
        changes: dict[str, object] = {}
        for pair in pairs:
            if "=" not in pair:
                raise OptionsError(f"--opt expects KEY=VALUE, got {pair!r}")
            key, raw = (s.strip() for s in pair.split("=", 1))
            key = key.replace("-", "_")
            if key not in hints:
                raise OptionsError(f"unknown option {key!r}; known: {field_names()}")
            changes[key] = _parse_value(key, raw, hints[key])
        return base.replace(**changes)


def field_names() -> list[str]:
    """Names of every ``Options`` field."""
    return [f.name for f in dataclasses.fields(Options)]


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise OptionsError(f"option {name}={value!r} is not one of {list(choices)}")


def _jsonable(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _parse_value(key: str, raw: str, hint: object) -> object:
    if hint is bool:
        low = raw.lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise OptionsError(f"option {key} must be true or false, got {raw!r}")
    args = typing.get_args(hint)
    if raw.lower() == "none" and type(None) in args:
        return None
    optional = [a for a in args if a is not type(None)] if type(None) in args else []
    if typing.get_origin(hint) is tuple or [typing.get_origin(a) for a in optional] == [tuple]:
        return tuple(item.strip() for item in raw.split(",") if item.strip())
    if hint in (int, float):
        try:
            return hint(raw)
        except ValueError:
            raise OptionsError(f"option {key} must be a number, got {raw!r}") from None
    return raw
