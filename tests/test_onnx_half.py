"""ONNX models with float16 / bfloat16 tensors compute as ONNX Runtime's CPU provider does:
matrix products and convolutions accumulate in float32 and round once, reductions, softmax and
normalizations run in float32. Each case is long enough (a 4096-term dot product, an 8192-wide
row) that half-precision accumulation would be visibly less accurate."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import plus_tvm
import pytest
from onnx import TensorProto, helper, numpy_helper

F16, BF16 = TensorProto.FLOAT16, TensorProto.BFLOAT16
RNG = np.random.default_rng(0)


def _model(nodes, inputs, initializers=(), elem=F16, opset=17):
    outputs = [helper.make_tensor_value_info(nodes[-1].output[0], elem, None)]
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _info(name, shape, elem=F16):
    return helper.make_tensor_value_info(name, elem, shape)


def _half(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float16)


def _plus(model, *inputs, dispatch=True):
    """plus's result; ``dispatch=False``: TVM's kernels only (what the import itself gives,
    without plus's library kernels, which accumulate half products in float32 anyway)."""
    options = plus_tvm.Options(dispatch=dispatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # (outputs declared without a shape)
        cm = plus_tvm.compile(model, "llvm", options=options)
    return np.asarray(cm(*inputs))


def _ort(model, feeds):
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def _error(got, ref):
    """max |got - ref| / max |ref| (the accuracy contract's measure)."""
    return float(np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max())


def _half_accumulated_matmul(a, b):
    """What a float16 accumulator gives (TVM's converter before this layer)."""
    acc = np.zeros((a.shape[0], b.shape[1]), np.float16)
    for k in range(a.shape[1]):
        acc = (acc + a[:, k : k + 1] * b[k : k + 1, :]).astype(np.float16)
    return acc


def test_float16_matmul_accumulates_in_float32_like_onnx_runtime():
    a, b = _half(4, 4096), _half(4096, 8)
    model = _model(
        [helper.make_node("MatMul", ["a", "b"], ["y"])],
        [_info("a", [4, 4096]), _info("b", [4096, 8])],
    )
    got = _plus(model, a, b)
    want = _ort(model, {"a": a, "b": b})
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert got.dtype == np.float16
    # ONNX Runtime: float32 products rounded once; plus gives the same values
    np.testing.assert_array_equal(
        got, (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)
    )
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=0, atol=1e-3)
    # a float16 accumulator is an order of magnitude worse: the case tells them apart
    assert _error(_half_accumulated_matmul(a, b), ref) > 10 * _error(got, ref)
    assert _error(got, ref) <= 1.5 * _error(want, ref) + 1e-4


@pytest.mark.parametrize("dispatch", [True, False])
def test_float16_gemm_applies_alpha_beta_and_bias_before_the_one_rounding(dispatch):
    a, w, c = _half(4, 4096), _half(8, 4096), _half(8)
    node = helper.make_node("Gemm", ["a", "w", "c"], ["y"], transB=1, alpha=0.7, beta=1.3)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(c, "c")]
    model = _model([node], [_info("a", [4, 4096])], inits)
    got = _plus(model, a, dispatch=dispatch)
    want = _ort(model, {"a": a})
    exact = 0.7 * (a.astype(np.float64) @ w.T.astype(np.float64)) + 1.3 * c.astype(np.float64)
    assert got.dtype == np.float16
    np.testing.assert_allclose(
        got.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=1e-3
    )
    assert _error(got, exact) <= 1.5 * _error(want, exact) + 1e-4


@pytest.mark.parametrize("dispatch", [True, False])
@pytest.mark.parametrize("op", ["Conv", "ConvTranspose"])
def test_float16_convolutions_accumulate_in_float32(op, dispatch):
    x = _half(1, 256, 6, 6)
    w = _half(16, 256, 3, 3) if op == "Conv" else _half(256, 16, 3, 3)
    bias = _half(16)
    attrs = {"pads": [1, 1, 1, 1]} if op == "Conv" else {"strides": [2, 2]}
    node = helper.make_node(op, ["x", "w", "b"], ["y"], **attrs)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "b")]
    model = _model([node], [_info("x", [1, 256, 6, 6])], inits)
    got = _plus(model, x, dispatch=dispatch)
    want = _ort(model, {"x": x})
    # float64 reference: the same graph in double precision (ONNX's reference implementation)
    from onnx.reference import ReferenceEvaluator

    double = _model(
        [node],
        [_info("x", [1, 256, 6, 6], TensorProto.DOUBLE)],
        [
            numpy_helper.from_array(w.astype(np.float64), "w"),
            numpy_helper.from_array(bias.astype(np.float64), "b"),
        ],
        elem=TensorProto.DOUBLE,
    )
    ref = ReferenceEvaluator(double).run(None, {"x": x.astype(np.float64)})[0]
    assert got.dtype == np.float16 and got.shape == want.shape
    assert _error(got, ref) <= 1.5 * _error(want, ref) + 1e-4


@pytest.mark.parametrize("op", ["Softmax", "ReduceMean"])
def test_float16_softmax_and_reductions_run_in_float32(op):
    x = (_half(2, 8192, scale=3.0) + np.float16(3)).astype(np.float16)
    attrs = {"axes": [1]} if op == "ReduceMean" else {}
    model = _model([helper.make_node(op, ["x"], ["y"], **attrs)], [_info("x", [2, 8192])])
    got = _plus(model, x)
    want = _ort(model, {"x": x})
    assert got.dtype == np.float16
    np.testing.assert_allclose(
        got.astype(np.float32), want.astype(np.float32), rtol=1e-3, atol=1e-6
    )


def test_the_imported_float16_matmul_keeps_half_operands_and_a_float32_accumulator():
    from plus_tvm.onnx_import.importer import import_model

    model = _model(
        [helper.make_node("MatMul", ["a", "b"], ["y"])], [_info("a", [2, 8]), _info("b", [8, 4])]
    )
    text = import_model(model, None, {}).script()
    assert 'R.matmul(a, b, out_dtype="float32")' in text
    assert 'R.astype(lv, dtype="float16")' in text


def test_bfloat16_matmul_accumulates_in_float32():
    # ONNX Runtime's CPU provider has no bfloat16 MatMul: the reference is float32 math
    a = RNG.standard_normal((4, 4096)).astype(ml_dtypes.bfloat16)
    b = RNG.standard_normal((4096, 8)).astype(ml_dtypes.bfloat16)
    model = _model(
        [helper.make_node("MatMul", ["a", "b"], ["y"])],
        [_info("a", [4, 4096], BF16), _info("b", [4096, 8], BF16)],
        elem=BF16,
    )
    got = _plus(model, a, b)
    assert got.dtype == ml_dtypes.bfloat16
    want = (a.astype(np.float32) @ b.astype(np.float32)).astype(ml_dtypes.bfloat16)
    np.testing.assert_allclose(
        got.astype(np.float32), want.astype(np.float32), rtol=1e-2, atol=1e-2
    )


def test_a_float32_model_is_imported_as_before():
    from plus_tvm.onnx_import.importer import import_model

    model = _model(
        [helper.make_node("MatMul", ["a", "b"], ["t"]), helper.make_node("Softmax", ["t"], ["y"])],
        [_info("a", [2, 8], TensorProto.FLOAT), _info("b", [8, 4], TensorProto.FLOAT)],
        elem=TensorProto.FLOAT,
    )
    text = import_model(model, None, {}).script()
    assert "astype" not in text and "out_dtype=None" in text
