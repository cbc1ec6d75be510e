#!/usr/bin/env python
"""Where the time goes: library calls vs generated TIR kernels, per model and option set.

Each run times the library kernels, runs the compiled model, and splits the median latency into
the library share and the rest (TIR kernels and VM overhead). The native kernels (the default
on CPU: the VM calls them directly) count their own call time (``native.status()``, read before
and after each run); the Python kernels (where a native one is unavailable) are wrapped with a
timer.
Option sets are measured one after the other in one process, rounds interleaved.

    .venv/bin/python scripts/library_share.py --models bert-base,mobilenetv2 \\
        --variants "gir=false;gir=true" --runs 10
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time

import plus_tvm
import tvm_ffi
from plus_tvm.loader import load_model
from plus_tvm.runtime import KERNELS, native


def _native_call_s() -> float:
    """Seconds the native kernels have spent in calls so far (their own counters)."""
    kernels = native.status().get("kernels") or {}
    return sum(float(k.get("call_us", 0)) for k in kernels.values()) / 1e6


class _Timed:
    def __init__(self) -> None:
        self.spent = collections.Counter()

    def install(self) -> None:
        for name, kernel in KERNELS.items():

            def timed(*args, _k=kernel, _n=name):
                start = time.perf_counter()
                type(_k).__call__(_k, *args)
                self.spent[_n] += time.perf_counter() - start

            tvm_ffi.register_global_func(name, timed, override=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="bert-base")
    parser.add_argument(
        "--variants",
        default="gir=false;gir=true",
        help="';'-separated option sets, each '+'-joined KEY=VALUE",
    )
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    timer = _Timed()
    timer.install()
    print("| model | options | median ms | library ms | rest ms | rest share | kernels |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for model in args.models.split(","):
        loaded = load_model(f"zoo:{model}")
        variants = args.variants.split(";")
        compiled = {}
        for v in variants:
            opts = plus_tvm.Options.from_pairs([p for p in v.split("+") if p])
            cm = plus_tvm.compile(loaded, options=opts)
            compiled[v] = (cm, cm.prepare(*loaded.example_inputs))
            for _ in range(2):
                cm.run_prepared(compiled[v][1])
        totals = {v: [] for v in variants}
        libs = {v: [] for v in variants}
        for _ in range(args.runs):
            for v in variants:
                cm, prepared = compiled[v]
                timer.spent.clear()
                native_before = _native_call_s()
                start = time.perf_counter()
                cm.run_prepared(prepared)
                totals[v].append(time.perf_counter() - start)
                libs[v].append(sum(timer.spent.values()) + _native_call_s() - native_before)
        for v in variants:
            total = statistics.median(totals[v]) * 1e3
            lib = statistics.median(libs[v]) * 1e3
            rest = total - lib
            kernels = compiled[v][0].stats["kernels"]
            row = [model, v, f"{total:.1f}", f"{lib:.1f}", f"{rest:.1f}", f"{rest / total:.0%}"]
            print("| " + " | ".join([*row, str(kernels)]) + " |", flush=True)


if __name__ == "__main__":
    main()
