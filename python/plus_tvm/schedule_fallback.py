"""A kernel whose plus schedule TVM cannot build falls back to the schedule TVM's own pipeline
gives it (DESIGN.md: plus must never fail where TVM's own pipeline succeeds).

Phase 4's rules (GIR, ``ParallelSpatialLLVM``, ...) can emit a schedule that the schedule
primitives accept but TVM's TIR lowering or code generation then refuses ("Nested parallel loop
is not supported", a vector ``Let`` bound twice, BF16StorageLegalize's dtype mismatch on a
``bfloat16x32`` store). :func:`build` compiles the scheduled module as usual; only when TVM's
TIR build fails (after the Relax passes finished) does it look for the kernels responsible:
it bisects the kernels phase 4 scheduled, building each half alone for the target, down to
the kernels that fail alone. Each is replaced by its unscheduled form (the module before phase
4, captured by :class:`BeforeSchedule`) given the schedule TVM's own pipeline would give it
(``reschedule``: phase 4 with TVM's rules: none on CPU, dlight's on GPU; plus's semantic passes
of that phase still run), and the module is built again. The success path costs nothing more
than one reference to the module before phase 4.

Only the errors TVM raises while building are caught (:data:`BUILD_ERRORS`, from
``tvm.compile`` once the Relax pipeline is done, where no plus code runs), and a kernel counts
as responsible only when it fails built alone: anything else is re-raised as it came.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import tvm
from tvm import tirx

from . import interrupt
from .errors import TVM_REFUSAL, PlusError

# What TVM's TIR lowering and code generation raise on an IR they refuse: its InternalError
# (a RuntimeError), ValueError, and the TypeError of its IR constructors (a bfloat16 value
# stored into the uint16 storage BF16StorageLegalize made of its buffer)
BUILD_ERRORS = (*TVM_REFUSAL, TypeError)
SCHEDULE_PHASE = "plus.schedule"


class ScheduleFallbackError(PlusError, RuntimeError):
    """A kernel failed to build with plus's schedule and again with TVM's own; the message
    names the kernel (PrimFunc) and carries the first error (also its ``__cause__``)."""


@dataclass(frozen=True)
class Fallback:
    """One kernel built with TVM's schedule instead of plus's, and why."""

    function: str
    error: str  # the first line of the error building it with plus's schedule

    def to_dict(self) -> dict[str, str]:
        return {"function": self.function, "error": self.error}


@tvm.instrument.pass_instrument
class BeforeSchedule:
    """Keeps the module as phase 4 (``plus.schedule``) receives it: the kernels unscheduled."""

    def __init__(self) -> None:
        self.mod: tvm.IRModule | None = None

    def run_before_pass(self, mod: tvm.IRModule, info: tvm.transform.PassInfo) -> None:
        if info.name == SCHEDULE_PHASE:
            self.mod = mod


@tvm.instrument.pass_instrument
class _AfterRelax:
    """Keeps the module the Relax pipeline named ``name`` returns: what TVM's TIR build takes
    (None while that pipeline has not finished: a failure then is not a build's)."""

    def __init__(self, name: str) -> None:
        self.pipeline = name
        self.mod: tvm.IRModule | None = None

    def run_after_pass(self, mod: tvm.IRModule, info: tvm.transform.PassInfo) -> None:
        if info.name == self.pipeline:
            self.mod = mod


def build(
    mod: tvm.IRModule,
    target: tvm.target.Target,
    relax_pipeline: tvm.transform.Pass,
    unscheduled: tvm.IRModule | None,
    reschedule: Callable[[tvm.IRModule], tvm.IRModule],
) -> tuple[object, list[Fallback]]:
    """``tvm.compile(mod, target, relax_pipeline=...)``, with the kernels that fail to build
    rebuilt with TVM's schedule (module docstring).

    Parameters
    ----------
    mod : IRModule
        Phase 4's output (never modified).
    unscheduled : IRModule or None
        The module before phase 4 (:class:`BeforeSchedule`); None: no fallback.
    reschedule : callable
        Gives a module of unscheduled PrimFuncs TVM's schedule for ``target``.

    Returns
    -------
    (executable, fallbacks): the kernels that fell back, empty when the first build succeeded.
    """
    watch = _AfterRelax(relax_pipeline.info.name)
    try:
        with _with_instrument(watch):
            return tvm.compile(mod, target, relax_pipeline=relax_pipeline), []
    except BUILD_ERRORS as err:
        interrupt.check()
        if unscheduled is None or watch.mod is None:
            raise  # no fallback asked for, or a Relax pass failed: not a schedule's build
        original = err
    candidates = _scheduled_here(mod, unscheduled)
    failing = _failing(watch.mod, sorted(candidates), target)
    if not failing:
        raise original  # no kernel phase 4 scheduled fails alone
    fallbacks = [Fallback(name, _first_line(error)) for name, error in failing]
    names = [f.function for f in fallbacks]
    gvars = {gv.name_hint: gv for gv in mod.get_global_vars()}
    with _clean_context(), target:
        rescheduled = reschedule(tvm.IRModule({gvars[n]: unscheduled[n] for n in names}))
    replaced = {gv.name_hint: f for gv, f in rescheduled.functions_items()}
    functions = {gv: replaced.get(gv.name_hint, f) for gv, f in mod.functions_items()}
    rebuilt = tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)
    try:
        executable = tvm.compile(rebuilt, target, relax_pipeline=relax_pipeline)
    except BUILD_ERRORS as err:
        interrupt.check()
        raise ScheduleFallbackError(
            f"kernel(s) {', '.join(names)} failed to build with plus's schedule "
            f"({fallbacks[0].error}) and again with TVM's own for {target.kind.name} "
            f"({_first_line(err)})"
        ) from original
    listed = "; ".join(f"{f.function} ({f.error})" for f in fallbacks)
    warnings.warn(
        f"plus's schedule of {len(names)} kernel(s) failed to build, built with TVM's own "
        f"schedule instead: {listed}",
        RuntimeWarning,
        stacklevel=2,
    )
    return executable, fallbacks


