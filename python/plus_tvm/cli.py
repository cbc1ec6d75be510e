"""The ``plus-tvm`` command line (tvmc-style).

``plus-tvm compile|run|inspect|bench MODEL``, ``plus-tvm zoo list|export`` and
``plus-tvm warehouse list|show NAME|validate [DIR ...]``; MODEL is
``path.onnx``, ``zoo:NAME`` or ``python:MODULE:ATTR`` (``run`` also takes a library written by
``compile``).
Every command takes ``--target`` (a name or a JSON dict) and ``--opt KEY=VALUE`` for any
``Options`` field. Exit codes: 0 success, 2 bad input (one clear line; ``--debug`` shows the
traceback), 3 ``run``'s check against the reference failed, 130 interrupted (Ctrl-C), 141 the
reader of the output went away (``| head``: quietly), 1 an internal error (a bug: please
report it). TVM's warnings and Python's FutureWarnings are only
shown with ``--verbose``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import zipfile
from collections.abc import Sequence

from .lm.cli_generate import add_generate_parser, cmd_generate

EXIT_USER_ERROR = 2
EXIT_INTERNAL_ERROR = 1
EXIT_CHECK_FAILED = 3
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as a shell reports a tool whose reader closed the pipe


def _common(p: argparse.ArgumentParser, pipeline: bool = True) -> None:
    p.add_argument("model", help="path.onnx, zoo:NAME or python:MODULE:ATTR")
    p.add_argument("--target", default="llvm", help="llvm, cuda or a JSON target dict")
    if pipeline:
        p.add_argument("--pipeline", choices=("plus", "tvm"), default="plus")
    p.add_argument(
        "--opt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set an Options field (repeatable), e.g. --opt fusion=tvm",
    )


def _finite(text: str, low: float, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < low:
        raise argparse.ArgumentTypeError(f"{text!r}: {what}")
    return value


def _tolerance(text: str) -> float:
    """A check tolerance: finite and >= 0 (``nan`` once turned the check off)."""
    return _finite(text, 0.0, "a tolerance is a finite number >= 0")


def _seconds(text: str) -> float:
    value = _finite(text, 0.0, "a finite number > 0")
    if value == 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a finite number > 0")
    return value


def _count(low: int):  # noqa: ANN202
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{text!r}: a whole number >= {low}")
        return value

    return parse


class UsageError(Exception):
    """A command line argparse refuses (reported as one line, exit code 2)."""


class _Parser(argparse.ArgumentParser):
    """argparse, with a bad command line raised as :class:`UsageError` (one line, exit 2, as
    every other bad input) instead of printing the usage and exiting from inside main."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


def _global_flags(parser: argparse.ArgumentParser, on_subcommand: bool = False) -> None:
    """``--debug`` and ``--verbose``, before the subcommand or after it."""
    # (on a subcommand the default is SUPPRESS, so that leaving it out there keeps the value
    # given before the subcommand)
    default = argparse.SUPPRESS if on_subcommand else False
    parser.add_argument(
        "--debug", action="store_true", default=default, help="show Python tracebacks on errors"
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        default=default,
        help="show TVM's log warnings and Python warnings",
    )


