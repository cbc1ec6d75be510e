"""Half-precision models (float16, bfloat16) compile, return the model's dtype and are no less
accurate than torch eager in that dtype.

The accuracy contract (:mod:`plus_tvm.accuracy`): against a float64 run of the same rounded
weights and inputs, plus's error (max |err| / max |ref|) is at most twice torch eager's own,
plus a small floor."""

from __future__ import annotations

import copy
import math

import ml_dtypes
import numpy as np
import plus_tvm
import pytest
import torch
from _shared_zoo import half_compiled, module_compiled
from plus_tvm import zoo
from plus_tvm.accuracy import bound, rel_err
from plus_tvm.half_reference import widened_run

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _cast(a: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return a.to(dtype) if a.is_floating_point() else a


def _first(out: object) -> torch.Tensor:
    out = out[0] if isinstance(out, (tuple, list)) else out
    return getattr(out, "last_hidden_state", getattr(out, "logits", out))


def _errors(model: torch.nn.Module, args: tuple, dtype: torch.dtype) -> tuple[float, float, object]:
    """(plus's relative error, torch eager's, plus's output) against float64."""
    half = copy.deepcopy(model).eval().to(dtype)
    hargs = tuple(_cast(a, dtype) for a in args)
    return _half_errors(half, hargs, plus_tvm.compile(half, example_args=hargs))


def _half_errors(half: torch.nn.Module, hargs: tuple, compiled) -> tuple[float, float, object]:
    """``_errors`` of ``half`` (a model in half precision) compiled as ``compiled``."""
    ref = _first(widened_run(half, hargs)).double()
    with torch.no_grad():
        eager = _first(half(*hargs)).double()
    got = _first(compiled(*hargs))
    return rel_err(got.double().numpy(), ref.numpy()), rel_err(eager.numpy(), ref.numpy()), got


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("name", [n for n in zoo.names() if n.endswith("-tiny")])
def test_zoo_models_in_half_precision_are_as_accurate_as_torch(name, dtype):
    # zoo.load(name) cast to dtype, compiled (tests/_shared_zoo.py: shared with the twin below)
    plus_err, torch_err, got = _half_errors(*half_compiled(name, DTYPES[dtype]))
    assert isinstance(got, torch.Tensor) and got.dtype == DTYPES[dtype]  # torch in, torch out
    assert plus_err <= bound(torch_err, dtype), (plus_err, torch_err)


def test_a_float32_model_is_imported_as_before():
    """The half-precision rewrite touches no float32 program."""
    from plus_tvm.frontend import export_torch
    from plus_tvm.torch_half import compute_as_torch, is_half_program

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8)).eval()
    program = export_torch(model, (torch.randn(2, 8),))
    before = str(program.graph)
    assert not is_half_program(program) and compute_as_torch(program) == 0
    assert str(program.graph) == before


def test_contractions_accumulate_in_float32_and_round_once():
    """A bfloat16 linear: the product in float32, the bias added before the one rounding."""
    from plus_tvm.frontend import export_torch, import_exported

    model = torch.nn.Linear(64, 32).eval().to(torch.bfloat16)
    mod, _ = import_exported(export_torch(model, (torch.randn(4, 64, dtype=torch.bfloat16),)))
    text = mod["main"].script()
    assert 'out_dtype="float32"' in text and 'R.astype(p_bias, dtype="float32")' in text
    assert text.count('dtype="bfloat16")') >= 1 and "main(" in text
    ret = mod["main"].ret_ty
    assert str(ret.dtype) == "bfloat16"


def test_norms_and_softmax_compute_in_float32():
    x = torch.randn(3, 256) * 40  # a wide softmax: rounding each exp in bf16 would show
    model = torch.nn.Sequential(torch.nn.LayerNorm(256), torch.nn.Softmax(-1))
    plus_err, torch_err, _ = _errors(model, (x,), torch.bfloat16)
    assert plus_err <= bound(torch_err, "bf16")


