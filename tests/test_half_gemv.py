"""The native bfloat16 GEMV (``runtime/native/gemv.cc``): bfloat16 linears of one to eight rows
on CPUs without bfloat16 GEMM instructions, as the native ``plus.linear`` (the VM's call) and the
Python kernel run them.

Numerics against torch's float32 (the error no larger than torch's bfloat16 graph's, and nearly
every output equal to it: both round the same float32 values at the same places) for every
config form the kernel takes: ``w=nk|kn``, bias, residual, every activation, ``parts`` > 1, one
to eight rows of 2-D and 3-D inputs, K and N off the vector widths, serial and threaded sizes.
Dispatch with the CPU's answer forced both ways (``gemv_half_force`` for the C++ kernel,
``cpu_dtypes`` for the Python one), so it runs on any host.
"""

from __future__ import annotations

import plus_tvm
import plus_tvm.runtime as rt
import pytest
import torch
from _tensors import TORCH_ACTIVATIONS, from_tvm, gemv_stats, require_native_gemv, to_tvm
from plus_tvm.runtime import _common, native
from plus_tvm.runtime.linear import HALF_GEMV_MAX_ROWS
from torch.nn import functional as F  # noqa: N812

BF16 = torch.bfloat16
NO_BF16 = ("float32",)  # an AVX2 CPU
NATIVE_BF16 = ("float32", "bfloat16")  # avx512_bf16 / AMX
ACTS = TORCH_ACTIVATIONS


@pytest.fixture(scope="module", autouse=True)
def natives():
    require_native_gemv()


@pytest.fixture
def cpu(monkeypatch):
    """``cpu(dtypes)``: the Python kernels see a CPU computing ``dtypes`` natively; the C++
    kernel's choice back to the CPU's after the test."""

    def use(dtypes: tuple[str, ...]) -> None:
        monkeypatch.setattr(_common, "cpu_dtypes", lambda: dtypes)

    yield use
    native.function("gemv_half_force")(-1)


stats = gemv_stats


def gemv_calls() -> int:
    return stats()["calls"]


def linear_stats() -> dict:
    return native.status()["kernels"]["plus.linear"]


def make(rows, k, ns, layout, bias, residual, lead3=False, seed=0):
    """x, the weights, biases (or None), residual (or None), the config, the output."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(BF16)

    lead = (rows, 1) if lead3 else (rows,)
    x = rand(*lead, k)
    ws = [rand(*((n, k) if layout == "nk" else (k, n)), scale=k**-0.5) for n in ns]
    bs = [rand(n) for n in ns] if bias else None
    r = rand(*lead, sum(ns)) if residual else None
    return x, ws, bs, r, torch.empty(*lead, sum(ns), dtype=BF16)


def graph(x, ws, layout, bs, r, act, dtype):
    """torch's op-by-op graph in ``dtype``: the linear, the activation, the residual add."""
    parts = []
    for i, w in enumerate(ws):
        wn = w if layout == "nk" else w.t()
        b = bs[i].to(dtype) if bs is not None else None
        parts.append(F.linear(x.to(dtype), wn.to(dtype), b))
    y = ACTS[act](torch.cat(parts, -1))
    return y + r.to(dtype) if r is not None else y


def config(layout, bias, residual, act, parts, extra=""):
    return f"w={layout};bias={int(bias)};residual={int(residual)};act={act};parts={parts}{extra}"


def check(got, x, ws, layout, bs, r, act):
    """As accurate as torch's bfloat16 graph against float32, and equal to it nearly
    everywhere."""
    ref = graph(x, ws, layout, bs, r, act, torch.float32)
    torch_bf16 = graph(x, ws, layout, bs, r, act, BF16)
    assert got.dtype == BF16 and got.shape == ref.shape
    got_err = float((got.float() - ref).abs().max())
    torch_err = float((torch_bf16.float() - ref).abs().max())
    assert got_err <= 1.25 * torch_err + 1e-30, (got_err, torch_err)
    same = float((got == torch_bf16).float().mean())
    assert same >= 0.9, same


def tensors(x, ws, bs, r):
    return [x, *ws, *(bs or []), *([r] if r is not None else [])]


