"""The plus pipeline: phases, use from TVM's entry points, fusion, immutability, IR dumps, CUDA."""

# TVMScript: the I/R/T aliases and functions inside @I.ir_module classes are its convention.
# ruff: noqa: N805, N812

from __future__ import annotations

import json
import os

import numpy as np
import plus_tvm
import pytest
import tvm
from plus_tvm import Options
from plus_tvm.passes import ApplyScheduleRules
from plus_tvm.pipeline import PHASE_NAMES, PHASES, phase_passes
from plus_tvm.target import host_target
from plus_tvm.tvm_default import tvm_pipeline
from tvm import relax
from tvm.s_tir import dlight as dl
from tvm.script import ir as I
from tvm.script import relax as R

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90"}, host=host_target())


@I.ir_module
class AddReluMul:
    @R.function
    def main(x: R.Tensor((4, 8), "float32"), y: R.Tensor((4, 8), "float32")) -> R.Tensor(
        (4, 8), "float32"
    ):
        with R.dataflow():
            a = R.add(x, y)
            b = R.nn.relu(a)
            c = R.multiply(b, y)
            R.output(c)
        return c


@I.ir_module
class TwoLayer:
    """matmul + bias + relu, a reshape and a row sum: several kernels, a view, a reduction."""

    @R.function
    def main(
        x: R.Tensor((2, 8), "float32"),
        w: R.Tensor((8, 6), "float32"),
        b: R.Tensor((6,), "float32"),
    ) -> R.Tuple(R.Tensor((2, 6), "float32"), R.Tensor((3,), "float32")):
        with R.dataflow():
            h = R.matmul(x, w)
            h1 = R.add(h, b)
            h2 = R.nn.relu(h1)
            r = R.reshape(h2, (3, 4))
            s = R.sum(r, axis=[1])
            out = (h2, s)
            R.output(out)
        return out


def _inputs(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "x": rng.standard_normal((2, 8)).astype("float32"),
        "w": rng.standard_normal((8, 6)).astype("float32"),
        "b": rng.standard_normal((6,)).astype("float32"),
    }


def _reference(x, w, b):
    h = np.maximum(x @ w + b, 0)
    return h, h.reshape(3, 4).sum(axis=1)


def _run(executable, *arrays):
    vm = relax.VirtualMachine(executable, tvm.cpu())
    out = vm["main"](*(tvm.runtime.tensor(a) for a in arrays))
    return [o.numpy() for o in out] if not hasattr(out, "numpy") else out.numpy()


def _pass_names(passes) -> list[str]:
    return [p.info.name for p in passes]


# --------------------------------------------------------------------------------- the phases
def test_six_phases_in_order():
    assert PHASE_NAMES == ("dispatch", "legalize", "fuse", "schedule", "lower", "finalize")
    assert tuple(name for name, _ in PHASES) == PHASE_NAMES
    phases = phase_passes(host_target(), Options())
    assert _pass_names(phases) == [f"plus.{n}" for n in PHASE_NAMES]
    assert all(isinstance(p, tvm.transform.Sequential) for p in phases)


def test_phase_subset_and_unknown_phase():
    assert _pass_names(phase_passes(host_target(), Options(), ("fuse", "legalize"))) == [
        "plus.legalize",
        "plus.fuse",
    ]  # pipeline order, whatever order was asked
    with pytest.raises(ValueError, match="optimize"):
        phase_passes(host_target(), Options(), ("optimize",))


