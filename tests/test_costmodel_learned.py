"""The learned cost model (issue 15): features read off the shared TIR analysis, training and
held-out scoring, the model file and its errors, ``plus-tvm calibrate``, and the dispatch
decisions it prices (a model that says "TIR is cheaper" must turn every library call into TIR,
and the compiled model must stay exact either way)."""

from __future__ import annotations

import json
import math
import os
import shutil
from collections import Counter

import numpy as np
import pytest
import torch
import tvm
from plus_tvm import Options, cli
from plus_tvm import compile as plus_compile
from plus_tvm.costmodel.features import (
    LIBRARY_FEATURES,
    REDUCTIONS,
    TIR_FEATURES,
    choice_features,
    library_features,
    tir_features,
)
from plus_tvm.costmodel.learned import CostModelError, LearnedCostModel, shipped_path
from plus_tvm.costmodel.train import decision_accuracy, score, split_groups, train
from plus_tvm.errors import PlusError
from small_models import SmallNet
from tvm.script import tirx as T  # noqa: N812


def log(x: float) -> float:
    return math.log2(1 + x)


@T.prim_func(s_tir=True)
def matmul(
    a: T.Buffer((4, 8), "float32"), b: T.Buffer((8, 16), "float32"), c: T.Buffer((4, 16), "float32")
):
    for i, j, k in T.grid(4, 16, 8):
        with T.sblock("c"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                c[vi, vj] = T.float32(0)
            c[vi, vj] = c[vi, vj] + a[vi, vk] * b[vk, vj]


@T.prim_func(s_tir=True)
def exp_rows(x: T.handle, y: T.handle):
    n = T.int64()
    a = T.match_buffer(x, (n, T.int64(32)), "float32")
    b = T.match_buffer(y, (n, T.int64(32)), "float32")
    for i, j in T.grid(n, T.int64(32)):
        with T.sblock("e"):
            vi, vj = T.axis.remap("SS", [i, j])
            b[vi, vj] = T.exp(a[vi, vj]) + T.float32(1)


def test_tir_features_of_a_matmul_count_its_work_bytes_and_reduction():
    f = tir_features(matmul, gir=True, lanes=16, threads=2)
    assert list(f) == list(TIR_FEATURES)
    assert f["flops"] == pytest.approx(log(2 * 4 * 16 * 8))  # an add and a mul per point
    assert f["points"] == pytest.approx(log(4 * 16 * 8))
    assert f["bytes_in"] == pytest.approx(log((4 * 8 + 8 * 16) * 4))
    assert f["bytes_out"] == pytest.approx(log(4 * 16 * 4))
    assert f["reduction"] == REDUCTIONS.index("dot")
    assert f["reduce_extent"] == pytest.approx(log(8))
    assert f["spatial_extent"] == pytest.approx(log(64))
    assert f["transcendental"] == 0 and f["gather"] == 0
    assert (f["gir"], f["lanes"], f["threads"]) == (1.0, 16.0, 2.0)


def test_tir_features_of_a_symbolic_kernel_need_its_sizes():
    assert tir_features(exp_rows, gir=False, lanes=8, threads=1) is None
    f = tir_features(exp_rows, gir=False, lanes=8, threads=1, sizes={"n": 10})
    assert f["transcendental"] == pytest.approx(log(320))
    assert f["flops"] == pytest.approx(log(640))
    assert f["reduction"] == 0 and f["bytes_in"] == pytest.approx(log(1280))


def test_library_features_describe_the_operands():
    f = library_features(
        "plus.linear",
        2 * 16 * 32 * 64,
        [([16, 32], "float32"), ([64, 32], "float32")],
        ([16, 64], "float32"),
        native=True,
        threads=2,
    )
    assert list(f) == list(LIBRARY_FEATURES)
    assert f["bytes_in"] == pytest.approx(log((16 * 32 + 64 * 32) * 4))
    assert f["out_rows"] == pytest.approx(log(16)) and f["out_cols"] == pytest.approx(log(64))
    assert f["native"] == 1.0 and f["inputs"] == 2.0


# ------------------------------------------------------------------ training on known truths
def _tir_vector(flops: float, gir: float = 1.0) -> dict:
    v = {k: 0.0 for k in TIR_FEATURES}
    v.update(flops=log(flops), points=log(flops / 2), bytes_in=log(flops), gir=gir)
    return v


def _lib_vector(flops: float, kernel: str = "plus.linear") -> dict:
    return library_features(
        kernel, flops, [([8, 8], "float32")], ([8, 8], "float32"), native=True, threads=2
    ) | {"flops": log(flops)}


def _synthetic(tir_us, lib_us, groups: int = 40) -> list[dict]:
    records = []
    for g in range(groups):
        flops = 2.0 ** (8 + g % 20)
        records.append(
            {"part": "tir", "group": f"p{g}", "features": _tir_vector(flops), "us": tir_us(flops)}
        )
        records.append(
            {
                "part": "library",
                "group": f"p{g}",
                "features": _lib_vector(flops),
                "us": lib_us(flops),
            }
        )
    return records


def test_a_trained_model_ranks_held_out_kernels_and_round_trips(tmp_path):
    records = _synthetic(lambda f: 1 + f / 1e3, lambda f: 5 + f / 1e5)
    data = train(records, seed=1, rounds=80)
    assert data["samples"] == {"tir": 40, "library": 40, "subgraph": 0, "choice": 0, "gir_plan": 0}
    assert data["accuracy"]["tir"]["spearman"] >= 0.9
    path = tmp_path / "m.json"
    path.write_text(json.dumps(data))
    model = LearnedCostModel.load(str(path))
    small, big = model.predict_tir_us([_tir_vector(2.0**9), _tir_vector(2.0**26)])
    assert small < big and big == pytest.approx(1 + 2.0**26 / 1e3, rel=0.3)
    assert model.identity == LearnedCostModel.load(str(path)).identity
    lib = model.predict_library_us([_lib_vector(2.0**20)])[0]
    assert lib == pytest.approx(5 + 2.0**20 / 1e5, rel=0.3)


def test_score_and_group_split():
    assert score([1, 2, 3, 4], [10, 20, 30, 40])["spearman"] == 1.0
    assert score([2.0], [1.0])["median_rel_err"] == 1.0
    train_g, test_g = split_groups([{"group": f"g{i}"} for i in range(10)], 0.2, 0)
    assert len(test_g) == 2 and not train_g & test_g and len(train_g | test_g) == 10
    assert split_groups([{"group": "a"}, {"group": "b"}], 0, 0)[1] == set()


def test_decision_accuracy_counts_right_choices_and_regret(tmp_path):
    data = train(_synthetic(lambda f: 1 + f / 1e3, lambda f: 5 + f / 1e5), holdout=0, rounds=80)
    model = LearnedCostModel(data, "x")
    pairs = [
        {
            "library": _lib_vector(2.0**24),
            "tir": [_tir_vector(2.0**24)],
            "library_us": 200.0,
            "tir_us": 17000.0,
        },
        {
            "library": _lib_vector(2.0**8),
            "tir": [_tir_vector(2.0**8)],
            "library_us": 5.0,
            "tir_us": 1.2,
        },
    ]
    got = decision_accuracy(model, pairs)
    assert (got["right"], got["n"], got["regret"]) == (2, 2, 0.0)
    assert got["chosen_us"] == got["best_us"] == 200.0 + 1.2
    # the constants take the library for the tiny GEMM (their crossing is 4 us, TIR's launch 2)
    analytic = decision_accuracy(None, pairs)
    assert analytic["n"] == 2 and analytic["chosen_us"] >= got["chosen_us"]


def test_model_files_that_are_not_models_are_named(tmp_path):
    with pytest.raises(CostModelError, match="nope.json"):
        LearnedCostModel.load(str(tmp_path / "nope.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(CostModelError, match="bad.json.*invalid JSON"):
        LearnedCostModel.load(str(bad))
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"format": "something/else"}))
    with pytest.raises(CostModelError, match="other.json.*not a cost model"):
        LearnedCostModel.load(str(other))
    data = train(_synthetic(lambda f: 1 + f, lambda f: 1 + f), holdout=0, rounds=5)
    data["tir"]["features"] = ["flops"]
    stale = tmp_path / "stale.json"
    stale.write_text(json.dumps(data))
    with pytest.raises(CostModelError, match="stale.json.*calibrate"):
        LearnedCostModel.load(str(stale))


