"""CanonicalizeSDPA + the attention entry: torch's SDPA decomposition (operand scales, safe
softmax) dispatches to ``plus.attention`` like the eager form, and stays exact, fully masked
query rows included (SDPA returns 0 for them, plain softmax NaN)."""

from __future__ import annotations

import numpy as np
import plus_tvm
import pytest
import torch
import tvm_ffi
from _shared_arch import arch_stats
from plus_tvm import arch_suite
from plus_tvm.passes import CanonicalizeSDPA
from torch.nn import functional as F  # noqa: N812


class _PackedQKV(torch.nn.Module):
    """One QKV projection split into heads, SDPA with an additive mask given as an input."""

    def __init__(self, heads: int = 4, dim: int = 32) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(a.transpose(1, 2).reshape(b, s, d))


def _mask(rows_all_masked: tuple[int, ...]) -> torch.Tensor:
    mask = torch.zeros(1, 1, 12, 12)
    mask[..., 5, 2:] = float("-inf")  # partly masked
    for r in rows_all_masked:
        mask[..., r, :] = float("-inf")
    return mask


@pytest.mark.parametrize("rows", [(), (3,), (0, 7, 11)])
def test_sdpa_dispatches_and_fully_masked_rows_are_zero(rows):
    torch.manual_seed(0)
    model = _PackedQKV().eval()
    x = torch.randn(1, 12, 32)
    compiled = plus_tvm.compile(model, example_args=(x, _mask(())))
    assert compiled.stats["patterns"].get("attention") == 1
    mask = _mask(rows)
    with torch.no_grad():
        ref = model(x, mask).numpy()
    got = np.asarray(compiled(x, mask))
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_undispatched_sdpa_keeps_the_safe_softmax():
    """Without dispatch the same canonical form runs as TIR: still 0 for masked rows."""
    torch.manual_seed(0)
    model = _PackedQKV().eval()
    x, mask = torch.randn(1, 12, 32), _mask((4,))
    compiled = plus_tvm.compile(
        model, example_args=(x, mask), options=plus_tvm.Options(dispatch=False)
    )
    with torch.no_grad():
        ref = model(x, mask).numpy()
    np.testing.assert_allclose(np.asarray(compiled(x, mask)), ref, rtol=1e-5, atol=1e-5)


def test_pass_moves_operand_scales_onto_the_product_and_leaves_its_input():
    from plus_tvm.loader import load_model

    torch.manual_seed(0)
    model = _PackedQKV().eval()
    mod = load_model(model, (torch.randn(1, 12, 32), _mask(()))).mod
    before = mod.script()
    rewrite = CanonicalizeSDPA()
    out = rewrite(mod)
    assert rewrite.hoisted >= 1 and rewrite.conditions == 1
    assert mod.script() == before  # the input module is never mutated
    assert not tvm_ffi.structural_equal(out, mod)


@pytest.mark.parametrize(
    "name", ["bert", "distilbert", "bart", "vit", "gpt-neox", "opt", "t5", "mistral", "falcon"]
)
def test_sdpa_models_use_the_attention_entry(name):
    """transformers' default (SDPA) attention hits the same entry as its eager attention and
    compiles to no more kernels: encoder, cross attention (BART), pre-scaled q (OPT), relative
    position bias (T5), grouped-query heads (Mistral), multi-query heads (Falcon), vision (ViT);
    SDPA's output comes back through three transposes, two of which cancel."""
    model, inputs = arch_suite.load(name, attention="eager")
    eager = plus_tvm.inspect(model, example_args=inputs)
    sdpa = arch_stats(name, attention="sdpa")  # (tests/_shared_arch.py: test_arch_suite's compile)
    assert sdpa["patterns"].get("attention", 0) == eager["patterns"].get("attention", 0) >= 1
    assert sdpa["patterns"].get("batch_gemm", 0) == 0
    assert sdpa["kernels"] <= eager["kernels"], (sdpa["kernel_names"], eager["kernel_names"])


def test_scales_behind_scales_are_all_hoisted():
    """OPT scales q itself and SDPA scales it again by ``sqrt(1)``: both factors, with a view
    between them, move onto the product."""

    class PreScaled(torch.nn.Module):
        def forward(self, q, k):
            q = (q * 0.5).reshape(1, 4, 6, 8) * 3.0
            return (q @ k.transpose(-1, -2)).softmax(-1)

    q, k = torch.randn(1, 24, 8), torch.randn(1, 4, 6, 8)
    mod = plus_tvm.from_torch(PreScaled().eval(), (q, k))[0]
    rewrite = CanonicalizeSDPA()
    out = rewrite(mod)
    assert rewrite.hoisted == 1
    text = out.script()
    assert "R.const(1.5" in text and "R.const(0.5" not in text and "R.const(3" not in text
    vm_out = plus_tvm.compile((out, {})).__call__(q.numpy(), k.numpy())
    np.testing.assert_allclose(np.asarray(vm_out), PreScaled()(q, k).numpy(), rtol=1e-5, atol=1e-6)


