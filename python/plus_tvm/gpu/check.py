"""Run a GPU bundle (:mod:`plus_tvm.gpu.bundle`) on the GPU machine: check, then time.

Runs with TVM's runtime library alone. For every model of the bundle it rebuilds the torch model
from its seed (or its shipped state dict), checks the weights against the bundle's fingerprint,
converts it to each dtype of the bundle (``model.to(dtype)``), and for every compiled variant:

- **checks** the outputs on the bundle's three input sets, each passed three times in turn (so
  that ``cuda_graph=auto``'s calls without a graph, its capturing call and its replays are all
  checked), and that three different inputs give three different outputs (a stale CUDA-graph
  replay would not); NaN in an output is an error. In fp32 against torch eager on the GPU in
  strict float32 (TF32 off for cuBLAS and cuDNN: the library kernels run through torch in this
  process and follow the same switches), within :data:`REL_TOL`; in bf16 / fp16 against a
  float64 run of the same rounded weights, within :mod:`plus_tvm.accuracy`'s contract (at most
  twice torch eager's own error in that dtype on that input, plus a floor);
- **times** it as users call it: torch tensors already on the GPU in, torch tensors on the GPU
  out (the plain ``compiled(*inputs)``; no host copy), warm-up runs, then timed runs each ending
  with a device synchronisation (median and minimum, ms; ``run_prepared_ms``: the VM call alone
  on inputs placed once); the device memory the process holds after warm-up
  beyond what it held before the load (weights, workspace, captured graphs). The variants of a
  model stay loaded and are timed ``--rounds`` times in turn; ``median_ms`` is the median of
  the rounds' medians, ``round_ms`` and ``round_spread`` say how much they moved.

First (unless ``--no-calibrate`` or ``--resume``) the CUDA-graph selection's costs are
measured on this GPU from the bundle's ``calibration/`` (:func:`calibrate_first`, a child
process, about 20 s): ``OUT/graph_costs.json``, summed up under ``calibration`` in the JSON.

With ``--kernels a,b`` the TIR kernels of variants ``a`` and ``b`` are also timed one by one
(:mod:`plus_tvm.kernel_timing`, shapes from the manifest) and compared in ``OUT/kernels.md``
(``plus-always,plus-gir``: GIR's CUDA schedules against dlight's, kernel by kernel).

With ``--profile N`` each plus variant and each peer also runs N inferences (after the
warm-up) under torch.profiler with CUDA activity, each inference in a ``record_function`` range
ending in a device synchronisation: every GPU kernel per inference by name, count and time,
summed by kind, and the busy time and idle gaps (:mod:`plus_tvm.gpu.profile`), under
``profile`` in the JSON and in ``OUT/profile.md``.

A bundle built with ``--batches`` holds each dtype at each batch size (keyed ``fp32`` at batch
1, ``fp32 b16`` at 16, :func:`plus_tvm.gpu.bundle.unit_label`); each is checked and timed on
its own input sets (batch 1 from the bundle, larger batches drawn again from their seeds) and
is a row of the table (``--batches a,b`` picks batches).

Peers are timed the same way in the same process, in the same dtype: torch eager,
``torch.compile`` (default) and ``torch.compile(mode="reduce-overhead")`` (inductor with CUDA
graphs); each ``torch.compile`` peer is skipped (and said so) when the time budget is spent.
Results go to ``OUT/gpu_check.json`` and a markdown table ``OUT/gpu_check.md`` (a row per model
and dtype). A crash of the process (a kernel's segfault) leaves ``running`` in the JSON;
``--resume`` records that model and dtype as crashed and goes on (``run.sh`` does so).

Usage (on the GPU machine, through the bundle's ``run.sh``)::

    python3 -m plus_tvm.gpu.check --bundle DIR --out OUT [--models a,b] [--peers ...]
        [--profile N] [--batches 1,16]
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

from plus_tvm import accuracy
from plus_tvm.gpu.bundle import split_label

REL_TOL = 1e-3  # max |plus - torch| / max |torch|, both in strict float32
CHECK_ROUNDS = 3  # calls per input set in the check (auto measures over its first 7 calls)
PEERS = ("eager", "compile", "compile-ro")
PROFILER_ACTIVITIES = ("CPU", "CUDA")  # CPU: the record_function range of each inference


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


def _strict_fp32(torch: object, on: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = not on
    torch.backends.cudnn.allow_tf32 = not on


def _check_model(
    name: str, record: dict, bundle: str, args: argparse.Namespace, done: Callable
) -> dict:
    """Rebuild ``name``'s torch model, check its weights against the bundle, then check and
    time every dtype of it (``done(dtype, result)`` after each: saved as it goes)."""
    import torch

    from plus_tvm import zoo
    from plus_tvm.gpu.bundle import fingerprint

    folder = os.path.join(bundle, "models", name)
    model = zoo.get(name).build(record["seed"])
    if record.get("state"):
        model.load_state_dict(torch.load(os.path.join(folder, record["state"])))
    want = record["fingerprint"]
    got = fingerprint(model.state_dict())
    differ = sorted(
        k for k in want if k not in got or not np.allclose(got[k], want[k], rtol=1e-6, atol=1e-9)
    )
    result: dict = {"weights_match_bundle": not differ, "dtypes": {}}
    if differ:
        result["weights_differ"] = differ[:5]
    model = model.cuda().eval()
    for label, entry in bundle_dtypes(record).items():
        dtype, batch = split_label(label)
        if args.dtypes and dtype not in args.dtypes:
            continue
        if args.batches and batch not in args.batches:
            continue
        if label in args.skip.get(name, ()):
            continue  # (checked before a resumed run)
        done(label, None)  # running: a crash of the process is put down to this unit
        try:
            sets = _input_sets(name, record, entry, folder, batch)
            res = _check_dtype(name, label, model, entry["variants"], sets, bundle, args)
        except Exception as err:  # noqa: BLE001 - one dtype failing must not hide the others
            res = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc(8)}
            print(f"[gpu_check] {name} {label}: FAILED {err}", flush=True)
        result["dtypes"][label] = {"dtype": dtype, "batch": batch, **res}
        done(label, result)
    return result


def _input_sets(name: str, record: dict, entry: dict, folder: str, batch: int) -> list:
    """The float32 (token ids: int64) numpy input sets of a unit: at batch 1 the bundle's,
    at a larger batch drawn again from the seeds the bundle names (:func:`batch_inputs`)."""
    from plus_tvm import zoo
    from plus_tvm.gpu.bundle import batch_inputs

    if batch == 1:
        data = np.load(os.path.join(folder, "inputs.npz"))
        return [
            [data[f"set{k}_{i}"] for i in range(record["num_inputs"])]
            for k in range(record["input_sets"])
        ]
    zentry = zoo.get(name)
    return [[t.numpy() for t in batch_inputs(zentry, s, batch)] for s in entry["input_seeds"]]


def resume(results: dict) -> dict[str, set]:
    """Go on from a saved result: the model and dtype it was running when the process died
    are recorded as crashed; returns, per model, the dtypes done (to skip)."""
    running = results.pop("running", None)
    if running:
        name, dtype = running
        model = results["models"].setdefault(name, {"dtypes": {}})
        model.setdefault("dtypes", {})[dtype] = {
            "error": "the check process died while running it (killed by a signal: a crash, "
            "e.g. a kernel touching memory it must not); resumed after it",
            "variants": {},
            "peers": {},
        }
    return {name: set(res.get("dtypes", {})) for name, res in results["models"].items()}


def bundle_dtypes(record: dict) -> dict:
    """A manifest record's units (a dtype at a batch, keyed by
    :func:`plus_tvm.gpu.bundle.unit_label`) and their variants (a bundle of format 1: float32
    at batch 1 only)."""
    return record.get("dtypes") or {"fp32": {"variants": record["variants"]}}


def _host(out: object) -> np.ndarray:
    """The first output (a tensor, or the first of a tuple) as a float64 numpy array."""
    out = out[0] if isinstance(out, (tuple, list)) else out
    if hasattr(out, "detach"):  # torch tensor (on the GPU)
        return out.detach().double().cpu().numpy()
    return np.asarray(out).astype(np.float64)


def _references(
    torch: object, model: object, dtype: str, cuda_sets: list
) -> tuple[str, list, list]:
    """The reference outputs of the input sets, and torch eager's own error on each (None in
    float32, where torch eager is the reference).

    - ``fp32``: torch eager in strict float32 (TF32 off for cuBLAS and cuDNN: the library
      kernels run through torch in this process and follow the same switches);
    - ``bf16`` / ``fp16``: a float64 run of the same rounded weights and inputs, against which
      plus is judged by :mod:`plus_tvm.accuracy`'s contract (at most twice torch eager's own
      error in the dtype, plus a floor)."""
    import copy

    with torch.no_grad():
        if dtype == "fp32":
            return "torch eager fp32 (TF32 off)", [_host(model(*s)) for s in cuda_sets], []
        wide = copy.deepcopy(model).double()
        refs = [
            _host(wide(*[t.double() if t.is_floating_point() else t for t in s])) for s in cuda_sets
        ]
        del wide
        eager = [_host(model(*s)) for s in cuda_sets]
    errs = [accuracy.rel_err(e, r) for e, r in zip(eager, refs)]
    return f"float64 run of the {dtype} weights and inputs", refs, errs


def _check_dtype(
    name: str,
    label: str,
    model32: object,
    variants: dict,
    sets: list,
    bundle: str,
    args: argparse.Namespace,
) -> dict:
    """Check and time every variant of ``name`` in the unit ``label`` (a dtype at a batch;
    ``sets``: its input sets), then the torch peers in it."""
    import torch

    import plus_tvm
    from plus_tvm.gpu.bundle import cast_inputs, in_dtype
    from plus_tvm.runtime import cuda_graph

    dtype, _ = split_label(label)
    cuda32 = [[torch.from_numpy(a).cuda() for a in s] for s in sets]
    cast = [cast_inputs(s, dtype) for s in cuda32]  # (integer inputs unchanged)
    model, _ = in_dtype(model32, [], dtype)
    # plus is given what a user gives it: numpy arrays in float32 (as ever), torch tensors on
    # the GPU in half precision (numpy has no bfloat16 of its own)
    plus_sets = sets if dtype == "fp32" else cast
    user_inputs = cuda32[0] if dtype == "fp32" else cast[0]  # (what the timed calls take)
    tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    _strict_fp32(torch, True)
    reference, refs, torch_errs = _references(torch, model, dtype, cast)
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    result: dict = {"reference": reference, "variants": {}, "peers": {}}
    if torch_errs:
        result["torch_rel_err"] = torch_errs
        result["contract"] = (
            f"plus rel err <= {accuracy.TORCH_FACTOR:g} x torch eager's + {accuracy.FLOOR[dtype]:g}"
        )
    else:
        result["contract"] = f"plus rel err <= {REL_TOL:g}"
    sync = torch.cuda.synchronize

    timers: dict[str, Callable[[], object]] = {}  # the variants kept loaded for more rounds
    for vname, variant in variants.items():
        row: dict = {}
        result["variants"][vname] = row
        cuda_graph.runtime().clear()
        if "error" in variant:  # it did not compile on the CPU machine
            row.update(error=f"compile failed: {variant['error']}", correct=False)
            print(f"[gpu_check] {name} {label} {vname}: {_brief(row)}", flush=True)
            continue
        try:
            start = time.perf_counter()
            compiled = plus_tvm.load(os.path.join(bundle, variant["library"]), weights=model)
            _strict_fp32(torch, True)
            # the sets in turn for CHECK_ROUNDS rounds: with cuda_graph=auto the first calls run
            # without a graph, then one captures, then replays (runtime.cuda_graph), so every
            # way a region runs is checked, each against its own input's reference (each output
            # copied to the host before the next call: a replay reuses its output buffers)
            calls = [_host(compiled(*s)) for _ in range(CHECK_ROUNDS) for s in plus_sets]
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
            row["load_and_first_runs_s"] = round(time.perf_counter() - start, 2)
            row.update(_judge(calls, refs, torch_errs, dtype))
            del compiled  # timed afresh with torch's defaults (TF32 convolutions), as users run
            torch.cuda.synchronize()
            free_before = torch.cuda.mem_get_info()[0]
            compiled = plus_tvm.load(os.path.join(bundle, variant["library"]), weights=model)
            # timed as users call it: torch tensors already on the GPU in, torch tensors on
            # the GPU out (no host copy either way; each call synchronises); the VM call alone
            # (inputs placed once) beside it
            plain = lambda c=compiled, x=user_inputs: c(*x)  # noqa: E731
            prepared = compiled.prepare(*plus_sets[0])
            row.update(_timed(plain, lambda: None, args.runs, args.warmup))
            row["run_prepared_ms"] = _timed(
                lambda c=compiled, p=prepared: c.run_prepared(p),
                lambda: None,
                max(args.runs // 3, 5),
                2,
            )["median_ms"]
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
            timers[vname] = plain
            if args.profile:
                tir = set(variant.get("kernel_signatures") or {})
                row["profile"] = _profile_or_skip(timers[vname], args, tir)
            del compiled, prepared, plain
        except Exception as err:  # noqa: BLE001 - a failing variant is reported, the rest go on
            row["error"] = f"{type(err).__name__}: {str(err).strip().splitlines()[-1:]}"
            row["traceback"] = traceback.format_exc(limit=6)
            row["correct"] = False
        print(f"[gpu_check] {name} {label} {vname}: {_brief(row)}", flush=True)
    _more_rounds(result["variants"], timers, args)
    timers.clear()  # the loaded variants go before the peers are timed

    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    x = cast[0]
    for peer in args.peers:
        row = {}
        result["peers"][peer] = row
        if peer != "eager" and time.time() > args.deadline:
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
                got = _host(fn(*x))
                row["compile_s"] = round(time.perf_counter() - start, 2)
                row["max_abs_err"] = float(np.abs(got - refs[0]).max()) if got.size else 0.0
                row["max_rel_err"] = accuracy.rel_err(got, refs[0])
                row.update(_timed(lambda f=fn: f(*x), sync, args.runs, args.warmup))
                if args.profile:
                    row["profile"] = _profile_or_skip(lambda f=fn: f(*x), args)
        except Exception as err:  # noqa: BLE001 - a failing peer is reported, never made up
            row["error"] = f"{type(err).__name__}: {str(err).strip().splitlines()[-1:]}"
        print(f"[gpu_check] {name} {label} {peer}: {_brief(row)}", flush=True)
    return result


def profiled(fn: Callable[[], object], inferences: int, warmup: int, tir: set | None) -> dict:
    """``inferences`` calls of ``fn`` (after ``warmup``) under torch.profiler with CPU and CUDA
    activity, each in a ``record_function`` range ending in a device synchronisation; their
    kernels summarised by :func:`plus_tvm.gpu.profile.summarize` (``tir``: the variant's TIR
    function names)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from plus_tvm.gpu.profile import MARK, kernel_events, summarize

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[getattr(ProfilerActivity, a) for a in PROFILER_ACTIVITIES]) as prof:
        for _ in range(inferences):
            with record_function(MARK):
                fn()
                torch.cuda.synchronize()
    kernels, windows = kernel_events(prof.events())
    if not kernels:
        return {"error": "the profiler saw no GPU kernel (no CUDA activity from CUPTI?)"}
    if len(windows) != inferences:  # without the ranges: one stretch (gaps include the host's)
        windows_seen, windows = len(windows), None
    summary = summarize(kernels, inferences, windows, tir)
    if windows is None:
        summary["windows_seen"] = windows_seen
    return summary