# ------------------------------------------------------------------ the decisions use it
def _model_file(tmp_path, name: str, tir_us, lib_us, ratio: float | None = None) -> str:
    records = _synthetic(tir_us, lib_us)
    if ratio is not None:  # a choice regressor that always says TIR / library = ratio
        for g in range(40):
            flops = 2.0 ** (8 + g % 20)
            vector = choice_features(_lib_vector(flops), [_tir_vector(flops)], float(g % 7 - 3))
            records.append({"part": "choice", "group": f"p{g}", "features": vector, "us": ratio})
    data = train(records, holdout=0, rounds=60)
    data["target_kind"] = "llvm"
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def _inputs():
    return (torch.randn(4, 8, generator=torch.Generator().manual_seed(0)),)


def test_the_learned_model_decides_library_or_tir_and_stays_exact(tmp_path):
    module = SmallNet().eval()
    x = _inputs()
    want = module(*x).detach().numpy()
    tir_cheap = _model_file(tmp_path, "tir.json", lambda f: 0.5, lambda f: 1e4)
    lib_cheap = _model_file(tmp_path, "lib.json", lambda f: 1e4, lambda f: 0.5)
    results = {}
    for name, path in (("tir", tir_cheap), ("lib", lib_cheap)):
        opts = Options(cost_model="learned", cost_model_file=path)
        m = plus_compile(module, "llvm", x, opts)
        np.testing.assert_allclose(m(*x), want, rtol=1e-4, atol=1e-5)
        decisions = m.stats["dispatch"]["decisions"]
        assert decisions and all(d["model"] == "learned" for d in decisions)
        assert all(d["tir_us"] > 0 and d["library_us"] > 0 for d in decisions)
        results[name] = m
    assert results["tir"].stats["library_calls"] == 0
    assert all(d["chosen"] == "tir" for d in results["tir"].stats["dispatch"]["decisions"])
    assert results["lib"].stats["library_calls"] >= 2
    # the model's identity is part of the options, hence of the digest
    a, b = (Options(**r.stats["options"]) for r in results.values())
    assert a.cost_model_id and a.cost_model_id != b.cost_model_id and a.digest() != b.digest()


