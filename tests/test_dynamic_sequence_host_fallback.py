"""A model re-imported with a symbolic sequence length (plus_tvm.dynamic_sequence) honours
``host_fallback`` as a static compile does: off, a torch op without a converter is refused by
name, in ``load_dynamic_sequence`` and in a compile of the re-imported model with
``Options(host_fallback=False)`` (both ran it on the host before); on, it runs on the host at
every length."""

from __future__ import annotations

import warnings

import numpy as np
import plus_tvm
import pytest
import torch
from plus_tvm.dynamic_sequence import inputs_at, load_dynamic_sequence
from plus_tvm.errors import UnsupportedOperatorError
from plus_tvm.loader import load_model
from plus_tvm.options import Options

NO_CONVERTER = "special_i0e"  # (tests/test_torch_host_fallback.py checks it has none)


class Text(torch.nn.Module):
    """Token ids -> embedding -> (i0e, which no converter compiles) -> linear."""

    def __init__(self, host_op: bool) -> None:
        super().__init__()
        self.host_op = host_op
        self.emb = torch.nn.Embedding(50, 8)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, ids):
        h = self.emb(ids)
        return self.fc(torch.special.i0e(h) if self.host_op else h)


def _loaded(host_op: bool) -> object:
    torch.manual_seed(0)
    ids = torch.randint(0, 50, (1, 6))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (the host node's warning)
        return load_model(Text(host_op).eval(), (ids,))


def test_a_static_compile_refuses_the_op_with_host_fallback_off():
    ids = torch.randint(0, 50, (1, 6))
    with pytest.raises(UnsupportedOperatorError, match=NO_CONVERTER):
        options = Options(host_fallback=False)
        plus_tvm.compile(Text(True).eval(), example_args=(ids,), options=options)


def test_load_dynamic_sequence_refuses_the_op_with_host_fallback_off():
    with pytest.raises(UnsupportedOperatorError, match=rf"{NO_CONVERTER}.* at node"):
        load_dynamic_sequence(_loaded(True), max_len=16, host_fallback=False)


def test_a_compile_with_host_fallback_off_refuses_a_model_imported_with_host_nodes():
    dynamic = load_dynamic_sequence(_loaded(True), max_len=16)
    with pytest.raises(UnsupportedOperatorError, match=rf"host_fallback.*{NO_CONVERTER}"):
        plus_tvm.compile(dynamic, target="llvm", options=Options(host_fallback=False))


@pytest.mark.parametrize("host_op", [True, False])
def test_the_dynamic_model_matches_torch_at_every_length(host_op):
    dynamic = load_dynamic_sequence(_loaded(host_op), max_len=16, host_fallback=host_op)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        options = Options(host_fallback=host_op)  # off: nothing runs on the host anyway
        cm = plus_tvm.compile(dynamic, target="llvm", options=options)
    assert bool(cm.stats.get("host_nodes")) == host_op
    for length in (3, 16):
        (ids,) = inputs_at(dynamic.example_inputs, length)
        with torch.no_grad():
            want = dynamic.torch_module(torch.from_numpy(ids)).numpy()
        np.testing.assert_allclose(cm(ids), want, rtol=1e-5, atol=1e-6, err_msg=f"length {length}")
