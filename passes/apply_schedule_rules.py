"""ApplyScheduleRules: dlight-style schedule rules on every unscheduled PrimFunc.

TVM's ``dlight.ApplyDefaultSchedule`` writes the scheduled functions back into the module it was
given; this pass builds a new module instead, so the pipeline never mutates its input (checked by
``testing.immutable_module`` in the tests). Rules are tried in order and the first one that
returns a schedule wins (the dlight / tinygrad rule contract); a rule returning ``None``
declines (a rule with an ``apply_with_reason(func, target)`` method returning ``(schedule or
None, reason)`` says why from the same analysis: the GIR rules and ``ParallelSpatialLLVM`` do,
and the stats show the reasons per rule as ``schedule.declined_because``), and so does a rule whose
schedule TVM refuses (a ``TVMError``, e.g. a dlight rule asserting on a kernel shape it was not
written for), and so does a rule whose schedule the GPU could not run (more static shared
memory than a block may have), and so does one of plus's own GPU rules whose schedule TVM's
TIR lowering refuses (the reasons go to ``declined_because``). A rule failing with
any other error (a bug in the rule) is *reported* (module attribute ``plus.schedule``, shown
in the stats as ``schedule``, and a warning) and the next rule tries: a crashing rule never
hides as "does not apply", and never fails a compile that TVM's own pipeline would finish
(the rules are pluggable: dlight's, GIR's, a user's). Ctrl-C is never swallowed
(:mod:`plus_tvm.interrupt`).
"""

from __future__ import annotations

import json
import warnings
from collections import Counter, defaultdict

import tvm
from plus_tvm import interrupt
from plus_tvm.errors import TVM_REFUSAL
from plus_tvm.schedules.reasoned_rule import NOTE_ATTR
from plus_tvm.tir_blocks import static_shared_bytes
from tvm import s_tir, tirx
from tvm.s_tir.dlight.base.schedule_rule import ScheduleRule

REPORT_ATTR = "plus.schedule"
# static __shared__ arrays per block on NVIDIA GPUs (more only as opt-in dynamic shared memory)
STATIC_SHARED_LIMIT = 48 * 1024


@tvm.transform.module_pass(opt_level=0, name="ApplyScheduleRules")
class ApplyScheduleRules:
    """Apply the first matching schedule rule to each PrimFunc not yet scheduled.

    Parameters
    ----------
    *rules : ScheduleRule
        Rules in priority order; put the fallback last.
    """

    def __init__(self, *rules: ScheduleRule) -> None:
        self.rules = list(rules)

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        if not self.rules:
            return mod
        target = tvm.target.Target.current(allow_none=True)
        functions = {}
        changed = False
        report = _Report()
        for gvar, func in mod.functions_items():
            if isinstance(func, tirx.PrimFunc) and self.rules and not _is_scheduled(func):
                scheduled = self._schedule(gvar.name_hint, func, _func_target(func, target), report)
                if scheduled is not None:
                    func = scheduled
                    changed = True
            functions[gvar] = func
        out = (
            tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)
            if changed
            else mod
        )
        return out.with_attr(REPORT_ATTR, report.to_json())

    def _schedule(
        self, name: str, func: tirx.PrimFunc, target: tvm.target.Target, report: _Report
    ) -> tirx.PrimFunc | None:
        for rule in self.rules:
            rule_name = type(rule).__name__
            interrupt.check()
            with_reason = getattr(rule, "apply_with_reason", None)
            try:
                if with_reason is not None:
                    space, reason = with_reason(func, target)
                else:
                    space, reason = rule.apply(func, target, False), None
            except TVM_REFUSAL:
                # TVM refused a schedule primitive of the rule: it declines, the next one tries
                interrupt.check()
                report.declined[rule_name] += 1
                continue
            except AssertionError as err:
                interrupt.check()
                if _from_tvm(rule):  # dlight's rules assert on kernels they do not handle
                    report.declined[rule_name] += 1
                else:
                    report.fail(name, rule_name, err)
                continue
            except Exception as err:  # noqa: BLE001 - a rule's bug: reported, never silent
                # nor fatal: plus compiles whatever TVM's own pipeline compiles
                interrupt.check()
                report.fail(name, rule_name, err)
                continue
            if space is None:
                if reason:
                    report.declined_because[rule_name][reason] += 1
                continue
            sch = space[0] if isinstance(space, (list, tuple)) else space
            scheduled = sch.mod["main"]
            over = _over_gpu_limits(scheduled, target)
            if over:  # the GPU would refuse the kernel at load: the next rule tries
                report.declined_because[rule_name][over] += 1
                continue
            refused = "" if _from_tvm(rule) else _lowering_refuses(scheduled, target)
            if refused:  # TVM's own lowering would fail the compile: the next rule tries
                report.declined_because[rule_name][refused] += 1
                continue
            report.scheduled[rule_name] += 1
            note = scheduled.attrs.get(NOTE_ATTR) if scheduled.attrs is not None else None
            if note is not None:
                report.notes[name] = json.loads(str(note))
                scheduled = scheduled.without_attr(NOTE_ATTR)
            return scheduled.with_attr("tirx.is_scheduled", True)
        report.unscheduled += 1
        return None


