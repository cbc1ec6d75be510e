"""Half-precision ``plus.attention`` computed in float32 on CPUs without instructions for the
dtype (``_common.widened_half``; ``runtime/attention.py``, ``native/onednn_attention.cc``).

Both CPU answers run on any host: the Python kernel sees a forced ``cpu_dtypes`` (as in
tests/test_widened_bfloat16.py), the native kernel is a detached instance made for the dtypes
such a CPU computes (``attention_create_detached``), its fallback the Python kernel. The bar
for the widened result: float32's reference rounded once (one unit in the last place), and an
error against it no larger than torch's own half SDPA's.
"""

from __future__ import annotations

import plus_tvm.runtime as rt
import pytest
import torch
from _tensors import from_tvm, to_tvm
from plus_tvm.runtime import _common, native
from torch.nn import functional as F  # noqa: N812

BF16 = torch.bfloat16
NO_BF16 = ("float32",)  # an AVX2 CPU
NATIVE_BF16 = ("float32", "bfloat16")  # avx512_bf16 / AMX
ULP = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}


@pytest.fixture
def cpu(monkeypatch):
    """``cpu(dtypes)``: the Python kernels see a CPU computing ``dtypes`` natively."""

    def use(dtypes: tuple[str, ...]) -> None:
        monkeypatch.setattr(_common, "cpu_dtypes", lambda: dtypes)
        rt.clear_caches()

    yield use
    rt.clear_caches()


class Detached:
    """A native ``plus.attention`` for a CPU computing ``dtypes``, counting its fallbacks."""

    def __init__(self, dtypes: tuple[str, ...]) -> None:
        if not rt.use_native():
            pytest.fail(f"native kernels unavailable: {native.status()['reason']}")
        self.fallbacks = 0
        python = rt.KERNELS["plus.attention"]

        def fallback(*args):  # noqa: ANN002, ANN202
            self.fallbacks += 1
            python(*args)

        create = native._STATE.module["attention_create_detached"]  # (the loaded library)
        self.kernel = create(fallback, ",".join(d for d in dtypes if d in python.native_dtypes))

    def __call__(self, inputs, config: str, out_shape, dtype) -> torch.Tensor:  # noqa: ANN001
        out = to_tvm(torch.empty(out_shape, dtype=dtype))
        self.kernel(*[to_tvm(t) for t in inputs], config, out)
        return from_tvm(out)


def python(inputs, config: str, out_shape, dtype, computes=None) -> torch.Tensor:  # noqa: ANN001
    """The Python kernel's result; ``computes``: the dtype its SDPA must run in."""
    out = torch.empty(out_shape, dtype=dtype)
    seen = []
    real = F.scaled_dot_product_attention

    def spy(q, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        seen.append(q.dtype)
        return real(q, *args, **kwargs)

    kernel_f = rt.attention.F  # (the kernel module's stand-in for torch.nn.functional)
    kernel_f.scaled_dot_product_attention = spy
    try:
        rt.KERNELS["plus.attention"].call(*inputs, config=config, out=out)
    finally:
        kernel_f.scaled_dot_product_attention = real
    assert computes is None or seen == [computes]
    return out


def sdpa(q, k, v, mask, causal: bool, scale, dtype=None) -> torch.Tensor:  # noqa: ANN001
    """torch's SDPA on bhsd q, k, v (kv heads repeated) in ``dtype`` (float32: the reference;
    the half dtype: torch's own half path); the causal mask added to an explicit one."""
    dtype = dtype or q.dtype
    rep = q.shape[1] // k.shape[1]
    q, k, v = (
        q.to(dtype),
        k.to(dtype).repeat_interleave(rep, 1),
        v.to(dtype).repeat_interleave(rep, 1),
    )
    if mask is not None:
        mask = mask.to(dtype)
        if causal:
            keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
            mask = mask.masked_fill(~keep, float("-inf"))
            causal = False
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)


def laid(t: torch.Tensor, layout: str) -> torch.Tensor:
    return t.transpose(1, 2).contiguous() if layout == "bshd" else t


def check(got: torch.Tensor, want32: torch.Tensor, torch_half: torch.Tensor) -> None:
    """``got``: float32's ``want32`` rounded once (within a unit in the last place), and an
    error against it no larger than torch's half SDPA's (``torch_half``), up to float32's own
    rounding at a tie."""
    dtype = got.dtype
    scale = max(1.0, float(want32.abs().max()))
    torch.testing.assert_close(
        got.float(), want32.to(dtype).float(), rtol=ULP[dtype], atol=ULP[dtype] * scale
    )
    err = float((got.float() - want32).abs().max())
    torch_err = float((torch_half.float() - want32).abs().max())
    assert err <= torch_err + 1e-6 * scale, (err, torch_err)


