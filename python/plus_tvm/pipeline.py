"""The plus pipeline: six phases, each a function returning a list of passes.

Pipeline as data, in the style of TVM's ``relax/backend/<target>/pipeline.py`` and mlc-llm's
phases: a user can take one phase, replace it, or run a single pass in their own
``tvm.transform.Sequential``. Each phase runs as a named ``Sequential`` (``plus.<phase>``) so
instruments (IR dumps, timing) see phase boundaries.

Phase contents today (later work replaces phases one by one, and says so here):

1. dispatch  - ``ProveSlicesInbound`` (symbolic slices without clamps their bounds rule
               out), ``FullAsBroadcast`` (TVM cannot legalize ``full``),
               ``FoldStaticSubgraphs``, ``WrapTakeIndices`` (no gather reads outside
               its table), ``GlobalPoolToMean``, ``Conv1dAsConv2d`` (the 2-D
               convolution entries take 1-D ones), ``CanonicalizeBatchMatmul``,
               ``SimplifyViews``, ``SinkRowReshapes`` (batch above 1: a linear's
               epilogue on its rows), ``SimplifyViews``, ``CanonicalizeSDPA``,
               ``FoldPadIntoConv``, ``ConvertToChannelsLast`` (CPU:
               convolutions and what lies between them in NHWC); ``PlusDispatch``
               (PluS +Graph matching, warehouse library calls) when
               ``dispatch`` is on; ``EliminateCommonSubexpr`` (one binding per distinct
               value); TVM's library dispatch for the target (sort/scan)
2. legalize  - ``LegalizeOps``, ``AnnotateTIROpPattern``, ``AnnotateMapPattern`` (mapping
               classes of paper 004 on every PrimFunc), ``FoldConstant``
3. fuse      - ``DPFuseOps`` (mapping-type rules + plan search of paper 004) + ``FuseTIR``;
               ``fusion=tvm``: TVM's ``FuseOps`` + ``FuseTIR``
4. schedule  - ``ExpandIntegerPower`` (``pow(x, 2)`` as ``x * x``: CUDA's fast-math
               ``powf`` is NaN for negative ``x``); ``gir`` (default ``auto``: CPU on, GPU
               off): GIR plans of paper 002 for memory-intensive kernels (``GIRLLVM`` on
               CPU, then ``ParallelSpatialLLVM`` for the large element-wise blocks of what
               GIR declined; ``GIRCUDA`` on GPU, before dlight); GPU:
               ``RecomputeReductionCUDA`` (a squeeze-excite gate: small reductions recomputed
               per thread of the large epilogue), then dlight rules (Matmul, GEMV,
               Reduction, GeneralReduction, Fallback); CPU with ``gir=off``: none; then
               ``PropagateNaN`` (``propagate_nan``: float max / min return NaN for a NaN
               operand, as torch)
5. lower     - dataflow lowering (``RewriteDataflowReshape`` ... ``CallTIRRewrite``)
6. finalize  - on CUDA with ``cuda_graph`` auto (default) or always: ``DeclareCaptureVars``,
               ``StageGraphInputs`` / ``StageGraphOutputs`` (model inputs and returned
               tensors get planned buffers and one copy, so every kernel can be captured),
               ``RewriteViewBuiltins`` (static reshape host calls as views), memory
               planning, ``RewriteCUDAGraph``; with auto all of it inside
               ``SelectCUDAGraphRegions`` (a region kept only where its estimated saving
               pays); ``RouteCUDAGraphRuntime`` (replay with fallback, measured decision
               with auto); otherwise memory planning; then VM lowering
"""

from __future__ import annotations

import os
from collections.abc import Callable

import tvm
from tvm import relax

from .options import Options
from .target import resolve_target

PhaseFn = Callable[[tvm.target.Target, Options], list[tvm.transform.Pass]]


def _is_gpu(target: tvm.target.Target) -> bool:
    return "gpu" in target.keys


