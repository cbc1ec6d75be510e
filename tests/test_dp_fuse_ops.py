"""DPFuseOps: fused programs equal unfused ones; groups become single kernels (paper 004)."""

from __future__ import annotations

import numpy as np
import plus_tvm
import pytest
import tvm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from plus_tvm.passes import AnnotateMapPattern, DPFuseOps
from plus_tvm.stats import kernel_stats
from plus_tvm.target import host_target
from tvm import relax, tirx
from tvm.script import tirx as T  # noqa: N812

TARGET = host_target()


def _legalized(mod: tvm.IRModule) -> tvm.IRModule:
    seq = tvm.transform.Sequential(
        [
            relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(),
            AnnotateMapPattern(),
        ]
    )
    with TARGET:
        return seq(mod)


def _build(inputs, body):
    """A Relax module ``main(*inputs)`` whose dataflow block is emitted by ``body(bb, vars)``."""
    bb = relax.BlockBuilder()
    params = [relax.Var(name, relax.TensorType(shape, "float32")) for name, shape in inputs]
    with bb.function("main", params):
        with bb.dataflow():
            out = body(bb, params)
            gv = bb.emit_output(out)
        bb.emit_func_output(gv)
    return bb.get()


def _run(mod: tvm.IRModule, args: list[np.ndarray], pipeline) -> list[np.ndarray]:
    ex = tvm.compile(mod, TARGET, relax_pipeline=pipeline)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in args])
    if isinstance(out, tvm.runtime.Tensor):
        return [out.numpy()]
    return [o.numpy() for o in out]


def _kernels(mod: tvm.IRModule) -> list[str]:
    return sorted(gv.name_hint for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc))


def _fused(mod: tvm.IRModule, **kw) -> tvm.IRModule:
    with TARGET:
        return relax.transform.FuseTIR()(DPFuseOps(**kw)(_legalized(mod)))


# ------------------------------------------------------------------------- the paper's case
def _matmul_reshape_transpose_add(bb, p):
    x, w, y = p
    a = bb.emit(relax.op.matmul(x, w))
    b = bb.emit(relax.op.reshape(a, (4, 4, 4)))
    c = bb.emit(relax.op.permute_dims(b, [0, 2, 1]))
    return bb.emit(relax.op.add(c, y))


MRTA = _build([("x", (4, 8)), ("w", (8, 16)), ("y", (4, 4, 4))], _matmul_reshape_transpose_add)


def test_matmul_reshape_transpose_add_is_one_kernel():
    assert _kernels(_fused(MRTA)) == ["fused_matmul_reshape_transpose_add"]
    with TARGET:  # TVM's FuseOps stops at the reshape after the matmul
        tvm_fused = relax.transform.FuseTIR()(relax.transform.FuseOps()(_legalized(MRTA)))
    assert len(_kernels(tvm_fused)) == 2


def test_fused_program_matches_the_unfused_one():
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype("float32") for s in [(4, 8), (8, 16), (4, 4, 4)]]
    (ref,) = _run(MRTA, args, "default")  # tvm.compile's default on llvm: no fusion
    (out,) = _run(MRTA, args, plus_tvm.pipeline(TARGET))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_multi_output_group_returns_every_escaping_value():
    def body(bb, p):
        x, y = p
        e = bb.emit(relax.op.exp(x))
        s = bb.emit(relax.op.add(e, y))
        r = bb.emit(relax.op.nn.relu(s))
        return relax.Tuple([e, r])  # e escapes the group: a second output

    mod = _build([("x", (4, 8)), ("y", (4, 8))], body)
    fused = _fused(mod)
    (kernel,) = _kernels(fused)  # one kernel with two outputs
    assert kernel.endswith("exp_add_relu")
    rng = np.random.default_rng(1)
    args = [rng.standard_normal((4, 8)).astype("float32") for _ in range(2)]
    ref = _run(mod, args, "default")
    out = _run(mod, args, plus_tvm.pipeline(TARGET))
    for a, b in zip(out, ref):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_two_reductions_are_never_one_kernel():
    def body(bb, p):
        (x,) = p
        m = bb.emit(relax.op.matmul(x, relax.op.permute_dims(x)))
        return bb.emit(relax.op.nn.softmax(m))

    mod = _build([("x", (4, 8))], body)
    kernels = _kernels(_fused(mod))
    assert not any("matmul" in k and "softmax" in k for k in kernels), kernels


def test_tvm_rules_in_the_plan_search_stop_where_fuseops_does():
    # Rule_T of the ablation: the reshape after the matmul is not an elementwise epilogue
    kernels = _kernels(_fused(MRTA, rules="tvm"))
    assert len(kernels) == 2 and "matmul" in kernels, kernels


def test_max_group_size_and_greedy_search_options():
    assert len(_kernels(_fused(MRTA, max_group_size=2))) >= 2
    assert _kernels(_fused(MRTA, search="greedy")) == ["fused_matmul_reshape_transpose_add"]


