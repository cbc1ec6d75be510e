"""Text-generation table of issue 38: prefill and per-token decode latency of plus
(``compile_lm``) against transformers' ``generate`` eager and compiled with a static cache.

Usage (full size, as the issue asks; roughly 40-60 minutes on a quiet 2-core machine):
    .venv/bin/python scripts/bench_generate.py --json gen.json
Tiny and quick:
    .venv/bin/python scripts/bench_generate.py --models arch:gpt2 --prompt 8 --new-tokens 4 \
        --batches 1,2 --dtypes float32 --rounds 1 --repeat 1

Every backend runs in its own process (this script re-invoked with ``--worker``), one per
model, dtype and round; inside it, each batch size is timed after a warm-up:
- ``plus``: ``plus_tvm.compile_lm(model, max_batch=max(batches))``, options from ``--opt``;
- ``hf-eager``: ``model.generate`` with its default dynamic cache;
- ``hf-compile``: transformers' documented static-cache recipe,
  ``generation_config.cache_implementation = "static"`` and
  ``model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)``
  (``max_cache_len`` = prompt + new tokens so every call reuses one cache shape); its warm-up
  (the compiles) is excluded from the timings and reported.
Prefill = ``generate`` of 1 new token; decode = ``(t(N) - t(1)) / (N - 1)``; each the median of
``--repeat`` calls; greedy, end of sequence ignored. The process list runs ``--rounds`` times,
each round in the reverse order of the one before (plus, eager, compile, compile, eager,
plus, ...); the table gives the median over rounds and the spread (max / min - 1).

Physical bound: a decode step reads every weight once, so a step takes at least
``weight bytes / copy bandwidth``, the bandwidth measured in its own process at the start of
each round as ``2 x bytes / time`` of ``dst.copy_(src)`` on a 256 MB tensor (a copy reads and
writes its bytes; counting both gives the memory system's rate, so the bound is the lower,
optimistic one). At batch B a step still streams the weights once; the bound is per step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

BACKENDS = ("plus", "hf-eager", "hf-compile")
MODELS = "zoo:gpt2,arch:llama-150m"


def main() -> int:
    args = _parser().parse_args()
    if args.worker:
        return _worker(args)
    backends = _split(args.backends)
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown:
        raise SystemExit(f"--backends: unknown {unknown}; known: {', '.join(BACKENDS)}")
    jobs = [(m, d) for m in _split(args.models) for d in _split(args.dtypes)]
    progress = args.progress or (args.json + ".progress.jsonl" if args.json else None)
    if args.report_only and not (progress and args.resume):
        raise SystemExit("--report-only reads the progress file: give --resume (and --json)")
    done = _load_progress(progress, args) if progress and args.resume else {}
    if progress and not args.resume:
        open(progress, "w").close()
    settings = _settings_key(args)
    bandwidth: list[dict] = []
    runs: list[dict] = []
    for r in range(args.rounds):
        if not args.report_only or (r, "bandwidth", None, None) in done:
            bandwidth.append(
                _landed(
                    done,
                    progress,
                    settings,
                    (r, "bandwidth", None, None),
                    lambda: _spawn(args, "bandwidth", None, None),
                )
            )
        order = backends if r % 2 == 0 else backends[::-1]
        for model, dtype in jobs:
            for backend in order:
                if args.report_only and (r, backend, model, dtype) not in done:
                    continue
                result = _landed(
                    done,
                    progress,
                    settings,
                    (r, backend, model, dtype),
                    lambda b=backend, m=model, d=dtype: _spawn(args, b, m, d),
                )
                runs.append(
                    {"round": r, "backend": backend, "model": model, "dtype": dtype, **result}
                )
                print(
                    f"[bench_generate] round {r} {model} {dtype} {backend}: "
                    f"{'ok' if 'error' not in result else 'ERROR ' + result['error'][:300]}",
                    file=sys.stderr,
                    flush=True,
                )
    gbs = [b["copy_gb_per_s"] for b in bandwidth if "copy_gb_per_s" in b]
    rows = _rows(runs, statistics.median(gbs) if gbs else None)
    checks = _token_checks(runs)
    report = {
        "settings": {k: v for k, v in vars(args).items() if k not in ("worker", "out")},
        "bandwidth": bandwidth,
        "rows": rows,
        "token_checks": checks,
        "runs": runs,
    }
    table = _table(rows, checks, bandwidth, args)
    print(table, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    failed = [r for r in runs if "error" in r]
    return (
        3 if failed or any(c["equal"] is False and c["dtype"] == "float32" for c in checks) else 0
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=MODELS, help="comma-separated zoo:NAME / arch:NAME")
    p.add_argument("--backends", default=",".join(BACKENDS))
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--prompt", type=int, default=128, help="prompt length (random ids)")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeat", type=int, default=3, help="calls per timing (median)")
    p.add_argument("--rounds", type=int, default=2, help="times the process list runs")
    p.add_argument("--target", default="llvm")
    p.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE", help="plus options")
    p.add_argument(
        "--compile-mode", default="reduce-overhead", help="hf-compile's torch.compile mode"
    )
    p.add_argument("--seed", type=int, default=0, help="weights and prompts")
    p.add_argument("--worker-timeout", type=float, default=3600.0)
    p.add_argument("--json", help="write the full report here")
    p.add_argument(
        "--progress",
        help="append each worker's result here as it lands (default: JSON path + .progress.jsonl)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="reuse the results already in the progress file (same settings) and run the rest",
    )
    p.add_argument(
        "--report-only",
        action="store_true",
        help="with --resume: the table of what the progress file holds, running nothing",
    )
    p.add_argument("--worker", choices=(*BACKENDS, "bandwidth"), help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--dtype", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    return p


def _split(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


# ------------------------------------------------------------------------------ the parent

_KEYED_SETTINGS = (
    "batches",
    "prompt",
    "new_tokens",
    "repeat",
    "target",
    "compile_mode",
    "seed",
    "opt",
)


def _settings_key(args: argparse.Namespace) -> dict:
    return {k: getattr(args, k) for k in _KEYED_SETTINGS}


def _load_progress(path: str, args: argparse.Namespace) -> dict:
    """The results of an earlier, interrupted run with the same settings, by (round, worker,
    model, dtype); lines from other settings are ignored, a torn last line is dropped."""
    done: dict = {}
    if not os.path.exists(path):
        return done
    with open(path) as f:
        for line in f:
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            if entry.get("settings") == _settings_key(args) and "error" not in entry["result"]:
                done[tuple(entry["key"])] = entry["result"]
    return done


def _landed(done: dict, path: str | None, settings: dict, key: tuple, run) -> dict:
    """A worker's result: the one already in the progress file, else run it and append it."""
    if key in done:
        print(f"[bench_generate] reused {key} from {path}", file=sys.stderr, flush=True)
        return done[key]
    result = run()
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"key": list(key), "settings": settings, "result": result}) + "\n")
    return result


