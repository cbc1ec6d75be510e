"""Per-kernel times of a compiled model: which generated kernel costs what, schedule against
schedule (GIR's against dlight's on a GPU, for instance).

Two halves, so that the timing runs where only TVM's runtime library is:

- :func:`signatures` (with the compiler, at bundle time): for each TIR kernel ``main`` launches,
  its arguments' shapes and dtypes and its launches per inference, read off the module that
  phases 1-4 produce (kernels of symbolic shape are left out);
- :func:`time_kernels` (runtime only): each kernel of a loaded library called alone through its
  host function with ``time_evaluator`` on random arguments (floats standard normal, integers
  zero so that gathers stay in range, booleans random), median ms times launches.

Library calls are not kernels here (their time is the library's). ``scripts/kernel_times.py``
uses the same signatures and arguments on the CPU.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

import numpy as np
import tvm

Signature = list[tuple[list[int], str]]


def signature(func: object) -> Signature | None:
    """``(shape, dtype)`` of each parameter of a PrimFunc, or None when one is symbolic or not
    a buffer."""
    from tvm import tirx

    out: Signature = []
    for param in func.params:
        buf = param.ty
        if not hasattr(buf, "shape"):
            return None
        shape = []
        for dim in buf.shape:
            if not isinstance(dim, tirx.IntImm):
                return None
            shape.append(int(dim))
        out.append((shape, str(buf.dtype)))
    return out


def launches(mod: tvm.IRModule) -> collections.Counter:
    """PrimFunc name -> launches per inference of ``main`` (reshapes that lower to views are not
    counted)."""
    from tvm import relax

    from .stats import kernel_calls

    calls = kernel_calls(relax.transform.RewriteDataflowReshape()(mod))
    return collections.Counter(callee for op, callee in calls if op.startswith("relax.call_tir"))


def signatures(mod: tvm.IRModule) -> dict[str, dict[str, object]]:
    """Name -> ``{"args": [[shape, dtype], ...], "launches": n}`` for every statically shaped
    TIR kernel ``main`` of ``mod`` (a phase-4 module) launches."""
    from tvm import tirx

    counts = launches(mod)
    out: dict[str, dict[str, object]] = {}
    for gvar, func in mod.functions_items():
        name = gvar.name_hint
        if not isinstance(func, tirx.PrimFunc) or name not in counts:
            continue
        sig = signature(func)
        if sig is not None:
            out[name] = {"args": [[list(s), d] for s, d in sig], "launches": counts[name]}
    return out


def random_args(sig: Sequence, dev: object, rng: np.random.Generator) -> list:
    """Device tensors for a signature: floats standard normal, integers zero (indices in
    range), booleans random."""
    out = []
    for shape, dtype in sig:
        if dtype.startswith(("float", "bfloat")):
            a = rng.standard_normal(shape).astype("float32").astype(dtype)
        elif dtype == "bool":
            a = rng.integers(0, 2, shape).astype(bool)
        else:
            a = np.zeros(shape, dtype)
        out.append(tvm.runtime.tensor(a, dev))
    return out


def host_module(library: tvm.runtime.Module, name: str) -> tvm.runtime.Module | None:
    """The module among ``library`` and its imports (depth first) that defines ``name``."""
    stack = [library]
    while stack:
        mod = stack.pop()
        if mod.implements_function(name, False):
            return mod
        stack.extend(mod.imports)
    return None


def time_kernels(
    library: tvm.runtime.Module,
    sigs: dict[str, dict[str, object]],
    dev: object,
    repeat: int = 5,
    min_repeat_ms: int = 10,
) -> dict[str, float]:
    """Milliseconds per inference in each kernel of ``sigs`` (median over ``repeat`` timings,
    times its launches), calling each kernel's launcher in ``library`` (a loaded model's
    executable, or the compiled VM executable's module) on random arguments; a kernel the
    library lacks is skipped."""
    rng = np.random.default_rng(0)
    out: dict[str, float] = {}
    for name, entry in sigs.items():
        host = host_module(library, name)
        if host is None:
            continue
        args = random_args(entry["args"], dev, rng)
        timer = host.time_evaluator(
            name, dev, number=10, repeat=repeat, min_repeat_ms=min_repeat_ms
        )
        out[name] = float(np.median(timer(*args).results)) * 1e3 * int(entry["launches"])
    return out
