"""Training and scoring the learned cost model from measured kernel times.

A **record** is one measurement: ``{"part": "tir" | "library" | "subgraph" | "choice", "group":
program, "features": vector, "us": microseconds}`` (a subgraph record: the kernels the pipeline
made of one matched subgraph, against its operators' vectors summed by
:func:`.features.subgraph_features`; a choice record: ``us`` is the measured TIR time over the
library time of one subgraph, against :func:`.features.choice_features`).

Accuracy is measured on whole programs held out of training (every kernel of a held-out program
is unseen, as a new model's would be): Spearman's rank correlation of predicted and measured
times and the median relative error, per part. The model that is stored is then trained on all
records.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import numpy as np

from .features import (
    CHOICE_FEATURES,
    GIR_PLAN_FEATURES,
    LIBRARY_FEATURES,
    SUBGRAPH_FEATURES,
    TIR_FEATURES,
)
from .learned import LearnedCostModel

#: xgboost settings: small trees, shrinkage, row subsampling (a hundred to a thousand samples
#: per part). Depth 5 and 150 rounds held the held-out accuracy of depth 6 and 300 rounds
#: (Spearman within 0.01, the same cross-validated choices) at a third of the file size
PARAMS = {
    "objective": "reg:squarederror",
    "max_depth": 5,
    "eta": 0.15,
    "subsample": 0.9,
    "colsample_bytree": 0.9,
    "min_child_weight": 1.0,
    "nthread": 0,
}
ROUNDS = 150


_NAMES = {
    "tir": TIR_FEATURES,
    "library": LIBRARY_FEATURES,
    "subgraph": SUBGRAPH_FEATURES,
    "choice": CHOICE_FEATURES,
    "gir_plan": GIR_PLAN_FEATURES,
}


def _rows(records: Sequence[dict], part: str, kernels: Sequence[str]) -> tuple:
    names = _NAMES[part]
    xs, ys = [], []
    for r in records:
        if r["part"] != part or not r["us"] > 0:
            continue
        f = r["features"]
        xs.append(
            [
                float(kernels.index(f[n]) if f[n] in kernels else -1)
                if isinstance(f[n], str)
                else float(f[n])
                for n in names
            ]
        )
        ys.append(math.log2(r["us"]))
    return np.asarray(xs, dtype=np.float32), np.asarray(ys, dtype=np.float32)


def _fit(xs: np.ndarray, ys: np.ndarray, seed: int, rounds: int) -> object:
    import xgboost

    params = {**PARAMS, "seed": seed}
    return xgboost.train(params, xgboost.DMatrix(xs, label=ys), num_boost_round=rounds)


def kernel_names(records: Sequence[dict]) -> list[str]:
    return sorted({r["features"]["kernel"] for r in records if r["part"] == "library"})


def score(predicted: Sequence[float], measured: Sequence[float]) -> dict[str, float]:
    """Spearman's rank correlation and the median relative error of ``predicted`` against
    ``measured`` (both in microseconds)."""
    from scipy.stats import spearmanr

    p, m = np.asarray(predicted), np.asarray(measured)
    rho = float(spearmanr(p, m).statistic) if len(p) > 2 else float("nan")
    rel = float(np.median(np.abs(p - m) / m)) if len(p) else float("nan")
    return {"spearman": round(rho, 4), "median_rel_err": round(rel, 4), "n": len(p)}


def split_groups(records: Sequence[dict], holdout: float, seed: int) -> tuple[set, set]:
    """Program names for training and for the held-out test, about ``holdout`` of them held
    out."""
    groups = sorted({r["group"] for r in records})
    rng = random.Random(seed)
    rng.shuffle(groups)
    n = max(1, round(len(groups) * holdout)) if len(groups) > 1 and holdout > 0 else 0
    return set(groups[n:]), set(groups[:n])


def train(
    records: Sequence[dict],
    *,
    holdout: float = 0.2,
    seed: int = 0,
    rounds: int = ROUNDS,
    meta: dict | None = None,
) -> dict:
    """A model file's contents (``FORMAT``) trained on ``records``, with the held-out
    accuracy of a model trained on the rest."""
    import xgboost

    from .learned import FORMAT

    kernels = kernel_names(records)
    train_groups, test_groups = split_groups(records, holdout, seed)
    data: dict = {"format": FORMAT, "kernels": kernels, **(meta or {})}
    accuracy: dict = {}
    samples: dict = {}
    for part, names in _NAMES.items():
        xs, ys = _rows(records, part, kernels)
        samples[part] = len(ys)
        if len(ys) < 2:
            continue
        if test_groups:
            train_x, train_y = _rows(
                [r for r in records if r["group"] in train_groups], part, kernels
            )
            test_x, test_y = _rows([r for r in records if r["group"] in test_groups], part, kernels)
            if len(train_y) >= 2 and len(test_y):
                held = _fit(train_x, train_y, seed, rounds)
                predicted = 2.0 ** held.predict(xgboost.DMatrix(test_x))
                accuracy[part] = score(predicted, 2.0**test_y)
        booster = _fit(xs, ys, seed, rounds)
        data[part] = {
            "features": list(names),
            "booster": bytes(booster.save_raw("json")).decode(),
        }
    data["samples"] = samples
    data["accuracy"] = accuracy
    data["holdout_groups"] = sorted(test_groups)
    return data


def decision_accuracy(model: LearnedCostModel | None, pairs: Sequence[dict]) -> dict[str, float]:
    """How often a model picks the faster side of a measured library-vs-TIR pair
    (``{"library": vector, "tir": [vectors], "library_us": m, "tir_us": m}``), and what its
    wrong picks cost: the summed measured time of its picks over the best picks' (``regret``;
    ``chosen_us`` and ``best_us`` are the sums). ``None``:
    the analytic constants' picks (``DispatchCost`` as the pipeline sets it), for comparison."""
    picks = []
    for pair in pairs:
        if model is None:
            lib, tir = _analytic(pair)
        else:
            lib = model.predict_library_us([pair["library"]])[0]
            ratio = model.predict_ratio(choice_of(pair))
            tir = lib * ratio if ratio is not None else model.predict_subgraph_us(pair["tir"])
        picks.append(
            (
                pair["library_us"] if lib < tir else pair["tir_us"],
                min(pair["library_us"], pair["tir_us"]),
            )
        )
    return _scored(picks)


