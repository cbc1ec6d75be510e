"""bfloat16 computed in float32 on CPUs without bfloat16 instructions (``_common.widened_half``).

Every test forces the CPU's answer (``cpu_dtypes`` monkeypatched), so both sides run on any
host, one with avx512_bf16 included, and calls the Python kernels directly (the native C++
kernels, in front of them on such a host, are not involved).
"""

from __future__ import annotations

import plus_tvm.runtime as rt
import pytest
import torch
from plus_tvm.runtime import _common
from torch.nn import functional as F  # noqa: N812

BF16 = torch.bfloat16
NO_BF16 = ("float32",)  # an AVX2 CPU
NATIVE_BF16 = ("float32", "bfloat16")  # avx512_bf16 / AMX


@pytest.fixture
def cpu(monkeypatch):
    """``cpu(dtypes)``: make the kernels see a CPU computing ``dtypes`` natively; caches
    cleared before and after; oneDNN's GEMM fixed-cost floor off (the tests are tiny)."""
    monkeypatch.setattr(rt.linear, "ONEDNN_MIN_FLOPS", 0.0)
    monkeypatch.setattr(rt.linear_layernorm, "ONEDNN_MIN_FLOPS", 0.0)

    def use(dtypes: tuple[str, ...]) -> None:
        monkeypatch.setattr(_common, "cpu_dtypes", lambda: dtypes)
        rt.clear_caches()

    yield use
    rt.clear_caches()


def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape) * scale).to(BF16)


def near(got: torch.Tensor, want: torch.Tensor, ulps: float = 1.0) -> None:
    """Within ``ulps`` bfloat16 roundings of ``want`` (relative 2^-7 each: one unit in the
    last place at most; 1e-2 absolute near zero)."""
    assert got.dtype == BF16
    torch.testing.assert_close(got.float(), want.float(), rtol=ulps * 2.0**-7, atol=1e-2)


def no_widening(monkeypatch) -> None:
    """Fail any widened run (the kernels' float32 methods)."""

    def fail(*args, **kwargs):
        raise AssertionError("widened path taken")

    monkeypatch.setattr(rt.linear.Linear, "_run_widened", fail)
    monkeypatch.setattr(rt.conv2d.Conv2d, "_run_widened", fail)


def float32_entries(kernel: str) -> list[torch.Tensor]:
    """The float32 tensors a kernel's cache holds (its widened, packed parameters)."""
    cache = rt.KERNELS[kernel].cache
    return [e[1] for e in cache.entries.values() if e[1].dtype == torch.float32]


def test_predicate_widens_bfloat16_from_three_rows_only_without_bfloat16(cpu):
    x = torch.zeros(2, 8, dtype=BF16)
    cpu(NO_BF16)
    assert [_common.widened_half(x, rows) for rows in (1, 2, 3, 128)] == [False, False, True, True]
    assert _common.widened_half(x.half(), 1)  # float16 always (its path is unchanged)
    assert not _common.widened_half(x.float(), 128)
    cpu(NATIVE_BF16)
    assert not any(_common.widened_half(x, rows) for rows in (1, 3, 1024))
    assert _common.widened_half(x.half(), 1)


@pytest.mark.parametrize("parts", [1, 2])
def test_linear_widened_packs_float32_once_and_rounds_where_torch_does(parts, cpu):
    cpu(NO_BF16)
    torch.manual_seed(0)
    kernel = rt.KERNELS["plus.linear"]
    x = rand(3, 4, 64)  # 12 rows: past the native GEMV's HALF_GEMV_MAX_ROWS (8)
    ws, bs = [rand(24, 64, scale=0.2) for _ in range(parts)], [rand(24) for _ in range(parts)]
    residual = rand(3, 4, 24 * parts) if parts == 1 else None
    w32, b32 = torch.cat(ws).float(), torch.cat(bs).float()
    # torch's graph: the linear rounded, the activation's result rounded, the sum rounded
    y = F.linear(x.float(), w32, b32).to(BF16)
    want = F.gelu(y.float()).to(BF16)
    if residual is not None:
        want = (want.float() + residual.float()).to(BF16)
    torch_bf16 = F.gelu(F.linear(x, torch.cat(ws), torch.cat(bs)))
    if residual is not None:
        torch_bf16 = torch_bf16 + residual
    want64 = F.gelu(F.linear(x.double(), w32.double(), b32.double()))
    if residual is not None:
        want64 = want64 + residual.double()
    cfg = f"bias=1;act=gelu;parts={parts};residual={int(residual is not None)}"
    inputs = [x, *ws, *bs, *([residual] if residual is not None else [])]
    packs, hits = kernel.cache.packs, kernel.cache.hits
    for _ in range(4):
        out = torch.empty(3, 4, 24 * parts, dtype=BF16)
        kernel.call(*inputs, config=cfg, out=out)
        near(out, want)
        near(out, torch_bf16, ulps=2)
        err, torch_err = (float(t.double().sub(want64).abs().max()) for t in (out, torch_bf16))
        assert err <= max(torch_err, 1e-2)
    # the weight (every part as one) widened and packed once, at the second call; hits after
    assert len(float32_entries("plus.linear")) == 1
    assert (kernel.cache.packs - packs, kernel.cache.hits - hits) == (1, 2)
    assert [k[-1][-1] for k in kernel.cache.entries] == [("linear-float32", "nk")]  # (joined)


