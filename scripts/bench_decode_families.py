"""Decode ms/token of plus (``compile_lm``) against transformers ``generate`` eager, for every
decoder family of ``plus_tvm.arch_suite`` at a mid-size config (issue 38 on models beyond
GPT-2 and LLaMA).

Each family is built from the suite's tiny config with its sizes replaced (``--hidden``,
``--heads``, ``--layers``, ``--intermediate``, ``--vocab``; kv heads keep the suite's ratio to
the query heads, a family with its own ``head_dim`` field gets ``hidden / heads``). Each
backend runs in its own process per family and dtype (this script re-invoked with
``--worker``), the two in alternating order per family; inside it each batch is timed after a
warm-up: prefill = ``generate`` of 1 token, decode = ``(t(N) - t(1)) / (N - 1)``, each the
median of ``--repeat`` calls, greedy, end of sequence ignored. Greedy tokens of plus are
compared with eager's (``=``: equal, else the first differing new-token position). ``--quiet``
runs every worker under ``/work/quiet.sh`` (other python processes paused).

``--profile``: instead of timing, plus's decode step of each family is profiled over the real
decode steps of one ``generate`` (a VM instrument times every call the VM makes: a TIR kernel, a
library call, a builtin) and summed by name per decode step.

    .venv/bin/python scripts/bench_decode_families.py --families falcon,llama --dtypes float32
    .venv/bin/python scripts/bench_decode_families.py --families falcon --profile
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

# families of arch_suite (decoders) and the two extra ones of plus_tvm.lm.models
DEFAULT = (
    "gpt2,llama,mistral,qwen2,qwen3,gemma,phi,phi3,falcon,gpt-neox,opt,bloom,mixtral,stablelm,olmo"
)
# names of the intermediate (MLP) size per config class, where it is not ``intermediate_size``
INTERMEDIATE = {
    "GPT2Config": "n_inner",
    "GPTJConfig": "n_inner",
    "CodeGenConfig": "n_inner",
    "OPTConfig": "ffn_dim",
    "FalconConfig": "ffn_hidden_size",
    "BloomConfig": None,  # 4 x hidden
}


def mid_config(name: str, args: argparse.Namespace) -> object:
    """The transformers config of ``arch:NAME`` at the mid size ``args`` asks for."""
    from plus_tvm.lm.models import arch_config

    tiny = arch_config(name)
    cls = type(tiny)
    amap = getattr(cls, "attribute_map", {})
    fields = {
        "hidden_size": args.hidden,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "vocab_size": args.vocab,
        "max_position_embeddings": max(128, args.prompt + args.new_tokens),
    }
    inter = INTERMEDIATE.get(cls.__name__, "intermediate_size")
    if inter is not None:
        fields[inter] = args.intermediate
    kv = getattr(tiny, "num_key_value_heads", None)
    if isinstance(kv, int) and kv != tiny.num_attention_heads:
        fields["num_key_value_heads"] = max(1, args.heads * kv // tiny.num_attention_heads)
    if getattr(tiny, "head_dim", None) is not None and "head_dim" in tiny.to_dict():
        fields["head_dim"] = args.hidden // args.heads
    for extra in ("word_embed_proj_dim",):  # OPT
        if hasattr(tiny, extra):
            fields[extra] = args.hidden
    if cls.__name__ == "GPT2Config":
        fields.pop("max_position_embeddings")
        fields["n_positions"] = max(128, args.prompt + args.new_tokens)
    mapped = {amap.get(k, k): v for k, v in fields.items()}
    return cls(**{**tiny.to_dict(), **mapped})


def load(name: str, args: argparse.Namespace, dtype: str) -> object:
    import torch
    import transformers

    torch.manual_seed(args.seed)
    model = transformers.AutoModelForCausalLM.from_config(mid_config(name, args)).eval()
    return model.to(getattr(torch, dtype))


def prompts(batch: int, args: argparse.Namespace) -> tuple:
    import torch

    gen = torch.Generator().manual_seed(args.seed + batch)
    ids = torch.randint(3, args.vocab, (batch, args.prompt), generator=gen)
    return ids, torch.ones_like(ids)


# ------------------------------------------------------------------------------ workers


def worker(args: argparse.Namespace) -> dict:
    import torch
    from plus_tvm.lm.bench import hf_runner, median_s, plus_runner, prefill_decode

    model = load(args.model, args, args.dtype)
    batches = [int(b) for b in args.batches.split(",")]
    n = args.new_tokens
    result: dict = {"threads": torch.get_num_threads()}
    if args.worker in ("plus", "profile"):
        import plus_tvm

        start = time.perf_counter()
        lm = plus_tvm.compile_lm(
            model,
            "llvm",
            plus_tvm.Options.from_pairs(args.opt),
            max_batch=max(batches),
            max_length=args.prompt + n,
        )
        result["compile_s"] = round(time.perf_counter() - start, 1)
    if args.worker == "profile":
        result["profile"] = {b: profile_decode(lm, *prompts(b, args), n) for b in batches}
        return result
    cases = []
    for batch in batches:
        ids, mask = prompts(batch, args)
        make = plus_runner(lm, ids, mask) if args.worker == "plus" else hf_runner(model, ids, mask)
        make(2)()
        make(1)()
        one, many = median_s(make(1), args.repeat), median_s(make(n), args.repeat)
        out = make(n)()
        if not isinstance(out, torch.Tensor):
            out = out.sequences
        case = {"batch": batch, **prefill_decode(one, many, n)}
        case["tokens"] = out[:, args.prompt :].tolist()
        cases.append(case)
    result["cases"] = cases
    return result


def profile_decode(lm: object, ids: object, mask: object, n: int) -> list[dict]:
    """Per-name rows ``{"name", "calls", "us"}`` per decode step, slowest first."""
    import collections

    import tvm_ffi

    lm.generate(ids, 2, attention_mask=mask, eos_token_id=[])  # (the decode VM exists now)
    vm = lm.decode._local.vm
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    started: list[float] = []
    steps = [0]

    def instrument(func, symbol, before_run, ret, *rest):
        del func, ret, rest
        if before_run:
            started.append(time.perf_counter())
        else:
            row = totals[str(symbol)]
            row[0] += 1
            row[1] += (time.perf_counter() - started.pop()) * 1e6
        return 0

    vm.set_instrument(tvm_ffi.convert(instrument))
    t0 = time.perf_counter()
    lm.generate(ids, n, attention_mask=mask, eos_token_id=[])
    wall = time.perf_counter() - t0
    steps[0] = n - 1  # decode steps of one generate of n tokens (the first is prefill's)
    vm.set_instrument(tvm_ffi.convert(lambda *a: 0))
    rows = [
        {"name": k, "calls": c / steps[0], "us": us / steps[0]} for k, (c, us) in totals.items()
    ]
    rows.sort(key=lambda r: -r["us"])
    return [{"generate_ms": round(wall * 1e3, 2)}, *rows]


# ------------------------------------------------------------------------------ parent


def spawn(args: argparse.Namespace, kind: str, model: str, dtype: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--out", out]
        cmd += ["--model", model, "--dtypes", dtype]
        for flag in ("batches", "prompt", "new_tokens", "repeat", "seed", "hidden", "heads"):
            cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
        for flag in ("layers", "intermediate", "vocab"):
            cmd += [f"--{flag}", str(getattr(args, flag))]
        cmd += [f"--opt={o}" for o in args.opt]
        if args.quiet:
            cmd = ["/work/quiet.sh", *cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not os.path.exists(out):
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-6:]
            return {"error": " / ".join(tail)[-400:]}
        with open(out) as f:
            return json.load(f)


def first_difference(a: list, b: list) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        for j, (p, q) in enumerate(zip(x, y)):
            if p != q:
                return f"seq {i} @{j}"
    return "="


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", default=DEFAULT)
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=704)
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--backends", default="plus,hf", help="plus, hf (transformers eager)")
    p.add_argument("--quiet", action="store_true", help="each worker under /work/quiet.sh")
    p.add_argument("--profile", action="store_true", help="profile plus's decode step instead")
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--json")
    p.add_argument("--worker", choices=("plus", "hf", "profile"), help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        args.dtype = args.dtypes
        with open(args.out, "w") as f:
            json.dump(worker(args), f)
        return 0
    families = [f for f in args.families.split(",") if f]
    dtypes = [d for d in args.dtypes.split(",") if d]
    print(
        f"hidden {args.hidden}, heads {args.heads} (head_dim {args.hidden // args.heads}), "
        f"layers {args.layers}, intermediate {args.intermediate}, vocab {args.vocab}, prompt "
        f"{args.prompt}, {args.new_tokens} new tokens, median of {args.repeat}",
        flush=True,
    )
    report = []
    if args.profile:
        for fam in families:
            for dt in dtypes:
                r = spawn(args, "profile", fam, dt)
                report.append({"family": fam, "dtype": dt, **r})
                if "error" in r:
                    print(f"{fam} {dt}: ERROR {r['error']}", flush=True)
                    continue
                for batch, rows in r["profile"].items():
                    total = sum(x["us"] for x in rows[1:])
                    print(
                        f"\n{fam} {dt} batch {batch}: {total:.0f} us profiled per decode step "
                        f"(generate {rows[0]['generate_ms']} ms)"
                    )
                    print("| name | calls/step | us/step | share |\n|---|---:|---:|---:|")
                    for x in rows[1 : 1 + args.top]:
                        print(
                            f"| {x['name']} | {x['calls']:.0f} | {x['us']:.1f} | "
                            f"{100 * x['us'] / total:.1f}% |"
                        )
                sys.stdout.flush()
    else:
        print(
            "| family | dtype | batch | plus ms/tok | eager ms/tok | x eager | tokens | "
            "compile s |\n|---|---|---:|---:|---:|---:|---|---:|",
            flush=True,
        )
        for i, fam in enumerate(families):
            for dt in dtypes:
                order = [b for b in ("plus", "hf") if b in args.backends.split(",")]
                order = order if i % 2 == 0 else order[::-1]
                res = {k: spawn(args, k, fam, dt) for k in order}
                report.append({"family": fam, "dtype": dt, **res})
                if any("error" in r for r in res.values()):
                    err = next(r["error"] for r in res.values() if "error" in r)
                    print(f"| {fam} | {dt} | | FAILED: {err[-200:]} | | | | |", flush=True)
                    continue
                hf_cases = res["hf"]["cases"] if "hf" in res else [None] * 8
                for pc, hc in zip(res["plus"]["cases"], hf_cases):
                    if hc is None:  # (plus alone)
                        hc = {"decode_ms_per_token": float("nan"), "tokens": pc["tokens"]}
                    pm, hm = pc["decode_ms_per_token"], hc["decode_ms_per_token"]
                    print(
                        f"| {fam} | {dt} | {pc['batch']} | {pm:.3f} | {hm:.3f} | "
                        f"{hm / pm if pm > 0 else float('nan'):.2f} | "
                        f"{first_difference(pc['tokens'], hc['tokens'])} | "
                        f"{res['plus']['compile_s']} |",
                        flush=True,
                    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