class _SubParser(_Parser):
    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        _global_flags(self, on_subcommand=True)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``plus-tvm``."""
    parser = _Parser(prog="plus-tvm", description="plus_tvm: TVM Relax with pluggable schedules")
    _global_flags(parser)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_SubParser)

    p = sub.add_parser("compile", help="compile a model to a shared library")
    _common(p)
    p.add_argument("-o", "--output", required=True, help="library path (.so)")
    p.add_argument("--json", action="store_true", help="print the stats as JSON")

    p = sub.add_parser(
        "run", help="compile (or load) and run a model, check it against a reference"
    )
    _common(p)
    p.add_argument(
        "--inputs",
        help=".npz of inputs (by input name or order); default: the "
        "model's example inputs or random ones",
    )
    p.add_argument("--output", help="write outputs to this .npz")
    p.add_argument("--no-check", action="store_true", help="skip the reference comparison")
    p.add_argument(
        "--rtol", type=_tolerance, default=1e-3, help="relative tolerance of the check (1e-3)"
    )
    p.add_argument(
        "--atol", type=_tolerance, default=1e-3, help="absolute tolerance of the check (1e-3)"
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")

    p = sub.add_parser("inspect", help="fusion and dispatch statistics without code generation")
    _common(p)
    p.add_argument("--json", action="store_true", help="print the stats contract as JSON")

    p = sub.add_parser("bench", help="benchmark against TVM, torch, torch.compile, onnxruntime")
    _common(p, pipeline=False)
    p.add_argument(
        "--compare",
        default="plus,tvm,torch,torch-compile,onnxruntime",
        help="comma-separated backends",
    )
    p.add_argument("--runs", type=_count(1), default=20, help="timed runs per backend")
    p.add_argument("--warmup", type=_count(0), default=2, help="untimed runs per backend first")
    p.add_argument(
        "--budget",
        type=_seconds,
        default=60.0,
        help="seconds per backend for its runs (slow backends get fewer runs)",
    )
    p.add_argument(
        "--seq-lengths",
        type=_lengths,
        help="comma-separated sequence lengths (a text model): plus compiled once with a "
        "symbolic sequence length, every backend timed at each length",
    )
    p.add_argument(
        "--dtype",
        choices=("fp32", "bf16", "fp16"),
        default="fp32",
        help="run every backend with the model in this precision (model.to(dtype))",
    )
    p.add_argument("--json", dest="json_path", help="write the result JSON to this file")
    p.add_argument("--plot", help="write a PNG bar chart to this file")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")

    p = sub.add_parser(
        "calibrate",
        help="time this machine's kernels and train the learned cost model (cost_model=learned)",
    )
    p.add_argument("--target", default="llvm", help="target (default llvm: this CPU)")
    p.add_argument(
        "-o",
        "--output",
        help="model file to write (default: this machine's file in the user's cache, the one "
        "cost_model=learned reads)",
    )
    p.add_argument(
        "--quick", action="store_true", help="a few programs only (a smoke test, not a model)"
    )
    p.add_argument(
        "--zoo",
        default=None,
        help="comma-separated zoo models whose tiny twins (and full sizes, unless --quick or "
        "--tiny-zoo) join the corpus (default: all ten; 'none' for none)",
    )
    p.add_argument(
        "--tiny-zoo",
        action="store_true",
        help="only the zoo models' tiny twins, not their full sizes (faster)",
    )
    p.add_argument("--seed", type=_count(0), default=0, help="draws the corpus' programs")
    p.add_argument(
        "--min-ms", type=_seconds, default=20.0, help="milliseconds of runs per library timing"
    )
    p.add_argument("--records", help="also write the measurements (JSON) to this file")
    p.add_argument("--json", action="store_true", help="print the model's summary as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")

    p = sub.add_parser("zoo", help="the model zoo")
    zsub = p.add_subparsers(dest="zoo_command", required=True, parser_class=_SubParser)
    zl = zsub.add_parser("list", help="list zoo models")
    zl.add_argument("--json", action="store_true")
    ze = zsub.add_parser("export", help="write a zoo model as an ONNX file")
    ze.add_argument("name", help="zoo model name (with or without zoo:)")
    ze.add_argument("-o", "--output", required=True, help="ONNX file to write")
    ze.add_argument("--dynamic-batch", action="store_true", help="make the batch dim symbolic")

    p = sub.add_parser("warehouse", help="the pattern warehouse (PluS): +Graph entries")
    wsub = p.add_subparsers(dest="warehouse_command", required=True, parser_class=_SubParser)
    wl = wsub.add_parser("list", help="list entries in priority order")
    wl.add_argument("--json", action="store_true")
    ws = wsub.add_parser("show", help="show one entry: fields and canonical +Graph")
    ws.add_argument("name", help="entry name")
    ws.add_argument("--json", action="store_true")
    wv = wsub.add_parser(
        "validate", help="load the shipped entries plus DIRs, report the first error"
    )
    wv.add_argument("dirs", nargs="*", metavar="DIR", help="more entry folders")
    for q in (wl, ws, wv):
        q.add_argument(
            "--opt", action="append", default=[], metavar="KEY=VALUE", help="set an Options field"
        )
    add_generate_parser(sub)  # plus_tvm/lm/cli_generate.py
    return parser


def _options(pairs: Sequence[str]):
    from .options import Options

    return Options.from_pairs(pairs)


def _cmd_compile(args: argparse.Namespace) -> int:
    import plus_tvm

    from .output_files import check_target

    for name in (args.output, args.output + ".params", args.output + ".json"):
        check_target(name)  # before compiling, not after
    cm = plus_tvm.compile(
        args.model, args.target, options=_options(args.opt), pipeline=args.pipeline
    )
    cm.export_library(args.output)
    if args.json:
        print(json.dumps(_public_stats(cm.stats), indent=1))
    else:
        from .report import stats_text

        print(stats_text(cm.stats))
        print(f"wrote {args.output} (+ .params, .json)")
    return 0


def _load_inputs(path: str, specs: list) -> tuple:
    import numpy as np

    from .errors import ModelLoadError

    if not os.path.exists(path):
        raise ModelLoadError(f"inputs file not found: {path}")
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:  # not an .npz / .npy
        raise ModelLoadError(f"cannot read inputs file {path}: {err}") from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise ModelLoadError(
            f"{path} holds one array (.npy); --inputs takes an .npz archive of the inputs by "
            "name (numpy.savez(path, name=array, ...))"
        )
    names = [s.name for s in specs]
    keys = names if all(n in data.files for n in names) else list(data.files)
    if len(keys) != len(specs):
        raise ModelLoadError(f"{path} holds {data.files}; the model takes {names}")
    try:
        return tuple(data[k] for k in keys)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:  # damaged, object arrays
        raise ModelLoadError(f"cannot read inputs file {path}: {err}") from None


def _cmd_run(args: argparse.Namespace) -> int:
    import numpy as np

    import plus_tvm

    from .loader import random_inputs

    is_library = args.model.endswith(".so") and os.path.exists(args.model + ".json")
    if is_library:
        cm = plus_tvm.load(args.model)
    else:
        cm = plus_tvm.compile(
            args.model, args.target, options=_options(args.opt), pipeline=args.pipeline
        )
    source = cm.source
    if args.inputs:
        inputs = _load_inputs(args.inputs, cm.inputs)
    elif source is not None and source.example_inputs is not None:
        inputs = tuple(
            np.asarray(x.detach().numpy() if hasattr(x, "detach") else x)
            for x in source.example_inputs
        )
    else:
        inputs = random_inputs(cm.inputs)
    named = cm.run_named(*inputs)  # the outputs flat, by the model's names (ONNX: its own)
    outs = tuple(named.values())
    result: dict[str, object] = {
        "model": cm.stats.get("model"),
        "outputs": [
            {
                "shape": list(o.shape),
                "dtype": str(o.dtype),
                "mean": float(np.mean(o)),
                "std": float(np.std(o)),
            }
            for o in outs
        ],
    }
    check = None
    if not args.no_check and source is not None:
        ref_name, ref = _reference(source, inputs)
        if ref is not None:
            refs = ref if isinstance(ref, tuple) else (ref,)
            check = compare_outputs(outs, refs, args.rtol, args.atol)
            result["reference"] = ref_name
            result.update(check)
    if args.output:
        _write(args.output, lambda f: np.savez(f, **named))
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for name, o in zip(named, result["outputs"]):
            print(
                f"{name}: shape {tuple(o['shape'])} {o['dtype']} mean {o['mean']:.4g} "
                f"std {o['std']:.4g}"
            )
        if check is not None:
            print(f"max abs error vs {result['reference']}: {result['max_abs_err']:.3e}")
    if check is not None and not check["ok"]:
        print(f"plus-tvm: check failed: {check['why']}", file=sys.stderr)
        return EXIT_CHECK_FAILED
    return 0


def compare_outputs(outs: Sequence, refs: Sequence, rtol: float, atol: float) -> dict:
    """Compare outputs with a reference as ``np.allclose`` would, NaN equal only to NaN.

    Returns ``{"ok", "max_abs_err", "why"}``; ``max_abs_err`` is over positions where both are
    numbers, and NaN (or an infinity) where the two disagree on being NaN / infinite.
    """
    import numpy as np

    if len(outs) != len(refs):
        return {
            "ok": False,
            "max_abs_err": float("nan"),
            "why": f"{len(outs)} outputs, the reference has {len(refs)}",
        }
    worst = 0.0
    for k, (o, r) in enumerate(zip(outs, refs)):
        o, r = np.asarray(o), np.asarray(r)
        if o.shape != r.shape:
            return {
                "ok": False,
                "max_abs_err": float("nan"),
                "why": f"output {k} has shape {o.shape}, the reference {r.shape}",
            }
        o64, r64 = o.astype(np.float64), r.astype(np.float64)
        nan_o, nan_r = np.isnan(o64), np.isnan(r64)
        if np.any(nan_o != nan_r):
            where = tuple(int(i) for i in np.argwhere(nan_o != nan_r)[0])
            return {
                "ok": False,
                "max_abs_err": float("nan"),
                "why": f"output {k} at {where} is {o64[where]} where the reference is "
                f"{r64[where]} (NaN mismatch)",
            }
        inf_o, inf_r = np.isinf(o64), np.isinf(r64)
        if not np.array_equal(np.where(inf_o, o64, 0), np.where(inf_r, r64, 0)):
            return {
                "ok": False,
                "max_abs_err": float("inf"),
                "why": f"output {k} differs from the reference in its infinities",
            }
        finite = ~nan_o & ~inf_o
        if np.any(finite):
            diff = np.abs(o64[finite] - r64[finite])
            worst = max(worst, float(diff.max()))
            bad = diff > atol + rtol * np.abs(r64[finite])
            if np.any(bad):
                return {
                    "ok": False,
                    "max_abs_err": worst,
                    "why": f"output {k}: {int(bad.sum())} of {diff.size} values differ by "
                    f"more than atol {atol:g} + rtol {rtol:g} x |reference| "
                    f"(max abs error {float(diff.max()):.3e})",
                }
    return {"ok": True, "max_abs_err": worst, "why": ""}


def _write(path: str, write) -> None:  # noqa: ANN001
    """``write(file)`` into a binary file that replaces ``path`` whole (exactly that path, never
    through a link); an unwritable path is a user error naming the path."""
    from .output_files import replace_atomically

    def to_file(tmp: str) -> None:
        with open(tmp, "wb") as f:
            write(f)

    replace_atomically(path, to_file)


def _write_to(path: str, write) -> None:  # noqa: ANN001
    """``write(tmp_path)`` (a writer that takes a path of the same extension), then that file
    replaces ``path`` whole, as :func:`_write`."""
    from .output_files import replace_atomically

    replace_atomically(path, write)


def _reference(source, inputs) -> tuple[str, object]:
    """Run the source model in torch eager or onnxruntime on the same inputs."""
    import numpy as np

    if source.torch_module is not None:
        import torch

        with torch.inference_mode():
            out = source.torch_module(*[torch.from_numpy(np.asarray(x, order="C")) for x in inputs])
        if isinstance(out, (tuple, list)):
            return "torch", tuple(o.numpy() for o in out)
        return "torch", out.numpy()
    if source.onnx_model is not None:
        import onnxruntime as ort

        from .errors import PlusError

        try:
            sess = ort.InferenceSession(
                source.onnx_model.SerializeToString(), providers=["CPUExecutionProvider"]
            )
            feed = {i.name: x for i, x in zip(sess.get_inputs(), inputs)}
            outs = sess.run(None, feed)
        except Exception as err:  # noqa: BLE001 - the reference's own refusal, of any type
            lines = str(err).strip().splitlines()
            raise PlusError(
                f"the reference (ONNX Runtime) cannot run this model: "
                f"{lines[-1] if lines else type(err).__name__}; --no-check skips the comparison"
            ) from None
        return "onnxruntime", tuple(outs) if len(outs) > 1 else outs[0]
    return "", None


def _public_stats(stats: dict) -> dict:
    return {k: v for k, v in stats.items() if k != "kernel_names"}


def _cmd_inspect(args: argparse.Namespace) -> int:
    import plus_tvm

    stats = plus_tvm.inspect(args.model, args.target, _options(args.opt), pipeline=args.pipeline)
    if args.json:
        print(json.dumps(_public_stats(stats), indent=1))
    else:
        from .report import stats_text

        print(stats_text(stats))
        top = sorted(stats.get("kernel_names", {}).items(), key=lambda kv: -kv[1])[:10]
        if top:
            print("top kernels: " + ", ".join(f"{k} x{v}" for k, v in top))
    return 0


def _lengths(text: str) -> list[int]:
    try:
        lengths = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not comma-separated integers: {text!r}") from None
    if not lengths or min(lengths) < 1:
        raise argparse.ArgumentTypeError(f"sequence lengths must be at least 1: {text!r}")
    return lengths


def _cmd_bench(args: argparse.Namespace) -> int:
    from .bench import Bench, format_table, plot

    backends = [b.strip() for b in args.compare.split(",") if b.strip()]
    result = Bench(
        args.model,
        backends,
        target=args.target,
        options=_options(args.opt),
        runs=args.runs,
        warmup=args.warmup,
        budget_s=args.budget,
        progress=not args.no_progress,
        seq_lengths=args.seq_lengths,
        dtype=args.dtype,
    ).run()
    print(format_table(result))
    if args.json_path:
        _write(args.json_path, lambda f: _dump_json(result, f))
        print(f"wrote {args.json_path}")
    if args.plot:
        _write_to(args.plot, lambda p: plot(result, p))
        print(f"wrote {args.plot}")
    if result["invalid"]:
        print(
            "plus-tvm bench: error: the measurement is invalid (a backend changed the "
            "process's affinity or thread counts): " + "; ".join(result["invalid"]),
            file=sys.stderr,
        )
        return EXIT_CHECK_FAILED
    return 0


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from .costmodel.calibrate import QUIET_LOAD, calibrate, write
    from .costmodel.learned import user_path
    from .errors import OutputWriteError
    from .gir.model import figures_key
    from .target import resolve_target

    target = resolve_target(args.target)
    if args.zoo is None:
        zoo = None
    elif args.zoo.strip().lower() == "none":
        zoo = ()
    else:
        from . import zoo as zoo_models

        zoo = tuple(n.strip().removeprefix("zoo:") for n in args.zoo.split(",") if n.strip())
        for name in zoo:
            zoo_models.get(name)  # an unknown name: UnknownModelError, exit 2
    data, measured = calibrate(
        target,
        quick=args.quick,
        zoo=zoo,
        full_zoo=not (args.quick or args.tiny_zoo),
        seed=args.seed,
        progress=not args.no_progress,
        min_ms=args.min_ms,
    )
    path = args.output or user_path(target.kind.name, figures_key(target))
    try:
        write(data, path)  # (atomic and private itself: the default path is in the cache)
    except OSError as err:
        raise OutputWriteError(f"cannot write {path}: {err.strerror or err}") from None
    if args.records:
        kept = {"records": measured.records, "pairs": measured.pairs, "seconds": measured.seconds}
        _write(args.records, lambda f: _dump_json(kept, f))
    summary = {
        "model": path,
        "samples": data["samples"],
        "accuracy": data["accuracy"],
        "calibrate_s": data["calibrate_s"],
        "other_load": data.get("other_load"),
        "skipped": measured.skipped,
    }
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    print(f"wrote {path} ({data['calibrate_s']} s)")
    print(
        f"samples: {data['samples']['tir']} TIR kernels, {data['samples']['library']} library "
        f"calls, {data['samples'].get('gir_plan', 0)} GIR plans"
    )
    load = data.get("other_load")
    if load is not None and load > QUIET_LOAD:
        print(
            f"warning: other processes kept {load:.2f} cores busy on average during the run: "
            "the timings are noisy; calibrate again on a quiet machine",
            file=sys.stderr,
        )
    for part, acc in data["accuracy"].items():
        if part.startswith("decisions"):
            by = "the analytic constants" if part.endswith("analytic") else "the learned model"
            print(
                f"held-out library-vs-TIR choices by {by}: {acc['right']} of {acc['n']} right, "
                f"{acc['regret'] * 100:.1f}% slower than the best choices"
            )
        elif part.startswith("gir_plans"):
            by = "the GIR performance model" if part.endswith("analytic") else "the learned model"
            print(
                f"held-out GIR plans by {by}: the fastest of a kernel's measured plans for "
                f"{acc['right']} of {acc['n']} kernels, {acc['regret'] * 100:.1f}% slower than "
                "the fastest plans"
            )
        else:
            print(
                f"held-out {part}: Spearman {acc['spearman']}, median relative error "
                f"{acc['median_rel_err'] * 100:.0f}% ({acc['n']} kernels)"
            )
    for line in measured.skipped:
        print(f"skipped {line}")
    return 0


def _cmd_zoo(args: argparse.Namespace) -> int:
    from . import zoo

    if args.zoo_command == "export":
        entry = zoo.get(args.name)
        path = args.output
        _write_to(path, lambda p: zoo.export_onnx(entry, p, dynamic_batch=args.dynamic_batch))
        print(f"wrote {path} ({entry.name}, inputs {', '.join(entry.input_names())})")
        return 0
    entries = [zoo.get(n) for n in zoo.names()]
    if args.json:
        print(
            json.dumps(
                [
                    {"name": e.name, "family": e.family, "description": e.description}
                    for e in entries
                ],
                indent=1,
            )
        )
    else:
        width = max(len(e.name) for e in entries)
        for e in entries:
            print(f"zoo:{e.name:<{width}}  {e.family:<7} {e.description}")
    return 0


def _cmd_warehouse(args: argparse.Namespace) -> int:
    from .pattern_warehouse import load_warehouse

    wh = load_warehouse((*_options(args.opt).warehouse, *getattr(args, "dirs", ())))
    if args.warehouse_command == "validate":
        print(f"ok: {len(wh)} entries")
        return 0
    if args.warehouse_command == "show":
        entry = wh.get(args.name)
        if args.json:
            print(json.dumps(entry.to_dict(), indent=1))
            return 0
        cons = entry.constraints
        print(f"name: {entry.name}\ndescription: {entry.description}\npath: {entry.path}")
        print(f"priority: {entry.priority}")
        print(f"allow_prologue: {str(entry.allow_prologue).lower()}")
        print(f"allow_epilogue: {str(entry.allow_epilogue).lower()}")
        print(f"batched: {str(entry.batched).lower()}")
        dtypes = ", ".join(cons.dtypes) if cons.dtypes is not None else "any"
        print(
            f"constraints: dtype {dtypes}; static_sizes {str(cons.static_sizes).lower()}; "
            f"layout {cons.layout or 'any'}"
        )
        print("implementations:")
        for impl in entry.implementations:
            when = f"  when {impl.when}" if impl.when else ""
            print(f"  {impl.name}  target {impl.target}{when}")
        print("graph:")
        print("\n".join("  " + line for line in entry.graph.to_text().splitlines()))
        return 0
    if args.json:
        rows = [
            {
                "name": e.name,
                "priority": e.priority,
                "allow_prologue": e.allow_prologue,
                "allow_epilogue": e.allow_epilogue,
                "implementations": [i.to_dict() for i in e.implementations],
                "path": e.path,
            }
            for e in wh
        ]
        print(json.dumps(rows, indent=1))
        return 0
    width = max((len(e.name) for e in wh), default=0)
    for e in wh:
        impls = ", ".join(f"{i.name}@{i.target}" for i in e.implementations)
        print(f"{e.name:<{width}}  {e.priority:>4}  {impls}  {e.path}")
    return 0


COMMANDS = {
    "compile": _cmd_compile,
    "run": _cmd_run,
    "inspect": _cmd_inspect,
    "bench": _cmd_bench,
    "calibrate": _cmd_calibrate,
    "zoo": _cmd_zoo,
    "warehouse": _cmd_warehouse,
    "generate": cmd_generate,
}


def _dump_json(data: object, f) -> None:  # noqa: ANN001
    f.write(json.dumps(data, indent=1).encode())


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``plus-tvm``; returns the exit code."""
    from . import interrupt
    from .errors import PlusError
    from .quiet import quiet

    try:
        args = build_parser().parse_args(argv)
    except UsageError as err:
        print(f"plus-tvm: error: {err}", file=sys.stderr)
        return EXIT_USER_ERROR
    try:
        with interrupt.guard(), quiet(enabled=not (args.verbose or args.debug)):
            return COMMANDS[args.command](args)
    except PlusError as err:
        if args.debug:
            raise
        print(f"plus-tvm: error: {err}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("plus-tvm: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # the reader went away (``plus-tvm warehouse show NAME | head``): stop quietly, as
        # command-line tools do on SIGPIPE; stdout is pointed at /dev/null so that Python's
        # final flush does not fail a second time
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except MemoryError as err:
        if args.debug:
            raise
        print(f"plus-tvm: error: out of memory ({err or 'allocation failed'})", file=sys.stderr)
        return EXIT_USER_ERROR
    except Exception as err:  # anything else is our bug: say so in one line
        if args.debug:
            raise
        first = str(err).strip().splitlines()
        print(
            f"plus-tvm: internal error: {type(err).__name__}: {first[-1] if first else ''} "
            "(run with --debug for the traceback)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL_ERROR


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
