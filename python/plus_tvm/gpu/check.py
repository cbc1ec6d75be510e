"""Run a GPU bundle (:mod:`plus_tvm.gpu.bundle`) on the GPU machine: check, then time.

Runs with TVM's runtime library alone. For every model of the bundle it rebuilds the torch model
from its seed (or its shipped state dict), checks the weights against the bundle's fingerprint,
and then for every compiled variant:

- **checks** the outputs on the bundle's three input sets, each passed three times in turn (so
  that ``cuda_graph=auto``'s calls without a graph, its capturing call and its replays are all
  checked), against torch eager on the GPU, both in strict float32 (TF32 off for cuBLAS and
  cuDNN: the library kernels run through torch in this process and follow the same switches),
  and that three different inputs give three different outputs (a stale CUDA-graph replay
  would not); NaN in an output is an error;
- **times** it: inputs placed once, warm-up runs, then timed runs each ending with a device
  synchronisation (median and minimum, ms); the device memory the process holds after warm-up
  beyond what it held before the load (weights, workspace, captured graphs). The variants of a
  model stay loaded and are timed ``--rounds`` times in turn; ``median_ms`` is the median of
  the rounds' medians, ``round_ms`` and ``round_spread`` say how much they moved.

With ``--kernels a,b`` the TIR kernels of variants ``a`` and ``b`` are also timed one by one
(:mod:`plus_tvm.kernel_timing`, shapes from the manifest) and compared in ``OUT/kernels.md``
(``plus-always,plus-gir``: GIR's CUDA schedules against dlight's, kernel by kernel).

Peers are timed the same way in the same process: torch eager, ``torch.compile`` (default) and
``torch.compile(mode="reduce-overhead")`` (inductor with CUDA graphs); each ``torch.compile``
peer is skipped (and said so) when the time budget is spent. Results go to ``OUT/gpu_check.json``
and a markdown table ``OUT/gpu_check.md``.

Usage (on the GPU machine, through the bundle's ``run.sh``)::

    python3 -m plus_tvm.gpu.check --bundle DIR --out OUT [--models a,b] [--peers ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable

import numpy as np

REL_TOL = 1e-3  # max |plus - torch| / max |torch|, both in strict float32
CHECK_ROUNDS = 3  # calls per input set in the check (auto measures over its first 7 calls)
PEERS = ("eager", "compile", "compile-ro")


def _timed(fn: Callable[[], object], sync: Callable[[], None], runs: int, warmup: int) -> dict:
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return {"median_ms": statistics.median(times), "min_ms": min(times), "runs": runs}


def _rel_err(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    """Max abs error and that over max |want|; NaN where ``want`` is finite counts as inf."""
    if not got.size:
        return 0.0, 0.0
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    diff[np.isnan(got) & ~np.isnan(want)] = np.inf
    diff[np.isnan(got) & np.isnan(want)] = 0.0
    err = float(diff.max())
    scale = float(np.nanmax(np.abs(want))) if want.size else 0.0
    return err, err / max(scale, 1e-12)


def _strict_fp32(torch: object, on: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = not on
    torch.backends.cudnn.allow_tf32 = not on


def _check_model(name: str, record: dict, bundle: str, args: argparse.Namespace) -> dict:
    import torch

    import plus_tvm
    from plus_tvm import zoo
    from plus_tvm.gpu.bundle import fingerprint
    from plus_tvm.runtime import cuda_graph

    folder = os.path.join(bundle, "models", name)
    model = zoo.get(name).build(record["seed"])
    if record.get("state"):
        model.load_state_dict(torch.load(os.path.join(folder, record["state"])))
    want = record["fingerprint"]
    got = fingerprint(model.state_dict())
    differ = sorted(
        k for k in want if k not in got or not np.allclose(got[k], want[k], rtol=1e-6, atol=1e-9)
    )
    result: dict = {"weights_match_bundle": not differ, "variants": {}, "peers": {}}
    if differ:
        result["weights_differ"] = differ[:5]
    model = model.cuda()
    data = np.load(os.path.join(folder, "inputs.npz"))
    sets = [
        [data[f"set{k}_{i}"] for i in range(record["num_inputs"])]
        for k in range(record["input_sets"])
    ]
    cuda_sets = [[torch.from_numpy(a).cuda() for a in s] for s in sets]
    tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    _strict_fp32(torch, True)
    with torch.no_grad():
        refs = [model(*s).float().cpu().numpy() for s in cuda_sets]
    sync = torch.cuda.synchronize

    timers: dict[str, Callable[[], object]] = {}  # the variants kept loaded for more rounds
    for vname, variant in record["variants"].items():
        row: dict = {}
        result["variants"][vname] = row
        cuda_graph.runtime().clear()
        try:
            start = time.perf_counter()
            compiled = plus_tvm.load(os.path.join(bundle, variant["library"]), weights=model)
            _strict_fp32(torch, True)
            # the sets in turn for CHECK_ROUNDS rounds: with cuda_graph=auto the first calls run
            # without a graph, then one captures, then replays (runtime.cuda_graph), so every
            # way a region runs is checked, each against its own input's reference
            calls = [np.asarray(compiled(*s)) for _ in range(CHECK_ROUNDS) for s in sets]
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
            row["load_and_first_runs_s"] = round(time.perf_counter() - start, 2)
            outs = calls[: len(sets)]
            row["checked_calls"] = len(calls)
            row["nan_outputs"] = int(sum(np.isnan(o).sum() for o in calls))
            errs = [_rel_err(o, refs[k % len(refs)]) for k, o in enumerate(calls)]
            row["worst_call"] = int(np.argmax([r for _, r in errs]))
            row["max_abs_err"] = max(e for e, _ in errs)
            row["max_rel_err"] = max(r for _, r in errs)
            distinct = all(
                not np.array_equal(outs[k], outs[k - 1])
                for k in range(1, len(outs))
                if not np.array_equal(refs[k], refs[k - 1])
            )
            row["new_inputs_new_outputs"] = distinct
            row["correct"] = bool(row["max_rel_err"] <= REL_TOL and distinct)
            del compiled  # timed afresh with torch's defaults (TF32 convolutions), as users run
            torch.cuda.synchronize()
            free_before = torch.cuda.mem_get_info()[0]
            compiled = plus_tvm.load(os.path.join(bundle, variant["library"]), weights=model)
            prepared = compiled.prepare(*sets[0])
            row.update(
                _timed(
                    lambda c=compiled, p=prepared: c.run_prepared(p),
                    lambda: None,
                    args.runs,
                    args.warmup,
                )
            )
            torch.cuda.synchronize()
            row["device_mb"] = round((free_before - torch.cuda.mem_get_info()[0]) / 2**20, 1)
            row["graph_regions"] = cuda_graph.status()  # decisions, times, capture memory
            if vname in args.kernels and variant.get("kernel_signatures"):
                import tvm

                from plus_tvm.kernel_timing import time_kernels

                row["kernel_ms"] = time_kernels(
                    compiled.executable,
                    variant["kernel_signatures"],
                    tvm.cuda(0),
                    repeat=3,
                    min_repeat_ms=0,
                )
            timers[vname] = lambda c=compiled, p=prepared: c.run_prepared(p)
            del compiled, prepared
        except Exception as err:  # noqa: BLE001 - a failing variant is reported, the rest go on
            row["error"] = f"{type(err).__name__}: {str(err).strip().splitlines()[-1:]}"
            row["traceback"] = traceback.format_exc(limit=6)
            row["correct"] = False
        print(f"[gpu_check] {name} {vname}: {_brief(row)}", flush=True)
    _more_rounds(result["variants"], timers, args)
    timers.clear()  # the loaded variants go before the peers are timed

    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    x = cuda_sets[0]
    for peer in args.peers:
        row = {}
        result["peers"][peer] = row
        if peer != "eager" and time.perf_counter() > args.deadline:
            row["skipped"] = "time budget spent"
            continue
        try:
            fn = model
            torch._dynamo.reset()  # each torch.compile peer starts cold, as in its own process
            start = time.perf_counter()
            if peer == "compile":
                fn = torch.compile(model)
            elif peer == "compile-ro":
                fn = torch.compile(model, mode="reduce-overhead")
            with torch.no_grad():
                got = fn(*x).float().cpu().numpy()
                row["compile_s"] = round(time.perf_counter() - start, 2)
                row["max_abs_err"], row["max_rel_err"] = _rel_err(got, refs[0])
                row.update(_timed(lambda f=fn: f(*x), sync, args.runs, args.warmup))
        except Exception as err:  # noqa: BLE001 - a failing peer is reported, never made up
            row["error"] = f"{type(err).__name__}: {str(err).strip().splitlines()[-1:]}"
        print(f"[gpu_check] {name} {peer}: {_brief(row)}", flush=True)
    return result


def _more_rounds(rows: dict, timers: dict, args: argparse.Namespace) -> None:
    """Time the loaded variants ``args.rounds - 1`` more times, in turn (A B A B: two libraries
    loaded one after the other differed by up to 5% on an H200 with the same kernels), and
    report the median over the rounds' medians and each round's median."""
    for vname in timers:
        rows[vname]["round_ms"] = [rows[vname]["median_ms"]]
    for _ in range(max(args.rounds - 1, 0)):
        if time.perf_counter() > args.deadline:
            break
        for vname, fn in timers.items():
            rows[vname]["round_ms"].append(_timed(fn, lambda: None, args.runs, 2)["median_ms"])
    for vname in timers:
        rounds = rows[vname]["round_ms"]
        rows[vname]["median_ms"] = statistics.median(rounds)
        rows[vname]["round_spread"] = (max(rounds) - min(rounds)) / statistics.median(rounds)


def _brief(row: dict) -> str:
    keys = ("median_ms", "max_rel_err", "nan_outputs", "correct", "device_mb", "error", "skipped")
    return ", ".join(
        f"{k}={row[k]:.4g}" if isinstance(row.get(k), float) else f"{k}={row[k]}"
        for k in keys
        if k in row
    )


def table(results: dict) -> str:
    """The markdown table of a gpu_check result: medians (ms), ratios, plus's error, the widest
    spread of plus's timing rounds, and whether plus and TVM's own pipeline were correct (TVM's
    baseline is reported, never fixed up)."""
    rows = [
        "| model | plus off | plus always | plus auto | plus gir | TVM | torch | compile "
        "| compile ro | auto vs off | always vs off | gir vs always | auto vs torch "
        "| auto vs compile | auto vs compile ro | plus max rel err | round spread "
        "| plus correct | TVM correct |",
        "|---|" + "---:|" * 16 + "---|---|",
    ]
    for name, res in results["models"].items():
        v, p = res.get("variants", {}), res.get("peers", {})
        if not v:
            rows.append(f"| {name} | {res.get('error', 'no result')} |" + " |" * 17)
            continue
        ms = {k: (row or {}).get("median_ms") for k, row in {**v, **p}.items()}
        alw, auto = ms.get("plus-always"), ms.get("plus-auto")
        plus = {k: r for k, r in v.items() if k.startswith("plus")}
        errs = [r["max_rel_err"] for r in plus.values() if r.get("max_rel_err") is not None]
        spreads = [r["round_spread"] for r in plus.values() if "round_spread" in r]
        keys = ("plus-off", "plus-always", "plus-auto", "plus-gir", "tvm", "eager", "compile")
        cells = [_num(ms.get(k)) for k in (*keys, "compile-ro")]
        cells += [_ratio(auto, ms.get("plus-off")), _ratio(alw, ms.get("plus-off"))]
        cells.append(_ratio(ms.get("plus-gir"), alw))
        cells += [_ratio(auto, ms.get(k)) for k in ("eager", "compile", "compile-ro")]
        cells.append(f"{max(errs):.1e}" if errs else "-")
        cells.append(f"{max(spreads):.1%}" if spreads else "-")
        cells.append(_yes(all(r.get("correct") for r in plus.values())))
        cells.append(_yes(v["tvm"].get("correct")) if "tvm" in v else "-")
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def kernel_table(results: dict, a: str, b: str, top: int = 8) -> str:
    """Per model, the ``top`` kernels by time under variant ``a`` with their time under ``b``
    (same kernel name: same fusion, another schedule), and the totals."""
    rows = [f"| model | kernel | {a} ms | {b} ms | {a} / {b} |", "|---|---|---:|---:|---:|"]
    for name, res in results["models"].items():
        va = res.get("variants", {}).get(a, {}).get("kernel_ms") or {}
        vb = res.get("variants", {}).get(b, {}).get("kernel_ms") or {}
        both = sorted(set(va) & set(vb), key=lambda k: -va[k])
        if not both:
            continue
        for k in both[:top]:
            rows.append(f"| {name} | {k} | {va[k]:.4f} | {vb[k]:.4f} | {_ratio(vb[k], va[k])} |")
        ta, tb = sum(va[k] for k in both), sum(vb[k] for k in both)
        rows.append(f"| {name} | all {len(both)} | {ta:.4f} | {tb:.4f} | {_ratio(tb, ta)} |")
    return "\n".join(rows)


def _num(x: float | None) -> str:
    return f"{x:.3f}" if x is not None else "-"


def _ratio(ours: float | None, theirs: float | None) -> str:
    return f"{theirs / ours:.2f}x" if ours and theirs else "-"


def _yes(ok: object) -> str:
    return "yes" if ok else "NO"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--models", default="", help="comma-separated subset (default: all)")
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="timing rounds over the loaded variants in turn (median of the rounds' medians)",
    )
    parser.add_argument("--budget", type=float, default=480.0, help="seconds for everything")
    parser.add_argument(
        "--kernels",
        default="",
        help="variants whose TIR kernels are also timed one by one (comma-separated); the "
        "first two are compared kernel by kernel in OUT/kernels.md",
    )
    args = parser.parse_args(argv)
    args.peers = [p for p in args.peers.split(",") if p]
    args.kernels = [v for v in args.kernels.split(",") if v]
    bad = [p for p in args.peers if p not in PEERS]
    if bad:
        print(f"gpu_check: unknown peer(s) {bad}; known: {', '.join(PEERS)}", file=sys.stderr)
        return 2
    try:
        import torch
    except ImportError:
        print("gpu_check: torch is not installed here", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA GPU on this machine; run the bundle on the GPU machine",
            file=sys.stderr,
        )
        return 2
    manifest_path = os.path.join(args.bundle, "manifest.json")
    try:
        with open(manifest_path) as f:
            manifest = json.load(f)
    except (OSError, json.JSONDecodeError) as err:
        print(f"gpu_check: cannot read {manifest_path}: {err}", file=sys.stderr)
        return 2
    import tvm

    import plus_tvm

    args.deadline = time.perf_counter() + args.budget
    chosen = [m for m in args.models.split(",") if m] or list(manifest["models"])
    os.makedirs(args.out, exist_ok=True)
    results = {
        "device": torch.cuda.get_device_name(0),
        "versions": {
            "torch": torch.__version__,
            "tvm": tvm.__version__,
            "runtime_only": not plus_tvm.compiler_available(),
        },
        "bundle": {k: manifest[k] for k in ("created", "target", "versions")},
        "rel_tol": REL_TOL,
        "models": {},
    }
    for name in chosen:
        if name not in manifest["models"]:
            print(f"gpu_check: {name} is not in the bundle", file=sys.stderr)
            return 2
        try:
            results["models"][name] = _check_model(
                name, manifest["models"][name], args.bundle, args
            )
        except Exception as err:  # noqa: BLE001 - one model failing must not hide the others
            results["models"][name] = {
                "error": f"{type(err).__name__}: {err}",
                "traceback": traceback.format_exc(limit=8),
            }
            print(f"[gpu_check] {name}: FAILED {err}", flush=True)
        with open(os.path.join(args.out, "gpu_check.json"), "w") as f:
            json.dump(results, f, indent=1)
    text = table(results)
    with open(os.path.join(args.out, "gpu_check.md"), "w") as f:
        f.write(text + "\n")
    if len(args.kernels) >= 2:
        with open(os.path.join(args.out, "kernels.md"), "w") as f:
            f.write(kernel_table(results, args.kernels[0], args.kernels[1]) + "\n")
    print(text)
    failed = plus_failures(results)
    if failed:
        print(f"gpu_check: plus not correct: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def plus_failures(results: dict) -> list[str]:
    """The models where a plus variant failed or was wrong (TVM's own pipeline is a baseline:
    its wrong outputs are in the table, not a failure of the check)."""
    return [
        name
        for name, r in results["models"].items()
        if "error" in r
        or not all(v.get("correct") for k, v in r["variants"].items() if k.startswith("plus"))
    ]


if __name__ == "__main__":
    sys.exit(main())
