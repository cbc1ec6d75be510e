"""GIR on half-precision kernels: element-wise and data-movement kernels are planned (a
reduction over half buffers keeps TVM's schedule) and compute as torch does (a bfloat16
argument of exp / sigmoid / tanh keeps TVM's function: its fast form, bound with Let, read
the raw bits of bfloat16 loads)."""

from __future__ import annotations

import plus_tvm
import pytest
import torch
from plus_tvm.gir.search import plan_for_rule
from plus_tvm.target import host_target
from tvm import te, tirx


class _HalfActivations(torch.nn.Module):
    """The element-wise kernels of half models: LLaMA's SiLU gate, GPT-2's tanh GELU, a
    BatchNorm + SiLU (EfficientNet), each large enough to be planned and vectorized."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = torch.nn.BatchNorm1d(64)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        gate = torch.nn.functional.silu(x) * y
        gelu = torch.nn.functional.gelu(x, approximate="tanh") + y
        bn = torch.nn.functional.silu(self.bn(x.transpose(1, 2)))
        return gate, gelu, bn


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_element_wise_kernels_planned_by_gir_compute_as_torch(dtype):
    torch.manual_seed(0)
    model = _HalfActivations().eval().to(dtype)
    x, y = (torch.randn(2, 256, 64).to(dtype) * 3 for _ in range(2))
    cm = plus_tvm.compile(model, "llvm", example_args=(x, y))
    for got, want in zip(cm(x, y), model(x, y)):
        assert got.dtype == dtype
        err = (got.float() - want.float()).abs().max() / want.float().abs().max()
        assert err < 0.02, err  # a few units in the last place; a misread load is far off


def _half_elementwise():
    a = te.placeholder((64, 256), "bfloat16", name="a")
    b = te.compute(a.shape, lambda i, j: tirx.sigmoid(a[i, j].astype("float32")).astype("bfloat16"))
    return te.create_prim_func([a, b])


def _half_reduction():
    a = te.placeholder((64, 256), "bfloat16", name="a")
    k = te.reduce_axis((0, 256), name="k")
    b = te.compute((64,), lambda i: te.sum(a[i, k].astype("float32"), axis=k))
    return te.create_prim_func([a, b])


def test_half_element_wise_kernels_are_planned_and_half_reductions_are_not():
    target = host_target()
    assert plan_for_rule(_half_elementwise(), target, "llvm") is not None
    why: list[str] = []
    assert plan_for_rule(_half_reduction(), target, "llvm", why=why) is None
    assert why == ["a reduction over half-precision buffers"]


class _Transcendental(torch.nn.Module):
    """A half model's transcendental activations, each alone (on its own input: one input
    widened once for five functions is a kernel of several outputs, not staged)."""

    def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        f = torch.nn.functional
        fns = (f.gelu, f.silu, torch.sigmoid, torch.tanh, torch.exp)
        return tuple(fn(x) for fn, x in zip(fns, xs))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_transcendental_functions_compute_in_float32_and_vectorize(dtype, tmp_path):
    """torch computes a half GELU / SiLU / sigmoid / tanh / exp in float32 and rounds once; so
    does plus (the ops are float32 ops between two casts), and the widening cast is kept in a
    float32 buffer beside its consumer, so each function takes its vectorized float32 form
    (no call of TVM's own ``exp`` / ``sigmoid`` / ``tanh`` / ``erf`` left, which runs one
    lane at a time: a bfloat16 GELU over 112x112x32 took 2.2 ms against torch's 0.06)."""
    torch.manual_seed(0)
    model = _Transcendental().eval()
    xs = tuple((torch.randn(4, 128, 64) * 3).to(dtype) for _ in range(5))
    cm = plus_tvm.compile(
        model, "llvm", example_args=xs, options=plus_tvm.Options(dump_ir=str(tmp_path))
    )
    # torch's float32 function rounded once: within two units in the last place of the
    # largest output (the fast functions are float32 approximations, 1e-7 relative)
    ulp = 2.0**-8 if dtype == torch.bfloat16 else 2.0**-11
    for got, want in zip(cm(*xs), model(*xs)):
        assert got.dtype == dtype
        assert torch.equal(torch.isinf(got), torch.isinf(want))
        finite = torch.isfinite(want)
        err = (got.float() - want.float())[finite].abs().max()
        assert err <= 2 * ulp * want.float()[finite].abs().max(), err
    (lowered,) = tmp_path.glob("*_lower.py")
    text = lowered.read_text()
    for fn in ("T.exp(", "T.sigmoid(", "T.tanh(", "T.erf("):
        assert fn not in text, fn
