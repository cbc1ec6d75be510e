"""Figure 6 of paper 004 on the zoo: kernels per model for each rules x search combination.

Usage: .venv/bin/python scripts/fusion_ablation.py [--models a,b] [--json F]

Columns: tvm/greedy (TVM's FuseOps, i.e. ``--opt fusion=tvm``), tvm/dp (TVM's op-pattern rules
in ``DPFuseOps``' search), mapping/greedy and mapping/dp (``DPFuseOps`` with table 1's rules and
``fusion_search`` greedy or dp), the fusion ratio (ops / kernels) of each, the
dp/tvm ratio, and the plan-search time of DPFuseOps (phase 3 only, measured by a pass
instrument).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import plus_tvm
import tvm
from plus_tvm import zoo

MODELS = (
    "bert-base,albert-base,gpt2,t5-encoder,vit,resnet50,mobilenetv2,efficientnet-b0,vgg16,llama"
)
# Fusion alone (paper 004's ablation): library dispatch off, so every operator is a TIR kernel
_BASE = plus_tvm.Options(dispatch=False)
CONFIGS = {
    "tvm/greedy": _BASE.replace(fusion="tvm"),
    "mapping/greedy": _BASE.replace(fusion="dp", fusion_search="greedy"),
    "tvm/dp": _BASE.replace(fusion="dp", fusion_search="dp", fusion_rules="tvm"),
    "mapping/dp": _BASE.replace(fusion="dp", fusion_search="dp"),
}


@tvm.instrument.pass_instrument
class _Timer:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._start: dict[str, float] = {}

    def run_before_pass(self, mod, info) -> None:
        self._start[info.name] = time.perf_counter()

    def run_after_pass(self, mod, info) -> None:
        if info.name in self._start:
            elapsed = time.perf_counter() - self._start.pop(info.name)
            self.seconds[info.name] = self.seconds.get(info.name, 0.0) + elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=MODELS)
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = []
    print(
        "| model | ops | tvm/greedy | tvm/dp | mapping/greedy | mapping/dp | ratio tvm | "
        "ratio dp | dp/tvm | search s |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in args.models.split(","):
        loaded = plus_tvm.loader.load_model(f"zoo:{zoo.get(name).name}")
        row = {"model": name}
        for label, opts in CONFIGS.items():
            timer = _Timer()
            with tvm.transform.PassContext(instruments=[timer]):
                stats = plus_tvm.inspect(loaded, options=opts)
            row["ops"] = stats["ops"]
            row[label] = stats["kernels"]
            if label == "mapping/dp":
                row["search_s"] = round(timer.seconds.get("DPFuseOps", 0.0), 2)
        row["ratio_tvm"] = row["ops"] / row["tvm/greedy"]
        row["ratio_dp"] = row["ops"] / row["mapping/dp"]
        row["dp_over_tvm"] = row["ratio_dp"] / row["ratio_tvm"]
        rows.append(row)
        print(
            f"| {name} | {row['ops']} | {row['tvm/greedy']} | {row['tvm/dp']} | "
            f"{row['mapping/greedy']} | "
            f"{row['mapping/dp']} | {row['ratio_tvm']:.2f} | {row['ratio_dp']:.2f} | "
            f"{row['dp_over_tvm']:.2f}x | {row['search_s']} |",
            flush=True,
        )
    mean = sum(r["dp_over_tvm"] for r in rows) / len(rows)
    print(
        f"\nmean fusion-ratio gain dp over tvm: {mean:.2f}x; "
        f"min {min(r['dp_over_tvm'] for r in rows):.2f}x"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
