"""Every architecture of the suite (transformers models outside the zoo, tiny configs, their
default SDPA attention) compiles with the plus pipeline, is exact against torch eager on two
inputs, and reaches the library through at least one warehouse entry. (The compiles are
shared for the session: tests/_shared_arch.py.)"""

from __future__ import annotations

import numpy as np
import plus_tvm
import pytest
import torch
from _shared_arch import compiled_arch
from plus_tvm import arch_suite

pytest.importorskip("transformers")


@pytest.mark.parametrize("name", arch_suite.names())
def test_architecture_compiles_and_is_exact(name):
    model, compiled = compiled_arch(name)  # (arch_suite.load(name), compiled with the defaults)
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