def dispatch_phase(
    target: tvm.target.Target, options: Options, record_calls: bool = False
) -> list[tvm.transform.Pass]:
    """Phase 1: +Graph identification and warehouse library calls (``dispatch``), then TVM's
    own library dispatch for the target."""
    from .passes import (
        CanonicalizeBatchMatmul,
        CanonicalizeSDPA,
        Conv1dAsConv2d,
        ConvertToChannelsLast,
        FoldPadIntoConv,
        FoldStaticSubgraphs,
        FullAsBroadcast,
        GlobalPoolToMean,
        ProveSlicesInbound,
        SimplifyViews,
        SinkRowReshapes,
        WrapTakeIndices,
    )

    # identity views, zero pads and pads a convolution can do itself out of the way first:
    # each would be a kernel of its own
    channels_last = options.channels_last(target)
    # input-independent chains (masks and position tables from arange) computed once here
    # slices of a symbolic length (torch.export's Dim) without clamps their bounds rule out:
    # shapes built from them stay known (first: the folding and views need them)
    # full() as a broadcast of its value: TVM's legalization of full() fails (its dtype)
    passes: list[tvm.transform.Pass] = [ProveSlicesInbound(), FullAsBroadcast()]
    if options.fold_constants:
        passes.append(FoldStaticSubgraphs())
    passes += [
        WrapTakeIndices(),  # gathers never read outside their table
        GlobalPoolToMean(),
        Conv1dAsConv2d(),  # the 2-D convolution entries and layout plan then apply
        # batched matmuls over the 4-D operands torch flattened: loops the mask's loops match
        CanonicalizeBatchMatmul(),
        SimplifyViews(),
        # row regroupings below the row-wise epilogues of a linear (batch > 1), then folded
        SinkRowReshapes(),
        SimplifyViews(),
        # SDPA's decomposition (operand scales, safe softmax) in the attention entry's form
        CanonicalizeSDPA(),
        FoldPadIntoConv(asymmetric=channels_last),
    ]
    if channels_last:
        passes += [
            # tuples of a value and its unused companion (max_pool2d's indices) dissolved, so
            # that the layout flows through them
            relax.transform.CanonicalizeBindings(),
            relax.transform.DeadCodeElimination(),
            ConvertToChannelsLast(),
        ]
    if options.dispatch:
        from .costmodel import DispatchCost
        from .passes import PlusDispatch
        from .pattern_warehouse import load_warehouse

        # with GIR schedules the TIR side of memory-bound subgraphs runs near copy bandwidth
        cost = DispatchCost(tir_gbps=8.0 if options.gir_enabled(target) else 1.0)
        if options.cost_model == "learned":
            cost = _learned_cost(target, options, cost)
        cost = cost if options.dispatch_cost_model else None
        nan = options.propagate_nan
        # loaded here, not inside the pass: an error in a user's entry then reaches the caller
        # as the WarehouseError naming the file and line (TVM's pass manager would turn it
        # into a bare RuntimeError)
        warehouse = load_warehouse(options.warehouse, env_dirs=options.warehouse_env)
        passes.append(
            PlusDispatch(
                warehouse=warehouse,
                cost=cost,
                propagate_nan=nan,
                conv_winograd=options.conv_winograd,
                machine=_kernel_machine(target, options),
                record_calls=record_calls,
            )
        )
        if options.merge_linears:
            from .passes import MergeSiblingLinears

            passes.append(MergeSiblingLinears())
        passes.append(SimplifyViews())
    # one binding per distinct value: the Q, K and V linears each flatten the same normalized
    # activation, and three identical reshapes became three outputs of the norm's kernel
    passes.append(relax.transform.EliminateCommonSubexpr())
    return passes + list(relax.pipeline.library_dispatch_passes(target))


def _learned_cost(target: tvm.target.Target, options: Options, fallback):  # noqa: ANN001, ANN202
    from .costmodel import LearnedDispatchCost
    from .costmodel.learned import LearnedCostModel

    model = LearnedCostModel.load(options.cost_model_file or _cost_model_path(target))
    return LearnedDispatchCost(model, fallback=fallback)


