"""Issue 38's generation table on the GPU machine: compile here, generate there.

Here (full TVM), :func:`build_lms` compiles :func:`plus_tvm.compile_lm` for each LM and dtype
(``fp32``, ``bf16``) for a target (``cuda`` sm_90 in the bundle) and writes each with
:func:`plus_tvm.export_lm`, weights external, into ``BUNDLE/lms/NAME/DTYPE/``; the manifest
keeps the LM's reference, seed and a fingerprint of its float32 weights.

There (TVM's runtime library alone), :func:`run` (``run.sh OUT --lm``) rebuilds each LM from
its reference and seed, checks the fingerprint, and runs every backend in its own process
(``python -m plus_tvm.lm.gpu_bench worker ...``): ``plus`` (:func:`plus_tvm.load_lm` and
``CompiledLM.generate``), ``eager`` (transformers' ``generate``, dynamic cache) and
``compile`` (transformers' static-cache recipe: ``cache_implementation="static"`` and
``model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)``).
Per batch: greedy, end of sequence ignored, prompt ``--prompt`` random ids (the same in every
process), prefill = ``generate`` of 1 token, decode per token = ``(t(N) - t(1)) / (N - 1)``,
each the median of ``--repeat`` calls, every call ending in a device synchronisation; the
tokens of ``generate(N)`` compared with eager's (equal, or the first differing new token per
sequence); the KV cache's bytes; beside each decode figure the physical bound, the weights'
bytes / the device's copy bandwidth (``2 x bytes / time`` of a 1 GiB device-to-device copy,
measured in the same run). The plus worker reports its load time (the CUDA source is compiled
with NVRTC when the libraries load) and its first call. Jobs run in priority order (plus and
eager of every LM and dtype, then the compiled peers) within ``--budget`` seconds: a job that
cannot start in time is reported as skipped, one that runs out of time is stopped and keeps
the batches it finished. Output: ``OUT/lm_bench.json`` and ``OUT/lm_bench.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import traceback

REFERENCES = {"gpt2": "zoo:gpt2", "llama-150m": "arch:llama-150m"}
BACKENDS = ("plus", "eager", "compile")
# seconds a job needs at least to be worth starting (imports, load, one batch)
MIN_START_S = {"plus": 45.0, "eager": 25.0, "compile": 90.0}
RESERVE_S = 8.0  # kept for writing the report after the last job
TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def reference(name: str) -> str:
    """``zoo:NAME`` / ``arch:NAME`` of a bundle LM name (``gpt2``, ``llama-150m``, or a
    reference itself)."""
    if ":" in name:
        return name
    if name in REFERENCES:
        return REFERENCES[name]
    from ..errors import UnknownModelError

    raise UnknownModelError(
        f"LM {name!r}: give one of {', '.join(REFERENCES)} or zoo:NAME / arch:NAME"
    )


def folder_name(name: str) -> str:
    return name.replace(":", "-")


# ----------------------------------------------------------------------------------- here


def build_lms(
    out: str,
    names: list[str],
    dtypes: list[str],
    target: object,
    max_batch: int = 8,
    max_length: int = 256,
    log: object = print,
    seed: int = 0,
) -> dict:
    """Compile and export every LM of ``names`` in each of ``dtypes`` for ``target`` under
    ``out/lms/NAME/DTYPE/`` (:func:`compile_unit`), each in a child process (a compiler crash
    is recorded, the rest go on). Returns the manifest's ``lms`` record."""
    from ..gpu.bundle import folder_bytes, run_child

    record: dict = {}
    for name in names:
        entry = lm_record(reference(name), seed, max_batch, max_length)
        for dtype in dtypes:
            folder = os.path.join(out, "lms", folder_name(name), dtype)
            os.makedirs(folder, exist_ok=True)
            result = os.path.join(out, "lms", f".{folder_name(name)}-{dtype}.json")
            cmd = [sys.executable, "-m", "plus_tvm.lm.gpu_bench", "compile", entry["reference"]]
            cmd += [dtype, json.dumps(target), folder, result, str(max_batch), str(max_length)]
            done = run_child([*cmd, str(seed)], result, ["lm"])["lm"]
            if os.path.exists(result):
                os.remove(result)
            if "error" not in done:
                done["folder"] = os.path.relpath(folder, out)
                done["bytes"] = folder_bytes(folder)
            entry["dtypes"][dtype] = done
            what = done.get("error") or f"{done['compile_s']} s, {done['bytes'] / 2**20:.2f} MiB"
            log(f"[gpu_bundle] lm {name} {dtype}: {what}")
        record[name] = entry
    return record


