#!/usr/bin/env python
"""Time exported plus models under TVM thread-pool settings, each in a fresh process.

    .venv/bin/python scripts/thread_policy.py /tmp/m/bert-base.so /tmp/m/mobilenetv2.so

A model is ``plus-tvm compile zoo:NAME -o NAME.so``. Each configuration (environment variables
set before ``import plus_tvm``; torch keeps its defaults) runs the model 3 times untimed and
``--runs`` times timed in its own interpreter; configurations alternate for ``--rounds`` rounds
(A B A B: a drift of the machine hits both), and the median of the rounds' medians and the
minimum are printed. This is the measurement behind ``plus_tvm.threads``'s defaults.
``--spin`` adds TVM's own spinning pool (the setting the defaults replaced).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CONFIGS = (
    {"TVM_NUM_THREADS": "1"},
    {"TVM_NUM_THREADS": "2", "TVM_THREAD_POOL_SPIN_COUNT": "0"},
)
SPINNING = {"TVM_NUM_THREADS": "2", "TVM_THREAD_POOL_SPIN_COUNT": "300000"}

_CHILD = r"""
import json, statistics, sys, time
import numpy as np, plus_tvm, torch
cm = plus_tvm.load(sys.argv[1])
rng = np.random.default_rng(0)
ins = []
for s in cm.inputs:
    shape = [int(d) for d in s.shape]
    if "int" in s.dtype:
        ins.append(rng.integers(0, 100, shape).astype(s.dtype))
    else:
        ins.append(rng.standard_normal(shape).astype(s.dtype))
p = cm.prepare(*ins)
for _ in range(3):
    cm.run_prepared(p)
ts = []
for _ in range(int(sys.argv[2])):
    t = time.perf_counter()
    cm.run_prepared(p)
    ts.append((time.perf_counter() - t) * 1e3)
r = {"median": statistics.median(ts), "min": min(ts), "torch": torch.get_num_threads()}
print(json.dumps(r))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--runs", type=int, default=25)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--spin", action="store_true")
    args = parser.parse_args()
    configs = CONFIGS + ((SPINNING,) if args.spin else ())
    for model in args.models:
        results: list[list[dict]] = [[] for _ in configs]
        for _ in range(args.rounds):
            for i, cfg in enumerate(configs):
                env = {**os.environ, **cfg}
                out = subprocess.run(
                    [sys.executable, "-c", _CHILD, model, str(args.runs)],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                results[i].append(json.loads(out.stdout.strip().splitlines()[-1]))
        for cfg, rs in zip(configs, results):
            label = " ".join(f"{k}={v}" for k, v in cfg.items())
            median = statistics.median(r["median"] for r in rs)
            best = min(r["min"] for r in rs)
            print(
                f"{os.path.basename(model):<18} {label:<58} median {median:8.2f} ms  "
                f"min {best:8.2f} ms  (torch threads {rs[0]['torch']})",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