# (mask shape, mask dtype (None: the call's), causal, scale, kv heads, layout, out layout);
# q: [2, 4, 6, 16], 9 keys
F32 = torch.float32
CASES = [
    (None, None, False, None, 4, "bhsd", "bhsd"),
    (None, None, True, 0.3, 4, "bshd", "bhsd"),
    ((2, 1, 1, 9), None, False, None, 2, "bhsd", "bshd"),  # padding mask, grouped heads
    ((2, 1, 1, 9), F32, False, None, 2, "bshd", "bhsd"),
    ((2, 4, 6, 9), None, True, None, 1, "bshd", "bshd"),  # a full mask and causal, one kv head
    ((2, 4, 6, 9), F32, True, None, 1, "bhsd", "bhsd"),
    ((6, 9), F32, False, 0.2, 4, "bhsd", "bhsd"),
]


def _case(mask_shape, kv: int, dtype, mask_dtype, sq: int = 6, causal: bool = False):
    torch.manual_seed(kv + len(mask_shape or ()))
    b, h, sk, d = 2, 4, 9, 16
    q = torch.randn(b, h, sq, d).to(dtype)
    k, v = torch.randn(b, kv, sk, d).to(dtype), torch.randn(b, kv, sk, d).to(dtype)
    mask = None
    if mask_shape is not None:
        mask = torch.randn(*mask_shape).to(mask_dtype or dtype)
        mask[..., -1] = float("-inf")  # a masked key
    return q, k, v, mask


def _config(mask, causal, scale, layout, out_layout) -> str:  # noqa: ANN001
    cfg = f"layout={layout};out_layout={out_layout};causal={int(causal)}"
    if mask is not None:
        cfg += ";mask=1"
    if scale is not None:
        cfg += f";scale={scale}"
    return cfg


@pytest.mark.parametrize("dtype", [BF16, torch.float16])
@pytest.mark.parametrize("mask_shape,mask_dtype,causal,scale,kv,layout,out_layout", CASES)
def test_python_kernel_widens_without_instructions(
    mask_shape, mask_dtype, causal, scale, kv, layout, out_layout, dtype, cpu
):
    """float32 on widened q, k, v and mask, rounded once: masks, causal, scale, grouped heads
    and both layouts as in float32."""
    cpu(NO_BF16)
    q, k, v, mask = _case(mask_shape, kv, dtype, mask_dtype)
    want32 = sdpa(q, k, v, mask, causal, scale, torch.float32)
    torch_half = sdpa(q, k, v, mask, causal, scale)
    inputs = [laid(q, layout), laid(k, layout), laid(v, layout)] + (
        [mask] if mask is not None else []
    )
    cfg = _config(mask, causal, scale, layout, out_layout)
    got = python(inputs, cfg, laid(want32, out_layout).shape, dtype, computes=torch.float32)
    check(laid(got, out_layout), want32, torch_half)


@pytest.mark.parametrize("mask_shape,mask_dtype,causal,scale,kv,layout,out_layout", CASES)
def test_native_kernel_widens_bfloat16_without_instructions(
    mask_shape, mask_dtype, causal, scale, kv, layout, out_layout, cpu
):
    """The native kernel computes it itself (no fallback to Python), as the Python kernel."""
    cpu(NO_BF16)
    kernel = Detached(NO_BF16)
    q, k, v, mask = _case(mask_shape, kv, BF16, mask_dtype)
    want32 = sdpa(q, k, v, mask, causal, scale, torch.float32)
    inputs = [laid(q, layout), laid(k, layout), laid(v, layout)] + (
        [mask] if mask is not None else []
    )
    cfg = _config(mask, causal, scale, layout, out_layout)
    shape = laid(want32, out_layout).shape
    for _ in range(2):  # (the plan made, then reused)
        got = kernel(inputs, cfg, shape, BF16)
        check(laid(got, out_layout), want32, sdpa(q, k, v, mask, causal, scale))
    assert kernel.fallbacks == 0


def test_native_kernel_zero_masked_rows_and_cache(cpu):
    """A batch whose every key is masked gets 0 (zero_masked); cache=1 with more than one
    query: the new token written into the cache's last slot before the widened cache is read."""
    cpu(NO_BF16)
    kernel = Detached(NO_BF16)
    torch.manual_seed(5)
    q, k, v = (torch.randn(2, 3, 4, 8).to(BF16) for _ in range(3))
    mask = torch.zeros(2, 1, 1, 4).to(BF16)
    mask[1] = float("-inf")
    got = kernel([q, k, v, mask], "mask=1;zero_masked=1", q.shape, BF16)
    want32 = sdpa(q, k, v, mask, False, None, torch.float32)
    want32[1] = 0.0
    torch_bf16 = sdpa(q, k, v, mask, False, None)
    torch_bf16[1] = 0.0  # (what zero_masked asks of torch's path too)
    check(got, want32, torch_bf16)
    k_cache, v_cache = (torch.randn(5, 2, 3, 8).to(BF16) for _ in range(2))
    k_new, v_new = (torch.randn(2, 3, 1, 8).to(BF16) for _ in range(2))
    args = [q, k_cache, v_cache, k_new, v_new]
    got = kernel(args, "cache=1", q.shape, BF16)
    k_cache[-1], v_cache[-1] = k_new[:, :, 0], v_new[:, :, 0]
    k_full, v_full = k_cache.permute(1, 2, 0, 3), v_cache.permute(1, 2, 0, 3)
    check(
        got,
        sdpa(q, k_full, v_full, None, False, None, torch.float32),
        sdpa(q, k_full, v_full, None, False, None),
    )
    assert kernel.fallbacks == 0


