"""ExpandIntegerPower: pow by small integer constants becomes products (CUDA's fast-math powf is
NaN for negative bases), exactly; other exponents stay pow."""

from __future__ import annotations

import numpy as np
import plus_tvm
import pytest
import torch
import tvm
from plus_tvm.passes import ExpandIntegerPower
from plus_tvm.passes.expand_integer_power import expand_power
from torch import nn
from tvm import relax, tirx


def _pows(mod: tvm.IRModule) -> list[float]:
    """The exponents of the pow calls left in the module's PrimFuncs."""
    from plus_tvm.tir_blocks import blocks, stores, walk_expr

    found: list[float] = []

    def look(node: object) -> None:
        if isinstance(node, tvm.ir.Call) and isinstance(node.op, tvm.ir.Op):
            if node.op.name == "tirx.pow":
                found.append(float(node.args[1].value))

    for _, func in mod.functions_items():
        if isinstance(func, tirx.PrimFunc):
            for block in blocks(func.body):
                for store in stores(block.body):
                    walk_expr(store.value, look)
    return found


@pytest.mark.parametrize("n", [-2, -1, 0, 1, 2, 3, 4])
def test_integer_exponents_become_products(n):
    x = tirx.Var("x", "float32")
    out = expand_power(tirx.pow(x, tirx.const(float(n), "float32")))
    assert out is not None and "pow" not in str(out)
    assert str(out).count("x") == max(abs(n), 0) or n == 0


@pytest.mark.parametrize("exponent", [2.5, 5.0, -7.0, 1.0 / 3.0])
def test_other_exponents_stay(exponent):
    x = tirx.Var("x", "float32")
    assert expand_power(tirx.pow(x, tirx.const(exponent, "float32"))) is None


def test_half_becomes_sqrt_and_a_computed_base_is_bound_once():
    x = tirx.Var("x", "float32")
    assert "sqrt" in str(expand_power(tirx.pow(x, tirx.const(0.5, "float32"))))
    out = expand_power(tirx.pow(x + tirx.const(1.0, "float32"), tirx.const(3.0, "float32")))
    assert isinstance(out, tirx.Let)


class _Powers(nn.Module):
    """RMSNorm's square, tanh GELU's cube, a reciprocal square and a fractional power."""

    def forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        gelu = 0.5 * x * (1 + torch.tanh(0.79788456 * (x + 0.044715 * x.pow(3))))
        return gelu * torch.rsqrt(var + 1e-6) + x.pow(-2) * 1e-3 + x.abs().pow(2.5)


def test_negative_bases_match_torch_and_only_the_fractional_pow_is_left():
    x = torch.randn(4, 32) * 3  # negative values throughout
    model = _Powers().eval()
    mod, _ = plus_tvm.from_torch(model, (x,))
    legal = relax.transform.LegalizeOps()(mod)
    assert sorted(_pows(legal)) == [-2.0, 2.0, 2.5, 3.0]
    assert _pows(ExpandIntegerPower()(legal)) == [2.5]
    compiled = plus_tvm.compile(model, example_args=(x,))
    np.testing.assert_allclose(np.asarray(compiled(x)), model(x).numpy(), rtol=1e-5, atol=1e-5)


def test_cuda_code_has_no_powf_for_integer_exponents():
    """Compiled for sm_90 (no GPU needed): the CUDA source multiplies instead of calling powf,
    which --use_fast_math turns into exp2(y * log2(x)), NaN for x < 0."""
    x = torch.randn(4, 32)
    mod, _ = plus_tvm.from_torch(_Powers().eval(), (x,))
    target = {"kind": "cuda", "arch": "sm_90"}
    tgt = plus_tvm.target.resolve_target(target)
    ex = tvm.compile(mod, tgt, relax_pipeline=plus_tvm.pipeline(tgt))
    sources = [m.inspect_source() for m in _modules(ex.mod) if m.kind == "cuda"]
    assert sources, "no CUDA module"
    powf = [ln for src in sources for ln in src.splitlines() if "powf(" in ln]
    assert len(powf) == 1 and ("2.5" in powf[0] or "0x1.4p+1" in powf[0]), powf


def _modules(mod: object) -> list:
    return [mod] + [m for sub in mod.imports for m in _modules(sub)]
