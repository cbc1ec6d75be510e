"""Compiled models in a forked child (multiprocessing's ``fork`` workers, pre-forking servers).

``fork`` copies only the calling thread. A thread pool the parent started is gone in the
child, while the pool's bookkeeping says its threads are there: GNU OpenMP (the pool oneDNN,
plus's parallel kernels and torch share) then waits forever at its first barrier, and so does
TVM's own pool. So, at import, plus_tvm registers a handler that runs in every forked child,
sets OpenMP's thread count to 1 there, in each OpenMP runtime the process has loaded, and drops
the library kernels' plans (a oneDNN primitive keeps the team size it was made for): a
parallel region of one thread never touches the dead team, so a model runs in the child, on
one core. (Processes that need every core in each worker start them with ``spawn`` or
``forkserver``.)

TVM's own pool cannot be told the same: a model whose kernels run on it (``cpu_parallel="tvm"``,
or where the native library is unavailable) and that already ran in the parent refuses to
run in the child, with an error saying what to do, instead of hanging.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Callable


def _openmp_runtimes() -> list[str]:
    """Paths of the OpenMP runtimes (``libgomp``, ``libomp``, ``libiomp``) this process has
    loaded, from ``/proc/self/maps``."""
    paths: list[str] = []
    with contextlib.suppress(OSError):
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rstrip("\n").split(maxsplit=5)[-1]
                name = os.path.basename(path)
                if name.startswith(("libgomp", "libomp", "libiomp")) and path not in paths:
                    paths.append(path)
    return paths


def serial_openmp() -> int:
    """Set OpenMP's thread count to 1 in every loaded OpenMP runtime; how many were found."""
    done = 0
    for path in _openmp_runtimes():
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(path).omp_set_num_threads(1)  # (the already loaded library)
            done += 1
    return done


def register(drop_plans: Callable[[], None]) -> None:
    """In every child this process forks: :func:`serial_openmp`, then ``drop_plans`` (the
    runtime's cached primitives and packed weights, made again on one thread)."""

    def in_child() -> None:
        serial_openmp()
        drop_plans()

    os.register_at_fork(after_in_child=in_child)
