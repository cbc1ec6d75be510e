"""TVM's parallel loops on OpenMP's pool (``runtime/native/parallel_launch.cc``,
``Options.cpu_parallel``): routed only where asked for, every task run once, barriers kept,
errors raised on the caller, and compiled models equal under both pools."""

from __future__ import annotations

import math
import subprocess
import sys
import threading

import numpy as np
import plus_tvm
import pytest
import torch
import tvm
from plus_tvm.errors import OptionsError
from plus_tvm.runtime import native, use_native
from plus_tvm.target import resolve_target
from tvm.script import tirx as T  # noqa: N812

TARGET = resolve_target("llvm")


@pytest.fixture(scope="module", autouse=True)
def launch_installed():
    if not (use_native() and native.openmp_parallel_available()):
        pytest.fail(f"the OpenMP launch is unavailable: {native.status()}")


def _compile(func) -> tvm.runtime.Module:
    return tvm.compile(tvm.IRModule({"main": func}), target=TARGET)


@T.prim_func
def _task_ids(out: T.Buffer((64,), "int32")):
    T.func_attr({"global_symbol": "main", "tirx.noalias": True})
    for i in T.parallel(64):
        out[i] = out[i] + i + 1


@T.prim_func
def _swap_halves(
    a: T.Buffer((2, 256), "float32"),
    b: T.Buffer((2, 256), "float32"),
    c: T.Buffer((2, 256), "float32"),
):
    # each task reads the row the other task wrote: only a barrier between the loops makes it
    # right
    T.func_attr({"global_symbol": "main", "tirx.noalias": True})
    with T.attr(0, "pragma_parallel_launch_point", 1):
        with T.attr(0, "pragma_parallel_barrier_when_finish", 1):
            for i in T.parallel(2):
                for j in range(256):
                    b[i, j] = a[i, j] * T.float32(2)
        for i in T.parallel(2):
            for j in range(256):
                c[i, j] = b[1 - i, j]


@T.prim_func
def _checked(a: T.Buffer((2, 64), "float32"), b: T.Buffer((2, 64), "float32")):
    T.func_attr({"global_symbol": "main", "tirx.noalias": True})
    for i in T.parallel(2):
        for j in range(64):
            assert a[i, j] >= T.float32(0), "negative input"
            b[i, j] = a[i, j]


@pytest.mark.parametrize("openmp", [True, False])
def test_every_iteration_runs_once_on_either_pool(openmp):
    f = _compile(_task_ids)["main"]
    out = tvm.runtime.tensor(np.zeros(64, "int32"))
    before = native.openmp_launches()
    with native.openmp_parallel(openmp):
        f(out)
    np.testing.assert_array_equal(out.numpy(), np.arange(1, 65))
    assert (native.openmp_launches() - before == 1) is openmp


def test_the_switch_is_per_thread_and_restored():
    f = _compile(_task_ids)["main"]
    out = tvm.runtime.tensor(np.zeros(64, "int32"))
    seen = []

    def other_thread():  # the switch of the main thread does not reach it
        before = native.openmp_launches()
        f(out)
        seen.append(native.openmp_launches() - before)

    with native.openmp_parallel():
        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join()
    assert seen == [0]
    assert native.use_openmp(False) is False  # restored after the block
    np.testing.assert_array_equal(out.numpy(), np.arange(1, 65))


@pytest.mark.parametrize("openmp", [True, False])
def test_a_barrier_between_parallel_loops_holds(openmp):
    f = _compile(_swap_halves)["main"]
    rng = np.random.default_rng(0)
    for _ in range(20):
        a = rng.standard_normal((2, 256)).astype("float32")
        args = [tvm.runtime.tensor(x) for x in (a, np.zeros_like(a), np.zeros_like(a))]
        with native.openmp_parallel(openmp):
            f(*args)
        np.testing.assert_array_equal(args[2].numpy(), (a * 2)[::-1])


@pytest.mark.parametrize("failing_row", [0, 1])
def test_an_error_in_any_task_is_raised_on_the_caller(failing_row):
    f = _compile(_checked)["main"]
    x = np.ones((2, 64), "float32")
    x[failing_row, 5] = -1  # row 1 is a worker thread's task
    args = [tvm.runtime.tensor(x), tvm.runtime.tensor(np.zeros_like(x))]
    with native.openmp_parallel(), pytest.raises(RuntimeError, match="negative input"):
        f(*args)
    with native.openmp_parallel():  # and the pool works afterwards
        f(tvm.runtime.tensor(np.ones_like(x)), args[1])
    np.testing.assert_array_equal(args[1].numpy(), np.ones_like(x))


