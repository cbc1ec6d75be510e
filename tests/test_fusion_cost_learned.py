"""The fusion plan priced by the learned cost model (``Options.fusion_cost="learned"``): the
fused kernel's vector, the plan search following predicted time instead of eq. 8, and the
pipeline using it with the prediction in the stats and the explanation."""

from __future__ import annotations

import json
from math import log2

import numpy as np
import plus_tvm
import pytest
import torch
from plus_tvm.costmodel.features import TIR_FEATURES, fused_features
from plus_tvm.costmodel.fusion_cost import LearnedFusionCost
from plus_tvm.costmodel.train import train
from plus_tvm.fusion import Edge, FusionGraph, dp_plan, eq8, greedy_plan, split_groups
from plus_tvm.mapping import MapPattern
from plus_tvm.options import Options, OptionsError


def log(x: float) -> float:
    return log2(1.0 + x)


def _vector(flops: float, nbytes: float, blocks: float = 1.0, reductions: float = 0.0) -> dict:
    v = dict.fromkeys(TIR_FEATURES, 0.0)
    v.update(
        flops=log(flops),
        points=log(flops),
        bytes_in=log(nbytes),
        bytes_out=log(nbytes),
        blocks=blocks,
        reduction_blocks=reductions,
        gir=1.0,
        lanes=16.0,
        threads=2.0,
    )
    return v


def test_fused_features_keep_the_inside_tensors_off_the_parameters():
    a, b = _vector(1000, 4096), _vector(3000, 4096, blocks=2)
    fused = fused_features([a, b], read_inside=4096, kept_inside=4096)
    assert fused["flops"] == pytest.approx(log(4000))
    assert fused["bytes_in"] == pytest.approx(log(4096))  # b's input came from a
    assert fused["bytes_out"] == pytest.approx(log(4096))  # a's output stays inside
    assert fused["bytes_local"] == pytest.approx(log(4096))
    assert fused["blocks"] == 3 and list(fused) == list(TIR_FEATURES)


class _Model:
    """Predicts 10 us per kernel, 100 us for a kernel of more than one reduction block (a
    pairing this machine's measurements would call slow), 1 us per kernel otherwise cheap."""

    def has(self, part: str) -> bool:
        return part == "tir"

    def predict_tir_us(self, vectors):
        return [100.0 if v["reduction_blocks"] > 1 else 10.0 for v in vectors]


def _two_reductions() -> tuple[FusionGraph, list[dict]]:
    """A row reduction feeding another (table 1 lets them fuse; eq. 8 wants it)."""
    graph = FusionGraph(
        [MapPattern.Reorganize, MapPattern.Reorganize],
        [Edge(0, 1, 4096.0)],
        names=["sum", "max"],
    )
    return graph, [_vector(1e5, 8192, reductions=1), _vector(1e5, 4096, reductions=1)]


def test_the_search_follows_predicted_time_where_it_disagrees_with_eq8():
    graph, vectors = _two_reductions()
    by_bytes = dp_plan(graph)
    assert len(by_bytes.groups()) == 1, "eq. 8 fuses the two (fewer bytes cross)"
    price = LearnedFusionCost(_Model(), vectors)
    # algorithm 2 assembles maximal groups only: priced by time it still fuses them...
    assembled = dp_plan(graph, cost=price)
    assert len(assembled.groups()) == 1 and assembled.cost == pytest.approx(100.0)
    assert greedy_plan(graph, cost=price).cost == pytest.approx(100.0)
    # ...and the cut step separates what the model predicts faster apart
    cut = split_groups(graph, assembled, price)
    assert cut.groups() == [[0], [1]] and cut.cost == pytest.approx(20.0)
    assert set(cut.patterns) == {0, 1}
    # eq. 8 never gains from a cut
    assert split_groups(graph, by_bytes, eq8()).groups() == [[0, 1]]


def test_nodes_that_are_no_kernel_cost_nothing():
    graph = FusionGraph(
        [MapPattern.NotFuse, MapPattern.OneToOne], [Edge(0, 1, 64.0)], names=["call", "add"]
    )
    price = LearnedFusionCost(_Model(), [None, _vector(10, 64)])
    assert price(graph, [-1, -1]) == pytest.approx(10.0)


# ------------------------------------------------------------------ through the pipeline
class _Net(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.softmax(x * 2.0 + 1.0, dim=-1)
        return torch.tanh(y) * x.sum(dim=-1, keepdim=True)


def _model_file(tmp_path) -> str:
    """A tiny trained model: time grows with flops and with bytes."""
    records = []
    for g in range(60):
        flops, nbytes = 2.0 ** (6 + g % 14), 2.0 ** (8 + (g * 7) % 12)
        vector = _vector(flops, nbytes, blocks=1 + g % 3, reductions=g % 2)
        us = 1.0 + flops / 1e3 + nbytes / 1e4
        records.append({"part": "tir", "group": f"p{g}", "features": vector, "us": us})
    data = train(records, holdout=0, rounds=40)
    data["target_kind"] = "llvm"
    path = tmp_path / "fusion-model.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_fusion_cost_learned_compiles_exactly_and_reports_its_prediction(tmp_path):
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(0))
    net = _Net().eval()
    want = net(x).numpy()
    path = _model_file(tmp_path)
    opts = Options(fusion_cost="learned", cost_model_file=path, fusion_explain=True)
    m = plus_tvm.compile(net, "llvm", (x,), opts)
    np.testing.assert_allclose(m(x), want, rtol=1e-4, atol=1e-5)
    priced = m.stats["fusion_cost"]
    assert priced["blocks"] >= 1 and priced["predicted_us"] > 0
    # the chosen plans are never predicted slower than the ones eq. 8 picks
    assert priced["predicted_us"] <= priced["eq8_plan_us"] + 1e-6
    used = Options(**m.stats["options"])
    assert used.cost_model_id and used.digest() != Options().digest()
    plain = plus_tvm.compile(net, "llvm", (x,))
    assert "fusion_cost" not in plain.stats
    from plus_tvm.report import stats_text

    assert "fusion cost" in stats_text(m.stats) and "fusion cost" not in stats_text(plain.stats)


def test_fusion_cost_choice_is_checked():
    with pytest.raises(OptionsError, match="fusion_cost"):
        Options(fusion_cost="fastest")
