"""CUDA-graph costs measured on a GPU (issue: calibrate once per GPU model): the fit recovers
the costs from timings, a calibration file changes the selection where it and the constants
disagree, a bad file is named with its entry, the bundle carries the calibration's libraries
and the measuring code runs (dry, on the CPU, with TVM's runtime library alone)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import plus_tvm
import pytest
import tvm
from plus_tvm import Options
from plus_tvm.costmodel import graph_cost
from plus_tvm.costmodel.graph_cost import GraphCost, GraphCostError
from plus_tvm.errors import OptionsError
from plus_tvm.gpu import calibrate_graph, calibration_libs
from tvm import relax

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUDA = {"kind": "cuda", "arch": "sm_90"}
TRUE = {  # the figures the synthetic timings are made from
    "kernel_launch_us": 4.2,
    "library_call_us": 13.5,
    "graph_launch_us": 7.3,
    "node_us": 0.6,
    "copy_bytes_per_us": 2.5e6,
}
VM_CALL_US = 9.0  # what every VM call costs besides its launches (the fits' intercept)


def _counts() -> dict:
    """The counts calibration_libs records for its chains (the graph build leaves the first and
    last kernel of a chain outside its region)."""
    plain, graph = {}, {}
    for n in calibration_libs.KERNEL_CHAINS:
        plain[f"kernels_{n}"] = {"kernels_outside": n, "library_outside": 0, "regions": 0}
        graph[f"kernels_{n}"] = {"kernels_outside": 2, "library_outside": 0, "regions": 1}
        plain[f"kernels_{n}"]["region_nodes"] = 0
        graph[f"kernels_{n}"]["region_nodes"] = n - 2
    for n in calibration_libs.LIBRARY_CHAINS:
        plain[f"library_{n}"] = {
            "kernels_outside": 0,
            "library_outside": n,
            "regions": 0,
            "region_nodes": 0,
        }
    return {"plain": plain, "graph": graph}


def _timings(noise: float = 0.0, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    counts = _counts()

    def jitter(us: float) -> float:
        return us * (1.0 + noise * rng.uniform(-1, 1))

    t = TRUE
    plain = {}
    for name, c in counts["plain"].items():
        us = VM_CALL_US + c["kernels_outside"] * t["kernel_launch_us"]
        plain[name] = jitter(us + c["library_outside"] * t["library_call_us"])
    graph = {
        name: jitter(
            VM_CALL_US
            + c["kernels_outside"] * t["kernel_launch_us"]
            + t["graph_launch_us"]
            + c["region_nodes"] * t["node_us"]
        )
        for name, c in counts["graph"].items()
    }
    sizes = [mib * 2**20 for mib in calibrate_graph.COPY_MIB]
    copy = [[n, jitter(3.0 + n / t["copy_bytes_per_us"])] for n in sizes]
    return {"plain": plain, "graph": graph, "copy": copy}


def test_fit_recovers_the_costs_from_timings():
    fitted = calibrate_graph.costs_from_timings(_timings(), _counts())
    assert fitted["problems"] == []
    assert fitted["figures"] == pytest.approx(TRUE, rel=1e-9)
    assert fitted["fits"]["kernels"]["intercept"] == pytest.approx(VM_CALL_US)


def test_fit_with_noise_stays_close():
    fitted = calibrate_graph.costs_from_timings(_timings(noise=0.01, seed=3), _counts())
    assert fitted["problems"] == []
    figures = fitted["figures"]
    for key in ("kernel_launch_us", "library_call_us", "copy_bytes_per_us"):
        assert figures[key] == pytest.approx(TRUE[key], rel=0.05), key
    # the graph launch is a difference of intercepts: absolute error within the noise
    assert abs(figures["graph_launch_us"] - TRUE["graph_launch_us"]) < 2.0
    assert abs(figures["node_us"] - TRUE["node_us"]) < 0.1


def test_fit_names_what_it_cannot_give():
    timings = _timings()
    timings["copy"] = [[n, 50.0] for n, _ in timings["copy"]]  # flat: no bandwidth
    timings["graph"] = {k: 1.0 for k in timings["graph"]}  # cheaper than the plain VM call
    fitted = calibrate_graph.costs_from_timings(timings, _counts())
    assert "copy_bytes_per_us" not in fitted["figures"]
    assert "graph_launch_us" not in fitted["figures"]
    assert any(p.startswith("copy:") for p in fitted["problems"])
    assert any(p.startswith("graph_launch_us: non-positive") for p in fitted["problems"])
    assert fitted["figures"]["kernel_launch_us"] == pytest.approx(TRUE["kernel_launch_us"])
    with pytest.raises(calibrate_graph.CalibrationError, match="two different x"):
        calibrate_graph.fit_line([4, 4], [1.0, 2.0])


def _calibration(path, gpus: dict) -> str:
    with open(path, "w") as f:
        json.dump({"format": graph_cost.FORMAT, "gpus": gpus}, f)
    return str(path)


def _entry(arch: str = "sm_90", date: str = "2026-11-30", **figures) -> dict:
    return {"arch": arch, "date": date, **TRUE, **figures}


def _mlp() -> tvm.IRModule:
    """Two library GEMMs and one fused kernel: one region of 3 captured calls, 2 staging copies
    (the constants keep it: saving 20.7 us against 10 us of copies)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 256), "float32"))
    w1 = relax.Var("w1", relax.TensorType((256, 256), "float32"))
    w2 = relax.Var("w2", relax.TensorType((256, 64), "float32"))
    with bb.function("main", [x, w1, w2], attrs={"num_input": 1}):
        with bb.dataflow():
            h = bb.emit(relax.op.nn.relu(relax.op.matmul(x, w1)))
            h = bb.emit(relax.op.tanh(relax.op.matmul(h, w2)))
            out = bb.emit_output(relax.op.sigmoid(relax.op.exp(h)))
        bb.emit_func_output(out)
    return bb.get()


