"""One ``compile_lm`` per tiny decoder (and config override) for the whole test session:
compiling a decoder (prefill and decode: two exports, two compiles, two JIT builds) is most of
the time of the files that generate with one, and several use the same models with the same
limits (tests/test_lm_generate.py, its family sweep included, and
tests/test_lm_decode_attention.py).

Every call returns objects of its own: a deep copy of the model (as it was right after the
compile) and a :class:`~plus_tvm.lm.CompiledLM` with its own KV cache over the shared compiled
steps, so no test sees another's cache buffers, sizes or model state. (The compiled steps read
the weights of the model they were compiled from, which no caller is handed: a test that
changes weights in place needs its own compile.)"""

from __future__ import annotations

import copy
import functools

import plus_tvm
import torch
from conftest import strict_pass_context
from plus_tvm.lm import CompiledLM
from plus_tvm.lm.models import load_causal_lm

MAX_BATCH, MAX_LENGTH = 4, 64


@functools.cache
def _compiled(name: str, overrides: tuple) -> tuple[torch.nn.Module, CompiledLM]:
    model = load_causal_lm(f"arch:{name}", **dict(overrides))
    with strict_pass_context():  # (checked as in a test, whoever compiles it first)
        return model, plus_tvm.compile_lm(model, max_batch=MAX_BATCH, max_length=MAX_LENGTH)


def compiled_lm(name: str, **overrides: object) -> tuple[torch.nn.Module, CompiledLM]:
    """``(model, lm)`` of ``arch:NAME`` (its config changed by ``overrides``, as
    ``load_causal_lm`` takes them) compiled with ``MAX_BATCH`` and ``MAX_LENGTH``."""
    model, lm = _compiled(name, tuple(sorted(overrides.items())))
    fresh = CompiledLM(
        lm.prefill, lm.decode, lm.layout, lm.limits, lm.eos_token_id, lm.pad_token_id, lm.name
    )
    return copy.deepcopy(model), fresh
