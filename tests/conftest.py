"""Shared test setup: strict pass checks, offline Hugging Face, deterministic torch, GPU marker.

Every test runs inside a ``PassContext`` with ``testing.immutable_module`` (a pass that mutates
its input module fails) and relax's ``WellFormedInstrument`` (every pass must produce well-formed
IR), as DESIGN.md section 5 asks.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys

# Before anything imports transformers / huggingface_hub: tests never touch the network.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
# Before anything loads OpenMP (torch): under pytest-xdist (one worker per core) a thread of
# OpenMP's team that spins after each parallel region takes the core another worker is running
# on. Two processes each running transformers' generate (tiny LLaMA, 2 torch threads) on 2
# cores took 3.2-4.3 s each with the default spin, 0.8-1.1 s with a passive wait (one alone:
# 0.7-0.9 s either way). Thread counts and results are unchanged; only waiting is.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import pytest  # noqa: E402
import torch  # noqa: E402
import tvm  # noqa: E402
import tvm.relax.ir.instrument  # noqa: E402  (tvm.relax.ir is not imported by ``import tvm``)
from _xdist_schedule import SharedCompileScheduling, order_for_xdist  # noqa: E402

torch.manual_seed(0)
torch.set_num_threads(2)

IMMUTABLE_KEY = "testing.immutable_module"


def _has_gpu() -> bool:
    try:
        return bool(tvm.cuda(0).exist)
    except Exception:  # a CPU-only TVM build may raise instead of answering False
        return False


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped where none is present)")


@pytest.hookimpl(optionalhook=True, tryfirst=True)  # (before xdist's own, a first-result hook)
def pytest_xdist_make_scheduler(config: pytest.Config, log):  # noqa: ANN001, ANN201
    """``--dist loadfile`` (scripts/test) with the files sharing a compile cache as one unit
    (tests/_xdist_schedule.py); any other mode is xdist's own."""
    if config.getvalue("dist") == "loadfile":
        return SharedCompileScheduling(config, log)
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        order_for_xdist(items)
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (tvm.cuda(0).exist is false)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


# TVM 0.27 passes that update the module they are given in place instead of a copy, so TVM's own
# pipelines fail the ``testing.immutable_module`` check on every model:
# - tirx.AnnotateEntryFunc (src/tirx/transform/primfunc_utils.cc) calls ``mod->Update`` on its
#   input when it holds a single PrimFunc: ``tvm.tirx.build`` of any one-kernel model fails;
# - tirx.SplitHostDevice (split_host_device.cc) ends with ``mod->Update(updates)`` on its input;
# - dlight's ApplyDefaultSchedule (s_tir/dlight/base/transform.py) assigns ``mod[gvar] = ...``
#   into its input; TVM's CUDA pipeline (our ``pipeline="tvm"`` baseline) runs it.
# These passes run on a copy with the check off, but only when a TVM pipeline (code in the ``tvm``
# package) builds them: every other pass stays checked, and plus_tvm's own passes -- including
# any use of these three from our code -- do too.
_TVM_IN_PLACE_PASSES = (
    ("tvm.tirx.transform", "AnnotateEntryFunc"),
    ("tvm.tirx.transform", "SplitHostDevice"),
    ("tvm.s_tir.dlight", "ApplyDefaultSchedule"),
)


