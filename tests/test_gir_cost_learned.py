"""GIR plans ranked by the learned cost model (``Options.gir_cost="learned"``): the plan vector,
the search handing its best plans to a ranker, GIRLLVM lowering the ranker's pick (exact, and
its predictions in the schedule report), the pipeline and the measured plan-choice accuracy."""

from __future__ import annotations

import json
from math import log2

import numpy as np
import plus_tvm
import pytest
import torch
from gir_kernels import fused_primfunc, random_args, run
from plus_tvm.costmodel.features import (
    GIR_PLAN_FEATURES,
    STRUCTURES,
    TIR_FEATURES,
    KernelContext,
    gir_plan_features,
    tir_features,
)
from plus_tvm.costmodel.gir_cost import LearnedPlanRanker
from plus_tvm.costmodel.learned import CostModelError, LearnedCostModel
from plus_tvm.costmodel.train import plan_choices, train
from plus_tvm.gir import machine_for
from plus_tvm.gir.analysis import analyze, normalize
from plus_tvm.gir.search import candidate_plans, plan, plan_kernel, ranked_plans
from plus_tvm.options import Options, OptionsError
from plus_tvm.report import stats_text
from plus_tvm.schedules import GIRLLVM
from plus_tvm.target import resolve_target


@pytest.fixture(scope="module")
def llvm():
    return resolve_target("llvm")


def log(x: float) -> float:
    return log2(1.0 + x)


class _Prefer:
    """A ranker that predicts 1 us for the plan whose params are ``want`` and 100 us for the
    rest (``want`` None: no prediction)."""

    def __init__(self, top: int = 4, want: dict | None = None):
        self.top = top
        self.want = want
        self.seen: list[list[dict]] = []

    def predict_us(self, func, plans):
        self.seen.append([p.params for p in plans])
        if self.want is None:
            return None
        return [1.0 if p.params == self.want else 100.0 for p in plans]


# ------------------------------------------------------------------ the plan vector
def test_gir_plan_features_add_the_plan_to_the_kernel_vector(llvm):
    func = fused_primfunc("softmax", [64, 256], llvm)
    kernel_vector = tir_features(func, gir=True, lanes=16, threads=2)
    params = {"vector": 8, "recompute": True, "acc": 1, "serial": True}
    v = gir_plan_features(kernel_vector, "row", params, 12e-6)
    assert list(v) == list(GIR_PLAN_FEATURES)
    assert all(v[k] == kernel_vector[k] for k in TIR_FEATURES)
    assert v["structure"] == STRUCTURES.index("row") and v["vector"] == 8.0
    assert v["recompute"] == 1.0 and v["serial"] == 1.0 and v["tile"] == 0.0
    assert v["estimate"] == pytest.approx(log(12.0))


# ------------------------------------------------------------------ the search
def test_ranked_plans_are_ordered_by_estimate_and_exhaustive_sees_every_candidate(llvm):
    func = normalize(fused_primfunc("transpose_add", [256, 256], llvm))
    kernel = analyze(func)
    m = machine_for(llvm)
    pruned = ranked_plans(kernel, m)
    every = ranked_plans(kernel, m, exhaustive=True)
    assert len(every) >= len(pruned) >= 1
    seconds = [p.estimate.seconds for p in every]
    assert seconds == sorted(seconds)
    assert plan_kernel(kernel, m).params == pruned[0].params == every[0].params
    assert all(p.ranked == every[0].ranked and p.candidates == len(every) for p in every)
    assert ranked_plans(kernel, m, budget=1, exhaustive=True)[0].candidates == 1


