"""Tests of plus_tvm.zoo (model zoo) and plus_tvm.torch_fixes (TVM 0.27 importer fixes).

Only tiny variants are built and compiled; full-size entries are checked through their
example inputs, which need no model.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may be fetched; fail fast if tried

import numpy as np
import pytest
import torch
from plus_tvm import zoo
from plus_tvm.errors import PlusError, UnknownModelError

BASE_NAMES = (
    "albert-base",
    "bert-base",
    "efficientnet-b0",
    "gpt2",
    "llama",
    "mobilenetv2",
    "resnet50",
    "t5-encoder",
    "vgg16",
    "vit",
)
TINY_NAMES = tuple(f"{n}-tiny" for n in BASE_NAMES)
TEXT = {"albert-base", "bert-base", "gpt2", "llama", "t5-encoder"}
CNN_TINY = ("resnet50-tiny", "mobilenetv2-tiny", "efficientnet-b0-tiny", "vgg16-tiny")

TINY_OUTPUT_SHAPES = {
    "albert-base-tiny": (1, 16, 64),
    "bert-base-tiny": (1, 16, 64),
    "efficientnet-b0-tiny": (1, 10),
    "gpt2-tiny": (1, 16, 1000),
    "llama-tiny": (1, 16, 1000),
    "mobilenetv2-tiny": (1, 10),
    "resnet50-tiny": (1, 10),
    "t5-encoder-tiny": (1, 16, 64),
    "vgg16-tiny": (1, 10),
    "vit-tiny": (1, 17, 64),
}

# Max abs error allowed between TVM and torch eager: fp32 reordering on these tiny models
# stays below 1e-5; 1e-4 leaves room for other CPUs' vector widths.
ATOL = 1e-4


def _needs_transformers(name: str) -> None:
    if not name.startswith("vgg16"):
        pytest.importorskip("transformers")


def _forward(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    with torch.no_grad():
        return model(*inputs)


# ------------------------------------------------------------------------------------ registry
def test_names_sorted_with_tiny_twins():
    names = zoo.names()
    assert names == sorted(names)
    assert set(names) == set(BASE_NAMES) | set(TINY_NAMES)


def test_unknown_name_raises():
    with pytest.raises(UnknownModelError, match="xyz") as info:
        zoo.get("xyz")
    assert isinstance(info.value, PlusError) and isinstance(info.value, KeyError)
    assert "bert-base" in str(info.value)  # lists the known names
    with pytest.raises(UnknownModelError, match="nope"):
        zoo.load("zoo:nope")
    with pytest.raises(UnknownModelError):
        zoo.get(None)  # type: ignore[arg-type]


def test_zoo_prefix_accepted():
    assert zoo.get("zoo:bert-base") is zoo.get("bert-base")
    assert zoo.get("zoo:vgg16-tiny").name == "vgg16-tiny"


@pytest.mark.parametrize("name", BASE_NAMES)
def test_full_size_entries(name):
    # Only the example inputs: building the full models would take seconds each.
    entry = zoo.get(name)
    assert entry.name == name and entry.description
    (x,) = entry.example_inputs()
    if name in TEXT:
        assert entry.family == "nlp"
        assert entry.input_names() == ("input_ids",)
        assert x.shape == (1, 128) and x.dtype == torch.int64
        assert int(x.min()) >= 0
    else:
        assert entry.family == "vision"
        assert entry.input_names() == ("pixel_values",)
        assert x.shape == (1, 3, 224, 224) and x.dtype == torch.float32


# --------------------------------------------------------------------------------- tiny models
@pytest.mark.parametrize("name", TINY_NAMES)
def test_tiny_model_runs(name):
    _needs_transformers(name)
    model, inputs = zoo.load(name)
    assert not model.training
    assert all(not p.requires_grad for p in model.parameters())
    out = _forward(model, inputs)
    assert isinstance(out, torch.Tensor)
    assert tuple(out.shape) == TINY_OUTPUT_SHAPES[name]
    assert torch.isfinite(out).all()
    assert float(out.std()) > 1e-3  # neither constant nor vanishing
    if name.removesuffix("-tiny") in TEXT:
        vocab = model.model.config.vocab_size
        assert int(inputs[0].max()) < vocab


@pytest.mark.parametrize("name", CNN_TINY)
def test_cnn_outputs_do_not_vanish(name):
    # Without the BatchNorm recalibration, random MobileNetV2/EfficientNet give ~1e-21 or 0.
    _needs_transformers(name)
    model, inputs = zoo.load(name)
    out = _forward(model, inputs)
    assert 1e-3 < float(out.std()) < 100.0


@pytest.mark.parametrize("name", ["gpt2-tiny", "resnet50-tiny", "vgg16-tiny"])
def test_determinism(name):
    _needs_transformers(name)
    entry = zoo.get(name)
    a, b, c = entry.build(seed=0), entry.build(seed=0), entry.build(seed=1)
    x = entry.example_inputs(seed=0)
    assert torch.equal(x[0], entry.example_inputs(seed=0)[0])
    assert not torch.equal(x[0], entry.example_inputs(seed=1)[0])
    assert torch.equal(_forward(a, x), _forward(b, x))
    sa, sc = a.state_dict(), c.state_dict()
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in sa.items())
    assert any(not torch.equal(v, sc[k]) for k, v in sa.items() if v.is_floating_point())


def test_build_leaves_global_rng_alone():
    state = torch.random.get_rng_state()
    zoo.get("vgg16-tiny").build(seed=3)
    assert torch.equal(state, torch.random.get_rng_state())


def test_build_does_not_use_network(monkeypatch):
    import socket

    def refuse(*args, **kwargs):
        raise AssertionError("zoo tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    for name in ("vgg16-tiny", "bert-base-tiny"):
        _needs_transformers(name)
        zoo.load(name)


@pytest.mark.parametrize("name", ["llama-tiny", "efficientnet-b0-tiny"])
def test_torch_export(name):
    _needs_transformers(name)
    model, inputs = zoo.load(name)
    program = torch.export.export(model, inputs)
    assert [
        s.arg.name for s in program.graph_signature.input_specs if s.kind.name == "USER_INPUT"
    ] == list(zoo.get(name).input_names())
    torch.testing.assert_close(program.module()(*inputs), _forward(model, inputs))


# ------------------------------------------------------------------------------------- ONNX
@pytest.mark.parametrize("name", ["vgg16-tiny", "gpt2-tiny"])
def test_export_onnx_matches_eager(name, tmp_path):
    _needs_transformers(name)
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    path = zoo.export_onnx(name, str(tmp_path / "m.onnx"))
    assert os.listdir(tmp_path) == ["m.onnx"]  # weights inside, no external data file
    model, inputs = zoo.load(name)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds = {n: x.numpy() for n, x in zip(zoo.get(name).input_names(), inputs)}
    out = sess.run(None, feeds)[0]
    np.testing.assert_allclose(out, _forward(model, inputs).numpy(), rtol=0, atol=ATOL)
    # and TVM's ONNX importer reads it
    onnx = pytest.importorskip("onnx")
    from tvm.relax.frontend.onnx import from_onnx

    mod = from_onnx(onnx.load(path), keep_params_in_input=True)
    assert mod["main"].attrs["num_input"] == 1


def test_export_onnx_dynamic_batch(tmp_path):
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    entry = zoo.get("vgg16-tiny")
    path = zoo.export_onnx(entry, tmp_path / "m.onnx", dynamic_batch=True)
    dim0 = onnx.load(path).graph.input[0].type.tensor_type.shape.dim[0]
    assert dim0.dim_param and not dim0.dim_value
    model = entry.build()
    x = torch.cat([entry.example_inputs(seed=s)[0] for s in range(3)])
    out = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(
        None, {"pixel_values": x.numpy()}
    )[0]
    np.testing.assert_allclose(out, _forward(model, (x,)).numpy(), rtol=0, atol=ATOL)


# ------------------------------------------------------------------------------- torch fixes
def _compile_run(model, inputs, convert_map, dynamic_shapes=None, run_inputs=None):
    """Import with TVM 0.27's torch frontend, compile for this CPU, run; returns numpy."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend import detach_params
    from tvm.relax.frontend.torch import from_exported_program

    program = torch.export.export(model, inputs, dynamic_shapes=dynamic_shapes)
    mod = from_exported_program(
        program,
        keep_params_as_input=True,
        unwrap_unit_return_tuple=True,
        custom_convert_map=convert_map,
    )
    mod, params = detach_params(mod)
    target = tvm.target.Target(
        {"kind": "llvm", "num-cores": 2, "mcpu": tvm.target.codegen.llvm_get_system_cpu()}
    )
    exe = tvm.compile(mod, target, relax_pipeline=relax.get_default_pipeline(target))
    vm = relax.VirtualMachine(exe, tvm.cpu())
    args = run_inputs if run_inputs is not None else inputs
    weights = params.get("main", [])
    return vm["main"](*[tvm.runtime.tensor(x.numpy()) for x in args], *weights).numpy()


