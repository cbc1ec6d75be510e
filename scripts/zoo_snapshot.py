#!/usr/bin/env python
"""What the compiler decides for every full-size zoo model, to show a refactor changed nothing.

``snap OUT.json`` records, per model (``--arch``: the architectures of ``plus_tvm.arch_suite``
instead of the zoo, inspected only), ``plus_tvm.inspect`` on llvm and on cuda (sm_90, compile
only): kernels, library calls, matched entries, kernel names, fusion groups, dispatch report,
schedule report; and the compiled model's max abs error against torch eager on the zoo's
example inputs (llvm). ``compare A.json B.json`` prints every field that differs (the
schedule report's ``declined_because``, added later, is left out) and exits 1 when any does.

    .venv/bin/python scripts/zoo_snapshot.py snap /tmp/before.json
    .venv/bin/python scripts/zoo_snapshot.py compare /tmp/before.json /tmp/after.json
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings

FIELDS = ("kernels", "library_calls", "patterns", "ops", "schedule", "kernel_names", "groups")


def snap_arch(out: str, models: list[str]) -> int:
    import plus_tvm
    from plus_tvm import arch_suite

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    result: dict[str, dict] = {}
    for name in models or list(arch_suite.ENTRIES):
        model, inputs = arch_suite.load(name)
        row: dict = {"max_abs_err": None}
        for target in ("llvm", "cuda"):
            stats = plus_tvm.inspect(model, target, example_args=inputs)
            row[target] = {k: stats[k] for k in (*FIELDS, "dispatch") if k in stats}
        result[name] = row
        print(f"{name}: {row['llvm']['kernels']} kernels", flush=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True, default=str)
    return 0


def snap(out: str, models: list[str]) -> int:
    import numpy as np
    import plus_tvm
    import torch
    from plus_tvm import zoo

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    names = models or [n for n in zoo.names() if not n.endswith("-tiny")]
    result: dict[str, dict] = {}
    for name in names:
        row: dict = {}
        for target in ("llvm", "cuda"):
            stats = plus_tvm.inspect(f"zoo:{name}", target)
            row[target] = {k: stats[k] for k in (*FIELDS, "dispatch") if k in stats}
        entry = zoo.get(name)
        model, inputs = entry.build(0), entry.example_inputs(0)
        compiled = plus_tvm.compile(model, example_args=inputs)
        with torch.no_grad():
            ref = model(*inputs)
        ref = ref[0] if isinstance(ref, (tuple, list)) else ref
        got = compiled(*inputs)
        got = np.asarray(got[0] if isinstance(got, (list, tuple)) else got)
        row["max_abs_err"] = float(np.abs(got - np.asarray(ref)).max())
        result[name] = row
        llvm = row["llvm"]
        print(
            f"{name}: {llvm['kernels']} kernels, {llvm['library_calls']} library calls, "
            f"max abs err {row['max_abs_err']:.1e}",
            flush=True,
        )
    with open(out, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True, default=str)
    return 0


def compare(a_path: str, b_path: str) -> int:
    with open(a_path) as f:
        a = json.load(f)
    with open(b_path) as f:
        b = json.load(f)
    differences = 0
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            print(f"{name}: only in {a_path if name in a else b_path}")
            differences += 1
            continue
        for target in ("llvm", "cuda"):
            for field in sorted(set(a[name][target]) | set(b[name][target])):
                va, vb = (_comparable(x[name][target].get(field), field) for x in (a, b))
                if va != vb:
                    print(f"{name} {target} {field}: {str(va)[:160]} | {str(vb)[:160]}")
                    differences += 1
        if a[name]["max_abs_err"] != b[name]["max_abs_err"]:
            print(f"{name} max_abs_err: {a[name]['max_abs_err']} | {b[name]['max_abs_err']}")
            differences += 1
    print(f"{len(a)} models, {differences} differences")
    return 1 if differences else 0


def _comparable(value: object, field: str) -> object:
    if field == "schedule" and isinstance(value, dict):
        return {k: v for k, v in value.items() if k != "declined_because"}
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("snap")
    p.add_argument("out")
    p.add_argument("--models", default="")
    p.add_argument("--arch", action="store_true", help="the arch_suite architectures")
    p = sub.add_parser("compare")
    p.add_argument("a")
    p.add_argument("b")
    args = parser.parse_args()
    if args.cmd == "snap":
        models = [m for m in args.models.split(",") if m]
        return snap_arch(args.out, models) if args.arch else snap(args.out, models)
    return compare(args.a, args.b)


if __name__ == "__main__":
    sys.exit(main())