def test_a_choice_regressor_overrides_the_kernel_times(tmp_path):
    module = SmallNet().eval()
    x = _inputs()
    # kernel times say the library is far cheaper, the choice regressor says TIR is: it decides
    path = _model_file(tmp_path, "choice.json", lambda f: 1e4, lambda f: 50.0, ratio=0.01)
    m = plus_compile(module, "llvm", x, Options(cost_model="learned", cost_model_file=path))
    np.testing.assert_allclose(m(*x), module(*x).detach().numpy(), rtol=1e-4, atol=1e-5)
    assert m.stats["library_calls"] == 0
    for d in m.stats["dispatch"]["decisions"]:
        assert d["chosen"] == "tir"
        assert d["tir_us"] == pytest.approx(d["library_us"] * 0.01, rel=0.05, abs=0.01)


def test_the_analytic_model_records_its_decisions_too():
    m = plus_compile(SmallNet().eval(), "llvm", _inputs())
    assert "calls" not in m.stats["dispatch"]  # the vectors are recorded for calibration only
    decisions = m.stats["dispatch"]["decisions"]
    assert decisions and {d["model"] for d in decisions} == {"analytic"}
    assert m.stats["options"]["cost_model_id"] == ""


def test_learned_without_a_model_for_the_target_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PLUS_TVM_CACHE_DIR", str(tmp_path))
    with pytest.raises(CostModelError, match="cuda.*calibrate"):
        plus_compile(SmallNet().eval(), "cuda", _inputs(), Options(cost_model="learned"))
    llvm_model = _model_file(tmp_path, "m.json", lambda f: 1.0, lambda f: 2.0)
    with pytest.raises(CostModelError, match="not 'cuda'"):
        plus_compile(
            SmallNet().eval(),
            "cuda",
            _inputs(),
            Options(cost_model="learned", cost_model_file=llvm_model),
        )