def _scored(picks: Sequence[tuple[float, float]]) -> dict[str, float]:
    """Right picks, their count and the regret of (picked, best) measured times."""
    right = sum(pick == best for pick, best in picks)
    chosen_us = sum(pick for pick, _ in picks)
    best_us = sum(best for _, best in picks)
    return {
        "right": right,
        "n": len(picks),
        "regret": round(chosen_us / best_us - 1.0, 4) if best_us else 0.0,
        "chosen_us": chosen_us,
        "best_us": best_us,
    }


def _cost(pair: dict) -> object:
    from .dispatch_cost import DispatchCost

    return DispatchCost(tir_gbps=8.0 if pair["tir"][0]["gir"] else 1.0)


def _gflops(pair: dict) -> float:
    from ..runtime.perf import library_gflops

    return library_gflops(pair["library"]["kernel"], "llvm", measure=False)


def _analytic(pair: dict) -> tuple[float, float]:
    """The analytic model's library and TIR microseconds of a pair, as ``PlusDispatch``
    prices them."""
    from .dispatch_cost import vector_prices

    return vector_prices(_cost(pair), pair["library"], _gflops(pair))


def choice_of(pair: dict) -> dict:
    """The choice vector of a pair (:func:`.features.choice_features`)."""
    from .dispatch_cost import analytic_ratio
    from .features import choice_features

    ratio = analytic_ratio(_cost(pair), pair["library"], _gflops(pair))
    return choice_features(pair["library"], pair["tir"], ratio)


def plan_choices(model: LearnedCostModel | None, records: Sequence[dict]) -> dict[str, float]:
    """How often a model picks the fastest of a kernel's measured GIR plans (``gir_plan``
    records sharing a ``kernel``), and what its wrong picks cost (``regret``, as in
    :func:`decision_accuracy`). ``None``: the GIR performance model's picks (the lowest
    ``estimate``; at equal estimates its first)."""
    kernels: dict[str, list[dict]] = {}
    for r in records:
        if r["part"] == "gir_plan" and r["us"] > 0:
            kernels.setdefault(r["kernel"], []).append(r)
    picks = []
    for plans in kernels.values():
        if len(plans) < 2:
            continue
        plans = sorted(plans, key=lambda r: r["plan"])
        if model is None:
            scores = [r["features"]["estimate"] for r in plans]
        else:
            scores = model.predict_gir_plan_us([r["features"] for r in plans])
        pick = plans[min(range(len(plans)), key=lambda i: scores[i])]["us"]
        picks.append((pick, min(r["us"] for r in plans)))
    return _scored(picks)
