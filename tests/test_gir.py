"""GIR (paper 002): analysis, templates, merging, rewrite rules, performance model, search."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tvm
from gir_kernels import fused_primfunc
from plus_tvm.gir import (
    Capacity,
    GOp,
    Graph,
    Hierarchy,
    Kind,
    MemSlice,
    Parallel,
    Scope,
    analyze,
    estimate,
    generate,
    machine_for,
    merge,
    op_graph,
    optimize,
    placement,
    plan,
    plan_kernel,
)
from plus_tvm.gir import model as gir_model
from plus_tvm.gir import rewrite as rw
from plus_tvm.gir.lowering import fast_erf, fast_exp, fast_tanh
from plus_tvm.target import resolve_target
from tvm.script import tirx as T  # noqa: N812

G, C, R = Hierarchy.GLOBAL, Hierarchy.CACHE, Hierarchy.REG
CPU = Parallel("core", 16, 16)
CAP = Capacity(reg=1536, cache=256 * 1024)


@pytest.fixture(scope="module")
def llvm():
    return resolve_target("llvm")


@pytest.fixture(scope="module")
def kernels(llvm):
    shapes = {"transpose_add": [64, 96], "mean_hw": [1, 8, 7, 7]}
    names = (
        "layernorm",
        "softmax",
        "rmsnorm",
        "gelu",
        "transpose_add",
        "rowsum",
        "colsum",
        "add_layernorm",
        "mean_hw",
    )
    return {k: analyze(fused_primfunc(k, shapes.get(k, [64, 256]), llvm)) for k in names}


# ------------------------------------------------------------------------------- analysis
def test_analysis_splits_kernels_into_basic_operators(kernels):
    ln = kernels["layernorm"]
    assert ln.structure == "row" and ln.rows == 64 and ln.row_len == 256
    assert [o.kind for o in ln.ops] == ["reduce", "ewise", "reduce", "broadcast"]
    sm = kernels["softmax"]
    assert [o.kind for o in sm.ops] == ["reduce", "broadcast", "reduce", "broadcast"]
    assert sm.op("T_softmax_exp").transcendental == 1
    assert kernels["colsum"].structure == "column"
    assert kernels["mean_hw"].structure == "row" and kernels["mean_hw"].row_len == 49
    tr = kernels["transpose_add"]
    assert tr.structure == "elementwise" and "transpose" in {o.kind for o in tr.ops}
    # RMSNorm's cast of the weight has no row axis: it is shared by every row
    assert any(o.shared for o in kernels["rmsnorm"].ops)


def test_analysis_dependences(kernels):
    sm = kernels["softmax"]
    assert sm.depends("T_softmax_norm", "T_softmax_maxelem")
    assert not sm.depends("T_softmax_maxelem", "T_softmax_norm")
    assert rw.barrier_between(sm, "T_softmax_exp", "T_softmax_norm")  # expsum in between
    assert not rw.barrier_between(sm, "T_softmax_exp", "T_softmax_expsum")


def test_analysis_declines_gathers_and_scheduled_code(llvm):
    @T.prim_func(s_tir=True)
    def gather(
        a: T.Buffer((16, 8), "float32"), i: T.Buffer((4,), "int32"), o: T.Buffer((4, 8), "float32")
    ):
        for r, c in T.grid(4, 8):
            with T.sblock("take"):
                vr, vc = T.axis.remap("SS", [r, c])
                o[vr, vc] = a[i[vr], vc]

    assert analyze(gather) is None
    f = fused_primfunc("layernorm", [8, 64], llvm)
    from plus_tvm.schedules.gir_llvm import GIRLLVM

    scheduled = GIRLLVM().apply(f, llvm, False).mod["main"]
    assert analyze(scheduled) is None  # loops no longer one per iterator


# ------------------------------------------------------------------------------ templates
def test_templates(kernels):
    ln = kernels["layernorm"]
    ew = op_graph(ln, ln.op("T_layer_norm"), CPU, {"vector": 16})
    kinds = [n.kind for n in ew.nodes]
    assert kinds.count(Kind.EWISE) == 1 and Kind.BROADCAST in kinds
    assert ew.nodes[-1].kind is Kind.MOVE and ew.nodes[-1].outputs[0].hierarchy is G
    red = op_graph(ln, ln.op("x_sum"), CPU, {"vector": 16})
    assert [n.kind for n in red.nodes].count(Kind.REDUCE) == 1
    assert any(n.kind is Kind.SYNC and n.scope is Scope.WARP for n in red.nodes)
    # several warps per row: partials meet in CACHE behind a BLOCK synchronization
    gpu = Parallel("warp", 32, 1, units_per_row=4, units_per_block=4)
    multi = op_graph(ln, ln.op("x_sum"), gpu, {"vector": 1})
    assert any(n.kind is Kind.SYNC and n.scope is Scope.BLOCK for n in multi.nodes)
    assert any(s.hierarchy is C for n in multi.nodes for s in n.outputs)
    # transpose: strided segments without blocking, a CACHE tile with it
    tr = kernels["transpose_add"]
    op = next(o for o in tr.ops if o.kind == "transpose")
    plain = op_graph(tr, op, CPU, {"vector": 16, "tile": 0, "row_len": 96})
    assert any(s.width == 1 and s.num == 96 for n in plain.nodes for s in n.inputs)
    tiled = op_graph(tr, op, CPU, {"vector": 16, "tile": 16, "row_len": 16})
    assert any(
        s.hierarchy is C and s.pattern == (16, 16, 16) for n in tiled.nodes for s in n.outputs
    )


def test_merge_inserts_device_syncs(kernels):
    sm = kernels["softmax"]
    g = generate(sm, CPU, {"vector": 16})
    syncs = [n for n in g.nodes if n.kind is Kind.SYNC and n.scope is Scope.DEVICE]
    # maxelem -> exp, exp -> expsum, exp -> norm, expsum -> norm
    assert len(syncs) == 4
    g.check()
    with pytest.raises(ValueError, match="parallel"):
        merge(
            sm,
            [
                op_graph(sm, o, p, {"vector": 16})
                for o, p in zip(sm.ops[:2], (CPU, Parallel("core", 8, 8)))
            ],
        )


# -------------------------------------------------------------------------- rewrite rules
def _chain(parallel=CPU, reader_pattern=None, width=64):
    """store t (REG -> GLOBAL), DEVICE sync, load t: the merged form of a producer/consumer."""
    g = Graph(parallel)
    a = MemSlice("a", G, 1, width, width)
    ar, tr = MemSlice("a", R, 1, width, width), MemSlice("t", R, 1, width, width)
    tg = MemSlice("t", G, 1, width, width)
    g.add(GOp(Kind.MOVE, [a], [ar], attrs={"block": "p"}))
    g.add(GOp(Kind.EWISE, [ar], [tr], attrs={"block": "p", "cheap": True}))
    g.add(GOp(Kind.MOVE, [tr], [tg], attrs={"block": "p"}))
    rp = reader_pattern or tg.pattern
    tg2 = MemSlice("t", G, rp[0], rp[1], rp[2] or rp[1], version=7)
    sync = g.add(GOp(Kind.SYNC, [tg], [tg2], Scope.DEVICE, attrs={"reader_pattern": rp}))
    tr2 = MemSlice("t", R, 1, tg2.elements, tg2.elements, version=8)
    g.add(GOp(Kind.MOVE, [tg2], [tr2], attrs={"block": "c"}))
    out = MemSlice("o", G, 1, width, width)
    g.add(GOp(Kind.EWISE, [tr2], [MemSlice("o", R, 1, width, width)], attrs={"block": "c"}))
    g.add(GOp(Kind.MOVE, [g.nodes[-1].outputs[0]], [out], attrs={"block": "c"}))
    return g, sync


class _K:  # a kernel with two element-wise blocks and no reduction
    params = ["a", "o"]
    intermediates = ["t"]
    ops = []

    def depends(self, later, earlier):
        return later == "c" and earlier == "p"


def test_sync_insertion_lane_scope_removes_the_sync_and_raises_to_registers():
    g, sync = _chain()
    assert rw.insert_sync(_K(), g, CAP, sync)
    assert sync not in g.nodes and g.count(Kind.SYNC) == 0
    assert {s.hierarchy for s in g.slices() if s.tensor == "t"} == {R}


def test_sync_insertion_block_scope_goes_to_cache():
    par = Parallel("warp", 32, 1, units_per_row=4, units_per_block=4)
    g, sync = _chain(par, reader_pattern=(4, 16, 16))  # the row in another segmentation
    assert rw.insert_sync(_K(), g, CAP, sync)
    assert sync.scope is Scope.BLOCK
    assert sync.outputs[0].hierarchy is C


def test_sync_insertion_keeps_device_scope_for_another_row_mapping():
    g, sync = _chain(reader_pattern=(64, 1, 64))  # a strided (transposed) re-read
    assert not rw.insert_sync(_K(), g, CAP, sync)
    assert sync.scope is Scope.DEVICE


def test_merge_raw_to_null_and_to_one_move():
    g = Graph(CPU)
    a, b, c = MemSlice("x", G, 1, 8, 8), MemSlice("x", R, 1, 8, 8), MemSlice("x", G, 1, 8, 8, 1)
    m1 = g.add(GOp(Kind.MOVE, [a], [b]))
    m2 = g.add(GOp(Kind.MOVE, [b], [c]))
    user = g.add(GOp(Kind.EWISE, [c], [MemSlice("y", R, 1, 8, 8)]))
    assert rw.merge_raw(g, m1, m2)
    assert g.nodes == [user] and user.inputs == [a]  # same pattern and hierarchy: null
    g = Graph(CPU)
    d = MemSlice("x", C, 1, 8, 8)
    m1 = g.add(GOp(Kind.MOVE, [a], [b]))
    m2 = g.add(GOp(Kind.MOVE, [b], [d]))
    assert rw.merge_raw(g, m1, m2)
    assert len(g.nodes) == 1 and g.nodes[0].inputs == [a] and g.nodes[0].outputs == [d]


def test_merge_rar(kernels):
    ln = kernels["layernorm"]
    g = Graph(CPU)
    x = MemSlice("x", G, 1, 1024, 1024)  # 4 KiB: more than the registers hold
    r1 = MemSlice("x", R, 1, 1024, 1024, version=1)
    r2 = MemSlice("x", R, 1, 1024, 1024, version=2)
    first = g.add(GOp(Kind.MOVE, [x], [r1], attrs={"block": "x_sum"}))
    second = g.add(GOp(Kind.MOVE, [x], [r2], attrs={"block": "T_layer_norm"}))
    g.add(GOp(Kind.EWISE, [r1, r2], [MemSlice("y", R, 1, 1024, 1024)]))
    # the two readers are separated by the row reductions: the row is staged once in CACHE
    assert rw.merge_rar(ln, g, CAP, first, second)
    staged = [n for n in g.nodes if n.attrs.get("staging")]
    assert len(staged) == 1 and staged[0].outputs[0].hierarchy is C
    assert staged[0].outputs[0] in g.pinned
    assert sum(1 for n in g.nodes for s in n.inputs if s == x) == 1  # one GLOBAL read
    # too large for any cache: read twice
    g2 = Graph(CPU)
    a = g2.add(GOp(Kind.MOVE, [x], [r1], attrs={"block": "x_sum"}))
    b = g2.add(GOp(Kind.MOVE, [x], [r2], attrs={"block": "T_layer_norm"}))
    assert not rw.merge_rar(ln, g2, Capacity(reg=64, cache=512), a, b)


def test_swap_forward_recomputes_a_cheap_operator_at_its_readers(kernels):
    sm = kernels["softmax"]
    g = generate(sm, CPU, {"vector": 16, "recompute": False}).copy()
    for n in list(g.nodes):
        if n in g.nodes:
            rw.insert_sync(sm, g, CAP, n)
    exp = next(
        n for n in g.nodes if n.kind is Kind.EWISE and n.outputs[0].tensor == "T_softmax_exp"
    )
    assert not rw.swap_forward(sm, g, exp)  # exp is not cheap: only with recompute
    g.params["recompute"] = True
    assert rw.swap_forward(sm, g, exp)
    exps = [n for n in g.nodes if n.kind is Kind.EWISE and n.attrs.get("transcendental")]
    assert len(exps) == 2  # recomputed for expsum and for norm
    assert not any(s.tensor == "T_softmax_exp" and s.hierarchy is C for s in g.slices())


def test_algorithm1_terminates_and_is_a_fixed_point(kernels):
    for kernel in kernels.values():
        g0 = generate(kernel, CPU, {"vector": 16, "tile": 16, "row_len": 16})
        g1 = optimize(kernel, g0, CAP)
        g1.check()
        g2 = optimize(kernel, g1, CAP)
        assert len(g2.nodes) == len(g1.nodes)
        assert g1.count(Kind.SYNC, Scope.DEVICE) <= g0.count(Kind.SYNC, Scope.DEVICE)
        assert (
            estimate(kernel, g1, machine_for(resolve_target("llvm"))).seconds
            <= estimate(kernel, g0, machine_for(resolve_target("llvm"))).seconds
        )


def test_optimized_layernorm_reads_its_input_once(kernels):
    ln = kernels["layernorm"]
    g = optimize(ln, generate(ln, CPU, {"vector": 16}), CAP)
    global_reads = [
        n
        for n in g.nodes
        if n.kind is Kind.MOVE and n.inputs[0].tensor == "x" and n.inputs[0].hierarchy is G
    ]
    assert len(global_reads) == 1
    assert g.count(Kind.SYNC, Scope.DEVICE) == 0
    where = placement(ln, g)
    assert where["x_sum"] == where["x_mean"] == where["x_var_sum"] == "inline"
    assert where["x"] == "reg"  # 1 KiB rows stay in registers between the three passes


# ---------------------------------------------------------------------------------- model
def test_model_prefers_less_global_traffic_and_contiguous_segments(kernels, llvm):
    m = machine_for(llvm)
    tr = kernels["transpose_add"]
    strided = optimize(tr, generate(tr, CPU, {"vector": 16, "tile": 0, "row_len": 96}), CAP)
    blocked = optimize(tr, generate(tr, CPU, {"vector": 16, "tile": 16, "row_len": 16}), CAP)
    assert estimate(tr, blocked, m).global_bytes < estimate(tr, strided, m).global_bytes
    ln = kernels["layernorm"]
    raw = generate(ln, CPU, {"vector": 16})
    assert estimate(ln, optimize(ln, raw, CAP), m).global_bytes < estimate(ln, raw, m).global_bytes


def test_machine_figures_are_read_from_the_cache(tmp_path, llvm):
    assert gir_model.load_figures(llvm) is None
    assert not machine_for(llvm).measured
    path = gir_model.figures_path(llvm)
    assert path.startswith(str(tmp_path))
    with open(path, "w") as f:
        json.dump({"global_gbps": 123.0, "cache_gbps": 456.0, "unit_share": 0.5}, f)
    m = machine_for(llvm)
    assert m.measured and m.global_gbps == 123.0 and m.cache_gbps == 456.0
    gpu = machine_for(tvm.target.Target({"kind": "cuda", "arch": "sm_90"}))
    assert gpu.family == "gpu" and gpu.lanes == 32


def test_measure_cpu_stores_figures(llvm):
    figures = gir_model.measure_cpu(llvm, store=True, seconds=0.05)
    assert figures["global_gbps"] > 0 and figures["cache_gbps"] > 0
    assert figures["launch_us"] >= 0  # waking TVM's pool: 10-35 us on the 2-core CI machine
    assert gir_model.load_figures(llvm)["global_gbps"] == figures["global_gbps"]


# --------------------------------------------------------------------------------- search
def test_search_picks_blocking_for_transposes_and_respects_the_budget(kernels, llvm):
    m = machine_for(llvm)
    best = plan_kernel(kernels["transpose_add"], m)
    assert best.params["tile"] > 0
    assert best.ranked[0][0] <= best.ranked[-1][0]
    one = plan_kernel(kernels["transpose_add"], m, budget=1)
    assert one.candidates == 1
    gpu = machine_for(tvm.target.Target({"kind": "cuda", "arch": "sm_90"}))
    p = plan_kernel(kernels["layernorm"], gpu)
    assert p.parallel.unit == "warp" and p.params["threads"] % 32 == 0


def test_plan_of_a_primfunc(llvm):
    p = plan(fused_primfunc("softmax", [16, 1024], llvm), llvm)
    assert p.kernel.structure == "row" and p.placement["T_softmax_maxelem"] == "inline"
    assert p.candidates >= 1


# ------------------------------------------------------------------------------ fast math
@pytest.mark.parametrize(
    "name, fn, ref, lo, hi, tol",
    [
        ("exp", fast_exp, np.exp, -80.0, 80.0, 3e-7),
        ("erf", fast_erf, None, -6.0, 6.0, 2e-6),
        ("tanh", fast_tanh, np.tanh, -12.0, 12.0, 2e-6),
    ],
)
def test_fast_math_accuracy(name, fn, ref, lo, hi, tol, llvm):
    import math

    n = 4096
    a = tvm.tirx.decl_buffer((n,), "float32", name="a") if False else None  # noqa: F841

    @T.prim_func(s_tir=True)
    def kernel(x: T.Buffer((n,), "float32"), y: T.Buffer((n,), "float32")):
        for i in range(n):
            with T.sblock("f"):
                vi = T.axis.spatial(n, i)
                y[vi] = x[vi]

    from tvm import s_tir

    sch = s_tir.Schedule(kernel)
    block = sch.get(sch.get_sblock("f"))
    store = block.body
    body = tvm.tirx.BufferStore(store.buffer, fn(store.value), store.indices)
    new = s_tir.SBlock(block.iter_vars, block.reads, block.writes, block.name_hint, body)
    sch.state.replace(sch.get_sref(sch.get_sblock("f")), new, {block: new})
    f = tvm.compile(
        tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")}), llvm
    )
    x = np.linspace(lo, hi, n).astype("float32")
    xs, ys = tvm.runtime.tensor(x), tvm.runtime.tensor(np.zeros(n, "float32"))
    f["main"](xs, ys)
    want = ref(x.astype("float64")) if ref else np.array([math.erf(v) for v in x.astype(float)])
    rel = np.abs(ys.numpy() - want) / np.maximum(np.abs(want), 1e-30 if name == "exp" else 1.0)
    assert rel.max() < tol, name
    # float32 overflow as the exact function: exp is +inf past log(FLT_MAX), tanh saturates
    x[:3] = [88.8, 100.0, np.inf]
    f["main"](tvm.runtime.tensor(x), ys)
    over = ys.numpy()[:3]
    if name == "exp":
        assert np.isposinf(over).all(), over
    else:
        assert np.array_equal(over, [1.0, 1.0, 1.0]), over
    # NaN in, NaN out, by the clamp itself (PropagateNaN need not rewrite it)
    x[::7] = np.nan
    f["main"](tvm.runtime.tensor(x), ys)
    got = ys.numpy()
    assert np.isnan(got[::7]).all() and not np.isnan(np.delete(got, np.s_[::7])).any(), name
