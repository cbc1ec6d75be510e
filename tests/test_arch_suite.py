"""Every architecture of the suite (transformers models outside the zoo, tiny configs, their
default SDPA attention) compiles with the plus pipeline, is exact against torch eager on two
inputs, and reaches the library through at least one warehouse entry."""

from __future__ import annotations

import numpy as np
import plus_tvm
import pytest
import torch
from plus_tvm import arch_suite

pytest.importorskip("transformers")


@pytest.mark.parametrize("name", arch_suite.names())
def test_architecture_compiles_and_is_exact(name):
    model, inputs = arch_suite.load(name)
    compiled = plus_tvm.compile(model, example_args=inputs)
    for seed in (0, 1):
        x = arch_suite.inputs_of(arch_suite.ENTRIES[name], seed)
        with torch.no_grad():
            ref = model(*x).numpy()
        assert ref.std() > 1e-3, "a degenerate reference proves nothing"
        got = compiled(*x)
        got = np.asarray(got[0] if isinstance(got, (list, tuple)) else got)
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4, err_msg=name)
    assert compiled.stats["library_calls"] > 0
    assert compiled.stats["patterns"]  # the warehouse entries matched


def test_the_suite_spans_the_families():
    families = {e["family"] for e in arch_suite.ENTRIES.values()}
    assert families >= set(arch_suite.FAMILIES)
    assert len(arch_suite.names()) >= 30


def test_unknown_architecture_is_a_clear_error():
    with pytest.raises(plus_tvm.errors.UnknownModelError, match="unknown suite architecture"):
        arch_suite.load("no-such-model")


@pytest.mark.parametrize("name", ["bert", "opt", "bart", "t5", "mistral", "vit"])
def test_sdpa_attention_costs_no_more_kernels_than_eager(name):
    """transformers' default SDPA attention (torch decomposes it: q and k scaled, a safe
    softmax, the output through three transposes) reaches the same attention entry as eager
    attention, with no more kernels: encoder, pre-scaled q (OPT), cross attention (BART),
    relative position bias (T5), grouped-query heads (Mistral), vision (ViT)."""
    stats = {}
    for attention in ("eager", "sdpa"):
        model, inputs = arch_suite.load(name, attention=attention)
        stats[attention] = plus_tvm.inspect(model, example_args=inputs)
    eager, sdpa = stats["eager"], stats["sdpa"]
    assert sdpa["patterns"].get("attention", 0) == eager["patterns"].get("attention", 0) > 0
    assert sdpa["kernels"] <= eager["kernels"], (sdpa["kernel_names"], eager["kernel_names"])
