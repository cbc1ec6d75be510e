"""The bucketed decode (issue 38, CUDA graphs on decode): the past is a length bucket
``Lb = S * m`` whose positions after the new token's slot are masked, the slot is an int64
tensor input written by the attention kernel (``plus.attention`` with ``cache=1;slot=1``),
the batch is padded to a bucket with dummy rows. Forced on for the CPU here: the greedy tokens
stay transformers' across length buckets, with garbage in the unused cache positions and the
loop's own cache write skipped; on sm_90 (compile only) no kernel is left outside the capture
regions because of the length."""

from __future__ import annotations

import functools
import re

import plus_tvm
import plus_tvm.runtime as rt
import pytest
import torch
import tvm
from _shared_lm import MAX_BATCH, MAX_LENGTH, _compiled
from _tensors import packed_call_vm
from conftest import strict_pass_context
from plus_tvm.lm import CompiledLM
from plus_tvm.lm.export import bucket_step, export_steps
from plus_tvm.lm.kv_cache import KVCache
from plus_tvm.lm.models import load_causal_lm

CUDA = {"kind": "cuda", "arch": "sm_90"}
NEW = 12  # a prompt of 8 and 12 new tokens: slots 8..18 cross the bucket boundary at 16


def _bucketed(name: str, **overrides: object) -> tuple[torch.nn.Module, CompiledLM]:
    model, lm = _bucketed_once(name, tuple(sorted(overrides.items())))
    fresh = CompiledLM(
        lm.prefill, lm.decode, lm.layout, lm.limits, lm.eos_token_id, lm.pad_token_id,
        lm.name, lm.decode_bucket,
    )  # fmt: skip
    return model, fresh


@functools.cache
def _bucketed_once(name: str, overrides: tuple) -> tuple[torch.nn.Module, CompiledLM]:
    """The bucketed decode compiled beside the session's shared prefill (tests/_shared_lm.py:
    the prefill does not depend on the decode's form)."""
    model, shared = _compiled(name, overrides)
    step = bucket_step(MAX_LENGTH, 32)
    programs = export_steps(
        model, shared.limits.vocab_size, MAX_BATCH, MAX_LENGTH, step, with_prefill=False
    )
    with strict_pass_context():
        decode = plus_tvm.compile(programs.decode, "llvm")
    lm = CompiledLM(
        shared.prefill, decode, shared.layout, shared.limits, shared.eos_token_id,
        shared.pad_token_id, shared.name, step,
    )  # fmt: skip
    return model, lm