class _Report:
    """What the rules did: kernels scheduled per rule, TVM refusals, and rule failures."""

    def __init__(self) -> None:
        self.scheduled: Counter = Counter()
        self.declined: Counter = Counter()
        # rule -> reason -> kernels: the reasons rules that say why give for returning None
        self.declined_because: defaultdict = defaultdict(Counter)
        self.failed: list[dict[str, str]] = []
        self.unscheduled = 0
        self.notes: dict[str, dict] = {}  # kernel -> how its rule chose the schedule

    def fail(self, kernel: str, rule: str, err: Exception) -> None:
        lines = [ln for ln in str(err).strip().splitlines() if ln.strip()]
        reason = f"{type(err).__name__}: {lines[-1].strip() if lines else ''}"[:300]
        self.failed.append({"kernel": kernel, "rule": rule, "error": reason})
        warnings.warn(
            f"schedule rule {rule} failed on kernel {kernel} ({reason}); the next rule took it",
            RuntimeWarning,
            stacklevel=2,
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "scheduled": dict(self.scheduled),
                "declined": dict(self.declined),
                "declined_because": {r: dict(c) for r, c in self.declined_because.items()},
                "failed": self.failed,
                "unscheduled": self.unscheduled,
                **({"notes": self.notes} if self.notes else {}),
            },
            sort_keys=True,
        )


def _over_gpu_limits(func: tirx.PrimFunc, target: tvm.target.Target) -> str:
    """Why a scheduled ``func`` cannot run on ``target``'s GPU ('' when it can): more static
    shared memory per thread block than a block may have (a dlight reduction rule caching a
    whole fused epilogue's input, e.g. VGG-16's pooled 512x7x7 map, 98 KiB: the CUDA module
    then fails to load, a failure no compile-time step of TVM's reports)."""
    if "gpu" not in target.keys:
        return ""
    limit = min(
        int(target.attrs.get("max_shared_memory_per_block", STATIC_SHARED_LIMIT)),
        STATIC_SHARED_LIMIT,
    )
    declared = static_shared_bytes(func)
    if declared is None or declared <= limit:
        return ""
    used = _per_block_shared_bytes(func, target)  # what lowering leaves of each buffer
    if used is not None and used > limit:
        return f"static shared memory {used} bytes over the {limit}-byte limit"
    return ""


_PLACE_AND_COMPACT = (
    s_tir.transform.LowerCrossThreadReduction,
    s_tir.transform.LowerInitBlock,
    s_tir.transform.PlanAndUpdateBufferAllocationLocation,
    s_tir.transform.ConvertBlocksToOpaque,
    s_tir.transform.CompactBufferAllocation,
)


def _per_block_shared_bytes(func: tirx.PrimFunc, target: tvm.target.Target) -> int | None:
    """The shared memory one thread block of ``func`` allocates once lowering has placed each
    buffer where it is used and compacted it to the region a block touches (the first steps of
    TVM's own lowering); ``None`` when TVM refuses those steps."""
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    try:
        with target:
            lowered = tvm.transform.Sequential([p() for p in _PLACE_AND_COMPACT])(mod)
    except TVM_REFUSAL:
        return None
    return static_shared_bytes(lowered["main"])


def _lowering_refuses(func: tirx.PrimFunc, target: tvm.target.Target) -> str:
    """Why TVM's TIR lowering for ``target``'s GPU refuses a schedule of one of plus's own rules
    ('' when it lowers). Checked only on GPU targets, where lowering rejects schedules the
    primitives accepted: a ``__syncthreads`` that ``ThreadSync`` would have to place under a
    thread-dependent condition (GIR's CUDA row schedule of a MobileViT kernel), for one."""
    if "gpu" not in target.keys:
        return ""
    from tvm.s_tir.pipeline import default_s_tir_pipeline

    lower = default_s_tir_pipeline()[0]
    main = func.with_attr("global_symbol", "main").with_attr("target", target)
    mod = tvm.IRModule({"main": main})
    try:
        with target:
            lower(mod)
    # (TVM's IR constructors raise TypeError on what its own legalization built wrong: a
    # bfloat16 value stored into the uint16 storage BF16StorageLegalize made of its buffer)
    except (*TVM_REFUSAL, TypeError) as err:
        lines = [ln for ln in str(err).strip().splitlines() if ln.strip()]
        return f"TVM's lowering refused the schedule: {lines[-1].strip() if lines else ''}"[:200]
    return ""


def _from_tvm(rule: ScheduleRule) -> bool:
    return type(rule).__module__.startswith("tvm.")


def _is_scheduled(func: tirx.PrimFunc) -> bool:
    attrs = func.attrs
    return bool(attrs is not None and attrs.get("tirx.is_scheduled", False))


def _func_target(func: tirx.PrimFunc, default: tvm.target.Target | None) -> tvm.target.Target:
    if func.attrs is not None and "target" in func.attrs:
        return func.attrs["target"]
    if default is None:
        raise ValueError("ApplyScheduleRules needs a target: run it inside `with target:`")
    return default
