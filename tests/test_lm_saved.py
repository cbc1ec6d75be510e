"""A CompiledLM saved with export_lm and loaded with load_lm on TVM's runtime library alone
generates as the compiled one and transformers do; the GPU side of issue 38's generation table
(plus_tvm.lm.gpu_bench: the worker, the budget, the table) runs here on the CPU with an llvm
build through the same code (docs/gpu.md)."""

from __future__ import annotations

import json
import os

import plus_tvm
import pytest
import torch
from _shared_lm import MAX_BATCH, MAX_LENGTH, compiled_lm
from plus_tvm import ModelLoadError
from plus_tvm.lm import gpu_bench
from plus_tvm.lm.bench import greedy_config
from plus_tvm.lm.models import load_causal_lm
from test_runtime_only import _run_runtime_only

LIMITS = (MAX_BATCH, MAX_LENGTH)
PROMPT, NEW = 6, 5
REFS = ("arch:gpt2", "arch:llama")


def _prompts(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two prompts, the second left-padded by two positions."""
    ids = torch.randint(3, vocab, (2, PROMPT), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    return ids, mask


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """A bundle of the two tiny LMs compiled for llvm (the session's shared compiles,
    tests/_shared_lm.py), laid out as gpt_bundle --lm lays out a cuda one (lms/NAME/DTYPE/,
    the manifest's gpu_bench.lm_record), and each LM's compiled tokens (= transformers')."""
    root = tmp_path_factory.mktemp("lm_bundle")
    lms, expected = {}, {}
    for ref in REFS:
        model, lm = compiled_lm(ref.removeprefix("arch:"))
        folder = root / "lms" / gpu_bench.folder_name(ref) / "fp32"
        assert plus_tvm.export_lm(lm, str(folder)) == str(folder)
        entry = gpu_bench.lm_record(ref, 0, *LIMITS)
        entry["dtypes"]["fp32"] = {"folder": os.path.relpath(folder, root)}
        lms[ref] = entry
        ids, mask = _prompts(model.config.vocab_size)
        ours = lm.generate(ids, NEW, attention_mask=mask, eos_token_id=[])
        with torch.no_grad():
            hf = model.generate(
                ids, attention_mask=mask, generation_config=greedy_config(model, NEW)
            )
        assert ours.tolist() == hf.tolist()  # (the compiled LM itself is right)
        expected[ref] = {"compiled": ours.tolist()}
    (root / "manifest.json").write_text(json.dumps({"lms": lms}))
    return root, expected


def test_load_lm_generates_as_compiled_without_the_compiler_library(tmp_path, bundle):
    root, expected = bundle
    result = _run_runtime_only(
        tmp_path,
        f"""
        import json, torch, tvm, plus_tvm
        from plus_tvm.lm.models import load_causal_lm
        out = {{"runtime_only": bool(tvm.base._RUNTIME_ONLY),
                "compiler": plus_tvm.compiler_available()}}
        for ref in {list(REFS)!r}:
            model = load_causal_lm(ref, seed=0)
            folder = {str(root)!r} + "/lms/" + ref.replace(":", "-") + "/fp32"
            lm = plus_tvm.load_lm(folder, weights=model, device="cpu")
            ids = torch.randint(3, model.config.vocab_size, (2, {PROMPT}),
                                generator=torch.Generator().manual_seed(5))
            mask = torch.ones_like(ids)
            mask[1, :2] = 0
            tokens = lm.generate(ids, {NEW}, attention_mask=mask, eos_token_id=[])
            one = lm.generate(ids[:1], {NEW}, eos_token_id=[])
            out[ref] = {{"tokens": tokens.tolist(), "one": one.tolist(),
                         "weights": lm.stats["weights"], "limits": [lm.max_batch, lm.max_length],
                         "params": sum(p.numel() * p.element_size()
                                       for p in model.parameters())}}
        print(json.dumps(out))
        """,
    )
    assert result["runtime_only"] and not result["compiler"]
    for ref in REFS:
        got = result[ref]
        assert got["tokens"] == expected[ref]["compiled"], ref
        assert got["one"][0] == expected[ref]["compiled"][0], ref  # (no padding: same row)
        assert got["limits"] == list(LIMITS)
        # both steps hold one buffer per weight, the torch module's own memory at most once
        assert got["weights"]["bytes"] <= got["params"] + 4096, got


def test_wrong_or_missing_weights_and_device_are_refused(bundle):
    root, _ = bundle
    folder = root / "lms" / "arch-gpt2" / "fp32"
    model = load_causal_lm("arch:gpt2", seed=0)
    state = dict(model.state_dict())
    wrong = dict(state, **{"transformer.h.0.mlp.c_fc.weight": torch.zeros(3, 3)})
    with pytest.raises(ModelLoadError, match=r"weight model\.transformer\.h\.0\.mlp\.c_fc\.weight"):
        plus_tvm.load_lm(folder, weights=wrong)
    missing = {k: v for k, v in state.items() if k != "transformer.wpe.weight"}
    with pytest.raises(ModelLoadError, match=r"model\.transformer\.wpe\.weight .*not in the given"):
        plus_tvm.load_lm(folder, weights=missing)
    half = {k: v.to(torch.bfloat16) for k, v in state.items()}
    with pytest.raises(ModelLoadError, match="float32, the given one is .* bfloat16"):
        plus_tvm.load_lm(folder, weights=half)
    with pytest.raises(ModelLoadError, match="exported without"):
        plus_tvm.load_lm(folder)
    with pytest.raises(ModelLoadError, match="compiled for cpu"):
        plus_tvm.load_lm(folder, weights=model, device="cuda")
    with pytest.raises(ModelLoadError, match="lm.json is missing"):
        plus_tvm.load_lm(root, weights=model)


def test_gpu_bench_runs_the_table_on_the_cpu(tmp_path, bundle):
    """run.sh OUT --lm's code on the CPU (device cpu, runtime-only workers): plus and eager
    in their own processes, tokens compared, the bound, the KV bytes, the table."""
    root, expected = bundle
    out = tmp_path / "out"
    argv = ["run", "--bundle", str(root), "--out", str(out), "--device", "cpu"]
    argv += ["--backends", "plus,eager", "--batches", "1,2", "--prompt", str(PROMPT)]
    argv += ["--new-tokens", str(NEW), "--repeat", "1", "--budget", "400"]
    result = _run_runtime_only(
        tmp_path,
        f"""
        import json, sys, tvm
        from plus_tvm.lm import gpu_bench
        rc = gpu_bench.main({argv!r})
        print(json.dumps({{"rc": rc, "runtime_only": bool(tvm.base._RUNTIME_ONLY)}}))
        """,
    )
    assert result == {"rc": 0, "runtime_only": True}
    report = json.loads((out / "lm_bench.json").read_text())
    assert report["environment"]["runtime_only"]
    assert all(m["weights_match_bundle"] for m in report["models"].values())
    assert report["bandwidth"]["copy_gb_per_s"] > 0
    plus = [r for r in report["rows"] if r["backend"] == "plus"]
    assert {(r["model"], r["batch"]) for r in plus} == {(m, b) for m in REFS for b in (1, 2)}
    for r in plus:
        assert r["tokens_equal"] is True, r
        assert r["prefill_ms"] > 0 and r["bound_ms"] > 0 and r["load_s"] > 0
        per_token = r["kv_cache_bytes"] / (r["batch"] * (PROMPT + NEW))
        assert per_token == int(per_token) > 0
        assert "x_eager" in r
    eager = [r for r in report["rows"] if r["backend"] == "eager"]
    assert len(eager) == 4 and all(r["kv_cache_bytes"] > 0 for r in eager)
    text = (out / "lm_bench.md").read_text()
    assert "| arch:gpt2 | fp32 | 2 | plus |" in text and "equal" in text


def test_gpu_bench_budget_skips_and_says_so(tmp_path, bundle):
    root, _ = bundle
    out = tmp_path / "out"
    argv = ["--bundle", str(root), "--out", str(out), "--device", "cpu", "--budget", "5"]
    assert gpu_bench.main(argv) == 0
    report = json.loads((out / "lm_bench.json").read_text())
    assert len(report["jobs"]) == len(REFS) * 3
    assert all(j["skipped"].startswith("budget:") for j in report["jobs"])
    # the compiled peers come after plus and eager of every LM
    assert [j["backend"] for j in report["jobs"]][-len(REFS) :] == ["compile"] * len(REFS)
    assert "budget:" in (out / "lm_bench.md").read_text()


def test_table_reports_the_first_differing_token_and_ratios():
    job = {"model": "m", "dtype": "bf16", "weight_bytes": 2 * 10**9}
    report = {
        "settings": {"prompt": 4, "new_tokens": 3, "repeat": 1, "device": "x", "budget_s": 9},
        "environment": {},
        "bandwidth": {"copy_gb_per_s": 1000.0},
        "jobs": [
            {
                **job,
                "backend": "eager",
                "cases": [{"batch": 2, "prefill_ms": 5, "decode_ms_per_token": 4.0,
                           "tokens": [[1, 2, 3], [4, 5, 6]]}],
            },
            {
                **job,
                "backend": "plus",
                "load_s": 3.0,
                "cases": [{"batch": 2, "prefill_ms": 4, "decode_ms_per_token": 2.0,
                           "tokens": [[1, 2, 3], [4, 9, 6]], "kv_cache_bytes": 2**20}],
            },
            {**job, "backend": "compile", "skipped": "budget: 3 s left, compile needs 90"},
        ],
    }  # fmt: skip
    report["rows"] = gpu_bench.rows(report)
    plus = next(r for r in report["rows"] if r["backend"] == "plus")
    assert plus["tokens_equal"] is False and plus["first_difference"] == [None, 1]
    assert plus["x_eager"] == 2.0 and "x_compile" not in plus
    assert plus["bound_ms"] == 2.0  # 2 GB at 1000 GB/s
    text = gpu_bench.table(report)
    assert "first differs at =,1" in text and "| m | bf16 | | compile |" in text
