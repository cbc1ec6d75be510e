"""plus_tvm.stats: operator and kernel counts on small TVMScript modules with known answers."""

# TVMScript: the I/R/T aliases and functions inside @I.ir_module classes are its convention.
# ruff: noqa: N805, N812

from __future__ import annotations

import tvm
from plus_tvm import stats
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T


@I.ir_module
class Mixed:
    """add, a Relax helper with a user call_tir, a library call, a reshape, a multiply."""

    @T.prim_func(private=True, s_tir=True)
    def add_one(x: T.Buffer((4, 8), "float32"), y: T.Buffer((4, 8), "float32")):
        for i, j in T.grid(4, 8):
            with T.sblock("add_one"):
                vi, vj = T.axis.remap("SS", [i, j])
                y[vi, vj] = x[vi, vj] + T.float32(1)

    @R.function
    def helper(x: R.Tensor((4, 8), "float32")) -> R.Tensor((4, 8), "float32"):
        cls = Mixed
        with R.dataflow():
            y = R.call_tir(cls.add_one, (x,), out_ty=R.Tensor((4, 8), "float32"))
            R.output(y)
        return y

    @R.function
    def main(x: R.Tensor((4, 8), "float32")) -> R.Tensor((32,), "float32"):
        cls = Mixed
        with R.dataflow():
            a = R.add(x, x)
            b = cls.helper(a)
            c = R.call_dps_packed("plus_test.lib_fn", (b,), out_ty=R.Tensor((4, 8), "float32"))
            d = R.reshape(c, (32,))
            e = R.multiply(d, d)
            R.output(e)
        return e


@I.ir_module
class Chain:
    @R.function
    def main(x: R.Tensor((4, 8), "float32"), y: R.Tensor((4, 8), "float32")) -> R.Tensor(
        (4, 8), "float32"
    ):
        with R.dataflow():
            a = R.add(x, y)
            b = R.nn.relu(a)
            c = R.multiply(b, y)
            d = R.sum(c, axis=[1])
            R.output(d)
        return d


def _legalize(mod: tvm.IRModule) -> tvm.IRModule:
    seq = tvm.transform.Sequential(
        [relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern()]
    )
    with tvm.target.Target("llvm"):
        return seq(mod)


def _context_with(*instruments) -> tvm.transform.PassContext:
    """The test's strict PassContext plus extra instruments (entering a bare one would drop it)."""
    cur = tvm.transform.PassContext.current()
    return tvm.transform.PassContext(
        opt_level=cur.opt_level,
        config=dict(cur.config),
        instruments=list(cur.instruments) + list(instruments),
    )


def test_count_ops_counts_operator_call_sites_in_main_only():
    # add, call_dps_packed, reshape, multiply; the call of `helper` is not an operator and
    # helper's own call_tir is not in main.
    assert stats.count_ops(Mixed) == 4
    assert stats.op_histogram(Mixed) == {
        "relax.add": 1,
        "relax.call_dps_packed": 1,
        "relax.reshape": 1,
        "relax.multiply": 1,
    }
    assert stats.count_ops(Mixed, "helper") == 1  # its call_tir


def test_count_ops_chain():
    assert stats.count_ops(Chain) == 4
    assert stats.op_histogram(Chain)["relax.nn.relu"] == 1


def test_kernel_stats_reshape_view_library_and_called_functions():
    legal = _legalize(Mixed)
    calls = stats.kernel_calls(legal)
    # Before the reshape rewrite the reshape is still a call_tir; helper's kernel is followed.
    assert ("relax.call_tir", "add_one") in calls
    assert ("relax.call_dps_packed", "plus_test.lib_fn") in calls
    assert len(calls) == 5

    ks = stats.kernel_stats(legal)
    # add, add_one (inside helper), the library call, multiply; the reshape became a view.
    assert ks["kernels"] == 4
    assert ks["library_calls"] == 1
    assert ks["kernel_names"] == {"add": 1, "add_one": 1, "plus_test.lib_fn": 1, "multiply": 1}
    assert "reshape" not in ks["kernel_names"]


def test_kernel_stats_counts_only_what_is_reachable():
    # From helper only its own kernel is reachable; main's kernels are not.
    assert stats.kernel_stats(_legalize(Mixed), "helper")["kernels"] == 1


def test_reshape_that_is_a_dataflow_output_stays_a_kernel():
    @I.ir_module
    class ReshapeOut:
        @R.function
        def main(x: R.Tensor((4, 8), "float32")) -> R.Tensor((32,), "float32"):
            with R.dataflow():
                a = R.add(x, x)
                d = R.reshape(a, (32,))
                R.output(d)
            return d

    # RewriteDataflowReshape only rewrites dataflow-internal bindings: the output reshape is a
    # copy kernel at run time, so it counts.
    assert stats.kernel_stats(_legalize(ReshapeOut))["kernels"] == 2


def test_kernel_stats_does_not_mutate_input(deep_copy):
    legal = _legalize(Mixed)
    before = deep_copy(legal)
    stats.kernel_stats(legal)
    tvm.ir.assert_structural_equal(legal, before)


def test_fused_groups_after_fuse_ops():
    fused = relax.transform.FuseOps()(_legalize(Chain))
    groups = stats.fused_groups(fused)
    assert len(groups) == 1
    # FuseOps puts the elementwise chain and the reduction it feeds in one group.
    assert groups[0]["ops"] == ["add", "relu", "multiply", "sum"]
    assert groups[0]["name"].startswith("fused_add_relu_multiply")
    assert stats.kernel_stats(relax.transform.FuseTIR()(fused))["kernels"] == 1


def test_fused_groups_empty_before_fusion():
    assert stats.fused_groups(_legalize(Chain)) == []


def test_fusion_recorder_records_groups():
    recorder = stats.PipelineRecorder()
    legal = _legalize(Chain)
    with _context_with(recorder):
        relax.transform.LegalizeOps()(Chain)  # not a fusion pass: records nothing
        assert recorder.groups == []
        relax.transform.FuseOps()(legal)
    assert [g["ops"] for g in recorder.groups] == [["add", "relu", "multiply", "sum"]]


def test_fusion_recorder_custom_pass_names():
    recorder = stats.PipelineRecorder(fusion_passes=("SomethingElse",))
    with _context_with(recorder):
        relax.transform.FuseOps()(_legalize(Chain))
    assert recorder.groups == []