def test_the_shipped_model_loads_and_is_used_by_default_for_learned(tmp_path, monkeypatch):
    monkeypatch.setenv("PLUS_TVM_CACHE_DIR", str(tmp_path))  # no calibration of this machine
    shipped = LearnedCostModel.load(shipped_path("llvm"))
    assert shipped.has("tir") and shipped.has("library") and shipped.kind == "llvm"
    assert shipped.data["accuracy"]["tir"]["spearman"] >= 0.9
    m = plus_compile(SmallNet().eval(), "llvm", _inputs(), Options(cost_model="learned"))
    assert m.stats["options"]["cost_model_id"] == shipped.identity
    assert m.stats["options"]["cost_model_file"] == shipped_path("llvm")


# ------------------------------------------------------------------ plus-tvm calibrate
def test_calibrate_quick_measures_trains_and_writes_a_usable_model(tmp_path, capsys):
    out = tmp_path / "cm.json"
    records = tmp_path / "records.json"
    code = cli.main(
        [
            "calibrate",
            "--quick",
            "--zoo",
            "none",
            "--min-ms",
            "2",
            "--no-progress",
            "-o",
            str(out),
            "--records",
            str(records),
            "--json",
        ]
    )
    printed, _ = capsys.readouterr()
    assert code == 0
    summary = json.loads(printed)
    assert summary["samples"]["tir"] >= 8 and summary["samples"]["library"] >= 2
    # several GIR plans of a kernel, each timed, and the cross-validated plan choices
    assert summary["samples"]["gir_plan"] >= 2
    assert {"gir_plans", "gir_plans_analytic"} <= set(summary["accuracy"])
    measured = json.loads(records.read_text())["records"]
    assert all(r["us"] > 0 for r in measured)
    assert {"tir", "library", "gir_plan"} <= {r["part"] for r in measured}
    plans = [r for r in measured if r["part"] == "gir_plan"]
    by_kernel = Counter(r["kernel"] for r in plans)
    assert all(n >= 2 for n in by_kernel.values())
    model = LearnedCostModel.load(str(out))
    assert model.kind == "llvm" and model.data["calibrate_s"] > 0
    # how busy the rest of the machine was, measured over the run (Linux: /proc/stat)
    if os.path.exists("/proc/stat"):
        assert summary["other_load"] is not None and summary["other_load"] >= 0
        assert model.data["other_load"] == summary["other_load"]
    module = SmallNet().eval()
    x = _inputs()
    m = plus_compile(module, "llvm", x, Options(cost_model="learned", cost_model_file=str(out)))
    np.testing.assert_allclose(m(*x), module(*x).detach().numpy(), rtol=1e-4, atol=1e-5)


def test_other_load_is_the_busy_time_this_process_did_not_use():
    from plus_tvm.costmodel.calibrate import busy_core_s, other_load, own_core_s

    # 10 s of wall time: the machine was busy 14 core-seconds, this process used 9 of them
    assert other_load((100.0, 114.0), (3.0, 12.0), 10.0) == pytest.approx(0.5)
    assert other_load((100.0, 105.0), (3.0, 12.0), 10.0) == 0.0  # tick rounding: never below
    if os.path.exists("/proc/stat"):
        before, mine = busy_core_s(), own_core_s()
        sum(i * i for i in range(200_000))
        assert busy_core_s() >= before and own_core_s() > mine


