"""Every gather / scatter index in range, or an error naming the op and the node.

Each family gets an index computed inside the model (``i + 1``), run in range (same values as
the reference), one past the end and 1e9 past it (an error, never a wrong value or a crash);
the torch path checks with torch's ranges and names the node and its source line, the ONNX
path with ONNX's (``-n..-1`` count from the end)."""

from __future__ import annotations

import numpy as np
import plus_tvm
import pytest
import torch
import tvm
from onnx import TensorProto, helper
from plus_tvm.errors import IndexOutOfRangeError
from plus_tvm.pipeline import phase_passes
from plus_tvm.target import resolve_target
from torch import nn

RNG = np.random.default_rng(0)
X = torch.randn(10, 4)


class Embedding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)

    def forward(self, i):
        return self.emb(i + 1)


class Gather(nn.Module):
    def forward(self, x, i):
        return torch.gather(x, 1, i + 1)


class Scatter(nn.Module):
    def forward(self, x, i, v):
        return torch.scatter(x, 0, i + 1, v)


class IndexSelect(nn.Module):
    def forward(self, x, i):
        return torch.index_select(x, 0, i + 1)


class Index(nn.Module):
    def forward(self, x, i):
        return x[i + 1]


class AdvancedIndex(nn.Module):
    def forward(self, x, i, j):
        return x[i + 1, j]


def _long(shape, value):
    return torch.full(shape, value, dtype=torch.long)


# name -> (module, inputs with the index set to ``value`` (the model adds 1), extent, node)
TORCH_CASES = {
    "embedding": (Embedding(), lambda v: (_long((3,), v),), 10, "embedding"),
    "gather": (Gather(), lambda v: (X, _long((10, 2), v)), 4, "gather"),
    "scatter": (Scatter(), lambda v: (X, _long((1, 4), v), torch.ones(1, 4)), 10, "scatter"),
    "index_select": (IndexSelect(), lambda v: (X, _long((3,), v)), 10, "index_select"),
    "index": (Index(), lambda v: (X, _long((3,), v)), 10, "index_tensor"),
    "advanced_index": (
        AdvancedIndex(),
        lambda v: (X, _long((3,), v), torch.tensor([0, -1, 3])),
        10,
        "index_tensor",
    ),
}


@pytest.mark.parametrize("name", sorted(TORCH_CASES))
def test_torch_index_in_range_and_out_of_range(name):
    model, inputs, n, op = TORCH_CASES[name]
    cm = plus_tvm.compile(model, example_args=inputs(0))
    for ok in (0, n - 2, -1):  # i + 1 in [0, n)
        with torch.no_grad():
            ref = model(*inputs(ok)).numpy()
        np.testing.assert_allclose(np.asarray(cm(*inputs(ok))), ref, rtol=1e-6)
    for bad in (n - 1, 10**9):  # one past the end, far past it
        with pytest.raises(IndexOutOfRangeError, match=rf"{op}.*index {bad + 1} .*outside"):
            cm(*inputs(bad))
    with pytest.raises(IndexOutOfRangeError, match=r"outside"):
        cm(*inputs(-n - 2))  # i + 1 = -n - 1: below every range


def test_torch_checks_name_the_node_and_its_line():
    model, inputs, _, _ = TORCH_CASES["gather"]
    cm = plus_tvm.compile(model, example_args=inputs(0))
    with pytest.raises(IndexOutOfRangeError, match=r"gather 'gather' \(File .*test_index_bounds"):
        cm(*inputs(9))


def test_negative_advanced_indices_count_from_the_end():
    """TVM's index_tensor kernel read garbage for -1 (torch: the last row)."""
    model = AdvancedIndex()
    inputs = (X, torch.tensor([-2, 0, -5]), torch.tensor([-1, 2, -4]))  # i + 1: -1, 1, -4
    cm = plus_tvm.compile(model, example_args=inputs)
    np.testing.assert_allclose(np.asarray(cm(*inputs)), model(*inputs).numpy(), rtol=1e-6)


def _onnx(op: str, idx_shape, out_shape, updates=None, **attrs):
    one = helper.make_tensor("one", TensorProto.INT64, [], [1])
    names = ["data", "idx1"] + (["upd"] if updates else [])
    nodes = [
        helper.make_node("Add", ["idx", "one"], ["idx1"], name="plus_one"),
        helper.make_node(op, names, ["y"], name=f"my_{op}", **attrs),
    ]
    inputs = [
        helper.make_tensor_value_info("data", TensorProto.FLOAT, [10, 4]),
        helper.make_tensor_value_info("idx", TensorProto.INT64, list(idx_shape)),
    ]
    if updates:
        inputs.append(helper.make_tensor_value_info("upd", TensorProto.FLOAT, list(updates)))
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))
    graph = helper.make_graph(nodes, "g", inputs, [out], initializer=[one])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


