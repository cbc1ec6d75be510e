"""The native ``plus.attention`` at one query position (a decode step): the direct loop of
``runtime/native/onednn_attention.cc`` (DecodeAttention) against torch's SDPA, at the head dims
of real decoders, with multi-query and grouped heads, left-padding masks, the KV cache read in
place (``cache=1``) and bfloat16; and no oneDNN primitive made per call as the keys grow."""

from __future__ import annotations

import plus_tvm.runtime as rt
import pytest
import torch
from _tensors import from_tvm, to_tvm
from plus_tvm.runtime import native
from torch.nn import functional as F  # noqa: N812


@pytest.fixture(scope="module", autouse=True)
def natives():
    if not rt.use_native():
        pytest.fail(f"native kernels unavailable: {native.status()['reason']}")


def stats() -> dict:
    return native.status()["kernels"]["plus.attention"]


def run(inputs, config: str, out_shape) -> tuple[torch.Tensor, list, int]:
    """The output, the inputs as the call left them (the cache written in place), and the
    calls handed to Python."""
    args = [to_tvm(t) for t in inputs]
    out = to_tvm(torch.empty(out_shape, dtype=inputs[0].dtype))
    before = stats()
    native.installed("plus.attention")(*args, config, out)  # as the VM calls it
    after = stats()
    assert after["calls"] + after["fallbacks"] == before["calls"] + before["fallbacks"] + 1
    return from_tvm(out), [from_tvm(a) for a in args], after["fallbacks"] - before["fallbacks"]