def test_phase_contents_follow_target_and_options():
    phases = dict(PHASES)
    llvm = host_target()
    assert _pass_names(phases["legalize"](llvm, Options())) == [
        "LegalizeOps",
        "AnnotateTIROpPattern",
        "AnnotateMapPattern",
        "FoldConstant",
    ]
    assert "FoldConstant" not in _pass_names(
        phases["legalize"](llvm, Options(fold_constants=False))
    )
    assert _pass_names(phases["fuse"](llvm, Options())) == ["DPFuseOps", "FuseTIR"]
    assert _pass_names(phases["fuse"](llvm, Options(fusion="tvm"))) == ["FuseOps", "FuseTIR"]
    # integer powers as products, GIR, max / min starting from -inf / +inf (on the CPU), then
    # NaN-propagating max / min
    schedule = [
        "ExpandIntegerPower",
        "ApplyScheduleRules",
        "InfiniteExtremeIdentity",
        "PropagateNaN",
    ]
    assert _pass_names(phases["schedule"](llvm, Options())) == schedule
    assert _pass_names(phases["schedule"](llvm, Options(gir=False))) == [
        "ExpandIntegerPower",
        "InfiniteExtremeIdentity",
        "PropagateNaN",
    ]
    assert _pass_names(phases["schedule"](llvm, Options(gir=False, propagate_nan=False))) == [
        "ExpandIntegerPower",
        "InfiniteExtremeIdentity",
    ]
    # on a GPU, blocks the rules left on the host are bound before PropagateNaN
    assert _pass_names(phases["schedule"](CUDA, Options())) == [
        "ExpandIntegerPower",
        "ApplyScheduleRules",
        "BindUnboundGPUBlocks",
        "PropagateNaN",
    ]
    assert "RewriteCUDAGraph" not in _pass_names(phases["finalize"](llvm, Options()))
    # capture (with its staging) only on CUDA and where the options ask for graphs
    assert "RewriteCUDAGraph" not in _pass_names(
        phases["finalize"](CUDA, Options(cuda_graph="off"))
    )
    assert _pass_names(phases["finalize"](CUDA, Options(cuda_graph="always")))[:7] == [
        "DeclareCaptureVars",
        "StageGraphInputs",
        "StageGraphOutputs",
        "RewriteViewBuiltins",
        "StaticPlanBlockMemory",
        "RewriteCUDAGraph",
        "RouteCUDAGraphRuntime",
    ]
    # auto (the default): the capture passes run inside the selection
    auto = phases["finalize"](CUDA, Options())
    assert _pass_names(auto)[:2] == ["SelectCUDAGraphRegions", "RouteCUDAGraphRuntime"]
    assert _pass_names(auto[0].capture)[-1] == "RewriteCUDAGraph"
    assert _pass_names(phases["finalize"](llvm, Options()))[0] == "StaticPlanBlockMemory"


# ------------------------------------------------------------------------ TVM's entry points
def test_pipeline_inside_a_user_sequential():
    rng = np.random.default_rng(0)
    args = _inputs(rng)
    tgt = host_target()
    lowered = tvm.transform.Sequential([plus_tvm.pipeline(tgt)])(TwoLayer)
    # The pipeline lowered everything to VM form: only VM builtins are left as operators.
    ops = plus_tvm.stats.op_histogram(lowered)
    assert ops and all(k.startswith(("relax.vm.", "relax.null_value")) for k in ops), ops
    ex = tvm.compile(lowered, tgt, relax_pipeline=None)
    got = _run(ex, args["x"], args["w"], args["b"])
    for g, e in zip(got, _reference(**args)):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("how", ["pass", "get_pipeline", "name"])
def test_tvm_compile_with_plus_pipeline(how):
    rng = np.random.default_rng(1)
    args = _inputs(rng)
    relax_pipeline = {
        "pass": plus_tvm.pipeline(),
        "get_pipeline": relax.get_pipeline("plus"),
        "name": "plus",
    }[how]
    ex = tvm.compile(TwoLayer, host_target(), relax_pipeline=relax_pipeline)
    got = _run(ex, args["x"], args["w"], args["b"])
    for g, e in zip(got, _reference(**args)):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


