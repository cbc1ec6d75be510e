"""Run ONNX node tests through the plus pipeline and TVM's own, crash-safe, and classify them.

Each (test, pipeline) runs in a worker process (:mod:`plus_tvm.conformance.worker`) with a
timeout; a worker that crashes or hangs is replaced and the test is recorded as ``crash`` or
``timeout``. Workers are bound to one pipeline, so TVM's side never has plus_tvm imported.

Every test gets a class from the two outcomes: ``both_pass``, ``both_fail``, ``plus_only_fail``
(plus breaks what TVM gets right: a defect of ours) and ``tvm_only_fail`` (plus_tvm's frontend or
pipeline gets right what TVM does not).
"""

from __future__ import annotations

import collections
import json
import os
import re
import select
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..env import child_environment
from ..paths import check_private
from .cases import NodeCase, cache_path

PIPELINES = ("plus", "tvm")
CLASSES = ("both_pass", "both_fail", "plus_only_fail", "tvm_only_fail")
_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")


@dataclass
class _Worker:
    pipeline: str
    proc: subprocess.Popen
    results: object  # the read end of the result pipe (a file object)
    task: str | None = None
    started: float = 0.0

    @classmethod
    def start(cls, pipeline: str, cache: str) -> _Worker:
        read_fd, write_fd = os.pipe()
        env = child_environment()
        # one core per worker: several workers share the machine
        env.setdefault("TVM_NUM_THREADS", "1")
        env.setdefault("OMP_NUM_THREADS", "1")
        proc = subprocess.Popen(
            [sys.executable, _WORKER, cache, "--result-fd", str(write_fd)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(write_fd,),
            env=env,
            text=True,
        )
        os.close(write_fd)
        return cls(pipeline, proc, os.fdopen(read_fd, "r"))

    def send(self, name: str) -> None:
        self.task, self.started = name, time.monotonic()
        self.proc.stdin.write(json.dumps({"name": name, "pipeline": self.pipeline}) + "\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.results.close()
        if self.proc.stdin:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:  # the worker is gone already
                pass


@dataclass
class Report:
    """The outcome of a run: per test, per pipeline records and the test's class."""

    tests: dict[str, dict] = field(default_factory=dict)
    duration_s: float = 0.0
    pipelines: tuple[str, ...] = PIPELINES

    def counts(self) -> dict[str, int]:
        """Tests per class (and passes per pipeline)."""
        out = collections.Counter(t["class"] for t in self.tests.values() if "class" in t)
        for p in self.pipelines:
            out[f"{p}_pass"] = sum(
                1 for t in self.tests.values() if t.get(p, {}).get("status") == "pass"
            )
        out["tests"] = len(self.tests)
        return dict(out)

    def names(self, cls: str) -> list[str]:
        return sorted(n for n, t in self.tests.items() if t.get("class") == cls)

    def to_json(self) -> dict:
        import onnx
        import tvm

        from .._version import __version__

        return {
            "format": "plus_tvm.conformance/1",
            "onnx": onnx.__version__,
            "tvm": tvm.__version__,
            "plus_tvm": __version__,
            "pipelines": list(self.pipelines),
            "duration_s": round(self.duration_s, 1),
            "counts": self.counts(),
            "tests": self.tests,
        }


def classify(plus: str | None, tvm: str | None) -> str:
    """The class of a test from the status of each pipeline (``pass`` or anything else)."""
    plus_ok, tvm_ok = plus == "pass", tvm == "pass"
    if plus_ok and tvm_ok:
        return "both_pass"
    if plus_ok:
        return "tvm_only_fail"
    if tvm_ok:
        return "plus_only_fail"
    return "both_fail"


def run(
    cases: Sequence[NodeCase],
    pipelines: Sequence[str] = PIPELINES,
    jobs: int | None = None,
    timeout_s: float = 120.0,
    progress: Callable[[int, int], None] | None = None,
) -> Report:
    """Run every case under every pipeline in ``jobs`` worker processes.

    Parameters
    ----------
    cases : sequence of NodeCase
        The tests (from :func:`plus_tvm.conformance.cases.load_cases`, which also fills the
        cache the workers read).
    pipelines : sequence of str
        ``"plus"`` and/or ``"tvm"``.
    jobs : int, optional
        Worker processes (default: the cores this process may use).
    timeout_s : float
        Seconds one test may take under one pipeline (import, compile, run, compare).
    progress : callable, optional
        ``progress(done, total)`` after each result.
    """
    for p in pipelines:
        if p not in PIPELINES:
            raise ValueError(f"unknown pipeline {p!r}; choose from {list(PIPELINES)}")
    cache = cache_path()
    if not os.path.exists(cache):
        raise FileNotFoundError(f"{cache}: call load_cases() first")
    check_private(cache)
    jobs = jobs or len(os.sched_getaffinity(0))
    pending = {p: collections.deque(c.name for c in cases) for p in pipelines}
    total = len(cases) * len(pipelines)
    report = Report({c.name: {"op": c.op} for c in cases}, pipelines=tuple(pipelines))
    slots: list[_Worker | None] = [None] * max(1, jobs)
    done = 0
    start = time.monotonic()

    def record(worker: _Worker, result: dict) -> None:
        nonlocal done
        report.tests[worker.task][worker.pipeline] = result
        worker.task = None
        done += 1
        if progress is not None:
            progress(done, total)

    def busy(p: str) -> int:
        return sum(1 for w in slots if w is not None and w.pipeline == p and w.task)

    try:
        while done < total:
            # an idle worker keeps its pipeline while that has work (a worker costs seconds to
            # start); a new one, or one whose pipeline is done, takes the pipeline with the most
            # work per busy worker
            for k, worker in enumerate(slots):
                if worker is not None and worker.task:
                    continue
                choices = [p for p in pipelines if pending[p]]
                if not choices:
                    continue
                if worker is not None and pending[worker.pipeline]:
                    pipe = worker.pipeline
                else:
                    pipe = max(choices, key=lambda p: len(pending[p]) / (1 + busy(p)))
                if worker is None or worker.pipeline != pipe:
                    if worker is not None:
                        worker.stop()
                    worker = slots[k] = _Worker.start(pipe, cache)
                worker.send(pending[pipe].popleft())
            running = [w for w in slots if w is not None and w.task]
            ready, _, _ = select.select([w.results for w in running], [], [], 1.0)
            for worker in running:
                if worker.results in ready:
                    line = worker.results.readline()
                    if line:
                        record(worker, _strip(json.loads(line)))
                        continue
                    code = worker.proc.wait()
                    record(worker, {"status": "crash", "stage": "?", "error": _died(code)})
                elif time.monotonic() - worker.started > timeout_s:
                    record(
                        worker,
                        {"status": "timeout", "stage": "?", "error": f"over {timeout_s:g} s"},
                    )
                else:
                    continue
                # a dead or hung worker is replaced on the next round
                slots[slots.index(worker)] = None
                worker.stop()
    finally:
        for worker in slots:
            if worker is not None:
                worker.stop()
    for entry in report.tests.values():
        if len(pipelines) == 2:
            entry["class"] = classify(
                entry.get("plus", {}).get("status"), entry.get("tvm", {}).get("status")
            )
    report.duration_s = time.monotonic() - start
    return report


def _strip(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in ("name", "pipeline")}


def _died(code: int) -> str:
    if code < 0:
        import signal

        try:
            return f"worker killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"worker killed by signal {-code}"
    return f"worker exited with code {code}"


_VOLATILE = re.compile(r"0x[0-9a-f]+|\b\d+\b|'[^']*'|\"[^\"]*\"|\([^()]*\)|\[[^\[\]]*\]")


def failure_kind(record: dict) -> str:
    """A failure's message with names and numbers blanked, to group failures of one cause."""
    text = record.get("error", "")
    return f"{record.get('stage', '?')}: " + _VOLATILE.sub("_", text)[:160]


def summary(report: Report, top: int = 15) -> str:
    """A text summary: counts, the plus-only failures, the most frequent failure kinds."""
    counts = report.counts()
    lines = [f"{counts['tests']} ONNX node tests in {report.duration_s:.0f} s"]
    for p in report.pipelines:
        lines.append(f"  {p}: {counts.get(f'{p}_pass', 0)} pass")
    if len(report.pipelines) == 2:
        for cls in CLASSES:
            lines.append(f"  {cls}: {counts.get(cls, 0)}")
        bad = report.names("plus_only_fail")
        if bad:
            lines.append("plus-only failures:")
            for name in bad:
                rec = report.tests[name]["plus"]
                lines.append(f"  {name}: {rec.get('stage')}: {rec.get('error', '')[:200]}")
    timed = [
        (t[p].get("seconds", 0.0), name, p)
        for name, t in report.tests.items()
        for p in report.pipelines
        if p in t
    ]
    slow = sorted(timed, reverse=True)[:5]
    if slow and slow[0][0] > 0:
        lines.append("slowest: " + ", ".join(f"{n} ({p}) {s:.0f} s" for s, n, p in slow))
    for p in report.pipelines:
        kinds = collections.Counter(
            failure_kind(t[p])
            for t in report.tests.values()
            if t.get(p, {}).get("status") != "pass"
        )
        if kinds:
            lines.append(f"most frequent {p} failures:")
            lines += [f"  {n:4d}  {k}" for k, n in kinds.most_common(top)]
    return "\n".join(lines)


def write_json(report: Report, path: str) -> None:
    with open(path, "w") as f:
        json.dump(report.to_json(), f, indent=1)
