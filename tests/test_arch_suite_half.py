"""Every architecture of the suite in half precision (issue 36's accuracy contract): compiled
from ``model.to(dtype)``, it returns the model's dtype and is no less accurate than torch eager
in that dtype against a float64 run of the same rounded weights (:mod:`plus_tvm.accuracy`: at
most twice torch eager's error plus a floor).

To keep the suite within its time, each architecture runs in one of the two dtypes (they
alternate down the suite's list), and one architecture of each family plus the mixtures of
experts run in both; ``scripts/arch_suite --dtypes bf16,fp16`` runs all of them in both (every
one passes: the stop notes give the run)."""

from __future__ import annotations

import copy

import plus_tvm
import pytest
import torch
from plus_tvm import arch_suite
from plus_tvm.accuracy import bound, rel_err
from plus_tvm.half_reference import widened_run

pytest.importorskip("transformers")

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# float16 only, these branch in Python on whether an activation is finite (``if
# hidden_states.dtype == torch.float16 and not torch.isfinite(hidden_states).all():``, BART's
# encoder layer and its copies), which plus compiles by speculation
# (plus_tvm.torch_branch_speculation): they always run in float16
BRANCHES_IN_FP16 = frozenset({"bart", "marian"})


def _cast(a: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return a.to(dtype) if a.is_floating_point() else a


def _reference(half: torch.nn.Module, args: tuple) -> torch.Tensor:
    out = widened_run(half, args)
    return (out[0] if isinstance(out, (list, tuple)) else out).double()


# in both dtypes: the first architecture of each family, and the mixtures of experts
BOTH = frozenset(
    {next(n for n in arch_suite.names() if arch_suite.ENTRIES[n]["family"] == f)
     for f in arch_suite.FAMILIES} | {"mixtral", "gpt-neox", "whisper"}
)  # fmt: skip


def _dtypes(k: int, name: str) -> list[str]:
    both = sorted(DTYPES)
    if name in BOTH:
        return both
    return ["fp16"] if name in BRANCHES_IN_FP16 else [both[k % 2]]


CASES = [
    pytest.param(name, dtype, id=f"{name}-{dtype}")
    for k, name in enumerate(arch_suite.names())
    for dtype in _dtypes(k, name)
]


@pytest.mark.parametrize("name,dtype", CASES)
def test_architecture_in_half_precision_is_as_accurate_as_torch(name, dtype):
    model, args = arch_suite.load(name)
    half = copy.deepcopy(model).eval().to(DTYPES[dtype])
    hargs = tuple(_cast(a, DTYPES[dtype]) for a in args)
    ref = _reference(half, hargs)
    with torch.no_grad():
        eager = half(*hargs).double()
    compiled = plus_tvm.compile(half, example_args=hargs)
    got = compiled(*hargs)
    got = got[0] if isinstance(got, (list, tuple)) else got
    assert isinstance(got, torch.Tensor) and got.dtype == DTYPES[dtype], name
    assert float(ref.abs().max()) > 1e-3, "a degenerate reference proves nothing"
    plus_err = rel_err(got.double().numpy(), ref.numpy())
    torch_err = rel_err(eager.numpy(), ref.numpy())
    assert plus_err <= bound(torch_err, dtype), (name, dtype, plus_err, torch_err)
    assert compiled.stats["library_calls"] > 0


@pytest.mark.parametrize("name", sorted(BRANCHES_IN_FP16))
def test_a_float16_branch_on_finiteness_is_speculated_and_guarded(name):
    """The float16 clamp branch compiles along the finite path; when the activation overflows
    (an encoder weight scaled in place after compiling: the compiled model follows it) the
    guard sees it and the call runs in torch eager, with torch's result."""
    model, args = arch_suite.load(name)
    half = copy.deepcopy(model).eval().to(torch.float16)
    hargs = tuple(_cast(a, torch.float16) for a in args)
    compiled = plus_tvm.compile(half, example_args=hargs)
    sites = {b["site"].split(" in ")[0] for b in compiled.stats["speculated_branches"]}
    assert len(sites) == 1 and sites.pop().startswith(f"transformers/models/{name}/modeling_")
    assert all(b["taken"] for b in compiled.stats["speculated_branches"])
    assert "torch.isfinite(hidden_states).all()" in compiled.stats["speculated_branches"][0]["code"]
    assert compiled.stats["speculation_fallbacks"] == 0
    fc2 = next(m for n, m in half.named_modules() if n.endswith("encoder.layers.0.fc2"))
    with torch.no_grad():
        fc2.weight.mul_(1e5)  # its output overflows float16 (inf, then NaN after the norm)
        fc2.bias.fill_(65504.0)
        want = half(*hargs)
    with pytest.warns(RuntimeWarning, match="runs in torch eager"):
        got = compiled(*hargs)
    assert compiled.stats["speculation_fallbacks"] == 1 and not bool(want.isfinite().all())
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