def _prompts(batch: int, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(3, 100, (batch, 8), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    if batch > 1:
        mask[1, :pad] = 0
        ids[1, :pad] = 1
    return ids, mask


def _garbage_and_no_loop_write(monkeypatch, loop_writes: bool = False) -> None:
    """Every cache position after the prompt holds large finite garbage (not zeros) and the
    loop's write of a decode step's keys and values does nothing (the prefill's, at 0,
    still happens): only a decode that masks the positions after the slot and whose attention
    writes each new token at the slot keeps the tokens. ``loop_writes``: the loop's write is
    kept (a decode whose attention is not the library call: the garbage alone)."""
    write = KVCache.write

    def garbage(self, start):  # noqa: ANN001, ANN202
        gen = torch.Generator().manual_seed(1)
        for buffer in self.buffers:
            tail = buffer[start:]
            tail.copy_(torch.randn(tail.shape, generator=gen) * 1e3)

    monkeypatch.setattr(KVCache, "clear_from", garbage)
    if not loop_writes:
        monkeypatch.setattr(
            KVCache, "write", lambda self, start, fresh: start or write(self, 0, fresh)
        )


FAMILIES = {
    "gpt2": {},
    "llama": {},  # grouped-query, rotary
    "mistral": {"sliding_window": 6},  # (a window shorter than the prompt)
    "falcon": {},  # multi-query
    "bloom": {},  # ALiBi from the mask's cumsum
}
# (Qwen2 is LLaMA's decode with biases on q, k, v: the same bucketed attention, mask and slot;
# its own tokens are checked in tests/test_lm_generate.py's family sweep)
# BLOOM's bucketed decode keeps its attention in TIR (the [B * H] scores' regrouping over the
# bucketed mask is not matched yet): its tokens are checked with the loop writing the cache
TIR_ATTENTION = {"bloom"}


@pytest.mark.parametrize(
    "family",
    [f if f in ("gpt2", "llama") else pytest.param(f, marks=pytest.mark.slow) for f in FAMILIES],
)
def test_bucketed_decode_keeps_the_tokens(family, monkeypatch):
    model, lm = _bucketed(family, **FAMILIES[family])
    layers = model.config.num_hidden_layers
    library = lm.stats["decode"]["dispatch"]["library"].get("attention")
    assert library == (None if family in TIR_ATTENTION else layers)
    assert lm.stats["decode_buckets"] == {
        "enabled": True,
        "length_step": 16,
        "length_buckets": 4,
        "batch_buckets": [1, 2, 4],
        "shapes": 12,
    }
    _garbage_and_no_loop_write(monkeypatch, loop_writes=family in TIR_ATTENTION)
    for batch, pad in ((1, 0), (2, 3)):
        ids, mask = _prompts(batch, pad)
        with torch.no_grad():
            want = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False)
        assert torch.equal(lm.generate(ids, NEW, attention_mask=mask), want), (batch, pad)


def test_dummy_rows_give_finite_logits_and_the_cache_is_allocated_once(monkeypatch):
    """A batch of 3 runs in the bucket of 4: the dummy row (mask all 0) computes finite
    logits; the cache is one flat storage per tensor, the same for a later batch of 1 (its
    views start at the same address)."""
    model, lm = _bucketed("gpt2")
    seen = []
    step = CompiledLM._decode_step

    def recording(self, *args):  # noqa: ANN001, ANN202
        out = step(self, *args)
        seen.append((args[0].shape[0], torch.as_tensor(out[0]).clone()))
        return out

    monkeypatch.setattr(CompiledLM, "_decode_step", recording)
    ids, mask = _prompts(3, 2)
    with torch.no_grad():
        want = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
    assert torch.equal(lm.generate(ids, 4, attention_mask=mask), want)
    assert seen and all(rows == 4 and torch.isfinite(logits).all() for rows, logits in seen)
    address = [b.data_ptr() for b in lm._cache.buffers]
    allocated = lm.stats["kv_cache"]["allocated_bytes"]
    lm.generate(ids[:1], 4)
    assert [b.data_ptr() for b in lm._cache.buffers] == address
    assert lm.stats["kv_cache"]["allocated_bytes"] == allocated > 0


@pytest.mark.parametrize("use_vm", [False, True])  # the Python kernel; through the VM (native
def test_slot_kernel_writes_at_the_slot(use_vm):  # parser: the slot runs in Python)
    torch.manual_seed(0)
    b, h, t, d, slot = 2, 4, 8, 8, 3
    q = torch.randn(b, h, 1, d)
    k_cache, v_cache = torch.randn(t, b, 2, d), torch.randn(t, b, 2, d)
    k_new, v_new = torch.randn(b, 2, 1, d), torch.randn(b, 2, 1, d)
    mask = torch.zeros(b, 1, 1, t)
    mask[..., slot + 1 :] = float("-inf")
    keys, values = k_cache.permute(1, 2, 0, 3).clone(), v_cache.permute(1, 2, 0, 3).clone()
    keys[:, :, slot], values[:, :, slot] = k_new[:, :, 0], v_new[:, :, 0]
    want = torch.softmax(q @ keys.repeat_interleave(2, 1).transpose(-1, -2) + mask, -1)
    want = want @ values.repeat_interleave(2, 1)
    inputs = [q, k_cache.clone(), v_cache.clone(), k_new, v_new, torch.tensor([slot]), mask]
    cfg = "cache=1;layout=bhsd;mask=1;out_layout=bhsd;scale=1.0;slot=1"
    if use_vm:
        tensors = [tvm.runtime.tensor(x.numpy()) for x in inputs]
        fn = _exe_with_slot([tuple(x.shape) for x in inputs], cfg, (b, h, 1, d))
        got = torch.from_numpy(fn(*tensors).numpy())
        caches = [torch.from_numpy(tensors[i].numpy()) for i in (1, 2)]
    else:
        got = torch.empty(b, h, 1, d)
        rt.KERNELS["plus.attention"](*inputs, cfg, got)
        caches = inputs[1:3]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for cache, before, new in zip(caches, (k_cache, v_cache), (k_new, v_new)):
        assert torch.equal(cache[slot], new[:, :, 0])
        others = [i for i in range(t) if i != slot]
        assert torch.equal(cache[others], before[others])


def _exe_with_slot(shapes: list, config: str, out_shape: tuple):  # noqa: ANN202
    dtypes = ["int64" if i == 5 else "float32" for i in range(len(shapes))]  # in5: the slot
    return packed_call_vm("plus.attention", shapes, config, out_shape, dtypes)


def test_sm90_no_kernel_stays_outside_for_the_length(monkeypatch):
    """Compile only, sm_90: the bucketed decode's length is a capture variable, and every
    kernel ``main`` launches itself whose arguments' shapes carry the length reads a model
    input (the cache, which TVM's capture rewrite never treats as static); none is left
    outside for a symbolic size."""
    import plus_tvm.compiler as compiler

    captured = []
    report = compiler.cuda_graph_report

    def keep(mod, mode):  # noqa: ANN001, ANN202
        captured.append(mod)
        return report(mod, mode)

    monkeypatch.setattr(compiler, "cuda_graph_report", keep)
    model = load_causal_lm("arch:gpt2")
    step = bucket_step(MAX_LENGTH, 32)
    programs = export_steps(model, model.config.vocab_size, 4, MAX_LENGTH, step, False)
    stats = plus_tvm.inspect(programs.decode, target=CUDA)
    cg = stats["cuda_graph"]
    assert cg["kernels"] == cg["kernels_captured"] + len(cg["outside"])
    main = captured[-1]["main"]
    mask = next(p for p in main.params if p.name.startswith("attention_mask"))
    length = mask.ty.shape.values[1]  # (the bucket count m of the [batch, m, S] mask)
    assert isinstance(length, tvm.tirx.Var)
    declared = [str(v) for v in main.attrs["relax.rewrite_cuda_graph.capture_symbolic_vars"]]
    assert str(length) in declared
    reasons = _outside_with(main, captured[-1], length)
    assert reasons and set(reasons) == {"reads a model input"}, reasons
    # the library calls and most kernels run in graphs (today's decode: 11 of 26 kernels)
    assert cg["kernels_captured"] >= 0.75 * cg["kernels"]


def _outside_with(main, mod, var) -> list[str]:  # noqa: ANN001
    """The report's reason for each kernel ``main`` launches itself (outside every capture
    region) whose arguments' shapes use ``var``."""
    from plus_tvm.cuda_graph_report import _aliases, _reason, _returned_vars, num_inputs
    from plus_tvm.passes._capture_calls import bindings
    from plus_tvm.passes._graph_staging import is_kernel_call, is_library_call

    inputs = set(main.params[: num_inputs(mod)])
    returned = _aliases(main, _returned_vars(main.body.body))
    found = []
    for binding in bindings(main):
        call = binding.value
        if not (is_library_call(call) or is_kernel_call(call, mod)):
            continue
        shapes = [str(a.ty.shape) for a in call.args if isinstance(a.ty, tvm.relax.TensorType)]
        if any(re.search(rf"\b{var.name}\b", s) for s in shapes):
            found.append(_reason(call, inputs, returned))
    return found