class _SoftmaxBlock(torch.nn.Module):
    """Row softmax and LayerNorm over wide rows: GIR schedules them with parallel loops."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(512)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.norm(x) * 3.0, dim=-1) + x


def test_a_compiled_model_runs_its_loops_on_openmp_and_agrees_with_tvms_pool():
    model = _SoftmaxBlock().eval()
    x = torch.randn(64, 512)
    expected = model(x).detach().numpy()
    outs = {}
    for pool in ("openmp", "tvm"):
        options = plus_tvm.Options(cpu_parallel=pool, gir_launch_us=1.0)
        cm = plus_tvm.compile(model, example_args=(x,), options=options)
        assert cm.stats["options"]["cpu_parallel"] == pool
        before = native.openmp_launches()
        outs[pool] = cm(x)
        launched = native.openmp_launches() - before
        assert (launched > 0) is (pool == "openmp"), launched
        np.testing.assert_allclose(outs[pool], expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outs["openmp"], outs["tvm"], rtol=1e-6, atol=1e-6)
    assert native.use_openmp(False) is False  # the call restored the thread's switch


def test_an_exported_model_loaded_again_runs_on_openmp(tmp_path):
    model = _SoftmaxBlock().eval()
    x = torch.randn(64, 512)
    cm = plus_tvm.compile(model, example_args=(x,), options=plus_tvm.Options(gir_launch_us=1.0))
    path = cm.export_library(str(tmp_path / "block.so"))
    loaded = plus_tvm.load(path)
    before = native.openmp_launches()
    got = loaded(x)
    assert native.openmp_launches() > before
    np.testing.assert_array_equal(got, cm(x))


def test_a_compiled_model_from_several_threads_on_openmp():
    model = _SoftmaxBlock().eval()
    x = torch.randn(64, 512)
    cm = plus_tvm.compile(model, example_args=(x,), options=plus_tvm.Options(gir_launch_us=1.0))
    expected = cm(x)
    results, errors = [], []

    def call():
        try:
            for _ in range(5):
                results.append(cm(x))
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    workers = [threading.Thread(target=call) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors
    assert len(results) == 20
    for got in results:
        np.testing.assert_array_equal(got, expected)


def test_cpu_parallel_is_checked_and_resolved(monkeypatch):
    from plus_tvm.compile_inputs import resolve_inputs
    from plus_tvm.gir.model import cpu_figures, runtime_threads

    with pytest.raises(OptionsError, match="cpu_parallel"):
        plus_tvm.Options(cpu_parallel="tbb")
    resolved = resolve_inputs(TARGET, plus_tvm.Options())
    assert resolved.cpu_parallel == "openmp"
    assert resolved.gir_launch_us == cpu_figures(TARGET, "openmp")["launch_us"] > 0
    assert resolved.threads == runtime_threads("openmp") == native.openmp_threads() >= 1
    on_tvm = resolve_inputs(TARGET, plus_tvm.Options(cpu_parallel="tvm"))
    assert on_tvm.gir_launch_us == cpu_figures(TARGET, "tvm")["launch_us"]
    assert resolved.digest() != on_tvm.digest()
    # without the native library OpenMP cannot be routed to: TVM's pool, and stats say so
    monkeypatch.setenv("PLUS_TVM_NATIVE", "0")
    assert resolve_inputs(TARGET, plus_tvm.Options()).cpu_parallel == "tvm"


def test_the_launch_is_measured_on_each_pool():
    from plus_tvm.gir.model import pool_launch_us

    before = native.openmp_launches()
    openmp = pool_launch_us(TARGET, 2, calls=20, pool="openmp")
    middle = native.openmp_launches()
    assert middle - before >= 20
    tvm_pool = pool_launch_us(TARGET, 2, calls=20, pool="tvm")
    assert native.openmp_launches() == middle  # TVM's measurement launched on TVM's pool
    # (a measured cost is a finite number; how large it is depends on the machine's load:
    # timings are for benchmarks, not tests)
    assert all(math.isfinite(t) and t >= 0 for t in (openmp, tvm_pool))


def test_compiling_and_running_loads_one_openmp_runtime_and_no_xgboost():
    """A compile with the analytic cost model never imports xgboost (its wheel brings a second
    libgomp), so the process runs one OpenMP runtime: torch's, which oneDNN and the launch use."""
    script = (
        "import sys, torch, plus_tvm\n"
        "m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()\n"
        "cm = plus_tvm.compile(m, example_args=(torch.randn(2, 8),))\n"
        "cm(torch.randn(2, 8))\n"
        "gomp = {l.split()[-1] for l in open('/proc/self/maps') if 'libgomp' in l}\n"
        "print('xgboost' in sys.modules, len(gomp))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[-2:] == ["False", "1"]