def sdpa(q, k, v, mask):
    """torch's SDPA on [B, H, 1, D] q and [B, Hkv, T, D] k, v (kv heads repeated), float32."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    m = None if mask is None else mask.float()
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=m)


def left_padding_mask(batch: int, length: int, pads: list[int], dtype) -> torch.Tensor:
    """transformers' additive mask [B, 1, 1, T]: the dtype's lowest value on each sequence's
    left padding, 0 elsewhere."""
    mask = torch.zeros(batch, 1, 1, length, dtype=dtype)
    for b, pad in enumerate(pads):
        mask[b, ..., :pad] = torch.finfo(dtype).min
    return mask


def close(got: torch.Tensor, want: torch.Tensor, dtype) -> None:
    if dtype == torch.bfloat16:  # one rounding of a float32 result; probabilities rounded too
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), want, rtol=2.0**-6, atol=2.0**-6)
    else:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


DTYPES = [torch.float32, torch.bfloat16]  # (bfloat16 one-query calls: native on any CPU)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [32, 64, 80, 128])
@pytest.mark.parametrize("kv_heads", [8, 2, 1])  # multi-head, grouped, multi-query
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_decode_step_reads_cache_in_place(dtype, d, kv_heads, layout):
    """cache=1: the new token written into the last slot, the [T, B, Hkv, D] cache read
    through strides, left padding masked; equal to SDPA over the written cache."""
    torch.manual_seed(d + kv_heads)
    b, h, t = 3, 8, 21
    q = torch.randn(b, h, 1, d).to(dtype)
    k_cache, v_cache = (torch.randn(t, b, kv_heads, d).to(dtype) for _ in range(2))
    k_cache[-1], v_cache[-1] = float("nan"), float("nan")  # the slot: written before it is read
    k_new, v_new = (torch.randn(b, kv_heads, 1, d).to(dtype) for _ in range(2))
    mask = left_padding_mask(b, t, [0, 5, 19], dtype)
    qin = q.transpose(1, 2).contiguous() if layout == "bshd" else q
    kin, vin = (x.transpose(1, 2).contiguous() if layout == "bshd" else x for x in (k_new, v_new))
    cfg = f"cache=1;layout={layout};mask=1;out_layout=bhsd"
    got, args, fallbacks = run([qin, k_cache, v_cache, kin, vin, mask], cfg, (b, h, 1, d))
    assert fallbacks == 0
    k_full, v_full = k_cache.clone(), v_cache.clone()
    k_full[-1], v_full[-1] = k_new[:, :, 0], v_new[:, :, 0]
    assert torch.equal(args[1], k_full) and torch.equal(args[2], v_full)
    want = sdpa(q, k_full.permute(1, 2, 0, 3), v_full.permute(1, 2, 0, 3), mask)
    close(got, want, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask_shape", [None, (2, 1, 1, 13), (2, 4, 1, 13), (1, 13), (2, 4, 1, 1)])
@pytest.mark.parametrize("out_layout", ["bhsd", "bshd"])
def test_one_query_broadcast_masks_and_scale(dtype, mask_shape, out_layout):
    """No cache: q, k, v [B, H, S, D], one query; masks of every broadcast form, an explicit
    scale, v with another head dim than q and k, the output in either layout."""
    torch.manual_seed(len(mask_shape or ()))
    b, h, kv, sk, d, dv = 2, 4, 2, 13, 32, 24
    q = torch.randn(b, h, 1, d).to(dtype)
    k, v = torch.randn(b, kv, sk, d).to(dtype), torch.randn(b, kv, sk, dv).to(dtype)
    inputs, cfg = [q, k, v], f"scale=0.21;out_layout={out_layout}"
    mask = None
    if mask_shape is not None:
        mask = torch.randn(*mask_shape).to(dtype)
        inputs.append(mask)
        cfg += ";mask=1"
    rep = h // kv
    want = F.scaled_dot_product_attention(
        q.float(),
        k.float().repeat_interleave(rep, 1),
        v.float().repeat_interleave(rep, 1),
        attn_mask=None if mask is None else mask.float(),
        scale=0.21,
    )
    shape = (b, h, 1, dv) if out_layout == "bhsd" else (b, 1, h, dv)
    got, _, fallbacks = run(inputs, cfg, shape)
    assert fallbacks == 0
    close(got, want.transpose(1, 2) if out_layout == "bshd" else want, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_query_causal_and_zero_masked(dtype):
    """causal=1 with one query is top-left aligned (torch's is_causal: it sees key 0 only);
    zero_masked=1 gives 0 for a sequence whose every key is masked (SDPA's safe softmax)."""
    torch.manual_seed(3)
    q, k, v = (torch.randn(2, 3, s, 16).to(dtype) for s in (1, 9, 9))
    got, _, fallbacks = run([q, k, v], "causal=1", (2, 3, 1, 16))
    assert fallbacks == 0
    close(
        got, F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True), dtype
    )
    mask = torch.zeros(2, 1, 1, 9, dtype=dtype)
    mask[1] = float("-inf")
    got, _, fallbacks = run([q, k, v, mask], "mask=1;zero_masked=1", (2, 3, 1, 16))
    assert fallbacks == 0
    want = F.scaled_dot_product_attention(q[:1].float(), k[:1].float(), v[:1].float())
    close(got[:1], want, dtype)
    assert torch.equal(got[1].float(), torch.zeros(3, 1, 16))


def test_decode_makes_no_primitive_per_length():
    """Keys of a new length at every call (as decode steps are) create no oneDNN primitive:
    the primitives a call of several queries makes are what the kernel counts."""
    torch.manual_seed(4)
    before = stats()["primitives"]
    for t in range(5, 12):
        q = torch.randn(1, 8, 1, 32)
        k, v = torch.randn(1, 8, t, 32), torch.randn(1, 8, t, 32)
        got, _, fallbacks = run([q, k, v], "", (1, 8, 1, 32))
        assert fallbacks == 0
        close(got, sdpa(q, k, v, None), torch.float32)
    assert stats()["primitives"] == before
    q = torch.randn(1, 8, 2, 32)  # two queries: the oneDNN plan, counted
    run([q, k, v], "", (1, 8, 2, 32))
    assert stats()["primitives"] == before + 1
