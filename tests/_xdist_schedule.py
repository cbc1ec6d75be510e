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

(``--dist loadgroup`` with ``xdist_group`` marks across files, so that one worker compiles a
decoder family once for every file that uses it, does not work with pytest-xdist 3.8 under
pytest 9: xdist appends the group to ``item._nodeid``, which pytest 9's ``nodeid`` no longer
reads, so every test becomes a unit of its own.)"""

from __future__ import annotations

import functools
import json
import os

import pytest

COSTS = os.path.join(os.path.dirname(__file__), "durations.json")
DEFAULT_S = 1.0  # (the median test of the suite takes well under a second)


@functools.cache
def _costs() -> dict[str, float]:
    try:
        with open(COSTS) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return {k: float(v) for k, v in data.items() if not k.startswith("_")}


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
    """Order ``items`` by file, the heaviest file first (each file's tests in their
    collection order)."""
    total: dict[str, float] = {}
    first: dict[str, int] = {}
    for i, (item, cost) in enumerate(zip(items, cost_of(items))):
        total[_file(item)] = total.get(_file(item), 0.0) + cost
        first.setdefault(_file(item), i)
    key = [(-total[_file(item)], first[_file(item)], i) for i, item in enumerate(items)]
    items[:] = [items[i] for i in sorted(range(len(items)), key=key.__getitem__)]