def _profile_or_skip(fn: Callable[[], object], args: argparse.Namespace, tir=None) -> dict:
    """:func:`profiled` with ``args.profile`` inferences; skipped when the time budget is spent;
    a profiler failure is reported in the profile (the run was checked and timed already)."""
    if time.time() > args.deadline:
        return {"skipped": "time budget spent"}
    try:
        return profiled(fn, args.profile, min(args.warmup, 3), tir)
    except Exception as err:  # noqa: BLE001 - the profile is extra: the run's result stands
        return {"error": f"{type(err).__name__}: {str(err).strip().splitlines()[-1:]}"}


def profile_rows(results: dict) -> list[tuple[str, dict]]:
    """(``model unit runner``, profile with the run's ``wall_ms``) for every profiled plus
    variant and peer of a gpu_check result, for :func:`plus_tvm.gpu.profile.profile_table`."""
    rows = []
    for name, label, res in units(results):
        for runner, row in {**res.get("variants", {}), **res.get("peers", {})}.items():
            prof = (row or {}).get("profile")
            if prof is None:
                continue
            if "skipped" in prof:
                prof = {"error": f"skipped: {prof['skipped']}"}
            rows.append((f"{name} {label} {runner}", {**prof, "wall_ms": row.get("median_ms")}))
    return rows