def test_unmasked_sdpa_drops_the_fix_up():
    """Without a mask no row of finite scores is all ``-inf``: the safe softmax's condition
    (which would read the scores a second time) goes, and the attention dispatches."""

    class Unmasked(torch.nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v)

    q, k, v = (torch.randn(1, 4, 9, 8) for _ in range(3))
    mod = plus_tvm.from_torch(Unmasked().eval(), (q, k, v))[0]
    assert "R.where" in mod.script()
    rewrite = CanonicalizeSDPA()
    out = rewrite(mod)
    assert rewrite.conditions == 1 and "R.where" not in out.script()
    compiled = plus_tvm.compile(Unmasked().eval(), example_args=(q, k, v))
    assert compiled.stats["patterns"].get("attention") == 1
    ref = Unmasked()(q, k, v).numpy()
    np.testing.assert_allclose(np.asarray(compiled(q, k, v)), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("form", ["sdpa", "eager"])
def test_multi_query_heads_dispatch(form):
    """k and v of one head broadcast to the heads of q (Falcon's multi-query attention): the
    broadcast k^T is read through, k broadcast once for the call."""

    class MultiQuery(torch.nn.Module):
        def forward(self, q, k, v, mask):
            if form == "sdpa":
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            return ((q @ k.transpose(-1, -2)) / 8**0.5 + mask).softmax(-1) @ v

    q, k, v = torch.randn(1, 4, 9, 8), torch.randn(1, 1, 9, 8), torch.randn(1, 1, 9, 8)
    mask = torch.zeros(1, 1, 9, 9)
    mask[..., 5:] = float("-inf")
    model = MultiQuery().eval()
    compiled = plus_tvm.compile(
        model, example_args=(q, k, v, mask), options=plus_tvm.Options(dispatch_cost_model=False)
    )
    assert compiled.stats["patterns"].get("attention") == 1
    ref = model(q, k, v, mask).numpy()
    got = np.asarray(compiled(q, k, v, mask))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("batch", [1, 2])
def test_alibi_bias_of_heads_folded_into_the_batch_dispatches(batch):
    """BLOOM's attention: heads folded into the batch (``[B*H, S, D]``), k^T as a 3-D
    transpose, an ALiBi bias ``[B*H, 1, S]`` added before the head split, then the causal mask:
    one attention call with the bias as part of its mask, at batch 1 (the binder's 3-D bias)
    and 2 (CanonicalizeBatchMatmul unflattens the product, SinkRowReshapes regroups the bias)."""

    class Alibi(torch.nn.Module):
        def forward(self, q, k, v, alibi, mask):
            b, h, s, d = q.shape
            scores = alibi + (q.reshape(b * h, s, d) @ k.reshape(b * h, s, d).transpose(1, 2)) * 0.3
            probs = (scores.view(b, h, s, s) + mask).softmax(-1)
            return (probs.view(b * h, s, s) @ v.reshape(b * h, s, d)).view(b, h, s, d)

    q, k, v = (torch.randn(batch, 4, 9, 8) for _ in range(3))
    alibi = torch.randn(batch * 4, 1, 9)
    mask = torch.triu(torch.full((9, 9), float("-inf")), 1).expand(batch, 1, 9, 9).contiguous()
    model = Alibi().eval()
    compiled = plus_tvm.compile(
        model,
        example_args=(q, k, v, alibi, mask),
        options=plus_tvm.Options(dispatch_cost_model=False),
    )
    assert compiled.stats["patterns"].get("attention") == 1
    ref = model(q, k, v, alibi, mask).numpy()
    got = np.asarray(compiled(q, k, v, alibi, mask))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "fill,dispatched",
    [(torch.finfo(torch.float32).min, True), (float("-inf"), True), (-1e4, False)],
    ids=["finfo-min", "-inf", "-1e4"],
)
def test_masked_fill_of_the_scores_is_an_additive_mask_only_when_exact(fill, dispatched):
    """GPT-Neo's ``where(window, scores, finfo.min)``: adding ``finfo.min`` gives ``finfo.min``
    for any score, so it is the additive mask ``where(window, 0, finfo.min)``; a fill of -1e4
    is not (a fully masked row would no longer be uniform) and stays TIR, exact either way."""

    class Windowed(torch.nn.Module):
        def forward(self, q, k, v, window):
            scores = torch.where(window, q @ k.transpose(-1, -2), torch.tensor(fill))
            return scores.softmax(-1) @ v

    q, k, v = (torch.randn(1, 4, 10, 8) for _ in range(3))
    i = torch.arange(10)
    window = ((i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < 4))[None, None]
    if fill != float("-inf"):
        window = window.clone()
        window[..., 6, :] = False  # a fully masked row: uniform in torch
    model = Windowed().eval()
    compiled = plus_tvm.compile(
        model, example_args=(q, k, v, window), options=plus_tvm.Options(dispatch_cost_model=False)
    )
    assert (compiled.stats["patterns"].get("attention") == 1) == dispatched
    ref = model(q, k, v, window).numpy()
    got = np.asarray(compiled(q, k, v, window))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
