"""The plus pipeline: six phases, each a function returning its list of passes.

Pipeline as data (TVM's ``relax/backend/<target>/pipeline.py``, mlc-llm's phases): a user can
take one phase, replace it, or run a single pass in their own ``tvm.transform.Sequential``. Each
phase runs as a ``Sequential`` named ``plus.<phase>``, so instruments (IR dumps, statistics)
see its boundaries. These lists are the one inventory of the pipeline's passes: each pass's
comment says why it is where it is; its module says how it works.

The phases take options already resolved (:func:`plus_tvm.compile_inputs.resolve_inputs`):
nothing here reads the machine or the environment.
"""

from __future__ import annotations

from collections.abc import Callable

import tvm
from tvm import relax

from . import compile_inputs
from .ir_dump import dump_phase
from .options import Options
from .target import resolve_target

PhaseFn = Callable[[tvm.target.Target, Options], list[tvm.transform.Pass]]


def _is_gpu(target: tvm.target.Target) -> bool:
    return "gpu" in target.keys


def dispatch_phase(
    target: tvm.target.Target, options: Options, record_calls: bool = False
) -> list[tvm.transform.Pass]:
    """Phase 1: every form of a pattern brought to its warehouse entry's form, then +Graph
    identification and library calls (PluS), then TVM's library dispatch (sort / scan).
    ``record_calls``: the dispatch report lists each call with its cost-model vectors."""
    from . import passes as p

    channels_last = options.channels_last(target)
    passes = [
        # symbolic slices (torch.export's Dim) whose bounds rule out the clamps keep plain
        # shapes: first, the folding and the views below need them
        p.ProveSlicesInbound(),
        p.FullAsBroadcast(),  # full() as a broadcast: TVM 0.27 cannot legalize full()
    ]
    if options.fold_constants:
        passes.append(p.FoldStaticSubgraphs())  # masks, position tables: computed once here
    passes += [
        p.WrapTakeIndices(),  # -n..-1 count from the end, as in torch and ONNX
        # every gather / scatter index in range: checked on the host (CPU), clamped (GPU)
        p.CheckIndexBounds(on_host=not _is_gpu(target)),
        p.GlobalPoolToMean(),
        p.Conv1dAsConv2d(),  # the 2-D convolution entries and the layout plan then apply
        p.CanonicalizeBatchMatmul(),  # batched matmuls over the 4-D operands torch flattened
        p.SimplifyViews(),  # identity views, zero pads, chains of views as one reshape
        p.SinkRowReshapes(),  # row regroupings below a linear's row-wise epilogue (batch > 1)
        p.SimplifyViews(),
        p.CanonicalizeSDPA(),  # SDPA's decomposition in the attention entry's form
        p.FoldPadIntoConv(asymmetric=channels_last),  # zero pads become convolution padding
    ]
    if channels_last:
        passes += [
            # a value's unused tuple companion (max_pool2d's indices) dissolved, so the
            # layout flows through it
            relax.transform.CanonicalizeBindings(),
            relax.transform.DeadCodeElimination(),
            p.ConvertToChannelsLast(),  # convolutions and what lies between them in NHWC
        ]
    if options.dispatch:
        passes += _library_dispatch(target, options, record_calls)
    # one binding per distinct value: the Q, K and V linears each flatten the same normalized
    # activation, and three identical reshapes became three outputs of the norm's kernel
    passes.append(relax.transform.EliminateCommonSubexpr())
    return passes + list(relax.pipeline.library_dispatch_passes(target))


def _library_dispatch(
    target: tvm.target.Target, options: Options, record_calls: bool
) -> list[tvm.transform.Pass]:
    from . import passes as p
    from .pattern_warehouse import load_warehouse

    # loaded here, not inside the pass: an error in a user's entry reaches the caller as the
    # WarehouseError naming its file and line (the pass manager would make it a RuntimeError)
    warehouse = load_warehouse(options.warehouse, env_dirs=options.warehouse_env)
    dispatch = p.PlusDispatch(
        warehouse=warehouse,
        cost=compile_inputs.dispatch_cost(target, options),
        propagate_nan=options.propagate_nan,
        conv_winograd=options.conv_winograd,
        machine=compile_inputs.kernel_machine(target, options),
        record_calls=record_calls,
    )
    merge = [p.MergeSiblingLinears()] if options.merge_linears else []  # Q/K/V as one GEMM
    return [dispatch, *merge, p.SimplifyViews()]