@pytest.mark.parametrize("rows", [1, 2])
def test_linear_with_fewer_rows_keeps_torch_bfloat16(rows, cpu, monkeypatch):
    """A decode step's one row (or two) keeps torch's bfloat16 GEMV: it reads half the bytes."""
    cpu(NO_BF16)
    no_widening(monkeypatch)
    x, w, b = rand(rows, 64), rand(32, 64, scale=0.2), rand(32)
    out = torch.empty(rows, 32, dtype=BF16)
    for _ in range(3):
        rt.KERNELS["plus.linear"].call(x, w, b, config="bias=1", out=out)
        near(out, F.linear(x, w, b), ulps=2)
    assert not float32_entries("plus.linear")


def test_native_bfloat16_cpu_keeps_its_path(cpu, monkeypatch):
    """Where the CPU computes bfloat16 (avx512_bf16), nothing widens: no float32 method runs
    and no float32 copy of a weight is cached, for every kernel that widens elsewhere."""
    cpu(NATIVE_BF16)
    no_widening(monkeypatch)
    monkeypatch.setattr(rt.matmul, "widened_half", _refuse(rt.matmul.widened_half))
    monkeypatch.setattr(
        rt.linear_layernorm, "widened_half", _refuse(rt.linear_layernorm.widened_half)
    )
    torch.manual_seed(1)
    x, w, b = rand(8, 64), rand(32, 64, scale=0.2), rand(32)
    out = torch.empty(8, 32, dtype=BF16)
    for _ in range(3):
        rt.KERNELS["plus.linear"].call(x, w, b, config="bias=1", out=out)
    near(out, F.linear(x, w, b), ulps=2)
    r, g, beta = rand(8, 32), rand(32), rand(32)
    rt.KERNELS["plus.linear_layernorm"].call(
        x, w, b, r, g, beta, config="bias=1;residual=1;gamma=1;beta=1", out=out
    )
    near(out, F.layer_norm(F.linear(x, w, b) + r, (32,), g, beta), ulps=4)
    a, m = rand(2, 8, 16), rand(2, 16, 8)
    mm = torch.empty(2, 8, 8, dtype=BF16)
    rt.KERNELS["plus.matmul"].call(a, m, config="", out=mm)
    near(mm, a @ m, ulps=2)
    xc, wc = rand(1, 4, 6, 6), rand(8, 4, 3, 3, scale=0.3)
    conv = torch.empty(1, 8, 6, 6, dtype=BF16)
    rt.KERNELS["plus.conv2d"].call(xc, wc, config="padding=1", out=conv)
    near(conv, F.conv2d(xc, wc, None, 1, 1), ulps=2)
    for name in ("plus.linear", "plus.linear_layernorm", "plus.conv2d"):
        assert not float32_entries(name), name


def _refuse(predicate):
    """The predicate, asserting it answers no."""

    def check(x, rows):
        result = predicate(x, rows)
        assert not result
        return result

    return check


def test_linear_layernorm_widened(cpu):
    cpu(NO_BF16)
    torch.manual_seed(2)
    x, w, b, r = rand(2, 6, 32), rand(32, 32, scale=0.2), rand(32), rand(2, 6, 32)
    g, beta = rand(32), rand(32)
    total = (F.linear(x.float(), w.float(), b.float()) + r.float()).to(BF16)  # rounded sum
    want = F.layer_norm(total.float(), (32,), g.float(), beta.float()).to(BF16)
    torch_bf16 = F.layer_norm(F.linear(x, w, b) + r, (32,), g, beta)
    out, sums = torch.empty(2, 6, 32, dtype=BF16), torch.empty(2, 6, 32, dtype=BF16)
    cfg = "bias=1;residual=1;gamma=1;beta=1;sum_out=1"
    for _ in range(3):
        rt.KERNELS["plus.linear_layernorm"](x, w, b, r, g, beta, cfg, out, sums)
        near(out, want, ulps=2)
        near(out, torch_bf16, ulps=4)
        near(sums, total, ulps=1)
    # w, b, gamma and beta widened once each (kept as float32 by the cache), w then packed
    kinds = sorted(k[-1][0] for k in rt.KERNELS["plus.linear_layernorm"].cache.entries)
    assert kinds == ["float32"] * 4 + ["linear"]


