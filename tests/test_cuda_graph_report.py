"""stats["cuda_graph"]: capture regions, kernels captured / total and the reason for every kernel
left outside, read off sm_90 builds on a machine without a GPU."""

from __future__ import annotations

import json

import plus_tvm
import pytest
import tvm
from plus_tvm import Options
from tvm import relax

CUDA = {"kind": "cuda", "arch": "sm_90"}


def _report(model, mode: str = "always", **options) -> dict:
    stats = plus_tvm.inspect(model, target=CUDA, options=Options(cuda_graph=mode, **options))
    report = stats["cuda_graph"]
    json.dumps(report)  # the CLI prints it as JSON
    return report


def _consistent(report: dict) -> None:
    assert report["kernels"] == report["kernels_captured"] + len(report["outside"])
    assert 0 <= report["library_calls_captured"] <= report["library_calls"]
    assert report["regions"] >= (1 if report["kernels_captured"] else 0)


@pytest.mark.parametrize("mode", ["always", "auto"])
def test_bert_tiny_every_kernel_is_captured(mode):
    report = _report("zoo:bert-base-tiny", mode)
    _consistent(report)
    assert report["mode"] == mode and report["enabled"]
    assert report["regions"] == 1
    assert report["library_calls"] > 0
    assert report["library_calls_captured"] == report["library_calls"]
    # the embedding gather reads a staged copy of input_ids; the returned tensor is a copy
    assert report["outside"] == [] and report["kernels_captured"] == report["kernels"]
    assert report["staging_copies"] == 2
    assert report["bytes_staged_per_replay"] == 1 * 16 * 8 + 1 * 16 * 64 * 4
    assert report["graph_memory_bytes"] > 0
    if mode == "auto":  # the estimate kept the region
        assert report["selection"]["plain"] is False
        assert [r["kept"] for r in report["selection"]["regions"]] == [True]


def test_off_runs_no_capture_pass_and_says_so():
    """The report reads what the build's CUDA-graph passes recorded: off runs none."""
    from plus_tvm.report import stats_text

    stats = plus_tvm.inspect("zoo:bert-base-tiny", target=CUDA, options=Options(cuda_graph="off"))
    assert stats["cuda_graph"] == {"mode": "off", "enabled": False}
    assert "off in this build (cuda_graph=off)" in stats_text(stats)


@pytest.mark.parametrize("fold", [True, False])
def test_gpt2_tiny_region_stays_whole(fold):
    """GPT-2's mask runs a cumsum between ``vm.builtin.reshape`` host calls, which cut the graph:
    folded at compile time (FoldStaticSubgraphs), or with the reshapes made views
    (RewriteViewBuiltins) when not folded, one region holds every kernel."""
    whole = _report("zoo:gpt2-tiny", "auto", fold_constants=fold)
    _consistent(whole)
    assert whole["regions"] == 1 and whole["outside"] == []


def _one_kernel() -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    with bb.function("main", [x], attrs={"num_input": 1}):
        with bb.dataflow():
            out = bb.emit_output(relax.op.exp(x))
        bb.emit_func_output(out)
    return bb.get()


def test_auto_leaves_a_graph_out_where_it_cannot_pay():
    """One kernel: a replay saves one launch and costs a graph launch and two staging copies,
    so auto builds the plain program; always captures it anyway."""
    auto = _report(_one_kernel(), "auto")
    _consistent(auto)
    assert auto["regions"] == 0 and auto["kernels_captured"] == 0
    assert auto["staging_copies"] == 0  # the plain plan: no copies either
    assert {o["reason"] for o in auto["outside"]} == {"not worth a graph (estimate)"}
    assert auto["selection"]["plain"] is True
    assert auto["selection"]["regions"][0]["saving_us"] < 0
    always = _report(_one_kernel(), "always")
    assert always["regions"] == 1 and always["kernels_captured"] == always["kernels"] == 1


