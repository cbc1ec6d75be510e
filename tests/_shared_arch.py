"""One float32 ``plus_tvm.compile`` per architecture of :mod:`plus_tvm.arch_suite` for the whole
test session: tests/test_arch_suite.py compiles and runs every architecture, and other files
read the statistics of the same compiles (tests/test_canonicalize_sdpa.py: the SDPA side of its
attention check, tests/test_batch_above_one.py: the batch-one entries), which ``inspect`` of the
same model and inputs would recompute (``inspect``'s statistics are ``compile``'s, less
``compile_s``).

Callers get objects of their own: a deep copy of the model and of the statistics. The compiled
model reads the weights of the model it was compiled from, which no caller is handed."""

from __future__ import annotations

import copy
import functools

import plus_tvm
import torch
from conftest import strict_pass_context
from plus_tvm import arch_suite


@functools.cache
def _loaded(name: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    return arch_suite.load(name)


@functools.cache
def _compiled(name: str) -> plus_tvm.CompiledModel:
    model, inputs = _loaded(name)
    with strict_pass_context():  # (checked as in a test, whoever compiles it first)
        return plus_tvm.compile(model, example_args=inputs)


def attention_of(model: torch.nn.Module) -> set[str]:
    """transformers' attention implementations in ``model`` (empty for a model with none)."""
    configs = (getattr(m, "config", None) for m in model.modules())
    return {c._attn_implementation for c in configs if hasattr(c, "_attn_implementation")}


def compiled_arch(name: str) -> tuple[torch.nn.Module, plus_tvm.CompiledModel]:
    """``(model, compiled)``: ``arch_suite.load(name)``'s model (a copy) and its compile with
    the default options."""
    return copy.deepcopy(_loaded(name)[0]), _compiled(name)


def arch_stats(name: str, attention: str | None = None) -> dict:
    """The statistics of compiling ``arch_suite.load(name, attention=attention)`` with the
    default options: the shared compile's where the default model has that attention, else
    ``inspect``'s of the model loaded with it."""
    if attention is not None and attention_of(_loaded(name)[0]) != {attention}:
        model, inputs = arch_suite.load(name, attention=attention)
        return plus_tvm.inspect(model, example_args=inputs)
    return copy.deepcopy(dict(_compiled(name).stats))