def legalize_phase(target: tvm.target.Target, options: Options) -> list[tvm.transform.Pass]:
    """Phase 2: Relax operators to TIR PrimFuncs, annotated for fusion."""
    del target
    from .passes import AnnotateMapPattern

    passes = [
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        AnnotateMapPattern(),  # paper 004's mapping class on every PrimFunc
    ]
    if options.fold_constants:
        passes.append(relax.transform.FoldConstant())
    return passes


def fuse_phase(target: tvm.target.Target, options: Options) -> list[tvm.transform.Pass]:
    """Phase 3: group kernels (paper 004's mapping-type rules and plan search, or TVM's
    ``FuseOps`` with ``fusion=tvm``) and merge each group into one PrimFunc."""
    if options.fusion == "tvm":
        return [relax.transform.FuseOps(), relax.transform.FuseTIR()]
    from .passes import DPFuseOps

    learned = options.fusion_cost == "learned"
    fuse = DPFuseOps(
        search=options.fusion_search,
        rules=options.fusion_rules,
        max_group_size=options.fusion_max_group_size,
        alpha=None if options.fusion_alpha < 0 else options.fusion_alpha,
        beta=options.fusion_beta,
        seed=options.fusion_seed,
        explain=options.fusion_explain,
        cost=options.fusion_cost,
        model=compile_inputs.learned_model(target, options) if learned else None,
        machine=compile_inputs.kernel_machine(target, options) if learned else None,
    )
    return [fuse, relax.transform.FuseTIR()]


def schedule_phase(
    target: tvm.target.Target, options: Options, *, tvm_rules: bool = False
) -> list[tvm.transform.Pass]:
    """Phase 4: TensorIR schedules for the fused kernels, GIR rules (paper 002) first.
    ``tvm_rules``: the schedule TVM's own pipeline gives instead (none on CPU, dlight's default
    rules on GPU), plus's semantic passes unchanged: what a kernel whose plus schedule fails to
    build falls back to (:mod:`plus_tvm.schedule_fallback`)."""
    from tvm.s_tir import dlight as dl

    from . import schedules as s
    from .passes import (
        ApplyScheduleRules,
        BindUnboundGPUBlocks,
        ExpandIntegerPower,
        InfiniteExtremeIdentity,
        PropagateNaN,
    )

    gir = options.gir_enabled(target) and not tvm_rules  # default: CPU on, GPU off
    machine = compile_inputs.gir_machine(target, options) if gir else None
    if _is_gpu(target) and tvm_rules:
        rules = [
            # TVM's default CUDA pipeline's rules, its Matmul kept off the WMMA path (segfault)
            s.MatmulWithoutTensorCores(),
            dl.gpu.GEMV(),
            dl.gpu.Reduction(),
            dl.gpu.GeneralReduction(),
            dl.gpu.Fallback(),
        ]
    elif _is_gpu(target):
        rules = [s.GIRCUDA(budget=options.gir_search_budget, machine=machine)] if gir else []
        rules += [
            s.RecomputeReductionCUDA(),  # a squeeze-excite gate recomputed per thread
            # dlight's Matmul without its WMMA path, whose tensorize segfaults in TVM 0.27
            s.MatmulWithoutTensorCores(),
            dl.gpu.GEMV(),
            dl.gpu.Reduction(),
            dl.gpu.GeneralReduction(),
            dl.gpu.Fallback(),
        ]
    elif gir:
        ranker = compile_inputs.plan_ranker(target, options)  # gir_cost=learned
        rules = [
            s.GIRLLVM(budget=options.gir_search_budget, machine=machine, ranker=ranker),
            # what GIR declines: pure data movement inlined, large element-wise blocks run
            # parallel and vectorized
            s.ParallelSpatialLLVM(),
        ]
    else:
        rules = []
    # pow(x, n) as products, pow(x, 0.5) as sqrt: CUDA's fast-math powf is NaN for x < 0
    passes = [ExpandIntegerPower()]
    if rules:
        passes.append(ApplyScheduleRules(*rules))  # first rule that applies wins
    if _is_gpu(target):
        # blocks the rules left on the host (dlight's Matmul leaves a fused function's other
        # outputs) bound to GPU threads; a kernel that cannot be bound is refused by name
        passes.append(BindUnboundGPUBlocks())
    if not _is_gpu(target):
        # a max pool / reduction over -inf returns -inf, not the lowest finite value (after
        # the schedules: rfactor and GPU reductions recognise max by its finite start)
        passes.append(InfiniteExtremeIdentity())
    if options.propagate_nan:
        # float max / min (ReLU, clip, pooling, max reductions) return NaN for NaN, as torch
        passes.append(PropagateNaN(keep_reductions=_is_gpu(target)))
    return passes


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
    """Phase 6: memory planning (with CUDA-graph capture on CUDA unless ``cuda_graph=off``),
    then lowering to VM builtins."""
    graphs = target.kind.name == "cuda" and options.cuda_graph != "off"
    plan = capture_passes(target, options) if graphs else [relax.transform.StaticPlanBlockMemory()]
    return plan + [
        relax.transform.LowerAllocTensor(),
        relax.transform.KillAfterLastUse(),
        relax.transform.LowerRuntimeBuiltin(),
        relax.transform.ComputePrimValue(),
        relax.transform.VMShapeLower(),
        relax.transform.AttachGlobalSymbol(),
    ]