def _scheduled_here(mod: tvm.IRModule, unscheduled: tvm.IRModule) -> set[str]:
    """Names of the kernels phase 4 scheduled (unscheduled before it, scheduled after)."""
    before = {gv.name_hint: f for gv, f in unscheduled.functions_items()}
    return {
        gv.name_hint
        for gv, f in mod.functions_items()
        if isinstance(f, tirx.PrimFunc)
        and _is_scheduled(f)
        and isinstance(before.get(gv.name_hint), tirx.PrimFunc)
        and not _is_scheduled(before[gv.name_hint])
    }


def _failing(
    lowered: tvm.IRModule, names: list[str], target: tvm.target.Target
) -> list[tuple[str, Exception]]:
    """The kernels of ``names`` that fail to build alone, with their errors: halves built
    alone, a half that builds cleared whole (a few builds where one kernel fails among many;
    for CUDA each build is an nvcc run)."""
    functions = {gv.name_hint: f for gv, f in lowered.functions_items()}
    names = [n for n in names if isinstance(functions.get(n), tirx.PrimFunc)]
    found: list[tuple[str, Exception]] = []

    def visit(group: list[str]) -> None:
        error = _build_error({n: functions[n] for n in group}, target)
        if error is None:
            return
        if len(group) == 1:
            found.append((group[0], error))
            return
        half = len(group) // 2
        visit(group[:half])
        visit(group[half:])

    if names:
        visit(names)
    return found


def _build_error(functions: dict, target: tvm.target.Target) -> Exception | None:
    """What TVM raises building ``functions`` alone for ``target`` (None: they build)."""
    sub = tvm.IRModule({name: f for name, f in functions.items()})
    try:
        with _clean_context():
            tvm.tirx.build(sub, target=target)
    except BUILD_ERRORS as err:
        interrupt.check()
        return err
    return None


def _clean_context() -> tvm.transform.PassContext:
    """The caller's config without its instruments: the probe builds and the fallback's
    schedule are no part of the pipeline's record (its statistics, its failing pass)."""
    cur = tvm.transform.PassContext.current()
    return tvm.transform.PassContext(opt_level=cur.opt_level, config=dict(cur.config))


def _with_instrument(instrument: object) -> tvm.transform.PassContext:
    cur = tvm.transform.PassContext.current()
    return tvm.transform.PassContext(
        opt_level=cur.opt_level,
        config=dict(cur.config),
        instruments=[*cur.instruments, instrument],
    )


def _is_scheduled(func: tirx.PrimFunc) -> bool:
    return bool(func.attrs is not None and func.attrs.get("tirx.is_scheduled", False))


def _first_line(err: BaseException) -> str:
    """The message's first line (its last when TVM prefixed a backtrace)."""
    lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
    if not lines:
        return type(err).__name__
    line = lines[-1] if lines[0].startswith("Traceback") else lines[0]
    return line[:300]
