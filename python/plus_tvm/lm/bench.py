"""Prefill latency and per-token decode latency of a ``CompiledLM`` against transformers'
``generate`` with its dynamic KV cache, both in this process (one after the other, blocks
alternated; not a worker process each as ``plus-tvm bench`` runs the backends;
``scripts/bench_generate.py`` runs each backend in its own process with these helpers).

Each side runs ``generate`` with 1 new token (the prefill and one sampling step) and with
``N`` new tokens, end of sequence ignored; prefill is the median time of the first, a decode
step ``(median(N) - median(1)) / (N - 1)``."""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable

import torch

Runner = Callable[[int], Callable[[], object]]  # new tokens -> one timed generate call


def median_s(run: Callable[[], object], repeat: int) -> float:
    """Median wall time of ``repeat`` calls of ``run``, seconds."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def greedy_config(model: torch.nn.Module, new_tokens: int, **fields: object) -> object:
    """A copy of ``model``'s generation config for greedy decoding of exactly ``new_tokens``
    tokens (end of sequence ignored); ``fields`` set more of its attributes."""
    config = copy.deepcopy(model.generation_config)
    # no end of sequence: every sequence runs new_tokens steps and an eos id is an ordinary
    # token (None would be filled in from the model's config, and min_new_tokens would then
    # suppress the eos logit, which plus's generate(eos_token_id=[]) does not)
    config.eos_token_id = []
    config.use_cache = True  # (the zoo's LMs are built with use_cache=False for forward timing)
    config.pad_token_id = config.pad_token_id if config.pad_token_id is not None else 0
    config.max_new_tokens, config.min_new_tokens, config.do_sample = new_tokens, new_tokens, False
    for key, value in fields.items():
        setattr(config, key, value)
    return config


def hf_runner(
    model: torch.nn.Module, input_ids: torch.Tensor, mask: torch.Tensor, **fields: object
) -> Runner:
    """``n -> call``: transformers' greedy ``model.generate`` of ``n`` new tokens."""

    def make(n: int) -> Callable[[], object]:
        settings = greedy_config(model, n, **fields)

        def run() -> object:
            with torch.no_grad():
                return model.generate(input_ids, attention_mask=mask, generation_config=settings)

        return run

    return make


def plus_runner(lm: object, input_ids: torch.Tensor, mask: torch.Tensor) -> Runner:
    """``n -> call``: ``lm.generate`` of ``n`` new tokens, greedy, end of sequence ignored."""
    return lambda n: lambda: lm.generate(input_ids, n, attention_mask=mask, eos_token_id=[])


def prefill_decode(one_s: float, many_s: float, new_tokens: int) -> dict[str, float]:
    """``prefill_ms`` (``generate`` of 1 token) and ``decode_ms_per_token`` from the times of
    ``generate`` with 1 and with ``new_tokens`` new tokens (seconds)."""
    return {
        "prefill_ms": round(one_s * 1e3, 3),
        "decode_ms_per_token": round((many_s - one_s) / (new_tokens - 1) * 1e3, 3),
    }


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
    sides = {
        "plus": plus_runner(lm, input_ids, mask),
        "transformers": hf_runner(model, input_ids, mask),
    }
    out: dict[str, object] = {
        "batch": int(input_ids.shape[0]),
        "prompt": int(input_ids.shape[1]),
        "new_tokens": max_new_tokens,
        "repeat": repeat,
        "process": "both in this process, blocks alternated",
    }
    results: dict[str, dict[str, list[float]]] = {"plus": {}, "transformers": {}}
    for make in sides.values():
        make(2)()  # warm-up (first-call setup, weight placement)
    for _ in range(2):  # blocks alternated
        for side, make in sides.items():
            results[side].setdefault("one", []).append(median_s(make(1), repeat))
            results[side].setdefault("many", []).append(median_s(make(max_new_tokens), repeat))
    for side, r in results.items():
        out[side] = prefill_decode(min(r["one"]), min(r["many"]), max_new_tokens)
    out["kv_cache_bytes_per_token"] = lm.stats["kv_cache"]["bytes_per_token"]
    return out