def test_get_pipeline_passes_options():
    with pytest.raises(plus_tvm.OptionsError):
        relax.get_pipeline("plus", options=Options(fusion="magic"))
    p = relax.get_pipeline("plus", target="llvm", options=Options(fold_constants=False))
    assert isinstance(p, tvm.transform.Pass)


def test_fuse_phase_fuses_elementwise_chain():
    stats = plus_tvm.inspect(AddReluMul)
    assert stats["ops"] == 3
    assert stats["kernels"] == 1
    assert stats["fusion_ratio"] == 3.0
    assert [g["ops"] for g in stats["groups"]] == [["add", "relu", "multiply"]]


def test_without_fuse_phase_every_op_is_a_kernel():
    # The same chain through legalize alone: three kernels, so the 1 above is fusion's doing.
    with host_target():
        mod = tvm.transform.Sequential(phase_passes(host_target(), Options(), ("legalize",)))(
            AddReluMul
        )
    assert plus_tvm.stats.kernel_stats(mod)["kernels"] == 3


def test_pipeline_does_not_mutate_its_input(deep_copy):
    before = deep_copy(TwoLayer)
    plus_tvm.pipeline("llvm")(TwoLayer)
    tvm.ir.assert_structural_equal(TwoLayer, before)
    before = deep_copy(AddReluMul)
    tvm.compile(AddReluMul, CUDA, relax_pipeline=plus_tvm.pipeline())
    tvm.ir.assert_structural_equal(AddReluMul, before)


# ------------------------------------------------------------------------------- IR dumps
def _dumped(folder) -> list[str]:
    return sorted(os.listdir(folder))


def test_dump_ir_from_pipeline_one_file_per_phase(tmp_path):
    folder = tmp_path / "ir"
    plus_tvm.pipeline("llvm", Options(dump_ir=str(folder)))(AddReluMul)
    assert _dumped(folder) == [f"{i:02d}_{n}.py" for i, n in enumerate(PHASE_NAMES, 1)]
    fused = (folder / "03_fuse.py").read_text()
    assert "fused_add_relu_multiply" in fused
    assert "R.nn.relu" in (folder / "01_dispatch.py").read_text()  # before legalization
    assert "R.nn.relu" not in (folder / "02_legalize.py").read_text()


def test_dump_ir_from_compile_one_file_per_phase(tmp_path):
    folder = tmp_path / "ir"
    plus_tvm.compile(AddReluMul, "llvm", options=Options(dump_ir=str(folder)))
    files = _dumped(folder)
    assert len(files) == len(PHASE_NAMES)
    assert sorted(f[3:-3] for f in files) == sorted(PHASE_NAMES)


def test_dump_ir_from_compile_numbered_in_pipeline_order(tmp_path):
    folder = tmp_path / "ir"
    plus_tvm.compile(AddReluMul, "llvm", options=Options(dump_ir=str(folder)))
    assert _dumped(folder) == [f"{i:02d}_{n}.py" for i, n in enumerate(PHASE_NAMES, 1)]


# ------------------------------------------------------------------------- CUDA code generation
def _module_of_kind(mod, kind: str):
    if mod.kind == kind:
        return mod
    for sub in mod.imports:
        found = _module_of_kind(sub, kind)
        if found is not None:
            return found
    return None


def test_cuda_codegen_without_a_gpu():
    # The target comes from tvm.compile's context: pipeline() is given none.
    ex = tvm.compile(AddReluMul, CUDA, relax_pipeline=relax.get_pipeline("plus"))
    cuda = _module_of_kind(ex.mod, "cuda")
    assert cuda is not None, "no CUDA module in the executable"
    src = cuda.inspect_source()
    kernels = [line for line in src.splitlines() if "__global__" in line and "{" in line]
    assert len(kernels) == 1 and "fused_add_relu_multiply" in kernels[0]
    assert "threadIdx.x" in src


