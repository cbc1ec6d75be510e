"""ONNX ArgMax / ArgMin against ONNX Runtime, NaN and infinities included
(python/plus_tvm/onnx_import/converters/arg_extremes.py).

TVM 0.27 gave index -1 for a row of -inf (ArgMax) or +inf (ArgMin) and ``size`` with
``select_last_index`` (TOPI's argmax starts from index -1 and the lowest finite value), and for
a row with a NaN an index that depends on the reduction order; ONNX Runtime (CPU) scans the row
from its first element and moves on a strictly greater (``>=`` for the last index) value, so a
NaN is never taken, unless it is the first element."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import plus_tvm
import pytest
from onnx import TensorProto, helper

ELEM = {
    "float32": TensorProto.FLOAT,
    "float16": TensorProto.FLOAT16,
    "int32": TensorProto.INT32,
    "int64": TensorProto.INT64,
}
SHAPE = (4, 6, 5)
CASES = [  # (op, axis, keepdims, select_last_index)
    ("ArgMax", 1, 1, 0),
    ("ArgMax", -1, 0, 0),
    ("ArgMax", 0, 0, 1),
    ("ArgMax", 2, 1, 1),
    ("ArgMin", 1, 0, 0),
    ("ArgMin", -1, 1, 0),
    ("ArgMin", 2, 0, 1),
]


def _model(dtype: str) -> onnx.ModelProto:
    nodes, outputs = [], []
    for k, (op, axis, keepdims, last) in enumerate(CASES):
        name = f"y{k}"
        nodes.append(
            helper.make_node(
                op, ["x"], [name], axis=axis, keepdims=keepdims, select_last_index=last
            )
        )
        shape = list(SHAPE)
        shape[axis] = 1
        if not keepdims:
            del shape[axis]
        outputs.append(helper.make_tensor_value_info(name, TensorProto.INT64, shape))
    x = helper.make_tensor_value_info("x", ELEM[dtype], list(SHAPE))
    graph = helper.make_graph(nodes, "g", [x], outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _floats(dtype: str, seed: int) -> np.ndarray:
    """Small integers (ties) with NaN, +-inf, the finite extremes; rows of infinities, a row
    without NaN, rows starting with a NaN."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, SHAPE).astype(np.float64)
    r = rng.random(SHAPE)
    x[r < 0.12] = np.nan
    x[(r >= 0.12) & (r < 0.17)] = np.inf
    x[(r >= 0.17) & (r < 0.22)] = -np.inf
    info = np.finfo(dtype)
    x[0, 0, :] = np.nan
    x[1, 1, :] = [np.inf, -np.inf, np.nan, 1.0, np.nan]
    x[1, 2, :] = [-np.inf, np.nan, -np.inf, np.nan, -np.inf]
    x[2, :, :] = np.arange(SHAPE[1] * SHAPE[2]).reshape(SHAPE[1:]) % 3
    x[3, :, :] = -np.inf
    x[3, 2, :2] = info.min
    x[3, 5, :] = np.inf
    x[3, 1, :] = [info.max, np.inf, np.inf, np.inf, info.min]
    return x.astype(dtype)


def _ints(dtype: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.integers(-2, 3, SHAPE).astype(dtype)
    info = np.iinfo(dtype)
    x[0] = info.min
    x[1] = info.max
    x[2, 3, :] = info.min
    return x


def _check(dtype: str, inputs: list[np.ndarray]) -> None:
    model = _model(dtype)
    onnx.checker.check_model(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cm = plus_tvm.compile(model, target="llvm")
    for x in inputs:
        want = session.run(None, {"x": x})
        got = cm(x)
        for k, (g, w) in enumerate(zip(got, want)):
            assert g.dtype == w.dtype and g.shape == w.shape, (CASES[k], g.shape, w.shape)
            np.testing.assert_array_equal(g, w, err_msg=f"{CASES[k]}")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_float_arg_extremes_match_onnxruntime(dtype):
    rng = np.random.default_rng(5)
    inf = np.full(SHAPE, np.inf, dtype)
    randoms = rng.standard_normal(SHAPE).astype(dtype)
    _check(dtype, [_floats(dtype, 0), _floats(dtype, 1), randoms, inf, -inf])


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_integer_arg_extremes_match_onnxruntime(dtype):
    _check(dtype, [_ints(dtype, 0), _ints(dtype, 1)])
