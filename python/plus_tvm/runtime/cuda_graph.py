"""``plus.cuda_graph.run_or_capture``: TVM's CUDA-graph replay with a fallback and, under
``cuda_graph=auto``, a measured per-region decision (PyGraph sections 4.3 and robustness).

``RouteCUDAGraphRuntime`` (phase 6) points every capture region of a module at this function
instead of TVM's ``vm.builtin.cuda_graph.run_or_capture``, with three more arguments: the
region's name, the module key (structural hash and options digest) and whether to measure.
The VM then calls::

    plus.cuda_graph.run_or_capture(vm, capture_func, args, index, name, key, measure, [shape])

Per VM, region index and captured shape:

- ``measure`` off (``cuda_graph=always``): TVM's builtin captures the region on the first call
  and replays it from then on;
- ``measure`` on (``cuda_graph=auto``): the first ``runs`` calls run the region without a
  graph, the next one captures it, the ``runs`` after that replay it, each of those timed to a
  device sync; then the faster way is kept and written to a decision cache keyed by the GPU's
  name, the module key, the region and the shape, so a later process on the same GPU skips the
  measurement. **Every call runs the region once** (TVM's capture runs it once before
  capturing, and the capture itself runs nothing): a region that ran twice in one call would
  read whatever its first run left in buffers it shares with its inputs (a GPU measurement of
  the first design, which timed both ways inside the first call: the vision models' first
  outputs were wrong, 0.4-3e23 relative, while every later call was right).

A capture that fails (a library call that allocates or synchronizes while the stream captures,
out of memory) is caught: the region runs without a graph from then on, with one warning that
names it, and the call that failed recomputes its result without a graph (its inputs are
intact: ``StageGraphInputs`` gives each staged input a storage of its own). A region that may
overwrite what it reads (``FLAG_NO_RERUN``, from ``rerun_safe`` at compile time) cannot run
twice in one call: there the failing call raises :class:`CaptureError` instead of returning a
wrong result, and later calls run the region without a graph. :func:`status`
gives per region the decision, the times measured and the device memory its capture took. The
function only needs TVM's runtime library.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import tvm_ffi

from ..paths import private_dir, read_json, write_json

RUN_OR_CAPTURE = "plus.cuda_graph.run_or_capture"
TVM_RUN_OR_CAPTURE = "vm.builtin.cuda_graph.run_or_capture"
INVOKE_CLOSURE = "vm.builtin.invoke_closure"
CACHE_FILE = "cuda_graph_decisions.json"

GRAPH = "graph"
EAGER = "eager"
FAILED = "failed"

# the flags argument RouteCUDAGraphRuntime writes after the module key
FLAG_MEASURE = 1  # cuda_graph=auto: decide by measurement
FLAG_NO_RERUN = 2  # the region may overwrite what it reads: never run it twice in one call


class CaptureWarning(RuntimeWarning):
    """A capture region could not be captured and runs without a CUDA graph."""


@tvm_ffi.register_error
class CaptureError(RuntimeError):
    """A capture failed in a region that cannot run again in the same call; later calls run it
    without a graph. (Registered with tvm-ffi so that it keeps its class through the VM.)"""


@dataclass
class RegionState:
    """What the runtime knows of one region (per VM, region index and captured shape)."""

    name: str
    decision: str = ""
    eager_us: float | None = None
    graph_us: float | None = None
    graph_bytes: int | None = None
    error: str = ""
    calls: int = 0
    rerun: bool = True  # whether the region may run twice in one call (a failed capture)
    # while measuring (cuda_graph=auto): the cache key, whether the region was captured, and the
    # times of the calls so far (seconds), one run per call
    cache_key: str = ""
    captured: bool = False
    eager_s: list[float] = field(default_factory=list)
    graph_s: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if v not in ("", None) and k not in _PRIVATE}


_PRIVATE = frozenset(("rerun", "cache_key", "captured", "eager_s", "graph_s"))


def default_cache_path() -> str:
    """``<cache root>/cuda_graph_decisions.json`` (:mod:`plus_tvm.paths`)."""
    return os.path.join(private_dir(), CACHE_FILE)


def decisions_problem(data: object) -> str | None:
    """What is wrong with a decision file's content (None: nothing)."""
    if not isinstance(data, dict):
        return f"expected a JSON object, got {type(data).__name__}"
    for key, value in data.items():
        if value not in (GRAPH, EAGER):
            return f"the decision of {key[:80]!r} is {value!r}, not {GRAPH!r} or {EAGER!r}"
    return None