def _judge(calls: list, refs: list, torch_errs: list, dtype: str) -> dict:
    """Every call's error against the reference of its input set (call k had set k % sets):
    in float32 at most :data:`REL_TOL`, in half precision within :mod:`plus_tvm.accuracy`'s
    contract; and different inputs gave different outputs (a stale graph replay would not)."""
    n = len(refs)
    errs = [accuracy.rel_err(o, refs[k % n]) for k, o in enumerate(calls)]
    if torch_errs:
        bounds = [accuracy.bound(torch_errs[k % n], dtype) for k in range(len(calls))]
    else:
        bounds = [REL_TOL] * len(calls)
    outs = calls[:n]
    distinct = all(
        not np.array_equal(outs[k], outs[k - 1])
        for k in range(1, len(outs))
        if not np.array_equal(refs[k], refs[k - 1])
    )
    worst = int(np.argmax([e - b for e, b in zip(errs, bounds)])) if errs else 0
    return {
        "checked_calls": len(calls),
        "nan_outputs": int(sum(np.isnan(o).sum() for o in calls)),
        "worst_call": worst,
        "max_abs_err": max(
            (float(np.abs(o - refs[k % n]).max()) for k, o in enumerate(calls) if o.size),
            default=0.0,
        ),
        "max_rel_err": max(errs, default=0.0),
        "worst_bound": bounds[worst] if bounds else None,
        "new_inputs_new_outputs": distinct,
        "correct": bool(all(e <= b for e, b in zip(errs, bounds)) and distinct),
    }