def test_matmul_widened_for_attention_rows(cpu, monkeypatch):
    """Attention's batched products widen (a decode step's one row per head counts its rows
    over the batch); a single row alone does not."""
    cpu(NO_BF16)
    seen = []
    real = rt.matmul.widened_half

    def record(x, rows):
        seen.append((rows, real(x, rows)))
        return seen[-1][1]

    monkeypatch.setattr(rt.matmul, "widened_half", record)
    torch.manual_seed(3)
    a, m, bias = rand(2, 3, 1, 16), rand(2, 3, 16, 8), rand(8)
    out = torch.empty(2, 3, 1, 8, dtype=BF16)
    rt.KERNELS["plus.matmul"].call(a, m, bias, config="bias=1;scale=0.5", out=out)
    want = (a.float() @ m.float() * 0.5 + bias.float()).to(BF16)
    near(out, want)  # float32's result rounded once
    near(out, torch.baddbmm(bias, a.view(6, 1, 16), m.view(6, 16, 8), alpha=0.5).view(2, 3, 1, 8))
    a1 = rand(1, 16)
    out1 = torch.empty(1, 8, dtype=BF16)
    rt.KERNELS["plus.matmul"].call(a1, m[0, 0], config="", out=out1)
    near(out1, a1 @ m[0, 0], ulps=2)
    assert seen[0] == (6, True) and seen[-1] == (1, False)


@pytest.mark.parametrize("bn", [0, 1])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_conv2d_widened(layout, bn, cpu):
    cpu(NO_BF16)
    torch.manual_seed(4)
    x, w, b, res = rand(1, 8, 6, 6), rand(16, 8, 3, 3, scale=0.3), rand(16), rand(1, 16, 6, 6)
    stats = [rand(16), rand(16), rand(16), (torch.rand(16) + 0.5).to(BF16)]
    y = F.conv2d(x.float(), w.float(), b.float(), padding=1).to(BF16)  # rounded once
    if bn:
        g, beta, mean, var = (t.float() for t in stats)
        y = F.batch_norm(y.float(), mean, var, g, beta, eps=1e-5).to(BF16)
    want = (F.relu(y) + res).relu()
    torch_y = F.conv2d(x, w, b, padding=1)
    if bn:
        g, beta, mean, var = (t.float() for t in stats)
        torch_y = F.batch_norm(torch_y.float(), mean, var, g, beta, eps=1e-5).to(BF16)
    torch_bf16 = (F.relu(torch_y) + res).relu()
    nhwc = layout == "nhwc"

    def lay(t: torch.Tensor) -> torch.Tensor:
        return t.permute(0, 2, 3, 1).contiguous() if nhwc else t

    cfg = f"padding=1;bias=1;bn={bn};act=relu;residual=1;post_act=relu;layout={layout}"
    inputs = [lay(x), w, b, *(stats if bn else []), lay(res)]
    for _ in range(3):
        out = torch.empty(lay(res).shape, dtype=BF16)
        rt.KERNELS["plus.conv2d"].call(*inputs, config=cfg, out=out)
        got = out.permute(0, 3, 1, 2) if nhwc else out
        near(got, want, ulps=1)
        near(got, torch_bf16, ulps=3)
    # the weight and bias widened once (3 calls), kept as float32 by the cache
    widened = [k for k in rt.KERNELS["plus.conv2d"].cache.entries if k[-1] == ("float32",)]
    assert len(widened) == 2
    assert rt.KERNELS["plus.conv2d"].cache.packs >= 2


def test_float16_still_widens_from_one_row(cpu):
    """float16 keeps widening from one row (its rule is unchanged)."""
    cpu(NO_BF16)
    x, w = torch.randn(1, 64).half(), torch.randn(16, 64).half()
    out = torch.empty(1, 16, dtype=torch.float16)
    for _ in range(2):
        rt.KERNELS["plus.linear"].call(x, w, config="", out=out)
    torch.testing.assert_close(out, F.linear(x.float(), w.float()).half(), rtol=1e-3, atol=1e-3)
    assert len(float32_entries("plus.linear")) == 1


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_widened_results_keep_bfloat16_range(layout, cpu):
    """bfloat16 has float32's range: results past float16's (65504) stay finite, rounded to
    bfloat16 once (never through float16)."""
    cpu(NO_BF16)
    x, w = torch.full((1, 8, 4, 4), 300.0, dtype=BF16), torch.full((4, 8, 1, 1), 300.0, dtype=BF16)
    want = F.conv2d(x.float(), w.float()).to(BF16)  # 720000
    nhwc = layout == "nhwc"
    xin = x.permute(0, 2, 3, 1).contiguous() if nhwc else x
    out = torch.empty((1, 4, 4, 4), dtype=BF16)
    for _ in range(2):
        rt.KERNELS["plus.conv2d"].call(xin, w, config=f"layout={layout}", out=out)
        assert torch.equal(out.permute(0, 3, 1, 2) if nhwc else out, want)
    xl, wl = x.reshape(4, 32), w.reshape(1, 32).expand(8, 32).contiguous()
    lin = torch.empty(4, 8, dtype=BF16)
    for _ in range(2):
        rt.KERNELS["plus.linear"].call(xl, wl, config="act=relu", out=lin)
        assert torch.equal(lin, F.linear(xl.float(), wl.float()).to(BF16))