ONNX_CASES = {
    "Gather": (_onnx("Gather", [3], [3, 4], axis=0), (3,), None, "take"),
    "GatherElements": (
        _onnx("GatherElements", [3, 4], [3, 4], axis=0),
        (3, 4),
        None,
        "gather_elements",
    ),
    "GatherND": (_onnx("GatherND", [3, 1], [3, 4]), (3, 1), None, "gather_nd"),
    "ScatterElements": (
        _onnx("ScatterElements", [3, 4], [10, 4], updates=[3, 4], axis=0),
        (3, 4),
        (3, 4),
        "scatter_elements",
    ),
    "ScatterND": (
        _onnx("ScatterND", [3, 1], [10, 4], updates=[3, 4]),
        (3, 1),
        (3, 4),
        "scatter_nd",
    ),
}


@pytest.mark.parametrize("name", sorted(ONNX_CASES))
def test_onnx_index_in_range_and_out_of_range(name):
    import onnxruntime as ort

    model, idx_shape, updates, op = ONNX_CASES[name]
    cm = plus_tvm.compile(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    data = RNG.standard_normal((10, 4)).astype(np.float32)
    extra = [np.ones(updates, np.float32)] if updates else []
    feeds = {"data": data}
    if updates:
        feeds["upd"] = extra[0]
    for ok in (0, 8, -3, -11):  # idx + 1 in [-n, n)
        idx = np.full(idx_shape, ok, np.int64)
        ref = session.run(None, {**feeds, "idx": idx})[0]
        np.testing.assert_allclose(np.asarray(cm(data, idx, *extra)), ref, rtol=1e-6)
    for bad in (9, -12, 10**9):
        idx = np.full(idx_shape, bad, np.int64)
        with pytest.raises(IndexOutOfRangeError, match=rf"{op} .*index {bad + 1} .*outside"):
            cm(data, idx, *extra)


def test_a_constant_index_out_of_range_fails_the_compile():
    class Constant(nn.Module):
        def forward(self, x):
            return x[torch.tensor([3, 12])]

    with pytest.raises(IndexOutOfRangeError, match=r"index_tensor.*index 12"):
        plus_tvm.compile(Constant(), example_args=(X,))


def test_the_cli_exits_2_on_an_index_out_of_range(tmp_path, capsys):
    from plus_tvm.cli import main

    model, idx_shape, _, _ = ONNX_CASES["GatherND"]
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    inputs = tmp_path / "in.npz"
    data = np.zeros((10, 4), np.float32)
    np.savez(inputs, data=data, idx=np.full(idx_shape, 9, np.int64))
    assert main(["run", str(path), "--inputs", str(inputs)]) == 2
    assert "index out of range" in capsys.readouterr().err


def test_gpu_builds_clamp_instead_of_calling_the_host():
    """A host check would stop CUDA-graph capture: on CUDA every index is clamped in the
    graph (the frontend's checks included), and no check call is left."""
    model, inputs, _, _ = TORCH_CASES["gather"]
    mod, _ = plus_tvm.from_torch(model, inputs(0))
    cuda = resolve_target({"kind": "cuda", "arch": "sm_90"})
    with cuda, tvm.transform.PassContext(opt_level=3):
        out = tvm.transform.Sequential(phase_passes(cuda, plus_tvm.Options(), ("dispatch",)))(mod)
    text = out["main"].script()
    assert "plus.check_indices" not in text and "R.minimum" in text


def test_a_check_returns_a_copy_never_its_input():
    """The VM frees the input's planned storage after its last use, the check: a result that
    aliased it was overwritten before the gather read it (DeBERTa-v2's embeddings)."""
    from plus_tvm.runtime import index_check

    indices = tvm.runtime.tensor(np.arange(3, dtype=np.int64))
    config = index_check.config_text("take", "t", negative=False, last=False)
    out = index_check.run(indices, [5], config)
    assert np.from_dlpack(out).ctypes.data != np.from_dlpack(indices).ctypes.data
    np.testing.assert_array_equal(np.from_dlpack(out), [0, 1, 2])


def test_ids_the_frontend_checked_are_not_checked_again():
    """An embedding's ids: checked once by the frontend (torch's range); the take after their
    reshape needs no second host call (the range it needs is wider)."""
    model, inputs, _, _ = TORCH_CASES["embedding"]
    mod, _ = plus_tvm.from_torch(model, inputs(0))
    llvm = resolve_target("llvm")
    with llvm, tvm.transform.PassContext(opt_level=3):
        out = tvm.transform.Sequential(phase_passes(llvm, plus_tvm.Options(), ("dispatch",)))(mod)
    assert out["main"].script().count("plus.check_indices") == 1
