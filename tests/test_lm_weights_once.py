"""A CompiledLM holds each weight once (issue 38): its prefill and decode steps are two compiles
of one module, and each compile copied every weight; ``share_weights`` makes both executables
take the same buffers (GPT-2 fp32 held ~500 MB twice). ``stats["weights"]`` counts the distinct
buffers both steps hold, host arrays and device copies."""

from __future__ import annotations

import numpy as np
import plus_tvm
import pytest
import torch
from plus_tvm.errors import PlusError
from plus_tvm.frontend import import_exported
from plus_tvm.lm.models import load_causal_lm, weight_bytes
from plus_tvm.shared_weights import held_weights, share_weights


def _greedy(model, ids, new=6) -> torch.Tensor:
    with torch.no_grad():
        mask = torch.ones_like(ids)
        return model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False)


@pytest.fixture(scope="module")
def gpt2():  # tied embeddings: wte is the LM head's weight
    model = load_causal_lm("arch:gpt2")
    return model, plus_tvm.compile_lm(model, max_batch=2, max_length=32)


def test_steps_hold_each_weight_once(gpt2):
    model, lm = gpt2
    once = weight_bytes(model)  # (the tied table counted once)
    assert lm.stats["weights"]["bytes"] == once  # after compile: one host copy
    ids = torch.tensor([[5, 6, 7, 9, 11]])
    assert torch.equal(lm.generate(ids, 6), _greedy(model, ids))
    # after running: placed on the device (here the CPU) once, no host copy kept beside it
    assert lm.stats["weights"]["bytes"] == once
    assert lm.stats["weights"]["tensors"] == len(list(model.parameters()))
    prefill = [w for w, _, _ in lm.prefill.weight_entries()]
    decode = [w for w, _, _ in lm.decode.weight_entries()]
    assert {id(w) for w in decode} <= {id(w) for w in prefill}


def test_shared_weights_follow_in_place_updates(gpt2):
    model, lm = gpt2
    ids = torch.tensor([[3, 8, 13, 21]])
    with torch.no_grad():
        for p in (model.lm_head.weight, model.transformer.h[0].mlp.c_fc.weight):
            saved = p.clone()
            p.mul_(-1.5)  # (both steps refresh the one buffer they share)
            try:
                assert torch.equal(lm.generate(ids, 5), _greedy(model, ids, 5))
            finally:
                p.copy_(saved)
    assert torch.equal(lm.generate(ids, 5), _greedy(model, ids, 5))
    assert lm.stats["weights"]["bytes"] == weight_bytes(model)


def test_decode_call_takes_the_past_without_a_copy(gpt2):
    # lm.decode(...) passes CPU torch tensors by DLPack (it copied every input before): the
    # attention writes the new token's keys and values into the slot of the tensors given
    model, lm = gpt2
    ids = torch.tensor([[5, 6, 7, 9]])
    logits, *fresh = lm.prefill(ids, torch.ones_like(ids), torch.arange(4)[None])
    past = [torch.cat([t, torch.zeros_like(t[:1])]) for t in fresh]  # + the new token's slot
    token = logits.argmax(-1, keepdim=True)
    mask = torch.ones(1, 5, dtype=torch.long)
    out, *new = lm.decode(token, mask, torch.tensor([[4]]), *past)
    for given, made in zip(past, new):
        assert torch.equal(given[-1:], made)
    with torch.no_grad():
        want = model(torch.cat([ids, token], 1)).logits[:, -1]
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)


class _MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(8, 16)
        self.down = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def test_weights_without_torch_source_are_shared_by_value():
    torch.manual_seed(0)
    module = _MLP().eval()
    x = torch.randn(2, 8)
    mod, params = import_exported(torch.export.export(module, (x,)))
    a = plus_tvm.compile((mod, params))  # (an IRModule with numpy params: no torch tensors)
    b = plus_tvm.compile((mod, {k: v.copy() for k, v in params.items()}))
    one = sum(v.nbytes for v in params.values())
    assert held_weights([a, b])["bytes"] == 2 * one
    share_weights([a, b])
    assert held_weights([a, b])["bytes"] == one
    want = module(x).detach().numpy()
    for cm in (a, b):
        np.testing.assert_allclose(cm(x.numpy()), want, rtol=1e-5, atol=1e-5)
    assert held_weights([a, b])["bytes"] == one
    with pytest.raises(PlusError, match="has run"):  # (a captured graph keeps its addresses)
        a.use_weights([w for w, _, _ in b.weight_entries()])


def test_use_weights_checks_shapes():
    torch.manual_seed(0)
    a = plus_tvm.compile(_MLP().eval(), "llvm", (torch.randn(2, 8),))
    weights = [w for w, _, _ in a.weight_entries()]
    with pytest.raises(PlusError, match="weights given for"):
        a.use_weights(weights[:-1])
    with pytest.raises(PlusError, match="weight 0"):
        a.use_weights([weights[1], weights[0], *weights[2:]])


@pytest.mark.parametrize("target,dtype", [("llvm", torch.bfloat16), ("cuda", torch.float32)])
def test_two_compiles_of_one_module_share_its_weights(target, dtype):
    # half precision; a CUDA model (compile-only without a GPU: the host arrays are shared,
    # with one: the device copies, placed once)
    torch.manual_seed(0)
    module = _MLP().eval().to(dtype)
    x = torch.randn(2, 8, dtype=dtype)
    a = plus_tvm.compile(module, target, (x,))
    b = plus_tvm.compile(module, target, (x[:1],))  # (another program of the same module)
    assert held_weights([a, b])["bytes"] == 2 * weight_bytes(module)
    share_weights([a, b])
    assert held_weights([a, b])["bytes"] == weight_bytes(module)
    if target == "llvm":
        for cm, inp in ((a, x), (b, x[:1])):
            torch.testing.assert_close(cm(inp), module(inp).detach())
        assert held_weights([a, b])["bytes"] == weight_bytes(module)
