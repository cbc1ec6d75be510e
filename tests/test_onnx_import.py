"""plus_tvm's ONNX frontend layer: converters TVM lacks or gets wrong, shape values, constants,
and errors that name the node. Every numeric case is checked against ONNX's reference
implementation (``onnx.reference``) on random inputs."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import plus_tvm
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from plus_tvm.errors import UnsupportedOperatorError

F, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _model(nodes, inputs, outputs, initializers=(), opset=23):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _info(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _check(model, feeds, rtol=1e-4, atol=1e-5):
    """Compile with plus, run, compare with ONNX's reference evaluator."""
    onnx.checker.check_model(model)
    want = ReferenceEvaluator(model).run(None, feeds)
    cm = plus_tvm.compile(model, "llvm")
    got = cm(*[feeds[i.name] for i in model.graph.input if i.name in feeds])
    got = got if isinstance(got, tuple) else (got,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return cm


RNG = np.random.default_rng(0)


def _randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


# ----------------------------------------------------------------------------- Attention
@pytest.mark.parametrize(
    "case",
    ["4d", "3d_gqa_causal", "4d_bool_mask_short", "4d_past_causal_softcap", "4d_window_mode2"],
)
def test_standard_attention_matches_the_reference(case):
    b, hq, hk, s, kv, d = 2, 4, 2, 3, 5, 8
    attrs, inputs, feeds = {}, ["q", "k", "v"], {}
    if case.startswith("3d"):
        q_shape, k_shape = [b, s, hq * d], [b, s, hk * d]
        attrs.update(q_num_heads=hq, kv_num_heads=hk, is_causal=1)
        feeds.update(q=_randn(*q_shape), k=_randn(*k_shape), v=_randn(*k_shape))
        out_shape = [b, s, hq * d]
    else:
        feeds.update(q=_randn(b, hq, s, d), k=_randn(b, hq, kv, d), v=_randn(b, hq, kv, d))
        out_shape = [b, hq, s, d]
    infos = [_info(n, F, list(feeds[n].shape)) for n in ("q", "k", "v")]
    outputs = ["y"]
    if case == "4d_bool_mask_short":
        feeds["mask"] = RNG.random((s, kv - 2)) > 0.3
        feeds["mask"][:, 0] = True
        inputs.append("mask")
        infos.append(_info("mask", BOOL, [s, kv - 2]))
    if case == "4d_past_causal_softcap":
        feeds.update(past_k=_randn(b, hq, 2, d), past_v=_randn(b, hq, 2, d))
        inputs += ["", "past_k", "past_v"]
        infos += [_info("past_k", F, [b, hq, 2, d]), _info("past_v", F, [b, hq, 2, d])]
        attrs.update(is_causal=1, softcap=2.0, scale=0.3)
        outputs += ["present_k", "present_v"]
    if case == "4d_window_mode2":
        attrs.update(qk_matmul_output_mode=2)
        outputs += ["", "", "qk"]
    shapes = {
        "y": out_shape,
        "present_k": [b, hq, kv + 2, d],
        "present_v": [b, hq, kv + 2, d],
        "qk": [b, hq, s, kv],
    }
    out_infos = [_info(n, F, shapes[n]) for n in outputs if n]
    node = helper.make_node("Attention", inputs, outputs, **attrs)
    model = _model([node], infos, out_infos)
    _check(model, feeds)


def test_contrib_attention_still_goes_to_tvms_converter():
    from plus_tvm.onnx_import.importer import PlusONNXImporter

    importer = PlusONNXImporter({}, {})
    importer._domain = "com.microsoft"
    with pytest.raises(KeyError, match="num_heads"):  # TVM's contrib converter, not ours
        importer._convert_operator("Attention", [None] * 3, {"tvm_custom": {}}, 23)


# --------------------------------------------------------------------------------- losses
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore", [None, 2, -1])
def test_negative_log_likelihood_loss(reduction, weighted, ignore):
    n, c, d = 3, 5, 4
    x = _randn(n, c, d)
    target = RNG.integers(0, c, (n, d)).astype(np.int64)
    if ignore is not None:
        target[0, 1] = ignore  # -1: outside the classes, must never be read
    feeds = {"x": x, "t": target}
    inputs, infos = ["x", "t"], [_info("x", F, [n, c, d]), _info("t", I64, [n, d])]
    if weighted:
        feeds["w"] = RNG.random(c).astype(np.float32)
        inputs.append("w")
        infos.append(_info("w", F, [c]))
    attrs = {"reduction": reduction}
    if ignore is not None:
        attrs["ignore_index"] = ignore
    node = helper.make_node("NegativeLogLikelihoodLoss", inputs, ["loss"], **attrs)
    loss_shape = [n, d] if reduction == "none" else []
    _check(_model([node], infos, [_info("loss", F, loss_shape)], opset=13), feeds)


@pytest.mark.parametrize("log_prob", [False, True])
def test_softmax_cross_entropy_loss(log_prob):
    n, c = 4, 6
    feeds = {"x": _randn(n, c), "t": RNG.integers(0, c, (n,)).astype(np.int64)}
    feeds["t"][2] = 3
    outputs = ["loss", "logp"] if log_prob else ["loss"]
    node = helper.make_node(
        "SoftmaxCrossEntropyLoss", ["x", "t"], outputs, reduction="mean", ignore_index=3
    )
    infos = [_info("x", F, [n, c]), _info("t", I64, [n])]
    shapes = {"loss": [], "logp": [n, c]}
    _check(_model([node], infos, [_info(o, F, shapes[o]) for o in outputs], opset=13), feeds)


# ------------------------------------------------------------------ constants and shapes
@pytest.mark.parametrize(
    "attr, value",
    [("value_float", 2.5), ("value_floats", [1.0, 2.0, 3.0]), ("value_int", 7)],
)
def test_constant_with_every_value_attribute(attr, value):
    const = helper.make_node("Constant", [], ["c"], **{attr: value})
    cast = helper.make_node("Cast", ["c"], ["cf"], to=F)
    add = helper.make_node("Add", ["x", "cf"], ["y"])
    model = _model([const, cast, add], [_info("x", F, [3])], [_info("y", F, [3])], opset=13)
    _check(model, {"x": _randn(3)})


def test_shape_values_reach_ops_that_take_tensors():
    # Shape -> Cast -> Mul: TVM refuses a shape value as an input of Mul
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Cast", ["s"], ["sf"], to=F),
        helper.make_node("ReduceSum", ["sf"], ["n"], keepdims=0),
        helper.make_node("Mul", ["x", "n"], ["y"]),
    ]
    model = _model(nodes, [_info("x", F, [2, 3])], [_info("y", F, [2, 3])], opset=13)
    _check(model, {"x": _randn(2, 3)})