def test_symbolic_batch():
    n = tirx.Var("n", "int64")

    def body(bb, p):
        x, b = p
        h = bb.emit(relax.op.add(x, b))
        return bb.emit(relax.op.nn.gelu(h))

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, 8), "float32"))
    b = relax.Var("b", relax.TensorType((8,), "float32"))
    with bb.function("main", [x, b]):
        with bb.dataflow():
            gv = bb.emit_output(body(bb, [x, b]))
        bb.emit_func_output(gv)
    mod = bb.get()
    assert len(_kernels(_fused(mod))) == 1
    rng = np.random.default_rng(2)
    for rows in (1, 5):
        args = [
            rng.standard_normal((rows, 8)).astype("float32"),
            rng.standard_normal(8).astype("float32"),
        ]
        (ref,) = _run(mod, args, "default")
        (out,) = _run(mod, args, plus_tvm.pipeline(TARGET))
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------ random programs
OPS = ["unary", "binary", "bias", "reshape_transpose", "center", "matmul", "softmax", "max"]


@st.composite
def programs(draw):
    return draw(
        st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 1000)), min_size=2, max_size=9)
    )


def _random_module(program):
    def body(bb, p):
        x, y, w, bias = p
        pool = [x, y]
        for op, pick in program:
            a = pool[pick % len(pool)]
            b = pool[(pick // 7) % len(pool)]
            if op == "unary":
                fn = [relax.op.exp, relax.op.nn.relu, relax.op.tanh, relax.op.negative][pick % 4]
                v = fn(a)
            elif op == "binary":
                v = (relax.op.add if pick % 2 else relax.op.multiply)(a, b)
            elif op == "bias":
                v = relax.op.add(a, bias)
            elif op == "reshape_transpose":
                t = bb.emit(relax.op.reshape(a, (8, 4)))
                v = relax.op.permute_dims(t)
            elif op == "center":
                m = bb.emit(relax.op.mean(a, axis=[1], keepdims=True))
                v = relax.op.subtract(a, m)
            elif op == "matmul":
                v = relax.op.matmul(a, w)
            elif op == "softmax":
                v = relax.op.nn.softmax(a, axis=1)
            else:
                v = relax.op.maximum(a, b)
            pool.append(bb.emit(v))
        # the last value, and an earlier one whose other uses escape any group
        return relax.Tuple([pool[-1], pool[len(pool) // 2]])

    return _build([("x", (4, 8)), ("y", (4, 8)), ("w", (8, 8)), ("bias", (8,))], body)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    programs(),
    st.sampled_from(["dp", "greedy"]),
    st.sampled_from(["mapping", "tvm"]),
    st.integers(2, 8),
)
def test_random_programs_fused_equal_unfused(program, search, rules, max_group_size):
    mod = _random_module(program)
    rng = np.random.default_rng(3)
    args = [rng.standard_normal(s).astype("float32") * 0.5 for s in [(4, 8), (4, 8), (8, 8), (8,)]]
    ref = _run(mod, args, "default")
    opts = plus_tvm.Options(
        fusion_search=search, fusion_rules=rules, fusion_max_group_size=max_group_size
    )
    out = _run(mod, args, plus_tvm.pipeline(TARGET, opts))
    for a, b in zip(out, ref):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    fused = _fused(mod, search=search, rules=rules, max_group_size=max_group_size)
    launches = kernel_stats(fused)["kernels"]
    assert launches <= kernel_stats(_legalized(mod))["kernels"]


# ------------------------------------------------------------------------------ explanations
def test_explain_mode_names_the_rule_or_limit_that_kept_kernels_apart():
    def body(bb, p):
        (x,) = p
        m = bb.emit(relax.op.matmul(x, relax.op.permute_dims(x)))
        return bb.emit(relax.op.nn.softmax(m))

    stats = plus_tvm.inspect(
        _build([("x", (4, 8))], body), options=plus_tvm.Options(fusion_explain=True)
    )
    notes = stats["fusion_explain"]
    assert any(
        "matmul" in n and "softmax" in n and "ManyToMany + ManyToMany" in n for n in notes
    ), notes
    small = plus_tvm.inspect(
        MRTA, options=plus_tvm.Options(fusion_explain=True, fusion_max_group_size=2)
    )
    assert any("size:" in n for n in small["fusion_explain"]), small["fusion_explain"]
    assert "fusion_explain" not in plus_tvm.inspect(MRTA)  # only on request


# ---------------------------------------------------------------- user-written call_tir kernels
def _scale_kernel(index_dtype: str):
    from tvm.script import tirx as T  # noqa: N812

    n, m = (T.int64(4), T.int64(8)) if index_dtype == "int64" else (4, 8)

    @T.prim_func(private=True, s_tir=True)
    def scale(a: T.Buffer((n, m), "float32"), b: T.Buffer((n, m), "float32")):
        for i, j in T.grid(n, m):
            with T.sblock("s"):
                vi, vj = T.axis.remap("SS", [i, j])
                b[vi, vj] = a[vi, vj] * T.float32(3)

    return scale


@pytest.mark.parametrize("index_dtype, kernels", [("int64", 1), ("int32", 2)])
def test_user_written_primfunc_is_classified_and_fused(index_dtype, kernels):
    # int32 buffer dims cannot be merged by FuseTIR (TVM's FuseOps fails on them): kept alone
    scale = _scale_kernel(index_dtype)
    bb = relax.BlockBuilder()
    gv_scale = bb.add_func(scale, "scale")
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            s = bb.emit(relax.call_tir(gv_scale, (x,), relax.TensorType((4, 8), "float32")))
            gv = bb.emit_output(relax.op.nn.relu(s))
        bb.emit_func_output(gv)
    mod = bb.get()
    fused = _fused(mod)
    assert kernel_stats(fused)["kernels"] == kernels
    arg = np.random.default_rng(4).standard_normal((4, 8)).astype("float32")
    (out,) = _run(mod, [arg], plus_tvm.pipeline(TARGET))
    np.testing.assert_allclose(out, np.maximum(arg * 3, 0), rtol=1e-6)


# ------------------------------------------------- regressions found by ONNX's node tests
def _sized_by_match_cast(bb, p):
    """``y = relu(x) + 1``, then a kernel whose output size a ``match_cast`` defines: the
    kernel reads no variable of the cast, only its symbolic sizes (ONNX Slice's import)."""
    (x,) = p
    a = bb.emit(relax.op.nn.relu(x))
    b = bb.emit(relax.op.add(a, relax.const(1.0, "float32")))
    shape = bb.emit(relax.op.shape_to_tensor(relax.op.shape_of(b)))
    dims = bb.emit(relax.op.tensor_to_shape(shape))
    n, m = tirx.Var("n", "int64"), tirx.Var("m", "int64")
    bb.match_cast(dims, relax.ShapeType([n, m]))
    return bb.emit(relax.op.reshape(b, relax.ShapeExpr([n, m])))


def test_a_binding_stays_after_the_match_cast_that_defines_its_sizes():
    mod = _build([("x", (4, 6))], _sized_by_match_cast)
    # the plan groups relu, add and the reshape; the group is not outlined (its sizes are not
    # defined by its inputs) but the block is rebuilt in the plan's order
    fused = _fused(mod)
    bindings = fused["main"].body.blocks[0].bindings
    cast = next(i for i, b in enumerate(bindings) if isinstance(b, relax.MatchCast))
    sizes = {v.id_ for v in relax.analysis.definable_tir_vars_in_type(bindings[cast].ty)}
    for i, binding in enumerate(bindings):
        used = {v.id_ for v in relax.analysis.tir_vars_in_type(binding.var.ty)}
        used |= {v.id_ for v in relax.analysis.free_symbolic_vars(binding.value)}
        if used & sizes and i != cast:
            assert i > cast, f"{binding.var.name} uses a size before the match_cast defines it"
    x = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    (out,) = _run(mod, [x], plus_tvm.pipeline(TARGET))
    np.testing.assert_allclose(out, np.maximum(x, 0) + 1, rtol=1e-6)


def _cumsum_of_a_cast(bb, p):
    """RoBERTa's position ids: a cumsum over an integer cast of the input, then arithmetic."""
    (x,) = p
    mask = bb.emit(relax.op.astype(relax.op.greater(x, relax.const(0.0, "float32")), "int64"))
    csum = bb.emit(relax.op.cumsum(mask, axis=1))
    pos = bb.emit(relax.op.multiply(csum, mask))
    return bb.emit(relax.op.astype(relax.op.add(pos, relax.const(1, "int64")), "float32"))


def test_extern_kernels_with_offset_buffers_are_never_grouped():
    mod = _build([("x", (2, 7))], _cumsum_of_a_cast)
    with TARGET:  # the pipeline's phase 1 turns cumsum into TVM's extern scan kernel
        mod = tvm.transform.Sequential(relax.pipeline.library_dispatch_passes(TARGET))(mod)
    legal = _legalized(mod)
    (cumsum,) = [f for gv, f in legal.functions_items() if gv.name_hint.startswith("cumsum")]
    assert plus_tvm.mapping.analyze_primfunc(cumsum) == plus_tvm.MapPattern.NotFuse
    fused = _fused(mod)
    assert any(name.startswith("cumsum") for name in _kernels(fused)), "cumsum stays alone"
    x = np.random.default_rng(1).standard_normal((2, 7)).astype("float32")
    (out,) = _run(mod, [x], plus_tvm.pipeline(TARGET))
    m = (x > 0).astype(np.int64)
    np.testing.assert_array_equal(out, (np.cumsum(m, axis=1) * m + 1).astype("float32"))


def test_an_opaque_extern_block_is_not_fuse():
    @T.prim_func(private=True, s_tir=True)
    def prefix(a: T.Buffer((T.int64(8),), "float32"), out: T.Buffer((T.int64(8),), "float32")):
        with T.sblock("prefix_generic"):
            T.reads()
            T.writes()
            out[0] = a[0]
            for i in range(T.int64(7)):
                out[i + 1] = out[i] + a[i + 1]

    assert plus_tvm.mapping.analyze_primfunc(prefix) == plus_tvm.MapPattern.NotFuse
