"""What a compile reads besides the model: resolved once into ``Options``, then passed down.

:func:`resolve_inputs` reads the machine and the environment (the warehouse folders, the cost
model this machine calibrated, the CPU pool and its measured figures) into the fields of
``Options``; ``plus_tvm.compile``, ``plus_tvm.inspect`` and ``plus_tvm.pipeline`` call it once
and hand the resolved options to the phases, so ``stats["options"]`` and
:meth:`Options.digest` name everything that shaped the compiled code. The other functions build
the objects the phases' passes take from those fields (cost models, the kernels' machine); they
read nothing the options do not say, apart from the learned model's file they name.
"""

from __future__ import annotations

import tvm

from .options import Options


def resolve_inputs(target: tvm.target.Target, options: Options) -> Options:
    """``options`` with every compile input that is not in the model read now and written
    into its fields: the folders of ``$PLUS_TVM_WAREHOUSE`` (``warehouse_env``), the cost
    model (``cost_model="auto"``: learned where this machine has a calibration) and a learned
    model's file and identity (``cost_model_file``, ``cost_model_id``), and for CPU targets
    the pool the parallel loops run on (``cpu_parallel``: ``"tvm"`` where OpenMP was asked for
    and the native library is unavailable), the GIR model's stored figures for it
    (``gir_global_gbps``, ``gir_cache_gbps``, ``gir_launch_us``) and its size (``threads``).
    For CUDA targets with ``cuda_graph="auto"``, the CUDA-graph costs (``cuda_graph_costs="auto"``:
    the calibration of the target's GPU by name, or ``"constants"``).
    Fields already set (by the caller, or by an earlier call: resolving twice reads nothing
    again) are kept."""
    from .pattern_warehouse import env_folders

    changes: dict[str, object] = {}
    if options.warehouse_env is None:
        changes["warehouse_env"] = env_folders()
    if options.cost_model == "auto":
        from .costmodel.learned import calibration
        from .gir.model import figures_key

        # (a damaged calibration is named in a warning and counts as none)
        calibrated = calibration(target.kind.name, figures_key(target)) is not None
        options = options.replace(cost_model="learned" if calibrated else "analytic")
        changes["cost_model"] = options.cost_model
    if _uses_learned_model(options) and not options.cost_model_id:
        path = options.cost_model_file or cost_model_path(target)
        model = _load_model(path, target)
        changes["cost_model_file"] = path
        changes["cost_model_id"] = model.identity
    if target.kind.name == "llvm":
        changes.update(_cpu_inputs(target, options))
    if target.kind.name == "cuda" and options.cuda_graph == "auto":
        from .costmodel.graph_cost import AUTO, resolve_graph_costs

        if options.cuda_graph_costs == AUTO:  # the target's GPU's calibration, by name
            path = options.cuda_graph_costs_file
            changes["cuda_graph_costs"] = resolve_graph_costs(target, AUTO, path)
    return options.replace(**changes) if changes else options


def _uses_learned_model(options: Options) -> bool:
    return "learned" in (options.cost_model, options.fusion_cost, options.gir_cost)


def _cpu_inputs(target: tvm.target.Target, options: Options) -> dict[str, object]:
    """The CPU pool, its GIR figures and its size, where the options leave them unset."""
    from .gir.model import cpu_figures, parallel_pool, runtime_threads

    changes: dict[str, object] = {}
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
    return changes


def cost_model_path(target: tvm.target.Target) -> str:
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


def _load_model(path: str, target: tvm.target.Target):  # noqa: ANN202
    from .costmodel.learned import CostModelError, LearnedCostModel

    model = LearnedCostModel.load(path)
    if model.kind and model.kind != target.kind.name:
        raise CostModelError(
            f"{path}: a cost model for target kind {model.kind!r}, not {target.kind.name!r}"
        )
    return model


def graph_cost(options: Options):  # noqa: ANN201
    """The launch and copy costs of the CUDA-graph selection (``cuda_graph_costs``)."""
    from .costmodel.graph_cost import graph_cost as costs

    return costs(options.cuda_graph_costs, options.cuda_graph_costs_file)


def learned_model(target: tvm.target.Target, options: Options):  # noqa: ANN201
    """The learned cost model the options name (``cost_model_file``, else this machine's)."""
    return _load_model(options.cost_model_file or cost_model_path(target), target)


def dispatch_cost(target: tvm.target.Target, options: Options):  # noqa: ANN201
    """What prices ``PlusDispatch``'s library-vs-TIR choice (None: always the library)."""
    from .costmodel import DispatchCost, LearnedDispatchCost

    if not options.dispatch_cost_model:
        return None
    # with GIR schedules the TIR side of memory-bound subgraphs runs near copy bandwidth
    cost = DispatchCost(tir_gbps=8.0 if options.gir_enabled(target) else 1.0)
    if options.cost_model == "learned":
        return LearnedDispatchCost(learned_model(target, options), fallback=cost)
    return cost


def kernel_machine(target: tvm.target.Target, options: Options):  # noqa: ANN201
    """Where the kernels run, as the learned cost model describes it."""
    from .costmodel.features import KernelContext
    from .gir.model import runtime_threads, target_lanes

    threads = options.threads or runtime_threads(options.cpu_parallel)
    return KernelContext(options.gir_enabled(target), target_lanes(target), threads)


def gir_machine(target: tvm.target.Target, options: Options):  # noqa: ANN201
    """The GIR performance model's figures from the options (the model's defaults for the
    target where a figure is unset: GPU targets, or options not resolved)."""
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


def plan_ranker(target: tvm.target.Target, options: Options):  # noqa: ANN201
    """The learned ranking of GIR plans (``gir_cost="learned"``), else None."""
    if options.gir_cost != "learned":
        return None
    from .costmodel.gir_cost import LearnedPlanRanker
    from .costmodel.learned import CostModelError

    try:
        return LearnedPlanRanker(learned_model(target, options), kernel_machine(target, options))
    except ValueError as err:
        raise CostModelError(str(err)) from None
