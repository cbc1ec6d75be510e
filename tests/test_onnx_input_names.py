"""An ONNX model's inputs keep the graph's own names, also where they are not identifiers
(``input.1``, ``x:0``, ``1``): a call binds them by those names, and every input error names
the input as the graph does (TVM's importer renamed ``input.1`` to ``input_1`` and ``1`` to
``input_1``: the errors named inputs the user's model does not have)."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import plus_tvm
import pytest
from onnx import TensorProto, helper
from plus_tvm.errors import InputError

NAMES = ("input.1", "x:0", "1")


def _model() -> onnx.ModelProto:
    def info(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", 3])

    nodes = [
        helper.make_node("Add", ["input.1", "x:0"], ["sum"]),
        helper.make_node("Mul", ["sum", "1"], ["out:0"]),
    ]
    graph = helper.make_graph(nodes, "g", [info(n) for n in NAMES], [info("out:0")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


@pytest.fixture(scope="module")
def compiled():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (TVM warned "Renaming name input.1 to input_1")
        return plus_tvm.compile(_model(), target="llvm")


def _arrays(batch: int = 2) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal((batch, 3)).astype("float32") for _ in NAMES]


def test_the_inputs_are_called_by_the_graph_names(compiled):
    a, b, c = _arrays()
    assert compiled.input_names == list(NAMES)
    assert [s.name for s in compiled.inputs] == list(NAMES)
    want = (a + b) * c
    np.testing.assert_allclose(compiled(a, b, c), want, rtol=1e-6)
    np.testing.assert_allclose(compiled(**dict(zip(NAMES, (a, b, c)))), want, rtol=1e-6)
    (got,) = compiled.run(None, dict(zip(NAMES, (a, b, c))))
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("k", range(len(NAMES)))
def test_a_wrong_dtype_or_rank_names_the_graph_input(compiled, k):
    arrays = _arrays()
    wrong = list(arrays)
    wrong[k] = arrays[k].astype("float64")
    with pytest.raises(InputError, match=rf"^input {NAMES[k]}: expected dtype float32"):
        compiled(*wrong)
    wrong[k] = arrays[k][0]
    with pytest.raises(InputError, match=rf"^input {NAMES[k]}: expected shape \(batch, 3\)"):
        compiled(*wrong)


def test_a_mismatched_symbolic_dim_names_the_graph_input(compiled):
    a, b, c = _arrays()
    with pytest.raises(InputError, match=r"^input 1: symbolic dim batch is 4 here but 2"):
        compiled(a, b, np.zeros((4, 3), "float32"))


def test_missing_inputs_are_listed_by_the_graph_names(compiled):
    a, b, _ = _arrays()
    listed = r"input\.1, x:0, 1"
    with pytest.raises(InputError, match=rf"takes 3 input\(s\) \({listed}\), got 2"):
        compiled(a, b)
    with pytest.raises(InputError, match=rf"missing input\(s\) '1'.* {listed}"):
        compiled(**{"input.1": a, "x:0": b})
    with pytest.raises(InputError, match=r"no input named 'input_1'"):
        compiled(**{"input_1": a, "x:0": b, "1": b})


def test_an_exported_model_keeps_the_graph_names(compiled, tmp_path):
    path = str(tmp_path / "m.so")
    compiled.export_library(path)
    loaded = plus_tvm.load(path)
    a, b, c = _arrays()
    assert loaded.input_names == list(NAMES)
    np.testing.assert_allclose(loaded(a, b, c), (a + b) * c, rtol=1e-6)
    with pytest.raises(InputError, match=r"^input input\.1: expected dtype float32"):
        loaded(a.astype("float64"), b, c)