def lm_record(ref: str, seed: int, max_batch: int, max_length: int) -> dict:
    """The manifest's record of one LM (its units under ``dtypes`` to be added): the reference
    and seed it is rebuilt from on the GPU side and a fingerprint of its float32 weights."""
    from ..gpu.bundle import fingerprint
    from .models import load_causal_lm, parameter_count

    model = load_causal_lm(ref, seed=seed)  # (an unknown name fails before any compile)
    return {
        "reference": ref,
        "seed": seed,
        "parameters": parameter_count(model),
        "fingerprint": fingerprint(model.state_dict()),
        "max_batch": max_batch,
        "max_length": max_length,
        "dtypes": {},
    }


def compile_unit(
    ref: str, dtype: str, target: object, folder: str, max_batch: int, max_length: int, seed: int
) -> tuple[object, dict]:
    """``compile_lm`` of ``ref`` in ``dtype`` for ``target``, exported to ``folder`` with
    external weights: the CompiledLM and the unit's record (or ``{"error": ...}``)."""
    import plus_tvm

    from ..errors import InternalCompileError, PlusError

    start = time.perf_counter()
    try:
        model = _model(ref, seed, dtype)
        lm = plus_tvm.compile_lm(model, target, max_batch=max_batch, max_length=max_length)
        plus_tvm.export_lm(lm, folder, weights="external")
    except (PlusError, InternalCompileError) as err:
        return None, {"error": f"{type(err).__name__}: {err}"}
    stats = lm.stats
    graphs = stats["decode"].get("cuda_graph") or {}
    return lm, {
        "folder": folder,
        "compile_s": round(time.perf_counter() - start, 1),
        "max_batch": lm.max_batch,
        "max_length": lm.max_length,
        "kv_bytes_per_token": stats["kv_cache"]["bytes_per_token"],
        "decode_buckets": stats.get("decode_buckets"),
        "kernels": {s: stats[s].get("kernels") for s in ("prefill", "decode")},
        "library_calls": {s: stats[s].get("library_calls") for s in ("prefill", "decode")},
        "decode_cuda_graph": {
            k: graphs.get(k) for k in ("mode", "regions", "kernels", "kernels_captured")
        },
    }


def _compile_child(argv: list[str]) -> int:
    """REF DTYPE TARGET_JSON FOLDER RESULT MAX_BATCH MAX_LENGTH SEED (:func:`build_lms`)."""
    ref, dtype, target, folder, result, max_batch, max_length, seed = argv
    _, rec = compile_unit(
        ref, dtype, json.loads(target), folder, int(max_batch), int(max_length), int(seed)
    )
    with open(result, "w") as f:
        json.dump({"lm": rec}, f, default=str)
    return 0


def _model(ref: str, seed: int, dtype: str) -> object:
    """The LM ``ref`` from ``seed`` (float32, built on the CPU) in ``dtype``."""
    import torch

    from .models import load_causal_lm

    model = load_causal_lm(ref, seed=seed)
    return model if dtype == "fp32" else model.to(getattr(torch, TORCH_DTYPES[dtype]))


