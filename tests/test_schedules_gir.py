"""GIR schedule rules: numerics of every scheduled kernel against the unscheduled one (llvm),
the pipeline's schedule phase with ``gir``, and CUDA code for sm_90 (compile only here)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from gir_kernels import build, fused_primfunc, random_args, run, run_cuda
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from plus_tvm.gir import machine_for, plan
from plus_tvm.options import Options
from plus_tvm.pipeline import phase_passes
from plus_tvm.schedules import GIRCUDA, GIRLLVM
from plus_tvm.target import resolve_target


@pytest.fixture(scope="module")
def llvm():
    return resolve_target("llvm")


@pytest.fixture(scope="module")
def sm90():
    return resolve_target({"kind": "cuda", "arch": "sm_90"})


def _check(kind, shape, target, sizes=None, tol=1e-4):
    func = fused_primfunc(kind, shape, target)
    sch = GIRLLVM().apply(func, target, False)
    assert sch is not None, f"GIRLLVM declined {kind} {shape}"
    scheduled = sch.mod["main"]
    arrays = random_args(func, sizes)
    for want, got in zip(run(func, target, arrays), run(scheduled, target, arrays)):
        scale = max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale)
    return scheduled


# powers of two and not, rows shorter than a vector, odd rows, one-element rows
SHAPES = [[64, 256], [33, 257], [5, 7], [3, 1000], [128, 1]]
CASES = [
    (k, s)
    for k in (
        "layernorm",
        "add_layernorm_2out",
        "add_layernorm",
        "rmsnorm",
        "softmax",
        "gelu",
        "silu_mul",
        "add_scale",
        "rowsum",
        "colsum",
        "colmean",
    )
    for s in SHAPES
]
CASES += [
    ("transpose_add", [64, 96]),
    ("transpose_add", [7, 13]),
    ("transpose_add", [48, 48]),
    ("mean_hw", [2, 16, 7, 7]),
    ("mean_hw", [1, 8, 56, 56]),
    ("gemv", [1280, 1000]),
    ("gemv", [37, 5]),
    ("silu_pad", [1, 8, 14, 14]),
    ("silu_pad", [1, 3, 5, 9]),
    ("silu_mean_2out", [1, 16, 14, 14]),
    ("silu_mean_2out", [1, 5, 7, 3]),
    ("relu_odd_rows", [1, 8, 28, 28]),
    ("relu_odd_rows", [1, 3, 56, 56]),
    ("rmsnorm_two_shapes", [1, 64, 256]),
    ("rmsnorm_two_shapes", [1, 33, 257]),
    ("rmsnorm_two_shapes", [1, 5, 7]),
]


@pytest.mark.parametrize("kind, shape", CASES, ids=lambda v: str(v))
def test_scheduled_equals_unscheduled(kind, shape, llvm, cores):
    _check(kind, shape, llvm)


@pytest.mark.parametrize("kind", ["layernorm", "softmax", "rmsnorm", "gelu", "colsum"])
def test_symbolic_sizes(kind, llvm):
    n = tvm.tirx.Var("n", "int64")
    scheduled = _check(kind, [n, 96], llvm, sizes={"n": 37})
    # a runtime pool of one thread (TVM's default on a 2-core x86 machine) plans serially
    assert ("T.parallel" if machine_for(llvm).units > 1 else "T.vectorized") in scheduled.script()


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    kind=st.sampled_from(["layernorm", "softmax", "rowsum", "colsum", "add_layernorm"]),
    rows=st.integers(1, 70),
    cols=st.sampled_from([1, 2, 3, 16, 31, 32, 48, 100, 128, 333]),
)
def test_random_shapes(kind, rows, cols, llvm):
    _check(kind, [rows, cols], llvm)


def test_schedule_structure(llvm):
    """Parallel rows, vectorized inner loops, lane partials of reductions in registers."""
    parallel = machine_for(llvm).units > 1  # TVM's pool has one thread on a 2-core x86
    ln = _check("layernorm", [512, 768], llvm).script()  # over 1 MiB: parallel plans only
    assert ("T.parallel" in ln) == parallel and "T.vectorized" in ln and "x_sum_rf" in ln
    sm = _check("softmax", [16, 1024], llvm).script()
    assert "T.exp(" not in sm  # mapped to vectorizable arithmetic
    tr = _check("transpose_add", [512, 1024], llvm).script()
    assert ("T.parallel" in tr) == parallel and "T.vectorized" in tr
    col = _check("colsum", [65536, 16], llvm).script()  # one tile of columns
    if machine_for(llvm).units > 1:
        assert "T.parallel" in col and "x_red_rf" in col  # rows split over the cores
    else:  # one thread in the runtime's pool: one core walks the rows with vector partials
        assert "T.vectorized" in col


def _depth(func) -> int:
    """The deepest nesting of fast-math functions over every store of ``func``."""
    from plus_tvm.gir.lowering import nesting_depth
    from plus_tvm.tir_blocks import blocks, stores

    return max(nesting_depth(st.value) for b in blocks(func.body) for st in stores(b.body))


@pytest.mark.parametrize(
    "kind, shape",
    [
        ("transcendental_chain", [64, 256]),
        ("softmax_exp_tanh", [64, 256]),
        ("transpose_exp_tanh", [512, 256]),
    ],
)
def test_nested_functions_are_staged_not_nested(kind, shape, llvm):
    """TVM's simplifier inlines every pure ``Let``, so fast-math functions nested in one
    expression multiply code generation time (the chain took 165 s to build; three nested
    ``exp`` 17 s). GIR keeps the intermediate between two such functions in a buffer local to
    a row (element-wise: computed once even where gelu reads it twice; a tiled transpose: the
    tile, vectorized), so every function stays mapped to vector arithmetic and no expression
    nests two."""
    import time

    func = fused_primfunc(kind, shape, llvm)
    sch = GIRLLVM().apply(func, llvm, False)
    assert sch is not None
    scheduled = sch.mod["main"]
    assert _depth(scheduled) == 1
    text = scheduled.script()
    assert not re.findall(r"T\.(exp|erf|tanh)\(", text), text  # every function mapped
    local = [ln for ln in text.splitlines() if "alloc_buffer" in ln and '"local"' in ln]
    if kind == "transcendental_chain":  # exp's and erf's results kept, tanh reads the last
        assert len(local) == 2, text
        # on every core unless the plan keeps this small kernel on one (the pool's launch)
        serial = plan(func, llvm).params.get("serial") or machine_for(llvm).units == 1
        assert ("T.parallel" in text) != serial, text
    if kind == "transpose_exp_tanh":  # tanh and the transposed exp kept per tile, vectorized
        assert len(local) == 2 and text.count("T.vectorized") >= 3, text
    start = time.perf_counter()
    _check(kind, shape, llvm, tol=2e-4)
    assert time.perf_counter() - start < 60


@pytest.mark.parametrize("shape", [[1280, 1000], [96, 250], [64, 1000]])
def test_column_epilogue_stays_in_its_tile(shape, llvm):
    """A classifier GEMV with its bias add: the column tile (125 of 1000) is not a multiple of
    the vector, and the epilogue, sized by TensorIR from the accumulators' store, once read
    three columns of the next tile before another core wrote them (EfficientNet-B0 with
    ``fusion_cost=learned``: max error 0.5-21, changing between runs). Three runs each."""
    for _ in range(3):
        _check("gemv_bias", shape, llvm)


def test_fast_math_nests_one_function_deep():
    """Where nothing is staged (a column reduction keeps no producer), the rewrite maps the
    innermost function and leaves the ones over it to the library call."""
    from plus_tvm.gir.lowering import nesting_depth, vectorizable_math
    from tvm import s_tir
    from tvm.script import tirx as T  # noqa: N812

    @T.prim_func(s_tir=True)
    def kernel(x: T.Buffer((64, 16), "float32"), y: T.Buffer((64, 16), "float32")):
        for i, j in T.grid(64, 16):
            with T.sblock("f"):
                vi, vj = T.axis.remap("SS", [i, j])
                y[vi, vj] = T.exp(T.tanh(T.exp(x[vi, vj]) * T.float32(0.1)))

    sch = s_tir.Schedule(kernel)
    assert vectorizable_math(sch) == 1
    text = sch.mod["main"].script()
    assert nesting_depth(sch.get(sch.get_sblock("f")).body.value) == 1
    assert "T.exp(" in text and "T.tanh(" in text and text.count("T.exp(") == 1
    f = tvm.compile(sch.mod, "llvm")
    xs = np.random.default_rng(0).standard_normal((64, 16)).astype("float32")
    ys = tvm.runtime.tensor(np.zeros((64, 16), "float32"))
    f["main"](tvm.runtime.tensor(xs), ys)
    np.testing.assert_allclose(ys.numpy(), np.exp(np.tanh(np.exp(xs) * 0.1)), rtol=1e-5)


def test_cnn_kernel_plans(llvm):
    """The kernels that dominate CNNs after library dispatch get the intended structure: a
    classifier GEMV is a row reduction over the weight's rows (the weight's transpose is
    inlined, rows read contiguously); squeeze-excite's activation + mean is one row kernel
    with two outputs; a pad's bounds test and a 28-wide row keep their loop nest (no
    per-element index divisions); a GEMM with several rows stays a contraction (declined)."""
    gemv = plan(fused_primfunc("gemv", [1280, 1000], llvm), llvm)
    assert gemv is not None and gemv.kernel.structure == "row"
    assert (gemv.kernel.rows, gemv.kernel.row_len) == (1000, 1280)
    se = plan(fused_primfunc("silu_mean_2out", [1, 16, 14, 14], llvm), llvm)
    assert se is not None and se.kernel.structure == "row"
    assert (se.kernel.rows, se.kernel.row_len) == (16, 196)
    assert plan(fused_primfunc("gemm", [8, 64, 32], llvm), llvm) is None
    pad = _check("silu_pad", [1, 8, 12, 13], llvm).script()  # padded rows are 15 wide
    assert "T.exp(" not in pad and "T.sigmoid(" not in pad  # vectorizable sigmoid
    assert "% T.int64(15)" not in pad  # the row loop is kept: no division by its width
    odd = _check("relu_odd_rows", [1, 8, 20, 28], llvm).script()
    assert "% T.int64(28)" not in odd


def test_rule_declines_what_it_does_not_plan(llvm):
    from tvm.script import tirx as T  # noqa: N812

    @T.prim_func(s_tir=True)
    def gather(
        a: T.Buffer((16, 8), "float32"), i: T.Buffer((4,), "int32"), o: T.Buffer((4, 8), "float32")
    ):
        for r, c in T.grid(4, 8):
            with T.sblock("take"):
                vr, vc = T.axis.remap("SS", [r, c])
                o[vr, vc] = a[i[vr], vc]

    assert GIRLLVM().apply(gather, llvm, False) is None
    assert GIRLLVM().apply(gather, resolve_target({"kind": "cuda", "arch": "sm_90"}), False) is None


def test_pipeline_schedule_phase_with_gir(llvm):
    """``gir=True``: every memory kernel of a small block is scheduled, results unchanged."""
    from tvm import relax

    mod = build("add_layernorm", [32, 64])
    phases = ("legalize", "fuse", "schedule")
    with llvm:
        on = tvm.transform.Sequential(phase_passes(llvm, Options(gir=True), phases=phases))(mod)
        off = tvm.transform.Sequential(phase_passes(llvm, Options(gir=False), phases=phases))(mod)
    funcs = [f for _, f in on.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert funcs and all(f.attrs.get("tirx.is_scheduled", False) for f in funcs)
    assert not any(
        f.attrs.get("tirx.is_scheduled", False)
        for _, f in off.functions_items()
        if isinstance(f, tvm.tirx.PrimFunc)
    )
    rng = np.random.default_rng(1)
    args = [rng.standard_normal(s).astype("float32") for s in ([32, 64], [32, 64], [64], [64])]
    outs = []
    for gir in (True, False):
        passes = phase_passes(
            llvm, Options(gir=gir), phases=("legalize", "fuse", "schedule", "lower", "finalize")
        )
        ex = tvm.compile(mod, target=llvm, relax_pipeline=tvm.transform.Sequential(passes))
        vm = relax.VirtualMachine(ex, tvm.cpu())
        outs.append(vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy())
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-5)


def test_options():
    assert Options(gir=True).gir
    assert Options.from_pairs(["gir=true", "gir_search_budget=3"]).gir_search_budget == 3
    from plus_tvm.errors import OptionsError

    with pytest.raises(OptionsError):
        Options(gir_search_budget=-1)


# ----------------------------------------------------------------------------------- CUDA
def _cuda_source(kind, shape, target):
    func = fused_primfunc(kind, shape, target)
    sch = GIRCUDA().apply(func, target, False)
    assert sch is not None, f"GIRCUDA declined {kind}"
    ex = tvm.compile(
        tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")}), target
    )
    return ex.mod.imports[0].inspect_source()


@pytest.mark.parametrize(
    "kind",
    ["layernorm", "softmax", "rmsnorm", "rowsum", "add_layernorm_2out", "rmsnorm_two_shapes"],
)
def test_cuda_row_kernels_use_warp_shuffles_and_shared_memory(kind, sm90):
    shape = [1, 512, 768] if kind == "rmsnorm_two_shapes" else [512, 768]
    src = _cuda_source(kind, shape, sm90)
    assert "__shfl_down_sync" in src or "__shfl_sync" in src  # warp-level reduction
    if kind != "rowsum":
        assert "__shared__" in src  # row results / staged rows shared by the block
    assert "blockIdx.x" in src and "threadIdx.x" in src


def test_cuda_elementwise_and_transpose(sm90):
    src = _cuda_source("transpose_add", [1024, 512], sm90)
    assert "__shared__" in src  # a tile staged so both global accesses are coalesced
    src = _cuda_source("gelu", [512, 3072], sm90)
    assert "erff" in src or "erf" in src
    src = _cuda_source("add_scale", [512, 3072], sm90)
    assert "float4" in src  # vector accesses


def test_cuda_pipeline_tries_gir_before_dlight(sm90):
    mod = build("softmax", [64, 1000])
    with sm90:
        out = tvm.transform.Sequential(
            phase_passes(sm90, Options(gir=True), phases=("legalize", "fuse", "schedule"))
        )(mod)
    funcs = [f for _, f in out.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert all(f.attrs.get("tirx.is_scheduled", False) for f in funcs)
    p = plan(fused_primfunc("softmax", [64, 1000], sm90), sm90)
    script = funcs[0].script()
    threads = p.params["threads"]
    assert re.search(rf"thread_binding\((T\.int64\()?{threads}\)?, thread=\"threadIdx.x\"", script)


@pytest.mark.parametrize(
    "kind, shape, shuffles",
    [
        ("gemv", [1280, 1000], True),
        ("silu_mean_2out", [1, 16, 14, 14], True),
        ("silu_pad", [1, 8, 14, 14], False),
        ("relu_odd_rows", [1, 8, 28, 28], False),
    ],
)
def test_cuda_cnn_kernels(kind, shape, shuffles, sm90):
    """The CNN kernels the llvm rule plans compile for sm_90 through GIRCUDA too; the GEMV
    and the squeeze-excite mean reduce their rows with warp shuffles."""
    src = _cuda_source(kind, shape, sm90)
    assert ("__shfl_down_sync" in src or "__shfl_sync" in src) == shuffles
    assert "blockIdx.x" in src and "threadIdx.x" in src


_GPU_SHAPES = {
    "transpose_add": [64, 96],
    "gemv": [1280, 1000],
    "silu_pad": [1, 8, 14, 14],
    "silu_mean_2out": [1, 16, 14, 14],
}


@pytest.mark.gpu
@pytest.mark.parametrize(
    "kind",
    ["layernorm", "softmax", "rmsnorm", "gelu", "transpose_add", "rowsum", "colsum"]
    + ["gemv", "silu_pad", "silu_mean_2out"],
)
def test_cuda_numerics_on_gpu(kind):
    target = resolve_target("cuda")
    shape = _GPU_SHAPES.get(kind, [96, 200])
    func = fused_primfunc(kind, shape, target)
    sch = GIRCUDA().apply(func, target, False)
    assert sch is not None
    arrays = random_args(func)
    got = run_cuda(sch.mod["main"], arrays)
    want = run(func, resolve_target("llvm"), arrays)
    for w, a in zip(want, got):
        np.testing.assert_allclose(a, w, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------- whole models
@pytest.mark.parametrize("name", ["bert-base-tiny", "gpt2-tiny"])
def test_zoo_model_with_gir(name, llvm):
    """Real fused kernels (LayerNorm with its reshaped copy as a second output, softmax with
    a broadcast/reshape epilogue, boolean masks) are scheduled and the model stays exact."""

    names = _zoo_scheduled_and_exact(name, Options(gir=True, dispatch=False), llvm)
    assert any("layer_norm" in n for n in names) and any("softmax" in n for n in names)


def _zoo_scheduled_and_exact(name: str, options: Options, llvm) -> list[str]:
    """Names of the kernels GIR scheduled in zoo model ``name`` (phases up to schedule), after
    checking the model compiled with ``options`` against torch eager."""
    import plus_tvm
    import torch
    from plus_tvm import zoo

    model, inputs = zoo.load(name)
    mod, _ = plus_tvm.from_torch(model, inputs)
    phases = ("dispatch", "legalize", "fuse", "schedule")
    with llvm:
        scheduled = tvm.transform.Sequential(phase_passes(llvm, options, phases=phases))(mod)
    with torch.no_grad():
        want = model(*inputs)
    want = (want[0] if isinstance(want, (tuple, list)) else want).numpy()
    got = plus_tvm.compile(model, llvm, example_args=inputs, options=options)(*inputs)
    got = got[0] if isinstance(got, (tuple, list)) else got
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    return [
        gv.name_hint
        for gv, f in scheduled.functions_items()
        if isinstance(f, tvm.tirx.PrimFunc) and f.attrs.get("tirx.is_scheduled", False)
    ]


def test_zoo_kernels_compile_for_sm90(sm90):
    """GIRCUDA on the real fused kernels of a model: all of them build for sm_90."""
    import plus_tvm
    from plus_tvm import zoo

    model, inputs = zoo.load("bert-base-tiny")
    mod, _ = plus_tvm.from_torch(model, inputs)
    with sm90:
        mod = tvm.transform.Sequential(
            phase_passes(sm90, Options(dispatch=False), phases=("legalize", "fuse"))
        )(mod)
    built = 0
    for _, func in mod.functions_items():
        if not isinstance(func, tvm.tirx.PrimFunc):
            continue
        sch = GIRCUDA().apply(func, sm90, False)
        if sch is None:
            continue
        main = sch.mod["main"].with_attr("global_symbol", "main")
        src = tvm.compile(tvm.IRModule({"main": main}), sm90).mod.imports[0].inspect_source()
        assert "__shfl_down_sync" in src or "__shfl_sync" in src
        built += 1
    assert built >= 3  # the LayerNorms and the softmax


@pytest.mark.parametrize(
    "name, expected",
    [
        ("efficientnet-b0-tiny", ("mean", "multiply")),  # (the classifier: plus.linear)
        ("mobilenetv2-tiny", ("mean",)),  # (the classifier: plus.linear)
    ],
)
def test_zoo_cnn_with_gir(name, expected, llvm):
    """What CNNs leave outside the library after dispatch (the classifier's GEMV, the
    squeeze-excite means and scales; the SiLU went into the convolution) is scheduled by GIR,
    and the model stays exact."""
    names = _zoo_scheduled_and_exact(name, Options(gir=True), llvm)
    for part in expected:
        assert any(part in n for n in names), f"no scheduled kernel named *{part}*: {names}"


def test_rules_say_why_they_declined_in_the_stats():
    """Every kernel a rule returns None for is counted under the rule's reason (issue 14:
    a rule declines with a reason the stats show, never silently)."""
    import plus_tvm
    from torch import nn

    class Model(nn.Module):
        def forward(self, x, idx):
            return x[idx].sum(-1) + x.mean()

    import torch

    stats = plus_tvm.inspect(Model(), example_args=(torch.randn(8, 4), torch.tensor([1, 3])))
    because = stats["schedule"]["declined_because"]
    reasons = {reason for counts in because.values() for reason in counts}
    assert "a gather, an offset slice or a reshaping read" in because.get("GIRLLVM", {})
    assert all(isinstance(n, int) and n > 0 for c in because.values() for n in c.values())
    declined = sum(because.get("ParallelSpatialLLVM", {}).values())
    assert declined == stats["schedule"]["unscheduled"] and reasons
