"""The GPU bundle in half precision (issue 36 item 6): ``gpu_bundle --dtypes bf16,fp16`` compiles
each model in each dtype for CUDA without a GPU, and ``gpu_check`` judges every plus call by the
half-precision accuracy contract (:mod:`plus_tvm.accuracy`) against a float64 run; its
CPU-testable parts (references, the judgement, the table, resuming after a crash, run.sh's
loop) run here, the real check where a GPU is present."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from _shared_gpu import cuda_on_the_cpu
from plus_tvm import accuracy
from plus_tvm.errors import InternalCompileError, PlusError
from plus_tvm.gpu import bundle as gpu_bundle
from plus_tvm.gpu import check

MODELS = ["vgg16-tiny"]  # (token ids stay int64: test_half_references_...)
HALF = {"bf16": "bfloat16", "fp16": "float16"}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("h") / "bundle")
    manifest = gpu_bundle.build_bundle(
        out, MODELS, ["plus-auto"], dtypes=["bf16", "fp16"], log=lambda m: None
    )
    return out, manifest


def test_each_model_is_compiled_in_each_dtype(built):
    out, manifest = built
    saved = json.load(open(os.path.join(out, "manifest.json")))
    assert saved["format"] == "plus_tvm.gpu_bundle/2" and saved["dtypes"] == ["bf16", "fp16"]
    for name in MODELS:
        record = saved["models"][name]
        assert list(record["dtypes"]) == ["bf16", "fp16"]
        inputs = np.load(os.path.join(out, "models", name, "inputs.npz"))
        assert {str(inputs[k].dtype) for k in inputs.files} <= {"float32", "int64"}
        for dtype, entry in record["dtypes"].items():
            variant = entry["variants"]["plus-auto"]
            assert "error" not in variant, variant.get("error")
            lib = os.path.join(out, variant["library"])
            assert lib.endswith(f"{name}/{dtype}/plus-auto.so") and os.path.getsize(lib) > 0
            meta = json.load(open(lib + ".json"))
            assert meta["target"]["kind"] == "cuda" and meta["target"]["arch"] == "sm_90"
            # weights travel by name in the dtype; floating inputs in it, token ids unchanged
            assert {w["dtype"] for w in meta["external"].values()} == {HALF[dtype]}
            assert [i["dtype"] for i in meta["inputs"]] == [HALF[dtype]]
            assert variant["bytes"] >= os.path.getsize(lib) and variant["kernel_signatures"]
    assert manifest["bytes"] <= gpu_bundle.LIMIT_BYTES
    assert "ml_dtypes" in open(os.path.join(out, "runtime", "README")).read()


def test_bad_dtypes_fail_before_any_work(tmp_path):
    for dtypes in (["fp8"], [], ["bf16", "bf16"]):
        with pytest.raises(PlusError, match="dtypes"):
            gpu_bundle.build_bundle(
                str(tmp_path / "x"), ["gpt2-tiny"], ["plus-auto"], dtypes=dtypes
            )
    assert not os.path.exists(tmp_path / "x")


def test_a_compile_failure_is_recorded_and_the_rest_go_on(tmp_path, monkeypatch):
    import plus_tvm.compiler

    def refuse(model, target, example, **kwargs):
        raise InternalCompileError("internal error in pipeline, pass X: no")

    monkeypatch.setattr(plus_tvm.compiler, "compile", refuse)
    monkeypatch.setattr(gpu_bundle, "_pack_runtime", os.makedirs)  # (tested with `built`)
    out = str(tmp_path / "b")
    manifest = gpu_bundle.build_bundle(
        out, ["gpt2-tiny"], ["plus-auto"], dtypes=["bf16"], log=lambda m: None, isolate=False
    )
    variant = manifest["models"]["gpt2-tiny"]["dtypes"]["bf16"]["variants"]["plus-auto"]
    assert "pass X" in variant["error"] and "library" not in variant
    assert os.path.exists(os.path.join(out, "run.sh"))  # the bundle is still made


def test_a_compile_process_that_dies_is_recorded(tmp_path):
    """With isolate (the default) each model and dtype compiles in a child process: a crash
    of the compiler (a segfault in TVM) is recorded per variant, the bundle goes on."""
    result = str(tmp_path / "r.json")
    crash = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"]
    records = gpu_bundle.run_child(crash, result, ["plus-auto", "plus-off"])
    assert set(records) == {"plus-auto", "plus-off"}
    assert records["plus-auto"]["error"] == "the compile process died of SIGSEGV"
    fail = [sys.executable, "-c", "import sys; sys.exit('no such model')"]
    assert gpu_bundle.run_child(fail, result, ["plus-auto"]) == {
        "plus-auto": {"error": "the compile process exited 1: no such model"}
    }
    write = f"import json; json.dump({{'plus-auto': {{'kernels': 3}}}}, open({result!r}, 'w'))"
    ok = gpu_bundle.run_child([sys.executable, "-c", write], result, ["plus-auto"])
    assert ok == {"plus-auto": {"kernels": 3}}


def test_the_contract():
    ref = np.array([1.0, -2.0, 4.0])
    assert accuracy.rel_err(ref + [0, 0, 0.04], ref) == pytest.approx(0.01)
    assert accuracy.rel_err(np.array([np.nan, 1.0, 1.0]), ref) == np.inf
    assert accuracy.rel_err(np.array([np.nan, 0.0]), np.array([np.nan, 1.0])) == 1.0
    assert accuracy.bound(0.01, "bf16") == pytest.approx(0.02 + 2.0**-7)
    assert accuracy.within(0.02, 0.01, "bf16") and not accuracy.within(0.03, 0.01, "fp16")
    assert not accuracy.within(float("nan"), 0.01, "bf16")
    with pytest.raises(ValueError, match="unknown dtype"):
        accuracy.bound(0.0, "fp8")
    with pytest.raises(ValueError, match="shape"):
        accuracy.rel_err(np.zeros(2), np.zeros(3))


@pytest.mark.parametrize("dtype", sorted(HALF))
def test_half_references_and_every_call_judged_on_the_cpu(dtype):
    """The reference is a float64 run of the rounded weights; torch eager's own error on each
    input set sets the bound of every plus call on that set."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
    sets = [[torch.randn(4, 32)] for _ in range(3)]
    half, _ = gpu_bundle.in_dtype(model, [], dtype)
    assert half is not model and model[0].weight.dtype == torch.float32  # the user's model kept
    cast = [gpu_bundle.cast_inputs(s, dtype) for s in sets]
    assert cast[0][0].dtype == getattr(torch, HALF[dtype])
    assert gpu_bundle.cast_inputs([torch.arange(3)], dtype)[0].dtype == torch.int64
    reference, refs, torch_errs = check._references(torch, half, dtype, cast)
    assert "float64" in reference and all(r.dtype == np.float64 for r in refs)
    assert len(torch_errs) == 3 and all(0 < e < 0.1 for e in torch_errs)
    with torch.no_grad():
        eager = [check._host(half(*s)) for s in cast]
    calls = [eager[k % 3] for k in range(9)]  # as plus's three rounds over the sets
    judged = check._judge(calls, refs, torch_errs, dtype)
    assert judged["correct"] and judged["checked_calls"] == 9 and judged["nan_outputs"] == 0
    assert judged["max_rel_err"] == pytest.approx(max(torch_errs))
    worse = list(calls)  # one call off by more than twice torch's error plus the floor
    worse[7] = refs[1] + 3 * (torch_errs[1] + accuracy.FLOOR[dtype]) * np.abs(refs[1]).max()
    judged = check._judge(worse, refs, torch_errs, dtype)
    assert not judged["correct"] and judged["worst_call"] == 7
    nan = list(calls)
    nan[4] = np.full_like(calls[4], np.nan)
    assert not check._judge(nan, refs, torch_errs, dtype)["correct"]
    stale = [eager[0]] * 9  # a stale replay: three inputs, one output
    judged = check._judge(stale, refs, torch_errs, dtype)
    assert not judged["new_inputs_new_outputs"] and not judged["correct"]