def _dynamic_mlp(upper: int | None = None) -> tvm.IRModule:
    n = tvm.tirx.Var("n", "int64")
    attrs = {"num_input": 1}
    if upper is not None:
        attrs["tir_var_upper_bound"] = {"n": upper}
    bb = relax.BlockBuilder()
    # wide enough that both GEMMs are library calls at the size a bounded n is priced at
    x = relax.Var("x", relax.TensorType((n, 256), "float32"))
    w1 = relax.Var("w1", relax.TensorType((256, 256), "float32"))
    w2 = relax.Var("w2", relax.TensorType((256, 64), "float32"))
    with bb.function("main", [x, w1, w2], attrs=attrs):
        with bb.dataflow():
            h = bb.emit(relax.op.nn.relu(relax.op.matmul(x, w1)))
            h = bb.emit(relax.op.tanh(relax.op.matmul(h, w2)))
            h = bb.emit(relax.op.exp(h))
            out = bb.emit_output(relax.op.sigmoid(h))
        bb.emit_func_output(out)
    return bb.get()


def test_symbolic_sizes_are_named():
    report = _report(_dynamic_mlp())
    _consistent(report)
    reasons = {o["reason"] for o in report["outside"]}
    assert report["kernels_captured"] == 0
    assert "reads a model input" in reasons and "symbolic size" in reasons
    assert "writes the returned tensor" in reasons
    assert report["bytes_staged_per_replay"] == 0


@pytest.mark.parametrize("max_sizes", [32, 8])
def test_bounded_symbolic_sizes_are_captured_per_value(max_sizes):
    """n <= 8 has 8 values: declared as a capture variable up to a cap of 8 graphs."""
    report = _report(_dynamic_mlp(upper=8), cuda_graph_max_sizes=max_sizes)
    _consistent(report)
    assert report["regions"] == 1 and report["kernels_captured"] > 0
    assert "symbolic size" not in {o["reason"] for o in report["outside"]}


@pytest.mark.parametrize("max_sizes", [7, 0])
def test_sizes_wider_than_the_cap_stay_outside(max_sizes):
    report = _report(_dynamic_mlp(upper=8), cuda_graph_max_sizes=max_sizes)
    _consistent(report)
    assert report["kernels_captured"] == 0
    assert "symbolic size" in {o["reason"] for o in report["outside"]}


def test_declare_capture_vars_keeps_user_declarations_and_lower_bounds():
    from plus_tvm.passes import DeclareCaptureVars
    from plus_tvm.passes.declare_capture_vars import CAPTURE_ATTR

    mod = _dynamic_mlp(upper=40)
    assert CAPTURE_ATTR not in (DeclareCaptureVars(32)(mod)["main"].attrs or {})
    narrow = mod["main"].with_attr("tir_var_lower_bound", {"n": 20})
    got = DeclareCaptureVars(32)(tvm.IRModule({"main": narrow}))["main"].attrs[CAPTURE_ATTR]
    assert [str(v) for v in got] == ["n"]
    mine = narrow.with_attr(CAPTURE_ATTR, ["m"])
    got = DeclareCaptureVars(32)(tvm.IRModule({"main": mine}))["main"].attrs[CAPTURE_ATTR]
    assert [str(v) for v in got] == ["m", "n"]


def test_cpu_builds_have_no_cuda_graph_report():
    stats = plus_tvm.inspect("zoo:bert-base-tiny", target="llvm")
    assert "cuda_graph" not in stats
    tvm_stats = plus_tvm.inspect("zoo:bert-base-tiny", target=CUDA, pipeline="tvm")
    assert "cuda_graph" not in tvm_stats


