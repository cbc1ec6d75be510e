"""The native float32 GEMV (``runtime/native/gemv.cc``): float32 ``plus.linear`` and
``plus.linear_layernorm`` calls of two to eight rows (a decode step at batch 2-8), which oneDNN
runs well below the memory's speed. Against torch's float32 graph for every config form the
kernel takes (``w=nk|kn``, bias, residual, every activation, ``parts`` > 1, 2-D and 3-D, K and N
off the vector widths, serial and threaded sizes); one row and nine rows stay oneDNN's; forced
off (``gemv_float_force``) every call is oneDNN's and equal to it."""

from __future__ import annotations

import pytest
import torch
from _tensors import TORCH_ACTIVATIONS, from_tvm, gemv_stats, require_native_gemv, to_tvm
from plus_tvm.runtime import native
from torch.nn import functional as F  # noqa: N812


@pytest.fixture(scope="module", autouse=True)
def natives():
    require_native_gemv()


@pytest.fixture
def force():
    """``force(mode)`` sets ``gemv_float_force``; back to the default after the test."""
    yield native.function("gemv_float_force")
    native.function("gemv_float_force")(-1)


stats = gemv_stats


def float_calls() -> int:
    return stats()["float_calls"]


def make(rows, k, ns, layout, bias, residual, lead3=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    lead = (rows, 1) if lead3 else (rows,)
    x = torch.randn(*lead, k, generator=g)
    ws = [torch.randn(*((n, k) if layout == "nk" else (k, n)), generator=g) * k**-0.5 for n in ns]
    bs = [torch.randn(n, generator=g) for n in ns] if bias else None
    r = torch.randn(*lead, sum(ns), generator=g) if residual else None
    return x, ws, bs, r


def reference(x, ws, layout, bs, r, act):
    parts = [
        F.linear(x, w if layout == "nk" else w.t(), bs[i] if bs is not None else None)
        for i, w in enumerate(ws)
    ]
    y = TORCH_ACTIVATIONS[act](torch.cat(parts, -1))
    return y + r if r is not None else y


def run_native(kernel, tensors, config, out_shape, extra_outs=0):
    outs = [to_tvm(torch.full(out_shape, float("nan"))) for _ in range(1 + extra_outs)]
    native.installed(kernel)(*[to_tvm(t) for t in tensors], config, *outs)
    return [from_tvm(o) for o in outs]


# (rows, K, Ns, layout, bias, residual, act, 3-D)
CASES = [
    (2, 64, [48], "nk", True, False, "none", False),
    (2, 77, [37], "kn", True, True, "none", True),
    (3, 768, [200], "nk", True, False, "gelu_tanh", False),
    (4, 768, [203], "kn", False, False, "silu", True),
    (5, 95, [33], "nk", False, True, "relu", False),
    (6, 513, [128, 133], "kn", True, False, "none", False),
    (7, 64, [16, 24, 8], "nk", True, False, "gelu", True),
    (8, 768, [200], "nk", True, True, "none", False),
    (8, 768, [203], "kn", True, True, "relu6", False),
    (8, 512, [128, 256], "nk", False, False, "tanh", False),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)).replace(" ", ""))
def test_native_linear_runs_the_gemv(case, force):
    rows, k, ns, layout, bias, residual, act, lead3 = case
    x, ws, bs, r = make(rows, k, ns, layout, bias, residual, lead3)
    cfg = f"w={layout};bias={int(bias)};residual={int(residual)};act={act};parts={len(ns)}"
    before = native.status()["kernels"]["plus.linear"]["fallbacks"]
    calls = float_calls()
    tensors = [x, *ws, *(bs or []), *([r] if r is not None else [])]
    (got,) = run_native("plus.linear", tensors, cfg, (*x.shape[:-1], sum(ns)))
    assert float_calls() == calls + 1
    assert native.status()["kernels"]["plus.linear"]["fallbacks"] == before
    torch.testing.assert_close(got, reference(x, ws, layout, bs, r, act), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 9])
def test_one_and_nine_rows_stay_onednn(rows, force):
    x, ws, bs, _ = make(rows, 256, [64], "nk", True, False)
    calls = float_calls()
    (got,) = run_native("plus.linear", [x, ws[0], bs[0]], "bias=1", (rows, 64))
    assert float_calls() == calls
    torch.testing.assert_close(got, F.linear(x, ws[0], bs[0]), rtol=1e-5, atol=1e-5)


def test_forced_off_and_on(force):
    """Off: oneDNN runs the call (and agrees); on: one row takes the GEMV too."""
    x, ws, bs, r = make(4, 256, [96], "nk", True, True)
    want = reference(x, ws, "nk", bs, r, "none")
    for mode, rows, used in ((0, 4, False), (1, 1, True), (-1, 4, True)):
        force(mode)
        calls = float_calls()
        xs, rs = x[:rows], r[:rows]
        (got,) = run_native("plus.linear", [xs, ws[0], bs[0], rs], "bias=1;residual=1", (rows, 96))
        assert float_calls() - calls == int(used), mode
        torch.testing.assert_close(got, want[:rows], rtol=1e-5, atol=1e-5)


def test_nan_reaches_every_output_and_relu_keeps_it(force):
    x, ws, bs, _ = make(3, 32, [8], "nk", True, False)
    x[1, 3] = float("nan")
    for act in ("none", "relu", "relu6"):
        (got,) = run_native("plus.linear", [x, ws[0], bs[0]], f"bias=1;act={act}", (3, 8))
        assert torch.isnan(got[1]).all() and not torch.isnan(got[[0, 2]]).any(), act


@pytest.mark.parametrize("sum_out", [False, True])
@pytest.mark.parametrize("layout,rows", [("nk", 2), ("kn", 8)])
def test_native_linear_layernorm_runs_the_gemv(layout, rows, sum_out, force):
    x, ws, bs, r = make(rows, 768, [96], layout, True, True, lead3=True, seed=5)
    g = torch.Generator().manual_seed(6)
    gamma, beta = (torch.randn(96, generator=g) for _ in range(2))
    cfg = f"w={layout};bias=1;residual=1;gamma=1;beta=1;eps=1e-05;sum_out={int(sum_out)}"
    calls = float_calls()
    outs = run_native(
        "plus.linear_layernorm", [x, ws[0], bs[0], r, gamma, beta], cfg, (rows, 1, 96), sum_out
    )
    assert float_calls() == calls + 1
    want_sum = reference(x, ws, layout, bs, r, "none")
    want = F.layer_norm(want_sum, (96,), gamma, beta, 1e-5)
    torch.testing.assert_close(outs[0], want, rtol=1e-4, atol=1e-4)
    if sum_out:
        torch.testing.assert_close(outs[1], want_sum, rtol=1e-5, atol=1e-5)
