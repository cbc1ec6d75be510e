"""Compile time of ``compile_lm``: work its torch side does not need to do, checked by counters
(not by a clock).

The steps are exported (and decomposed) without torch's fake-tensor dispatch cache: with their
symbolic batch and lengths a cache hit rebuilds its output over symbolic sizes in Python
``SymInt`` arithmetic, dearer than the fake kernel it saves (the export and decomposition of a
tiny Qwen2's two steps took ~4 s of CPU more with it). The same program comes out either way.
"""

from __future__ import annotations

import contextlib

import plus_tvm.lm.export as lm_export
import pytest
import torch
from plus_tvm.frontend import export_torch, import_exported
from plus_tvm.lm.export import export_steps
from plus_tvm.lm.models import load_causal_lm
from torch._subclasses.fake_tensor import FakeTensorMode


def _imported(model: torch.nn.Module) -> list[str]:
    """The Relax text of both steps as ``compile_lm`` imports them (exported, decomposed)."""
    programs = export_steps(model, model.config.vocab_size, 2, 16)
    texts = []
    for program in (programs.prefill, programs.decode):
        mod, params = import_exported(export_torch(program))
        texts.append(mod.script(show_meta=False) + "\n" + " ".join(params))
    return texts


@pytest.fixture(scope="module")
def gpt2() -> torch.nn.Module:
    return load_causal_lm("arch:gpt2")


def test_steps_are_traced_without_the_fake_tensor_cache(gpt2):
    setting = torch._dynamo.config.fake_tensor_cache_enabled
    FakeTensorMode.cache_clear()
    _imported(gpt2)  # export and run_decompositions of both steps
    info = FakeTensorMode.cache_info()
    assert (info.hits, info.misses) == (0, 0)  # the cache was never looked up
    assert torch._dynamo.config.fake_tensor_cache_enabled == setting  # (restored)


def test_the_same_program_as_with_the_cache(gpt2, monkeypatch):
    without = _imported(gpt2)
    monkeypatch.setattr(lm_export, "without_fake_tensor_cache", contextlib.nullcontext)
    FakeTensorMode.cache_clear()
    with_cache = _imported(gpt2)
    assert FakeTensorMode.cache_info().hits > 0  # (torch's default: the cache used)
    assert with_cache == without