def _spawn(args: argparse.Namespace, worker: str, model: str | None, dtype: str | None) -> dict:
    """Run one worker process; its JSON result, or ``{"error": ...}`` when it failed."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", worker, "--out", out]
        for flag in ("batches", "prompt", "new_tokens", "repeat", "target", "compile_mode", "seed"):
            cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
        cmd += [f"--opt={o}" for o in args.opt]
        if model is not None:
            cmd += ["--model", model, "--dtype", dtype]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.worker_timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"worker timed out after {args.worker_timeout} s"}
        if proc.returncode != 0 or not os.path.exists(out):
            tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-15:]
            return {"error": f"worker exit {proc.returncode}: " + "\n".join(tail)}
        with open(out) as f:
            return json.load(f)


def _rows(runs: list[dict], gb_per_s: float | None) -> list[dict]:
    """One row per model, dtype, batch and backend (medians over rounds, the spread, the
    bound), and one FAILED row per model, dtype and backend that failed in every round."""
    cases: dict[tuple, list[dict]] = {}
    info: dict[tuple, dict] = {}
    errors: dict[tuple, str] = {}
    for run in runs:
        key = (run["model"], run["dtype"], run["backend"])
        if "error" in run:
            errors.setdefault(key, run["error"])
            continue
        info[key[:2]] = run["model_info"]
        for case in run["cases"]:
            cases.setdefault((*key, case["batch"]), []).append(
                {**case, "compile_s": run.get("compile_s")}
            )
    rows = [
        {"model": m, "dtype": d, "backend": b, "error": e}
        for (m, d, b), e in errors.items()
        if not any(k[:3] == (m, d, b) for k in cases)
    ]
    for (model, dtype, backend, batch), found in cases.items():
        decode = [c["decode_ms_per_token"] for c in found]
        weights = info[(model, dtype)]["weight_bytes"]
        rows.append(
            {
                "model": model,
                "dtype": dtype,
                "batch": batch,
                "backend": backend,
                "parameters": info[(model, dtype)]["parameters"],
                "weight_bytes": weights,
                "prefill_ms": round(statistics.median(c["prefill_ms"] for c in found), 3),
                "decode_ms_per_token": round(statistics.median(decode), 3),
                "decode_rounds": decode,
                "spread": round(max(decode) / min(decode) - 1, 3) if min(decode) > 0 else None,
                "bound_ms": round(weights / (gb_per_s * 1e9) * 1e3, 3) if gb_per_s else None,
                "kv_cache_bytes": found[0]["kv_cache_bytes"],
                "compile_s": found[0]["compile_s"],
            }
        )
    for row in rows:  # plus's speed-up over each peer (decode, same model, dtype, batch)
        if row["backend"] != "plus" or "error" in row:
            continue
        for peer, name in (("hf-eager", "x_eager"), ("hf-compile", "x_compile")):
            other = _find(rows, row, peer)
            if other:  # (None where noise made plus's decode figure <= 0)
                mine = row["decode_ms_per_token"]
                row[name] = round(other["decode_ms_per_token"] / mine, 3) if mine > 0 else None
    return rows


def _find(rows: list[dict], row: dict, backend: str) -> dict | None:
    for other in rows:
        if (
            "error" not in other
            and other["backend"] == backend
            and all(other[k] == row[k] for k in ("model", "dtype", "batch"))
        ):
            return other
    return None


def _token_checks(runs: list[dict]) -> list[dict]:
    """Greedy tokens of plus and hf-compile against hf-eager's, per model, dtype, batch and
    round: equal, or the first differing position (new tokens, per sequence)."""
    eager = {
        (r["round"], r["model"], r["dtype"], c["batch"]): c["tokens"]
        for r in runs
        if r["backend"] == "hf-eager" and "error" not in r
        for c in r["cases"]
    }
    checks = []
    for r in runs:
        if r["backend"] == "hf-eager" or "error" in r:
            continue
        for c in r["cases"]:
            ref = eager.get((r["round"], r["model"], r["dtype"], c["batch"]))
            if ref is None:
                continue
            first = [_first_difference(a, b) for a, b in zip(c["tokens"], ref)]
            checks.append(
                {
                    "round": r["round"],
                    "model": r["model"],
                    "dtype": r["dtype"],
                    "batch": c["batch"],
                    "backend": r["backend"],
                    "equal": all(f is None for f in first),
                    "first_difference": first,
                }
            )
    return checks


def _first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def _table(rows: list[dict], checks: list[dict], bandwidth: list[dict], args) -> str:
    def num(value: object, spec: str = ".2f") -> str:
        return format(value, spec) if isinstance(value, (int, float)) else "-"

    lines = [
        f"prompt {args.prompt}, {args.new_tokens} new tokens, median of {args.repeat} calls, "
        f"{args.rounds} round(s), each backend in its own process",
        "",
        "| model | params | dtype | batch | backend | prefill ms | decode ms/token | spread % | "
        "bound ms | x eager | x compile | KV MB | compile s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if "error" in r:
            lines.append(
                f"| {r['model']} | | {r['dtype']} | | {r['backend']} | FAILED: "
                f"{r['error'].splitlines()[-1][:160]} | | | | | | | |"
            )
            continue
        lines.append(
            f"| {r['model']} | {num(r['parameters'] / 1e6, '.3g')}M | {r['dtype']} | {r['batch']} "
            f"| {r['backend']} | {num(r['prefill_ms'])} | {num(r['decode_ms_per_token'])} "
            f"| {num(r['spread'] * 100 if r['spread'] is not None else None, '.0f')} "
            f"| {num(r['bound_ms'])} | {num(r.get('x_eager'))} | {num(r.get('x_compile'))} "
            f"| {num(r['kv_cache_bytes'] / 2**20, '.1f')} | {num(r['compile_s'], '.1f')} |"
        )
    gbs = [b.get("copy_gb_per_s") for b in bandwidth]
    lines += [
        "",
        f"copy bandwidth (2 x bytes / time, 256 MB, per round): {gbs} GB/s; bound = weight "
        "bytes / median bandwidth, per decode step; goal: x eager >= 2, x compile >= 1.2",
    ]
    for c in checks:
        if not c["equal"]:
            lines.append(
                f"TOKENS DIFFER {c['backend']} vs hf-eager: {c['model']} {c['dtype']} batch "
                f"{c['batch']} round {c['round']}: first differing new token per sequence "
                f"{c['first_difference']}"
            )
    if checks and all(c["equal"] for c in checks):
        lines.append("greedy tokens: every backend equals hf-eager in every case")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ the workers


def _worker(args: argparse.Namespace) -> int:
    result = _bandwidth() if args.worker == "bandwidth" else _generate(args)
    with open(args.out, "w") as f:
        json.dump(result, f)
    return 0


def _bandwidth(megabytes: int = 256, repeat: int = 10) -> dict:
    import torch

    src = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    times = []
    for i in range(repeat + 2):
        start = time.perf_counter()
        dst.copy_(src)
        if i >= 2:  # (two warm-up copies: first touch of dst's pages)
            times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    return {
        "bytes": src.nbytes,
        "copy_gb_per_s": round(2 * src.nbytes / seconds / 1e9, 2),
        "counted": "read + write (2 x bytes)",
        "torch_threads": torch.get_num_threads(),
    }


def _generate(args: argparse.Namespace) -> dict:
    import torch
    from plus_tvm.errors import InternalCompileError, PlusError
    from plus_tvm.lm.bench import hf_runner, median_s, plus_runner, prefill_decode
    from plus_tvm.lm.models import load_causal_lm, parameter_count, weight_bytes

    dtype = getattr(torch, args.dtype)
    model = load_causal_lm(args.model, seed=args.seed).to(dtype)
    batches = [int(b) for b in _split(args.batches)]
    n, prompt = args.new_tokens, args.prompt
    result: dict = {
        "model_info": {
            "parameters": parameter_count(model),
            "weight_bytes": weight_bytes(model),
            "torch_threads": torch.get_num_threads(),
        }
    }
    vocab = model.get_input_embeddings().num_embeddings
    if args.worker == "plus":
        import plus_tvm

        start = time.perf_counter()
        try:
            lm = plus_tvm.compile_lm(
                model,
                args.target,
                plus_tvm.Options.from_pairs(args.opt),
                max_batch=max(batches),
                max_length=prompt + n,
            )
        except (PlusError, InternalCompileError) as e:  # (a FAILED row; the others still run)
            return {**result, "error": f"compile_lm: {type(e).__name__}: {e}"}
        result["compile_s"] = round(time.perf_counter() - start, 2)
    elif args.worker == "hf-compile":
        model.generation_config.cache_implementation = "static"
        model.forward = torch.compile(model.forward, mode=args.compile_mode, fullgraph=True)
    cases = []
    for batch in batches:
        gen = torch.Generator().manual_seed(args.seed + batch)  # (the same prompts everywhere)
        ids = torch.randint(0, vocab, (batch, prompt), generator=gen)
        mask = torch.ones_like(ids)
        fields: dict = {}
        if args.worker == "plus":
            make = plus_runner(lm, ids, mask)
        else:
            if args.worker == "hf-compile":  # one cache shape for every call: no recompiles
                torch._dynamo.reset()  # (each batch compiled afresh, in its own warm-up)
                fields = {"cache_implementation": "static", "max_cache_len": prompt + n}
            make = hf_runner(model, ids, mask, **fields)
        start = time.perf_counter()
        make(n if args.worker == "hf-compile" else min(n, 2))()  # warm-up (hf-compile: compiles)
        make(1)()
        warmup_s = time.perf_counter() - start
        one, many = median_s(make(1), args.repeat), median_s(make(n), args.repeat)
        case = {"batch": batch, **prefill_decode(one, many, n), "warmup_s": round(warmup_s, 2)}
        if args.worker == "plus":  # (untimed: the tokens to compare, the cache's size)
            tokens = make(n)()
            case["kv_cache_bytes"] = lm.stats["kv_cache"]["bytes_per_token"] * batch * (prompt + n)
            case["kv_cache_allocated_bytes"] = lm.stats["kv_cache"]["allocated_bytes"]
        else:
            out = hf_runner(model, ids, mask, return_dict_in_generate=True, **fields)(n)()
            tokens = out.sequences
            case["kv_cache_bytes"] = _cache_bytes(
                getattr(out, "cache", None) or out.past_key_values
            )
        case["tokens"] = tokens[:, prompt:].tolist()
        cases.append(case)
    if args.worker == "hf-compile":
        result["compile_s"] = round(sum(c["warmup_s"] for c in cases), 2)
    result["cases"] = cases
    return result


def _cache_bytes(cache: object) -> int:
    from plus_tvm.lm.gpu_bench import cache_bytes  # (the one definition, shared with the GPU side)

    return cache_bytes(cache)


if __name__ == "__main__":
    sys.exit(main())
