"""Benchmark zoo models with ``plus-tvm bench`` semantics and print the README's one table.

Usage (after scripts/test or scripts/demo has set up .venv):
    .venv/bin/python scripts/bench_zoo.py --out bench-out            # all ten zoo models
    .venv/bin/python scripts/bench_zoo.py --models bert-base,gpt2 --compare plus,onnxruntime

Every backend runs in its own process with its own defaults on every core (``plus_tvm.bench``).
The machine's fp32 GEMM ceiling (oneDNN on a prepacked weight and ``F.linear``, best of both, in
a fresh process) is measured before the first model and after the last; a model's "% of GEMM
ceiling" is its matmul / convolution FLOPs over plus's median latency, over the mean of the two
ceilings. Writes ``<out>/<model>.json`` (the ``plus-tvm bench --json`` schema),
``<out>/ceiling.json`` and ``<out>/table.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from plus_tvm.bench import Bench
from plus_tvm.bench.ceiling import measure_in_subprocess

ZOO = "bert-base,albert-base,gpt2,t5-encoder,llama,vit,resnet50,mobilenetv2,efficientnet-b0,vgg16"
PEERS = ("torch", "torch-compile", "onnxruntime")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=ZOO)
    parser.add_argument("--compare", default="plus," + ",".join(PEERS))
    parser.add_argument("--target", default="llvm")
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--budget", type=float, default=30.0)
    parser.add_argument("--out", default="bench-out")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    before = measure_in_subprocess()
    print(f"[bench_zoo] GEMM ceiling before: {before['ceiling_gflops']} GFLOP/s", file=sys.stderr)
    results = []
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
        results.append((name, result))
        print(f"[bench_zoo] {name} done", file=sys.stderr, flush=True)
    after = measure_in_subprocess()
    ceiling = (before["ceiling_gflops"] + after["ceiling_gflops"]) / 2
    with open(os.path.join(args.out, "ceiling.json"), "w") as f:
        json.dump({"before": before, "after": after}, f, indent=1)
    rows = _table(results, ceiling)
    env = results[0][1]["environment"] if results else {}
    rows.append("")
    rows.append(
        f"CPUs {env.get('affinity')}; GEMM ceiling {before['ceiling_gflops']} GFLOP/s before, "
        f"{after['ceiling_gflops']} after (torch threads {before['torch_threads']})"
    )
    invalid = [f"{n}: {p}" for n, r in results for p in r["invalid"]]
    rows += [f"INVALID {p}" for p in invalid]
    table = "\n".join(rows)
    print(table)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table + "\n")
    return 3 if invalid else 0


def _num(value: object, spec: str, suffix: str = "") -> str:
    return format(value, spec) + suffix if isinstance(value, (int, float)) else "-"


def _table(results: list[tuple[str, dict]], ceiling: float) -> list[str]:
    head = [
        "model",
        "plus ms",
        "torch ms",
        "torch.compile ms",
        "ORT ms",
        "vs torch",
        "vs torch.compile",
        "vs ORT",
        "GFLOP",
        "% GEMM ceiling",
        "plus MB (model)",
        "ORT MB (model)",
        "kernels",
        "max abs err",
    ]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in results:
        b, sp = r["backends"], r["speedup"]
        plus = b["plus"]
        flops = r["stats"].get("gemm_flops") or 0
        pct = (
            100 * flops / (plus["median_ms"] / 1e3) / (ceiling * 1e9)
            if plus["median_ms"] and flops
            else None
        )

        def ms(key: str, b: dict = b) -> str:
            e = b.get(key)
            if e is None:
                return "-"
            return _num(e["median_ms"], ".2f") if e["median_ms"] else e["status"][:40]

        def mem(key: str, b: dict = b) -> str:
            e = b.get(key, {})
            peak, model = e.get("peak_rss_mb"), e.get("peak_above_libraries_mb")
            return f"{_num(peak, '.0f')} ({_num(model, '.0f')})"

        cells = [
            name,
            ms("plus"),
            ms("torch"),
            ms("torch-compile"),
            ms("onnxruntime"),
            _num(sp.get("torch"), ".2f", "x"),
            _num(sp.get("torch-compile"), ".2f", "x"),
            _num(sp.get("onnxruntime"), ".2f", "x"),
            _num(flops / 1e9, ".2f"),
            _num(pct, ".0f", "%"),
            mem("plus"),
            mem("onnxruntime"),
            str(plus.get("kernels", "-")),
            _num(plus["max_abs_err"], ".1e"),
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


if __name__ == "__main__":
    sys.exit(main())