def test_calibrate_warns_when_other_processes_kept_the_machine_busy(tmp_path, monkeypatch, capsys):
    from plus_tvm.costmodel import calibrate as calibration

    def fake(target, **_kwargs):
        data = {
            "samples": {"tir": 1, "library": 1},
            "accuracy": {},
            "calibrate_s": 1.0,
            "other_load": 0.8,
        }
        return data, calibration.Measurement()

    monkeypatch.setattr(calibration, "calibrate", fake)
    out = tmp_path / "cm.json"
    assert cli.main(["calibrate", "--quick", "--no-progress", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "0.80 cores busy" in err and "quiet machine" in err


def test_calibrate_names_an_unknown_zoo_model(capsys):
    assert cli.main(["calibrate", "--quick", "--zoo", "nosuch", "--no-progress"]) == 2
    assert "nosuch" in capsys.readouterr().err


def test_compile_with_a_missing_cost_model_file_exits_2(tmp_path, capsys):
    missing = tmp_path / "missing.json"
    code = cli.main(
        [
            "inspect",
            "zoo:bert-base-tiny",
            "--opt",
            "cost_model=learned",
            "--opt",
            f"cost_model_file={missing}",
        ]
    )
    assert code == 2
    assert "missing.json" in capsys.readouterr().err


def test_cost_model_choice_is_checked():
    with pytest.raises(PlusError, match="cost_model"):
        Options(cost_model="magic")


def test_auto_is_learned_only_where_this_machine_was_calibrated(tmp_path, monkeypatch):
    from plus_tvm.costmodel.learned import user_path
    from plus_tvm.gir.model import figures_key
    from plus_tvm.target import resolve_target

    cache = tmp_path / "cache"
    monkeypatch.setenv("PLUS_TVM_CACHE_DIR", str(cache))
    module, x = SmallNet().eval(), _inputs()
    m = plus_compile(module, "llvm", x)
    assert m.stats["options"]["cost_model"] == "analytic"
    assert {d["model"] for d in m.stats["dispatch"]["decisions"]} == {"analytic"}
    mine = user_path("llvm", figures_key(resolve_target("llvm")))
    os.makedirs(os.path.dirname(mine), exist_ok=True)  # (the cache root exists by now)
    shutil.copy(_model_file(tmp_path, "m.json", lambda f: 0.5, lambda f: 1e4), mine)
    m = plus_compile(module, "llvm", x)
    assert m.stats["options"]["cost_model"] == "learned"
    assert m.stats["options"]["cost_model_file"] == mine
    assert m.stats["library_calls"] == 0  # this machine's model said TIR
    np.testing.assert_allclose(m(*x), module(*x).detach().numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(tvm.cuda().exist, reason="this machine has a CUDA device")
def test_calibrate_without_the_target_device_is_a_clear_error(capsys):
    assert cli.main(["calibrate", "--quick", "--target", "cuda", "--no-progress"]) == 2
    assert "no cuda device" in capsys.readouterr().err


@pytest.mark.parametrize(
    "name", ["bert-base-tiny", "efficientnet-b0-tiny", "llama-tiny", "resnet50-tiny"]
)
def test_zoo_models_under_the_shipped_model_are_exact(name):
    from plus_tvm import zoo

    entry = zoo.get(name)
    model, inputs = entry.build(0).eval(), entry.example_inputs(0)
    m = plus_compile(model, "llvm", inputs, Options(cost_model="learned"))
    assert {d["model"] for d in m.stats["dispatch"]["decisions"]} <= {"learned", "analytic"}
    with torch.no_grad():
        ref = model(*inputs)
    ref = ref[0] if isinstance(ref, (tuple, list)) else ref
    got = m(*inputs)
    got = got[0] if isinstance(got, (tuple, list)) else got
    np.testing.assert_allclose(got, ref.numpy(), rtol=1e-4, atol=1e-4)


def test_a_learned_cost_without_a_machine_is_refused(tmp_path):
    from plus_tvm.costmodel import LearnedDispatchCost
    from plus_tvm.passes import PlusDispatch

    model = LearnedCostModel.load(_model_file(tmp_path, "m.json", lambda f: 1.0, lambda f: 2.0))
    with pytest.raises(ValueError, match="machine"):
        PlusDispatch(cost=LearnedDispatchCost(model))
    with pytest.raises(ValueError, match="machine"):
        PlusDispatch(record_calls=True)