def test_integer_initializers_are_constants_so_shape_operands_import():
    shape = numpy_helper.from_array(np.array([3, 2], np.int64), "shape")
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    weight = numpy_helper.from_array(_randn(3, 2), "w")
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("Mul", ["r", "w"], ["m"]),
        helper.make_node("ReduceSum", ["m", "axes"], ["y"], keepdims=0),
    ]
    model = _model(
        nodes, [_info("x", F, [2, 3])], [_info("y", F, [3])], [shape, axes, weight], opset=18
    )
    mod, params = plus_tvm.from_onnx(model)
    assert list(params) == ["w"]  # the weight stays a weight; shape and axes are constants
    _check(model, {"x": _randn(2, 3)})


# ----------------------------------------------------------------------------------- errors
def test_an_unsupported_op_names_the_node_and_its_index():
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="first"),
        helper.make_node("Det", ["a"], ["y"], name="the_det", domain="com.example"),
    ]
    model = _model(nodes, [_info("x", F, [2, 2])], [_info("y", F, [])], opset=13)
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(UnsupportedOperatorError, match=r"Det at node #1 'the_det'"):
        plus_tvm.from_onnx(model)


def test_a_failing_converter_names_node_op_and_reason_and_prints_nothing(capfd):
    # Reduce with axes from a graph input: TVM's converter needs them constant, and with a
    # symbolic number of axes and keepdims=0 the output's rank is unknown: no host node either
    node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], name="sum_it", keepdims=0)
    model = _model(
        [node], [_info("x", F, [2, 3]), _info("axes", I64, ["n"])], [_info("y", F, None)], opset=18
    )
    with pytest.raises(UnsupportedOperatorError) as info:
        plus_tvm.from_onnx(model)
    text = str(info.value)
    assert "node #0 'sum_it' of type ReduceSum" in text and "opset 18" in text
    assert "constant" in text.lower()  # the converter's reason
    out, _ = capfd.readouterr()
    assert "Error converting operator" not in out  # TVM's print stays off the user's stdout


def test_a_bug_in_a_plus_converter_propagates(monkeypatch):
    """An error of plus_tvm's own converter code (here an AttributeError) is a bug: it
    propagates, and the node neither goes to the host nor reads as having no converter."""
    from plus_tvm.onnx_import.converters import CONVERTERS
    from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

    class BuggyRelu(OnnxOpConverter):
        @classmethod
        def _impl_v1(cls, bb, inputs, attr, params):
            return inputs[0].no_such_attribute

    monkeypatch.setitem(CONVERTERS, "Relu", BuggyRelu)
    node = helper.make_node("Relu", ["x"], ["y"], name="relu")  # the host could run it
    model = _model([node], [_info("x", F, [4])], [_info("y", F, [4])], opset=13)
    with pytest.raises(AttributeError, match="no_such_attribute"):
        plus_tvm.from_onnx(model)


