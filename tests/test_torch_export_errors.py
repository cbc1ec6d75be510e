"""A module whose forward branches on a tensor's value (Longformer's ``if is_global_attn:``)
cannot be exported as one graph: the error names the source line of the branch and what to
do (python/plus_tvm/torch_export_errors.py), not sympy symbols above a graph dump."""

from __future__ import annotations

import plus_tvm
import pytest
import torch


class BranchOnValue(torch.nn.Module):
    def forward(self, x):
        if x.sum().item() > 0:  # the branch torch.export cannot follow
            return x * 2
        return x - 1


def test_a_branch_on_a_tensor_value_names_its_line():
    with pytest.raises(plus_tvm.errors.ModelLoadError) as info:
        plus_tvm.compile(BranchOnValue(), example_args=(torch.ones(3),), target="llvm")
    message = str(info.value)
    assert "branches on the value of a tensor" in message
    assert "test_torch_export_errors.py:" in message  # the user's line
    assert "torch.where / torch.cond" in message
    assert "graph():" not in message  # no graph dump


class ClampIfNotFinite(torch.nn.Module):
    """BART's float16 idiom: ``not t.all()`` reaches ``bool`` through torch's function mode, so
    torch's "Caused by" names its own frame, not this one."""

    def forward(self, x):
        if not torch.isfinite(x).all():
            x = torch.clamp(x, -100.0, 100.0)
        return x * 2


def test_a_branch_through_torchs_function_mode_names_the_users_line():
    with pytest.raises(plus_tvm.errors.ModelLoadError) as info:
        plus_tvm.compile(ClampIfNotFinite(), example_args=(torch.ones(3),), target="llvm")
    message = str(info.value)
    assert "test_torch_export_errors.py:" in message and "in forward" in message, message
    assert "`if not torch.isfinite(x).all():`" in message
    assert "non_strict_utils" not in message


def test_other_export_failures_keep_their_first_line():
    class Bad(torch.nn.Module):
        def forward(self, x):
            raise RuntimeError("boom in forward")

    with pytest.raises(plus_tvm.errors.ModelLoadError, match="torch.export failed for Bad: boom"):
        plus_tvm.compile(Bad(), example_args=(torch.ones(3),), target="llvm")


def test_longformer_names_its_global_attention_branch():
    transformers = pytest.importorskip("transformers")
    config = transformers.LongformerConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        attention_window=4,
    )
    torch.manual_seed(0)
    model = transformers.LongformerModel(config).eval()
    with pytest.raises(plus_tvm.errors.ModelLoadError) as info:
        plus_tvm.compile(model, example_args=(torch.randint(3, 100, (1, 12)),), target="llvm")
    assert "modeling_longformer.py" in str(info.value)
    assert "branches on the value of a tensor" in str(info.value)