def _fixes():
    pytest.importorskip("tvm")
    from plus_tvm.torch_fixes import custom_convert_map

    return custom_convert_map()


@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny"])
def test_llm_compiles_and_matches_eager_with_fixes(name):
    _needs_transformers(name)
    fixes = _fixes()
    model, inputs = zoo.load(name)
    out = _compile_run(model, inputs, fixes)
    np.testing.assert_allclose(out, _forward(model, inputs).numpy(), rtol=0, atol=ATOL)


def test_unfixed_importer_breaks_gpt2_tiny():
    # If this starts passing, TVM fixed bool cumsum and cumsum_promote can go.
    _needs_transformers("gpt2-tiny")
    _fixes()
    model, inputs = zoo.load("gpt2-tiny")
    with pytest.raises(Exception, match="kDLFloat"):  # LLVM CreateAdd on a bool cumsum
        _compile_run(model, inputs, None)


class _BoolCumsum(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x > 0, dim=-1)


class _BoolEqual(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return ((x > 0) == (y > 0)).float()


class _BoolCompare(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        same = (x > 0) == (y > 0)
        differ = (x > 0) != True  # noqa: E712  (the bool-vs-scalar overload is the point)
        above = (y > 0) > (x > 0)
        return same.float() + 2 * differ.float() + 4 * above.float() + 8 * ((x > 0) == 2).float()


class _NegativeSlice(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # torch.diff decomposes to slices along dim -1 (x[..., :-1] indexing would be
        # normalised to dim 1 by torch.export); transformers' mask code uses it.
        return torch.diff(x, dim=-1)


def test_fix_cumsum_of_bool():
    fixes = _fixes()
    x = torch.randn(2, 8)
    with pytest.raises(Exception, match="kDLFloat"):
        _compile_run(_BoolCumsum(), (x,), None)
    out = _compile_run(_BoolCumsum(), (x,), fixes)
    assert out.dtype == np.int64  # torch's dtype, not bool
    np.testing.assert_array_equal(out, _BoolCumsum()(x).numpy())


def test_fix_bool_comparisons():
    fixes = _fixes()
    x, y = torch.randn(2, 8), torch.randn(2, 8)
    with pytest.raises(Exception, match="fcmp"):  # LLVM float compare on i1
        _compile_run(_BoolEqual(), (x, y), None)
    np.testing.assert_array_equal(
        _compile_run(_BoolEqual(), (x, y), fixes), _BoolEqual()(x, y).numpy()
    )
    out = _compile_run(_BoolCompare(), (x, y), fixes)
    np.testing.assert_array_equal(out, _BoolCompare()(x, y).numpy())


def test_fix_negative_slice_dim_with_dynamic_batch():
    fixes = _fixes()
    x = torch.randn(2, 8)
    batch = {"x": {0: torch.export.Dim("batch", min=1, max=16)}}
    with pytest.raises(Exception, match="src_tensor_dim"):
        _compile_run(_NegativeSlice(), (x,), None, dynamic_shapes=batch)
    x3 = torch.randn(3, 8)
    out = _compile_run(_NegativeSlice(), (x,), fixes, dynamic_shapes=batch, run_inputs=(x3,))
    np.testing.assert_allclose(out, _NegativeSlice()(x3).numpy(), rtol=0, atol=0)


def test_llama_tiny_dynamic_batch_with_fixes():
    _needs_transformers("llama-tiny")
    fixes = _fixes()
    model, (ids,) = zoo.load("llama-tiny")
    ids2 = torch.cat([ids, ids.flip(-1)])  # batch 2: torch.export would specialise batch 1
    ids3 = torch.cat([ids2, ids])
    batch = {"input_ids": {0: torch.export.Dim("batch", min=1, max=16)}}
    out = _compile_run(model, (ids2,), fixes, dynamic_shapes=batch, run_inputs=(ids3,))
    np.testing.assert_allclose(out, _forward(model, (ids3,)).numpy(), rtol=0, atol=ATOL)


class _IntegerTrueDivision(torch.nn.Module):
    """DeBERTa-v2's relative-position buckets: ``log`` of an int64 tensor, integer ``/``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = (x.abs() * 10).long() + 1
        return torch.log(n) + n / 3 + torch.sqrt(n) + torch.rsqrt(n) * torch.exp(-n)


class _CatWithEmptyCache(torch.nn.Module):
    """transformers' KV cache starts as ``torch.tensor([])``; torch skips it in ``cat``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        empty = torch.zeros(0, dtype=x.dtype)
        return torch.cat([empty, x, empty], dim=-2) * 2


def test_fix_integer_operands_of_float_ops_are_promoted():
    fixes = _fixes()
    x = torch.randn(2, 8)
    with pytest.raises(Exception, match="log"):  # TVM 0.27 keeps int64 for log
        _compile_run(_IntegerTrueDivision(), (x,), None)
    out = _compile_run(_IntegerTrueDivision(), (x,), fixes)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, _IntegerTrueDivision()(x).numpy(), rtol=1e-5, atol=1e-6)


def test_fix_cat_skips_empty_one_dimensional_operands():
    fixes = _fixes()
    x = torch.randn(1, 2, 5, 4)
    with pytest.raises(Exception, match="same ndim"):
        _compile_run(_CatWithEmptyCache(), (x,), None)
    out = _compile_run(_CatWithEmptyCache(), (x,), fixes)
    np.testing.assert_array_equal(out, _CatWithEmptyCache()(x).numpy())
