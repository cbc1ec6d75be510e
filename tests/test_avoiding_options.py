"""An internal error ends with the option that compiles without the failing part: every
suggestion is a valid option that turns that part off, and names a pass that exists."""

from __future__ import annotations

import plus_tvm.passes as passes
import pytest
from plus_tvm import Options
from plus_tvm.avoiding_options import BY_PASS, BY_PHASE, avoiding_option, hint
from plus_tvm.pipeline import PHASE_NAMES

TVM_PASSES = {"FoldConstant"}  # TVM's own passes the pipeline runs
OFF_BY_DEFAULT = {"merge_linears=false"}  # the pass runs only when the user turned it on


@pytest.mark.parametrize("option", sorted(set(BY_PASS.values()) | set(BY_PHASE.values())))
def test_every_suggestion_is_a_valid_option_that_differs_from_the_default(option):
    chosen = Options.from_pairs([option])
    key = option.split("=", 1)[0]
    assert (getattr(chosen, key) == getattr(Options(), key)) == (option in OFF_BY_DEFAULT)


def test_every_named_pass_and_phase_exists():
    for name in BY_PASS:
        assert name in TVM_PASSES or hasattr(passes, name), name
    assert set(BY_PHASE) <= set(PHASE_NAMES)


def test_the_pass_wins_over_the_phase_and_unknown_parts_give_no_hint():
    assert avoiding_option("dispatch", "FoldStaticSubgraphs") == "fold_constants=false"
    assert avoiding_option("dispatch", "SomethingElse") == "dispatch=false"
    assert avoiding_option("lower", "ToNonDataflow") is None
    assert hint("lower", None) == ""
    assert "Options(fusion='tvm')" in hint("fuse", "DPFuseOps")
    assert "Options(dispatch=False)" in hint("dispatch", "PlusDispatch")


def test_an_option_already_set_is_not_suggested_again():
    """A FuseTIR failure under ``fusion=tvm`` must not end with "--opt fusion=tvm": the
    compile had it. It points at TVM's own pipeline instead; other options still get theirs."""
    set_already = Options(fusion="tvm")
    text = hint("fuse", "FuseTIR", set_already)
    assert "fusion=tvm" in text and "already set" in text and "--pipeline tvm" in text
    assert "--opt" not in text
    assert "Options(fusion='tvm')" in hint("fuse", "FuseTIR", Options())
    assert "Options(gir='off')" in hint("schedule", "ApplyScheduleRules", set_already)
    assert hint("lower", None, set_already) == ""


def test_the_compile_error_names_no_option_the_compile_already_has():
    """The compiler's error (what ``plus_tvm.compile`` raises for a failing pass) with and
    without the avoiding option set: FuseTIR failing in the fuse phase."""
    from plus_tvm import compiler
    from plus_tvm.errors import InternalCompileError

    tracker = compiler._PassTracker()
    tracker.running = ["plus.fuse", "FuseTIR"]
    for options, wanted in ((Options(), "--opt fusion=tvm"), (Options(fusion="tvm"), "--pipeline")):
        with pytest.raises(InternalCompileError, match="a planted failure") as err:
            with compiler._naming_the_pass(tracker, options):
                raise RuntimeError("a planted failure")
        assert "phase fuse, pass FuseTIR" in str(err.value) and wanted in str(err.value)