def _kernel_machine(target: tvm.target.Target, options: Options):  # noqa: ANN202
    """Where the kernels run, as the learned cost model describes it."""
    from .costmodel.features import KernelContext
    from .gir.model import runtime_threads, target_lanes

    threads = options.threads or runtime_threads(options.cpu_parallel)
    return KernelContext(options.gir_enabled(target), target_lanes(target), threads)


def _cost_model_path(target: tvm.target.Target) -> str:
    """The learned model for ``target`` (:func:`plus_tvm.costmodel.learned.model_path`)."""
    from .costmodel.learned import CostModelError, model_path
    from .gir.model import figures_key

    kind = target.kind.name
    path = model_path(kind, figures_key(target))
    if path is None:
        raise CostModelError(
            f"cost_model=learned: no cost model for target kind {kind!r} (none calibrated on "
            f"this machine, none shipped); run `plus-tvm calibrate --target {kind}` or set "
            "cost_model_file"
        )
    return path


def legalize_phase(target: tvm.target.Target, options: Options) -> list[tvm.transform.Pass]:
    """Phase 2: lower Relax ops to TIR PrimFuncs and annotate them for fusion."""
    del target
    from .passes import AnnotateMapPattern

    passes = [
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        AnnotateMapPattern(),
    ]
    if options.fold_constants:
        passes.append(relax.transform.FoldConstant())
    return passes


def fuse_phase(target: tvm.target.Target, options: Options) -> list[tvm.transform.Pass]:
    """Phase 3: group kernels and merge each group into one PrimFunc."""
    if options.fusion == "tvm":
        return [relax.transform.FuseOps(), relax.transform.FuseTIR()]
    from .passes import DPFuseOps

    model = machine = None
    if options.fusion_cost == "learned":
        from .costmodel.learned import LearnedCostModel

        model = LearnedCostModel.load(options.cost_model_file or _cost_model_path(target))
        machine = _kernel_machine(target, options)
    return [
        DPFuseOps(
            search=options.fusion_search,
            rules=options.fusion_rules,
            max_group_size=options.fusion_max_group_size,
            alpha=None if options.fusion_alpha < 0 else options.fusion_alpha,
            beta=options.fusion_beta,
            seed=options.fusion_seed,
            explain=options.fusion_explain,
            cost=options.fusion_cost,
            model=model,
            machine=machine,
        ),
        relax.transform.FuseTIR(),
    ]


def schedule_phase(target: tvm.target.Target, options: Options) -> list[tvm.transform.Pass]:
    """Phase 4: integer powers as products (``ExpandIntegerPower``: CUDA's fast ``powf`` is NaN for
    negative bases), TensorIR schedules for the fused kernels (GIR rules first with ``gir``),
    then NaN-propagating ``max`` / ``min`` (``propagate_nan``)."""
    from .passes import ExpandIntegerPower

    return [ExpandIntegerPower()] + _schedule_passes(target, options) + _nan_passes(target, options)


def _schedule_passes(target: tvm.target.Target, options: Options) -> list[tvm.transform.Pass]:
    from tvm.s_tir import dlight as dl

    from .passes import ApplyScheduleRules

    if _is_gpu(target):
        from .schedules import RecomputeReductionCUDA

        gir = []
        if options.gir_enabled(target):
            from .schedules import GIRCUDA

            gir = [GIRCUDA(budget=options.gir_search_budget, machine=gir_machine(target, options))]
        return [
            ApplyScheduleRules(
                *gir,
                RecomputeReductionCUDA(),
                dl.gpu.Matmul(),
                dl.gpu.GEMV(),
                dl.gpu.Reduction(),
                dl.gpu.GeneralReduction(),
                dl.gpu.Fallback(),
            )
        ]
    if options.gir_enabled(target):
        from .schedules import GIRLLVM, ParallelSpatialLLVM

        rule = GIRLLVM(
            budget=options.gir_search_budget,
            machine=gir_machine(target, options),
            ranker=_plan_ranker(target, options),
        )
        return [ApplyScheduleRules(rule, ParallelSpatialLLVM())]
    return []


