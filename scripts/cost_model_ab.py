#!/usr/bin/env python
"""The learned cost model against the analytic constants on every full-size zoo model.

For each model: the library-vs-TIR decisions and kernels of option set A (default
``cost_model=analytic``) and B (default ``cost_model=learned``; ``--b fusion_cost=learned``
compares fusion plans priced by the model with eq. 8, ``--b gir_cost=learned`` GIR plans ranked
by it) from ``plus_tvm.inspect``, no code generated. A model whose decisions, kernels and plans
are the same compiles to the same code (stated, not timed). A model where something changed is
compiled both ways, exported, and each library timed in fresh processes, alternated A B A B
(median of ``--runs`` after 3 warm-up runs each), with both outputs checked against torch eager.

    .venv/bin/python scripts/cost_model_ab.py --model-file /tmp/cm.json --out /tmp/ab.json
    .venv/bin/python scripts/cost_model_ab.py --a "" --b fusion_cost=learned
    .venv/bin/python scripts/cost_model_ab.py --a cpu_parallel=tvm --b cpu_parallel=openmp \\
        --time-all
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import warnings
from collections import Counter

_TIMER = r"""
import json, sys, time, numpy as np, plus_tvm
from plus_tvm import zoo
path, name, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
model = plus_tvm.load(path)
entry = zoo.get(name)
inputs = entry.example_inputs(0)
prepared = model.prepare(*inputs)
for _ in range(3):
    model.run_prepared(prepared)
times = []
for _ in range(runs):
    t = time.perf_counter()
    model.run_prepared(prepared)
    times.append(time.perf_counter() - t)
import torch
with torch.no_grad():
    ref = entry.build(0)(*inputs)
ref = ref[0] if isinstance(ref, (tuple, list)) else ref
out = model(*inputs)
out = out[0] if isinstance(out, (tuple, list)) else out
err = float(np.abs(np.asarray(out) - ref.numpy()).max())
print(json.dumps({"ms": float(np.median(times)) * 1e3, "err": err}))
"""


def choices(stats: dict) -> Counter:
    return Counter(
        (d["entry"], d["kernel"], d["chosen"])
        for d in (stats.get("dispatch") or {}).get("decisions", [])
    )


def plan_changes(stats: dict) -> list[str]:
    """The kernels whose GIR plan a ranker chose differently from the performance model's best
    (``schedule.notes``; the notes list the plans in the performance model's order)."""
    notes = (stats.get("schedule") or {}).get("notes") or {}
    return sorted(
        f"{kernel}: GIR plan {n['plans'][0]['params']} -> {n['gir_plan']}"
        for kernel, n in notes.items()
        if n["gir_plan"] != n["plans"][0]["params"]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-file", help="learned model (default: this machine's / shipped)")
    parser.add_argument("--models", help="comma-separated zoo models (default: all ten)")
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", help="write the results as JSON")
    parser.add_argument(
        "--time-all",
        action="store_true",
        help="time every model, also where A and B compile the same decisions (options that "
        "change how the code runs, such as cpu_parallel)",
    )
    parser.add_argument("--a", default="cost_model=analytic", help="option set A (k=v,k=v)")
    parser.add_argument("--b", default="cost_model=learned", help="option set B (k=v,k=v)")
    args = parser.parse_args()

    import plus_tvm
    from plus_tvm import Options, zoo

    warnings.filterwarnings("ignore")
    names = (
        args.models.split(",")
        if args.models
        else [n for n in zoo.names() if not n.endswith("-tiny")]
    )

    def options(pairs: str) -> Options:
        base = Options(cost_model_file=args.model_file)
        return Options.from_pairs([p for p in pairs.split(",") if p], base)

    # the keys keep their historical names: A is "analytic", B is "learned"
    variants = {"analytic": options(args.a), "learned": options(args.b)}
    results = {}
    folder = tempfile.mkdtemp(prefix="cost-ab-")
    for name in names:
        stats = {v: plus_tvm.inspect(f"zoo:{name}", "llvm", o) for v, o in variants.items()}
        a, b = choices(stats["analytic"]), choices(stats["learned"])
        row = {
            "library_calls": {v: s["library_calls"] for v, s in stats.items()},
            "kernels": {v: s["kernels"] for v, s in stats.items()},
            "changed": sorted(
                f"{e} -> {k}: {c} x{n}" for (e, k, c), n in ((a - b) + (b - a)).items()
            )
            + plan_changes(stats["analytic"])
            + plan_changes(stats["learned"]),
        }
        same = (
            a == b
            and stats["analytic"]["kernel_names"] == stats["learned"]["kernel_names"]
            and not row["changed"]
        )
        if not same or args.time_all:
            paths = {}
            for v, o in variants.items():
                paths[v] = os.path.join(folder, f"{name}-{v}.so")
                plus_tvm.compile(f"zoo:{name}", "llvm", options=o).export_library(paths[v])
            times: dict[str, list] = {v: [] for v in variants}
            errs = {}
            for _ in range(args.rounds):
                for v in variants:
                    out = (
                        subprocess.run(
                            [sys.executable, "-c", _TIMER, paths[v], name, str(args.runs)],
                            capture_output=True,
                            text=True,
                            check=True,
                        )
                        .stdout.strip()
                        .splitlines()[-1]
                    )
                    got = json.loads(out)
                    times[v].append(round(got["ms"], 3))
                    errs[v] = got["err"]
            row["ms"] = times
            row["max_abs_err"] = errs
            best = {v: min(t) for v, t in times.items()}
            row["analytic_over_learned"] = round(best["analytic"] / best["learned"], 3)
        results[name] = row
        print(
            f"{name}: library calls {row['library_calls']['analytic']} -> "
            f"{row['library_calls']['learned']}, "
            + (
                "same decisions"
                if "ms" not in row
                else f"changed {row['changed']}; ms {row['ms']}; "
                f"analytic/learned {row['analytic_over_learned']}x; err {row['max_abs_err']}"
            ),
            flush=True,
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
