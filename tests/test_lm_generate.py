"""plus_tvm.compile_lm / CompiledLM.generate (issue 38): greedy tokens identical to
transformers' generate on the same random weights (batch 1 and a left-padded batch 2), eos and
padding, sampling, the two compiled steps in a loop of one's own, the KV cache's stats and
reuse, the CLI and the bench function. One compile per family for the whole session
(tests/_shared_lm.py); the other decoder families of arch_suite are the ``slow`` sweep at the
end."""

from __future__ import annotations

import json

import pytest
import torch
from _shared_lm import MAX_BATCH, MAX_LENGTH, compiled_lm
from plus_tvm.cli import main as cli_main
from plus_tvm.lm import CompiledLM
from plus_tvm.lm.bench import bench_generate

NEW = 12


def _prompts(batch: int, pad: int = 0, length: int = 8, seed: int = 1) -> tuple:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 100, (batch, length), generator=gen)
    mask = torch.ones_like(ids)
    if pad:
        mask[-1, :pad] = 0
        ids[-1, :pad] = 1  # (the pad id of the suite's configs)
    return ids, mask


def _reference(model, ids, mask, new=NEW, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(
            ids, attention_mask=mask, max_new_tokens=new, do_sample=False, **kwargs
        )


@pytest.fixture(scope="module")
def gpt2():
    return compiled_lm("gpt2")  # (compiled once per session, shared with other files)


@pytest.fixture(scope="module")
def llama():
    return compiled_lm("llama")


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("batch,pad", [(1, 0), (2, 3)])
def test_greedy_matches_transformers(request, family, batch, pad):
    model, lm = request.getfixturevalue(family)
    assert isinstance(lm, CompiledLM)
    ids, mask = _prompts(batch, pad)
    out = lm.generate(ids, NEW, attention_mask=mask)
    assert out.dtype == torch.long and out.shape[0] == batch
    assert torch.equal(out, _reference(model, ids, mask))


def test_one_compile_serves_other_batches_and_lengths(llama):
    model, lm = llama
    for batch, length, pad in ((3, 5, 2), (4, 11, 0), (1, 1, 0)):
        ids, mask = _prompts(batch, pad, length, seed=batch + length)
        assert torch.equal(
            lm.generate(ids, 6, attention_mask=mask), _reference(model, ids, mask, 6)
        )


def test_eos_pads_finished_sequences_as_transformers(llama):
    model, lm = llama
    ids, mask = _prompts(2, 3)
    start = ids.shape[1]
    free = lm.generate(ids, NEW, attention_mask=mask, eos_token_id=[])
    eos = int(free[0, start + 2])  # the third new token of the first sequence
    end = start + free[0, start:].tolist().index(eos)  # (its first place)
    out = lm.generate(ids, NEW, attention_mask=mask, eos_token_id=eos, pad_token_id=1)
    ref = _reference(model, ids, mask, eos_token_id=eos, pad_token_id=1)
    assert torch.equal(out, ref)
    assert int(out[0, end]) == eos
    assert (out[0, end + 1 :] == 1).all()  # padding after the end, as transformers


def test_sampling_warpers(llama):
    model, lm = llama
    ids, mask = _prompts(2, 3)
    greedy = lm.generate(ids, NEW, attention_mask=mask)
    for kwargs in ({"top_k": 1}, {"top_p": 1e-6}, {"temperature": 0.5, "top_k": 1}):
        torch.manual_seed(0)
        assert torch.equal(
            lm.generate(ids, NEW, do_sample=True, attention_mask=mask, **kwargs), greedy
        )
    torch.manual_seed(3)
    first = lm.generate(ids, NEW, do_sample=True, attention_mask=mask, eos_token_id=[])
    torch.manual_seed(3)
    again = lm.generate(ids, NEW, do_sample=True, attention_mask=mask, eos_token_id=[])
    assert torch.equal(first, again) and first.shape == greedy.shape
    assert int(first.max()) < 100


def test_prefill_and_decode_in_a_loop_of_ones_own(llama):
    model, lm = llama
    ids, mask = _prompts(1)
    positions = torch.arange(ids.shape[1])[None]
    logits, *cache = lm.prefill(ids, mask, positions)
    assert tuple(logits.shape) == (1, 100)
    assert all(tuple(t.shape) == (8, 1, 2, 8) for t in cache)  # [length, batch, heads, dim]
    tokens = [int(logits.argmax(-1))]
    past = [torch.as_tensor(t).clone() for t in cache]
    for _ in range(3):
        slot = [torch.cat([p, torch.zeros_like(p[:1])]) for p in past]  # + the new token's slot
        length = past[0].shape[0]
        logits, *fresh = lm.decode(
            torch.tensor([[tokens[-1]]]),
            torch.ones(1, length + 1, dtype=torch.long),
            torch.tensor([[length]]),
            *slot,
        )
        past = [torch.cat([p, torch.as_tensor(f)]) for p, f in zip(past, fresh)]
        tokens.append(int(logits.argmax(-1)))
    assert tokens == lm.generate(ids, 4)[0, ids.shape[1] :].tolist()


def test_kv_cache_stats_and_reuse(llama):
    model, lm = llama
    config = model.config
    head = config.hidden_size // config.num_attention_heads
    per_token = config.num_hidden_layers * 2 * config.num_key_value_heads * head * 4
    stats = lm.stats["kv_cache"]
    assert stats["bytes_per_token"] == per_token
    assert stats["bytes_at_limits"] == per_token * MAX_BATCH * MAX_LENGTH
    assert lm.stats["prefill"]["kernels"] > 0 and lm.stats["decode"]["kernels"] > 0
    ids, mask = _prompts(2, 3)
    lm.generate(ids, NEW, attention_mask=mask, eos_token_id=[])
    assert lm.stats["kv_cache"]["allocated_bytes"] == per_token * 2 * (8 + NEW)
    buffers = [b.data_ptr() for b in lm._cache.buffers]
    lm.generate(ids[:, 2:], NEW, attention_mask=mask[:, 2:], eos_token_id=[])  # fits: reused
    assert [b.data_ptr() for b in lm._cache.buffers] == buffers


def test_the_module_is_not_changed(gpt2):
    model, _ = gpt2
    assert model.config._attn_implementation != "eager"  # (eager only while exported)
    assert not model.training


def test_cli_generate(gpt2, monkeypatch, capsys):
    model, lm = gpt2
    import plus_tvm.lm.build as module

    monkeypatch.setattr(module, "compile_lm", lambda *args, **kwargs: lm)  # (compiled above)
    rc = cli_main(
        [
            "generate",
            "arch:gpt2",
            "--prompt-ids",
            "5,6,7,8",
            "--prompt-ids",
            "9,10",
            "--max-new-tokens",
            "5",
            "--json",
        ]
    )
    assert rc == 0
    result = json.loads(capsys.readouterr().out)
    ids = torch.tensor([[5, 6, 7, 8], [1, 1, 9, 10]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    assert result["tokens"] == _reference(model, ids, mask, 5).tolist()
    assert result["kv_cache"]["bytes_per_token"] == lm.stats["kv_cache"]["bytes_per_token"]


def test_bench_reports_prefill_and_decode(gpt2):
    model, lm = gpt2
    ids, _ = _prompts(1)
    result = bench_generate(lm, model, ids, 3, repeat=1)
    for side in ("plus", "transformers"):
        assert result[side]["prefill_ms"] > 0
        assert set(result[side]) == {"prefill_ms", "decode_ms_per_token"}
    assert result["batch"] == 1 and result["prompt"] == 8 and result["new_tokens"] == 3


FAMILIES = {
    "mistral": {"sliding_window": 6},  # (a window shorter than prompt + new tokens)
    "qwen2": {},
    "qwen3": {},
    "gemma": {},
    "phi": {},
    "phi3": {},
    "falcon": {},
    "gpt-neox": {},
    "opt": {},
    "bloom": {},
    "mixtral": {},  # (the mixture of experts; Qwen2-MoE's forward runs in the arch-suite tests)
    "stablelm": {},
    "olmo": {},
}


@pytest.mark.slow
@pytest.mark.parametrize(
    "family",
    list(FAMILIES),
)
def test_family_greedy_matches_transformers(family):
    model, lm = compiled_lm(family, **FAMILIES[family])  # (shared with other files' tests)
    for batch, pad in ((1, 0), (2, 3)):
        ids, mask = _prompts(batch, pad)
        assert torch.equal(lm.generate(ids, NEW, attention_mask=mask), _reference(model, ids, mask))
