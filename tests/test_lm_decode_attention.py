"""The decode step's attention with its KV cache (issue 38 item 2): the warehouse's attention
entry matches it, the kernel reads the cache buffers in place (``plus.attention`` with
``cache=1``: no select, no permute, no repeated kv heads) and writes the new token into the
last slot; the tokens stay those of transformers."""

from __future__ import annotations

import plus_tvm.runtime as rt
import pytest
import torch
import tvm
from _shared_lm import compiled_lm
from _tensors import packed_call_vm
from plus_tvm.lm.kv_cache import KVCache
from plus_tvm.runtime import native


def _exe(shapes: list, config: str, out_shape: tuple):  # noqa: ANN202
    return packed_call_vm("plus.attention", shapes, config, out_shape)


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])  # multi-head, grouped-query, multi-query
@pytest.mark.parametrize("use_native", [True, False])  # the C++ kernel, the Python one
def test_cache_attention_kernel(layout, kv_heads, use_native):
    torch.manual_seed(0)
    b, h, t, d = 2, 4, 7, 8
    q = torch.randn(b, h, 1, d)
    k_cache, v_cache = torch.randn(t, b, kv_heads, d), torch.randn(t, b, kv_heads, d)
    k_new, v_new = torch.randn(b, kv_heads, 1, d), torch.randn(b, kv_heads, 1, d)
    mask = torch.zeros(b, 1, 1, t)
    mask[1, ..., :2] = float("-inf")  # a left-padded sequence
    keys = torch.cat([k_cache[:-1].permute(1, 2, 0, 3), k_new], 2)
    values = torch.cat([v_cache[:-1].permute(1, 2, 0, 3), v_new], 2)
    rep = h // kv_heads
    want = torch.softmax(
        q @ keys.repeat_interleave(rep, 1).transpose(-1, -2) * 0.3 + mask, -1
    ) @ values.repeat_interleave(rep, 1)

    def laid(x):
        return x.transpose(1, 2).contiguous() if layout == "bshd" else x

    inputs = [laid(q), k_cache, v_cache, laid(k_new), laid(v_new), mask]
    cfg = f"cache=1;layout={layout};mask=1;out_layout=bhsd;scale=0.3"
    if not use_native:
        out = torch.empty(b, h, 1, d)
        caches = [k_cache.clone(), v_cache.clone()]
        inputs[1:3] = caches
        rt.KERNELS["plus.attention"](*inputs, cfg, out)
        got = out
    else:
        assert rt.use_native(), native.status()["reason"]
        fn = _exe([tuple(x.shape) for x in inputs], cfg, (b, h, 1, d))
        tensors = [tvm.runtime.tensor(x.numpy()) for x in inputs]
        before = native.status()["kernels"]["plus.attention"]["fallbacks"]
        got = torch.from_numpy(fn(*tensors).numpy())
        assert native.status()["kernels"]["plus.attention"]["fallbacks"] == before
        caches = [torch.from_numpy(tensors[i].numpy()) for i in (1, 2)]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the new token is in the last slot of the caches, the past is untouched
    for cache, before_call, new in zip(caches, (k_cache, v_cache), (k_new, v_new)):
        assert torch.equal(cache[-1], new[:, :, 0])
        assert torch.equal(cache[:-1], before_call[:-1])


@pytest.fixture(scope="module", params=["gpt2", "llama"])  # llama: grouped-query heads
def compiled(request):
    return compiled_lm(request.param)  # (tests/_shared_lm.py: compiled once per session)


def test_decode_attention_reaches_the_warehouse_with_the_cache(compiled):
    model, lm = compiled
    layers = model.config.num_hidden_layers
    dispatch = lm.stats["decode"]["dispatch"]
    assert dispatch["library"].get("attention") == layers
    assert dispatch["matched"].get("attention", 0) >= layers


def test_decode_with_the_cache_keeps_the_tokens(compiled):
    model, lm = compiled
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 100, (2, 6), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    ids[1, :2] = 1
    with torch.no_grad():
        want = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False)
    assert torch.equal(lm.generate(ids, 8, attention_mask=mask), want)


def test_decode_attention_writes_the_cache_in_place(compiled, monkeypatch):
    """The loop hands the cache buffers to the decode step without a copy and the step's
    attention writes each new token into them: the tokens are right even when the loop's own
    write of the step's keys and values after it does nothing."""
    model, lm = compiled
    ids = torch.tensor([[5, 6, 7, 9]])
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=6, do_sample=False)
    real = KVCache.write
    monkeypatch.setattr(KVCache, "write", lambda self, start, fresh: start or real(self, 0, fresh))
    assert torch.equal(lm.generate(ids, 6), want)