def test_cli_inspect_prints_it_without_a_gpu(capsys):
    from plus_tvm.cli import main

    assert main(["inspect", "zoo:bert-base-tiny", "--target", "cuda", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["cuda_graph"]
    _consistent(report)
    assert main(["inspect", "zoo:bert-base-tiny", "--target", "cuda"]) == 0
    text = capsys.readouterr().out
    assert "cuda_graph     16/16 kernels in 1 region(s) (auto); outside: none; 2 staging" in text


def test_a_refused_analysis_is_reported_not_fatal(monkeypatch):
    """TVM refusing the capture rewrite (a RuntimeError / ValueError) leaves the build alone:
    the report names the failure, the text form shows it; other errors still propagate."""
    import plus_tvm.compiler as compiler
    from plus_tvm.report import stats_text

    def refuse(*_args):
        raise RuntimeError("Traceback ...\nInternalError: cannot plan storage")

    monkeypatch.setattr(compiler, "cuda_graph_report", refuse)
    stats = plus_tvm.inspect("zoo:bert-base-tiny", target=CUDA)
    assert stats["cuda_graph"] == {
        "mode": "auto",
        "error": "capture analysis failed: InternalError: cannot plan storage",
    }
    assert "capture analysis failed: InternalError" in stats_text(stats)

    def bug(*_args):
        raise KeyError("not a TVM refusal")

    monkeypatch.setattr(compiler, "cuda_graph_report", bug)
    with pytest.raises(KeyError, match="not a TVM refusal"):  # a bug is never swallowed
        plus_tvm.inspect("zoo:bert-base-tiny", target=CUDA)


def test_staged_bytes_count_a_bool_as_one_byte():
    from plus_tvm.passes._graph_staging import tensor_bytes

    assert tensor_bytes(relax.TensorType((3, 4), "bool")) == 12
    assert tensor_bytes(relax.TensorType((3, 4), "float16")) == 24


def test_stats_text_shows_schedules_declines_failures_and_inputs():
    from plus_tvm.report import stats_text

    stats = {
        "model": "m",
        "schedule": {
            "scheduled": {"GIRLLVM": 2},
            "declined_because": {"GIRLLVM": {"a contraction": 3, "no blocks": 1}},
            "failed": [{"kernel": "k", "rule": "R", "error": "ZeroDivisionError: x"}],
        },
        "options": {
            "threads": 2,
            "gir_global_gbps": 21.5,
            "gir_cache_gbps": 99.0,
            "warehouse_env": ["/w"],
        },
    }
    text = stats_text(stats)
    assert "scheduled      GIRLLVM=2" in text
    assert "declined       GIRLLVM: 3 a contraction; 1 no blocks" in text
    assert "rule failed    R on k: ZeroDivisionError: x" in text
    assert "inputs         threads=2, GIR bandwidth 21.5 / 99.0 GB/s, PLUS_TVM_WAREHOUSE=/w" in text
    # the pool launch the GIR model planned with, and plans a learned ranker moved
    stats["options"]["gir_launch_us"] = 30.0
    plans = [
        {"params": {"vector": 16}, "predicted_us": 9.0, "estimate_us": 4.0},
        {"params": {"vector": 16, "serial": True}, "predicted_us": 2.0, "estimate_us": 5.0},
    ]
    stats["schedule"]["notes"] = {
        "mean": {
            "gir_plan": {"vector": 16, "serial": True},
            "ranked_by": "learned",
            "plans": plans,
        },
        "add": {"gir_plan": {"vector": 16}, "ranked_by": "learned", "plans": plans},
    }
    text = stats_text(stats)
    assert "GIR bandwidth 21.5 / 99.0 GB/s, pool launch 30 us" in text
    assert "GIR plans      2 kernel(s) ranked by the learned model, 1 away from" in text
    assert "GIR plan       mean: {'vector': 16, 'serial': True} predicted 2 us" in text


def test_static_shape_reads_only_literal_shapes():
    from plus_tvm.passes._graph_staging import static_shape

    shape_var = relax.Var("s", relax.ShapeType(ndim=2))
    n = tvm.tirx.Var("n", "int64")
    assert static_shape(relax.TensorType([2, 3], "float32")) == (2, 3)
    assert static_shape(relax.TensorType([n, 3], "float32")) is None
    assert static_shape(relax.TensorType(ndim=2, dtype="float32")) is None
    assert static_shape(relax.TensorType(shape_var, "float32")) is None  # (raised before)
