"""The machine's fp32 GEMM ceiling, measured in a fresh process with torch's defaults.

Run as a script (``python ceiling.py``; prints one JSON object) so that nothing else in the
process has touched the thread pools. Two libraries at transformer shapes (M = 128 rows):
oneDNN on a weight prepacked once (``mkldnn._linear_pointwise``, what plus's library kernels
run) and ``F.linear`` (MKL or OpenBLAS, what torch eager runs). The ceiling is the best median
GFLOP/s over the shapes and libraries.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

SHAPES = ((128, 768, 3072), (128, 3072, 768), (128, 768, 2304), (512, 1024, 4096))


def _median_s(fn, runs: int = 20) -> float:
    # (plus_tvm.runtime.perf.time_us does the same, but importing plus_tvm here would bring
    # TVM and its thread policy into a process meant to hold torch alone)
    for _ in range(5):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure() -> dict:
    import torch

    torch.manual_seed(0)
    rows = []
    with torch.inference_mode():
        for m, k, n in SHAPES:
            x, w, b = torch.randn(m, k), torch.randn(n, k), torch.randn(n)
            packed = torch.ops.mkldnn._reorder_linear_weight(w, m)
            flops = 2.0 * m * k * n
            onednn = _median_s(
                lambda x=x, p=packed, b=b: torch.ops.mkldnn._linear_pointwise(
                    x, p, b, "none", [], ""
                )
            )
            blas = _median_s(lambda x=x, w=w, b=b: torch.nn.functional.linear(x, w, b))
            rows.append(
                {
                    "shape": [m, k, n],
                    "onednn_prepacked_gflops": round(flops / onednn / 1e9, 1),
                    "f_linear_gflops": round(flops / blas / 1e9, 1),
                }
            )
    best = max(max(r["onednn_prepacked_gflops"], r["f_linear_gflops"]) for r in rows)
    return {"ceiling_gflops": best, "torch_threads": torch.get_num_threads(), "shapes": rows}


def measure_in_subprocess() -> dict:
    """:func:`measure` in a fresh interpreter (torch's defaults, every core)."""
    import os
    import subprocess

    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    print(json.dumps(measure()))