def test_float32_is_judged_as_before():
    """fp32: torch eager in strict float32 is the reference, every call within REL_TOL."""
    model = torch.nn.Linear(8, 4).eval()
    sets = [[torch.randn(2, 8)] for _ in range(3)]
    reference, refs, torch_errs = check._references(torch, model, "fp32", sets)
    assert "fp32" in reference and torch_errs == []
    calls = [refs[k % 3] * (1 + check.REL_TOL / 2) for k in range(9)]
    assert check._judge(calls, refs, [], "fp32")["correct"]
    calls[2] = refs[2] * (1 + 2 * check.REL_TOL)
    assert not check._judge(calls, refs, [], "fp32")["correct"]


def _unit(auto_ms: float, ro_ms: float, err: float, torch_err: float, correct: bool) -> dict:
    return {
        "reference": "float64",
        "torch_rel_err": [torch_err / 2, torch_err],
        "variants": {"plus-auto": {"median_ms": auto_ms, "max_rel_err": err, "correct": correct}},
        "peers": {"eager": {"median_ms": 2.0}, "compile-ro": {"median_ms": ro_ms}},
    }


def test_the_table_has_a_row_per_model_and_dtype():
    results = {
        "models": {
            "m": {
                "dtypes": {
                    "bf16": _unit(1.0, 1.1, 4e-3, 5e-3, True),
                    "fp16": _unit(0.5, 0.4, 6e-4, 5e-4, True),
                }
            },
            "n": {"error": "RuntimeError: no weights"},
        }
    }
    lines = check.table(results).splitlines()
    assert len({ln.count("|") for ln in lines}) == 1  # header, rule and rows line up
    bf16, fp16, failed = lines[2:]
    assert bf16.startswith("| m | bf16 | 1 | - | - | 1.000 |")
    # auto vs torch eager, vs compile (not timed), vs compile ro; plus's error and torch's own
    assert "| 2.00x | - | 1.10x | 4.0e-03 | 5.0e-03 | - | yes | - |" in bf16
    assert "| 4.00x | - | 0.80x | 6.0e-04 | 5.0e-04 | - | yes | - |" in fp16
    assert failed.startswith("| n | - | - | RuntimeError: no weights |")
    assert check.plus_failures(results) == ["n -"]
    results["models"]["m"]["dtypes"]["fp16"]["variants"]["plus-auto"]["correct"] = False
    assert check.plus_failures(results) == ["m fp16", "n -"]