def _on_a_copy(original):
    """A factory like ``original`` whose pass, when TVM builds it, runs on a copy, unchecked."""

    def make(*args, **kwargs) -> tvm.transform.Pass:
        inner = original(*args, **kwargs)
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if not caller.startswith("tvm."):
            return inner

        @tvm.transform.module_pass(opt_level=0, name=inner.info.name)
        def run(mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
            config = {k: v for k, v in ctx.config.items() if k != IMMUTABLE_KEY}
            copy = tvm.IRModule(
                dict(mod.functions_items()), attrs=mod.attrs, global_infos=mod.global_infos
            )
            with tvm.transform.PassContext(opt_level=ctx.opt_level, config=config):
                return inner(copy)

        return run

    return make


@tvm.instrument.pass_instrument
class WellFormedInstrument:
    """relax's ``WellFormedInstrument`` (``check_well_formed`` of every pass's input and output,
    types included, but around ``Normalize``, ``NormalizeGlobalVar``, ``ResolveGlobals``) that
    checks a module it has seen pass, unchanged, only once: a pass's output is the next pass's
    input, and a ``Sequential`` hands its own input to its first pass and returns its last
    pass's output, so the stock instrument checks most modules two to four times (60-75% of its
    checks; a tiny ResNet-50 compile spent 0.76 of 2.5 s in them).

    A module counts as unchanged while it is the same object holding the same functions map,
    attributes and global infos objects as when it passed: this instrument holds them, so an
    in-place update of the module (``IRModule.update_func``, ``mod[gv] = f``: copy-on-write of
    a map someone else holds) replaces its map, and the module is checked again."""

    SKIP = ("Normalize", "NormalizeGlobalVar", "ResolveGlobals")
    KEEP = 16  # modules remembered (the passes of a pipeline hand modules on one by one)

    def __init__(self) -> None:
        self._passed: list[tuple] = []

    def run_before_pass(self, mod: tvm.IRModule, info: tvm.transform.PassInfo) -> None:
        self._check(mod, info.name, "Before")

    def run_after_pass(self, mod: tvm.IRModule, info: tvm.transform.PassInfo) -> None:
        self._check(mod, info.name, "After")

    def _check(self, mod: tvm.IRModule, name: str, when: str) -> None:
        if name in self.SKIP:
            return
        parts = (mod, mod.functions, mod.attrs, mod.global_infos)
        for seen in self._passed:
            if all(_same(a, b) for a, b in zip(parts, seen)):
                return
        well_formed = tvm.relax.analysis.check_well_formed(mod, True)
        if not well_formed:
            mod.show(name=f"{when}{name}")
        assert well_formed
        self._passed = [*self._passed[-(self.KEEP - 1) :], parts]


def _same(a: object, b: object) -> bool:
    return a is b if a is None or b is None else bool(a.same_as(b))


@contextlib.contextmanager
def strict_pass_context():
    """The immutable-module check and the well-formedness instrument, as a context manager."""
    instrument = WellFormedInstrument()
    with tvm.transform.PassContext(config={IMMUTABLE_KEY: True}, instruments=[instrument]):
        yield


@pytest.fixture(scope="session", autouse=True)
def _tvm_in_place_passes_on_a_copy():
    with pytest.MonkeyPatch.context() as patch:
        for module_name, name in _TVM_IN_PLACE_PASSES:
            module = importlib.import_module(module_name)
            patch.setattr(module, name, _on_a_copy(getattr(module, name)))
        yield


@pytest.fixture(autouse=True)
def _strict_pass_context():
    """Every test runs under the immutable-module check and the well-formedness instrument,
    with torch's random weights independent of which tests ran before."""
    torch.manual_seed(0)
    with strict_pass_context():
        yield


@pytest.fixture(scope="session")
def strict():
    """``strict_pass_context`` for module- or session-scoped fixtures that compile something
    (they are set up before the per-test autouse context is entered)."""
    return strict_pass_context


@pytest.fixture
def deep_copy():
    """A function returning an independent deep copy of an IRModule.

    A TVMScript round trip: ``tvm.ir.save_json`` (and so ``copy.deepcopy`` and pickling) of any
    TVM object segfaults in ``tvm::ffi::ToJSONGraph`` with apache-tvm 0.27.0.post1 and
    apache-tvm-ffi 0.1.15.post2.
    """

    def copy(mod: tvm.IRModule) -> tvm.IRModule:
        dup = tvm.script.from_source(mod.script(show_meta=True))
        tvm.ir.assert_structural_equal(dup, mod)
        assert not dup.same_as(mod)
        return dup

    return copy


@pytest.fixture(params=["pool", "4 cores"])
def cores(request, monkeypatch):
    """Plan for the runtime's own pool (one thread on a 2-core x86 machine: serial plans), or
    as if it had 4 threads: parallel rows and column reductions split over cores, whose loops
    run correctly (if not faster) on any pool."""
    if request.param == "4 cores":
        import dataclasses

        from plus_tvm.gir import search

        real = search.machine_for
        monkeypatch.setattr(search, "machine_for", lambda t: dataclasses.replace(real(t), units=4))
    return request.param


@pytest.fixture(scope="session", autouse=True)
def _native_build_once(tmp_path_factory):
    """The native kernels are compiled once per test session (every test, and every process
    a test starts, finds them there), never into the user's cache. Under pytest-xdist the
    workers share one folder (the build takes a file lock and renames into place)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker's base is <run's base>/popen-gwN
        folder = base.parent / "native"
        folder.mkdir(exist_ok=True)
    else:
        folder = tmp_path_factory.mktemp("native")
    os.environ.setdefault("PLUS_TVM_NATIVE_CACHE", str(folder))


@pytest.fixture(autouse=True)
def _no_figures_cache(tmp_path, monkeypatch):
    """Tests never read (or write) the user's measured machine figures (GIR's performance
    model): every run plans with the same defaults, on any machine."""
    monkeypatch.setenv("PLUS_TVM_CACHE_DIR", str(tmp_path))