def _plan_ranker(target: tvm.target.Target, options: Options):  # noqa: ANN202
    """The learned ranking of GIR plans (``gir_cost="learned"``), else None."""
    if options.gir_cost != "learned":
        return None
    from .costmodel.gir_cost import LearnedPlanRanker
    from .costmodel.learned import CostModelError, LearnedCostModel

    model = LearnedCostModel.load(options.cost_model_file or _cost_model_path(target))
    try:
        return LearnedPlanRanker(model, _kernel_machine(target, options))
    except ValueError as err:
        raise CostModelError(str(err)) from None


def gir_machine(target: tvm.target.Target, options: Options):  # noqa: ANN202
    """The GIR performance model's figures from the options (unresolved ones as
    :func:`resolve_inputs` would resolve them now)."""
    from .gir.model import machine_for

    given = {
        k: v
        for k, v in (
            ("global_gbps", options.gir_global_gbps),
            ("cache_gbps", options.gir_cache_gbps),
            ("launch_us", options.gir_launch_us),
        )
        if v
    }
    return machine_for(target, given or None, options.threads)


def resolve_inputs(target: tvm.target.Target, options: Options) -> Options:
    """``options`` with every compile input that is not in the model read now and written
    into its fields: the folders of ``$PLUS_TVM_WAREHOUSE`` (``warehouse_env``), the cost
    model (``cost_model="auto"``: learned where this machine has a calibration) and a learned
    model's file and identity (``cost_model_file``, ``cost_model_id``), and for CPU
    targets the pool the parallel loops run on (``cpu_parallel``: ``"tvm"`` where OpenMP was
    asked for and the native library is unavailable), the GIR model's stored figures for it
    (``gir_global_gbps``, ``gir_cache_gbps``, ``gir_launch_us``) and its size (``threads``).
    Fields already set (by the caller, or by an earlier call: resolving twice reads nothing
    again) are kept. Both :func:`pipeline` and
    ``plus_tvm.compile`` run the phases with the resolved options, so ``stats["options"]``
    and :meth:`Options.digest` name everything that shaped the compiled code."""
    from .pattern_warehouse import env_folders

    changes: dict[str, object] = {}
    if options.warehouse_env is None:
        changes["warehouse_env"] = env_folders()
    if options.cost_model == "auto":
        from .costmodel.learned import user_path
        from .gir.model import figures_key

        calibrated = os.path.exists(user_path(target.kind.name, figures_key(target)))
        options = options.replace(cost_model="learned" if calibrated else "analytic")
        changes["cost_model"] = options.cost_model
    learned = "learned" in (options.cost_model, options.fusion_cost, options.gir_cost)
    if learned and not options.cost_model_id:
        from .costmodel.learned import LearnedCostModel

        path = options.cost_model_file or _cost_model_path(target)
        model = LearnedCostModel.load(path)
        if model.kind and model.kind != target.kind.name:
            from .costmodel.learned import CostModelError

            raise CostModelError(
                f"{path}: a cost model for target kind {model.kind!r}, not {target.kind.name!r}"
            )
        changes["cost_model_file"] = path
        changes["cost_model_id"] = model.identity
    if target.kind.name == "llvm":
        from .gir.model import cpu_figures, parallel_pool, runtime_threads

        pool = parallel_pool(options.cpu_parallel)
        if pool != options.cpu_parallel:  # OpenMP asked for, the native library unavailable
            changes["cpu_parallel"] = pool
        fields = {
            "gir_global_gbps": "global_gbps",
            "gir_cache_gbps": "cache_gbps",
            "gir_launch_us": "launch_us",
        }
        unset = [name for name in fields if not getattr(options, name)]
        if unset:  # read only when unset
            figures = cpu_figures(target, pool)
            changes.update({name: figures[fields[name]] for name in unset})
        if not options.threads:
            threads = runtime_threads(pool)
            if threads:
                changes["threads"] = threads
    return options.replace(**changes) if changes else options


