"""Long compiles show where they are on a terminal, and nowhere else."""

from __future__ import annotations

import io

import plus_tvm
from plus_tvm import progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_sees_the_phase_and_pass_and_the_line_is_cleared(monkeypatch):
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    screen = _Terminal()
    monkeypatch.setattr(progress.sys, "stderr", screen)
    plus_tvm.inspect("zoo:bert-base-tiny")
    text = screen.getvalue()
    assert "[plus_tvm] bert-base-tiny: phase dispatch, pass PlusDispatch" in text
    assert "phase fuse, pass DPFuseOps" in text
    assert text.endswith("\r\033[K")  # cleared at the end


def test_pipes_see_nothing(monkeypatch):
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    pipe = io.StringIO()  # not a terminal
    monkeypatch.setattr(progress.sys, "stderr", pipe)
    plus_tvm.inspect("zoo:bert-base-tiny")
    assert pipe.getvalue() == ""


def test_short_compiles_stay_silent():
    screen = _Terminal()
    line = progress.CompileProgress("m", stream=screen)
    line.update("phase dispatch")  # within DELAY_S of the start
    line.close()
    assert screen.getvalue() == ""
