"""PlusDispatch: warehouse entries matched in real graphs, library calls, numerics, variants.

Every case compiles through the whole pipeline and compares with torch eager. The cost model is
switched off where a test wants the library call on tiny shapes (on tiny shapes it rightly
keeps TIR; ``test_cost_model_keeps_tiny_gemm_in_tir`` checks that separately).
"""

from __future__ import annotations

import math

import numpy as np
import plus_tvm
import pytest
import torch
from plus_tvm import Options
from torch import nn

LIB = Options(dispatch_cost_model=False)


def _run(module: nn.Module, *args: torch.Tensor, options: Options = LIB):
    module.eval()
    compiled = plus_tvm.compile(module, example_args=args, options=options)
    with torch.no_grad():
        ref = module(*args)
    out = compiled(*args)
    out = out[0] if isinstance(out, (list, tuple)) else out
    np.testing.assert_allclose(np.asarray(out), ref.numpy(), rtol=1e-4, atol=1e-4)
    return compiled.stats


def _library(stats: dict) -> dict:
    return dict(stats["dispatch"]["library"])


# ------------------------------------------------------------------------------------- GEMM
class _MLP(nn.Module):
    def __init__(self, bias: bool, act: nn.Module) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 48, bias=bias)
        self.act = act

    def forward(self, x):
        return self.act(self.fc(x))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("act", [nn.Identity(), nn.GELU(), nn.ReLU(), nn.SiLU()])
def test_linear_with_and_without_bias_share_one_entry(bias, act):
    torch.manual_seed(0)
    stats = _run(_MLP(bias, act), torch.randn(2, 8, 32))
    assert _library(stats) == {"gemm_epilogue": 1}
    assert stats["dispatch"]["implementations"]["gemm_epilogue"] == {"torch.linear": 1}
    assert stats["library_calls"] == 1


