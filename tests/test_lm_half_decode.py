"""A half-precision decode step is library calls (issue 38: GPT-2 in bfloat16 decoded at
~300 ms a token). A half model's batched matmul rounds its float32 product between torch's
flattening of batch and heads (``[B*H, S, T]``) and its inverse; with a symbolic batch the two
reshapes stayed around the cast, the attention entry matched nothing (two TIR products and a
TIR softmax per layer), and the output projection after it grew into the unmatched views and
was left a TIR matmul over half buffers (GPT-2 124M, batch 8: 54 ms of an 85 ms step).
``SimplifyViews`` folds the pair around the cast now."""

from __future__ import annotations

import re

import plus_tvm
import plus_tvm.runtime as rt
import pytest
import torch
from plus_tvm.lm.export import export_steps
from plus_tvm.lm.models import load_causal_lm
from plus_tvm.runtime import native


def _check_decode_ir(ir: str, layers: int, declined: object) -> None:
    # every linear (the LM head too) and both products of each attention are library calls:
    # no matmul is left to TIR, which would reduce over half buffers
    assert not re.findall(r"R\.matmul\(", ir), declined
    assert len(re.findall(r'"plus\.attention"', ir)) == layers
    assert "cache=1" in ir  # the decode step's attention, reading the cache in place


@pytest.mark.parametrize("family", ["gpt2", "llama"])  # llama: grouped-query, RMSNorm, SwiGLU
def test_fp16_decode_step_is_library_calls(family, tmp_path):
    model = load_causal_lm(f"arch:{family}").to(torch.float16)
    programs = export_steps(model, model.config.vocab_size, 4, 32)
    cm = plus_tvm.compile(programs.decode, "llvm", options=plus_tvm.Options(dump_ir=tmp_path))
    dispatch = cm.stats["dispatch"]
    layers = model.config.num_hidden_layers
    assert dispatch["library"].get("attention") == layers, dispatch
    _check_decode_ir((tmp_path / "01_dispatch.py").read_text(), layers, dispatch["declined"])


# falcon: multi-query (k and v of one head broadcast to the heads of q), whose two batched
# products were plus.matmul calls before the attention entry took them; bloom: ALiBi, its
# product of float32 casts of bfloat16 q and k^T (baddbmm), a float32 cast of the bias
@pytest.mark.parametrize("family", ["gpt2", "llama", "falcon", "bloom"])
def test_bf16_decode_is_library_calls_and_keeps_the_tokens(family, tmp_path):
    """The bfloat16 decode step: library calls only, its attention the native kernel where
    this CPU computes bfloat16 (no Python fallback), the tokens those of transformers on the
    same bfloat16 weights (symbolic batch: a batch of 2 with left padding)."""
    model = load_causal_lm(f"arch:{family}").to(torch.bfloat16)
    options = plus_tvm.Options(dump_ir=tmp_path)  # (decode is compiled after prefill)
    lm = plus_tvm.compile_lm(model, options=options, max_batch=2, max_length=32)
    layers = model.config.num_hidden_layers
    dispatch = lm.stats["decode"]["dispatch"]
    assert dispatch["library"].get("attention") == layers, dispatch
    _check_decode_ir((tmp_path / "01_dispatch.py").read_text(), layers, dispatch["declined"])
    ids = torch.tensor([[5, 6, 7, 9, 11, 13], [1, 1, 8, 12, 4, 10]])
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    with torch.no_grad():
        want = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
    native_bf16 = rt.use_native() and "bfloat16" in native.native_dtypes(
        rt.KERNELS["plus.attention"]
    )
    before = dict(native.status()["kernels"]["plus.attention"]) if native_bf16 else None
    got = lm.generate(ids, 6, attention_mask=mask)
    if before is not None:
        after = native.status()["kernels"]["plus.attention"]
        assert after["calls"] > before["calls"]
        assert after["fallbacks"] == before["fallbacks"]
    assert torch.equal(got, want)