# (rows, K, Ns, layout, bias, residual, act, 3-D): tails of K (mod 16, odd) and N (mod 4, 16);
# 768 x 200 (300 KiB) runs on the thread team, the small ones on the calling thread; 1 to
# MAX_ROWS rows
CASES = [
    (1, 64, [48], "nk", False, False, "none", False),
    (2, 64, [48], "nk", True, False, "none", False),
    (1, 77, [37], "nk", True, True, "none", True),
    (2, 77, [37], "kn", True, True, "none", True),
    (1, 768, [200], "nk", True, False, "gelu_tanh", False),
    (2, 768, [200], "kn", True, True, "none", False),
    (1, 768, [203], "kn", False, False, "silu", True),
    (2, 95, [33], "kn", False, True, "relu", False),
    (1, 64, [16, 24, 8], "nk", True, False, "none", False),
    (2, 64, [16, 24, 8], "kn", False, False, "gelu", True),
    (1, 512, [128, 256], "nk", False, False, "none", False),
    (2, 513, [128, 133], "kn", True, False, "none", False),
    # 3 to 8 rows (a decode step at batch 3-8): two sums per row up to 4 rows, one past that
    (3, 77, [37], "nk", True, True, "none", False),
    (4, 768, [200], "nk", True, False, "silu", True),
    (5, 768, [203], "kn", True, True, "none", False),
    (8, 768, [200], "nk", False, True, "gelu_tanh", False),
    (8, 95, [33, 16], "kn", True, False, "none", True),
    (7, 513, [128], "nk", True, False, "relu", False),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)).replace(" ", ""))
def test_native_linear_runs_the_gemv(case, cpu):
    """Through the native plus.linear as the VM calls it (parts > 1 included): the GEMV ran,
    nothing went to Python, and the result is torch's."""
    rows, k, ns, layout, bias, residual, act, lead3 = case
    native.function("gemv_half_force")(1)
    x, ws, bs, r, out = make(rows, k, ns, layout, bias, residual, lead3)
    args = [to_tvm(t) for t in tensors(x, ws, bs, r)]
    out_t = to_tvm(out)
    before, calls = linear_stats(), gemv_calls()
    native.installed("plus.linear")(*args, config(layout, bias, residual, act, len(ns)), out_t)
    assert gemv_calls() == calls + 1
    assert linear_stats()["fallbacks"] == before["fallbacks"]
    check(from_tvm(out_t), x, ws, layout, bs, r, act)


@pytest.mark.parametrize("act", sorted(ACTS))
@pytest.mark.parametrize("layout", ["nk", "kn"])
def test_every_activation_in_the_python_kernel(act, layout, cpu):
    """The Python plus.linear on an AVX2 CPU calls the GEMV (with ``prepack=0`` too)."""
    cpu(NO_BF16)
    for rows, extra in ((1, ""), (2, ";prepack=0")):
        x, ws, bs, r, out = make(rows, 96, [40], layout, True, act == "relu", seed=rows)
        calls = gemv_calls()
        cfg = config(layout, True, r is not None, act, 1, extra)
        rt.KERNELS["plus.linear"].call(*tensors(x, ws, bs, r), config=cfg, out=out)
        assert gemv_calls() == calls + 1
        check(out, x, ws, layout, bs, r, act)


def test_nan_and_infinity_as_torch(cpu):
    """A NaN in x reaches every output (ReLU keeps it); a sum past bfloat16's range is inf."""
    cpu(NO_BF16)
    calls = gemv_calls()
    x, ws, bs, _, out = make(1, 32, [8], "nk", True, False)
    x[0, 3] = float("nan")
    for act in ("none", "relu", "relu6"):
        rt.KERNELS["plus.linear"].call(x, ws[0], bs[0], config=f"bias=1;act={act}", out=out)
        assert torch.isnan(out).all(), act
    big = torch.full((1, 32), 3e38, dtype=BF16)
    w = torch.ones(4, 32, dtype=BF16)
    out = torch.empty(1, 4, dtype=BF16)
    rt.KERNELS["plus.linear"].call(big, w, config="w=nk", out=out)
    assert torch.isinf(out).all() and (out > 0).all()
    assert gemv_calls() == calls + 4


def test_dispatch_forced_both_ways(cpu):
    """The C++ kernel uses the GEMV as the CPU says (bfloat16 not among its dtypes) or as forced;
    forced off, the call goes to Python, which (told the CPU computes bfloat16) keeps torch."""
    x, ws, bs, r, out = make(1, 64, [32], "nk", True, True)
    args = [to_tvm(t) for t in tensors(x, ws, bs, r)]
    cfg = config("nk", True, True, "none", 1)
    fn = native.installed("plus.linear")
    auto = "bfloat16" not in native.native_dtypes(rt.KERNELS["plus.linear"])
    for mode, used in ((-1, auto), (1, True), (0, False)):
        cpu(NATIVE_BF16)  # the Python kernel (where a call falls back) keeps torch
        native.function("gemv_half_force")(mode)
        out_t = to_tvm(out)
        before, calls = linear_stats(), gemv_calls()
        fn(*args, cfg, out_t)
        assert gemv_calls() - calls == int(used), mode
        fell_back = linear_stats()["fallbacks"] - before["fallbacks"]
        assert fell_back == int(not used and auto), mode  # (a bf16 CPU runs it in oneDNN)
        check(from_tvm(out_t), x, ws, "nk", bs, r, "none")


def test_rows_limit_is_the_librarys():
    assert stats()["max_rows"] == HALF_GEMV_MAX_ROWS