class DecisionCache:
    """Measured decisions on disk, one JSON object; a damaged file counts as empty (a
    :class:`~plus_tvm.paths.CacheWarning` names it) and is replaced on the next decision."""

    def __init__(self, path: str | None = None) -> None:
        self._path = path  # None: the cache root's file, found when first needed

    @property
    def path(self) -> str:
        """The decisions file (created folders: only when first read or written, never at
        import: a bad cache root must not break ``import plus_tvm``)."""
        if self._path is None:
            self._path = default_cache_path()
        return self._path

    def get(self, key: str) -> str | None:
        return self._read().get(key)

    def put(self, key: str, decision: str) -> None:
        data = self._read()
        data[key] = decision
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        write_json(self.path, data)

    def _read(self) -> dict[str, str]:
        data = read_json(self.path, decisions_problem)
        return data if isinstance(data, dict) else {}


@dataclass
class Device:
    """The GPU side the runtime needs: its name, a sync, and its free memory (None: unknown).
    Defaults read CUDA device 0 through TVM's runtime."""

    name: Callable[[], str] = field(default=lambda: _cuda().device_name or "cuda")
    sync: Callable[[], None] = field(default=lambda: _cuda().sync())
    free_bytes: Callable[[], int | None] = field(default=lambda: _cuda().available_global_memory)


def _cuda():
    import tvm.runtime

    return tvm.runtime.cuda(0)


