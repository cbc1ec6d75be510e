"""ONNX TopK against ONNX Runtime, NaN and infinities included
(python/plus_tvm/onnx_import/converters/top_k.py): ONNX Runtime takes NaN as the largest
value; TVM 0.27 returned a row holding a NaN in an undefined order, and an opset-10 TopK (``k``
an input) as a top-1."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import plus_tvm
import pytest
from onnx import TensorProto, helper

SHAPE = (3, 6, 7)
ELEM = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "int64": TensorProto.INT64}


def _model(dtype: str, opset: int) -> onnx.ModelProto:
    cases = [(3, -1, 1), (2, 1, 0), (4, 2, 0), (6, 1, 1)] if opset >= 11 else [(3, -1, 1)]
    nodes, outputs, inits = [], [], []
    for n, (k, axis, largest) in enumerate(cases):
        inits.append(helper.make_tensor(f"k{n}", TensorProto.INT64, [1], [k]))
        attrs = {"axis": axis, **({"largest": largest} if opset >= 11 else {})}
        nodes.append(helper.make_node("TopK", ["x", f"k{n}"], [f"v{n}", f"i{n}"], **attrs))
        shape = list(SHAPE)
        shape[axis] = k
        outputs += [
            helper.make_tensor_value_info(f"v{n}", ELEM[dtype], shape),
            helper.make_tensor_value_info(f"i{n}", TensorProto.INT64, shape),
        ]
    x = helper.make_tensor_value_info("x", ELEM[dtype], list(SHAPE))
    graph = helper.make_graph(nodes, "g", [x], outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _input(dtype: str, seed: int) -> np.ndarray:
    """Distinct values (ONNX Runtime's order of ties is its own) with NaN and +-inf; a row of
    NaN and a row of -inf."""
    rng = np.random.default_rng(seed)
    x = rng.permutation(np.prod(SHAPE)).reshape(SHAPE).astype(np.float64) - 60
    if dtype.startswith("float"):
        r = rng.random(SHAPE)
        x[r < 0.15] = np.nan
        x[(r >= 0.15) & (r < 0.18)] = np.inf
        x[(r >= 0.18) & (r < 0.21)] = -np.inf
        x[0, 0, :] = np.nan
        x[1, 2, :] = -np.inf
    return x.astype(dtype)


@pytest.mark.parametrize("opset", [10, 13])
@pytest.mark.parametrize("dtype", ["float32", "float16", "int64"])
def test_top_k_matches_onnxruntime(dtype, opset):
    if opset == 10 and dtype == "int64":
        pytest.skip("TopK-10 takes float tensors only")
    model = _model(dtype, opset)
    onnx.checker.check_model(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cm = plus_tvm.compile(model, target="llvm")
    for seed in (0, 1):
        x = _input(dtype, seed)
        got = cm(x)
        got = got if isinstance(got, tuple) else (got,)
        for n, (g, w) in enumerate(zip(got, session.run(None, {"x": x}))):
            assert g.dtype == w.dtype and g.shape == w.shape, (n, g.shape, w.shape)
            np.testing.assert_array_equal(g, w, err_msg=f"output {n}")
