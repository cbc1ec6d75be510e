"""plus.cuda_graph.run_or_capture: capture regions replay through plus_tvm's runtime, which falls
back to running a region without a graph when capture fails and, with cuda_graph=auto, keeps the
faster of graph and no graph by measurement, cached on disk.

The capture passes are target independent, so the same program is built for the CPU here and
run by the VM with TVM's CUDA builtins replaced by stand-ins (the CPU build of TVM has none):
what is tested is the plumbing (closures, arguments, fallback, decisions, three inputs giving
three correct outputs), not a GPU."""

from __future__ import annotations

import warnings

import numpy as np
import plus_tvm
import pytest
import torch
import tvm
import tvm_ffi
from plus_tvm import Options, zoo
from plus_tvm.compiler import pre_lowering
from plus_tvm.cuda_graph_report import GET_CACHED_ALLOC
from plus_tvm.loader import load_model
from plus_tvm.passes._capture_calls import PLUS_RUN_OR_CAPTURE, bindings, capture_call
from plus_tvm.passes._graph_staging import staging_copies
from plus_tvm.pipeline import PHASE_NAMES, capture_passes, finalize_phase, phase_passes
from plus_tvm.runtime import cuda_graph
from plus_tvm.target import resolve_target
from tvm import relax

INVOKE = tvm_ffi.get_global_func(cuda_graph.INVOKE_CLOSURE)


class _Allocs:
    """Stand-in for TVM's get_cached_alloc (allocation closure run once per VM and index)."""

    def __init__(self) -> None:
        self.cache: dict = {}

    def __call__(self, vm, alloc, index):
        key = (cuda_graph._address(vm), int(index))
        if key not in self.cache:
            self.cache[key] = INVOKE(vm, alloc)
        return self.cache[key]


if tvm_ffi.get_global_func(GET_CACHED_ALLOC, allow_missing=True) is None:
    tvm_ffi.register_global_func(GET_CACHED_ALLOC, _Allocs())


class _Device:
    def __init__(self) -> None:
        self.syncs = 0

    def name(self) -> str:
        return "test-gpu"

    def sync(self) -> None:
        self.syncs += 1

    def free_bytes(self) -> int | None:
        return None


