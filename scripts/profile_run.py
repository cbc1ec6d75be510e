#!/usr/bin/env python
"""Where a compiled model's time goes, as it runs: every VM call of real inferences, timed.

The model is compiled (plus pipeline, this CPU), run ``--warmup`` times, then run ``--runs``
times with a VM instrument (TVM 0.27's VM has no profiler: ``set_instrument`` is called before
and after each Call instruction) that times every call the VM makes (a TIR kernel, a library
call, a VM builtin) and sums it by name. Printed slowest first with the count per inference and
each name's share of the summed time, and the wall time of the instrumented runs (the instrument
costs a few microseconds per call, the gap between the two). A library call is one row: its own
time, whatever it runs inside.

    .venv/bin/python scripts/profile_run.py zoo:gpt2 --dtype bf16 --runs 5
"""

from __future__ import annotations

import argparse
import collections
import copy
import time

import plus_tvm
import torch
import tvm_ffi
from plus_tvm.loader import load_model
from plus_tvm.runtime import native, use_native
from tvm.runtime.vm import VirtualMachine

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _in_dtype(loaded, dtype: torch.dtype):
    module = copy.deepcopy(loaded.torch_module).eval().to(dtype)
    args = tuple(
        x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
        for x in loaded.example_inputs
    )
    return module, args


def profile(model: str, dtype: str, runs: int, warmup: int, options: list[str]) -> list[dict]:
    """Per-name rows ``{"name", "calls", "ms", "share"}`` (per inference), slowest first."""
    loaded = load_model(model)
    module, args = _in_dtype(loaded, DTYPES[dtype])
    opts = plus_tvm.Options.from_pairs(options)
    cm = plus_tvm.compile(module, "llvm", example_args=args, options=opts)
    call_args = [*cm.prepare(*args), *cm._vm()[1]]  # the inputs, then the weights
    use_native()  # the VM resolves the native kernels when it is built
    vm = VirtualMachine(cm.executable, cm.device)
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    started: list[float] = []

    def instrument(func, symbol, before_run, ret, *args):
        del func, ret, args
        if before_run:
            started.append(time.perf_counter())
        else:
            row = totals[str(symbol)]
            row[0] += 1
            row[1] += (time.perf_counter() - started.pop()) * 1000.0
        return 0  # VMInstrumentReturnKind.NO_OP: run the call

    before = native.use_openmp(True) if cm._openmp else None  # as CompiledModel runs it
    try:
        for _ in range(warmup):
            vm["main"](*call_args)
        vm.set_instrument(tvm_ffi.convert(instrument))
        t0 = time.perf_counter()
        for _ in range(runs):
            vm["main"](*call_args)
        wall = (time.perf_counter() - t0) * 1000.0 / runs
    finally:
        if before is not None:
            native.use_openmp(before)
    print(f"instrumented wall time: {wall:.2f} ms per inference")
    whole = sum(ms for _, ms in totals.values()) or 1.0
    rows = [
        {"name": n, "calls": c / runs, "ms": ms / runs, "share": ms / whole}
        for n, (c, ms) in totals.items()
    ]
    return sorted(rows, key=lambda r: -r["ms"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--opt", action="append", default=[], help="KEY=VALUE plus option")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    rows = profile(a.model, a.dtype, a.runs, a.warmup, a.opt)
    total = sum(r["ms"] for r in rows)
    print(f"{a.model} {a.dtype}: {total:.2f} ms profiled per inference, {len(rows)} names")
    print("| name | calls | ms | share |\n|---|---:|---:|---:|")
    for r in rows[: a.top]:
        print(f"| {r['name']} | {r['calls']:.0f} | {r['ms']:.3f} | {100 * r['share']:.1f}% |")


if __name__ == "__main__":
    main()
