"""RewriteViewBuiltins: static ``vm.builtin.reshape`` host calls (TVM's scan dispatch puts them
around a cumsum) become aliases or ``R.reshape`` views, so a CUDA-graph region continues across
them; the program computes the same values."""

from __future__ import annotations

import numpy as np
import plus_tvm
import tvm
from plus_tvm import Options
from plus_tvm.passes import RewriteViewBuiltins
from plus_tvm.pipeline import finalize_phase
from tvm import relax

CUDA = {"kind": "cuda", "arch": "sm_90"}


def _reshape_builtin(x: relax.Var, shape) -> relax.Call:
    """``R.call_packed("vm.builtin.reshape", x, shape)`` as lowered IR has it."""
    ty = relax.TensorType(shape, "float32")
    return relax.Call(
        relax.ExternFunc("vm.builtin.reshape"), [x, relax.ShapeExpr(shape)], ty_args=[ty]
    )


def _reshapes(shape_a, shape_b) -> tvm.IRModule:
    """main(x: [2, 6]) = exp(reshape(reshape(x, a), b)) with the builtin calls of lowered IR."""
    x = relax.Var("x", relax.TensorType((2, 6), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x], attrs={"num_input": 1}, pure=False):
        a = bb.emit(_reshape_builtin(x, shape_a))
        b = bb.emit(_reshape_builtin(a, shape_b))
        out = bb.emit(relax.op.exp(b))
        bb.emit_func_output(out)
    return bb.get()


def _run(mod: tvm.IRModule, x: np.ndarray) -> np.ndarray:
    tgt = tvm.target.Target("llvm")
    with tgt:
        mod = relax.transform.LegalizeOps()(mod)
        mod = tvm.transform.Sequential(
            [relax.transform.CallTIRRewrite(), *finalize_phase(tgt, Options())]
        )(mod)
    vm = relax.VirtualMachine(tvm.compile(mod, tgt, relax_pipeline=None), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def test_static_reshapes_become_views_and_values_stay():
    mod = _reshapes((3, 4), (3, 4))
    rewrite = RewriteViewBuiltins()
    out = rewrite(mod)
    assert rewrite.rewritten == 2
    text = out["main"].script()
    assert "vm.builtin.reshape" not in text and "R.reshape(x" in text
    assert "vm.builtin.reshape" in mod["main"].script()  # the input module is untouched
    x = np.random.default_rng(0).standard_normal((2, 6)).astype("float32")
    np.testing.assert_allclose(_run(out, x), _run(mod, x), rtol=1e-6)
    np.testing.assert_allclose(_run(out, x), np.exp(x).reshape(3, 4), rtol=1e-6)


def test_a_symbolic_reshape_is_left_alone():
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((n, 6), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x], attrs={"num_input": 1}, pure=False):
        y = bb.emit(_reshape_builtin(x, [n * 6]))
        bb.emit_func_output(y)
    mod = bb.get()
    rewrite = RewriteViewBuiltins()
    assert rewrite(mod).same_as(mod) or rewrite.rewritten == 0


def test_gpt2_tiny_unfolded_mask_no_longer_cuts_the_graph():
    """Without FoldStaticSubgraphs GPT-2's mask cumsum sits between two reshape builtins; they
    used to split the model into regions with four kernels outside."""
    report = plus_tvm.inspect(
        "zoo:gpt2-tiny", target=CUDA, options=Options(cuda_graph="always", fold_constants=False)
    )["cuda_graph"]
    assert report["regions"] == 1
    assert report["outside"] == [] and report["kernels_captured"] == report["kernels"]