# ---------------------------------------------------------------------------------- there


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["compile"]:
        return _compile_child(argv[1:])
    if argv[:1] == ["worker"]:
        return _worker_main(argv[1:])
    if argv[:1] == ["run"]:
        argv = argv[1:]
    p = argparse.ArgumentParser(description="issue 38's generation table from a GPU bundle")
    p.add_argument("--bundle", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--lm", action="store_true", help="(run.sh's switch to this table)")
    p.add_argument("--models", default="", help="comma-separated subset of the bundle's LMs")
    p.add_argument("--dtypes", default="", help="comma-separated subset (default: all)")
    p.add_argument("--backends", default=",".join(BACKENDS))
    p.add_argument("--batches", default="1,8")
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--budget", type=float, default=540.0, help="seconds for everything")
    p.add_argument("--device", default="cuda", help="cuda (the GPU machine) or cpu (tests)")
    args = p.parse_args(argv)
    backends = _split(args.backends)
    bad = [b for b in backends if b not in BACKENDS]
    if bad:
        print(f"gpu_bench: unknown backend(s) {bad}; known: {', '.join(BACKENDS)}", file=sys.stderr)
        return 2
    try:
        batches = [int(b) for b in _split(args.batches)]
    except ValueError:
        print(f"gpu_bench: --batches {args.batches!r}: give integers", file=sys.stderr)
        return 2
    if args.new_tokens < 2 or args.prompt < 2 or args.repeat < 1:
        print("gpu_bench: --new-tokens and --prompt >= 2, --repeat >= 1", file=sys.stderr)
        return 2
    return run(args, backends, batches)


def _split(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def run(args: argparse.Namespace, backends: list[str], batches: list[int]) -> int:
    start = time.time()
    deadline = start + args.budget
    with open(os.path.join(args.bundle, "manifest.json")) as f:
        manifest = json.load(f)
    lms = manifest.get("lms") or {}
    chosen = _split(args.models) or list(lms)
    missing = [m for m in chosen if m not in lms]
    if missing:
        print(f"gpu_bench: {', '.join(missing)} not in the bundle's LMs", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    report: dict = {
        "settings": {
            "prompt": args.prompt,
            "new_tokens": args.new_tokens,
            "repeat": args.repeat,
            "batches": batches,
            "budget_s": args.budget,
            "device": args.device,
        },
        "environment": _environment(args.device),
        "bandwidth": bandwidth(args.device),
        "models": {},
        "jobs": [],
    }
    units = []
    for name in chosen:
        entry = lms[name]
        report["models"][name] = {
            "reference": entry["reference"],
            "parameters": entry.get("parameters"),
            "weights_match_bundle": _fingerprint_check(entry),
        }
        for dtype, unit in entry["dtypes"].items():
            if _split(args.dtypes) and dtype not in _split(args.dtypes):
                continue
            units.append((name, dtype, unit))
    jobs = [(u, b) for u in units for b in backends if b != "compile"]
    jobs += [(u, "compile") for u in units if "compile" in backends]
    for (name, dtype, unit), backend in jobs:
        job = {"model": name, "dtype": dtype, "backend": backend}
        left = deadline - time.time() - RESERVE_S
        if "error" in unit and backend == "plus":
            job["error"] = f"not in the bundle: {unit['error']}"
        elif left < MIN_START_S[backend]:
            job["skipped"] = (
                f"budget: {left:.0f} s left, {backend} needs {MIN_START_S[backend]:.0f}"
            )
        else:
            job.update(_spawn(args, lms[name], name, dtype, unit, backend, batches, left))
        report["jobs"].append(job)
        _log(job)
        _save(args.out, report)
    report["rows"] = rows(report)
    report["elapsed_s"] = round(time.time() - start, 1)
    _save(args.out, report)
    text = table(report)
    with open(os.path.join(args.out, "lm_bench.md"), "w") as f:
        f.write(text + "\n")
    print(text, flush=True)
    bad = [j for j in report["jobs"] if j["backend"] == "plus" and "error" in j]
    differ = [r for r in report["rows"] if r["backend"] == "plus" and r.get("dtype") == "fp32"]
    differ = [r for r in differ if r.get("tokens_equal") is False]
    return 1 if bad or differ else 0


def _log(job: dict) -> None:
    what = job.get("error") or job.get("skipped") or f"{len(job.get('cases', []))} batch(es)"
    print(f"[gpu_bench] {job['model']} {job['dtype']} {job['backend']}: {what}", flush=True)


def _save(out: str, report: dict) -> None:
    with open(os.path.join(out, "lm_bench.json"), "w") as f:
        json.dump(report, f, indent=1)


def _environment(device: str) -> dict:
    import torch

    import plus_tvm

    env = {"torch": torch.__version__, "runtime_only": not plus_tvm.compiler_available()}
    if device == "cuda":
        env["gpu"] = torch.cuda.get_device_name(0)
    return env


def bandwidth(device: str, megabytes: int | None = None, repeat: int = 10) -> dict:
    """The device's copy bandwidth: ``2 x bytes / time`` of ``dst.copy_(src)`` (a copy reads
    and writes its bytes), median of ``repeat`` copies after two warm-ups."""
    import torch

    megabytes = megabytes or (1024 if device.startswith("cuda") else 256)
    src = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    times = []
    for i in range(repeat + 2):
        _sync(device)
        t = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        if i >= 2:
            times.append(time.perf_counter() - t)
    seconds = statistics.median(times)
    del src, dst
    return {
        "bytes": megabytes * 2**20,
        "copy_gb_per_s": round(2 * megabytes * 2**20 / seconds / 1e9, 1),
    }


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def _fingerprint_check(entry: dict) -> bool:
    """Whether the LM rebuilt here from its reference and seed has the bundle's weights."""
    import numpy as np

    from ..gpu.bundle import fingerprint
    from .models import load_causal_lm

    got = fingerprint(load_causal_lm(entry["reference"], seed=entry["seed"]).state_dict())
    want = entry["fingerprint"]
    return set(got) == set(want) and all(
        np.allclose(got[k], want[k], rtol=1e-6, atol=1e-9) for k in want
    )


def _spawn(
    args: argparse.Namespace,
    entry: dict,
    name: str,
    dtype: str,
    unit: dict,
    backend: str,
    batches: list[int],
    seconds: float,
) -> dict:
    """One backend's worker process, stopped after ``seconds``; its result (the batches it
    finished, if stopped)."""
    result = os.path.join(args.out, f".{folder_name(name)}-{dtype}-{backend}.json")
    if os.path.exists(result):
        os.remove(result)
    spec = {
        "backend": backend,
        "reference": entry["reference"],
        "seed": entry["seed"],
        "dtype": dtype,
        "folder": os.path.join(args.bundle, unit["folder"]) if "folder" in unit else None,
        "device": args.device,
        "batches": [b for b in batches if b <= int(unit.get("max_batch", entry["max_batch"]))],
        "prompt": args.prompt,
        "new_tokens": args.new_tokens,
        "repeat": args.repeat,
        "result": result,
    }
    cmd = [sys.executable, "-m", "plus_tvm.lm.gpu_bench", "worker", json.dumps(spec)]
    began = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds)
        rc, err = proc.returncode, proc.stderr
    except subprocess.TimeoutExpired as stopped:
        rc, err = None, (stopped.stderr or b"")
        err = err.decode(errors="replace") if isinstance(err, bytes) else err
    out: dict = {"wall_s": round(time.perf_counter() - began, 1)}
    if os.path.exists(result):
        with open(result) as f:
            out.update(json.load(f))
        os.remove(result)
    if rc is None:
        out["stopped"] = f"out of budget after {seconds:.0f} s"
    elif rc != 0 and "error" not in out:
        tail = (err or "").strip().splitlines()[-8:]
        out["error"] = f"worker exit {rc}: " + " | ".join(tail)
    return out


# --------------------------------------------------------------------------------- worker


def _worker_main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    result: dict = {"cases": []}

    def save() -> None:
        with open(spec["result"], "w") as f:
            json.dump(result, f)

    try:
        run_backend(spec, result, save)
    except Exception as err:  # noqa: BLE001 - reported in the table, the other jobs go on
        result["error"] = f"{type(err).__name__}: {err}"
        result["traceback"] = traceback.format_exc(limit=8)
    save()
    return 0


def run_backend(spec: dict, result: dict, save: object = lambda: None) -> dict:
    """Time one backend on every batch of ``spec`` (see :func:`_spawn`), filling ``result``
    (``cases``: one per batch, saved after each)."""
    import torch

    from .bench import hf_runner, median_s
    from .models import weight_bytes

    device, backend, n = spec["device"], spec["backend"], spec["new_tokens"]
    prompt = spec["prompt"]
    start = time.perf_counter()
    model = _model(spec["reference"], spec["seed"], spec["dtype"])
    result["weight_bytes"] = weight_bytes(model)
    vocab = model.get_input_embeddings().num_embeddings
    if backend == "plus":
        import plus_tvm

        t = time.perf_counter()
        lm = plus_tvm.load_lm(spec["folder"], weights=model, device=device)
        result["load_s"] = round(time.perf_counter() - t, 2)  # (NVRTC compiles the CUDA here)
    else:
        model = model.to(device)
        if backend == "compile":
            model.generation_config.cache_implementation = "static"
            model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    save()
    for batch in spec["batches"]:
        gen = torch.Generator().manual_seed(spec["seed"] + batch)  # (the same everywhere)
        ids = torch.randint(0, vocab, (batch, prompt), generator=gen)
        mask = torch.ones_like(ids)
        if backend == "plus":

            def make(k: int, ids: torch.Tensor = ids, mask: torch.Tensor = mask) -> object:
                return lambda: lm.generate(ids, k, attention_mask=mask, eos_token_id=[])

        else:
            ids, mask = ids.to(device), mask.to(device)
            fields = {}
            if backend == "compile":  # one cache shape for every call: no recompiles
                torch._dynamo.reset()
                fields = {"cache_implementation": "static", "max_cache_len": prompt + n}
            make = hf_runner(model, ids, mask, **fields)

        def synced(run: object) -> object:
            def call() -> object:
                out = run()
                _sync(device)
                return out

            return call

        t = time.perf_counter()
        synced(make(n if backend == "compile" else 2))()  # warm-up (compile: the compiles)
        first_s = time.perf_counter() - t
        synced(make(1))()
        one = median_s(synced(make(1)), spec["repeat"])
        many = median_s(synced(make(n)), spec["repeat"])
        tokens = synced(make(n))()
        case = {
            "batch": batch,
            "prefill_ms": round(one * 1e3, 3),
            "decode_ms_per_token": round((many - one) / (n - 1) * 1e3, 3),
            "warmup_s": round(first_s, 2),
            "tokens": tokens[:, prompt:].tolist() if backend == "plus" else None,
        }
        if backend == "plus":
            per_token = lm.stats["kv_cache"]["bytes_per_token"]
            case["kv_cache_bytes"] = per_token * batch * (prompt + n)
        else:
            out = hf_runner(model, ids, mask, return_dict_in_generate=True, **fields)(n)()
            case["tokens"] = out.sequences[:, prompt:].tolist()
            case["kv_cache_bytes"] = cache_bytes(getattr(out, "cache", None) or out.past_key_values)
        result["cases"].append(case)
        save()
    result["worker_s"] = round(time.perf_counter() - start, 1)
    return result


def cache_bytes(cache: object) -> int:
    """Bytes of the keys and values a transformers cache holds (static: its whole capacity)."""
    import torch

    total = 0
    for layer in getattr(cache, "layers", []):
        for tensor in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(tensor, torch.Tensor):
                total += tensor.nbytes
    return total


# ---------------------------------------------------------------------------------- table


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two token lists differ (None: equal)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def rows(report: dict) -> list[dict]:
    """One row per model, dtype, backend and batch (a job that failed or was skipped: one row
    saying so), with plus's ratios to the peers, the bound and the token check."""
    gbs = (report.get("bandwidth") or {}).get("copy_gb_per_s")
    out = []
    eager = {}
    for job in report["jobs"]:
        if job["backend"] == "eager":
            for case in job.get("cases", []):
                eager[(job["model"], job["dtype"], case["batch"])] = case
    for job in report["jobs"]:
        key = {k: job[k] for k in ("model", "dtype", "backend")}
        note = job.get("error") or job.get("skipped")
        if not job.get("cases"):
            out.append({**key, "note": note or job.get("stopped") or "no batch finished"})
            continue
        for case in job["cases"]:
            row = {
                **key,
                "batch": case["batch"],
                "prefill_ms": case["prefill_ms"],
                "decode_ms_per_token": case["decode_ms_per_token"],
                "bound_ms": round(job["weight_bytes"] / (gbs * 1e9) * 1e3, 3) if gbs else None,
                "kv_cache_bytes": case.get("kv_cache_bytes"),
                "warmup_s": case.get("warmup_s"),
                "load_s": job.get("load_s"),
            }
            ref = eager.get((job["model"], job["dtype"], case["batch"]))
            if job["backend"] != "eager" and ref is not None:
                first = [first_difference(a, b) for a, b in zip(case["tokens"], ref["tokens"])]
                row["tokens_equal"] = all(f is None for f in first)
                row["first_difference"] = first
            if job.get("stopped") or job.get("error"):
                row["note"] = job.get("stopped") or job.get("error")
            out.append(row)
    for row in out:
        if row["backend"] != "plus" or "decode_ms_per_token" not in row:
            continue
        for peer in ("eager", "compile"):
            other = next(
                (
                    r
                    for r in out
                    if r["backend"] == peer
                    and "decode_ms_per_token" in r
                    and all(r[k] == row[k] for k in ("model", "dtype", "batch"))
                ),
                None,
            )
            mine = row["decode_ms_per_token"]
            if other and mine > 0:
                row[f"x_{peer}"] = round(other["decode_ms_per_token"] / mine, 2)
    return out


def table(report: dict) -> str:
    """The markdown table of :func:`rows`."""

    def num(value: object, spec: str = ".2f") -> str:
        return format(value, spec) if isinstance(value, (int, float)) else "-"

    s = report["settings"]
    bw = (report.get("bandwidth") or {}).get("copy_gb_per_s")
    lines = [
        f"{report['environment'].get('gpu', s['device'])}: prompt {s['prompt']}, "
        f"{s['new_tokens']} new tokens, greedy, median of {s['repeat']} calls, each backend "
        f"in its own process; copy bandwidth {bw} GB/s (bound = weight bytes / bandwidth)",
        "",
        "| model | dtype | batch | backend | prefill ms | decode ms/token | bound ms | "
        "x eager | x compile | KV MiB | tokens vs eager | load s | note |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in report["rows"]:
        if "decode_ms_per_token" not in r:
            lines.append(
                f"| {r['model']} | {r['dtype']} | | {r['backend']} | | | | | | | | | "
                f"{_first_line(r['note'], 160)} |"
            )
            continue
        if "tokens_equal" not in r:
            tokens = "-"
        elif r["tokens_equal"]:
            tokens = "equal"
        else:
            tokens = "first differs at " + ",".join(
                "=" if f is None else str(f) for f in r["first_difference"]
            )
        kv = r.get("kv_cache_bytes")
        lines.append(
            f"| {r['model']} | {r['dtype']} | {r['batch']} | {r['backend']} "
            f"| {num(r['prefill_ms'])} | {num(r['decode_ms_per_token'], '.3f')} "
            f"| {num(r['bound_ms'], '.3f')} | {num(r.get('x_eager'))} | {num(r.get('x_compile'))} "
            f"| {num(kv / 2**20 if kv else None, '.1f')} | {tokens} "
            f"| {num(r.get('load_s'), '.1f')} | {_first_line(r.get('note'), 120)} |"
        )
    lines.append("")
    lines.append(f"elapsed {report.get('elapsed_s')} s of a {s['budget_s']:.0f} s budget")
    return "\n".join(lines)


def _first_line(text: object, width: int) -> str:
    lines = str(text or "").strip().splitlines()
    return lines[0][:width].replace("|", "/") if lines else ""


if __name__ == "__main__":
    sys.exit(main())
