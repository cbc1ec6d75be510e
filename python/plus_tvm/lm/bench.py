"""Prefill latency and per-token decode latency of a ``CompiledLM`` against transformers'
``generate`` with its dynamic KV cache, both in this process (one after the other, blocks
alternated; not a worker process each as ``plus-tvm bench`` runs the backends).

Each side runs ``generate`` with 1 new token (the prefill and one sampling step) and with
``N`` new tokens, end of sequence ignored; prefill is the median time of the first, a decode
step ``(median(N) - median(1)) / (N - 1)``."""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable

import torch


def _median_s(run: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_generate(
    lm: object,
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    attention_mask: torch.Tensor | None = None,
    repeat: int = 3,
) -> dict[str, object]:
    """``{"plus": {...}, "transformers": {...}}``: ``prefill_ms`` and ``decode_ms_per_token``
    of each, with the shapes measured; greedy, ``max_new_tokens`` >= 2."""
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    config = copy.deepcopy(model.generation_config)
    config.eos_token_id = None  # every sequence runs max_new_tokens steps
    config.pad_token_id = config.pad_token_id if config.pad_token_id is not None else 0

    def plus(n: int) -> Callable[[], object]:
        return lambda: lm.generate(input_ids, n, attention_mask=mask, eos_token_id=[])

    def hf(n: int) -> Callable[[], object]:
        settings = copy.deepcopy(config)
        settings.max_new_tokens, settings.min_new_tokens, settings.do_sample = n, n, False

        def run() -> object:
            with torch.no_grad():
                return model.generate(input_ids, attention_mask=mask, generation_config=settings)

        return run

    out: dict[str, object] = {
        "batch": int(input_ids.shape[0]),
        "prompt": int(input_ids.shape[1]),
        "new_tokens": max_new_tokens,
        "repeat": repeat,
        "process": "both in this process, blocks alternated",
    }
    results: dict[str, dict[str, list[float]]] = {"plus": {}, "transformers": {}}
    for make in (plus, hf):
        make(2)()  # warm-up (first-call setup, weight placement)
    for _ in range(2):  # blocks alternated
        for side, make in (("plus", plus), ("transformers", hf)):
            one = _median_s(make(1), repeat)
            many = _median_s(make(max_new_tokens), repeat)
            results[side].setdefault("one", []).append(one)
            results[side].setdefault("many", []).append(many)
    for side, r in results.items():
        one, many = min(r["one"]), min(r["many"])
        out[side] = {
            "prefill_ms": round(one * 1e3, 3),
            "decode_ms_per_token": round((many - one) / (max_new_tokens - 1) * 1e3, 3),
        }
    out["kv_cache_bytes_per_token"] = lm.stats["kv_cache"]["bytes_per_token"]
    return out
