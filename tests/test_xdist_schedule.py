"""The suite's own xdist scheduling (tests/_xdist_schedule.py, installed by tests/conftest.py):
files that share tests/_shared_lm.py's per-process compiles go to one worker as one unit, the
rest file by file, the heaviest unit first."""

from __future__ import annotations

import types

import conftest
import pytest
from _xdist_schedule import SharedCompileScheduling, order_for_xdist, scope_of

SHARED = ("tests/test_lm_generate.py", "tests/test_lm_saved.py", "tests/test_family_attention.py")
ALONE = ("tests/test_runtime.py", "tests/test_xdist_schedule.py")


@pytest.mark.parametrize("path", SHARED)
def test_files_importing_the_shared_compiles_are_one_unit(path):
    assert scope_of(f"{path}::test_x[gpt2]") == "shared:_shared_lm"


@pytest.mark.parametrize("path", ALONE)
def test_other_files_are_their_own_unit(path):
    assert scope_of(f"{path}::test_x") == path


def test_an_unknown_file_is_its_own_unit():
    assert scope_of("tests/no_such_file.py::test") == "tests/no_such_file.py"


def _config(dist: str) -> object:
    values = {"dist": dist, "tx": ["2*popen"]}
    return types.SimpleNamespace(
        getvalue=values.__getitem__, option=types.SimpleNamespace(loadscopereorder=False)
    )


def test_the_hook_takes_loadfile_only():
    assert isinstance(
        conftest.pytest_xdist_make_scheduler(_config("loadfile"), None), SharedCompileScheduling
    )
    for dist in ("load", "loadscope", "worksteal", "each"):
        assert conftest.pytest_xdist_make_scheduler(_config(dist), None) is None


class _Node:
    """What the scheduler uses of xdist's WorkerController."""

    def __init__(self, name: str) -> None:
        self.gateway = types.SimpleNamespace(id=name)
        self.sent: list[int] = []
        self.shutting_down = False

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent += indices

    def shutdown(self) -> None:
        self.shutting_down = True


def test_a_worker_gets_every_shared_file_and_the_other_the_rest():
    collection = [
        "tests/test_lm_generate.py::test_a",
        "tests/test_lm_generate.py::test_b",
        "tests/test_runtime.py::test_c",
        "tests/test_lm_saved.py::test_d",
        "tests/test_xdist_schedule.py::test_e",
    ]
    sched = SharedCompileScheduling(_config("loadfile"), None)
    nodes = [_Node("gw0"), _Node("gw1")]
    for node in nodes:
        sched.add_node(node)
        sched.add_node_collection(node, collection)
    sched.schedule()
    by_node = [{collection[i].split("::")[0] for i in node.sent} for node in nodes]
    shared = next(files for files in by_node if "tests/test_lm_generate.py" in files)
    assert {"tests/test_lm_generate.py", "tests/test_lm_saved.py"} <= shared
    other = by_node[1 - by_node.index(shared)]
    assert "tests/test_lm_saved.py" not in other and other


def test_order_puts_a_units_tests_together_heaviest_unit_first(monkeypatch):
    import _xdist_schedule

    costs = {
        "tests/test_runtime.py::test_c": 5.0,
        "tests/test_lm_generate.py::test_a": 3.0,
        "tests/test_lm_saved.py::test_d": 4.0,
    }
    monkeypatch.setattr(_xdist_schedule, "_costs", lambda: costs)
    items = [
        types.SimpleNamespace(nodeid=n)
        for n in (
            "tests/test_lm_generate.py::test_a",
            "tests/test_runtime.py::test_c",
            "tests/test_xdist_schedule.py::test_e",
            "tests/test_lm_saved.py::test_d",
        )
    ]
    order_for_xdist(items)
    # the shared unit (3 + 4 s) before test_runtime.py (5 s), then the 1 s default
    assert [i.nodeid for i in items] == [
        "tests/test_lm_generate.py::test_a",
        "tests/test_lm_saved.py::test_d",
        "tests/test_runtime.py::test_c",
        "tests/test_xdist_schedule.py::test_e",
    ]