def _matmul() -> tvm.IRModule:
    """One library GEMM: a replay saves one library crossing, against a graph launch and two
    staging copies (the constants drop it: 3.9 us saved against 10 us of copies)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 256), "float32"))
    w = relax.Var("w", relax.TensorType((256, 256), "float32"))
    with bb.function("main", [x, w], attrs={"num_input": 1}):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(x, w))
        bb.emit_func_output(out)
    return bb.get()


def _selection(mod: tvm.IRModule, target: dict = CUDA, **options) -> dict:
    stats = plus_tvm.inspect(mod, target=target, options=Options(**options))
    return stats["cuda_graph"]["selection"] | {"options": stats["options"]}


def test_a_calibration_with_expensive_graphs_drops_what_the_constants_keep(tmp_path):
    constants = _selection(_mlp())
    assert constants["costs"]["source"] == "constants" and constants["costs"]["gpu"] is None
    assert constants["plain"] is False and [r["kept"] for r in constants["regions"]] == [True]
    path = _calibration(tmp_path / "costs.json", {"NVIDIA H200": _entry(graph_launch_us=60.0)})
    calibrated = _selection(_mlp(), cuda_graph_costs_file=path)
    assert calibrated["options"]["cuda_graph_costs"] == "NVIDIA H200"  # resolved by sm_90
    costs = calibrated["costs"]
    assert costs["source"] == "calibration" and costs["gpu"] == "NVIDIA H200"
    assert costs["file"] == path and costs["graph_launch_us"] == 60.0
    assert calibrated["plain"] is True and [r["kept"] for r in calibrated["regions"]] == [False]
    # explicitly the constants: the file is not used
    again = _selection(_mlp(), cuda_graph_costs_file=path, cuda_graph_costs="constants")
    assert again["costs"]["source"] == "constants" and again["plain"] is False


def test_a_calibration_with_costly_library_calls_keeps_what_the_constants_drop(tmp_path):
    assert _selection(_matmul())["plain"] is True
    entry = _entry(library_call_us=40.0, kernel_launch_us=3.0, graph_launch_us=5.0)
    path = _calibration(tmp_path / "costs.json", {"NVIDIA H100 80GB HBM3": entry})
    kept = _selection(_matmul(), cuda_graph_costs_file=path)
    assert kept["costs"]["gpu"] == "NVIDIA H100 80GB HBM3"
    assert kept["plain"] is False and [r["kept"] for r in kept["regions"]] == [True]


def test_which_entry_a_target_gets(tmp_path):
    entries = {
        "NVIDIA H100 80GB HBM3": _entry(date="2026-11-20"),
        "NVIDIA H200": _entry(date="2026-11-30"),
        "NVIDIA A100-SXM4-80GB": _entry(arch="sm_80"),
    }
    path = _calibration(tmp_path / "costs.json", entries)
    read = graph_cost.read_calibrations(path)

    def resolve(target: dict, choice: str = "auto") -> str:
        return graph_cost.resolve_graph_costs(tvm.target.Target(target), choice, path)

    assert resolve(CUDA) == "NVIDIA H200"  # two sm_90 GPUs: the newest calibration
    assert resolve({**CUDA, "model": "h100"}) == "NVIDIA H100 80GB HBM3"
    assert resolve({"kind": "cuda", "arch": "sm_80"}) == "NVIDIA A100-SXM4-80GB"
    assert resolve({"kind": "cuda", "arch": "sm_89"}) == "constants"  # none for it
    assert resolve({**CUDA, "model": "a100"}) == "constants"  # an A100 is not sm_90
    assert resolve(CUDA, "NVIDIA H100 80GB HBM3") == "NVIDIA H100 80GB HBM3"
    with pytest.raises(GraphCostError, match=r"costs\.json: no CUDA-graph calibration for GPU"):
        resolve(CUDA, "NVIDIA B200")
    with pytest.raises(GraphCostError, match=r"'NVIDIA B200' \(calibrated: \['NVIDIA A100"):
        _selection(_matmul(), cuda_graph_costs_file=path, cuda_graph_costs="NVIDIA B200")
    cost = graph_cost.graph_cost("NVIDIA H200", path)
    assert cost == GraphCost.from_entry("NVIDIA H200", read["NVIDIA H200"], path)
    assert cost.region_saving_us(10, 2) == pytest.approx(10 * 4.2 + 2 * 13.5 - 7.3 - 12 * 0.6)
    # without cuda_graph=auto nothing is read (the file named does not exist)
    from plus_tvm.compile_inputs import resolve_inputs

    unused = Options(cuda_graph="always", cuda_graph_costs_file=str(tmp_path / "none.json"))
    assert resolve_inputs(tvm.target.Target(CUDA), unused).cuda_graph_costs == "auto"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", r"bad\.json: not a JSON CUDA-graph calibration"),
        ('{"format": "other", "gpus": {}}', r"bad\.json: not a CUDA-graph calibration of format"),
        (
            {"NVIDIA H200": {**_entry(), "node_us": "fast"}},
            r"bad\.json: entry 'NVIDIA H200': node_us must be a number, got 'fast'",
        ),
        (
            {"NVIDIA H200": {k: v for k, v in _entry().items() if k != "graph_launch_us"}},
            r"bad\.json: entry 'NVIDIA H200': missing 'graph_launch_us'",
        ),
        (
            {"NVIDIA H200": _entry(kernel_launch_us=-1.0)},
            r"entry 'NVIDIA H200': kernel_launch_us must be a finite positive number, got -1",
        ),
        ({"NVIDIA H200": _entry(arch="hopper")}, r"entry 'NVIDIA H200': arch must be"),
        ({"NVIDIA H200": _entry(date="yesterday")}, r"entry 'NVIDIA H200': date must be"),
        ({"NVIDIA H200": [1, 2]}, r"entry 'NVIDIA H200': must be an object"),
    ],
)
def test_a_malformed_file_is_named_with_its_entry(tmp_path, content, message):
    path = tmp_path / "bad.json"
    if isinstance(content, str):
        path.write_text(content)
    else:
        _calibration(path, content)
    with pytest.raises(GraphCostError, match=message):
        graph_cost.read_calibrations(str(path))
    # and a compile that names the file fails with it, before any work
    with pytest.raises(GraphCostError, match=message):
        plus_tvm.inspect(_matmul(), target=CUDA, options=Options(cuda_graph_costs_file=str(path)))


def test_options_and_the_shipped_file():
    assert isinstance(graph_cost.read_calibrations(), dict)  # the package's data file is valid
    assert Options().cuda_graph_costs == "auto" and Options().cuda_graph_costs_file is None
    assert Options(cuda_graph_costs="constants").digest() != Options().digest()
    with pytest.raises(OptionsError, match="cuda_graph_costs must be"):
        Options(cuda_graph_costs="")
    with pytest.raises(OptionsError, match="cuda_graph_costs_file must be a path"):
        Options(cuda_graph_costs_file=3)
    opts = Options.from_pairs(["cuda_graph_costs=NVIDIA H200", "cuda_graph_costs_file=/x.json"])
    assert opts.cuda_graph_costs == "NVIDIA H200" and opts.cuda_graph_costs_file == "/x.json"
    # the GPU side's copies of the format and figures (it cannot import costmodel)
    assert calibrate_graph.FORMAT == graph_cost.FORMAT
    assert (
        calibrate_graph.FIGURES
        == graph_cost.FIGURES
        == tuple(f for f in GraphCost.__dataclass_fields__ if f.endswith(("_us", "_per_us")))
    )


def test_add_merges_a_gpu_run_into_the_data_file(tmp_path):
    data = _calibration(tmp_path / "data.json", {"NVIDIA H100 80GB HBM3": _entry()})
    run = _calibration(tmp_path / "run.json", {"NVIDIA H200": _entry(graph_launch_us=9.5)})
    assert calibrate_graph.main(["add", run, "--into", data]) == 0
    merged = graph_cost.read_calibrations(data)
    assert sorted(merged) == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    assert merged["NVIDIA H200"]["graph_launch_us"] == 9.5
    dry = tmp_path / "dry.json"
    dry.write_text(json.dumps({"format": graph_cost.FORMAT, "dry": True, "gpus": {}}))
    assert calibrate_graph.main(["add", str(dry), "--into", data]) == 2  # refused, named
    with pytest.raises(GraphCostError, match=r"dry\.json: a dry run's output"):
        graph_cost.read_calibrations(str(dry))
    assert sorted(graph_cost.read_calibrations(data)) == sorted(merged)  # unchanged


def test_the_bundle_carries_the_calibration(tmp_path, monkeypatch):
    from plus_tvm.gpu import bundle

    # the runtime's packing (pip downloads) and the libraries' CUDA code generation are
    # test_gpu_bundle's (its bundle carries them): here, that the builder writes them
    built = []

    def build(folder: str, target: dict) -> None:
        built.append((folder, target))
        os.makedirs(folder)

    monkeypatch.setattr(bundle, "_pack_runtime", lambda folder: os.makedirs(folder))
    monkeypatch.setattr(calibration_libs, "build_calibration", build)
    out = str(tmp_path / "bundle")
    manifest = bundle.build_bundle(out, [], ["plus-off"], log=lambda m: None, isolate=False)
    assert built == [(os.path.join(out, "calibration"), CUDA)]
    assert manifest["calibration"] == "calibration"
    runner = open(os.path.join(out, "run.sh")).read()
    assert '"--calibrate" ]' in runner
    assert 'calibrate_graph run --libs "$here/calibration"' in runner


def test_the_graph_library_captures_each_chain_between_its_ends(tmp_path):
    """The CUDA libraries and the counts the fit needs, read off their lowered IR: without
    graphs every kernel launches from the host; with them a chain's first (it reads the input)
    and last (it writes the returned tensor) do, the rest replay as one region."""
    folder = str(tmp_path / "calibration")
    libs = calibration_libs.build_calibration(folder, CUDA)
    assert sorted(os.listdir(folder)) == ["calibration.json", "graph.so", "plain.so"]
    assert json.load(open(os.path.join(folder, calibrate_graph.MANIFEST))) == libs
    assert libs["target"] == CUDA
    assert {v: r["cuda_graph"] for v, r in libs["libraries"].items()} == {
        "plain": "off",
        "graph": "always",
    }
    plain, graph = (libs["libraries"][v]["functions"] for v in ("plain", "graph"))
    for n in calibration_libs.KERNEL_CHAINS:
        assert plain[f"kernels_{n}"] == {
            "kernels_outside": n,
            "library_outside": 0,
            "regions": 0,
            "region_nodes": 0,
        }
        assert graph[f"kernels_{n}"] == {
            "kernels_outside": 2,
            "library_outside": 0,
            "regions": 1,
            "region_nodes": n - 2,
        }
    for n in calibration_libs.LIBRARY_CHAINS:
        assert plain[f"library_{n}"]["library_outside"] == n
    assert set(plain) == set(graph)  # (the regions' own functions are not chains)


def test_dry_run_measures_on_the_cpu_with_the_runtime_alone(tmp_path):
    """The GPU side's code end to end on llvm libraries, in a process whose TVM has no compiler
    library (as on the GPU machine): chains timed, counts read, a dry file that no compile
    takes for a calibration."""
    libs = str(tmp_path / "libs")
    calibration_libs.build_calibration(libs, "llvm")
    assert sorted(os.listdir(libs)) == ["calibration.json", "plain.so"]
    out = str(tmp_path / "out")
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1", PYTHONPATH=os.path.join(REPO, "python"))
    cmd = [sys.executable, "-m", "plus_tvm.gpu.calibrate_graph", "run", "--libs", libs]
    proc = subprocess.run(
        [*cmd, "--out", out, "--device", "cpu", "--calls", "20"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.load(open(os.path.join(out, calibrate_graph.OUTPUT)))
    assert result["dry"] is True and result["gpus"] == {}
    measured = result["entry"]["measured"]
    names = {f"kernels_{n}" for n in calibration_libs.KERNEL_CHAINS}
    names |= {f"library_{n}" for n in calibration_libs.LIBRARY_CHAINS}
    assert set(measured["timings"]["plain"]) == names
    assert all(us > 0 for us in measured["timings"]["plain"].values())
    assert [n for n, _ in measured["timings"]["copy"]] == [
        m * 2**20 for m in calibrate_graph.DRY_COPY_MIB
    ]
    assert not [e for e in measured["errors"] if not e.startswith("fit:")], measured["errors"]
    assert "kernels" in measured["fits"] and "library" in measured["fits"]
    with pytest.raises(GraphCostError, match="dry run"):
        graph_cost.read_calibrations(os.path.join(out, calibrate_graph.OUTPUT))


def test_the_check_runs_the_calibration_first_and_says_why_not(tmp_path):
    from plus_tvm.gpu.check import calibrate_first

    assert "skipped" in calibrate_first(str(tmp_path), str(tmp_path / "out"))  # an old bundle
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the calibration runs for real there")
    (tmp_path / "calibration").mkdir()
    result = calibrate_first(str(tmp_path), str(tmp_path / "out"))
    assert result["returncode"] == 2 and "no CUDA GPU" in result["stderr"]


@pytest.mark.gpu
def test_calibration_on_this_gpu(tmp_path):
    """On a GPU with TVM's compiler: the chains built for it, measured, and the file taken by a
    compile for this GPU's architecture."""
    import torch

    libs = str(tmp_path / "libs")
    calibration_libs.build_calibration(libs, "cuda")
    result = calibrate_graph.calibrate(libs, str(tmp_path / "out"))
    name = torch.cuda.get_device_name(0)
    assert list(result["gpus"]) == [name], result.get("incomplete")
    path = os.path.join(str(tmp_path / "out"), calibrate_graph.OUTPUT)
    entry = graph_cost.read_calibrations(path)[name]
    assert entry["graph_launch_us"] > 0 and entry["kernel_launch_us"] > 0
    selection = _selection(_mlp(), target="cuda", cuda_graph_costs_file=path)
    assert selection["costs"]["gpu"] == name
