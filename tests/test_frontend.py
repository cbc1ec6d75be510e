"""Frontends: torch.export and ONNX to Relax with weights as inputs; import errors."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import plus_tvm
import pytest
import torch
import tvm
from onnx import TensorProto, helper
from plus_tvm import ModelLoadError, UnsupportedOperatorError
from plus_tvm.frontend import num_inputs
from small_models import SmallNet


class SmallCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.fc = torch.nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x)).mean(dim=(2, 3))
        return torch.softmax(self.fc(h), dim=-1)


class Erfinv(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.erfinv(x) * 2


def _tensor_shape(param) -> list:
    return list(param.ty.shape.values)


# ------------------------------------------------------------------------------------ torch
def test_from_torch_keeps_weights_as_inputs():
    model = SmallNet().eval()
    mod, params = plus_tvm.from_torch(model, (torch.randn(2, 8),))
    assert isinstance(mod, tvm.IRModule)
    main = mod["main"]
    assert int(main.attrs["num_input"]) == 1 == num_inputs(mod)
    assert main.params[0].name == "x"
    # params is keyed by main's weight parameters, in main's order ...
    assert list(params) == [p.name for p in main.params[1:]]
    # ... and holds exactly the module's weights, in registration order.
    weights = [p.detach().numpy() for p in model.parameters()]
    assert len(params) == len(weights) == 6
    for (name, value), ref in zip(params.items(), weights):
        assert isinstance(value, np.ndarray) and value.dtype == np.float32
        np.testing.assert_array_equal(value, ref, err_msg=name)
    for p, value in zip(main.params[1:], params.values()):
        assert [int(d) for d in _tensor_shape(p)] == list(value.shape)
    # The imported graph holds the ops of the model.
    hist = plus_tvm.stats.op_histogram(mod)
    assert hist["relax.matmul"] == 2 and hist["relax.nn.layer_norm"] == 1
    assert hist["relax.nn.gelu"] == 1


def test_from_torch_accepts_exported_program():
    model = SmallNet().eval()
    program = torch.export.export(model, (torch.randn(2, 8),))
    mod, params = plus_tvm.from_torch(program)
    assert num_inputs(mod) == 1 and len(params) == 6


def test_from_torch_dynamic_batch_runs_at_two_sizes():
    model = SmallNet().eval()
    dims = {"x": {0: torch.export.Dim("batch", min=1, max=64)}}
    mod, params = plus_tvm.from_torch(model, (torch.randn(3, 8),), dynamic_shapes=dims)
    batch, feat = _tensor_shape(mod["main"].params[0])
    assert isinstance(batch, tvm.tirx.Var)  # symbolic, not a fixed 3
    assert int(feat) == 8
    compiled = plus_tvm.compile((mod, params))
    assert isinstance(compiled.inputs[0].shape[0], str)
    for n in (1, 5):
        x = torch.randn(n, 8)
        with torch.no_grad():
            expected = model(x).numpy()
        got = compiled(x)
        assert got.shape == (n, 4)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_from_torch_unsupported_operator_names_op_and_node():
    with pytest.raises(UnsupportedOperatorError) as info:
        plus_tvm.from_torch(Erfinv(), (torch.rand(2, 3),), host_fallback=False)
    msg = str(info.value)
    assert "erfinv.default" in msg
    assert "node 'erfinv'" in msg
    assert "test_frontend.py" in msg  # where in the user's code


def test_from_torch_converter_failure_names_op_and_node(monkeypatch):
    import plus_tvm.torch_fixes as fixes
    from plus_tvm.errors import InputRefusedError

    original = fixes.custom_convert_map

    def broken_relu(node, importer):  # a converter refusing its input, as TVM's do
        raise InputRefusedError("converter exploded")

    monkeypatch.setattr(
        fixes, "custom_convert_map", lambda: {**original(), "relu.default": broken_relu}
    )

    class ReluNet(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) + 1

    with pytest.raises(UnsupportedOperatorError) as info:
        plus_tvm.from_torch(ReluNet(), (torch.randn(2, 3),))
    msg = str(info.value)
    assert "relu.default" in msg and "node 'relu'" in msg and "converter exploded" in msg


def test_a_bug_in_a_plus_converter_propagates(monkeypatch):
    """An error of plus_tvm's own converter code is a bug, never reported as the operator
    being unsupported."""
    import plus_tvm.torch_fixes as fixes

    original = fixes.custom_convert_map

    def buggy_relu(node, importer):
        return node.no_such_attribute  # AttributeError in plus_tvm-side code

    monkeypatch.setattr(
        fixes, "custom_convert_map", lambda: {**original(), "relu.default": buggy_relu}
    )

    class ReluNet(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) + 1

    with pytest.raises(AttributeError, match="no_such_attribute"):
        plus_tvm.from_torch(ReluNet(), (torch.randn(2, 3),))


def test_from_torch_bad_arguments():
    with pytest.raises(ModelLoadError, match="example_args"):
        plus_tvm.from_torch(SmallNet())
    with pytest.raises(ModelLoadError, match="str"):
        plus_tvm.from_torch("not a model", ())


def test_from_torch_export_failure_is_model_load_error():
    class DataDependent(torch.nn.Module):
        def forward(self, x):
            y = x[x > 0]
            if y.shape[0] > 2:  # a size from the data: torch.export cannot trace it
                return y + 1
            return y - 1

    with pytest.raises(ModelLoadError, match="torch.export failed for DataDependent"):
        plus_tvm.from_torch(DataDependent(), (torch.randn(2, 3),))


# ------------------------------------------------------------------------------------- onnx
@pytest.fixture(scope="module")
def cnn_onnx(tmp_path_factory):
    """SmallCNN exported twice: static shapes and a dynamic batch axis."""
    model = SmallCNN().eval()
    folder = tmp_path_factory.mktemp("onnx")
    paths = {}
    for name, dyn in (("static", None), ("dynamic", {"x": {0: "batch"}, "y": {0: "batch"}})):
        path = folder / f"cnn_{name}.onnx"
        torch.onnx.export(
            model,
            (torch.randn(2, 3, 8, 8),),
            str(path),
            input_names=["x"],
            output_names=["y"],
            dynamic_axes=dyn,
            dynamo=False,
        )
        paths[name] = str(path)
    return model, paths


def test_from_onnx_matches_onnxruntime(cnn_onnx):
    model, paths = cnn_onnx
    mod, params = plus_tvm.from_onnx(paths["static"])
    main = mod["main"]
    assert num_inputs(mod) == 1 and main.params[0].name == "x"
    assert list(params) == [p.name for p in main.params[1:]]
    np.testing.assert_array_equal(params["conv.weight"], model.conv.weight.detach().numpy())
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype("float32")
    expected = ort.InferenceSession(paths["static"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(plus_tvm.compile((mod, params))(x), expected, rtol=1e-5, atol=1e-6)


def test_from_onnx_dynamic_batch(cnn_onnx):
    _, paths = cnn_onnx
    mod, params = plus_tvm.from_onnx(onnx.load(paths["dynamic"]))  # a ModelProto works too
    batch = _tensor_shape(mod["main"].params[0])[0]
    assert isinstance(batch, tvm.tirx.Var) and batch.name == "batch"
    compiled = plus_tvm.compile((mod, params))
    sess = ort.InferenceSession(paths["dynamic"])
    rng = np.random.default_rng(1)
    for n in (1, 3):
        x = rng.standard_normal((n, 3, 8, 8)).astype("float32")
        got = compiled(x)
        assert got.shape == (n, 5)
        np.testing.assert_allclose(got, sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_from_onnx_shape_dict(cnn_onnx):
    _, paths = cnn_onnx
    mod, _ = plus_tvm.from_onnx(paths["dynamic"], shape_dict={"x": [4, 3, 8, 8]})
    assert [int(d) for d in _tensor_shape(mod["main"].params[0])] == [4, 3, 8, 8]
    mod, _ = plus_tvm.from_onnx(paths["static"], shape_dict={"x": ["n", 3, 8, 8]})
    assert isinstance(_tensor_shape(mod["main"].params[0])[0], tvm.tirx.Var)
    with pytest.raises(ModelLoadError, match="names no input.*'z'"):
        plus_tvm.from_onnx(paths["static"], shape_dict={"z": [1]})


def test_from_onnx_missing_file(tmp_path):
    missing = tmp_path / "nope.onnx"
    with pytest.raises(ModelLoadError, match="not found.*nope.onnx"):
        plus_tvm.from_onnx(str(missing))


def test_from_onnx_corrupt_file(tmp_path):
    bad = tmp_path / "corrupt.onnx"
    bad.write_bytes(np.random.default_rng(0).integers(0, 256, 512, dtype=np.uint8).tobytes())
    with pytest.raises(ModelLoadError, match="corrupt.onnx"):
        plus_tvm.from_onnx(str(bad))


def test_from_onnx_unsupported_operator_names_op_and_node(tmp_path):
    # an op of a domain no converter and not ONNX's reference implementation (the host) knows
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["h"], name="first_relu"),
            helper.make_node("Celu2", ["h"], ["y"], name="my_celu", domain="com.example"),
        ],
        "celu_graph",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    opsets = [helper.make_opsetid("", 13), helper.make_opsetid("com.example", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    path = tmp_path / "celu.onnx"
    onnx.save(model, str(path))
    with pytest.raises(UnsupportedOperatorError) as info:
        plus_tvm.from_onnx(str(path))
    msg = str(info.value)
    assert "Celu2" in msg and "'my_celu'" in msg and "celu.onnx" in msg