def test_a_converter_refusing_its_input_still_goes_to_the_host(monkeypatch):
    """What a converter refuses on purpose (``InputRefusedError``, as TVM's refuse with their
    errors) sends the node to the host, as TVM's refusals do."""
    from plus_tvm.errors import InputRefusedError
    from plus_tvm.onnx_import.converters import CONVERTERS
    from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

    class RefusingRelu(OnnxOpConverter):
        @classmethod
        def _impl_v1(cls, bb, inputs, attr, params):
            raise InputRefusedError("not this one")

    monkeypatch.setitem(CONVERTERS, "Relu", RefusingRelu)
    node = helper.make_node("Relu", ["x"], ["y"], name="relu")
    model = _model([node], [_info("x", F, [4])], [_info("y", F, [4])], opset=13)
    with pytest.warns(RuntimeWarning, match="'relu' of type Relu: InputRefusedError: not this one"):
        cm = plus_tvm.compile(model, "llvm")
    x = _randn(4)
    np.testing.assert_array_equal(cm(x), np.maximum(x, 0))


# ------------------------------------------------------- converters TVM gets silently wrong
@pytest.mark.parametrize("axis", [-1, 1, 0])
def test_layer_normalization_returns_mean_and_inverse_std_dev(axis):
    x = _randn(2, 3, 4)
    norm = list(x.shape)[axis:]
    node = helper.make_node(
        "LayerNormalization", ["x", "g", "b"], ["y", "mean", "inv"], axis=axis, epsilon=1e-3
    )
    stat = [d if i < (axis % 3) else 1 for i, d in enumerate(x.shape)]
    infos = [_info("x", F, [2, 3, 4]), _info("g", F, norm), _info("b", F, norm)]
    outs = [_info("y", F, [2, 3, 4]), _info("mean", F, stat), _info("inv", F, stat)]
    feeds = {"x": x, "g": _randn(*norm), "b": _randn(*norm)}
    _check(_model([node], infos, outs, opset=17), feeds)


