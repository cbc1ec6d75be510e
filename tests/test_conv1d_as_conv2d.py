"""Conv1dAsConv2d: 1-D convolutions reach the 2-D convolution entries, exactly, with their
epilogue (bias, activation, residual) inside the call; the unit axis sinks only below
operators that read the result alone."""

from __future__ import annotations

import numpy as np
import plus_tvm
import pytest
import torch
import tvm_ffi
from plus_tvm.loader import load_model
from plus_tvm.passes import Conv1dAsConv2d
from torch import nn
from torch.nn import functional as F  # noqa: N812


class Stem(nn.Module):
    """Whisper's stem: two convolutions with bias and GELU, the second strided."""

    def __init__(self, c_in: int = 8, c: int = 16) -> None:
        super().__init__()
        self.c1 = nn.Conv1d(c_in, c, 3, padding=1)
        self.c2 = nn.Conv1d(c, c, 3, stride=2, padding=1)

    def forward(self, x):
        x = F.gelu(self.c1(x))
        return F.gelu(self.c2(x)).permute(0, 2, 1)


class Variants(nn.Module):
    """Dilation, groups, depthwise, no bias, a residual add and ReLU after it."""

    def __init__(self, c: int = 16) -> None:
        super().__init__()
        self.dilated = nn.Conv1d(c, c, 3, padding=2, dilation=2)
        self.grouped = nn.Conv1d(c, c, 5, padding=2, groups=4, bias=False)
        self.depthwise = nn.Conv1d(c, c, 7, padding=3, groups=c)
        self.pointwise = nn.Conv1d(c, 2 * c, 1)

    def forward(self, x):
        y = torch.relu(self.dilated(x))
        y = torch.relu(self.grouped(y) + x)
        y = F.silu(self.depthwise(y))
        return self.pointwise(y)


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("model,shape", [(Stem(), (2, 8, 30)), (Variants(), (1, 16, 21))])
def test_conv1d_dispatches_and_is_exact(model, shape, layout):
    torch.manual_seed(0)
    model = model.eval()
    x = torch.randn(*shape)
    compiled = plus_tvm.compile(
        model,
        example_args=(x,),
        options=plus_tvm.Options(conv_layout=layout, dispatch_cost_model=False),
    )
    convs = sum(isinstance(m, nn.Conv1d) for m in model.modules())
    # every convolution, its epilogue inside (the cost model off: tiny sizes would stay TIR)
    assert compiled.stats["library_calls"] == convs
    for seed in (0, 1):
        data = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            ref = model(data).numpy()
        np.testing.assert_allclose(np.asarray(compiled(data)), ref, rtol=1e-5, atol=1e-5)


def test_the_epilogue_lands_behind_the_conv2d_and_the_input_is_kept():
    torch.manual_seed(0)
    mod = load_model(Stem().eval(), (torch.randn(1, 8, 30),)).mod
    before = mod.script()
    rewrite = Conv1dAsConv2d()
    out = rewrite(mod)
    assert mod.script() == before  # never mutated
    assert rewrite.rewritten == 2 and rewrite.sunk == 4  # two bias adds, two GELUs
    text = out.script()
    assert "R.nn.conv1d" not in text and text.count("R.nn.conv2d") == 2
    assert text.count("R.squeeze") == 1  # one squeeze, at the end of the chain


def test_a_result_read_twice_keeps_its_squeeze():
    class TwoReaders(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv1d(4, 4, 3, padding=1, bias=False)

        def forward(self, x):
            y = self.conv(x)
            return torch.relu(y), y * 2.0

    mod = load_model(TwoReaders().eval(), (torch.randn(1, 4, 9),)).mod
    rewrite = Conv1dAsConv2d()
    out = rewrite(mod)
    assert rewrite.rewritten == 1 and rewrite.sunk == 0
    assert not tvm_ffi.structural_equal(out, mod)
    model = TwoReaders().eval()
    x = torch.randn(1, 4, 9)
    got = plus_tvm.compile(model, example_args=(x,))(x)
    for g, r in zip(got, model(x)):
        np.testing.assert_allclose(np.asarray(g), r.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_a_conv1d_without_out_dtype_is_rewritten():
    """The ONNX importer leaves ``out_dtype`` unset (the input's dtype); the rewrite kept it as
    the string "None" and failed ("unknown dtype"): 12 ONNX node tests (CausalConvWithState)."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 9), "float32"))
    w = relax.Var("w", relax.TensorType((8, 4, 3), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.nn.conv1d(x, w, padding=[1, 1])))
        bb.emit_func_output(out)
    mod = bb.get()
    rewrite = Conv1dAsConv2d()
    assert rewrite(mod) is not mod and rewrite.rewritten == 1
    xs, ws = np.random.rand(1, 4, 9).astype("float32"), np.random.rand(8, 4, 3).astype("float32")
    got = np.asarray(plus_tvm.compile((mod, {}))(xs, ws))
    ref = F.conv1d(torch.from_numpy(xs), torch.from_numpy(ws), padding=1).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
