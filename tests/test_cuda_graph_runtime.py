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
import pytest
import torch
import tvm
import tvm_ffi
from _shared_zoo import module_compiled
from plus_tvm import Options, zoo
from plus_tvm.compiler import pre_lowering
from plus_tvm.cuda_graph_report import GET_CACHED_ALLOC
from plus_tvm.loader import load_model
from plus_tvm.passes._capture_calls import PLUS_RUN_OR_CAPTURE, bindings, capture_call
from plus_tvm.passes._graph_staging import staging_copies
from plus_tvm.paths import CacheWarning
from plus_tvm.pipeline import PHASE_NAMES, capture_passes, finalize_phase, phase_passes
from plus_tvm.runtime import cuda_graph
from plus_tvm.target import resolve_target
from tvm import relax

INVOKE = tvm_ffi.get_global_func(cuda_graph.INVOKE_CLOSURE)


class _Allocs:
    """Stand-in for TVM's get_cached_alloc (allocation closure run once per VM and index).

    A VM passes the same allocation closure on every call; the entry keeps it (alive) and is
    used only for that closure: a later VM at a freed VM's address (the key) must not get the
    freed VM's storage (that gave a 4096-byte storage to a 49152-byte tensor, now and then,
    depending on where the allocator put the next test's VM)."""

    def __init__(self) -> None:
        self.cache: dict = {}

    def __call__(self, vm, alloc, index):
        key = (cuda_graph._address(vm), int(index))
        entry = self.cache.get(key)
        if entry is None or not entry[0].same_as(alloc):
            entry = self.cache[key] = (alloc, INVOKE(vm, alloc))
        return entry[1]


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
    model, inputs, compiled = module_compiled("bert-base-tiny")  # (tests/_shared_zoo.py)
    tgt = resolve_target("llvm")
    loaded = load_model(model, inputs)
    mod, _ = pre_lowering(loaded, tgt, Options(), "plus")
    with tgt:
        low = tvm.transform.Sequential(phase_passes(tgt, Options(), PHASE_NAMES[4:5]))(mod)
    weights = compiled._current_weights()  # (compile(model, example_args=inputs)'s)
    return model, inputs, tgt, low, weights


def _build(bert, mode: str):
    _, _, tgt, low, _ = bert
    rest = finalize_phase(tgt, Options(cuda_graph="off"))[1:]  # lowering after planning
    with tgt:
        final = tvm.transform.Sequential(capture_passes(tgt, Options(cuda_graph=mode)) + rest)(low)
    return final, tvm.compile(final, tgt, relax_pipeline=None)


def _run_three(bert, executable, runtime_fn, name: str, calls: int = 3):
    model, inputs, _, _, weights = bert
    tvm_ffi.register_global_func(PLUS_RUN_OR_CAPTURE, runtime_fn, override=True)
    try:
        vm = relax.VirtualMachine(executable, tvm.cpu())
        outs = []
        for seed in range(calls):
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
    # runs=1: call 1 without a graph (timed), call 2 captures, call 3 replays (timed), decides
    rt = cuda_graph.GraphRuntime(capture, invoke, _Device(), cache, runs=1, clock=clock)
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
    again = cuda_graph.GraphRuntime(capture, invoke, _Device(), cache, runs=1, clock=clock)
    _run_three(bert, executable, again, "auto cached")
    (state,) = again.status()
    assert state["decision"] == expect and "eager_us" not in state
    assert replays == ([0, 0, 0] if graph_faster else [])


def test_measuring_runs_the_region_once_per_call(bert, tmp_path):
    """A region runs once per call while it is measured (two runs in one call read what the
    first left in buffers shared with its inputs: wrong first outputs on an H200, 2026-11-26)."""
    _, executable = _build(bert, "auto")
    runs_per_call = []
    device = _Device()

    def count(fn):
        def wrapped(vm, func, *args):
            runs_per_call[-1] += 1
            return fn(vm, func, *args)

        return wrapped

    invoke = count(INVOKE)
    capture = count(lambda vm, func, args, index, *shape: INVOKE(vm, func, *args))
    rt = cuda_graph.GraphRuntime(
        capture, invoke, device, cuda_graph.DecisionCache(str(tmp_path / "d.json")), runs=2
    )

    def runtime(*args):
        runs_per_call.append(0)
        return rt(*args)

    _run_three(bert, executable, runtime, "measured", calls=6)
    assert runs_per_call == [1] * 6
    (state,) = rt.status()
    assert state["decision"] in ("graph", "eager") and state["calls"] == 6
    assert device.syncs == 8  # a sync before and after each of the four timed calls


