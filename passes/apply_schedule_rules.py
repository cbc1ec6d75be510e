"""ApplyScheduleRules: dlight-style schedule rules on every unscheduled PrimFunc.

TVM's ``dlight.ApplyDefaultSchedule`` writes the scheduled functions back into the module it was
given; this pass builds a new module instead, so the pipeline never mutates its input (checked by
``testing.immutable_module`` in the tests). Rules are tried in order and the first one that
returns a schedule wins (the dlight / tinygrad rule contract); a rule returning ``None`` -- or
failing on a kernel it was not written for -- declines.
"""

from __future__ import annotations

import tvm
from tvm import tirx
from tvm.s_tir.dlight.base.schedule_rule import ScheduleRule


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
        target = tvm.target.Target.current(allow_none=True)
        functions = {}
        changed = False
        for gvar, func in mod.functions_items():
            if isinstance(func, tirx.PrimFunc) and self.rules and not _is_scheduled(func):
                scheduled = self._schedule(func, _func_target(func, target))
                if scheduled is not None:
                    func = scheduled
                    changed = True
            functions[gvar] = func
        if not changed:
            return mod
        return tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)

    def _schedule(self, func: tirx.PrimFunc, target: tvm.target.Target) -> tirx.PrimFunc | None:
        for rule in self.rules:
            try:
                space = rule.apply(func, target, False)
            except Exception:  # noqa: BLE001
                # dlight rules assert on kernel shapes they were not written for (e.g. a
                # matmul with a fused transpose prologue); such a rule declines, the next tries.
                continue
            if space is None:
                continue
            sch = space[0] if isinstance(space, (list, tuple)) else space
            return sch.mod["main"].with_attr("tirx.is_scheduled", True)
        return None


def _is_scheduled(func: tirx.PrimFunc) -> bool:
    attrs = func.attrs
    return bool(attrs is not None and attrs.get("tirx.is_scheduled", False))


def _func_target(func: tirx.PrimFunc, default: tvm.target.Target | None) -> tvm.target.Target:
    if func.attrs is not None and "target" in func.attrs:
        return func.attrs["target"]
    if default is None:
        raise ValueError("ApplyScheduleRules needs a target: run it inside `with target:`")
    return default