def _nan_passes(target: tvm.target.Target, options: Options) -> list[tvm.transform.Pass]:
    if not options.propagate_nan:
        return []
    from .passes import PropagateNaN

    return [PropagateNaN(keep_reductions=_is_gpu(target))]


def lower_phase(target: tvm.target.Target, options: Options) -> list[tvm.transform.Pass]:
    """Phase 5: leave dataflow form; reshapes become views, call_tir becomes explicit DPS."""
    del target, options
    return [
        relax.transform.RewriteDataflowReshape(),
        relax.transform.ToNonDataflow(),
        relax.transform.RemovePurityChecking(),
        relax.transform.CallTIRRewrite(),
    ]


def finalize_phase(target: tvm.target.Target, options: Options) -> list[tvm.transform.Pass]:
    """Phase 6: memory planning, CUDA graph capture (CUDA), lowering to VM builtins."""
    graphs = target.kind.name == "cuda" and options.cuda_graph != "off"
    plan = [relax.transform.StaticPlanBlockMemory()]
    passes = capture_passes(target, options) if graphs else plan
    passes += [
        relax.transform.LowerAllocTensor(),
        relax.transform.KillAfterLastUse(),
        relax.transform.LowerRuntimeBuiltin(),
        relax.transform.ComputePrimValue(),
        relax.transform.VMShapeLower(),
        relax.transform.AttachGlobalSymbol(),
    ]
    return passes


def capture_passes(target: tvm.target.Target, options: Options) -> list[tvm.transform.Pass]:
    """Phase 6's CUDA-graph part: bounded symbolic sizes declared for capture per value,
    model inputs and returned tensors staged so every kernel can be captured and static
    ``vm.builtin.reshape`` host calls made views the rewrite sees through (PyGraph 4.1),
    memory planning and TVM's capture rewrite; with ``cuda_graph=auto`` inside
    ``SelectCUDAGraphRegions`` (regions kept where the estimate says they pay, PyGraph 4.3);
    last, capture calls routed through plus_tvm's runtime (fallback, measured decision)."""
    from .passes import (
        DeclareCaptureVars,
        RewriteCUDAGraph,
        RewriteViewBuiltins,
        RouteCUDAGraphRuntime,
        SelectCUDAGraphRegions,
        StageGraphInputs,
        StageGraphOutputs,
    )

    capture = [
        DeclareCaptureVars(max_sizes=options.cuda_graph_max_sizes),
        StageGraphInputs(target),
        StageGraphOutputs(target),
        RewriteViewBuiltins(),
        relax.transform.StaticPlanBlockMemory(),
        RewriteCUDAGraph(enabled=True),
    ]
    auto = options.cuda_graph == "auto"
    if auto:
        capture = [SelectCUDAGraphRegions(capture, [relax.transform.StaticPlanBlockMemory()])]
    return capture + [RouteCUDAGraphRuntime(measure=auto, options_digest=options.digest())]


PHASES: tuple[tuple[str, PhaseFn], ...] = (
    ("dispatch", dispatch_phase),
    ("legalize", legalize_phase),
    ("fuse", fuse_phase),
    ("schedule", schedule_phase),
    ("lower", lower_phase),
    ("finalize", finalize_phase),
)
PHASE_NAMES = tuple(name for name, _ in PHASES)


def phase_passes(
    target: tvm.target.Target, options: Options, phases: tuple[str, ...] = PHASE_NAMES
) -> list[tvm.transform.Pass]:
    """The named phases as ``Sequential`` passes called ``plus.<phase>``, in pipeline order."""
    unknown = set(phases) - set(PHASE_NAMES)
    if unknown:
        raise ValueError(f"unknown phase(s) {sorted(unknown)}; phases are {list(PHASE_NAMES)}")
    return [
        tvm.transform.Sequential(fn(target, options), name=f"plus.{name}")
        for name, fn in PHASES
        if name in phases
    ]


