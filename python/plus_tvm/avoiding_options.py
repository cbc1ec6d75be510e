"""Which option compiles a model without the part of the pipeline that failed on it.

An internal error names its phase and pass (:mod:`plus_tvm.compiler`); :func:`avoiding_option`
turns that into the option a user can set to go on while the bug is fixed. Kept as data: the
pass name first (the most precise), then the phase.
"""

from __future__ import annotations

from .options import Options

# pass name (as TVM's PassInfo names it) -> the option that leaves that pass out
BY_PASS: dict[str, str] = {
    "PlusDispatch": "dispatch=false",
    "MergeSiblingLinears": "merge_linears=false",
    "FoldStaticSubgraphs": "fold_constants=false",
    "FoldConstant": "fold_constants=false",
    "ConvertToChannelsLast": "conv_layout=nchw",
    "DPFuseOps": "fusion=tvm",
    "ApplyScheduleRules": "gir=off",
    "PropagateNaN": "propagate_nan=false",
    "SelectCUDAGraphRegions": "cuda_graph=off",
    "RewriteCUDAGraph": "cuda_graph=off",
    "RouteCUDAGraphRuntime": "cuda_graph=off",
    "StageGraphInputs": "cuda_graph=off",
    "StageGraphOutputs": "cuda_graph=off",
    "DeclareCaptureVars": "cuda_graph=off",
}
# phase name (``plus.<phase>``) -> the option that leaves most of that phase out
BY_PHASE: dict[str, str] = {
    "dispatch": "dispatch=false",
    "fuse": "fusion=tvm",
    "schedule": "gir=off",
    "finalize": "cuda_graph=off",
}


def avoiding_option(phase: str | None, pass_name: str | None) -> str | None:
    """The ``key=value`` option that compiles without the failing part, or None if none does."""
    if pass_name and pass_name in BY_PASS:
        return BY_PASS[pass_name]
    if phase and phase in BY_PHASE:
        return BY_PHASE[phase]
    return None


def hint(phase: str | None, pass_name: str | None, options: Options | None = None) -> str:
    """The sentence an internal error ends with: the option that avoids the failing part; TVM's
    own pipeline where ``options`` (the compile's) already set that option; '' where no option
    avoids the part."""
    option = avoiding_option(phase, pass_name)
    if option is None:
        return ""
    if options is not None and _in_effect(option, options):
        return (
            f" It failed with {option} already set; TVM's own pipeline may compile the "
            "model: --pipeline tvm (Python: plus_tvm.compile(..., pipeline='tvm'))."
        )
    key, value = option.split("=", 1)
    return (
        f" To compile without that part while it is fixed: --opt {option} "
        f"(Python: Options({key}={_python_value(value)}))."
    )


def _in_effect(option: str, options: Options) -> bool:
    key = option.split("=", 1)[0]
    return getattr(Options.from_pairs([option]), key) == getattr(options, key)


def _python_value(value: str) -> str:
    if value in ("true", "false"):
        return value.capitalize()
    return repr(value)