class _Clock:
    """A clock the stand-ins advance: a region 'takes' what they say."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def bert():
    model, inputs = zoo.load("bert-base-tiny")
    tgt = resolve_target("llvm")
    loaded = load_model(model, inputs)
    mod, _ = pre_lowering(loaded, tgt, Options(), "plus")
    with tgt:
        low = tvm.transform.Sequential(phase_passes(tgt, Options(), PHASE_NAMES[4:5]))(mod)
    weights = plus_tvm.compile(model, example_args=inputs)._current_weights()
    return model, inputs, tgt, low, weights


def _build(bert, mode: str):
    _, _, tgt, low, _ = bert
    rest = finalize_phase(tgt, Options(cuda_graph="off"))[1:]  # lowering after planning
    with tgt:
        final = tvm.transform.Sequential(capture_passes(tgt, Options(cuda_graph=mode)) + rest)(low)
    return final, tvm.compile(final, tgt, relax_pipeline=None)


def _run_three(bert, executable, runtime_fn, name: str):
    model, inputs, _, _, weights = bert
    tvm_ffi.register_global_func(PLUS_RUN_OR_CAPTURE, runtime_fn, override=True)
    try:
        vm = relax.VirtualMachine(executable, tvm.cpu())
        outs = []
        for seed in range(3):
            ids = torch.randint(
                0, 1000, inputs[0].shape, generator=torch.Generator().manual_seed(seed)
            )
            got = vm["main"](tvm.runtime.tensor(ids.numpy()), *weights).numpy()
            ref = model(ids)
            ref = (ref[0] if isinstance(ref, (tuple, list)) else ref).detach().numpy()
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5, err_msg=name)
            outs.append(got)
        assert not np.array_equal(outs[0], outs[1])  # new inputs, new outputs
    finally:
        cuda_graph.register()  # the real runtime back under its name


def test_route_points_capture_calls_at_plus_runtime(bert):
    for mode, measure in (("always", 0), ("auto", 1)):
        final, _ = _build(bert, mode)
        calls = [capture_call(b.value) for b in bindings(final["main"])]
        calls = [c for c in calls if c is not None]
        assert [c.builtin for c in calls] == [PLUS_RUN_OR_CAPTURE]
        packed = next(
            b.value.args[1] for b in bindings(final["main"]) if capture_call(b.value) is not None
        )
        assert str(packed.fields[3].value) == calls[0].region.name_hint
        assert int(packed.fields[5].value) == measure


def test_weights_are_static_arguments_never_copied(bert):
    """Weights reach the graph as arguments of the capture function (static through
    ``num_input``); the only copies are of the model input and the returned tensor."""
    final, _ = _build(bert, "always")
    main = final["main"]
    num_input = int(main.attrs["num_input"])
    weights = set(main.params[num_input:])
    capture = next(capture_call(b.value) for b in bindings(main) if capture_call(b.value))
    assert weights <= set(capture.args.fields)
    sources = [c.args[0] for c in staging_copies(final, main)]
    assert not any(s in weights for s in sources)
    assert main.params[0] in sources  # input_ids is staged


def test_three_inputs_through_replayed_regions_are_correct(bert):
    _, executable = _build(bert, "always")
    captured = []

    def capture(vm, func, args, index, *shape):
        captured.append(int(index))
        return INVOKE(vm, func, *args)

    rt = cuda_graph.GraphRuntime(capture=capture, device=_Device(), cache=None)
    _run_three(bert, executable, rt, "always")
    assert captured == [0, 0, 0]  # captured once, replayed twice
    assert [s["decision"] for s in rt.status()] == ["graph"]


def test_a_failed_capture_falls_back_with_one_warning(bert, tmp_path):
    _, executable = _build(bert, "always")
    attempts = []

    def capture(vm, func, args, index, *shape):
        attempts.append(int(index))
        raise RuntimeError("CUDA: operation not permitted when stream is capturing")

    rt = cuda_graph.GraphRuntime(
        capture=capture, device=_Device(), cache=cuda_graph.DecisionCache(str(tmp_path / "d.json"))
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _run_three(bert, executable, rt, "fallback")
    mine = [w for w in caught if issubclass(w.category, cuda_graph.CaptureWarning)]
    assert len(mine) == 1 and "main_cuda_graph_capture" in str(mine[0].message)
    assert attempts == [0]  # never tried again
    (state,) = rt.status()
    assert state["decision"] == "failed" and "not permitted" in state["error"]
    assert state["calls"] == 3


@pytest.mark.parametrize("graph_faster", [True, False])
def test_auto_measures_once_and_caches_the_decision(bert, tmp_path, graph_faster):
    _, executable = _build(bert, "auto")
    clock = _Clock()
    replays = []

    def capture(vm, func, args, index, *shape):
        replays.append(int(index))
        clock.now += 1e-3 if graph_faster else 1e-1
        return INVOKE(vm, func, *args)

    def invoke(vm, func, *args):
        clock.now += 1e-2
        return INVOKE(vm, func, *args)

    cache = cuda_graph.DecisionCache(str(tmp_path / "d.json"))
    rt = cuda_graph.GraphRuntime(capture, invoke, _Device(), cache, runs=3, clock=clock)
    _run_three(bert, executable, rt, "auto")
    (state,) = rt.status()
    expect = "graph" if graph_faster else "eager"
    assert state["decision"] == expect
    assert state["eager_us"] == pytest.approx(1e4) and state["graph_us"] > 0
    stored = cache._read()
    assert list(stored.values()) == [expect]
    assert next(iter(stored)).startswith("test-gpu|")
    # a new process on the same GPU reads the decision instead of measuring again
    replays.clear()
    again = cuda_graph.GraphRuntime(capture, invoke, _Device(), cache, runs=3, clock=clock)
    _run_three(bert, executable, again, "auto cached")
    (state,) = again.status()
    assert state["decision"] == expect and "eager_us" not in state
    assert replays == ([0, 0, 0] if graph_faster else [])


def test_a_damaged_decision_cache_counts_as_empty(tmp_path):
    path = tmp_path / "d.json"
    path.write_text("{not json")
    cache = cuda_graph.DecisionCache(str(path))
    assert cache.get("x") is None
    cache.put("x", "graph")
    assert cache.get("x") == "graph"