def pipeline(
    target: str | dict | tvm.target.Target | None = None, options: Options | None = None
) -> tvm.transform.Pass:
    """The whole plus pipeline as one pass.

    Parameters
    ----------
    target : str, dict or tvm.target.Target, optional
        The target; when omitted it is read from ``tvm.target.Target.current()`` at run time
        (``tvm.compile`` enters the target), falling back to the host CPU.
    options : Options, optional
        Pipeline settings; defaults to ``Options()``.

    Returns
    -------
    tvm.transform.Pass
        A module pass usable in ``tvm.compile(mod, target, relax_pipeline=...)`` or inside a
        user's ``tvm.transform.Sequential``.
    """
    options = options or Options()
    fixed = resolve_target(target) if target is not None else None

    @tvm.transform.module_pass(opt_level=0, name="PlusPipeline")
    def _plus_pipeline(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        tgt = fixed or tvm.target.Target.current(allow_none=True) or resolve_target("llvm")
        with tgt:
            phases = phase_passes(tgt, resolve_inputs(tgt, options))
            if not options.dump_ir:
                return tvm.transform.Sequential(phases, name="plus")(mod)
            for number, phase in enumerate(phases, 1):
                mod = phase(mod)
                dump_phase(options.dump_ir, number, phase.info.name, mod)
            return mod

    return _plus_pipeline


def dump_phase(folder: str, number: int, pass_name: str, mod: tvm.IRModule) -> str:
    """Write ``mod`` to ``<folder>/<number>_<phase>.py`` (``Options.dump_ir``); returns the path."""
    os.makedirs(folder, exist_ok=True)
    phase = pass_name[len("plus.") :] if pass_name.startswith("plus.") else pass_name
    path = os.path.join(folder, f"{number:02d}_{phase}.py")
    with open(path, "w") as f:
        f.write(mod.script(show_meta=False))
    return path


def tvm_pipeline(target: str | dict | tvm.target.Target | None = None) -> tvm.transform.Pass:
    """TVM's own default Relax pipeline for the target (the ``--pipeline tvm`` baseline)."""
    tgt = resolve_target(target)
    return tvm.transform.Sequential(
        tvm_pre_lowering_passes(tgt) + tvm_post_lowering_passes(tgt), name="tvm_default"
    )


def _tvm_backend(target: tvm.target.Target):
    """The module of TVM's own per-target pipeline (``tvm.relax.backend.<kind>.pipeline``).

    Imported directly because ``relax.pipeline.dataflow_lower_passes`` is broken in 0.27: the
    backend packages do not export ``dataflow_lower_passes``.
    """
    import importlib

    kind = target.kind.name
    family = (
        kind if kind in ("cuda", "rocm") else ("gpu_generic" if _is_gpu(target) else "cpu_generic")
    )
    return importlib.import_module(f"tvm.relax.backend.{family}.pipeline")


def tvm_pre_lowering_passes(target: tvm.target.Target) -> list[tvm.transform.Pass]:
    """TVM's default pipeline up to (not including) dataflow lowering, for kernel statistics."""
    backend = _tvm_backend(target)
    return list(backend.library_dispatch_passes(target)) + list(backend.legalize_passes(target))


def tvm_post_lowering_passes(target: tvm.target.Target) -> list[tvm.transform.Pass]:
    """The rest of TVM's default pipeline: dataflow lowering and finalization."""
    backend = _tvm_backend(target)
    return list(backend.dataflow_lower_passes(target)) + list(backend.finalize_passes(target))


def _register() -> None:
    """Make ``relax.get_pipeline("plus", target=..., options=...)`` work (once per process)."""
    from tvm.relax import pipeline as relax_pipeline

    if "plus" not in relax_pipeline.PIPELINE_MAP:
        relax_pipeline.register_pipeline("plus")(pipeline)


_register()