def test_python_kernel_dispatch(cpu):
    """The Python kernels call the GEMV only for bfloat16 of one to eight rows on a CPU without
    bfloat16: not where the CPU computes it, not at nine rows (widened float32), not for
    float32; linear_layernorm's one-row GEMM takes it too; a strided output falls back."""
    kernel = rt.KERNELS["plus.linear"]
    x, ws, bs, _, out = make(1, 64, [32], "nk", True, False)
    cfg = "bias=1"
    cpu(NATIVE_BF16)
    calls = gemv_calls()
    kernel.call(x, ws[0], bs[0], config=cfg, out=out)
    assert gemv_calls() == calls
    check(out, x, ws, "nk", bs, None, "none")
    cpu(NO_BF16)
    x9, w9, b9, _, out9 = make(HALF_GEMV_MAX_ROWS + 1, 64, [32], "nk", True, False)
    kernel.call(x9, w9[0], b9[0], config=cfg, out=out9)
    kernel.call(x.float(), ws[0].float(), bs[0].float(), config=cfg, out=out.float())
    assert gemv_calls() == calls
    strided = torch.empty(1, 64, dtype=BF16)[:, ::2]
    kernel.call(x, ws[0], bs[0], config=cfg, out=strided)
    assert gemv_calls() == calls
    check(strided, x, ws, "nk", bs, None, "none")
    # linear_layernorm at one row: the GEMV computes the sum, torch's layer_norm the rest
    g = torch.Generator().manual_seed(3)
    r, gamma, beta = (torch.randn(*s, generator=g).to(BF16) for s in ((1, 32), (32,), (32,)))
    norm = torch.empty(1, 32, dtype=BF16)
    rt.KERNELS["plus.linear_layernorm"].call(
        x, ws[0], bs[0], r, gamma, beta, config="bias=1;residual=1;gamma=1;beta=1", out=norm
    )
    assert gemv_calls() == calls + 1
    want = F.layer_norm(F.linear(x, ws[0], bs[0]) + r, (32,), gamma, beta)
    torch.testing.assert_close(norm.float(), want.float(), rtol=2**-6, atol=2**-6)


def test_compiled_decode_shaped_linear_uses_it(cpu):
    """A compiled one-row bfloat16 linear (the VM's plus.linear) runs the GEMV where the CPU
    has no bfloat16, and its result is torch's."""
    native.function("gemv_half_force")(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.GELU()).to(BF16).eval()
    x = torch.randn(1, 512).to(BF16)
    cm = plus_tvm.compile(model, example_args=(x,))
    calls = gemv_calls()
    got = cm(x)
    assert gemv_calls() > calls
    with torch.no_grad():
        want = model(x)
    assert float((got == want).float().mean()) >= 0.9


@pytest.mark.parametrize("sum_out", [False, True])
@pytest.mark.parametrize("layout,rows", [("nk", 1), ("kn", 2), ("nk", 6)])
def test_native_linear_layernorm_runs_the_gemv(layout, rows, sum_out, cpu):
    """The native plus.linear_layernorm (GPT-2's projections and the norm after them): the
    GEMV's sum rounded (handed out with ``sum_out``), its layer normalization as torch's."""
    native.function("gemv_half_force")(1)
    x, ws, bs, r, out = make(rows, 768, [96], layout, True, True, lead3=True, seed=5)
    g = torch.Generator().manual_seed(6)
    gamma, beta = (torch.randn(96, generator=g).to(BF16) for _ in range(2))
    args = [to_tvm(t) for t in (x, ws[0], bs[0], r, gamma, beta)]
    cfg = f"w={layout};bias=1;residual=1;gamma=1;beta=1;eps=1e-05;sum_out={int(sum_out)}"
    outs = [to_tvm(out)] + ([to_tvm(torch.empty_like(out))] if sum_out else [])
    fn = native.installed("plus.linear_layernorm")
    before = native.status()["kernels"]["plus.linear_layernorm"]["fallbacks"]
    calls = gemv_calls()
    fn(*args, cfg, *outs)
    assert gemv_calls() == calls + 1
    assert native.status()["kernels"]["plus.linear_layernorm"]["fallbacks"] == before
    want_sum = graph(x, ws, layout, bs, r, "none", BF16)
    want = F.layer_norm(want_sum, (96,), gamma, beta, 1e-5)
    ref = F.layer_norm(
        graph(x, ws, layout, bs, r, "none", torch.float32), (96,), gamma.float(), beta.float(), 1e-5
    )
    got = from_tvm(outs[0])
    assert float((got.float() - ref).abs().max()) <= 1.25 * float((want.float() - ref).abs().max())
    assert float((got == want).float().mean()) >= 0.9
    if sum_out:
        assert float((from_tvm(outs[1]) == want_sum).float().mean()) >= 0.9