class GraphRuntime:
    """The body of ``plus.cuda_graph.run_or_capture`` (module docstring).

    Parameters
    ----------
    capture : callable, optional
        TVM's ``vm.builtin.cuda_graph.run_or_capture`` (looked up on first use).
    invoke : callable, optional
        TVM's ``vm.builtin.invoke_closure``: runs the region without a graph.
    device : Device, optional
        Name, sync and free memory of the GPU.
    cache : DecisionCache, optional
        Where measured decisions persist (default :func:`default_cache_path`).
    runs : int
        Timed calls per way (without a graph, replayed) when measuring.
    clock : callable
        Seconds, monotonic.
    """

    def __init__(
        self,
        capture: Callable | None = None,
        invoke: Callable | None = None,
        device: Device | None = None,
        cache: DecisionCache | None = None,
        runs: int = 3,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._capture = capture
        self._invoke = invoke
        self.device = device or Device()
        self.cache = cache or DecisionCache()
        self.runs = runs
        self.clock = clock
        self._lock = threading.RLock()
        self._regions: dict[tuple, RegionState] = {}

    # ------------------------------------------------------------------ the VM's entry point
    def __call__(self, vm, func, args, index, name, key, flags, *shape):
        state_key = (_address(vm), int(index), tuple(int(s) for s in shape[0]) if shape else ())
        with self._lock:
            state = self._regions.get(state_key)
            if state is None:
                rerun = not int(flags) & FLAG_NO_RERUN  # the same on every call of the region
                state = self._regions[state_key] = RegionState(name=str(name), rerun=rerun)
            state.calls += 1
        measure = bool(int(flags) & FLAG_MEASURE)
        if not state.decision:
            with self._lock:  # undecided: one thread at a time captures or measures
                if not state.decision:
                    if not measure:
                        return self._capture_region(state, vm, func, args, index, shape)
                    return self._measure(state, vm, func, args, index, str(key), shape)
        if state.decision == GRAPH:
            return self._tvm_capture()(vm, func, args, index, *shape)
        return self._run_eager(vm, func, args)  # EAGER or FAILED

    def status(self) -> list[dict[str, object]]:
        """Per region seen: name, decision, calls, times measured (us), graph memory (bytes)."""
        with self._lock:
            return [s.as_dict() for s in self._regions.values()]

    def clear(self) -> None:
        """Forget every region's state (a VM still running re-decides on its next call)."""
        with self._lock:
            self._regions.clear()

    # ------------------------------------------------------------------ internals
    def _capture_region(self, state, vm, func, args, index, shape):
        """Capture the region (TVM's builtin runs it once, then captures it) and keep the graph;
        on failure run it without a graph from now on."""
        before = self.device.free_bytes()
        try:
            result = self._tvm_capture()(vm, func, args, index, *shape)
        except (RuntimeError, MemoryError) as err:
            state.decision, state.error = FAILED, str(err).strip().splitlines()[-1][:300]
            if not state.rerun:
                raise CaptureError(
                    f"CUDA graph capture of region {state.name!r} failed ({state.error}); "
                    "the region may overwrite what it reads, so this call cannot run it "
                    "again without a graph and has no result; later calls run it without a "
                    "graph (cuda_graph='off' avoids the capture)"
                ) from None
            warnings.warn(
                f"CUDA graph capture of region {state.name!r} failed ({state.error}); "
                "it runs without a graph from now on",
                CaptureWarning,
                stacklevel=3,
            )
            return self._run_eager(vm, func, args)
        after = self.device.free_bytes()
        if before is not None and after is not None:
            state.graph_bytes = max(0, int(before) - int(after))
        state.captured = True
        if not state.cache_key:  # cuda_graph=always: decided by capturing
            state.decision = GRAPH
        return result

    def _measure(self, state, vm, func, args, index, key, shape):
        """One call of a region being measured: ``runs`` timed calls without a graph, one call
        that captures, ``runs`` timed replays, then the decision (module docstring)."""
        if not state.cache_key:
            state.cache_key = "|".join(
                (self._device_name(), key, state.name, ",".join(map(str, shape)))
            )
            known = self.cache.get(state.cache_key)
            if known == EAGER:
                state.decision = EAGER
                return self._run_eager(vm, func, args)
            if known == GRAPH:
                state.cache_key = ""  # decided: capture as cuda_graph=always does
                return self._capture_region(state, vm, func, args, index, shape)
        if len(state.eager_s) < self.runs:
            seconds, result = self._timed(lambda: self._run_eager(vm, func, args))
            state.eager_s.append(seconds)
            return result
        if not state.captured:
            result = self._capture_region(state, vm, func, args, index, shape)
            if state.decision == FAILED:
                self.cache.put(state.cache_key, EAGER)
            return result
        seconds, result = self._timed(lambda: self._tvm_capture()(vm, func, args, index, *shape))
        state.graph_s.append(seconds)
        if len(state.graph_s) >= self.runs:
            state.eager_us = statistics.median(state.eager_s) * 1e6
            state.graph_us = statistics.median(state.graph_s) * 1e6
            state.decision = GRAPH if state.graph_us < state.eager_us else EAGER
            self.cache.put(state.cache_key, state.decision)
        return result

    def _run_eager(self, vm, func, args):
        return self._tvm_invoke()(vm, func, *args)

    def _timed(self, fn: Callable[[], object]) -> tuple[float, object]:
        """Seconds ``fn`` takes from one device sync to the next, and its result."""
        self.device.sync()
        start = self.clock()
        result = fn()
        self.device.sync()
        return self.clock() - start, result

    def _device_name(self) -> str:
        try:
            return str(self.device.name())
        except (RuntimeError, AttributeError):
            return "cuda"

    def _tvm_capture(self) -> Callable:
        if self._capture is None:
            self._capture = tvm_ffi.get_global_func(TVM_RUN_OR_CAPTURE)
        return self._capture

    def _tvm_invoke(self) -> Callable:
        if self._invoke is None:
            self._invoke = tvm_ffi.get_global_func(INVOKE_CLOSURE)
        return self._invoke


def _address(vm: object) -> int:
    """A stable number for the VM context pointer the VM passes first."""
    value = getattr(vm, "value", vm)
    try:
        return int(value or 0)
    except TypeError:
        return id(vm)


_RUNTIME = GraphRuntime()


def runtime() -> GraphRuntime:
    """The runtime behind the registered ``plus.cuda_graph.run_or_capture``."""
    return _RUNTIME


def status() -> list[dict[str, object]]:
    """Per capture region this process ran: decision, calls, measured times, graph memory."""
    return _RUNTIME.status()


def register() -> None:
    """Register ``plus.cuda_graph.run_or_capture`` (idempotent)."""
    tvm_ffi.register_global_func(RUN_OR_CAPTURE, _RUNTIME, override=True)
