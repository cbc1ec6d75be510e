"""ONNX nodes no converter compiles run on the host by ONNX's reference implementation
(``onnx_import/host_nodes.py``, ``runtime/onnx_host.py``). Each result is checked against numpy
written here (not the reference the host runs), with compiled ops before and after the node."""

from __future__ import annotations

import numpy as np
import plus_tvm
import pytest
from onnx import TensorProto, helper
from plus_tvm.errors import UnsupportedOperatorError
from plus_tvm.report import stats_text

F, I64 = TensorProto.FLOAT, TensorProto.INT64
RNG = np.random.default_rng(3)


def _model(nodes, inputs, outputs, opset=18):
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _info(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _reduce_model(keepdims, noop=0, n_axes=1):
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node(
            "ReduceSum",
            ["r", "axes"],
            ["s"],
            name="sum_it",
            keepdims=keepdims,
            noop_with_empty_axes=noop,
        ),
        helper.make_node("Exp", ["s"], ["y"]),  # compiled, on the host node's symbolic shape
    ]
    return _model(
        nodes, [_info("x", F, [2, 3, 4]), _info("axes", I64, [n_axes])], [_info("y", F, None)]
    )


@pytest.mark.parametrize(
    "keepdims, noop, axes",
    [(1, 0, [1]), (0, 0, [1]), (0, 0, [-1, 0]), (1, 0, [2, 0]), (1, 0, []), (1, 1, [])],
)
def test_a_reduce_with_runtime_axes_runs_on_the_host(keepdims, noop, axes):
    cm = plus_tvm.compile(_reduce_model(keepdims, noop, len(axes)), "llvm")
    assert len(cm.stats["host_nodes"]) == 1
    assert "'sum_it' of type ReduceSum" in cm.stats["host_nodes"][0]
    assert "constant" in cm.stats["host_nodes"][0].lower()  # the converter's reason
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    for values in (axes, axes[::-1]):  # the same model, other axes at run time
        got = cm(x, np.array(values, dtype=np.int64))
        r = np.maximum(x, 0)
        if not values and noop:
            want = np.exp(r)
        else:
            want = np.exp(r.sum(axis=tuple(values) or None, keepdims=bool(keepdims)))
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5)


def test_an_op_without_a_converter_runs_on_the_host():
    alpha = 0.7
    nodes = [
        helper.make_node("Add", ["x", "x"], ["a"]),
        helper.make_node("Celu", ["a"], ["c"], name="my_celu", alpha=alpha),
        helper.make_node("Mul", ["c", "x"], ["y"]),
    ]
    model = _model(nodes, [_info("x", F, [3, 5])], [_info("y", F, [3, 5])], opset=13)
    with pytest.warns(RuntimeWarning, match=r"1 ONNX node\(s\) run on the host.*my_celu"):
        cm = plus_tvm.compile(model, "llvm")
    assert cm.stats["host_nodes"] == ["#1 'my_celu' of type Celu: no converter for it"]
    lines = stats_text(cm.stats).splitlines()
    assert any(ln.startswith("on the host") and "'my_celu' of type Celu" in ln for ln in lines)
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    a = 2 * x
    celu = np.maximum(0, a) + np.minimum(0, alpha * (np.exp(a / alpha) - 1))
    np.testing.assert_allclose(cm(x), celu * x, rtol=1e-5, atol=1e-6)


def test_a_host_node_with_two_outputs_and_a_runtime_k():
    node = helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=1, name="top")
    model = _model(
        [node],
        [_info("x", F, [2, 6]), _info("k", I64, [1])],
        [_info("values", F, [2, None]), _info("indices", I64, [2, None])],
    )
    cm = plus_tvm.compile(model, "llvm")
    x = RNG.permutation(12).reshape(2, 6).astype(np.float32)
    for k in (1, 4):
        values, indices = cm(x, np.array([k], dtype=np.int64))
        order = np.argsort(-x, axis=1)[:, :k]
        np.testing.assert_array_equal(indices, order)
        np.testing.assert_array_equal(values, np.take_along_axis(x, order, axis=1))


def test_an_exported_model_with_a_host_node_loads_and_runs(tmp_path):
    cm = plus_tvm.compile(_reduce_model(keepdims=1), "llvm")
    path = str(tmp_path / "m.so")
    cm.export_library(path)
    loaded = plus_tvm.load(path)
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    axes = np.array([1], dtype=np.int64)
    np.testing.assert_allclose(loaded(x, axes), cm(x, axes), rtol=1e-6)


@pytest.mark.parametrize(
    "node, why",
    [
        (helper.make_node("RandomUniformLike", ["x"], ["y"], name="draw"), "random"),
        (helper.make_node("Frobnicate", ["x"], ["y"], name="frob", domain="com.example"), "domain"),
    ],
)
def test_nodes_that_cannot_run_on_the_host_still_fail_naming_the_node(node, why):
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("com.example", 1)]
    graph = helper.make_graph([node], "g", [_info("x", F, [2, 2])], [_info("y", F, [2, 2])])
    model = helper.make_model(graph, opset_imports=opsets)
    with pytest.raises(UnsupportedOperatorError) as info:
        plus_tvm.from_onnx(model)
    assert node.name in str(info.value) and node.op_type in str(info.value)


def test_a_value_the_reference_refuses_at_run_time_names_the_node():
    cm = plus_tvm.compile(_reduce_model(keepdims=1), "llvm")
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    with pytest.raises(RuntimeError, match=r"ReduceSum node sum_it \(run on the host"):
        cm(x, np.array([7], dtype=np.int64))  # no axis 7 in a 3-d tensor


def test_a_scalar_host_output_stays_zero_dimensional():
    node = helper.make_node("Det", ["x"], ["d"], name="det")  # no converter in TVM 0.27
    model = _model([node], [_info("x", F, [3, 3])], [_info("d", F, [])], opset=13)
    cm = plus_tvm.compile(model, "llvm")
    x = RNG.standard_normal((3, 3)).astype(np.float32)
    got = cm(x)
    assert got.shape == () and got.dtype == np.float32
    np.testing.assert_allclose(got, np.linalg.det(x.astype(np.float64)), rtol=1e-4)


def test_host_fallback_off_refuses_an_onnx_host_node_by_name(tmp_path):
    """Options(host_fallback=False) governs ONNX host nodes as it does torch ones: the compile
    fails naming the node instead of running it in numpy; a model without one compiles."""
    model = _reduce_model(keepdims=1)
    off = plus_tvm.Options(host_fallback=False)
    with pytest.raises(UnsupportedOperatorError, match=r"host_fallback is off.*'sum_it' of type"):
        plus_tvm.compile(model, "llvm", options=off)
    path = tmp_path / "reduce.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(UnsupportedOperatorError, match=r"1 host node\(s\) on the host"):
        plus_tvm.compile(str(path), "llvm", options=off)
    plain = _model(
        [helper.make_node("Relu", ["x"], ["y"])], [_info("x", F, [2, 3])], [_info("y", F, [2, 3])]
    )
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_array_equal(plus_tvm.compile(plain, "llvm", options=off)(x), np.maximum(x, 0))
