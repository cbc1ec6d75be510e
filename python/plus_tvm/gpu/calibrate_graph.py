"""Measure the CUDA-graph selection's costs on the GPU at hand (``run.sh OUT --calibrate``).

Runs on the GPU machine with TVM's runtime library alone, from a GPU bundle's ``calibration/``
folder (compiled on the CPU machine by :mod:`plus_tvm.gpu.calibration_libs`): chains of N
launches of a tiny generated kernel and of N library calls, built without CUDA graphs
(``plain.so``) and with them (``graph.so``). Each function is called back to back (one device
synchronisation per batch of calls; the median over batches of the time per call), and a line
is fitted over N:

- ``kernel_launch_us``: the slope of the plain kernel chains (a kernel launched by the VM);
- ``library_call_us``: the slope of the library chains (VM -> Python -> torch op);
- ``node_us``: the slope of the graph chains over their captured nodes, once the kernels each
  still launches from the host (the first reads the input, the last writes the output; counted
  in the IR at build time) are taken off at ``kernel_launch_us``;
- ``graph_launch_us``: that line's intercept less the plain chains' (what the VM call, its
  output and the Python call cost alike): ``plus.cuda_graph.run_or_capture`` and
  ``cudaGraphLaunch``;
- ``copy_bytes_per_us``: the inverse slope of device-to-device copies (torch ``copy_``) over
  sizes from 1 to 256 MiB.

The times are wall times to the device synchronisation: what a call costs when the host cannot
run ahead (a replay of tiny kernels is bound by the GPU's time per node, a plain chain by the
larger of the host's launch and the GPU's time per kernel). The host's share alone (the calls
timed before the sync) is fitted the same way and kept under ``measured["host_only"]``.

The result, ``OUT/graph_costs.json``, is a calibration file (``plus_tvm.costmodel.graph_cost``):
one entry keyed by ``torch.cuda.get_device_name()`` with its ``arch``, the date, the five
figures and under ``measured`` every timing and fit. ``python -m plus_tvm.gpu.calibrate_graph
add OUT/graph_costs.json`` (on the CPU machine) merges it into the package's data file.

``--device cpu`` is the dry run: the same code on libraries built for ``llvm`` (plain chains,
library chains, copies; no CUDA graphs), written with ``"dry": true`` and refused as a
calibration. Nothing here needs TVM's compiler library or imports ``tvm.relax``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import sys
import time
import traceback
from collections.abc import Callable

import numpy as np

MANIFEST = "calibration.json"  # written by plus_tvm.gpu.calibration_libs
OUTPUT = "graph_costs.json"
#: costmodel.graph_cost's FORMAT and FIGURES (not imported: that package needs TVM's compiler)
FORMAT = "plus_tvm.graph_costs/1"
FIGURES = ("kernel_launch_us", "library_call_us", "graph_launch_us", "node_us", "copy_bytes_per_us")
COPY_MIB = (1, 16, 64, 256)  # device-to-device copy sizes on the GPU
DRY_COPY_MIB = (1, 4, 16)
_DRY_FIGURES = ("kernel_launch_us", "library_call_us", "copy_bytes_per_us")  # no graphs on CPU
_CHAIN = re.compile(r"^(kernels|library)_(\d+)$")


class CalibrationError(RuntimeError):
    """The timings do not give a usable figure (too few points, a non-positive cost)."""


def fit_line(xs: list[float], ys: list[float]) -> dict[str, float]:
    """Least-squares ``y = intercept + slope * x`` and the largest residual relative to y."""
    if len(set(xs)) < 2:
        raise CalibrationError(f"a line needs two different x values, got {xs}")
    slope, intercept = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    pred = intercept + slope * np.asarray(xs, float)
    worst = max(abs(p - y) / abs(y) if y else abs(p - y) for p, y in zip(pred, ys))
    return {"intercept": float(intercept), "slope": float(slope), "max_rel_residual": float(worst)}


def costs_from_timings(timings: dict, counts: dict) -> dict:
    """The five figures of :class:`plus_tvm.costmodel.graph_cost.GraphCost` from measured
    per-call times and the build's counts (module docstring).

    ``timings``: ``plain`` and ``graph`` (``{function: us per call}``; either may be absent:
    no figures from it), ``copy`` (``[[bytes, us], ...]``). ``counts``: per library (``plain``,
    ``graph``) and function, ``kernels_outside``, ``library_outside``, ``regions``,
    ``region_nodes`` (the calibration libraries' manifest). Returns ``{"figures", "fits",
    "problems"}``: a figure whose fit fails or comes out non-positive is left out and its
    problem said (``node_us``: noise below 0 counts as 0)."""
    figures: dict[str, float] = {}
    fits: dict[str, dict] = {}
    problems: list[str] = []

    def fit(part: str, xs: list, ys: list) -> dict | None:
        try:
            fits[part] = fit_line(xs, ys)
        except CalibrationError as err:
            problems.append(f"{part}: {err}")
        return fits.get(part)

    plain, pc = timings.get("plain") or {}, counts.get("plain") or {}
    kern = sorted(f for f in plain if f.startswith("kernels_"))
    lib = sorted(f for f in plain if f.startswith("library_"))
    if fit("kernels", [pc[f]["kernels_outside"] for f in kern], [plain[f] for f in kern]):
        figures["kernel_launch_us"] = fits["kernels"]["slope"]
    if fit("library", [pc[f]["library_outside"] for f in lib], [plain[f] for f in lib]):
        figures["library_call_us"] = fits["library"]["slope"]
    graph, gc = timings.get("graph"), counts.get("graph") or {}
    if graph and "kernel_launch_us" in figures:
        chains = sorted(f for f in graph if f.startswith("kernels_") and gc[f]["regions"] == 1)
        # the kernels each chain still launches from the host (its first and last) taken off
        host = [gc[f]["kernels_outside"] * figures["kernel_launch_us"] for f in chains]
        ys = [graph[f] - h for f, h in zip(chains, host)]
        if fit("graph", [gc[f]["region_nodes"] for f in chains], ys):
            figures["graph_launch_us"] = fits["graph"]["intercept"] - fits["kernels"]["intercept"]
            figures["node_us"] = max(fits["graph"]["slope"], 0.0)
    copies = timings.get("copy")
    if copies and fit("copy", [b for b, _ in copies], [us for _, us in copies]):
        # the bytes must explain the times: at the largest size, most of its time
        if fits["copy"]["slope"] * max(b for b, _ in copies) > 0.5 * max(us for _, us in copies):
            figures["copy_bytes_per_us"] = 1.0 / fits["copy"]["slope"]
        else:
            problems.append(f"copy: the times do not grow with the size: {copies}")
    for key in [k for k, v in figures.items() if not (v > 0 or (k == "node_us" and v == 0))]:
        problems.append(f"{key}: non-positive ({figures.pop(key)!r})")
    return {"figures": figures, "fits": fits, "problems": problems}


def time_per_call(
    fn: Callable[[], object], sync: Callable[[], None], calls: int, batches: int, warmup: int = 3
) -> tuple[float, float]:
    """Microseconds per call: ``calls`` back-to-back calls then one sync, the median over
    ``batches`` (after ``warmup`` calls: a graph is captured on its first); and the host's
    share, the same calls timed before the sync (the GPU may still be running them: a chain
    of tiny kernels can be bound by the GPU's time per kernel rather than the host's)."""
    for _ in range(warmup):
        fn()
    sync()
    wall, host = [], []
    for _ in range(batches):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        issued = time.perf_counter()
        sync()
        wall.append((time.perf_counter() - start) * 1e6 / calls)
        host.append((issued - start) * 1e6 / calls)
    return statistics.median(wall), statistics.median(host)


def _chain_size(name: str) -> int:
    return int(_CHAIN.match(name).group(2))


def measure(libs: str, device: str = "cuda", calls: int = 100, batches: int = 5) -> dict:
    """Time every chain of the calibration libraries in ``libs`` on ``device`` (``cuda``, or
    ``cpu`` for the dry run) and the copies: ``{"timings", "counts", "errors"}``. A library
    or copy that fails is recorded in ``errors`` with its traceback, the rest still timed."""
    import torch
    import tvm
    from tvm.runtime.vm import VirtualMachine

    import plus_tvm  # noqa: F401 - registers the library kernels and plus.cuda_graph

    with open(os.path.join(libs, MANIFEST)) as f:
        manifest = json.load(f)
    dev = tvm.cuda(0) if device == "cuda" else tvm.cpu(0)
    sync = torch.cuda.synchronize if device == "cuda" else dev.sync
    timings: dict = {}
    counts: dict = {}
    errors: list[str] = []
    x_host = np.zeros(manifest["width"], dtype="float32")
    for variant, record in manifest["libraries"].items():
        if variant == "graph" and device != "cuda":
            continue  # (built for CUDA only)
        counts[variant] = record["functions"]
        try:
            executable = tvm.runtime.load_module(os.path.join(libs, record["library"]))
            vm = VirtualMachine(executable, dev)
            x = tvm.runtime.tensor(x_host, dev)
            names = sorted(record["functions"], key=lambda n: (n.split("_")[0], _chain_size(n)))
            if variant == "graph":  # the library calls are not part of the graph's fit
                names = [n for n in names if n.startswith("kernels_")]
            row, host = {}, {}
            for name in names:
                func = vm[name]
                row[name], host[name] = time_per_call(
                    lambda f=func, a=x: f(a), sync, calls, batches
                )
            for name in [n for n in names if n.startswith("kernels_")]:
                got = float(vm[name](x).numpy()[0])  # the chain ran (or replayed) all: x + N
                if got != _chain_size(name):
                    raise CalibrationError(f"{variant}.{name} returned {got}, not x + N = N")
            timings[variant] = row
            timings[f"{variant}_host"] = host
        except Exception as err:  # noqa: BLE001 - one part failing must not hide the others
            errors.append(f"{variant}: {type(err).__name__}: {err}\n{traceback.format_exc(6)}")
    try:
        timings["copy"] = _copies(torch, device, sync)
    except Exception as err:  # noqa: BLE001
        errors.append(f"copy: {type(err).__name__}: {err}\n{traceback.format_exc(6)}")
    return {"timings": timings, "counts": counts, "errors": errors}


def _copies(torch: object, device: str, sync: Callable[[], None]) -> list[list[float]]:
    """[bytes, us] of ``dst.copy_(src)`` for each size (median of 10 after 2 warm-up)."""
    out = []
    for mib in COPY_MIB if device == "cuda" else DRY_COPY_MIB:
        n = mib * 2**20
        src = torch.ones(n, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        us, _ = time_per_call(lambda d=dst, s=src: d.copy_(s), sync, 1, 10, warmup=2)
        out.append([n, us])
        del src, dst
    return out


def calibrate(libs: str, out: str, device: str = "cuda", calls: int = 100) -> dict:
    """Measure, fit and write ``OUT/graph_costs.json`` (a calibration file; the dry run's is
    marked ``dry``). Returns what it wrote."""
    import torch

    import plus_tvm

    start = time.perf_counter()
    measured = measure(libs, device, calls)
    if device == "cuda":
        name = torch.cuda.get_device_name(0)
        major, minor = torch.cuda.get_device_capability(0)
        arch = f"sm_{major}{minor}"
    else:
        name, arch = "cpu (dry run)", None
    result: dict = {"format": FORMAT, "gpus": {}}
    entry: dict = {"arch": arch, "date": datetime.date.today().isoformat()}
    fitted = costs_from_timings(measured["timings"], measured["counts"])
    entry.update(fitted["figures"])
    measured["fits"] = fitted["fits"]
    measured["errors"] += [f"fit: {p}" for p in fitted["problems"]]
    missing = [k for k in FIGURES if k not in entry and (device == "cuda" or k in _DRY_FIGURES)]
    measured["errors"] += [f"fit: no {k}" for k in missing if not fitted["problems"]]
    # the host's share alone (not what the selection uses: a replay waits for the GPU too)
    host = {k[: -len("_host")]: v for k, v in measured["timings"].items() if k.endswith("_host")}
    measured["host_only"] = costs_from_timings(host, measured["counts"])
    measured["seconds"] = round(time.perf_counter() - start, 2)
    measured["versions"] = {"torch": torch.__version__, "plus_tvm": plus_tvm.__version__}
    entry["measured"] = measured
    if device != "cuda":
        result.update(dry=True, device=name, entry=entry)
    elif measured["errors"]:
        result.update(incomplete={name: entry})  # not a calibration: the errors say why
    else:
        result["gpus"][name] = entry
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, OUTPUT), "w") as f:
        json.dump(result, f, indent=1)
    return result


def summary(result: dict) -> str:
    """One line per GPU (or the dry run) with its figures, and the errors."""
    entries = dict(result.get("gpus", {}))
    entries.update(result.get("incomplete", {}))
    if "entry" in result:
        entries[result.get("device", "dry run")] = result["entry"]
    lines = []
    for name, e in entries.items():
        figures = ", ".join(f"{k}={e[k]:.4g}" for k in FIGURES if k in e)
        lines.append(f"{name} ({e.get('arch')}, {e['measured'].get('seconds')} s): {figures}")
        lines += [f"  error: {err.splitlines()[0]}" for err in e["measured"].get("errors", [])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="measure (on the GPU machine, from a bundle)")
    run.add_argument("--libs", required=True, help="the bundle's calibration/ folder")
    run.add_argument("--out", required=True)
    run.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: dry run")
    run.add_argument("--calls", type=int, default=100, help="calls per timed batch")
    add = sub.add_parser("add", help="merge a GPU run's graph_costs.json into the data file")
    add.add_argument("file")
    add.add_argument("--into", default=None, help="default: the package's data file")
    show = sub.add_parser("show", help="list the calibrations of a file (default: shipped)")
    show.add_argument("file", nargs="?", default=None)
    args = parser.parse_args(argv)
    if args.cmd in ("add", "show"):  # (on the CPU machine: the package's data file)
        return _edit(args)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("calibrate_graph: no CUDA GPU here (--device cpu: dry run)", file=sys.stderr)
            return 2
    if not os.path.isfile(os.path.join(args.libs, MANIFEST)):
        print(f"calibrate_graph: no {MANIFEST} in {args.libs}", file=sys.stderr)
        return 2
    result = calibrate(args.libs, args.out, args.device, args.calls)
    print(summary(result))
    print(f"[calibrate_graph] wrote {os.path.join(args.out, OUTPUT)}")
    return 1 if "incomplete" in result else 0


def _edit(args: argparse.Namespace) -> int:
    from ..costmodel.graph_cost import DATA_FILE, GraphCostError, add_calibration, read_calibrations

    try:
        if args.cmd == "add":
            names = add_calibration(args.file, args.into)
            print(f"{args.into or DATA_FILE}: added {', '.join(names)}")
        else:
            for name, e in read_calibrations(args.file).items():
                figures = ", ".join(f"{k}={e[k]:.4g}" for k in FIGURES)
                print(f"{name} ({e['arch']}, {e['date']}): {figures}")
    except GraphCostError as err:
        print(f"calibrate_graph: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
