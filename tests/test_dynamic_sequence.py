"""Dynamic sequence length end to end (issue 13 item 4): ProveSlicesInbound, +Graphs over
symbolic reshapes, and the text models compiled once with a ``Dim`` on the sequence axis and
run at several lengths against torch eager, with the same warehouse entries as a static
compile."""

from __future__ import annotations

import numpy as np
import plus_tvm
import pytest
import torch
import tvm
from _shared_zoo import zoo_stats
from plus_tvm import zoo
from plus_tvm.dispatch.opgraph import OpGraph
from plus_tvm.passes import ProveSlicesInbound
from tvm import relax, tirx


# ------------------------------------------------------------------------ ProveSlicesInbound
def _sliced(lower: int, upper: int | None, end_of, table: int = 64) -> tvm.IRModule:
    """``main(x: (1, n)) = (x + table[:, :end])[...]`` with ``n`` bounded as given."""
    n = tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType([1, n], "float32"))
    tab = relax.const(np.arange(table, dtype="float32").reshape(1, table))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            cut = bb.emit(relax.op.strided_slice(tab, [1], [0], [end_of(n)]))
            # TVM cannot match (1, n) with the clamped length: the sum's shape is unknown
            out = bb.emit_output(relax.op.add(cut, x))
        bb.emit_func_output(out)
    func = bb.get()["main"]
    attrs = {"tir_var_lower_bound": {"n": lower}}
    if upper is not None:
        attrs["tir_var_upper_bound"] = {"n": upper}
    return tvm.IRModule({"main": func.with_attrs(attrs)})


def _slices(mod: tvm.IRModule) -> list[relax.Call]:
    return [
        b.value
        for blk in mod["main"].body.blocks
        for b in blk.bindings
        if isinstance(b.value, relax.Call)
        and isinstance(b.value.op, tvm.ir.Op)
        and b.value.op.name == "relax.strided_slice"
    ]


def _run(mod: tvm.IRModule, x: np.ndarray) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def test_prove_slices_inbound_drops_clamps_the_bounds_rule_out():
    mod = _sliced(1, 64, lambda n: n)
    assert "T.min" in mod.script() and "ndim=2" in mod.script()
    new = ProveSlicesInbound()(mod)
    assert [bool(c.attrs.assume_inbound) for c in _slices(new)] == [True]
    ret = new["main"].ret_ty
    assert str(ret.shape.values[1]) == "n"  # the sum's shape is known again
    assert "T.min" not in new.script()
    assert not bool(_slices(mod)[0].attrs.assume_inbound)  # the input module is untouched
    for length in (1, 5, 64):
        x = np.random.default_rng(length).standard_normal((1, length)).astype("float32")
        np.testing.assert_array_equal(_run(new, x), x + np.arange(length, dtype="float32"))


@pytest.mark.parametrize(
    "lower, upper, end_of",
    [
        (1, None, lambda n: n),  # n may exceed the 64-long table: the clamp is needed
        (1, 128, lambda n: n),
        (0, 64, lambda n: n - 1),  # n = 0 gives end -1
    ],
    ids=["unbounded", "bound-past-table", "may-go-negative"],
)
def test_prove_slices_inbound_keeps_clamps_it_cannot_prove(lower, upper, end_of):
    mod = _sliced(lower, upper, end_of)
    new = ProveSlicesInbound()(mod)
    assert [bool(c.attrs.assume_inbound) for c in _slices(new)] == [False]


def test_prove_slices_inbound_leaves_static_modules_alone():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 8], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.strided_slice(x, [1], [0], [4]))
        bb.emit_func_output(out)
    mod = bb.get()
    assert ProveSlicesInbound()(mod).same_as(mod)