def _resnet(own_storage: bool = True, flags_only: bool = False):
    """ResNet-50-tiny built for the CPU with the capture passes (``own_storage`` as given to
    ``StageGraphInputs``): (model, inputs, weights, final module, executable)."""
    from plus_tvm.passes import (
        DeclareCaptureVars,
        RewriteCUDAGraph,
        RewriteViewBuiltins,
        RouteCUDAGraphRuntime,
        StageGraphInputs,
        StageGraphOutputs,
    )

    model, inputs = zoo.load("resnet50-tiny")
    tgt = resolve_target("llvm")
    mod, _ = pre_lowering(load_model(model, inputs), tgt, Options(), "plus")
    capture = [
        DeclareCaptureVars(),
        StageGraphInputs(tgt, own_storage=own_storage),
        StageGraphOutputs(tgt),
        RewriteViewBuiltins(),
        relax.transform.StaticPlanBlockMemory(),
        RewriteCUDAGraph(enabled=True),
        RouteCUDAGraphRuntime(measure=False),
    ]
    rest = [] if flags_only else finalize_phase(tgt, Options(cuda_graph="off"))[1:]
    with tgt:
        low = tvm.transform.Sequential(phase_passes(tgt, Options(), PHASE_NAMES[4:5]))(mod)
        final = tvm.transform.Sequential(capture + rest)(low)
    if flags_only:
        return final
    executable = tvm.compile(final, tgt, relax_pipeline=None)
    weights = module_compiled("resnet50-tiny")[2]._current_weights()  # (tests/_shared_zoo.py)
    return model, inputs, weights, final, executable


def _flags(final) -> list[int]:
    calls = [capture_call(b.value) for b in bindings(final["main"])]
    return [c.flags for c in calls if c is not None]


def _check_resnet(model, inputs, weights, executable, runtime_fn, seeds=(0, 1), fail_first=False):
    """Run ``seeds`` through one VM and compare with torch; with ``fail_first`` the first call
    must raise CaptureError."""
    tvm_ffi.register_global_func(PLUS_RUN_OR_CAPTURE, runtime_fn, override=True)
    try:
        vm = relax.VirtualMachine(executable, tvm.cpu())
        for k, seed in enumerate(seeds):
            x = torch.randn(inputs[0].shape, generator=torch.Generator().manual_seed(seed))
            if fail_first and k == 0:
                with pytest.raises(cuda_graph.CaptureError, match="main_cuda_graph_capture"):
                    vm["main"](tvm.runtime.tensor(x.numpy()), *weights)
                continue
            got = vm["main"](tvm.runtime.tensor(x.numpy()), *weights).numpy()
            ref = model(x)
            ref = (ref[0] if isinstance(ref, (tuple, list)) else ref).detach().numpy()
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    finally:
        cuda_graph.register()


def _twice(vm, func, args, index, *shape):
    INVOKE(vm, func, *args)
    return INVOKE(vm, func, *args)


def test_a_vision_region_run_twice_in_one_call_is_still_correct():
    """The staged input has a storage of its own: no intermediate of the region overwrites it,
    so running a region twice in one call (a failed capture running again, TVM's run before
    capturing) reads the same input both times. ResNet's pixels are float32 like its
    activations, so the planner would otherwise share their bytes."""
    model, inputs, weights, final, executable = _resnet()
    assert _flags(final) == [0]  # safe to run again
    rt = cuda_graph.GraphRuntime(capture=_twice, device=_Device(), cache=None)
    _check_resnet(model, inputs, weights, executable, rt)


def test_a_region_that_overwrites_its_input_is_flagged_and_never_run_twice():
    """With the staged input's bytes shared (``own_storage=False``) the region is flagged; a
    capture that fails there raises CaptureError for that call instead of returning what a
    second run computes from a clobbered input, and later calls run it once, correctly."""
    model, inputs, weights, final, executable = _resnet(own_storage=False)
    assert _flags(final) == [cuda_graph.FLAG_NO_RERUN]

    def fails_after_running(vm, func, args, index, *shape):
        INVOKE(vm, func, *args)  # TVM runs the region, then the capture fails
        raise RuntimeError("CUDA: operation not permitted when stream is capturing")

    rt = cuda_graph.GraphRuntime(capture=fails_after_running, device=_Device(), cache=None)
    _check_resnet(model, inputs, weights, executable, rt, seeds=(0, 1, 2), fail_first=True)
    (state,) = rt.status()
    assert state["decision"] == "failed" and state["calls"] == 3


def test_the_report_names_the_flagged_regions():
    """stats["cuda_graph"]["not_rerun_safe"] reads the flag RouteCUDAGraphRuntime wrote."""
    from plus_tvm.cuda_graph_report import _analyse

    shared = _analyse(_resnet(own_storage=False, flags_only=True), "always")
    assert shared["not_rerun_safe"] == ["main_cuda_graph_capture"]
    assert _analyse(_resnet(flags_only=True), "always")["not_rerun_safe"] == []


def test_the_rerun_hazard_is_real_without_the_flag():
    """What the flag prevents: the same region run twice in one call is wrong."""
    model, inputs, weights, _, executable = _resnet(own_storage=False)
    rt = cuda_graph.GraphRuntime(capture=_twice, device=_Device(), cache=None)
    with pytest.raises(AssertionError):
        _check_resnet(model, inputs, weights, executable, rt, seeds=(0,))


def test_a_damaged_decision_cache_counts_as_empty(tmp_path):
    path = tmp_path / "d.json"
    path.write_text("{not json")
    cache = cuda_graph.DecisionCache(str(path))
    with pytest.warns(CacheWarning, match="d.json.*not JSON"):
        assert cache.get("x") is None
        cache.put("x", "graph")  # replaces the damaged file
    assert cache.get("x") == "graph"
