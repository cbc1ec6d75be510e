"""scripts/bench_generate.py (issue 38's generation table) end to end on tiny decoders: every
backend in its own process, the JSON rows and their fields, the KV cache's bytes, the greedy
token check against transformers' eager generate; the ~150M LLaMA reference's size. No
timing assertions (the numbers of a shared 2-core machine mean nothing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import transformers
from plus_tvm.lm.models import arch_config, parameter_count, weight_bytes

SCRIPT = os.path.join(os.path.dirname(__file__), os.pardir, "scripts", "bench_generate.py")
PROMPT, NEW = 8, 4


def _run(tmp_path, models: str, backends: str, batches: str = "1,3") -> tuple[dict, str]:
    out = tmp_path / "gen.json"
    cmd = [
        sys.executable, SCRIPT, "--models", models, "--backends", backends,
        "--dtypes", "float32", "--batches", batches, "--prompt", str(PROMPT),
        "--new-tokens", str(NEW), "--rounds", "1", "--repeat", "1", "--json", str(out),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout


def _kv_bytes(name: str, batch: int, positions: int) -> int:
    config = arch_config(name)
    layers = getattr(config, "num_hidden_layers", None) or config.n_layer
    heads = getattr(config, "num_attention_heads", None) or config.n_head
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = config.hidden_size // heads
    return 2 * layers * batch * positions * kv_heads * head_dim * 4  # float32


def test_plus_and_eager_table(tmp_path):
    # one family here (the generation tests cover every family's tokens): the script's table
    report, table = _run(tmp_path, "arch:llama", "plus,hf-eager")
    assert report["bandwidth"][0]["copy_gb_per_s"] > 0
    rows = {(r["model"], r["batch"], r["backend"]): r for r in report["rows"]}
    assert not [r for r in report["rows"] if "error" in r]
    assert set(rows) == {
        ("arch:llama", b, k) for b in (1, 3) for k in ("plus", "hf-eager")
    }
    for (model, batch, backend), row in rows.items():
        for field in ("prefill_ms", "decode_ms_per_token", "bound_ms", "spread"):
            assert isinstance(row[field], (int, float)) or row[field] is None, field
        assert row["dtype"] == "float32" and row["bound_ms"] > 0
        assert row["parameters"] > 0 and row["weight_bytes"] == 4 * row["parameters"]
        name = model.split(":")[1]
        if backend == "plus":  # prompt + new positions; the speed-up over eager
            assert row["kv_cache_bytes"] == _kv_bytes(name, batch, PROMPT + NEW)
            assert row["compile_s"] > 0 and "x_eager" in row and "x_compile" not in row
        else:  # transformers' dynamic cache: the last token's keys are never computed
            assert row["kv_cache_bytes"] == _kv_bytes(name, batch, PROMPT + NEW - 1)
    checks = report["token_checks"]
    assert {(c["model"], c["batch"]) for c in checks} == {("arch:llama", b) for b in (1, 3)}
    assert all(c["equal"] and c["first_difference"] == [None] * c["batch"] for c in checks)
    for run in report["runs"]:
        for case in run["cases"]:
            assert len(case["tokens"]) == case["batch"]
            assert all(len(t) == NEW for t in case["tokens"])
    assert "| model | params | dtype | batch | backend |" in table
    assert "greedy tokens: every backend equals hf-eager" in table


def test_a_failing_backend_is_a_failed_row_and_exit_3(tmp_path):
    out = tmp_path / "gen.json"
    cmd = [
        sys.executable, SCRIPT, "--models", "arch:gpt2", "--backends", "plus",
        "--dtypes", "float32", "--batches", "1", "--prompt", str(PROMPT),
        "--new-tokens", str(NEW), "--rounds", "1", "--repeat", "1", "--json", str(out),
        "--opt", "no_such_option=1",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, proc.stderr[-2000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["backend"] == "plus" and "no_such_option" in row["error"]
    assert "FAILED" in proc.stdout


@pytest.mark.slow
def test_hf_compile_static_cache(tmp_path):
    report, _ = _run(tmp_path, "arch:gpt2", "hf-eager,hf-compile", batches="1")
    (row,) = [r for r in report["rows"] if r["backend"] == "hf-compile"]
    assert row["compile_s"] > 0  # (its warm-up: the compiles, excluded from the timings)
    assert row["kv_cache_bytes"] == _kv_bytes("gpt2", 1, PROMPT + NEW)  # the static capacity
    assert all(c["equal"] for c in report["token_checks"])


def test_llama_150m_reference():
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(arch_config("llama-150m"))
    assert isinstance(model, transformers.LlamaForCausalLM)
    assert parameter_count(model) == 134_105_856  # 12 x 768, SwiGLU 2048, vocabulary 32000
    assert weight_bytes(model.to(torch.bfloat16)) == 2 * 134_105_856


def test_transformers_side_uses_a_cache_and_no_eos():
    from plus_tvm.lm.bench import greedy_config, hf_runner
    from plus_tvm.lm.models import load_causal_lm

    model = load_causal_lm("zoo:gpt2-tiny")  # (built with use_cache=False for forward timing)
    config = greedy_config(model, 3)
    assert config.use_cache and config.eos_token_id == [] and config.min_new_tokens == 3
    ids = torch.randint(0, 999, (2, PROMPT), generator=torch.Generator().manual_seed(0))
    out = hf_runner(model, ids, torch.ones_like(ids), return_dict_in_generate=True)(3)()
    assert out.sequences.shape == (2, PROMPT + 3)
    cache = getattr(out, "cache", None) or out.past_key_values
    assert cache is not None and cache.layers[0].keys.shape[-2] == PROMPT + 2
    assert model.generation_config.eos_token_id == 999  # (the model's own config unchanged)