def _more_rounds(rows: dict, timers: dict, args: argparse.Namespace) -> None:
    """Time the loaded variants ``args.rounds - 1`` more times, in turn (A B A B: two libraries
    loaded one after the other differed by up to 5% on an H200 with the same kernels), and
    report the median over the rounds' medians and each round's median."""
    for vname in timers:
        rows[vname]["round_ms"] = [rows[vname]["median_ms"]]
    for _ in range(max(args.rounds - 1, 0)):
        if time.time() > args.deadline:
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


def units(results: dict) -> list[tuple[str, str, dict]]:
    """(model, unit label, its result) for every model and unit (a dtype at a batch: ``fp32``,
    ``fp32 b16``) of a gpu_check result; a model that failed before its units (or a result of
    the float32-only format) as one unit."""
    out = []
    for name, res in results["models"].items():
        out += [(name, dtype, r) for dtype, r in res.get("dtypes", {}).items()]
        if "error" in res or "dtypes" not in res:
            out.append((name, "fp32" if "variants" in res else "-", res))
    return out


def table(results: dict) -> str:
    """The markdown table of a gpu_check result, a row per model, dtype and batch: medians (ms),
    ratios, plus's error against the dtype's reference (torch eager in strict fp32; a float64
    run in bf16 / fp16, where torch eager's own error is the next column), the widest spread of
    plus's timing rounds, and whether plus and TVM's own pipeline were correct (TVM's baseline
    is reported, never fixed up)."""
    rows = [
        "| model | dtype | batch | plus off | plus always | plus auto | plus gir | TVM | torch "
        "| compile | compile ro | auto vs off | always vs off | gir vs always | auto vs torch "
        "| auto vs compile | auto vs compile ro | plus max rel err | torch rel err "
        "| round spread | plus correct | TVM correct |",
        "|---|---|---:|" + "---:|" * 17 + "---|---|",
    ]
    for name, label, res in units(results):
        dtype, batch = split_label(label) if label != "-" else ("-", "-")
        v, p = res.get("variants", {}), res.get("peers", {})
        if not v:
            rows.append(
                f"| {name} | {dtype} | {batch} | {res.get('error', 'no result')} |" + " |" * 18
            )
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
        torch_errs = res.get("torch_rel_err")
        cells.append(f"{max(torch_errs):.1e}" if torch_errs else "-")
        cells.append(f"{max(spreads):.1%}" if spreads else "-")
        cells.append(_yes(all(r.get("correct") for r in plus.values())))
        cells.append(_yes(v["tvm"].get("correct")) if "tvm" in v else "-")
        rows.append(f"| {name} | {dtype} | {batch} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def kernel_table(results: dict, a: str, b: str, top: int = 8) -> str:
    """Per model and dtype, the ``top`` kernels by time under variant ``a`` with their time
    under ``b`` (same kernel name: same fusion, another schedule), and the totals."""
    rows = [
        f"| model | dtype | kernel | {a} ms | {b} ms | {a} / {b} |",
        "|---|---|---|---:|---:|---:|",
    ]
    for name, dtype, res in units(results):
        va = res.get("variants", {}).get(a, {}).get("kernel_ms") or {}
        vb = res.get("variants", {}).get(b, {}).get("kernel_ms") or {}
        both = sorted(set(va) & set(vb), key=lambda k: -va[k])
        if not both:
            continue
        head = f"| {name} | {dtype} |"
        for k in both[:top]:
            rows.append(f"{head} {k} | {va[k]:.4f} | {vb[k]:.4f} | {_ratio(vb[k], va[k])} |")
        ta, tb = sum(va[k] for k in both), sum(vb[k] for k in both)
        rows.append(f"{head} all {len(both)} | {ta:.4f} | {tb:.4f} | {_ratio(tb, ta)} |")
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
        "--dtypes", default="", help="comma-separated subset of the bundle's dtypes (default: all)"
    )
    parser.add_argument(
        "--batches", default="", help="comma-separated subset of the bundle's batch sizes"
    )
    parser.add_argument(
        "--profile",
        type=int,
        nargs="?",
        const=20,
        default=0,
        metavar="N",
        help="also profile N inferences (default 20) of every variant and peer under "
        "torch.profiler: kernels per inference by kind, busy time, idle gaps (OUT/profile.md)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="go on from OUT/gpu_check.json: skip what it holds, record the model and dtype "
        "that was running as crashed (run.sh resumes after the process dies of a signal)",
    )
    parser.add_argument(
        "--kernels",
        default="",
        help="variants whose TIR kernels are also timed one by one (comma-separated); the "
        "first two are compared kernel by kernel in OUT/kernels.md",
    )
    parser.add_argument(
        "--no-calibrate",
        action="store_true",
        help="skip the CUDA-graph cost calibration run first (OUT/graph_costs.json)",
    )
    args = parser.parse_args(argv)
    args.peers = [p for p in args.peers.split(",") if p]
    args.kernels = [v for v in args.kernels.split(",") if v]
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    try:
        args.batches = [int(b) for b in args.batches.split(",") if b]
    except ValueError:
        print(f"gpu_check: --batches {args.batches!r}: give integers", file=sys.stderr)
        return 2
    if args.profile < 0:
        print("gpu_check: --profile N: give a positive number of inferences", file=sys.stderr)
        return 2
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

    chosen = [m for m in args.models.split(",") if m] or list(manifest["models"])
    missing = [m for m in chosen if m not in manifest["models"]]
    if missing:
        print(f"gpu_check: {', '.join(missing)} not in the bundle", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    out_json = os.path.join(args.out, "gpu_check.json")
    results = {
        "device": torch.cuda.get_device_name(0),
        "versions": {
            "torch": torch.__version__,
            "tvm": tvm.__version__,
            "runtime_only": not plus_tvm.compiler_available(),
        },
        "bundle": {k: manifest[k] for k in ("created", "target", "versions")},
        "rel_tol": REL_TOL,
        "half_contract": {"torch_factor": accuracy.TORCH_FACTOR, "floor": accuracy.FLOOR},
        "started": time.time(),
        "models": {},
    }
    if not args.resume and not args.no_calibrate:  # first: the CUDA-graph costs of this GPU
        results["calibration"] = calibrate_first(args.bundle, args.out)
    args.skip = {}
    if args.resume and os.path.exists(out_json):
        with open(out_json) as f:
            results = json.load(f)
        args.skip = resume(results)
    args.deadline = results["started"] + args.budget  # (wall clock: it spans a resumed run)

    def save() -> None:
        with open(out_json, "w") as f:
            json.dump(results, f, indent=1)

    for name in chosen:
        prior = results["models"].get(name, {})

        def done(dtype: str, res: dict | None, name: str = name, prior: dict = prior) -> None:
            if res is None:
                results["running"] = [name, dtype]
            else:
                results.pop("running", None)
                merged = {**res, "dtypes": {**prior.get("dtypes", {}), **res["dtypes"]}}
                results["models"][name] = merged
            save()

        try:
            _check_model(name, manifest["models"][name], args.bundle, args, done)
        except Exception as err:  # noqa: BLE001 - one model failing must not hide the others
            results["models"][name] = {
                **prior,
                "error": f"{type(err).__name__}: {err}",
                "traceback": traceback.format_exc(limit=8),
            }
            results.pop("running", None)
            print(f"[gpu_check] {name}: FAILED {err}", flush=True)
        save()
    text = table(results)
    with open(os.path.join(args.out, "gpu_check.md"), "w") as f:
        f.write(text + "\n")
    if len(args.kernels) >= 2:
        with open(os.path.join(args.out, "kernels.md"), "w") as f:
            f.write(kernel_table(results, args.kernels[0], args.kernels[1]) + "\n")
    if args.profile:
        from plus_tvm.gpu.profile import profile_table

        with open(os.path.join(args.out, "profile.md"), "w") as f:
            f.write(profile_table(profile_rows(results)) + "\n")
    print(text)
    failed = plus_failures(results)
    if failed:
        print(f"gpu_check: plus not correct: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def calibrate_first(bundle: str, out: str, timeout: float = 180.0) -> dict:
    """Run the CUDA-graph calibration (:mod:`plus_tvm.gpu.calibrate_graph`) on the bundle's
    ``calibration/`` in a child process (a crash there must not cost the check), writing
    ``OUT/graph_costs.json``: its exit code and summary for the check's JSON."""
    import subprocess

    from plus_tvm.gpu.bundle import CALIBRATION

    libs = os.path.join(bundle, CALIBRATION)
    if not os.path.isdir(libs):
        return {"skipped": f"the bundle has no {CALIBRATION}/ (built before the calibration)"}
    cmd = [sys.executable, "-m", "plus_tvm.gpu.calibrate_graph", "run", "--libs", libs]
    try:
        proc = subprocess.run([*cmd, "--out", out], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"the calibration ran over {timeout:.0f} s"}
    print(proc.stdout + proc.stderr[-2000:], end="", flush=True)
    result = {"returncode": proc.returncode, "summary": proc.stdout.strip().splitlines()}
    if proc.returncode != 0:
        result["stderr"] = proc.stderr[-2000:]
    return result


def plus_failures(results: dict) -> list[str]:
    """The models and dtypes (``name dtype``) where a plus variant failed or was wrong (TVM's
    own pipeline is a baseline: its wrong outputs are in the table, not a failure)."""
    return [
        f"{name} {dtype}"
        for name, dtype, r in units(results)
        if "error" in r
        or not all(v.get("correct") for k, v in r["variants"].items() if k.startswith("plus"))
    ]


if __name__ == "__main__":
    sys.exit(main())