def capture_passes(target: tvm.target.Target, options: Options) -> list[tvm.transform.Pass]:
    """Phase 6's CUDA-graph part (PyGraph, paper 001; Relax paper section 4.5)."""
    from . import passes as p

    capture = [
        # a symbolic size with at most cuda_graph_max_sizes values is captured per value
        p.DeclareCaptureVars(max_sizes=options.cuda_graph_max_sizes),
        p.StageGraphInputs(target),  # model inputs get planned buffers and one copy
        p.StageGraphOutputs(target),  # so do returned tensors (PyGraph 4.1)
        p.RewriteViewBuiltins(),  # static reshape host calls as views: no cut region
        relax.transform.StaticPlanBlockMemory(),
        p.RewriteCUDAGraph(enabled=True),
    ]
    auto = options.cuda_graph == "auto"
    if auto:  # a region kept only where its estimated saving pays (PyGraph 4.3)
        plain = [relax.transform.StaticPlanBlockMemory()]
        capture = [p.SelectCUDAGraphRegions(capture, plain, compile_inputs.graph_cost(options))]
    # replay with fallback on a failed capture; with auto, measured per region on first call
    return capture + [p.RouteCUDAGraphRuntime(measure=auto, options_digest=options.digest())]


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
    """The whole plus pipeline as one module pass, for ``tvm.compile(mod, target,
    relax_pipeline=...)`` or a user's ``Sequential``. ``target``: when omitted, the current
    target at run time (``tvm.compile`` enters it), else the host CPU; ``options`` (default
    ``Options()``) are resolved when the pass runs."""
    options = options or Options()
    fixed = resolve_target(target) if target is not None else None

    @tvm.transform.module_pass(opt_level=0, name="PlusPipeline")
    def _plus_pipeline(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        tgt = fixed or tvm.target.Target.current(allow_none=True) or resolve_target("llvm")
        with tgt:
            phases = phase_passes(tgt, compile_inputs.resolve_inputs(tgt, options))
            if not options.dump_ir:
                return tvm.transform.Sequential(phases, name="plus")(mod)
            for number, phase in enumerate(phases, 1):
                mod = phase(mod)
                dump_phase(options.dump_ir, number, phase.info.name, mod)
            return mod

    return _plus_pipeline


def _register() -> None:
    """Make ``relax.get_pipeline("plus", target=..., options=...)`` work (once per process)."""
    from tvm.relax import pipeline as relax_pipeline

    if "plus" not in relax_pipeline.PIPELINE_MAP:
        relax_pipeline.register_pipeline("plus")(pipeline)


_register()