class _ResidualLN(nn.Module):
    """PluS S2/S4: GEMM + bias + residual + LayerNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 32)
        self.ln = nn.LayerNorm(32)

    def forward(self, x, h):
        return self.ln(self.fc(x) + h)


def test_gemm_residual_layernorm_is_one_call():
    torch.manual_seed(0)
    stats = _run(_ResidualLN(), torch.randn(1, 8, 64), torch.randn(1, 8, 32))
    assert _library(stats) == {"gemm_layernorm": 1}
    assert stats["kernels"] == 1


# ------------------------------------------------------------------------------------ norms
class _LlamaRMSNorm(nn.Module):
    def __init__(self, n: int, zero_centered: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n) * 0.1 + (0.0 if zero_centered else 1.0))
        self.zero_centered = zero_centered

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.float32)
        var = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(var + 1e-6)
        w = (1.0 + self.weight) if self.zero_centered else self.weight
        return w * x.to(dtype)


class _T5LayerNorm(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n) * 0.1 + 1.0)

    def forward(self, x):
        variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + 1e-6)
        return self.weight * x


@pytest.mark.parametrize(
    "module",
    [_LlamaRMSNorm(64), _T5LayerNorm(64), _LlamaRMSNorm(64, zero_centered=True)],
    ids=["llama-rmsnorm", "t5-layernorm", "zero-centered-gamma"],
)
def test_rmsnorm_variants_hit_the_rms_norm_entry(module):
    torch.manual_seed(0)
    stats = _run(module, torch.randn(1, 16, 64))
    assert _library(stats) == {"rms_norm": 1}


@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_with_and_without_bias(bias):
    torch.manual_seed(0)
    ln = nn.LayerNorm(64, bias=bias)
    with torch.no_grad():
        ln.weight.normal_()
    stats = _run(ln, torch.randn(1, 16, 64))
    assert _library(stats) == {"layer_norm": 1}


# -------------------------------------------------------------------------------- attention
class _Attention(nn.Module):
    def __init__(self, heads: int, dim: int, by: str, mask: str) -> None:
        super().__init__()
        self.h, self.d = heads, dim // heads
        self.q, self.k, self.v = (nn.Linear(dim, dim) for _ in range(3))
        self.by, self.mask = by, mask

    def forward(self, x, pad):
        b, s, _ = x.shape

        def heads(t):
            return t.view(b, s, self.h, self.d).transpose(1, 2)

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        if self.by == "mul":
            scores = q @ k.transpose(-1, -2) * (1.0 / math.sqrt(self.d))
        else:
            scores = q @ k.transpose(-1, -2) / math.sqrt(self.d)
        if self.mask == "causal":
            causal = torch.full((s, s), -1e9).triu(1)
            scores = scores + causal.view(1, 1, s, s)
        else:
            scores = scores + pad.view(b, 1, 1, s)
        p = scores.softmax(-1)
        return (p @ v).transpose(1, 2).reshape(b, s, self.h * self.d)


@pytest.mark.parametrize("by", ["mul", "div"])
@pytest.mark.parametrize("mask", ["causal", "padding"])
def test_attention_variants_hit_the_attention_entry(by, mask):
    torch.manual_seed(0)
    pad = torch.zeros(1, 16)
    pad[0, 12:] = -1e9
    stats = _run(_Attention(4, 32, by, mask), torch.randn(1, 16, 32), pad)
    lib = _library(stats)
    assert lib.get("attention") == 1, stats["dispatch"]
    assert lib.get("gemm_epilogue") == 3


# ------------------------------------------------------------------------------- cost model
def test_cost_model_keeps_tiny_gemm_in_tir():
    torch.manual_seed(0)
    tiny = _MLP(True, nn.Identity())
    tiny.fc = nn.Linear(4, 4)
    stats = _run(tiny, torch.randn(2, 4), options=Options())
    assert stats["library_calls"] == 0
    assert any("TIR predicted faster" in k for k in stats["dispatch"]["declined"])
    big = _run(_MLP(True, nn.Identity()), torch.randn(64, 32), options=Options())
    assert big["library_calls"] == 1


def test_dispatch_off_leaves_everything_to_tir():
    torch.manual_seed(0)
    stats = _run(
        _ResidualLN(), torch.randn(1, 8, 64), torch.randn(1, 8, 32), options=Options(dispatch=False)
    )
    assert stats["library_calls"] == 0 and "dispatch" not in stats


# ----------------------------------------------------------------------------- zoo models
@pytest.mark.parametrize(
    "model, layout, entries",
    [
        ("bert-base-tiny", "auto", {"gemm_epilogue", "gemm_layernorm", "attention"}),
        ("gpt2-tiny", "auto", {"gemm_epilogue", "attention", "layer_norm"}),
        ("t5-encoder-tiny", "auto", {"gemm_epilogue", "attention", "rms_norm"}),
        ("llama-tiny", "auto", {"gemm_epilogue", "attention", "rms_norm"}),
        ("vit-tiny", "auto", {"gemm_epilogue", "attention", "layer_norm"}),
        (
            "resnet50-tiny",
            "nchw",
            {"conv2d_epilogue", "conv2d_pointwise", "conv2d_strided_pointwise"},
        ),
        ("mobilenetv2-tiny", "nchw", {"conv2d_depthwise", "conv2d_pointwise", "conv2d_strided"}),
        ("efficientnet-b0-tiny", "nchw", {"conv2d_depthwise", "conv2d_pixel", "conv2d_pointwise"}),
        (
            "resnet50-tiny",
            "nhwc",
            {"conv2d_nhwc_padded", "conv2d_nhwc_pointwise", "conv2d_strided_pointwise"},
        ),
        ("mobilenetv2-tiny", "nhwc", {"conv2d_nested", "conv2d_nhwc_pointwise", "conv2d_strided"}),
        (
            "efficientnet-b0-tiny",
            "nhwc",
            {"conv2d_nested", "conv2d_pixel", "conv2d_nhwc_pointwise"},
        ),
        ("vgg16-tiny", "nhwc", {"conv2d_nhwc_padded"}),
    ],
)
def test_zoo_models_match_entries_with_torch_numerics(model, layout, entries):
    from plus_tvm.loader import load_model

    loaded = load_model(f"zoo:{model}")
    compiled = plus_tvm.compile(f"zoo:{model}", options=LIB.replace(conv_layout=layout))
    with torch.no_grad():
        ref = loaded.torch_module(*loaded.example_inputs)
    if not isinstance(ref, torch.Tensor):
        hidden = getattr(ref, "last_hidden_state", None)
        ref = hidden if hidden is not None else ref[0]
    out = compiled(*loaded.example_inputs)
    out = out[0] if isinstance(out, (list, tuple)) else out
    np.testing.assert_allclose(np.asarray(out), ref.numpy(), rtol=1e-3, atol=2e-4)
    assert entries <= set(compiled.stats["patterns"]), compiled.stats["dispatch"]


class _PreLN(nn.Module):
    """GPT-2 / ViT: the residual sum feeds the LayerNorm and is carried on."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 32)
        self.ln = nn.LayerNorm(32)
        self.out = nn.Linear(32, 32)

    def forward(self, x, h):
        s = self.fc(x) + h
        return self.out(self.ln(s)) + s


def test_pre_ln_sum_is_a_second_output_of_one_call():
    torch.manual_seed(0)
    stats = _run(_PreLN(), torch.randn(1, 8, 32), torch.randn(1, 8, 32))
    assert _library(stats) == {"gemm_layernorm": 1, "gemm_epilogue": 1}
    assert stats["kernels"] == 2


