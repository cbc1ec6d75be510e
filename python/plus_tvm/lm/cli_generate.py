"""``plus-tvm generate MODEL --prompt-ids 1,2,3 --max-new-tokens N``: compile a causal LM
with :func:`plus_tvm.compile_lm` and print the generated token ids (``--bench``: prefill and
per-token decode latency against transformers' ``generate``)."""

from __future__ import annotations

import argparse
import json


def add_generate_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate token ids with a causal LM and its KV cache")
    p.add_argument("model", help="zoo:NAME (gpt2, llama, ...) or arch:NAME (a tiny decoder)")
    p.add_argument("--target", default="llvm", help="llvm, cuda or a JSON target dict")
    p.add_argument(
        "--prompt-ids",
        action="append",
        required=True,
        metavar="IDS",
        help="comma-separated token ids; repeat for a batch (shorter ones left-padded)",
    )
    p.add_argument("--max-new-tokens", type=int, required=True)
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--max-length", type=int, default=2048)
    p.add_argument("--do-sample", action="store_true")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0, help="weights and sampling")
    p.add_argument("--eos-token-id", type=int, action="append", help="default: the model's")
    p.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--bench", action="store_true", help="time prefill and decode vs transformers")
    p.add_argument("--repeat", type=int, default=3, help="runs per --bench timing")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def _prompts(texts: list[str], pad: int) -> tuple[object, object]:
    import torch

    from ..errors import InputError

    rows = []
    for text in texts:
        try:
            rows.append([int(t) for t in text.split(",") if t.strip()])
        except ValueError:
            raise InputError(f"--prompt-ids {text!r}: not comma-separated integers") from None
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row) :] = torch.tensor(row)
            mask[i, width - len(row) :] = 1
    return ids, mask


def cmd_generate(args: argparse.Namespace) -> int:
    import torch

    from ..options import Options
    from .build import compile_lm
    from .models import load_causal_lm

    model = load_causal_lm(args.model, seed=args.seed)
    pad = getattr(model.generation_config, "pad_token_id", None)
    ids, mask = _prompts(args.prompt_ids, pad if pad is not None else 0)
    lm = compile_lm(
        model,
        args.target,
        Options.from_pairs(args.opt),
        max_batch=args.max_batch,
        max_length=args.max_length,
    )
    torch.manual_seed(args.seed)
    out = lm.generate(
        ids,
        args.max_new_tokens,
        do_sample=args.do_sample,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        eos_token_id=args.eos_token_id,
        attention_mask=mask,
    )
    result: dict[str, object] = {
        "model": args.model,
        "tokens": out.tolist(),
        "kv_cache": lm.stats["kv_cache"],
    }
    if args.bench:
        from .bench import bench_generate

        result["bench"] = bench_generate(
            lm, model, ids, max(2, args.max_new_tokens), mask, args.repeat
        )
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    for row in result["tokens"]:
        print(",".join(map(str, row)))
    if args.bench:
        b = result["bench"]
        for side in ("plus", "transformers"):
            print(
                f"{side}: prefill {b[side]['prefill_ms']:.3f} ms, decode "
                f"{b[side]['decode_ms_per_token']:.3f} ms/token (batch {b['batch']}, prompt "
                f"{b['prompt']}, {b['new_tokens']} new; {b['process']})"
            )
    return 0