def test_cuda_codegen_scheduled_reduction():
    ex = tvm.compile(TwoLayer, CUDA, relax_pipeline=plus_tvm.pipeline("cuda"))
    src = _module_of_kind(ex.mod, "cuda").inspect_source()
    assert src.count("__global__") >= 2
    assert "blockIdx.x" in src and "threadIdx.x" in src


# ------------------------------------------------------------------------ ApplyScheduleRules
def _legalized(mod: tvm.IRModule) -> tvm.IRModule:
    with CUDA:
        return tvm.transform.Sequential(phase_passes(CUDA, Options(), ("legalize", "fuse")))(mod)


def _prim_funcs(mod: tvm.IRModule) -> dict[str, tvm.tirx.PrimFunc]:
    return {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}


def test_apply_schedule_rules_without_rules_is_a_no_op():
    mod = _legalized(TwoLayer)
    with CUDA:
        out = ApplyScheduleRules()(mod)
    tvm.ir.assert_structural_equal(out, mod)


def test_apply_schedule_rules_schedules_a_copy(deep_copy):
    mod = _legalized(TwoLayer)
    before = deep_copy(mod)
    with CUDA:
        out = ApplyScheduleRules(dl.gpu.Reduction(), dl.gpu.Fallback())(mod)
    tvm.ir.assert_structural_equal(mod, before)  # input untouched
    funcs = _prim_funcs(out)
    assert funcs and all(f.attrs["tirx.is_scheduled"] for f in funcs.values())
    assert all("threadIdx" in f.script() for f in funcs.values())
    assert not any("threadIdx" in f.script() for f in _prim_funcs(mod).values())


def test_apply_schedule_rules_first_match_wins_and_declines():
    mod = _legalized(AddReluMul)
    with CUDA:
        # Reduction declines an elementwise kernel: nothing is scheduled, the functions are
        # returned as they are, and the report says so.
        declined = ApplyScheduleRules(dl.gpu.Reduction())(mod)
        for gvar, func in mod.functions_items():
            tvm.ir.assert_structural_equal(declined[gvar.name_hint], func)
        report = json.loads(str(declined.attrs["plus.schedule"]))
        assert report == {
            "declined": {},
            "declined_because": {},  # dlight's rules give no reason
            "failed": [],
            "scheduled": {},
            "unscheduled": 1,
        }
        scheduled = ApplyScheduleRules(dl.gpu.Reduction(), dl.gpu.Fallback())(mod)
        # Already scheduled functions are left alone on a second run.
        again = ApplyScheduleRules(dl.gpu.Fallback())(scheduled)
    for gvar, func in scheduled.functions_items():
        tvm.ir.assert_structural_equal(again[gvar.name_hint], func)
    (func,) = _prim_funcs(scheduled).values()
    assert func.attrs["tirx.is_scheduled"]
    assert "threadIdx" in func.script()


def test_apply_schedule_rules_needs_a_target():
    mod = _legalized(AddReluMul)
    with pytest.raises(Exception, match="needs a target"):
        ApplyScheduleRules(dl.gpu.Fallback())(mod)


# ------------------------------------------------------------------- the tests' own safety net
def test_strict_pass_context_is_active_and_catches_mutation():
    ctx = tvm.transform.PassContext.current()
    assert bool(ctx.config["testing.immutable_module"])
    assert "WellFormedInstrument" in [i.name for i in ctx.instruments]

    @tvm.transform.module_pass(opt_level=0, name="MutatesInput")
    def mutates(mod, _ctx):
        gv = mod.get_global_var("main")
        mod.update_func(gv, mod[gv].with_attr("touched", True))
        return mod

    mod = tvm.IRModule(dict(AddReluMul.functions_items()))
    with pytest.raises(Exception, match="Immutable module has been modified in pass: MutatesInput"):
        mutates(mod)


