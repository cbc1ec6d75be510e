"""Benchmark several zoo models with ``plus-tvm bench`` semantics and print one markdown table.

Usage (after scripts/test or scripts/demo has set up .venv):
    .venv/bin/python scripts/bench_zoo.py --models bert-base,gpt2,vit,resnet50 --out bench-out

Each model runs in its own ``Bench`` (backends interleaved within a model), writes
``<out>/<model>.json`` (the ``plus-tvm bench --json`` schema) and adds a row per backend to the
table: median latency, runs, plus's speedup over it (peer median / plus median), max abs error
against torch eager, kernels and status.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from plus_tvm.bench import BACKENDS, Bench


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="bert-base,gpt2,vit,resnet50")
    parser.add_argument("--compare", default=",".join(BACKENDS))
    parser.add_argument("--target", default="llvm")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--budget", type=float, default=60.0)
    parser.add_argument("--out", default="bench-out")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows = [
        "| model | backend | median ms | runs | plus speedup | max abs err | kernels | status |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        result = Bench(
            f"zoo:{name}",
            args.compare.split(","),
            target=args.target,
            runs=args.runs,
            warmup=args.warmup,
            budget_s=args.budget,
            progress=False,
        ).run()
        with open(os.path.join(args.out, f"{name}.json"), "w") as f:
            json.dump(result, f, indent=1)
        for backend, entry in result["backends"].items():
            speedup = 1.0 if backend == "plus" else result["speedup"].get(backend)
            rows.append(_row(name, backend, entry, speedup))
        print(f"[bench_zoo] {name} done", file=sys.stderr, flush=True)
    table = "\n".join(rows)
    print(table)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table + "\n")
    return 0


def _row(model: str, backend: str, e: dict, speedup: object) -> str:
    def fmt(value: object, spec: str) -> str:
        return format(value, spec) if isinstance(value, (int, float)) else "-"

    cells = [
        model,
        backend,
        fmt(e["median_ms"], ".1f"),
        str(e["runs"]),
        fmt(speedup, ".3f") + ("x" if isinstance(speedup, (int, float)) else ""),
        fmt(e["max_abs_err"], ".1e"),
        str(e.get("kernels", "-")),
        e["status"],
    ]
    return "| " + " | ".join(cells) + " |"


if __name__ == "__main__":
    sys.exit(main())
