"""Python branches on a tensor's value (plus_tvm.torch_branch_speculation): compiled along the
path the example inputs took, the condition an extra output checked at every call; a call that
goes another way runs in torch eager (counted), or is an error naming the line."""

from __future__ import annotations

import warnings

import numpy as np
import plus_tvm
import pytest
import torch
from plus_tvm.errors import BranchSpeculationError, ModelLoadError
from plus_tvm.loader import output_count
from plus_tvm.torch_branch_guards import SPECULATED_ATTR, speculated_branches


class ClampIfOverflow(torch.nn.Module):
    """BART's float16 clamp: the clamp runs only where the activation overflowed."""

    def forward(self, x):
        h = x * 1000.0
        if not torch.isfinite(h).all():  # the branch
            h = h.clamp(-1e30, 1e30)
        return h + 1.0


class SignBranch(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # the branch
            return x * 2.0
        return x - 1.0


class ItemBranch(torch.nn.Module):
    def forward(self, x, mask):
        if mask.any().item() and x.sum().item() > 0:  # the branch
            return x * 3.0
        return x + 1.0


class NoBranch(torch.nn.Module):
    def forward(self, x):
        return torch.where(x.sum() > 0, x * 2.0, x - 1.0)


def _line(module: type, mark: str = "# the branch") -> str:
    import inspect

    lines, first = inspect.getsourcelines(module)
    return f"test_branch_speculation.py:{first + next(i for i, s in enumerate(lines) if mark in s)}"


def test_a_finiteness_branch_compiles_and_a_call_that_overflows_runs_in_torch_eager():
    model = ClampIfOverflow().eval()
    x = torch.randn(4, 8)
    cm = plus_tvm.compile(model, example_args=(x,))
    (branch,) = cm.stats["speculated_branches"]
    assert _line(ClampIfOverflow) in branch["site"] and branch["taken"] is True
    assert "torch.isfinite(h).all()" in branch["code"]
    other = torch.randn(4, 8) * 3
    assert torch.equal(cm(other), model(other))  # the compiled path, same ops as torch
    assert cm.stats["speculation_fallbacks"] == 0
    big = torch.full((4, 8), 1e37)  # * 1000 overflows: torch takes the clamp
    with pytest.warns(RuntimeWarning, match="runs in torch eager"):
        got = cm(big)
    assert torch.equal(got, model(big)) and float(got.max()) == pytest.approx(1e30 + 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once only
        got = cm(big.numpy())
    assert (got == model(big).numpy()).all()  # numpy in, numpy out
    assert cm.stats["speculation_fallbacks"] == 2


def test_a_sign_branch_takes_either_way_with_torchs_results():
    model = SignBranch().eval()
    cm = plus_tvm.compile(model, example_args=(torch.ones(3),))
    for x in (torch.tensor([1.0, 2.0, -0.5]), torch.tensor([-1.0, 0.5, -2.0])):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            assert torch.equal(cm(x), model(x))
    assert cm.stats["speculation_fallbacks"] == 1


def test_without_host_fallback_the_other_way_is_an_error_naming_the_line():
    options = plus_tvm.Options(host_fallback=False)
    cm = plus_tvm.compile(SignBranch().eval(), example_args=(torch.ones(3),), options=options)
    assert torch.equal(cm(torch.full((3,), 2.0)), torch.full((3,), 4.0))  # compiled path
    with pytest.raises(BranchSpeculationError) as info:
        cm(-torch.ones(3))
    message = str(info.value)
    assert _line(SignBranch) in message and "(`if x.sum() > 0:" in message
    assert "gave False, True on the example inputs" in message


@pytest.mark.filterwarnings("ignore:the branch at:RuntimeWarning")
def test_item_comparisons_are_speculated_on_their_values():
    model = ItemBranch().eval()
    x, mask = torch.ones(3), torch.tensor([0, 1])
    cm = plus_tvm.compile(model, example_args=(x, mask))
    kinds = [b["kind"] for b in cm.stats["speculated_branches"]]
    assert kinds == ["item", "item"]
    assert torch.equal(cm(x * 5, mask), model(x * 5, mask))  # another value: torch eager
    assert cm.stats["speculation_fallbacks"] == 1
    assert torch.equal(cm(x, mask), model(x, mask))  # the example's values: compiled
    assert cm.stats["speculation_fallbacks"] == 1
    zero = torch.tensor([0, 0])
    assert torch.equal(cm(x, zero), model(x, zero))  # mask.any() False: the other branch
    assert cm.stats["speculation_fallbacks"] == 2


def test_a_model_without_branches_gets_no_extra_output():
    x = torch.randn(3)
    mod, _ = plus_tvm.from_torch(NoBranch().eval(), (x,))
    assert speculated_branches(mod) == [] and SPECULATED_ATTR not in (mod.attrs or {})
    assert output_count(mod) == 1  # the output alone, no guard beside it
    cm = plus_tvm.compile(NoBranch().eval(), example_args=(x,))
    assert "speculated_branches" not in cm.stats and "speculation_fallbacks" not in cm.stats
    branching, _ = plus_tvm.from_torch(SignBranch().eval(), (x,))
    assert len(speculated_branches(branching)) == 1
    assert output_count(branching) == 2  # the output and its guard


def test_a_saved_model_that_goes_another_way_is_an_error(tmp_path):
    cm = plus_tvm.compile(SignBranch().eval(), example_args=(torch.ones(3),))
    path = str(tmp_path / "m.so")
    cm.export_library(path)
    loaded = plus_tvm.load(path)
    assert torch.equal(loaded(torch.ones(3)), torch.full((3,), 2.0))
    with pytest.raises(BranchSpeculationError, match="no torch module"):
        loaded(-torch.ones(3))


class ReachedOnlyWhenExporting(torch.nn.Module):
    def forward(self, x):
        if x.mean() > -100:
            x = x + 1.0
        if torch.compiler.is_exporting() and x.sum() > 0:  # eager never asks
            x = x * 2.0
        return x


def test_a_branch_the_eager_run_never_reached_is_a_clear_error():
    with pytest.raises(ModelLoadError, match="did not reach that often"):
        plus_tvm.compile(ReachedOnlyWhenExporting().eval(), example_args=(torch.ones(3),))


def test_a_product_of_boolean_tensors_compiles_as_a_logical_and():
    """torch's decomposition of isfinite multiplies two bool tensors: TVM 0.27's multiply in
    bool fails LLVM's code generation (torch_bool_arith)."""

    class Finite(torch.nn.Module):
        def forward(self, x, y):
            return torch.isfinite(x), (x > 0) * (y > 0)

    x = torch.tensor([1.0, float("inf"), float("nan"), -2.0])
    y = torch.tensor([1.0, 1.0, -1.0, -1.0])
    cm = plus_tvm.compile(Finite().eval(), example_args=(x, y))
    for got, want in zip(cm(x, y), Finite()(x, y)):
        assert got.dtype == torch.bool and torch.equal(got, want)


def test_a_fallback_in_reduced_precision_returns_the_compiled_dtype():
    options = plus_tvm.Options(precision="bf16")
    cm = plus_tvm.compile(SignBranch().eval(), example_args=(torch.ones(3),), options=options)
    want = cm(torch.ones(3)).dtype
    with pytest.warns(RuntimeWarning, match="runs in torch eager"):
        got = cm(-torch.ones(3))
    assert got.dtype == want and torch.equal(got.float(), torch.full((3,), -2.0))
    wanted = cm(np.ones(3, np.float32)).dtype  # numpy in: numpy out (ml_dtypes' bfloat16)
    got = cm(-np.ones(3, np.float32))
    assert got.dtype == wanted and (got.astype(np.float32) == -2.0).all()


@pytest.mark.filterwarnings("ignore:the branch at:RuntimeWarning")
def test_a_speculated_branch_under_a_dynamic_dimension():
    model = ClampIfOverflow().eval()
    rows = torch.export.Dim("rows", min=2, max=64)
    cm = plus_tvm.compile(model, example_args=(torch.randn(4, 8),), dynamic_shapes={"x": {0: rows}})
    for x in (torch.randn(2, 8), torch.randn(9, 8), torch.full((5, 8), 1e37)):
        assert torch.equal(cm(x), model(x))
    assert cm.stats["speculation_fallbacks"] == 1


def test_compiling_a_branch_prints_no_graph_dump(capfd, caplog):
    """torch prints the graph it traced before a data-dependent failure, and warns it found no
    line to suggest a check at: noise once plus speculates (torch_export_errors)."""
    plus_tvm.compile(SignBranch().eval(), example_args=(torch.ones(3),))
    err = capfd.readouterr().err
    assert "def forward" not in err and "Unable to find user code" not in err
    assert not any("Unable to find user code" in r.getMessage() for r in caplog.records)


def test_the_stats_text_lists_the_speculated_branches():
    from plus_tvm.report import stats_text

    stats = {
        "model": "m",
        "speculated_branches": [
            {"site": "m.py:3 in forward", "code": "if x.sum() > 0:", "taken": True, "kind": "bool"}
        ],
        "speculation_fallbacks": 2,
    }
    text = stats_text(stats)
    assert "m.py:3 in forward (`if x.sum() > 0:`): True" in text and "2 calls" in text
    assert "speculated" not in stats_text({"model": "m"})
