"""The thread policy of plus_tvm, decided once, and the snapshot that checks it is kept.

A compiled model runs two kinds of parallel code in turn, never at the same time: TVM's kernels
on TVM's thread pool, and library kernels (oneDNN / ATen through torch) on torch's OpenMP pool.
Left to itself, TVM's pool (1) sizes itself to half the hardware threads on x86, which is half
the cores of a machine without SMT, and (2) pins the calling thread to CPU 0 when it starts
(``TVM_BIND_THREADS``), so from then on torch and every other library in the process see one
core. plus_tvm therefore sets, at import and only where the user has not:

* ``TVM_BIND_THREADS=0``: no thread of the process is pinned; the caller's affinity stays;
* ``TVM_NUM_THREADS`` = the physical cores of the process's affinity (:func:`physical_cores`),
  so TVM's kernels use every core, as torch's pool does by default;
* ``TVM_THREAD_POOL_SPIN_COUNT=0``: TVM's workers sleep as soon as a parallel job ends. With
  TVM's default (300000 yields) an idle worker keeps a core busy while the next library call
  runs torch's pool on every core: measured on 2 cores, MobileNetV2 17.4 ms with no spin vs
  27.7 ms (median; bimodal 17.5-30) with the default spin, ResNet-50 54.8 vs 75.7 ms, BERT-base
  102.6 vs 100.7 ms; a pool of one thread: 18.0, 56.2, 99.0 ms (``scripts/thread_policy.py``).

torch's thread count is never changed.

Both variables are read by TVM when its pool starts (the first parallel kernel), so they take
effect when ``plus_tvm`` is imported before TVM runs a kernel. :func:`snapshot` is what tests and
the benchmark use to prove that compiling and running a model leaves the process as it was.
"""

from __future__ import annotations

import os

from . import env as _env

BIND_ENV = _env.TVM_BIND_THREADS
NUM_ENV = _env.TVM_NUM_THREADS
SPIN_ENV = _env.TVM_THREAD_POOL_SPIN_COUNT


def _allowed() -> set[int] | None:
    return set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def physical_cores() -> int:
    """Physical cores of the CPUs this process may run on (hyper-threads counted once).

    ``TVM_NUM_THREADS`` and then ``OMP_NUM_THREADS`` win when set, as in TVM's own sizing.

    Returns
    -------
    int
        The thread count, at least 1.
    """
    given = _env.thread_count()
    if given is not None:
        return given
    allowed = _allowed()
    cores: set[tuple[str, str]] = set()
    try:
        with open("/proc/cpuinfo") as f:
            proc = phys = core = None
            for line in f:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key == "processor":
                    proc = int(value)
                elif key == "physical id":
                    phys = value
                elif key == "core id":
                    core = value
                elif not key and proc is not None:
                    if allowed is None or proc in allowed:
                        cores.add((str(phys), str(core if core is not None else proc)))
                    proc = phys = core = None
            if proc is not None and (allowed is None or proc in allowed):
                cores.add((str(phys), str(core if core is not None else proc)))
    except OSError:
        pass
    if cores:
        return len(cores)
    return len(allowed) if allowed else (os.cpu_count() or 1)


def configure_tvm_pool(environ: dict | None = None) -> dict[str, str]:
    """Set the policy's defaults in ``environ`` (``os.environ``) where the user has not.

    Returns
    -------
    dict
        The three variables as they are now.
    """
    env = os.environ if environ is None else environ
    env.setdefault(BIND_ENV, "0")
    env.setdefault(NUM_ENV, str(physical_cores()))
    env.setdefault(SPIN_ENV, "0")
    return {key: env[key] for key in (BIND_ENV, NUM_ENV, SPIN_ENV)}


STATE_KEYS = ("affinity", "torch_threads", "torch_interop_threads")


def snapshot() -> dict:
    """What the process's parallel libraries see: its CPU affinity (sorted list) and torch's
    thread counts (``None`` while torch is not imported). The bench's worker script reports the
    same keys (it cannot import plus_tvm)."""
    import sys

    allowed = _allowed()
    torch = sys.modules.get("torch")
    return {
        "affinity": sorted(allowed) if allowed is not None else [],
        "torch_threads": torch.get_num_threads() if torch is not None else None,
        "torch_interop_threads": torch.get_num_interop_threads() if torch is not None else None,
    }


def state_changes(before: dict, after: dict) -> list[str]:
    """What differs between two :func:`snapshot` states (a ``None`` count is not compared)."""
    out = []
    for key in STATE_KEYS:
        a, b = before.get(key), after.get(key)
        if a is not None and b is not None and a != b:
            out.append(f"{key} {a} -> {b}")
    return out
