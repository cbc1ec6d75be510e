#!/usr/bin/env python
"""Time every generated TIR kernel of a model, option set against option set.

The model goes through phases 1-4 of the plus pipeline (dispatch, legalize, fuse, schedule)
for each option set; every PrimFunc is built alone for the target, run on random inputs with
``time_evaluator`` (parallel loops on the option set's pool, ``cpu_parallel``) and multiplied by
how many times ``main`` calls it. Library calls are not
counted (``scripts/library_share.py`` splits a whole run). Kernels are printed slowest first,
with the time of the same kernel (same name) under each option set.

    .venv/bin/python scripts/kernel_times.py mobilenetv2 --variants "gir=false;gir=true"
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import plus_tvm
import tvm
from plus_tvm.compile_inputs import resolve_inputs
from plus_tvm.compiler import pre_lowering
from plus_tvm.kernel_timing import random_args, signatures
from plus_tvm.loader import load_model
from plus_tvm.runtime import native
from plus_tvm.target import resolve_target


def kernel_times(mod: tvm.IRModule, target, repeat: int) -> dict[str, float]:
    """Milliseconds per inference spent in each PrimFunc of ``mod`` (called name -> ms;
    kernels of symbolic shape skipped)."""
    dev = tvm.cpu()
    rng = np.random.default_rng(0)
    out = {}
    for name, entry in signatures(mod).items():
        args = random_args(entry["args"], dev, rng)
        fn = mod[name].with_attr("global_symbol", "main")
        lib = tvm.compile(tvm.IRModule({"main": fn}), target)
        timer = lib.jit().time_evaluator("main", dev, number=5, repeat=repeat, min_repeat_ms=20)
        timer(*args)  # discarded: a pool that slept (OpenMP's, after compiling) wakes up first
        t = timer(*args)
        out[name] = float(np.median(t.results)) * 1e3 * entry["launches"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="zoo name")
    ap.add_argument("--variants", default="gir=false;gir=true")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    target = resolve_target("llvm")
    loaded = load_model(f"zoo:{args.model}")
    variants = args.variants.split(";")
    times, pools = {}, {}
    for v in variants:
        opts = resolve_inputs(target, plus_tvm.Options.from_pairs([p for p in v.split("+") if p]))
        mod, _ = pre_lowering(loaded, target, opts, "plus")
        # on the pool the compiled model runs its parallel loops on (Options.cpu_parallel)
        pools[v] = f"{opts.cpu_parallel} x{opts.threads}"
        with native.openmp_parallel(opts.cpu_parallel == "openmp"):
            times[v] = kernel_times(mod, target, args.repeat)
    names = sorted(
        {n for t in times.values() for n in t}, key=lambda n: -times[variants[0]].get(n, 0)
    )
    print("parallel loops on: " + ", ".join(f"{v or '(defaults)'}: {p}" for v, p in pools.items()))
    print(f"{'kernel':60}" + "".join(f"{v[:16]:>17}" for v in variants))
    for n in names[: args.top]:
        print(
            f"{n[:60]:60}" + "".join(f"{times[v].get(n, float('nan')):14.3f} ms" for v in variants)
        )
    print(f"{'total':60}" + "".join(f"{sum(times[v].values()):14.3f} ms" for v in variants))
    return 0


if __name__ == "__main__":
    sys.exit(main())