def test_a_resumed_check_records_the_crash_and_skips_what_is_done():
    results = {
        "models": {"a": {"dtypes": {"bf16": _unit(1, 1, 0, 0, True)}}},
        "running": ["a", "fp16"],
    }
    assert check.resume(results) == {"a": {"bf16", "fp16"}}
    crashed = results["models"]["a"]["dtypes"]["fp16"]
    assert "died" in crashed["error"] and "running" not in results
    assert check.plus_failures(results) == ["a fp16"]
    fresh = {"models": {"a": {"dtypes": {}}}, "running": ["b", "bf16"]}
    assert check.resume(fresh) == {"a": set(), "b": {"bf16"}}


def test_run_sh_resumes_after_the_check_dies(tmp_path):
    """run.sh runs the check again with --resume when it dies of a signal (a crashing
    kernel), and stops at an ordinary exit status."""
    out = str(tmp_path / "bundle")
    os.makedirs(out)
    gpu_bundle._write_runner(out)
    fake = tmp_path / "bin"
    fake.mkdir()
    log = tmp_path / "calls"
    (fake / "python3").write_text(
        "#!/bin/bash\n"
        'if [ "$2" = plus_tvm.gpu.check ]; then\n'
        f'  echo "$*" >> {log}\n'
        f'  [ "$(wc -l < {log})" -lt 3 ] && exit 139\n'
        "  exit 1\n"
        "fi\n"
        "exit 0\n"  # pip, the ml_dtypes probe
    )
    (fake / "tar").write_text("#!/bin/bash\nexit 0\n")  # (nothing unpacked into /tmp here)
    for tool in ("python3", "tar"):
        (fake / tool).chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}")
    proc = subprocess.run(
        ["bash", os.path.join(out, "run.sh"), str(tmp_path / "res"), "--runs", "3"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    calls = log.read_text().splitlines()
    assert proc.returncode == 1 and len(calls) == 3, proc.stderr
    assert "--resume" not in calls[0] and all("--resume" in c for c in calls[1:])
    assert all(c.endswith("--runs 3") for c in calls) and "died" in proc.stderr


def test_the_check_runs_end_to_end_on_the_cpu(tmp_path, monkeypatch):
    """gpu_check's whole path for a half-precision model (load with the torch weights in the
    dtype, nine judged calls, timing, the eager peer, the table) on a bundle compiled for the
    CPU, with torch's CUDA calls made no-ops: what the GPU run does, short of the GPU."""
    import plus_tvm.compiler

    real = plus_tvm.compiler.compile
    monkeypatch.setattr(
        plus_tvm.compiler, "compile", lambda m, t, ex, **kw: real(m, "llvm", ex, **kw)
    )
    monkeypatch.setattr(gpu_bundle, "_kernel_signatures", lambda *a: {})
    monkeypatch.setattr(gpu_bundle, "_pack_runtime", os.makedirs)  # (this TVM runs it here)
    out = str(tmp_path / "bundle")
    gpu_bundle.build_bundle(
        out, ["vgg16-tiny"], ["plus-auto"], dtypes=["bf16"], log=lambda m: None, isolate=False
    )
    cuda_on_the_cpu(monkeypatch)
    res = str(tmp_path / "res")
    args = ["--runs", "2", "--warmup", "1", "--rounds", "1", "--peers", "eager"]
    assert check.main(["--bundle", out, "--out", res, *args]) == 0
    unit = json.load(open(os.path.join(res, "gpu_check.json")))["models"]["vgg16-tiny"]
    bf16 = unit["dtypes"]["bf16"]
    auto = bf16["variants"]["plus-auto"]
    assert unit["weights_match_bundle"] and "float64" in bf16["reference"]
    assert auto["correct"] and auto["checked_calls"] == 9 and auto["median_ms"] > 0
    assert auto["max_rel_err"] <= auto["worst_bound"]
    assert bf16["peers"]["eager"]["max_rel_err"] == pytest.approx(bf16["torch_rel_err"][0])
    assert "| vgg16-tiny | bf16 |" in open(os.path.join(res, "gpu_check.md")).read()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (gpu_check there)")
def test_the_check_passes_on_a_gpu(built, tmp_path):
    out, _ = built
    code = check.main(
        [
            *("--bundle", out, "--out", str(tmp_path / "r")),
            *("--runs", "3", "--warmup", "1", "--rounds", "1", "--peers", "eager"),
        ]
    )
    results = json.load(open(tmp_path / "r" / "gpu_check.json"))
    assert code == 0, check.plus_failures(results)
    units = check.units(results)
    assert sorted((n, d) for n, d, _ in units) == sorted(
        (n, d) for n in MODELS for d in ("bf16", "fp16")
    )
    assert all(u["variants"]["plus-auto"]["checked_calls"] == 9 for _, _, u in units)
    assert time.time() >= results["started"]
