"""One ``compile_lm`` per tiny decoder for the whole test session: tests/test_lm_generate.py
and tests/test_lm_decode_attention.py use the same two models (``arch:gpt2``, ``arch:llama``)
with the same limits, and compiling them (prefill and decode) is most of those files' time.

Every call returns objects of its own: a deep copy of the model (as it was right after the
compile) and a :class:`~plus_tvm.lm.CompiledLM` with its own KV cache over the shared compiled
steps, so no test sees another's cache buffers, sizes or model state."""

from __future__ import annotations

import copy
import functools

import plus_tvm
import torch
from plus_tvm.lm import CompiledLM
from plus_tvm.lm.models import load_causal_lm

MAX_BATCH, MAX_LENGTH = 4, 64


@functools.cache
def _compiled(name: str) -> tuple[torch.nn.Module, CompiledLM]:
    model = load_causal_lm(f"arch:{name}")
    return model, plus_tvm.compile_lm(model, max_batch=MAX_BATCH, max_length=MAX_LENGTH)


def compiled_lm(name: str) -> tuple[torch.nn.Module, CompiledLM]:
    """``(model, lm)`` of ``arch:NAME`` compiled with ``MAX_BATCH`` and ``MAX_LENGTH``."""
    model, lm = _compiled(name)
    fresh = CompiledLM(
        lm.prefill, lm.decode, lm.layout, lm.limits, lm.eos_token_id, lm.pad_token_id, lm.name
    )
    return copy.deepcopy(model), fresh
