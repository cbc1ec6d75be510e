"""FoldStaticSubgraphs: input-independent chains (arange -> cumsum -> compare, as transformers
build masks) become constants with the values the kernels would compute; nothing that reads an
input is folded; large results stay kernels."""

from __future__ import annotations

import numpy as np
import plus_tvm
import pytest
import torch
import tvm
from _shared_zoo import zoo_compiled, zoo_stats
from plus_tvm import Options
from plus_tvm.passes import FoldStaticSubgraphs
from plus_tvm.pipeline import phase_passes
from plus_tvm.stats import op_histogram
from plus_tvm.target import resolve_target
from tvm import relax


def _mask_module(n: int = 12) -> tvm.IRModule:
    """x + where(cumsum(arange != 3) == k, 0, -inf)-style mask built from arange, as GPT-2 does."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, n), "float32"))
    with bb.function("main", [x], attrs={"num_input": 1}):
        with bb.dataflow():
            pos = bb.emit(relax.op.arange(0, n, 1, dtype="int64"))
            pos = bb.emit(relax.op.expand_dims(pos, axis=[0]))
            flag = bb.emit(relax.op.not_equal(pos, relax.const(3, "int64")))
            run = bb.emit(relax.op.cumsum(flag, axis=1, dtype="int64"))
            keep = bb.emit(relax.op.less_equal(run, relax.const(n // 2, "int64")))
            mask = bb.emit(
                relax.op.where(keep, relax.const(0.0, "float32"), relax.const(-1e9, "float32"))
            )
            y = bb.emit(relax.op.add(x, mask))
            out = bb.emit_output(relax.op.multiply(y, relax.op.sum(mask)))
        bb.emit_func_output(out)
    return bb.get()


def _run(mod: tvm.IRModule, x: np.ndarray) -> np.ndarray:
    exe = tvm.compile(mod, target="llvm")
    return relax.VirtualMachine(exe, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


def test_mask_chain_is_folded_with_the_same_values():
    mod = _mask_module()
    folded = FoldStaticSubgraphs()(mod)  # conftest's immutable-module check runs around it
    ops = op_histogram(folded)
    for name in ("relax.arange", "relax.cumsum", "relax.where", "relax.sum"):
        assert name not in ops, ops
    assert ops == {"relax.add": 1, "relax.multiply": 1}
    x = np.random.default_rng(0).standard_normal((1, 12)).astype("float32")
    np.testing.assert_array_equal(_run(folded, x), _run(mod, x))


def test_nothing_reading_an_input_is_folded():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.exp(x))
            out = bb.emit_output(relax.op.add(y, relax.const(1.0, "float32")))
        bb.emit_func_output(out)
    mod = bb.get()
    tvm.ir.assert_structural_equal(FoldStaticSubgraphs()(mod), mod)


def test_results_above_max_bytes_stay_kernels():
    mod = _mask_module(64)
    tvm.ir.assert_structural_equal(FoldStaticSubgraphs(max_bytes=16)(mod), mod)
    assert "relax.cumsum" not in op_histogram(FoldStaticSubgraphs()(mod))


def test_symbolic_sizes_are_not_folded():
    n = tvm.tirx.Var("n", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n,), "int64"))
    with bb.function("main", [x]):
        with bb.dataflow():
            pos = bb.emit(relax.op.arange(relax.prim_value(0), relax.prim_value(n), 1))
            out = bb.emit_output(relax.op.add(x, pos))
        bb.emit_func_output(out)
    mod = bb.get()
    tvm.ir.assert_structural_equal(FoldStaticSubgraphs()(mod), mod)


def test_phase_one_runs_it_unless_constants_are_not_folded():
    llvm = resolve_target("llvm")
    names = [p.info.name for p in phase_passes(llvm, Options(), ("dispatch",))[0].passes]
    # after the passes that make shapes and ops legal to evaluate, before everything else
    assert names[:3] == ["ProveSlicesInbound", "FullAsBroadcast", "FoldStaticSubgraphs"]
    off = phase_passes(llvm, Options(fold_constants=False), ("dispatch",))[0].passes
    assert "FoldStaticSubgraphs" not in [p.info.name for p in off]


@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny"])
def test_zoo_masks_fold_and_models_stay_exact(name):
    """GPT-2's and LLaMA's packed-sequence masks (arange -> cumsum -> index) fold away."""
    compiled = zoo_compiled(name)  # plus_tvm.compile(f"zoo:{name}"), once per session
    on = zoo_stats(name)  # (inspect's statistics of the same compile)
    off = plus_tvm.inspect(f"zoo:{name}", options=Options(fold_constants=False))
    assert on["kernels"] < off["kernels"]
    assert not any("cumsum" in k for k in on["kernel_names"]), on["kernel_names"]
    model, inputs = plus_tvm.zoo.load(name)
    with torch.no_grad():
        want = model(*inputs)
    want = (want[0] if isinstance(want, tuple) else want).numpy()
    np.testing.assert_allclose(compiled(*inputs), want, rtol=1e-4, atol=1e-4)
