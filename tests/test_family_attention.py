"""Decode attention with the KV cache for the decoder families whose attention is written
differently (issue 38): Falcon's multi-query attention (k^T and v of one head broadcast to the
heads of q, with a symbolic batch and length) and BLOOM's ALiBi (heads folded into the batch,
``baddbmm`` with the scale as ``alpha``, the bias ``[B*H, 1, S]`` added before the head split)
reach the warehouse's attention entry in the prefill and the decode step; the decode step's
kernel reads the cache in place (``cache=1``) and writes the new token into its slot, and the
tokens stay those of transformers' greedy ``generate``. (Falcon in bfloat16:
tests/test_lm_half_decode.py.)"""

from __future__ import annotations

import pytest
import torch
from _shared_lm import compiled_lm
from plus_tvm.lm.kv_cache import KVCache


@pytest.fixture(scope="module", params=["falcon", "bloom"])
def compiled(request):
    return compiled_lm(request.param)  # (tests/_shared_lm.py: compiled once per session)


def _prompts() -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of two, the second row left-padded by two."""
    ids = torch.randint(3, 100, (2, 6), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    ids[1, :2] = 1
    return ids, mask


def _skip_the_loops_writes(monkeypatch) -> None:
    """The generation loop's write of a decode step's keys and values does nothing (the
    prefill's, at 0, still happens) and every cache buffer starts as NaN: only an attention
    that writes each new token into the cache keeps the tokens."""
    write, reserve = KVCache.write, KVCache.reserve

    def poisoned(self, batch, length):  # noqa: ANN001, ANN202
        reserve(self, batch, length)
        for buffer in self.buffers:
            buffer.fill_(float("nan"))

    monkeypatch.setattr(KVCache, "reserve", poisoned)
    monkeypatch.setattr(KVCache, "write", lambda self, start, fresh: start or write(self, 0, fresh))


def test_attention_reaches_the_warehouse_in_both_steps(compiled):
    model, lm = compiled
    layers = model.config.num_hidden_layers
    for step in ("prefill", "decode"):
        dispatch = lm.stats[step]["dispatch"]
        assert dispatch["library"].get("attention") == layers, (step, dispatch["declined"])


def test_decode_keeps_the_tokens_and_writes_the_cache_in_place(compiled, monkeypatch):
    """Greedy tokens of a left-padded batch are transformers', with the loop's own write of
    each decode step's keys and values doing nothing: the attention (``cache=1``) wrote each
    new token into the cache buffers itself."""
    model, lm = compiled
    ids, mask = _prompts()
    with torch.no_grad():
        want = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False)
    _skip_the_loops_writes(monkeypatch)
    assert torch.equal(lm.generate(ids, 8, attention_mask=mask), want)
