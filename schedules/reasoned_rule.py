"""ReasonedRule: the base of plus's schedule rules, which say why they decline a kernel.

dlight's ``ScheduleRule.apply`` returns a schedule or ``None``. plus's rules implement
``apply_with_reason(func, target) -> (schedule or None, reason)`` instead, from the same
analysis that decides, and ``ApplyScheduleRules`` reports the reasons per rule in the stats
(``schedule.declined_because``); ``apply`` is defined here once for TVM's callers.
"""

from __future__ import annotations

import json

import tvm
from plus_tvm.errors import TVM_REFUSAL
from tvm import s_tir, tirx
from tvm.s_tir.dlight.base.schedule_rule import ScheduleRule

# why a rule declines a function whose blocks it cannot reach
OPAQUE = "no schedulable root block (opaque code)"

# a function attribute a rule may set on its schedule to say how it chose it (a JSON object);
# ``ApplyScheduleRules`` moves it into its report (``schedule.notes``, per kernel) and drops it
NOTE_ATTR = "plus.schedule_note"


def with_note(sch: s_tir.Schedule, note: dict) -> s_tir.Schedule:
    """``sch``'s function carrying ``note`` (see ``NOTE_ATTR``)."""
    return s_tir.Schedule(sch.mod["main"].with_attr(NOTE_ATTR, json.dumps(note, sort_keys=True)))


class ReasonedRule(ScheduleRule):
    """A schedule rule whose ``apply_with_reason`` says why it declined."""

    def apply(self, func: tirx.PrimFunc, target: tvm.target.Target, _tunable: bool):
        return self.apply_with_reason(func, target)[0]

    def apply_with_reason(self, func: tirx.PrimFunc, target: tvm.target.Target):
        """The schedule, or ``None`` and why (``ApplyScheduleRules`` reports it)."""
        raise NotImplementedError

    @staticmethod
    def root_blocks(func: tirx.PrimFunc) -> tuple[s_tir.Schedule, list] | None:
        """A schedule of ``func`` and the blocks under its root, or ``None`` for opaque code
        (the rule then declines with ``OPAQUE``)."""
        try:
            sch = s_tir.Schedule(func)
            return sch, sch.get_child_blocks(sch.get_sblock("root"))
        except TVM_REFUSAL:  # opaque functions are not ours to schedule
            return None