# ---------------------------------------------------------- +Graph over a symbolic reshape
def test_plus_graph_follows_a_symbolic_reshape():
    """(4, s, s) -> (1, 4, s, s) legalizes to ``((i*s + j)*s + k) // (s*s)`` indices: the
    builder resolves them to the iterators, so the matmul, reshape and softmax share loops as
    they do with static sizes."""
    s = tirx.Var("s", "int64")
    a = relax.Var("a", relax.TensorType([4, s, 16], "float32"))
    b = relax.Var("b", relax.TensorType([4, 16, s], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [a, b]):
        with bb.dataflow():
            mm = bb.emit(relax.op.matmul(a, b))
            r = bb.emit(relax.op.reshape(mm, [1, 4, s, s]))
            out = bb.emit_output(relax.op.nn.softmax(r, axis=-1))
        bb.emit_func_output(out)
    mod = bb.get()
    block = mod["main"].body.blocks[0]
    graph = OpGraph(block, mod, {})
    reshape = next(n for n in graph.nodes if n.op_name == "relax.reshape")
    (op,) = reshape.basic
    assert [acc.dims for acc in op.reads] == [(0, 1, 2)]
    assert [acc.dims for acc in op.writes] == [(None, 0, 1, 2)]


# ------------------------------------------------------------------------- the text models
_MODELS = ["bert-base-tiny", "gpt2-tiny", "t5-encoder-tiny", "llama-tiny"]


def _compile_dynamic(name: str):
    model, args = zoo.load(name)
    dims = ({1: torch.export.Dim("seq", min=1, max=64)},)
    program = torch.export.export(model, args, dynamic_shapes=dims)
    return model, plus_tvm.compile(program)


@pytest.mark.parametrize("name", _MODELS)
def test_one_compile_runs_every_sequence_length_exactly(name):
    model, dynamic = _compile_dynamic(name)
    static = zoo_stats(name)  # the static compile (tests/_shared_zoo.py: "zoo:NAME", shared)
    assert str(dynamic.inputs[0].shape[1]) != "16"  # the sequence axis is symbolic
    # the warehouse entries a static compile uses are matched with symbolic sizes too
    for entry, count in static["patterns"].items():
        assert dynamic.stats["patterns"].get(entry, 0) >= count, (entry, dynamic.stats["patterns"])
    rng = np.random.default_rng(0)
    for length in (1, 17, 64):
        ids = torch.from_numpy(rng.integers(0, 1000, (1, length)))
        with torch.no_grad():
            ref = model(ids).numpy()
        out = np.asarray(dynamic(ids.numpy()))
        assert out.shape == ref.shape
        assert np.abs(ref).max() > 0.1  # a non-degenerate reference
        np.testing.assert_allclose(out, ref, atol=1e-4, rtol=1e-4, err_msg=f"length {length}")


def test_a_length_past_the_bound_is_a_clear_input_error(tmp_path):
    from plus_tvm import InputError
    from plus_tvm.dynamic_sequence import inputs_at, load_dynamic_sequence
    from plus_tvm.loader import load_model

    loaded = load_dynamic_sequence(load_model("zoo:gpt2-tiny"), max_len=32)
    cm = plus_tvm.compile(loaded)
    cm(*inputs_at(loaded.example_inputs, 32))
    with pytest.raises(InputError, match=r"input_ids: axis 1 .* is 33.* 1\.\.32"):
        cm(*inputs_at(loaded.example_inputs, 33))
    # the bound travels with an exported library
    path = str(tmp_path / "m.so")
    cm.export_library(path)
    with pytest.raises(InputError, match=r"1\.\.32"):
        plus_tvm.load(path)(*inputs_at(loaded.example_inputs, 40))


def test_a_model_without_token_inputs_has_no_sequence_axis():
    from plus_tvm import ModelLoadError
    from plus_tvm.dynamic_sequence import sequence_dims

    with pytest.raises(ModelLoadError, match="no sequence input"):
        sequence_dims((torch.randn(1, 3, 8, 8),), 64)


# ---------------------------------------------------------- pricing symbolic sizes
def test_size_value_evaluates_symbolic_sizes():
    from plus_tvm.costmodel import size_value

    assert size_value(7, {}) == 7
    assert size_value("4*s70*16", {"s70": 23}) == 4 * 23 * 16
    assert size_value("(s + 1) // 2", {"s": 9}) == 5
    assert size_value("s1*s2", {"s1": 2}) is None  # s2 has no price
    assert size_value("T.min(s, 4)", {"s": 2}) is None  # not plain arithmetic
    assert size_value("s // 0", {"s": 2}) is None


@pytest.mark.parametrize(
    "low, high, library",
    [(1, 512, False), (256, 512, True)],
    ids=["short-priced-tir", "long-priced-library"],
)
def test_symbolic_sizes_are_priced_inside_their_declared_range(low, high, library):
    """A LayerNorm over a symbolic sequence is priced at the geometric middle of the Dim's
    range: 1..512 is priced at 23 rows (a library call's crossing costs more than the TIR
    kernel), 256..512 at 362 rows (the library pays); before, every symbolic size was assumed
    large."""
    from plus_tvm.symbolic_bounds import typical_sizes

    class Norm(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = torch.nn.LayerNorm(512)

        def forward(self, x):
            return self.norm(x)

    seq = torch.export.Dim("seq", min=low, max=high)
    x = torch.randn(1, max(low, 300), 512)
    mod, params = plus_tvm.from_torch(Norm().eval(), (x,), dynamic_shapes=({1: seq},))
    (name,) = typical_sizes(mod["main"])
    assert typical_sizes(mod["main"])[name] == round((low * high) ** 0.5)
    stats = plus_tvm.inspect((mod, params))
    assert (stats["library_calls"] > 0) == library, stats["dispatch"]
