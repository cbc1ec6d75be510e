"""Per-token decode of ``compile_lm`` at full size, one model, dtype and batch per process:
wall and CPU time per token, and (``--profile``) where a decode step's time goes.

Timing: ``generate`` of 1 and of ``--new-tokens`` tokens after a warm-up, decode per token
``(t(N) - t(1)) / (N - 1)`` (as ``scripts/bench_generate.py``), median of ``--repeat``; the
CPU time (user + sys of the process, all threads) the same way, robust to a shared machine.
``--profile``: a VM instrument times every call of the decode function (a TIR kernel, a library
call, a VM builtin) over the decode steps of one ``generate`` and sums it by name per step
(the instrument adds a few microseconds per call; the step's other time is the Python loop).

    .venv/bin/python scripts/profile_decode_step.py --model arch:llama-150m --dtype bfloat16 \
        --batch 1 [--profile]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch


def cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def timed(run, repeat: int) -> tuple[float, float]:
    """Median wall and CPU seconds of ``repeat`` calls of ``run``."""
    wall, cpu = [], []
    for _ in range(repeat):
        c, w = cpu_s(), time.perf_counter()
        run()
        wall.append(time.perf_counter() - w)
        cpu.append(cpu_s() - c)
    return statistics.median(wall), statistics.median(cpu)


def profile(lm, ids, mask, n: int) -> list[dict]:
    """Per-name rows ``{"name", "calls", "us"}`` per decode step, slowest first (the VM
    instrument of scripts/bench_decode_families.py), after the generate's ms per token."""
    from bench_decode_families import profile_decode  # (this script's folder is on sys.path)

    head, *rows = profile_decode(lm, ids, mask, n)
    return [{"generate_ms_per_token": round(head["generate_ms"] / n, 3)}, *rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="arch:llama-150m")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import plus_tvm
    from plus_tvm.lm.models import load_causal_lm
    from plus_tvm.runtime import native

    model = load_causal_lm(args.model, seed=0).to(getattr(torch, args.dtype))
    start = time.perf_counter()
    lm = plus_tvm.compile_lm(
        model, max_batch=args.max_batch, max_length=args.prompt + max(args.new_tokens, 128)
    )
    compile_s = time.perf_counter() - start
    vocab = model.get_input_embeddings().num_embeddings
    gen = torch.Generator().manual_seed(args.batch)
    ids = torch.randint(0, vocab, (args.batch, args.prompt), generator=gen)
    mask = torch.ones_like(ids)
    n = args.new_tokens
    result: dict = {
        "model": args.model,
        "dtype": args.dtype,
        "batch": args.batch,
        "compile_s": round(compile_s, 1),
        "threads": torch.get_num_threads(),
    }
    if args.profile:
        result["profile"] = profile(lm, ids, mask, n)
        for row in result["profile"][:25]:
            print(row)
    else:

        def run(k):  # noqa: ANN001, ANN202
            return lambda: lm.generate(ids, k, attention_mask=mask, eos_token_id=[])

        run(2)()
        one = timed(run(1), args.repeat)
        many = timed(run(n), args.repeat)
        result["prefill_ms"] = round(one[0] * 1e3, 2)
        result["decode_ms_per_token"] = round((many[0] - one[0]) / (n - 1) * 1e3, 3)
        result["decode_cpu_ms_per_token"] = round((many[1] - one[1]) / (n - 1) * 1e3, 3)
        result["tokens"] = run(n)()[:, args.prompt :].tolist()[0][:16]
    stats = native.status()
    kernels = stats.get("kernels", {})
    result["native_linear"] = {
        k: v for k, v in kernels.get("plus.linear", {}).items() if k in ("calls", "fallbacks")
    }
    gemv = getattr(native, "function", lambda name: None)("gemv_half_stats")  # (an old tree)
    if gemv is not None:
        result["gemv_half"] = json.loads(str(gemv()))
    print(json.dumps({k: v for k, v in result.items() if k != "profile"}))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