def test_layer_normalization_of_float16_uses_float32_statistics():
    x = (_randn(4, 64) * 30).astype(np.float16)
    node = helper.make_node("LayerNormalization", ["x", "g"], ["y"])
    infos = [_info("x", TensorProto.FLOAT16, [4, 64]), _info("g", TensorProto.FLOAT16, [64])]
    model = _model([node], infos, [_info("y", TensorProto.FLOAT16, [4, 64])], opset=17)
    _check(model, {"x": x, "g": np.ones(64, np.float16)}, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("negative, positive", [(1, 0), (0, 1), (1, 1), (0, 0)])
def test_is_inf_honours_its_detection_attributes(negative, positive):
    x = np.array([1.0, np.inf, -np.inf, np.nan, -2.0], np.float32)
    node = helper.make_node(
        "IsInf", ["x"], ["y"], detect_negative=negative, detect_positive=positive
    )
    model = _model([node], [_info("x", F, [5])], [_info("y", BOOL, [5])], opset=13)
    _check(model, {"x": x})


def test_expand_to_a_shape_known_at_run_time_follows_broadcasting():
    node = helper.make_node("Expand", ["x", "shape"], ["y"])
    model = _model(
        [node],
        [_info("x", F, [3, 1]), _info("shape", I64, [3])],
        [_info("y", F, ["a", "b", "c"])],
        opset=13,
    )
    x = _randn(3, 1)
    cm = plus_tvm.compile(model, "llvm")
    for shape in ([2, 1, 6], [1, 3, 1], [4, 3, 2]):
        want = x * np.ones(np.broadcast_shapes(x.shape, tuple(shape)), np.float32)
        np.testing.assert_array_equal(cm(x, np.array(shape, np.int64)), want)


def test_a_graph_output_without_a_shape_imports_as_in_tvm():
    # ONNX's checker calls it incomplete; TVM's importer (and so plus) warns and goes on
    node = helper.make_node("Relu", ["x"], ["y"])
    model = _model([node], [_info("x", F, [4])], [_info("y", F, None)], opset=13)
    with pytest.warns(UserWarning, match="checker"):
        cm = plus_tvm.compile(model, "llvm")
    x = _randn(4)
    np.testing.assert_array_equal(cm(x), np.maximum(x, 0))


def test_dynamic_batch_multihead_attention_matches_onnx_runtime(tmp_path):
    # torch's export builds each head reshape's target as Concat(shape values, constants): with
    # the constants as tensors the Reshape went to the host, its dims were unknown and a matmul
    # of two host results had no shape ("internal error ... FoldConstant: 'NoneType' object is
    # not iterable")
    torch = pytest.importorskip("torch")
    ort = pytest.importorskip("onnxruntime")

    class MHA(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = torch.nn.MultiheadAttention(16, 2, batch_first=True)

        def forward(self, x):
            return self.mha(x, x, x, need_weights=False)[0]

    torch.manual_seed(0)
    path = str(tmp_path / "mha.onnx")
    torch.onnx.export(
        MHA().eval(),
        (torch.randn(2, 5, 16),),
        path,
        input_names=["x"],
        output_names=["y"],
        dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}},
        dynamo=False,
        opset_version=17,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no node runs on the host
        cm = plus_tvm.compile(path, target="llvm")
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for batch in (1, 3):
        x = _randn(batch, 5, 16)
        got = np.asarray(cm(x))
        want = session.run(None, {"x": x})[0]
        assert got.shape == want.shape == (batch, 5, 16)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_concat_of_shape_values_and_constant_pieces_stays_a_shape():
    # Reshape(x, Concat(Shape(x)[:1], [-1, 2])): a shape value, so Reshape imports (no host)
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], end=1),
        helper.make_node("Concat", ["s", "tail"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"]),
    ]
    tail = numpy_helper.from_array(np.array([-1, 2], np.int64), "tail")
    model = _model(
        nodes, [_info("x", F, ["b", 3, 4])], [_info("y", F, ["b", 6, 2])], [tail], opset=17
    )
    from plus_tvm.onnx_import.importer import import_model

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        mod = import_model(model, None, {})
    assert "onnx_host" not in mod.script()
    x = _randn(2, 3, 4)
    np.testing.assert_array_equal(plus_tvm.compile(model, "llvm")(x), x.reshape(2, 6, 2))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_float_mod_is_numpys_modulo_with_infinities_and_signed_zeros(dtype):
    # TVM's floor_mod (a - floor(a / b) * b) gave nan for a finite dividend and an infinite
    # divisor, and +0 where the divisor is negative
    a = np.array([0, -0.0, 0, -0.0, -3, 3, -1, 1, np.inf, -np.inf, 1, 1, np.nan, 1, 5.5], dtype)
    b = np.array(
        [-2, 2, 2, -2, np.inf, np.inf, -np.inf, -np.inf, 2, 2, 0, -0.0, 2, np.nan, -2], dtype
    )
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    node = helper.make_node("Mod", ["a", "b"], ["y"], fmod=0)
    model = _model(
        [node], [_info("a", elem, [15]), _info("b", elem, [15])], [_info("y", elem, [15])], opset=13
    )
    got = plus_tvm.compile(model, "llvm")(a, b)
    with np.errstate(all="ignore"):
        want = np.mod(a, b)
    np.testing.assert_array_equal(got, want)  # (nan where numpy has nan)
    numbers = ~np.isnan(want)
    assert np.array_equal(np.signbit(got[numbers]), np.signbit(want[numbers]))


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_reduce_max_and_min_of_infinities_give_infinities(op, dtype):
    # TVM's reductions start from the dtype's finite extreme: a row of -inf had max -3.4e38
    # (float16: -65504), and a fully masked attention row's NaN went through the mask check
    sign = -1 if op == "ReduceMax" else 1
    big = np.finfo(dtype).max
    x = np.array(
        [[sign * np.inf] * 3, [1, 2, sign * np.inf], [sign * big, sign * np.inf, sign * np.inf]],
        dtype,
    )
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    node = helper.make_node(op, ["x"], ["y"], axes=[-1], keepdims=1)
    model = _model([node], [_info("x", elem, [3, 3])], [_info("y", elem, [3, 1])], opset=17)
    want = (np.max if op == "ReduceMax" else np.min)(x, axis=-1, keepdims=True)
    np.testing.assert_array_equal(plus_tvm.compile(model, "llvm")(x), want)


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("axes", [[-1], [0], None])
def test_reduce_max_and_min_give_nan_wherever_the_nan_lies(op, axes):
    # numpy's, torch's and ONNX's reference semantics: any NaN reduced gives NaN, whatever its
    # position (a fold of ordered comparisons keeps a NaN only where it comes last; ONNX
    # Runtime's CPU kernel depends on the position too, onnxruntime#10514)
    x = np.arange(1, 1 + 5 * 37, dtype=np.float32).reshape(5, 37)
    x[0, 0] = x[1, 18] = x[2, 36] = np.nan  # first, middle, last of a row
    x[4, 3] = np.nan
    attrs = {"keepdims": 0} if axes is None else {"axes": axes, "keepdims": 0}
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    model = _model(
        [node], [_info("x", TensorProto.FLOAT, [5, 37])], [_info("y", 1, None)], opset=17
    )
    want = (np.max if op == "ReduceMax" else np.min)(x, axis=None if axes is None else axes[0])
    np.testing.assert_array_equal(np.asarray(plus_tvm.compile(model, "llvm")(x)), want)
