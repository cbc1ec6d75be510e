"""The benchmark harness: one process per backend with its own defaults, budgets, error checks,
the affinity / thread-count guard, memory, and speedup arithmetic."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch
from plus_tvm import threads
from plus_tvm.bench import BACKENDS, Backend, Bench, BenchError, format_table, state_changes
from plus_tvm.loader import load_model


class Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.lin(x))


class SlowEager(Small):
    """Sleeps in eager mode only: export traces the sleep away, so plus is fast."""

    def forward(self, x):
        time.sleep(0.03)
        return super().forward(x)


def _eager() -> bool:
    return not (torch.compiler.is_compiling() or torch.compiler.is_exporting())


class FailsEager(Small):
    def forward(self, x):
        if _eager():
            raise RuntimeError("peer exploded")
        return super().forward(x)


class PinsEager(Small):
    """Pins its process to one CPU when run eagerly: the bench must call that invalid."""

    def forward(self, x):
        if _eager():
            os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        return super().forward(x)


@pytest.fixture(autouse=True)
def _no_settling_pause(monkeypatch):
    """No pause before each timed block (``SETTLE_S``, 0.25 s per block and backend: it keeps
    one backend's spinning thread pool out of the next one's timings, which no test here
    judges; the blocks, their order and the budget work as in a real run)."""
    from plus_tvm.bench import driver

    monkeypatch.setattr(driver, "SETTLE_S", 0.0)


def _loaded(cls):
    torch.manual_seed(0)
    return load_model(cls().eval(), (torch.randn(2, 8),))


VARIANT = "plus:dispatch=false+fusion=tvm"


@pytest.fixture(scope="module")
def small_bench(strict):
    """One bench of ``Small`` on every kind of backend, a plus variant among them (its worker
    processes and compiles shared by the two tests that read it)."""
    backends = ["plus", "torch", "onnxruntime", VARIANT]
    with strict(), pytest.MonkeyPatch.context() as patch:
        from plus_tvm.bench import driver

        patch.setattr(driver, "SETTLE_S", 0.0)  # (as _no_settling_pause: module scope here)
        return Bench(_loaded(Small), backends, runs=3, warmup=1, progress=False).run()


def test_every_backend_runs_in_its_own_process_on_every_core(small_bench):
    cpus = sorted(os.sched_getaffinity(0))
    result = small_bench
    assert result["invalid"] == [] and result["reference"] == "torch"
    assert result["environment"]["affinity"] == cpus
    for name in ("plus", "torch", "onnxruntime"):
        entry = result["backends"][name]
        assert entry["status"] == "ok", (name, entry["status"])
        assert entry["runs"] == 3 and entry["median_ms"] > 0
        assert entry["affinity"] == cpus  # nothing narrowed the CPUs a backend started with
        assert entry["max_abs_err"] < 1e-5
        assert 0 < entry["peak_above_libraries_mb"] < entry["peak_rss_mb"]
    plus_threads = result["backends"]["plus"]["threads"]
    assert plus_threads["tvm_pool"] == threads.physical_cores()
    # torch in the worker keeps its own default (it is what a fresh interpreter picks)
    fresh = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert result["backends"]["torch"]["threads"]["torch"] == int(fresh.stdout)
    assert "onnxruntime" in result["backends"]["onnxruntime"]["threads"]
    text = format_table(result)
    assert "own process" in text and "INVALID" not in text


def test_budget_limits_runs_of_a_slow_backend():
    result = Bench(
        _loaded(SlowEager), ["plus", "torch"], runs=6, warmup=0, budget_s=0.05, progress=False
    ).run()
    plus, torch_ = result["backends"]["plus"], result["backends"]["torch"]
    assert 1 <= torch_["runs"] < 6 and torch_["status"].startswith("budget:")
    assert torch_["median_ms"] >= 30
    assert plus["runs"] == 6 and plus["status"] == "ok"
    assert result["speedup"]["torch"] == pytest.approx(
        torch_["median_ms"] / plus["median_ms"], rel=2e-3
    )


def test_failing_peer_is_reported_and_plus_still_measured():
    result = Bench(_loaded(FailsEager), ["plus", "torch"], runs=2, warmup=0, progress=False).run()
    assert "peer exploded" in result["backends"]["torch"]["status"]
    assert result["backends"]["plus"]["runs"] == 2
    assert "peer exploded" in str(result["speedup"]["torch"])
    assert result["reference"].startswith("none")  # no silent reference from a broken model
    assert result["backends"]["plus"]["max_abs_err"] is None
    assert "torch" in format_table(result)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to narrow")
def test_a_backend_that_changes_its_affinity_makes_the_result_invalid():
    result = Bench(_loaded(PinsEager), ["plus", "torch"], runs=2, warmup=0, progress=False).run()
    status = result["backends"]["torch"]["status"]
    assert status.startswith("invalid:") and "affinity" in status
    assert any(p.startswith("torch:") for p in result["invalid"])
    assert result["backends"]["plus"]["status"] == "ok"
    assert "INVALID" in format_table(result)


def test_bench_command_exits_3_on_an_invalid_measurement(monkeypatch, capsys):
    from plus_tvm import cli

    fake = {
        "model": "m",
        "target": "llvm",
        "reference": "torch",
        "environment": {"affinity": [0, 1]},
        "invalid": ["torch: affinity [0, 1] -> [0]"],
        "backends": {
            "plus": {"median_ms": 1.0, "runs": 1, "max_abs_err": 0.0, "status": "ok"},
            "torch": {"median_ms": 2.0, "runs": 1, "max_abs_err": 0.0, "status": "invalid: x"},
        },
        "speedup": {"torch": 2.0},
        "stats": {},
    }
    monkeypatch.setattr("plus_tvm.bench.Bench.run", lambda self: fake)
    code = cli.main(["bench", "zoo:bert-base-tiny", "--compare", "plus,torch", "--no-progress"])
    assert code == 3
    assert "invalid" in capsys.readouterr().err


def test_plus_variant_backend_is_compiled_with_its_options(small_bench):
    result = small_bench
    variant = result["backends"][VARIANT]
    assert variant["status"] == "ok" and variant["max_abs_err"] < 1e-4
    assert VARIANT in result["speedup"]
    with pytest.raises(Exception, match="unknown option"):
        Bench(_loaded(Small), ["plus", "plus:nonsense=1"], progress=False)


def test_bad_arguments_are_rejected():
    with pytest.raises(BenchError, match="tensorrt"):
        Bench("zoo:bert-base-tiny", ["plus", "tensorrt"])
    bad = ({"runs": 0}, {"warmup": -1}, {"budget_s": float("inf")}, {"runs": True})
    for kwargs in (*bad, {"seq_lengths": [16, 0]}):
        with pytest.raises(BenchError):
            Bench("zoo:bert-base-tiny", ["plus"], **kwargs)
    assert set(BACKENDS) >= {"plus", "torch", "torch-compile", "onnxruntime"}
    assert not Backend("x").active


def test_state_changes_names_what_changed():
    a = {"affinity": [0, 1], "torch_threads": 2, "torch_interop_threads": 2}
    assert state_changes(a, dict(a)) == []
    b = {**a, "affinity": [0], "torch_threads": 1}
    assert state_changes(a, b) == ["affinity [0, 1] -> [0]", "torch_threads 2 -> 1"]
    assert state_changes(a, {**a, "torch_threads": None}) == []  # torch not loaded there


# ---------------------------------------------------------------------------------------------
# the thread policy


def test_thread_policy_defaults_and_user_values():
    env: dict[str, str] = {}
    got = threads.configure_tvm_pool(env)
    assert got == {
        "TVM_BIND_THREADS": "0",
        "TVM_NUM_THREADS": str(threads.physical_cores()),
        "TVM_THREAD_POOL_SPIN_COUNT": "0",
    }
    mine = {"TVM_BIND_THREADS": "1", "TVM_NUM_THREADS": "3", "TVM_THREAD_POOL_SPIN_COUNT": "9"}
    assert threads.configure_tvm_pool(dict(mine)) == mine  # the user's values win
    assert threads.physical_cores() >= 1


def test_compiling_and_running_leaves_affinity_and_torch_threads_as_they_were(tmp_path):
    """In a fresh interpreter (TVM's pool starts there): compile, run, export, load, run."""
    script = textwrap.dedent(
        """
        import json, os, sys
        import torch
        before = (sorted(os.sched_getaffinity(0)), torch.get_num_threads(),
                  torch.get_num_interop_threads())
        import numpy as np, plus_tvm
        cm = plus_tvm.compile("zoo:bert-base-tiny", target="llvm")
        x = np.random.default_rng(0).integers(0, 100, (1, 16)).astype("int64")
        cm(x)
        path = os.path.join(sys.argv[1], "m.so")
        cm.export_library(path)
        plus_tvm.load(path)(x)
        cnn = plus_tvm.compile("zoo:resnet50-tiny", target="llvm")
        cnn(np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype("float32"))
        after = (sorted(os.sched_getaffinity(0)), torch.get_num_threads(),
                 torch.get_num_interop_threads())
        import tvm_ffi
        pool = int(tvm_ffi.get_global_func("runtime.NumThreads")())
        print(json.dumps({"before": before, "after": after, "pool": pool}))
        """
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TVM_NUM_THREADS", "TVM_BIND_THREADS", "TVM_THREAD_POOL_SPIN_COUNT")
    }
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    import json

    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["after"] == got["before"]
    assert got["pool"] == threads.physical_cores()


def test_output_comparison_uses_the_reference():
    """A backend whose output differs is reported with its error, not hidden."""
    bench = Bench(_loaded(Small), ["plus"], runs=1, warmup=0, progress=False)
    ref = np.zeros((2, 8), "float32")
    good = Backend("plus", times_ms=[1.0], output=ref + 0.5)
    bench.initial_state = threads.snapshot()
    bench.reference_name = "torch"
    bench._reference = lambda by_name: ref  # noqa: SLF001
    result = bench._summary([good])  # noqa: SLF001
    assert result["backends"]["plus"]["max_abs_err"] == pytest.approx(0.5)
    bad_shape = Backend("plus", times_ms=[1.0], output=np.zeros((3,), "float32"))
    result = bench._summary([bad_shape])  # noqa: SLF001
    assert result["backends"]["plus"]["status"].startswith("wrong output shape")


def test_an_interrupted_bench_leaves_no_worker_behind(monkeypatch):
    import plus_tvm.bench.driver as driver

    started = []
    real = driver._Worker.__init__

    def spy(self, *args, **kwargs):
        real(self, *args, **kwargs)
        started.append(self)

    def interrupt(self, backends):
        raise KeyboardInterrupt

    monkeypatch.setattr(driver._Worker, "__init__", spy)
    monkeypatch.setattr(driver.Bench, "_time", interrupt)
    with pytest.raises(KeyboardInterrupt):
        Bench(_loaded(Small), ["plus", "torch"], runs=2, warmup=0, progress=False).run()
    assert len(started) == 2
    assert all(w.proc.poll() is not None for w in started)  # every worker process is gone


def test_sequence_lengths_one_compile_every_backend_at_each_length(tmp_path):
    """plus is compiled once with a symbolic sequence length; every backend (ORT on a model
    exported with a dynamic sequence axis) is timed and checked at each length."""
    result = Bench(
        "zoo:gpt2-tiny",
        ["plus", "torch", "onnxruntime"],
        runs=2,
        warmup=0,
        progress=False,
        seq_lengths=[3, 40],
    ).run()
    assert result["invalid"] == [] and list(result["lengths"]) == ["3", "40"]
    assert result["stats"]["patterns"]["attention"] == 2  # dispatch with symbolic sizes
    for summary in result["lengths"].values():
        for name in ("plus", "torch", "onnxruntime"):
            entry = summary["backends"][name]
            assert entry["status"] == "ok", (name, entry["status"])
            assert entry["runs"] == 2 and entry["max_abs_err"] < 1e-4
    kernels = {s["backends"]["plus"]["kernels"] for s in result["lengths"].values()}
    assert len(kernels) == 1  # the same compiled module
    text = format_table(result)
    assert "sequence length 3" in text and "sequence length 40" in text
    from plus_tvm.bench import plot

    assert os.path.getsize(plot(result, str(tmp_path / "lengths.png"))) > 0


def test_a_model_from_a_python_file_runs_in_the_torch_workers(tmp_path):
    """``python:FILE.py:ATTR``: the model's classes live in a file no worker can import by
    name; the bench lists the file next to the saved module and the worker imports it first
    (before: "the torch module cannot be saved for a worker")."""
    path = tmp_path / "user_model.py"
    path.write_text(
        textwrap.dedent(
            """
            import torch

            class Net(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = torch.nn.Linear(8, 8)

                def forward(self, x):
                    return torch.relu(self.fc(x))

            def build():
                torch.manual_seed(0)
                return Net().eval(), (torch.randn(2, 8),)
            """
        )
    )
    loaded = load_model(f"python:{path}:build")
    result = Bench(loaded, ["plus", "torch"], runs=2, warmup=0, progress=False).run()
    assert result["backends"]["torch"]["status"] == "ok", result["backends"]["torch"]["status"]
    assert result["backends"]["torch"]["runs"] == 2
    assert result["backends"]["plus"]["max_abs_err"] < 1e-5


# ------------------------------------------------------------------- spread of the runs
def test_spread_is_the_range_of_the_middle_runs():
    from plus_tvm.bench.spread import spread_ms

    assert spread_ms([]) is None and spread_ms([3.0]) is None
    assert spread_ms([1.0, 2.0]) == pytest.approx(0.8)  # 10th to 90th percentile
    # one outlier among many runs does not make the spread
    assert spread_ms([1.0] * 19 + [500.0]) < 1.0
    assert spread_ms([1.0, 1.0, 1.0, 1.0, 500.0]) > 250.0  # with five runs it does


def test_a_ratio_within_the_spread_of_either_side_is_warned_about():
    from plus_tvm.bench.spread import spread_warnings

    def entry(times):
        from plus_tvm.bench.spread import spread_ms

        return {"median_ms": float(np.median(times)), "spread_ms": spread_ms(times), "runs": 5}

    steady = [1.0, 1.01, 0.99, 1.0, 1.02]
    noisy = [0.05, 97.0, 0.06, 300.0, 0.07]  # a loaded machine: runs over 3 orders
    backends = {
        "plus": entry(steady),
        "torch": entry([2.0, 2.02, 1.98, 2.01, 2.0]),  # 2x, both tight: no warning
        "torch-compile": entry([1.05, 0.9, 1.2, 0.95, 1.1]),  # 1.05x inside its own spread
        "onnxruntime": entry(noisy),
        "tvm": {"median_ms": None, "spread_ms": None, "runs": 0},  # failed: nothing to say
    }
    lines = spread_warnings(backends)
    names = [line.split(":")[0] for line in lines]
    assert names == ["torch-compile", "onnxruntime"]
    assert "within the spread" in lines[0] and "more runs" in lines[0]
    # the plus side's spread counts as well
    backends = {"plus": entry(noisy), "torch": entry([2.0, 2.02, 1.98, 2.01, 2.0])}
    assert [line.split(":")[0] for line in spread_warnings(backends)] == ["torch"]
    # a single run has no spread: no warning either way
    single = {"plus": {"median_ms": 1.0, "spread_ms": None, "runs": 1}}
    assert spread_warnings({**single, "torch": {**single["plus"], "median_ms": 1.01}}) == []


def test_the_table_prints_the_spread_and_the_warnings():
    result = {
        "model": "m",
        "target": "llvm",
        "reference": "torch",
        "environment": {"affinity": [0]},
        "backends": {
            "plus": {
                "median_ms": 1.0,
                "runs": 5,
                "spread_ms": 0.5,
                "max_abs_err": 0.0,
                "status": "ok",
            },
        },
        "speedup": {},
        "warnings": ["torch: the ratio 1.05x is within the spread of the runs"],
    }
    text = format_table(result)
    assert "spread ms" in text and "0.500" in text
    assert "WARNING: torch: the ratio 1.05x" in text


def test_no_progress_bar_unless_stderr_is_a_terminal():
    import io

    from plus_tvm.bench import driver

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    assert isinstance(driver._progress(10, True, io.StringIO()), driver._NoBar)  # a pipe
    assert isinstance(driver._progress(10, False, Terminal()), driver._NoBar)  # switched off
    bar = driver._progress(10, True, Terminal())
    assert not isinstance(bar, driver._NoBar)
    bar.close()


# ---------------------------------------------------------------------- half precision
def test_onnx_runtime_in_bfloat16_is_reported_as_not_available(tmp_path):
    bench = Bench(_loaded(Small), ["plus", "onnxruntime"], dtype="bf16", progress=False)
    backend = Backend("onnxruntime")
    bench._save_onnx(backend, str(tmp_path))
    assert backend.status.startswith("n/a in bfloat16: ONNX Runtime's CPU provider")
    assert "--dtype fp16" in backend.status and not os.listdir(tmp_path)


def test_an_onnx_model_is_benched_in_float16_through_onnx_runtimes_converter(tmp_path):
    path = str(tmp_path / "small.onnx")
    torch.manual_seed(0)
    torch.onnx.export(Small().eval(), (torch.randn(2, 8),), path, input_names=["x"], dynamo=False)
    result = Bench(
        path, ["plus", "onnxruntime"], runs=2, warmup=0, progress=False, dtype="fp16"
    ).run()
    assert result["reference"] == "onnxruntime"
    for name in ("plus", "onnxruntime"):
        entry = result["backends"][name]
        assert entry["status"] == "ok", (name, entry["status"])
        assert entry["max_abs_err"] < 1e-2
    assert "fp16" in result["model"]
    with pytest.raises(BenchError, match="only fp16"):
        Bench(path, ["plus"], runs=1, warmup=0, progress=False, dtype="bf16").run()


def test_a_half_bench_of_plus_alone_has_torchs_output_in_that_dtype_as_reference():
    """With plus alone in bfloat16 the reference is torch eager run in the bench itself: its
    float inputs cast as the workers cast them, its bfloat16 output widened for the
    comparison (``.numpy()`` of a bfloat16 tensor raised a TypeError: ``plus-tvm bench
    zoo:t5-encoder --dtype bf16 --compare plus`` failed)."""
    bench = Bench(_loaded(Small), ["plus"], dtype="bf16", progress=False)
    bench.loaded = bench._in_dtype(_loaded(Small))  # noqa: SLF001 - (what run() does first)
    bench.inputs = (np.random.default_rng(0).standard_normal((2, 8)).astype("float32"),)
    ref = bench._reference({})  # noqa: SLF001
    assert bench.reference_name == "torch" and ref.dtype == np.float32
    module = bench.loaded.torch_module
    with torch.no_grad():
        want = module(torch.from_numpy(bench.inputs[0]).to(torch.bfloat16)).float().numpy()
    np.testing.assert_array_equal(ref, want)
