"""The main job (``scripts/demo``): compile a zoo model with plus, run it, compare with torch.

Prints one table: operators, kernels and fusion ratio under plus and under TVM's default pipeline
for the target, latency of plus and torch eager measured side by side (interleaved), their
ratio, and the max abs error of plus against torch eager.
"""

from __future__ import annotations

import argparse
import sys
import time

from . import interrupt
from .bench import Bench
from .compiler import inspect
from .errors import PlusError
from .quiet import quiet


def _latency(backend: dict) -> str:
    if backend.get("median_ms") is None:
        return str(backend.get("status"))
    return f"{backend['median_ms']:.1f} ({backend['runs']} runs)"


def _speedup(result: dict, peer: str) -> str:
    value = result["speedup"].get(peer)
    return f"{value:.3f}x" if isinstance(value, (int, float)) else str(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/demo", description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="zoo:bert-base")
    parser.add_argument("--target", default="llvm")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per backend")
    parser.add_argument(
        "--budget", type=float, default=30.0, help="seconds of runs per backend (slow: fewer runs)"
    )
    parser.add_argument(
        "--verbose", action="store_true", help="show TVM's log warnings and Python warnings"
    )
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        with interrupt.guard(), quiet(enabled=not args.verbose):
            tvm_stats = inspect(args.model, args.target, pipeline="tvm")
            result = Bench(
                args.model,
                ["plus", "torch", "onnxruntime"],
                target=args.target,
                runs=args.runs,
                warmup=2,  # library weights are prepacked on their second call
                budget_s=args.budget,
                log=lambda msg: print(msg, flush=True),
            ).run()
    except PlusError as err:
        print(f"demo: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("demo: interrupted", file=sys.stderr)
        return 130
    plus, torch_ = result["backends"]["plus"], result["backends"]["torch"]
    ort = result["backends"]["onnxruntime"]
    stats = result["stats"]
    rows = [
        ("model", result["model"]),
        ("target", result["target"]),
        ("ops (Relax op calls after import)", stats["ops"]),
        ("kernels, plus pipeline", stats["kernels"]),
        ("kernels, TVM default pipeline", tvm_stats["kernels"]),
        ("fusion ratio, plus", f"{stats['fusion_ratio']:.2f}"),
        ("fusion ratio, TVM default", f"{tvm_stats['fusion_ratio']:.2f}"),
        ("plus latency (median ms)", f"{plus['median_ms']:.1f} ({plus['runs']} runs)"),
        ("torch eager latency (median ms)", f"{torch_['median_ms']:.1f} ({torch_['runs']} runs)"),
        ("plus speedup over torch eager", f"{result['speedup']['torch']:.3f}x"),
        ("onnxruntime latency (median ms)", _latency(ort)),
        ("plus speedup over onnxruntime", _speedup(result, "onnxruntime")),
        ("library calls (PluS dispatch)", stats["library_calls"]),
        ("warehouse entries matched", ", ".join(f"{k} x{v}" for k, v in stats["patterns"].items())),
        ("plus kernels / TVM default kernels", f"{stats['kernels'] / tvm_stats['kernels']:.2f}"),
        ("max abs error vs torch eager", f"{plus['max_abs_err']:.2e}"),
        ("compile time plus (s)", f"{stats['compile_s']:.1f}"),
    ]
    width = max(len(k) for k, _ in rows)
    print()
    print("\n".join(f"{k:<{width}}  {v}" for k, v in rows))
    print(f"\ndemo finished in {time.perf_counter() - start:.0f} s")
    ok = plus["max_abs_err"] is not None and plus["max_abs_err"] < 1e-2
    if not ok:
        print("demo: plus output does not match torch eager", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
