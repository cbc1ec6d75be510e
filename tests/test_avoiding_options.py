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
