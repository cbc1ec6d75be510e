"""The order of the suite's files under pytest-xdist (scripts/test runs it with ``--dist
loadfile --no-loadscope-reorder``).

xdist hands each worker one work unit (with ``loadfile``: the tests of one file, so a file's
module fixtures and shared compiles are made once per worker) at a time, in the order the units
are first met in the collection. Its default (``--loadscope-reorder``) sorts the units by their
number of tests, which put the heaviest files (the LM ones: few tests of 30-60 s each) last,
and the last ~10 minutes of a CI run on one worker. Here the files are collected heaviest first
(their tests' CPU seconds in tests/durations.json): handing the longest unit to the first free
worker is the longest-processing-time-first rule, within 4/3 of the best makespan.

A test the data does not know counts as its file's unlisted share, else ``DEFAULT_S``. The order
of a run without xdist (``-n 0``) is left as collected.

Files that share a session-wide compile cache (``SHARED_COMPILES``: tests/_shared_lm.py, one
``compile_lm`` per tiny decoder for the whole process) form one work unit together
(:class:`SharedCompileScheduling`, installed by tests/conftest.py for ``--dist loadfile``), so
one worker compiles each decoder once for all of them instead of each worker that gets one of
those files compiling it again. (``--dist loadgroup`` with ``xdist_group`` marks would say the
same, but does not work with pytest-xdist 3.8 under pytest 9: xdist appends the group to
``item._nodeid``, which pytest 9's ``nodeid`` no longer reads, so every test becomes a unit of
its own.)"""

from __future__ import annotations

import functools
import json
import os
import re

import pytest
from xdist.scheduler import LoadFileScheduling

COSTS = os.path.join(os.path.dirname(__file__), "durations.json")
DEFAULT_S = 1.0  # (the median test of the suite takes well under a second)
# test helper modules holding a per-process cache of compiles that several files use
SHARED_COMPILES = ("_shared_lm",)
_TESTS = os.path.dirname(os.path.abspath(__file__))


@functools.cache
def _costs() -> dict[str, float]:
    try:
        with open(COSTS) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return {k: float(v) for k, v in data.items() if not k.startswith("_")}


@functools.cache
def _shared_compile_of(path: str) -> str | None:
    """The first of ``SHARED_COMPILES`` the test file at ``path`` (relative to tests/'s parent,
    as in node ids) imports, else None."""
    try:
        with open(os.path.join(os.path.dirname(_TESTS), path)) as f:
            text = f.read()
    except OSError:
        return None
    for module in SHARED_COMPILES:
        if re.search(rf"^\s*(from {module} import|import {module}\b)", text, re.MULTILINE):
            return module
    return None


def scope_of(nodeid: str) -> str:
    """The work unit of the test ``nodeid``: its file, or ``shared:<module>`` for every file
    that imports that module of ``SHARED_COMPILES``."""
    path = nodeid.split("::", 1)[0]
    module = _shared_compile_of(path)
    return f"shared:{module}" if module is not None else path


class SharedCompileScheduling(LoadFileScheduling):
    """xdist's ``loadfile``, with the units of :func:`scope_of`."""

    def _split_scope(self, nodeid: str) -> str:
        return scope_of(nodeid)


def _file(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def cost_of(items: list[pytest.Item]) -> list[float]:
    """Estimated CPU seconds of each test: its own entry, else an equal share of its file's
    entry (the file's tests not listed one by one), else ``DEFAULT_S``."""
    costs = _costs()
    unlisted: dict[str, int] = {}
    for item in items:
        if item.nodeid not in costs:
            unlisted[_file(item)] = unlisted.get(_file(item), 0) + 1
    out = []
    for item in items:
        own = costs.get(item.nodeid)
        if own is None:
            rest = costs.get(_file(item))
            own = rest / unlisted[_file(item)] if rest is not None else DEFAULT_S
        out.append(own)
    return out


def order_for_xdist(items: list[pytest.Item]) -> None:
    """Order ``items`` by work unit (:func:`scope_of`), the heaviest unit first (each unit's
    tests in their collection order)."""
    scopes = [scope_of(item.nodeid) for item in items]
    total: dict[str, float] = {}
    first: dict[str, int] = {}
    for i, (scope, cost) in enumerate(zip(scopes, cost_of(items))):
        total[scope] = total.get(scope, 0.0) + cost
        first.setdefault(scope, i)
    key = [(-total[scope], first[scope], i) for i, scope in enumerate(scopes)]
    items[:] = [items[i] for i in sorted(range(len(items)), key=key.__getitem__)]
