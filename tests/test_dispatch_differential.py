"""Differential test of library dispatch (PluS): random transformer-style torch modules built
from linears (with or without bias, activations built in or written out, residuals),
LayerNorm / RMSNorm, softmax and attention (scaled by multiply or divide, with or without a
causal mask, one or several heads) are compiled with dispatch on (cost model off, so even tiny
shapes become library calls) and off, and both are checked against torch eager. A binder that
absorbs the wrong operand, drops an epilogue or misreads a layout fails here even where no
hand-picked case covers the combination. ``PLUS_TVM_DIFF_SEEDS=N`` runs N modules (20 in CI).
"""

from __future__ import annotations

import math
import os

import numpy as np
import plus_tvm
import pytest
import torch
from plus_tvm import Options
from torch import nn

SEEDS = int(os.environ.get("PLUS_TVM_DIFF_SEEDS", "40")) // 2
ACTS = ("none", "relu", "gelu", "gelu_tanh", "silu", "silu_written", "gelu_new_written")


def _act(name: str, x: torch.Tensor) -> torch.Tensor:
    if name == "relu":
        return torch.relu(x)
    if name == "gelu":
        return nn.functional.gelu(x)
    if name == "gelu_tanh":
        return nn.functional.gelu(x, approximate="tanh")
    if name == "silu":
        return nn.functional.silu(x)
    if name == "silu_written":
        return x * torch.sigmoid(x)
    if name == "gelu_new_written":  # GPT-2's gelu_new
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    return x


class _Linear(nn.Module):
    def __init__(self, rng, d: int) -> None:
        super().__init__()
        self.out = int(rng.choice([d, 2 * d]))
        self.fc = nn.Linear(d, self.out, bias=bool(rng.integers(0, 2)))
        self.act = str(rng.choice(ACTS))
        self.residual = self.out == d and bool(rng.integers(0, 2))
        self.desc = f"linear({d}->{self.out}, bias={self.fc.bias is not None}, {self.act}"
        self.desc += ", residual)" if self.residual else ")"

    def forward(self, x):
        y = _act(self.act, self.fc(x))
        return y + x if self.residual else y


class _Norm(nn.Module):
    def __init__(self, rng, d: int) -> None:
        super().__init__()
        self.kind = str(rng.choice(["layer_norm", "layer_norm_no_bias", "rms_norm"]))
        self.w = nn.Parameter(torch.randn(d) * 0.1 + 1.0)
        self.b = nn.Parameter(torch.randn(d) * 0.1) if self.kind == "layer_norm" else None
        self.residual = bool(rng.integers(0, 2))
        self.desc = f"{self.kind}{' after a residual add' if self.residual else ''}"

    def forward(self, x):
        h = x + x * 0.5 if self.residual else x
        if self.kind == "rms_norm":  # LLaMA's, written out
            return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w
        return nn.functional.layer_norm(h, h.shape[-1:], self.w, self.b, 1e-5)


class _Attention(nn.Module):
    def __init__(self, rng, d: int) -> None:
        super().__init__()
        self.heads = int(rng.choice([h for h in (1, 2, 4) if d % h == 0]))
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.divide = bool(rng.integers(0, 2))
        self.causal = bool(rng.integers(0, 2))
        self.desc = (
            f"attention(heads={self.heads}, {'divide' if self.divide else 'multiply'}"
            f"{', causal' if self.causal else ''})"
        )

    def forward(self, x):
        b, s, d = x.shape
        hd = d // self.heads

        def split(t):
            return t.view(b, s, self.heads, hd).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        scores = q @ k.transpose(-1, -2)
        scores = scores / math.sqrt(hd) if self.divide else scores * (1.0 / math.sqrt(hd))
        if self.causal:
            mask = torch.triu(torch.full((s, s), -1e4), diagonal=1)
            scores = scores + mask
        ctx = torch.softmax(scores, dim=-1) @ v
        return self.o(ctx.transpose(1, 2).reshape(b, s, d))


class _Softmax(nn.Module):
    desc = "softmax"

    def forward(self, x):
        return torch.softmax(x, dim=-1)


def _model(seed: int) -> tuple[nn.Module, torch.Tensor, str]:
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    d = d0 = int(rng.choice([8, 16, 32]))
    s = int(rng.choice([4, 7, 16]))
    blocks: list[nn.Module] = []
    for _ in range(int(rng.integers(2, 5))):
        kind = str(rng.choice(["linear", "linear", "norm", "attention", "softmax"]))
        if kind == "linear":
            block = _Linear(rng, d)
            d = block.out
        elif kind == "norm":
            block = _Norm(rng, d)
        elif kind == "attention":
            block = _Attention(rng, d)
        else:
            block = _Softmax()
        blocks.append(block)
    model = nn.Sequential(*blocks).eval()
    desc = f"seed {seed}: x[1, {s}, {d0}] -> " + " -> ".join(b.desc for b in blocks)
    x = torch.from_numpy(rng.standard_normal((1, s, d0)).astype("float32"))
    return model, x, desc


@pytest.mark.parametrize("seed", range(SEEDS))
def test_random_module_matches_eager_with_and_without_dispatch(seed):
    model, x, desc = _model(seed)
    with torch.no_grad():
        want = model(x).numpy()
    scale = max(1.0, float(np.abs(want).max()))
    calls = {}
    for name, opts in (
        ("dispatch", Options(dispatch_cost_model=False)),
        ("no dispatch", Options(dispatch=False)),
    ):
        compiled = plus_tvm.compile(model, example_args=(x,), options=opts)
        got = np.asarray(compiled(x))
        np.testing.assert_allclose(
            got, want, rtol=1e-4, atol=1e-4 * scale, err_msg=f"{name}: {desc}"
        )
        calls[name] = compiled.stats["library_calls"]
    assert calls["no dispatch"] == 0
    if any(isinstance(b, (_Linear, _Attention)) for b in model):
        assert calls["dispatch"] > 0, desc  # the binders were exercised
