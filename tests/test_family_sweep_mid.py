"""Decoders in bfloat16 at a width where plus's CPU schedules take their symbolic-size paths.

The tiny configs of the other tests keep every loop nest below ParallelSpatialLLVM's
``min_static`` (256 static elements), so the row kernels, the element-wise chains and the lane
reductions under a symbolic batch and length were reached only by a manual sweep at hidden 256,
which found three schedules TVM could not build (a bfloat16 accumulator in vector lanes, a row
loop split into vectors, a ``Let`` bound twice). Here each family's prefill and decode must build
with plus's own schedules (no kernel rescued by the build fallback, which would hide such a
failure) and generate transformers' greedy tokens."""

from __future__ import annotations

import plus_tvm
import pytest
import torch
from plus_tvm.lm.models import load_causal_lm

# hidden and intermediate 256: a [batch * length, 256] nest is 256 static elements (GPT-2's
# LayerNorm and GELU rows at this size: tests/test_parallel_spatial_llvm.py, kernel by kernel)
_WIDE = {
    "llama": {"hidden_size": 256, "intermediate_size": 256, "num_hidden_layers": 1},
    "mixtral": {"hidden_size": 256, "intermediate_size": 256, "num_hidden_layers": 1},
}


@pytest.mark.parametrize("family", sorted(_WIDE))
def test_wide_bf16_decoder_builds_with_plus_schedules_and_keeps_the_tokens(family):
    model = load_causal_lm(f"arch:{family}", **_WIDE[family]).to(torch.bfloat16)
    lm = plus_tvm.compile_lm(model, max_batch=2, max_length=32)
    for step in ("prefill", "decode"):
        assert "schedule_fallbacks" not in lm.stats[step], lm.stats[step]["schedule_fallbacks"]
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 100, (2, 12), generator=gen)
    mask = torch.ones_like(ids)
    ids[1, :4], mask[1, :4] = 1, 0  # left padding
    want = model.generate(
        ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=1
    )
    got = lm.generate(ids, 6, attention_mask=mask, pad_token_id=1)
    assert torch.equal(got, want)