def test_numpy_bfloat16_in_numpy_out():
    model = torch.nn.Linear(8, 4).eval().to(torch.bfloat16)
    x = torch.randn(2, 8, dtype=torch.bfloat16)
    cm = plus_tvm.compile(model, example_args=(x,))
    arr = x.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    out = cm(arr)
    assert isinstance(out, np.ndarray) and out.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(out.astype(np.float32), cm(x).float().numpy())


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_a_half_convolution_takes_its_batch_norm_and_relu(dtype):
    """Conv + BatchNorm + ReLU in half precision: one library call each (the BatchNorm computed
    in float32, not folded into the half weight), as accurate as torch."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(8, 16, 3, padding=1),
        torch.nn.BatchNorm2d(16),
        torch.nn.ReLU(),
        torch.nn.Conv2d(16, 16, 1, bias=False),
        torch.nn.BatchNorm2d(16),
    ).eval()
    with torch.no_grad():
        for bn in (model[1], model[4]):
            bn.running_mean.normal_(0, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.uniform_(0.5, 1.5)
    x = torch.randn(1, 8, 12, 12)
    plus_err, torch_err, _ = _errors(model, (x,), DTYPES[dtype])
    assert plus_err <= bound(torch_err, dtype), (plus_err, torch_err)
    half = copy.deepcopy(model).to(DTYPES[dtype])
    stats = plus_tvm.inspect(half, example_args=(x.to(DTYPES[dtype]),))
    assert stats["kernel_names"].get("plus.conv2d") == 2
    assert not [g for g in stats["groups"] if "batch_norm" in g["ops"]], stats["groups"]


class _ConvBnSiluHead(torch.nn.Module):
    """EfficientNet's expansion, depthwise convolution and head: each Conv + BatchNorm +
    SiLU, then the mean over the image."""

    def __init__(self) -> None:
        super().__init__()
        self.convs = torch.nn.ModuleList(
            [
                torch.nn.Conv2d(8, 16, 1, bias=False),
                torch.nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False),
                torch.nn.Conv2d(16, 24, 1, bias=False),
            ]
        )
        self.bns = torch.nn.ModuleList([torch.nn.BatchNorm2d(c) for c in (16, 16, 24)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv, bn in zip(self.convs, self.bns):
            x = torch.nn.functional.silu(bn(conv(x)))
        return x.mean(dim=(2, 3))


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_a_half_convolution_takes_its_silu_after_the_batch_norm(dtype):
    """A half SiLU computes in float32 between two casts (``x * sigmoid(x)`` after widening
    the BatchNorm's rounded result): it joins the convolution's call (``act=silu``) rather than
    running as a TIR kernel, and the mean after it (which widens the SiLU's rounding again)
    does not pull the convolution out of the library; as accurate as torch."""
    torch.manual_seed(0)
    model = _ConvBnSiluHead().eval()
    with torch.no_grad():
        for bn in model.bns:
            bn.running_mean.normal_(0, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
    x = torch.randn(1, 8, 10, 10)
    plus_err, torch_err, _ = _errors(model, (x,), DTYPES[dtype])
    assert plus_err <= bound(torch_err, dtype), (plus_err, torch_err)
    half = copy.deepcopy(model).to(DTYPES[dtype])
    stats = plus_tvm.inspect(half, example_args=(x.to(DTYPES[dtype]),))
    assert stats["kernel_names"].get("plus.conv2d") == 3
    tir = [n for n in stats["kernel_names"] if not n.startswith("plus.")]
    assert not [n for n in tir if "sigmoid" in n or "conv2d" in n], tir


class _NewGelu(torch.nn.Module):
    """GPT-2's ``gelu_new``, written out (its constants round to the half dtype)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))
        return 0.5 * x * (1.0 + torch.tanh(inner))


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_a_written_out_gelu_joins_the_half_linear(dtype):
    """gelu_new in a half model (its constants rounded, its pow in float32 between casts) is
    recognised as the linear's tanh GELU epilogue: no element-wise kernel is left."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), _NewGelu(), torch.nn.Linear(64, 32))
    x = torch.randn(4, 32)
    plus_err, torch_err, _ = _errors(model.eval(), (x,), DTYPES[dtype])
    assert plus_err <= bound(torch_err, dtype), (plus_err, torch_err)
    half = copy.deepcopy(model).to(DTYPES[dtype])
    stats = plus_tvm.inspect(half, example_args=(x.to(DTYPES[dtype]),))
    assert stats["kernel_names"] == {"plus.linear": 2}, stats["kernel_names"]


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("act", [torch.nn.GELU(), torch.nn.GELU("tanh"), torch.nn.SiLU()])
def test_a_half_activation_between_casts_joins_the_linear(dtype, act):
    """A half GELU / SiLU computes in float32 between two casts (torch_half.FLOAT32_OPS):
    the linear takes it as its epilogue past the widening cast, no element-wise kernel left."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), act, torch.nn.Linear(64, 32)).eval()
    x = torch.randn(4, 32)
    plus_err, torch_err, _ = _errors(model, (x,), DTYPES[dtype])
    assert plus_err <= bound(torch_err, dtype), (plus_err, torch_err)
    half = copy.deepcopy(model).to(DTYPES[dtype])
    stats = plus_tvm.inspect(half, example_args=(x.to(DTYPES[dtype]),))
    assert stats["kernel_names"] == {"plus.linear": 2}, stats["kernel_names"]


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_nan_goes_through_max_and_relu_in_half(dtype):
    model = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.MaxPool1d(2))
    x = torch.tensor([[[1.0, float("nan"), -2.0, 3.0]]], dtype=DTYPES[dtype])
    got = plus_tvm.compile(model, example_args=(x,))(x)
    torch.testing.assert_close(got, model(x), equal_nan=True)


@pytest.mark.parametrize("precision", sorted(DTYPES))
@pytest.mark.parametrize("name", ["bert-base-tiny", "resnet50-tiny"])
def test_precision_option_runs_a_float32_model_in_half(name, precision):
    """Options(precision=...): weights converted once, float32 in and out, and against the
    float32 model no less accurate than torch eager with the model converted."""
    model, args = zoo.load(name)
    with torch.no_grad():
        ref = _first(model(*args)).double()
        half = copy.deepcopy(model).eval().to(DTYPES[precision])
        eager = _first(half(*[_cast(a, DTYPES[precision]) for a in args])).double()
    options = plus_tvm.Options(precision=precision)
    cm = plus_tvm.compile(model, example_args=args, options=options)
    got = _first(cm(*args))
    assert got.dtype == torch.float32 and cm.stats["options"]["precision"] == precision
    plus_err = rel_err(got.double().numpy(), ref.numpy())
    torch_err = rel_err(eager.numpy(), ref.numpy())
    assert plus_err <= bound(torch_err, precision), (plus_err, torch_err)
    assert cm.stats["library_calls"] > 0  # the half-precision library kernels ran


def test_precision_needs_a_torch_model():
    from onnx import TensorProto, helper

    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(plus_tvm.OptionsError, match="torch model"):
        plus_tvm.compile(model, options=plus_tvm.Options(precision="bf16"))


@pytest.mark.parametrize("name", ["efficientnet-b0-tiny", "resnet50-tiny"])
def test_a_half_cnn_reaches_the_library_as_its_float32_twin(name):
    """The 1x1 convolutions match as often in bfloat16 as in float32: a prologue that only a pattern
    read with an imagined unit loop admits (the squeeze-excite scale before a 1x1 convolution)
    must not cost the convolution its own full match (EfficientNet-B0 bf16 ran 10x slower so:
    its 1x1 convolutions with batch norm fell back to TIR)."""
    import collections

    counts = {}
    for dtype in (torch.float32, torch.bfloat16):
        # zoo.load(name) as it is and cast to bfloat16, compiled (tests/_shared_zoo.py's compiles)
        half = dtype != torch.float32
        compiled = half_compiled(name, dtype)[2] if half else module_compiled(name)[2]
        decisions = compiled.stats["dispatch"]["decisions"]
        counts[dtype] = collections.Counter(d["entry"] for d in decisions)
    pointwise = "conv2d_nhwc_pointwise"
    assert counts[torch.bfloat16][pointwise] == counts[torch.float32][pointwise] > 0