class _NewGELU(nn.Module):
    def __init__(self, form: str) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 64)
        self.form = form

    def forward(self, x):
        y = self.fc(x)
        if self.form == "gpt2":
            return 0.5 * y * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (y + 0.044715 * y**3)))
        if self.form == "swish":
            return y * torch.sigmoid(y)
        return y * torch.sigmoid(1.702 * y)  # quick-gelu: no library epilogue computes it


@pytest.mark.parametrize("form, fused", [("gpt2", True), ("swish", True), ("quick", False)])
def test_written_out_activation_is_recognised_by_value(form, fused):
    torch.manual_seed(0)
    stats = _run(_NewGELU(form), torch.randn(1, 8, 32))
    assert _library(stats) == {"gemm_epilogue": 1}
    assert (stats["kernels"] == 1) == fused


class _BmmSoftmax(nn.Module):
    """Two activations multiplied (batch_gemm), a softmax of another tensor (softmax)."""

    def forward(self, a, b, c):
        return (a @ b.transpose(-1, -2)) * 0.5, c.softmax(-1)


def test_batch_gemm_and_softmax_entries():
    torch.manual_seed(0)
    module = _BmmSoftmax().eval()
    args = (torch.randn(2, 3, 8, 16), torch.randn(2, 3, 8, 16), torch.randn(4, 32))
    compiled = plus_tvm.compile(module, example_args=args, options=LIB)
    outs = compiled(*args)
    refs = module(*args)
    for out, ref in zip(outs, refs):
        np.testing.assert_allclose(np.asarray(out), ref.numpy(), rtol=1e-4, atol=1e-5)
    assert _library(compiled.stats) == {"batch_gemm": 1, "softmax": 1}


class _ConvBN(nn.Module):
    def __init__(self, act: nn.Module, residual: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.act = act
        self.residual = residual
        with torch.no_grad():
            self.bn.running_mean.normal_()
            self.bn.running_var.uniform_(0.5, 2.0)
            self.bn.weight.normal_()
            self.bn.bias.normal_()

    def forward(self, x):
        y = self.act(self.bn(self.conv(x)))
        return y + x if self.residual else y


@pytest.mark.parametrize(
    "act", [nn.ReLU(), nn.ReLU6(), nn.Identity()], ids=["relu", "relu6", "none"]
)
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize(
    "layout,entry,transposes", [("nchw", "conv2d_epilogue", 0), ("nhwc", "conv2d_nhwc_padded", 2)]
)
def test_batch_norm_and_activation_fold_into_the_convolution(
    act, residual, layout, entry, transposes
):
    torch.manual_seed(0)
    options = LIB.replace(conv_layout=layout)
    stats = _run(_ConvBN(act, residual), torch.randn(1, 8, 16, 16), options=options)
    assert _library(stats) == {entry: 1}
    # conv + BN + activation (+ the residual after it) is one library call; in NHWC the image
    # is transposed on the way in and the result on the way out
    assert stats["kernels"] == 1 + transposes


@pytest.mark.parametrize(
    "layout,entry,transposes", [("nchw", "conv2d_epilogue", 0), ("nhwc", "conv2d_nhwc_padded", 2)]
)
def test_a_batch_above_one_hits_the_same_entry(layout, entry, transposes):
    """A padded convolution of batch 3: the builder nests the pad and the product under a
    batch loop, which the ``batched`` entries match like batch 1 (before: no match, TIR)."""
    torch.manual_seed(0)
    options = LIB.replace(conv_layout=layout)
    stats = _run(_ConvBN(nn.ReLU(), True), torch.randn(3, 8, 16, 16), options=options)
    assert _library(stats) == {entry: 1}
    assert stats["kernels"] == 1 + transposes


class _DynamicBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 64)
        self.ln = nn.LayerNorm(64)
        self.fc2 = nn.Linear(64, 64)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.fc(x))
        return self.ln(self.fc2(h) + h)


@pytest.mark.parametrize("dispatch", [True, False])
def test_symbolic_batch_compiles_and_matches_at_several_sizes(dispatch):
    """Sizes like ``b*8`` (a reshape of a symbolic batch) reach both dispatch and fusion."""
    from torch.export import Dim

    torch.manual_seed(0)
    module = _DynamicBlock().eval()
    mod, params = plus_tvm.from_torch(
        module, (torch.randn(3, 8, 32),), dynamic_shapes={"x": {0: Dim("b", min=1, max=64)}}
    )
    compiled = plus_tvm.compile((mod, params), options=LIB.replace(dispatch=dispatch))
    for batch in (1, 3, 5):
        x = torch.randn(batch, 8, 32)
        with torch.no_grad():
            ref = module(x).numpy()
        np.testing.assert_allclose(np.asarray(compiled(x)), ref, rtol=1e-4, atol=1e-5)
    if dispatch:
        assert _library(compiled.stats) == {"gemm_epilogue": 2, "layer_norm": 1}
