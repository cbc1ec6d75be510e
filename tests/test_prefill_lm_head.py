"""The prefill step's LM head is a library GEMM (issue 38: bfloat16 prefill). The prefill
computes the logits of the last position only: ``hidden[:, -1:, :] @ W^T``, a one-row GEMM of
a batched operand. The +Graph identification matches that matmul alone (its weight's
transpose and a half model's rounding back to the half dtype outside the subgraph), and the
``torch.linear`` binder declined it ("cannot express it"): the LM head ran as one TIR matmul
(LLaMA-150m in bfloat16, prompt 128, batch 1: 26 of a 70 ms prefill) after a transpose of the
whole ``[vocab, hidden]`` weight on every call. The binder reads the weight through a
transpose bound anywhere in the block and takes the rounding that is the product's sole
reader, so the LM head is ``plus.linear`` on the weight as stored (shared with decode's)."""

from __future__ import annotations

import re

import plus_tvm
import pytest
import torch
from plus_tvm.lm.export import export_steps
from plus_tvm.lm.models import load_causal_lm

# big enough that the analytic cost model prefers the library for every GEMM
_SIZES = {
    "llama": {"hidden_size": 64, "intermediate_size": 128, "vocab_size": 512},
    "gpt2": {"n_embd": 64, "n_inner": 128, "vocab_size": 512},
}


@pytest.mark.parametrize(
    ("family", "dtype", "max_batch"),
    [
        ("llama", torch.bfloat16, 4),
        ("llama", torch.float32, 4),
        ("gpt2", torch.bfloat16, 1),  # a static batch of 1
    ],
)
def test_prefill_lm_head_is_a_library_gemm(family, dtype, max_batch, tmp_path):
    model = load_causal_lm(f"arch:{family}", **_SIZES[family]).to(dtype)
    vocab = model.config.vocab_size
    programs = export_steps(model, vocab, max_batch, 32)
    cm = plus_tvm.compile(programs.prefill, "llvm", options=plus_tvm.Options(dump_ir=tmp_path))
    dispatch = cm.stats["dispatch"]
    ir = (tmp_path / "01_dispatch.py").read_text()
    # no matmul left to TIR, no transpose of a weight left behind, nothing declined
    assert not re.findall(r"R\.matmul\(", ir), dispatch["declined"]
    assert not re.findall(r"R\.permute_dims\(p_model_\w*, axes=\[1, 0\]\)", ir)
    assert not any("cannot express" in k for k in dispatch["declined"]), dispatch["declined"]
    head = [
        line
        for line in ir.splitlines()
        if re.search(r'"plus\.(linear|matmul)"', line) and re.search(rf"out_ty=.*\b{vocab}\)", line)
    ]
    assert len(head) == 1, "the LM head is no library call"

    batch = max_batch
    ids = torch.randint(0, vocab, (batch, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    positions = torch.arange(9)[None].expand(batch, 9).contiguous()
    logits, *_ = cm(ids, mask, positions)
    with torch.no_grad():
        want = model(ids, attention_mask=mask).logits[:, -1]
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(
        torch.as_tensor(logits).to(torch.float32), want.float(), atol=tol, rtol=tol
    )
