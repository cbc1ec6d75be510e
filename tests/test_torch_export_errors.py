"""A module whose forward depends on a tensor's value in a way torch.export cannot capture as
one graph, and plus_tvm cannot speculate on (a Python ``if`` on a size that a boolean mask
gave): the error names the source line of the branch and what to do
(python/plus_tvm/torch_export_errors.py), not sympy symbols above a graph dump. A plain ``if``
on ``bool(tensor)`` or ``.item()`` compiles by speculation (tests/test_branch_speculation.py);
the message for torch's own error on one is checked directly."""

from __future__ import annotations

import plus_tvm
import pytest
import torch
from plus_tvm.torch_export_errors import export_failure_message, is_data_dependent


class BranchOnMaskedSize(torch.nn.Module):
    def forward(self, x):
        y = x[x > 0]
        if y.shape[0] > 2:  # the branch torch.export cannot follow
            return y * 2
        return y - 1


def test_a_branch_on_a_tensor_value_names_its_line():
    with pytest.raises(plus_tvm.errors.ModelLoadError) as info:
        plus_tvm.compile(BranchOnMaskedSize(), example_args=(torch.ones(3),), target="llvm")
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
    with pytest.raises(Exception) as info:  # noqa: PT011 - torch's own error, whatever its type
        torch.export.export(ClampIfNotFinite(), (torch.ones(3),))
    assert is_data_dependent(info.value)
    message = export_failure_message("ClampIfNotFinite", info.value)
    assert "test_torch_export_errors.py:" in message and "in forward" in message, message
    assert "`if not torch.isfinite(x).all():`" in message
    assert "non_strict_utils" not in message


def test_other_export_failures_keep_their_first_line():
    class Bad(torch.nn.Module):
        def forward(self, x):
            raise RuntimeError("boom in forward")

    with pytest.raises(plus_tvm.errors.ModelLoadError, match="torch.export failed for Bad: boom"):
        plus_tvm.compile(Bad(), example_args=(torch.ones(3),), target="llvm")


def test_longformer_exports_its_global_attention_branch_by_speculation():
    """Longformer's ``is_global_attn = ....any().item()`` and ``if is_global_attn:``: exported
    along the example's path (no global attention), the condition a guard output."""
    transformers = pytest.importorskip("transformers")
    from plus_tvm.frontend import export_torch
    from plus_tvm.torch_branch_speculation import speculation_of

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
    program = export_torch(model, (torch.randint(3, 100, (1, 12)),))
    branches = speculation_of(program).branches
    assert any("modeling_longformer.py" in b.site and "is_global_attn" in b.code for b in branches)
