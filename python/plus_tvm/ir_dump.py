"""``Options(dump_ir=DIR)``: the IR after each pipeline phase, written to ``DIR/NN_<phase>.py``."""

from __future__ import annotations

import os

import tvm

PHASE_PREFIX = "plus."


def dump_phase(folder: str, number: int, pass_name: str, mod: tvm.IRModule) -> str:
    """Write ``mod`` to ``<folder>/<number>_<phase>.py``; returns the path."""
    os.makedirs(folder, exist_ok=True)
    phase = pass_name.removeprefix(PHASE_PREFIX)
    path = os.path.join(folder, f"{number:02d}_{phase}.py")
    with open(path, "w") as f:
        f.write(mod.script(show_meta=False))
    return path


@tvm.instrument.pass_instrument
class PhaseDumper:
    """Writes the IR after each phase (a ``Sequential`` named ``plus.<phase>``), numbered in
    pipeline order across the two halves that ``plus_tvm.compile`` runs."""

    def __init__(self, folder: str, phases: tuple[str, ...]) -> None:
        self.folder = folder
        self.phases = phases
        self.count = 0

    def run_after_pass(self, mod: tvm.IRModule, info: tvm.transform.PassInfo) -> None:
        name = info.name
        if name.startswith(PHASE_PREFIX) and name.removeprefix(PHASE_PREFIX) in self.phases:
            self.count += 1
            dump_phase(self.folder, self.count, info.name, mod)
