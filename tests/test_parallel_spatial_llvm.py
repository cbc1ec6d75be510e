"""ParallelSpatialLLVM: the CPU fallback for kernels GIR declines (a squeeze-excite's expand
convolution fused into the scale), checked for structure and against the unscheduled kernel."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from gir_kernels import random_args, run
from plus_tvm.gir.model import target_lanes
from plus_tvm.options import Options
from plus_tvm.passes import PropagateNaN
from plus_tvm.pipeline import phase_passes
from plus_tvm.schedules import GIRLLVM, ParallelSpatialLLVM
from plus_tvm.target import resolve_target
from tvm import relax, s_tir, tirx


@pytest.fixture(scope="module")
def llvm():
    return resolve_target("llvm")


def _fused(target, build) -> tirx.PrimFunc:
    """The largest fused PrimFunc that legalize + fuse make of ``build(bb)``."""
    bb = relax.BlockBuilder()
    build(bb)
    with target:
        mod = tvm.transform.Sequential(
            phase_passes(target, Options(), phases=("legalize", "fuse"))
        )(bb.get())
    funcs = [f for _, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)]
    return max(funcs, key=lambda f: len(str(f)))


def _se_scale(h: int, w: int, c: int):
    """conv 1x1 (8 -> c) on a pooled [1, 1, 1, 8] + bias + sigmoid, scaling [1, h, w, c]."""

    def build(bb):
        pooled = relax.Var("pooled", relax.TensorType((1, 1, 1, 8), "float32"))
        weight = relax.Var("weight", relax.TensorType((c, 8, 1, 1), "float32"))
        bias = relax.Var("bias", relax.TensorType((c,), "float32"))
        act = relax.Var("act", relax.TensorType((1, h, w, c), "float32"))
        with bb.function("main", [pooled, weight, bias, act]):
            with bb.dataflow():
                y = bb.emit(
                    relax.op.nn.conv2d(pooled, weight, data_layout="NHWC", kernel_layout="OIHW")
                )
                y = bb.emit(relax.op.add(y, relax.op.reshape(bias, (1, 1, 1, c))))
                y = bb.emit(relax.op.sigmoid(y))
                out = bb.emit_output(relax.op.multiply(act, y))
            bb.emit_func_output(out)

    return build


def _loop_kinds(func: tirx.PrimFunc) -> dict[str, set[int]]:
    """Per block: the kinds of the loops around it."""
    sch = s_tir.Schedule(func)
    return {
        sch.get(b).name_hint: {int(sch.get(loop).kind) for loop in sch.get_loops(b)}
        for b in sch.get_child_blocks(sch.get_sblock("root"))
    }


def _check(func, target, sch):
    arrays = random_args(func)
    for want, got in zip(run(func, target, arrays), run(sch.mod["main"], target, arrays)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("h,w,c", [(56, 56, 32), (30, 30, 20), (40, 23, 24), (32, 32, 18)])
def test_se_scale_runs_parallel_and_equals_unscheduled(h, w, c, llvm):
    func = _fused(llvm, _se_scale(h, w, c))
    assert "conv2d" in str(func)
    assert GIRLLVM().apply(func, llvm, False) is None  # the kernel this rule exists for
    sch = ParallelSpatialLLVM().apply(func, llvm, False)
    assert sch is not None
    kinds = set().union(*_loop_kinds(sch.mod["main"]).values())
    assert int(tirx.ForKind.PARALLEL) in kinds
    # the vector is halved until it divides the channels, down to 4 lanes (20: 4 lanes);
    # 18 channels: parallel only
    assert (int(tirx.ForKind.VECTORIZED) in kinds) == (c % 4 == 0)
    _check(func, llvm, sch)


def test_small_blocks_are_left_alone_and_reductions_keep_their_order(llvm):
    func = _fused(llvm, _se_scale(4, 4, 8))  # 128 elements: below min_elements
    assert ParallelSpatialLLVM().apply(func, llvm, False) is None
    sch = ParallelSpatialLLVM(min_elements=32).apply(func, llvm, False)
    assert sch is not None
    _check(func, llvm, sch)
    kinds = _loop_kinds(sch.mod["main"])
    assert kinds["T_multiply"] >= {int(tirx.ForKind.PARALLEL)}
    # the convolution (a reduction over the 8 input channels, read with a stride: not
    # vectorized) runs its output channels in parallel, its reduction loop serial and last
    for name in (n for n in kinds if n.startswith("conv2d")):
        s = s_tir.Schedule(sch.mod["main"])
        loops = [s.get(loop) for loop in s.get_loops(s.get_sblock(name))]
        assert int(loops[-1].kind) == int(tirx.ForKind.SERIAL) and int(loops[-1].extent) == 8
        assert int(tirx.ForKind.VECTORIZED) not in kinds[name]


def test_declines_other_targets_and_symbolic_sizes(llvm):
    func = _fused(llvm, _se_scale(56, 56, 32))
    cuda = resolve_target({"kind": "cuda", "arch": "sm_90"})
    assert ParallelSpatialLLVM().apply(func, cuda, False) is None

    n = tirx.Var("n", "int64")

    def build(bb):
        x = relax.Var("x", relax.TensorType((n, 4096), "float32"))
        with bb.function("main", [x]):
            with bb.dataflow():
                out = bb.emit_output(relax.op.exp(x))
            bb.emit_func_output(out)

    assert ParallelSpatialLLVM().apply(_fused(llvm, build), llvm, False) is None


def _rotary(heads: int, seq: int, dim: int):
    """LLaMA's rotary embedding on a projection: reshape, transpose, x * cos + rotate_half(x) *
    sin with rotate_half = concat(-x[..., d/2:], x[..., :d/2])."""
    half = dim // 2

    def build(bb):
        x = relax.Var("x", relax.TensorType((seq, heads * dim), "float32"))
        cos = relax.Var("cos", relax.TensorType((1, 1, seq, dim), "float32"))
        sin = relax.Var("sin", relax.TensorType((1, 1, seq, dim), "float32"))
        with bb.function("main", [x, cos, sin]):
            with bb.dataflow():
                q = bb.emit(relax.op.reshape(x, (1, seq, heads, dim)))
                q = bb.emit(relax.op.permute_dims(q, [0, 2, 1, 3]))
                lo = bb.emit(relax.op.strided_slice(q, axes=[3], begin=[0], end=[half]))
                hi = bb.emit(relax.op.strided_slice(q, axes=[3], begin=[half], end=[dim]))
                rot = bb.emit(relax.op.concat([relax.op.negative(hi), lo], axis=3))
                out = bb.emit_output(
                    relax.op.add(relax.op.multiply(q, cos), relax.op.multiply(rot, sin))
                )
            bb.emit_func_output(out)

    return build


def test_data_movement_is_inlined_and_nothing_costly_is_recomputed(llvm):
    """The rotary chain's nine full-size buffers become at most one: reshape, transpose, slices,
    negate and concatenate are inlined into their data-parallel consumers; the result equals the
    unscheduled kernel."""
    func = _fused(llvm, _rotary(8, 128, 64))
    plain = s_tir.Schedule(func)
    assert len(plain.get(plain.get_sblock("root")).alloc_buffers) >= 6
    sch = ParallelSpatialLLVM().apply(func, llvm, False)
    root = sch.get(sch.get_sblock("root"))
    assert len(root.alloc_buffers) <= 1
    _check(func, llvm, sch)


def test_a_transcendental_producer_is_not_inlined(llvm):
    """exp(x) read by two consumers stays one buffer: inlining would compute it twice."""

    def build(bb):
        x = relax.Var("x", relax.TensorType((256, 256), "float32"))
        with bb.function("main", [x]):
            with bb.dataflow():
                e = bb.emit(relax.op.exp(x))
                t = bb.emit(relax.op.permute_dims(e, [1, 0]))
                out = bb.emit_output(relax.op.add(relax.op.multiply(e, t), e))
            bb.emit_func_output(out)

    func = _fused(llvm, build)
    sch = ParallelSpatialLLVM().apply(func, llvm, False)
    names = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    assert any(n.startswith("compute") or "exp" in n for n in names), names
    _check(func, llvm, sch)


def _movement_chain(seed: int):
    """A random chain of data movement (transposes, reshapes, half swaps with a negation: the
    rotary pattern's pieces) between element-wise operations, 32768 elements throughout."""
    rng = np.random.default_rng(seed)
    shapes = [(16, 32, 64), (32, 16, 64), (64, 32, 16), (8, 64, 64), (32, 32, 32)]

    def build(bb):
        x = relax.Var("x", relax.TensorType((16, 32, 64), "float32"))
        y = relax.Var("y", relax.TensorType((16, 32, 64), "float32"))
        with bb.function("main", [x, y]):
            with bb.dataflow():
                cur = bb.emit(relax.op.multiply(x, relax.const(1.5, "float32")))
                for _ in range(int(rng.integers(3, 7))):
                    kind = rng.choice(["transpose", "reshape", "swap", "negate"])
                    shape = [int(d) for d in cur.ty.shape]
                    if kind == "transpose":
                        cur = bb.emit(relax.op.permute_dims(cur, list(rng.permutation(3))))
                    elif kind == "reshape":
                        target = shapes[int(rng.integers(len(shapes)))]
                        cur = bb.emit(relax.op.reshape(cur, target))
                    elif kind == "swap":
                        axis = int(rng.integers(3))
                        half = shape[axis] // 2
                        lo = relax.op.strided_slice(cur, axes=[axis], begin=[0], end=[half])
                        hi = relax.op.strided_slice(
                            cur, axes=[axis], begin=[half], end=[shape[axis]]
                        )
                        cur = bb.emit(relax.op.concat([relax.op.negative(hi), lo], axis=axis))
                    else:
                        cur = bb.emit(relax.op.negative(cur))
                cur = bb.emit(relax.op.reshape(cur, (16, 32, 64)))
                out = bb.emit_output(relax.op.add(relax.op.multiply(cur, y), cur))
            bb.emit_func_output(out)

    return build


@pytest.mark.parametrize("seed", range(6))
def test_random_movement_chains_equal_the_unscheduled_kernel(seed, llvm):
    func = _fused(llvm, _movement_chain(seed))
    sch = ParallelSpatialLLVM().apply(func, llvm, False)
    assert sch is not None  # 32768-element blocks: always large enough
    _check(func, llvm, sch)


def _half_pool(dtype: str, c: int):
    """A half model's max-pool as ``torch_half`` imports it: cast to float32, a channels-last
    3x3 / stride-2 max-pool, cast back."""

    def build(bb):
        x = relax.Var("x", relax.TensorType((1, 28, 28, c), dtype))
        with bb.function("main", [x]):
            with bb.dataflow():
                y = bb.emit(relax.op.astype(x, "float32"))
                y = bb.emit(
                    relax.op.nn.max_pool2d(y, pool_size=3, strides=2, padding=1, layout="NHWC")
                )
                out = bb.emit_output(relax.op.astype(y, dtype))
            bb.emit_func_output(out)

    return build


def _run_typed(func, target, seed=0):
    """Run ``func`` on random inputs in its parameters' own dtypes (bfloat16 via ml_dtypes)."""
    import ml_dtypes

    rng = np.random.default_rng(seed)
    arrays = []
    for p in func.params:
        shape = [int(d) for d in p.ty.shape]
        dtype = ml_dtypes.bfloat16 if str(p.dtype) == "bfloat16" else str(p.dtype)
        arrays.append((rng.standard_normal(shape) * 4).astype(dtype))
    return run(func, target, arrays)


@pytest.mark.parametrize("dtype,c", [("bfloat16", 64), ("float16", 32), ("float32", 24)])
def test_a_half_pool_runs_parallel_vectorized_over_channels_and_exact(dtype, c, llvm):
    """The kernel GIR declines in half precision (a reduction over half buffers) is no longer
    left serial: its spatial loops run parallel, the channel loop (contiguous in every access)
    moves inside the window loops and is vectorized where it divides; max is exact, so the
    result equals the unscheduled kernel bit for bit."""
    func = _fused(llvm, _half_pool(dtype, c))
    if dtype != "float32":
        assert GIRLLVM().apply(func, llvm, False) is None
    sch = ParallelSpatialLLVM(min_elements=1024).apply(func, llvm, False)
    assert sch is not None
    s = s_tir.Schedule(sch.mod["main"])
    names = {s.get(b).name_hint: b for b in s.get_child_blocks(s.get_sblock("root"))}
    # the padding is read in place, not written out
    assert not any("pad" in name for name in names), names
    update = next(b for name, b in names.items() if name.endswith("_update"))
    loops = [s.get(loop) for loop in s.get_loops(update)]
    assert int(loops[0].kind) == int(tirx.ForKind.PARALLEL)
    # the window loops (extent 3) sit between the vectors of channels and their lanes, as
    # wide as the target's vector in the pool's widest type (float32), halved until they divide
    lanes = target_lanes(llvm)
    while c % lanes:
        lanes //= 2
    assert [int(lp.extent) for lp in loops[-3:]] == [3, 3, lanes]
    assert int(loops[-1].kind) == int(tirx.ForKind.VECTORIZED)
    assert int(loops[-4].extent) == c // lanes
    # each vector of outputs is set once, in front of its window, as one vector
    init = names[s.get(update).name_hint.replace("_update", "_init")]
    assert int(s.get(s.get_loops(init)[-1]).kind) == int(tirx.ForKind.VECTORIZED)
    # as the pipeline builds it: with PropagateNaN's rewrite of the max (a bfloat16 pool's
    # padding, inlined, once came out 5e4 off through a Let of its cast)
    scheduled = PropagateNaN()(tvm.IRModule({"main": sch.mod["main"]}))["main"]
    for want, got in zip(_run_typed(func, llvm), _run_typed(scheduled, llvm)):
        np.testing.assert_array_equal(got.astype("float32"), want.astype("float32"))


def test_a_row_reduction_runs_a_row_at_a_time_in_vector_lanes(llvm):
    """A bfloat16 softmax between casts (rows of 512), which GIR declines: every block runs
    inside one parallel loop over the rows (the max, the sum and the output a row at a time,
    no full-size buffer between them), and the max and the sum reduce in vector lanes
    (partial results per lane, then the lanes), not as a chain of 512 dependent additions.
    The sum's order changes, so the result equals the unscheduled kernel to bfloat16's
    rounding, not bit for bit."""

    def build(bb):
        x = relax.Var("x", relax.TensorType((4, 64, 512), "bfloat16"))
        with bb.function("main", [x]):
            with bb.dataflow():
                y = bb.emit(relax.op.astype(x, "float32"))
                y = bb.emit(relax.op.nn.softmax(y, axis=-1))
                out = bb.emit_output(relax.op.astype(y, "bfloat16"))
            bb.emit_func_output(out)

    func = _fused(llvm, build)
    assert GIRLLVM().apply(func, llvm, False) is None
    sch = ParallelSpatialLLVM().apply(func, llvm, False)
    assert sch is not None
    s = s_tir.Schedule(sch.mod["main"])
    blocks = s.get_child_blocks(s.get_sblock("root"))
    rows = {s.get(s.get_loops(b)[0]).loop_var.name for b in blocks}
    assert len(rows) == 1 and int(s.get(s.get_loops(blocks[0])[0]).kind) == int(
        tirx.ForKind.PARALLEL
    )
    lanes = [b for b in blocks if s.get(b).name_hint.endswith("_rf")]
    assert len(lanes) == 2
    for b in lanes:
        inner = s.get(s.get_loops(b)[-1])
        assert int(inner.kind) == int(tirx.ForKind.VECTORIZED) and 512 % int(inner.extent) == 0
    for want, got in zip(_run_typed(func, llvm), _run_typed(sch.mod["main"], llvm)):
        np.testing.assert_allclose(got.astype("float32"), want.astype("float32"), rtol=1e-2)


def test_a_padding_of_the_channels_stays_a_block_before_a_vectorized_pool(llvm):
    """Inlined into the pool, a padding tested on the channel would test each lane (TVM then
    makes the vector loop scalar): it is written out first; a padding of the rows and columns
    alone is read in place (the test above)."""
    from tvm import te, topi

    x = te.placeholder((1, 30, 30, 24), "float32", name="x")
    lowest = tirx.min_value("float32")
    padded = topi.nn.pad(x, [0, 1, 1, 0], [0, 1, 1, 8], pad_value=lowest, name="channel_pad")
    y = topi.nn.pool2d(padded, (3, 3), (2, 2), (1, 1), (0, 0, 0, 0), "max", layout="NHWC")
    func = te.create_prim_func([x, y]).with_attr("global_symbol", "main")
    sch = ParallelSpatialLLVM(min_elements=1024).apply(func, llvm, False)
    assert sch is not None
    s = s_tir.Schedule(sch.mod["main"])
    names = [s.get(b).name_hint for b in s.get_child_blocks(s.get_sblock("root"))]
    assert "channel_pad" in names, names
    for want, got in zip(_run_typed(func, llvm), _run_typed(sch.mod["main"], llvm)):
        np.testing.assert_array_equal(got, want)


def _gelu_chain(shape):
    """GPT-2's written-out GELU on a [*shape] activation (symbolic sizes allowed)."""

    def build(bb):
        x = relax.Var("x", relax.TensorType(shape, "float32"))
        with bb.function("main", [x]):
            with bb.dataflow():
                cube = bb.emit(relax.op.multiply(relax.op.multiply(x, x), x))
                inner = bb.emit(relax.op.add(x, relax.op.multiply(cube, relax.const(0.044715))))
                t = bb.emit(relax.op.tanh(relax.op.multiply(inner, relax.const(0.7978845608))))
                half = bb.emit(relax.op.multiply(x, relax.const(0.5)))
                out = bb.emit_output(relax.op.multiply(half, relax.op.add(t, relax.const(1.0))))
            bb.emit_func_output(out)

    return build


def test_a_prefill_chain_over_a_batch_and_a_length_runs_parallel_and_vectorized(llvm):
    """Under a symbolic batch and length (a prefill step compiled once for all), the
    element-wise chain GIR declines ran serial and scalar (GPT-2's GELU: 38% of its bfloat16
    prefill at batch 8). Two symbolic sizes make the nest large: the leading loops are fused
    into one parallel loop (all of them: a batch of 1 must not be the whole parallel loop), the
    static innermost loop vectorized. One symbolic size (a decode step's batch) is left."""
    b, n = tirx.Var("b", "int64"), tirx.Var("n", "int64")
    func = _fused(llvm, _gelu_chain((b, n, 3072)))
    sch = ParallelSpatialLLVM().apply(func, llvm, False)
    assert sch is not None
    s = s_tir.Schedule(sch.mod["main"])
    for block in s.get_child_blocks(s.get_sblock("root")):
        loops = [s.get(lp) for lp in s.get_loops(block)]
        assert int(loops[0].kind) == int(tirx.ForKind.PARALLEL)
        assert len(loops) == 3 and int(loops[-1].kind) == int(tirx.ForKind.VECTORIZED)
    libs = [
        tvm.compile(tvm.IRModule({"main": f.with_attr("global_symbol", "main")}), target=llvm)
        for f in (func, sch.mod["main"])
    ]
    for shape in ((1, 5, 3072), (3, 2, 3072)):
        x = tvm.runtime.tensor(np.random.default_rng(0).standard_normal(shape).astype("float32"))
        outs = [tvm.runtime.empty(shape, "float32") for _ in libs]
        for lib, out in zip(libs, outs):
            lib["main"](x, out)
        np.testing.assert_allclose(outs[1].numpy(), outs[0].numpy(), rtol=1e-6, atol=1e-6)
    decode = _fused(llvm, _gelu_chain((b, 1, 3072)))
    assert ParallelSpatialLLVM().apply(decode, llvm, False) is None


def _half_gelu_between_reshapes(b, n):
    """GPT-2's GELU in bfloat16 as a half model's prefill has it: rounded to bfloat16 after
    each operation, ``pow`` and ``tanh`` computed in float32 between casts, read from and
    written to the ``[b * n, 3072]`` rows of the linears around it through reshapes."""

    def build(bb):
        ids = relax.Var("ids", relax.TensorType((b, n), "int64"))  # (defines b and n)
        rows = relax.Var("rows", relax.TensorType((b * n, 3072), "bfloat16"))
        with bb.function("main", [ids, rows]):
            with bb.dataflow():
                x = bb.emit(relax.op.reshape(rows, (b, n, 3072)))
                xf = bb.emit(relax.op.astype(x, "float32"))
                cube = bb.emit(
                    relax.op.astype(relax.op.multiply(relax.op.multiply(xf, xf), xf), "bfloat16")
                )
                inner = bb.emit(
                    relax.op.add(x, relax.op.multiply(cube, relax.const(0.044715, "bfloat16")))
                )
                arg = bb.emit(
                    relax.op.astype(
                        relax.op.multiply(inner, relax.const(0.7978845608, "bfloat16")), "float32"
                    )
                )
                t = bb.emit(relax.op.astype(relax.op.tanh(arg), "bfloat16"))
                half = bb.emit(relax.op.multiply(x, relax.const(0.5, "bfloat16")))
                y = bb.emit(relax.op.multiply(half, relax.op.add(t, relax.const(1.0, "bfloat16"))))
                out = bb.emit_output(relax.op.reshape(y, (b * n, 3072)))
            bb.emit_func_output(out)

    return build


def test_a_half_gelu_between_reshapes_is_one_parallel_loop_of_vector_math(llvm):
    """The bfloat16 GELU of a prefill (symbolic batch and length, reshapes from and to the
    linears' rows) ran as twelve full-size buffers with TVM's scalar ``tanh``: 11.4 ms on
    [8 * 128, 3072], against 0.46 now. Every intermediate is inlined but ``tanh``'s float32
    argument and result, which are computed a row at a time inside the output's parallel loop;
    ``tanh`` is vector arithmetic (no TVM ``tanh`` call left). The reshape's reads over two
    symbolic sizes fold to plain rows (``symbolic_divmod``). Equal to the unscheduled kernel
    within one bfloat16 rounding (the fast ``tanh`` differs from TVM's in float32's last bits)."""
    b, n = tirx.Var("b", "int64"), tirx.Var("n", "int64")
    func = _fused(llvm, _half_gelu_between_reshapes(b, n))
    sch = ParallelSpatialLLVM().apply(func, llvm, False)
    assert sch is not None
    scheduled = sch.mod["main"]
    assert "T.tanh(" not in scheduled.script()
    s = s_tir.Schedule(scheduled)
    blocks = s.get_child_blocks(s.get_sblock("root"))
    rows = {s.get_loops(block)[0] for block in blocks}
    assert len(blocks) == 3 and len({s.get(r).loop_var.name for r in rows}) == 1
    assert int(s.get(next(iter(rows))).kind) == int(tirx.ForKind.PARALLEL)
    for block in blocks:
        assert int(s.get(s.get_loops(block)[-1]).kind) == int(tirx.ForKind.VECTORIZED)
    assert "% (b * n)" not in scheduled.script()
    _check_rows(func, scheduled, 3072, llvm)


def _check_rows(func, scheduled, width: int, llvm) -> None:
    """``scheduled`` equals ``func`` to bfloat16's rounding on ``[b * n, width]`` rows for two
    batches and lengths."""
    libs = [
        tvm.compile(tvm.IRModule({"main": f.with_attr("global_symbol", "main")}), target=llvm)
        for f in (func, scheduled)
    ]
    torch = pytest.importorskip("torch")
    for batch, length in ((1, 5), (3, 7)):
        sizes = {"b": batch, "n": length}
        gen = torch.Generator().manual_seed(batch)
        args = []
        for param in func.params[:-1]:  # inputs (of the rows' values), sizes, then the output
            if param.name in sizes:
                args.append(sizes[param.name])
                continue
            shape = [_size(d, sizes) for d in param.shape]
            values = torch.randn(shape, generator=gen) * 3
            args.append(tvm.runtime.from_dlpack(values.to(getattr(torch, str(param.dtype)))))
        rows = batch * length
        outs = [torch.empty(rows, width, dtype=torch.bfloat16) for _ in libs]
        for lib, out in zip(libs, outs):
            lib["main"](*args, tvm.runtime.from_dlpack(out))
        want, got = (o.float() for o in outs)
        assert float(want.abs().max()) > 1.0
        torch.testing.assert_close(got, want, rtol=2**-7, atol=2**-7)


def _size(dim, sizes: dict) -> int:
    """A buffer dimension (static, or a product of the symbolic sizes) at ``sizes``."""
    if isinstance(dim, tirx.IntImm):
        return int(dim)
    if isinstance(dim, tirx.Var):
        return sizes[dim.name]
    assert isinstance(dim, tirx.Mul), dim
    return _size(dim.a, sizes) * _size(dim.b, sizes)


def test_a_half_layer_norm_of_a_prefill_runs_a_row_at_a_time_in_vector_lanes(llvm):
    """A bfloat16 LayerNorm computed in float32 between casts, over a prefill's rows (symbolic
    batch and length, reshapes from and to the linears' rows): its mean and variance were
    chains of 768 dependent additions in full-size loops of their own (1.3 ms on
    [8 * 128, 768], 0.19 now). Every block runs inside the output's parallel row loop; both
    sums reduce in vector lanes."""
    b, n = tirx.Var("b", "int64"), tirx.Var("n", "int64")

    def build(bb):
        ids = relax.Var("ids", relax.TensorType((b, n), "int64"))  # (defines b and n)
        rows = relax.Var("rows", relax.TensorType((b * n, 768), "bfloat16"))
        gamma = relax.Var("gamma", relax.TensorType((768,), "float32"))
        beta = relax.Var("beta", relax.TensorType((768,), "float32"))
        with bb.function("main", [ids, rows, gamma, beta]):
            with bb.dataflow():
                x = bb.emit(relax.op.astype(relax.op.reshape(rows, (b, n, 768)), "float32"))
                y = bb.emit(relax.op.nn.layer_norm(x, gamma, beta, axes=[-1]))
                y = bb.emit(relax.op.astype(y, "bfloat16"))
                out = bb.emit_output(relax.op.reshape(y, (b * n, 768)))
            bb.emit_func_output(out)

    func = _fused(llvm, build)
    sch = ParallelSpatialLLVM().apply(func, llvm, False)
    assert sch is not None
    scheduled = sch.mod["main"]
    s = s_tir.Schedule(scheduled)
    blocks = s.get_child_blocks(s.get_sblock("root"))
    assert len({s.get(s.get_loops(b)[0]).loop_var.name for b in blocks}) == 1
    lanes = [b for b in blocks if s.get(b).name_hint.endswith("_rf")]
    assert len(lanes) == 2
    for block in lanes:
        assert int(s.get(s.get_loops(block)[-1]).kind) == int(tirx.ForKind.VECTORIZED)
    _check_rows(func, scheduled, 768, llvm)


def test_a_half_rms_norm_keeps_its_row_scale_a_value_per_row(llvm):
    """LLaMA's RMSNorm in bfloat16 (``x * rsqrt(mean(x^2) + eps)`` in float32, rounded, times
    the weight, read into two outputs' shapes): the ``rsqrt`` of each row is a block of one
    value per row, computed inside the row loop with no loop of its own to vectorize (the row
    loop itself was once split into vectors around the rest, which TVM's build refused:
    "VectorizeLoop before LiftStorageAlloc"). The kernel builds and equals the unscheduled one
    to bfloat16's rounding."""

    def build(bb):
        x = relax.Var("x", relax.TensorType((1, 128, 512), "bfloat16"))
        w = relax.Var("w", relax.TensorType((512,), "bfloat16"))
        with bb.function("main", [x, w]):
            with bb.dataflow():
                xf = bb.emit(relax.op.astype(x, "float32"))
                ms = bb.emit(relax.op.mean(relax.op.multiply(xf, xf), axis=[-1], keepdims=True))
                scale = bb.emit(relax.op.rsqrt(relax.op.add(ms, relax.const(1e-6, "float32"))))
                y = bb.emit(relax.op.astype(relax.op.multiply(xf, scale), "bfloat16"))
                out = bb.emit_output(relax.op.reshape(relax.op.multiply(w, y), (128, 512)))
            bb.emit_func_output(out)

    func = _fused(llvm, build)
    assert "rsqrt" in str(func)
    sch = ParallelSpatialLLVM().apply(func, llvm, False)
    assert sch is not None
    s = s_tir.Schedule(sch.mod["main"])
    blocks = s.get_child_blocks(s.get_sblock("root"))
    assert len({s.get(s.get_loops(b)[0]).loop_var.name for b in blocks}) == 1
    assert int(s.get(s.get_loops(blocks[0])[0]).kind) == int(tirx.ForKind.PARALLEL)
    for want, got in zip(_run_typed(func, llvm), _run_typed(sch.mod["main"], llvm)):
        np.testing.assert_allclose(got.astype("float32"), want.astype("float32"), rtol=2**-7)


def test_a_half_swiglu_between_reshapes_builds_with_its_sigmoid_vectorized(llvm):
    """LLaMA's bfloat16 SwiGLU of a prefill: ``bf16(x * sigmoid(x)) * up`` with ``x`` the gate's
    rows widened to float32. The sigmoid's value reaches the rounding to bfloat16 through the
    product inlined after it; inlined there, TVM's rounding used the fast sigmoid's ``Let``
    twice and the build failed ("Let cannot bind the same var to two different values"). The
    sigmoid stays a float32 row next to the output: the kernel builds, has no TVM ``sigmoid``
    call left, and equals the unscheduled one to bfloat16's rounding."""
    b, n = tirx.Var("b", "int64"), tirx.Var("n", "int64")

    def build(bb):
        ids = relax.Var("ids", relax.TensorType((b, n), "int64"))  # (defines b and n)
        gate = relax.Var("gate", relax.TensorType((b * n, 2048), "bfloat16"))
        up = relax.Var("up", relax.TensorType((b * n, 2048), "bfloat16"))
        with bb.function("main", [ids, gate, up]):
            with bb.dataflow():
                x = bb.emit(relax.op.astype(relax.op.reshape(gate, (b, n, 2048)), "float32"))
                silu = bb.emit(relax.op.multiply(x, relax.op.sigmoid(x)))
                act = bb.emit(relax.op.astype(silu, "bfloat16"))
                y = bb.emit(relax.op.multiply(act, relax.op.reshape(up, (b, n, 2048))))
                out = bb.emit_output(relax.op.reshape(y, (b * n, 2048)))
            bb.emit_func_output(out)

    func = _fused(llvm, build)
    assert "sigmoid" in str(func)
    sch = ParallelSpatialLLVM().apply(func, llvm, False)
    assert sch is not None
    scheduled = sch.mod["main"]
    assert "T.sigmoid(" not in scheduled.script()
    _check_rows(func, scheduled, 2048, llvm)


def test_a_half_sum_over_a_leading_axis_builds_with_one_lane(llvm):
    """A mixture of experts sums its experts' bfloat16 outputs over a leading axis (Mixtral's
    ``[experts, tokens, hidden]``): the reduction's contiguous channels made vector lanes of a
    bfloat16 accumulator, which TVM 0.27's bfloat16 legalization refuses ("dtype mismatch on
    BufferStore"); compile_lm of a bfloat16 Mixtral failed. It runs parallel with one lane and
    equals the unscheduled kernel bit for bit (the order of each sum is kept)."""

    def build(bb):
        x = relax.Var("x", relax.TensorType((4, 512, 256), "bfloat16"))
        with bb.function("main", [x]):
            with bb.dataflow():
                out = bb.emit_output(relax.op.sum(x, axis=[0]))
            bb.emit_func_output(out)

    func = _fused(llvm, build)
    sch = ParallelSpatialLLVM().apply(func, llvm, False)
    assert sch is not None
    scheduled = sch.mod["main"]
    tvm.compile(tvm.IRModule({"main": scheduled.with_attr("global_symbol", "main")}), target=llvm)
    for want, got in zip(_run_typed(func, llvm), _run_typed(scheduled, llvm)):
        np.testing.assert_array_equal(got.astype("float32"), want.astype("float32"))
