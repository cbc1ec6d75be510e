"""``python -m plus_tvm.conformance``: run ONNX's node tests under plus and TVM, classify, report.

Exit code 0 when no test fails under plus that passes under TVM, 1 otherwise (with
``--no-strict``: always 0 once the run completes), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import fnmatch
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/conformance",
        description="ONNX backend node tests through the plus pipeline and TVM's own pipeline",
    )
    parser.add_argument(
        "--subset",
        choices=("all", "ci", "half"),
        default="all",
        help="all runnable tests, the CI subset (the first test of every operator), or the "
        "tests with float16 / bfloat16 data",
    )
    parser.add_argument("-k", dest="pattern", help="only tests whose name matches this glob")
    parser.add_argument("--pipelines", default="plus,tvm", help="plus, tvm or plus,tvm")
    parser.add_argument("--jobs", type=int, default=None, help="worker processes (default: cores)")
    parser.add_argument(
        "--timeout", type=float, default=120.0, help="seconds per test and pipeline"
    )
    parser.add_argument("--json", dest="json_path", help="write the full report here")
    parser.add_argument("--refresh", action="store_true", help="regenerate the cached tests")
    parser.add_argument(
        "--no-strict", action="store_true", help="exit 0 despite plus-only failures"
    )
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    pipelines = [p.strip() for p in args.pipelines.split(",") if p.strip()]
    if not pipelines or any(p not in ("plus", "tvm") for p in pipelines):
        parser.error(f"--pipelines must name plus and/or tvm, got {args.pipelines!r}")
    if args.jobs is not None and args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if args.timeout <= 0:
        parser.error("--timeout must be positive")

    from .cases import first_of_each_operator, half_precision, load_cases
    from .runner import run, summary, write_json

    cases = load_cases(refresh=args.refresh)
    if args.subset == "ci":
        cases = first_of_each_operator(cases)
    elif args.subset == "half":
        cases = half_precision(cases)
    if args.pattern:
        cases = [c for c in cases if fnmatch.fnmatch(c.name, args.pattern)]
    if not cases:
        parser.error("no test matches")
    bar = None
    if not args.no_progress and sys.stderr.isatty():  # (a pipe or a log gets no bar)
        from tqdm import tqdm

        bar = tqdm(total=len(cases) * len(pipelines), unit="run", file=sys.stderr)
    report = run(
        cases,
        pipelines,
        jobs=args.jobs,
        timeout_s=args.timeout,
        progress=(lambda done, total: bar.update(1)) if bar else None,
    )
    if bar:
        bar.close()
    print(summary(report))
    if args.json_path:
        write_json(report, args.json_path)
        print(f"wrote {args.json_path}")
    plus_only = report.counts().get("plus_only_fail", 0)
    return 1 if plus_only and not args.no_strict else 0


if __name__ == "__main__":
    sys.exit(main())