def test_strict_pass_context_catches_ill_formed_output():
    @tvm.transform.module_pass(opt_level=0, name="BreaksWellFormedness")
    def breaks(mod, _ctx):
        x = relax.Var("x", relax.TensorType((4,), "float32"))
        free = relax.Var("free", relax.TensorType((4,), "float32"))  # bound nowhere
        return tvm.IRModule({"main": relax.Function([x], free, ret_ty=free.ty)})

    breaks_it = tvm.IRModule(dict(AddReluMul.functions_items()))
    with pytest.raises(AssertionError):  # raised by WellFormedInstrument.run_after_pass
        breaks(breaks_it)


def test_strict_pass_context_exempts_tvm_in_place_passes_only_inside_tvm():
    # dlight's ApplyDefaultSchedule writes into its input (the reason ApplyScheduleRules exists).
    # conftest lets TVM's own CUDA pipeline use it, but a use from our code is still caught.
    mod = _legalized(AddReluMul)
    with CUDA, pytest.raises(Exception, match="modified in pass: ApplyDefaultSchedule"):
        dl.ApplyDefaultSchedule(dl.gpu.Fallback())(mod)


def test_tvm_baseline_pipeline_on_cuda():
    plus = plus_tvm.inspect(TwoLayer, "cuda")
    baseline = plus_tvm.inspect(TwoLayer, "cuda", pipeline="tvm")
    assert plus["target"] == baseline["target"] and plus["target"].startswith("cuda sm_")
    assert plus["kernels"] == 2  # matmul+add+relu fused; the reshape is a view; the sum
    assert baseline["kernels"] == plus["kernels"]
    ex = tvm.compile(TwoLayer, CUDA, relax_pipeline=tvm_pipeline(CUDA))
    assert "__global__" in _module_of_kind(ex.mod, "cuda").inspect_source()


@pytest.mark.gpu
@pytest.mark.parametrize("cuda_graph", ["off", "always", "auto"])
def test_runs_on_gpu(cuda_graph):
    args = _inputs(np.random.default_rng(2))
    compiled = plus_tvm.compile((TwoLayer, {}), "cuda", options=Options(cuda_graph=cuda_graph))
    for _ in range(2):  # with CUDA graphs the second call replays the captured graph
        got = compiled(args["x"], args["w"], args["b"])
        for g, e in zip(got, _reference(**args)):
            np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4)


class _Crashing:
    """A schedule rule with a bug that is not one of TVM's error kinds."""

    def apply(self, func, target, tunable):  # noqa: ANN001, ANN201
        del func, target, tunable
        return 1 // 0


def test_a_crashing_rule_is_reported_and_the_next_rule_schedules():
    mod = _legalized(AddReluMul)
    with CUDA, pytest.warns(RuntimeWarning, match="_Crashing failed on kernel"):
        out = ApplyScheduleRules(_Crashing(), dl.gpu.Fallback())(mod)
    report = json.loads(str(out.attrs["plus.schedule"]))
    assert [f["rule"] for f in report["failed"]] == ["_Crashing"]
    assert "ZeroDivisionError" in report["failed"][0]["error"]
    assert report["scheduled"] == {"Fallback": 1} and report["unscheduled"] == 0


def test_a_norm_feeding_three_projections_is_one_output_and_gir_scheduled():
    """T5 / LLaMA: the Q, K and V linears each flatten the same normalized activation. Three
    identical reshapes made the RMSNorm kernel write three outputs, which GIR's normalization
    could not inline (the kernel ran unscheduled: 0.67 ms of T5-base's 26 ms); one binding per
    distinct value (EliminateCommonSubexpr after dispatch) leaves one output."""
    stats = plus_tvm.inspect("zoo:t5-encoder-tiny")
    names = stats["kernel_names"]
    assert not any("reshape_reshape" in name for name in names), names
    declined = stats["schedule"]["declined_because"].get("GIRLLVM", {})
    assert "not a schedulable function" not in declined
    norms = [n for n in names if "rsqrt" in n]
    assert norms and stats["schedule"]["scheduled"]["GIRLLVM"] >= len(norms)