def test_a_ranker_picks_among_the_analytic_models_best_plans(llvm):
    func = fused_primfunc("softmax", [64, 256], llvm)
    plans = candidate_plans(func, llvm, exhaustive=True)
    assert len(plans) >= 3 and all(p.func is not None for p in plans)
    analytic = plan(func, llvm)
    assert analytic.params == plans[0].params and not analytic.predicted
    # the ranker sees the best `top` and its fastest prediction wins
    third = plans[2].params
    ranker = _Prefer(top=3, want=third)
    chosen = plan(func, llvm, ranker=ranker)
    assert chosen.params == third
    assert ranker.seen == [[p.params for p in plans[:3]]]
    assert [us for us, _, _ in chosen.predicted] == [100.0, 100.0, 1.0]
    assert [e for _, _, e in chosen.predicted] == [p.estimate.seconds * 1e6 for p in plans[:3]]
    # outside the top it is never seen; no prediction keeps the analytic order
    assert plan(func, llvm, ranker=_Prefer(top=1, want=third)).params == plans[0].params
    assert plan(func, llvm, ranker=_Prefer(top=4)).params == plans[0].params


# ------------------------------------------------------------------ the rule
@pytest.mark.parametrize("kind,shape", [("softmax", [64, 256]), ("transpose_add", [96, 128])])
def test_girllvm_lowers_the_rankers_pick_exactly(kind, shape, llvm):
    func = fused_primfunc(kind, shape, llvm)
    plans = candidate_plans(func, llvm, exhaustive=True)
    arrays = random_args(func)
    want = run(func, llvm, arrays)
    schedules = set()
    for p in plans[:4]:
        ranker = _Prefer(top=4, want=p.params)
        sch, why = GIRLLVM(ranker=ranker).apply_with_reason(func, llvm)
        assert why is None
        scheduled = sch.mod["main"]
        note = json.loads(str(scheduled.attrs["plus.schedule_note"]))
        assert note["gir_plan"] == json.loads(json.dumps(p.params))
        assert note["ranked_by"] == "learned" and len(note["plans"]) == min(4, len(plans))
        assert all(e["estimate_us"] > 0 for e in note["plans"])
        schedules.add(str(scheduled.without_attr("plus.schedule_note").script()))
        got = run(scheduled.without_attr("plus.schedule_note"), llvm, arrays)
        for w, g in zip(want, got, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    assert len(schedules) >= 2  # the plans are lowered differently


# ------------------------------------------------------------------ training and accuracy
def _plan_records(groups: int = 24) -> list[dict]:
    """Kernels whose serial plan runs 10x faster than the parallel ones, while the analytic
    estimate ranks a parallel plan first."""
    records = []
    for g in range(groups):
        base = dict.fromkeys(TIR_FEATURES, 0.0) | {"bytes_in": log(2.0 ** (10 + g % 8))}
        for rank, serial in enumerate((False, False, True)):
            params = {"vector": 16 if rank == 0 else 8, "serial": serial}
            est = (1.0 + rank) * 1e-6
            records.append(
                {
                    "part": "gir_plan",
                    "group": f"p{g}",
                    "kernel": f"p{g}/k",
                    "plan": rank,
                    "features": gir_plan_features(base, "elementwise", params, est),
                    "us": 2.0 if serial else 20.0 + rank,
                }
            )
    return records


def test_plan_choices_score_the_picks_of_a_model_and_of_the_analytic_estimate():
    records = _plan_records()
    analytic = plan_choices(None, records)
    assert analytic["n"] == 24 and analytic["right"] == 0
    assert analytic["regret"] == pytest.approx(20.0 / 2.0 - 1.0)
    model = LearnedCostModel(train(records, holdout=0, rounds=40), "")
    learned = plan_choices(model, records)
    assert learned["right"] == 24 and learned["regret"] == 0.0


def _plan_model_file(tmp_path, prefer_serial: bool) -> str:
    records = _plan_records()
    if not prefer_serial:  # the same kernels, the parallel plans fast
        for r in records:
            r["us"] = 50.0 if r["features"]["serial"] else 1.0 + r["plan"]
    data = train(records, holdout=0, rounds=40)
    data["target_kind"] = "llvm"
    path = tmp_path / f"plans-{prefer_serial}.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_the_learned_ranker_predicts_each_plan(tmp_path, llvm):
    model = LearnedCostModel.load(_plan_model_file(tmp_path, prefer_serial=True))
    ranker = LearnedPlanRanker(model, KernelContext(True, 16, 2))
    func = fused_primfunc("add_scale", [64, 64], llvm)
    plans = candidate_plans(func, llvm, exhaustive=True)[:4]
    predicted = ranker.predict_us(func, plans)
    assert len(predicted) == len(plans) and all(us > 0 for us in predicted)
    serial = [us for us, p in zip(predicted, plans, strict=True) if p.params.get("serial")]
    parallel = [us for us, p in zip(predicted, plans, strict=True) if not p.params.get("serial")]
    assert serial and parallel and max(serial) < min(parallel)


def test_a_model_without_a_plan_regressor_is_refused_by_name(tmp_path):
    data = train(
        [{"part": "tir", "group": f"g{i}", "features": dict.fromkeys(TIR_FEATURES, float(i)),
          "us": 1.0 + i} for i in range(6)],
        holdout=0,
        rounds=5,
    )  # fmt: skip
    path = tmp_path / "no-plans.json"
    path.write_text(json.dumps(data | {"target_kind": "llvm"}))
    with pytest.raises(ValueError, match="no GIR plan regressor"):
        LearnedPlanRanker(LearnedCostModel.load(str(path)), KernelContext(True, 16, 2))
    opts = Options(gir_cost="learned", cost_model_file=str(path), cost_model="analytic")
    with pytest.raises(CostModelError, match="no-plans.json"):
        plus_tvm.compile(_Net().eval(), "llvm", _inputs(), opts)


def test_gir_cost_choice_is_checked():
    with pytest.raises(OptionsError, match="gir_cost"):
        Options(gir_cost="bytes")


# ------------------------------------------------------------------ the pipeline
class _Net(torch.nn.Module):
    """Memory kernels GIR plans on a small input: a row softmax, a column mean, an
    element-wise chain (each small enough for serial plans)."""

    def forward(self, x):
        y = torch.softmax(x * 2.0, dim=-1)
        return torch.relu(y + x.mean(dim=0, keepdim=True)) * torch.sigmoid(x)


def _inputs():
    return (torch.randn(64, 96, generator=torch.Generator().manual_seed(0)),)


def test_the_pipeline_ranks_gir_plans_with_the_learned_model_and_stays_exact(tmp_path):
    module, x = _Net().eval(), _inputs()
    want = module(*x).detach().numpy()
    analytic = plus_tvm.compile(module, "llvm", x, Options(cost_model="analytic"))
    assert "notes" not in (analytic.stats["schedule"] or {})
    chosen = {}
    for prefer_serial in (True, False):
        path = _plan_model_file(tmp_path, prefer_serial)
        # a cheap pool launch keeps parallel plans among the performance model's best four
        opts = Options(
            cost_model="analytic", gir_cost="learned", cost_model_file=path, gir_launch_us=1.0
        )
        m = plus_tvm.compile(module, "llvm", x, opts)
        np.testing.assert_allclose(m(*x), want, rtol=1e-4, atol=1e-5)
        notes = m.stats["schedule"]["notes"]
        assert notes and all(n["ranked_by"] == "learned" for n in notes.values())
        for n in notes.values():
            fastest = min(n["plans"], key=lambda e: e["predicted_us"])
            assert n["gir_plan"] == fastest["params"]
        chosen[prefer_serial] = {k: bool(n["gir_plan"].get("serial")) for k, n in notes.items()}
        text = stats_text(m.stats)
        assert f"{len(notes)} kernel(s) ranked by the learned model" in text
        options = Options(**m.stats["options"])
        assert options.cost_model_id and options.cost_model_file == path
    # the serial plans where the model says so, and the two models disagree somewhere
    assert any(chosen[True].values()) and chosen[True] != chosen[False]
