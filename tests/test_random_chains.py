"""Differential test: random chains of element-wise functions through the plus pipeline against
TVM's own pipeline on the same Relax module, each built in bounded time.

Fused chains of transcendental functions are where GIR's fast math, ``PropagateNaN`` and TVM's
simplifier meet: a five-function chain once took 165 s to build (a nested ``Let`` per mapped
function, inlined by the simplifier). Drawn chains catch the forms hand-picked cases miss."""

from __future__ import annotations

import time

import numpy as np
import plus_tvm
import pytest
import tvm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tvm import relax

UNARY = ("exp", "tanh", "sigmoid", "erf", "gelu", "silu", "relu", "neg", "sqrt_abs", "square")
BUILD_LIMIT_S = 30.0  # the chain that took 165 s builds in under 2 s


def _unary(bb: relax.BlockBuilder, name: str, x: relax.Expr) -> relax.Expr:
    op = relax.op
    if name == "neg":
        return bb.emit(op.negative(x))
    if name == "sqrt_abs":
        return bb.emit(op.sqrt(bb.emit(op.abs(x))))
    if name == "square":
        return bb.emit(op.multiply(x, x))
    if name in ("gelu", "silu", "relu"):
        return bb.emit(getattr(op.nn, name)(x))
    return bb.emit(getattr(op, name)(x))


def chain_module(ops: list[str], shape: tuple[int, ...], combine: list[str]) -> tvm.IRModule:
    """``x`` through ``ops``, each result combined with ``y`` by ``combine[k]`` (add, mul)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(list(shape), "float32"))
    y = relax.Var("y", relax.TensorType(list(shape), "float32"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            t: relax.Expr = x
            for name, how in zip(ops, combine):
                t = _unary(bb, name, t)
                t = bb.emit(relax.op.add(t, y) if how == "add" else relax.op.multiply(t, y))
            out = bb.emit_output(t)
        bb.emit_func_output(out)
    return bb.get()


@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(
    ops=st.lists(st.sampled_from(UNARY), min_size=2, max_size=6),
    combine=st.lists(st.sampled_from(["add", "mul"]), min_size=6, max_size=6),
    shape=st.sampled_from([(64, 32), (3, 257), (2, 8, 48)]),
)
def test_random_chains_match_tvm_and_build_fast(ops, combine, shape):
    mod = chain_module(ops, shape, combine)
    rng = np.random.default_rng(len(ops))
    args = [rng.standard_normal(shape).astype("float32") for _ in range(2)]
    start = time.perf_counter()
    plus = plus_tvm.compile(mod, "llvm")
    built = time.perf_counter() - start
    assert built < BUILD_LIMIT_S, f"{ops} on {shape} built in {built:.0f} s"
    want = plus_tvm.compile(mod, "llvm", pipeline="tvm")(*args)
    got = plus(*args)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-5, equal_nan=True, err_msg=str(ops))


@pytest.mark.parametrize("gir", ["on", "off"])
def test_the_chain_that_took_minutes(gir):
    ops = ["sqrt_abs", "exp", "gelu", "relu", "tanh"]
    mod = chain_module(ops, (64, 32), ["add", "mul", "add", "mul", "add"])
    start = time.perf_counter()
    plus = plus_tvm.compile(mod, "llvm", options=plus_tvm.Options.from_pairs([f"gir={gir}"]))
    assert time.perf_counter() - start < BUILD_LIMIT_S
    args = [np.random.default_rng(1).standard_normal((64, 32)).astype("float32") for _ in "xy"]
    want = plus_tvm.compile(mod, "llvm", pipeline="tvm")(*args)
    np.testing.assert_allclose(plus(*args), want, rtol=2e-4, atol=1e-5)