def _probabilities_tell():
    """Two keys whose probabilities, 0.50073 and 0.49927, round to 0.5 each in bfloat16, with
    values +-768: float32 gives 768 * (p0 - p1) = 1.125; a path that rounds the probabilities
    (or torch's unnormalised exponentials) gives 0 (or about 1.5)."""
    q = torch.zeros(1, 1, 4, 4, dtype=BF16)
    q[..., 0] = 1.0
    k = torch.zeros(1, 1, 2, 4, dtype=BF16)
    k[0, 0, 0, 0] = 0.0029296875  # 3 * 2^-10: the logits differ by that (scale 1)
    v = torch.zeros(1, 1, 2, 4, dtype=BF16)
    v[0, 0, 0], v[0, 0, 1] = 768.0, -768.0
    return q, k, v


def test_probabilities_are_not_rounded_where_widened(cpu):
    """Without bfloat16 instructions both kernels return float32's 1.125; with them they keep
    their bfloat16 paths (the Python kernel torch's SDPA, bit for bit; the native kernel its
    bfloat16 primitives, or torch's where oneDNN has none), which round: never 1.125."""
    q, k, v = _probabilities_tell()
    want32 = sdpa(q, k, v, None, False, 1.0, torch.float32)
    assert torch.allclose(want32[..., 0], torch.tensor(1.125), atol=1e-3)
    torch_bf16 = sdpa(q, k, v, None, False, 1.0)
    assert float((torch_bf16.float() - want32).abs().max()) > 0.25  # (torch's path rounds)
    cpu(NO_BF16)
    assert torch.equal(python([q, k, v], "scale=1.0", q.shape, BF16), want32.to(BF16))
    detached = Detached(NO_BF16)
    assert torch.equal(detached([q, k, v], "scale=1.0", q.shape, BF16), want32.to(BF16))
    assert detached.fallbacks == 0
    cpu(NATIVE_BF16)
    assert torch.equal(python([q, k, v], "scale=1.0", q.shape, BF16), torch_bf16)
    got = Detached(NATIVE_BF16)([q, k, v], "scale=1.0", q.shape, BF16)
    assert float((got.float() - want32).abs().max()) > 0.25


def test_native_and_python_kernels_widen_from_the_same_rows(cpu):
    """The native kernel's kWidenMinRows is ``WIDEN_MIN_ROWS["bfloat16"]``: below it (queries;
    one apart, which the direct loop runs) it hands the call to Python, which then keeps
    torch's bfloat16 SDPA; from it, both widen (batch and heads do not count)."""
    cpu(NO_BF16)
    rows = _common.WIDEN_MIN_ROWS["bfloat16"]
    assert rows >= 2  # (one query is the direct loop's)
    kernel = Detached(NO_BF16)
    q, k, v = (t.expand(2, 3, -1, -1).contiguous() for t in _probabilities_tell())
    for sq, widened in ((rows - 1, False), (rows, True)):
        qs = q[:, :, :sq].contiguous()
        want32 = sdpa(qs, k, v, None, False, 1.0, torch.float32).to(BF16)
        before = kernel.fallbacks
        got = kernel([qs, k, v], "scale=1.0", qs.shape, BF16)
        assert kernel.fallbacks - before == (0 if widened else 1)
        assert torch.equal(python([qs, k, v], "scale=1.0", qs.shape, BF16), got)
        assert torch.equal(got, want32) == widened


def test_python_kernel_one_query_widens_float16_only(cpu):
    """A decode step (one query): bfloat16 keeps torch's SDPA (it wins on long caches, and the
    native direct loop runs it in the VM), float16 widens (torch's float16 is 3-7x slower)."""
    cpu(NO_BF16)
    q, k, v = _probabilities_tell()
    q1 = q[:, :, :1].contiguous()
    got = python([q1, k, v], "scale=1.0", q1.shape, BF16, computes=BF16)
    assert torch.equal(got, sdpa(q1, k, v, None, False, 1.0))
    q, k, v, mask = _case((2, 1, 1, 9), 2, torch.float16, None, sq=1)
    got = python([q, k, v, mask], "mask=1", q.shape, torch.float16, computes=torch.float32)
    check(got, sdpa(q, k, v, mask, False, None, torch.float32), sdpa(q, k, v, mask, False, None))
