"""The benchmark harness: budgets, interleaving, error checks and speedup arithmetic."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from plus_tvm.bench import Backend, Bench, format_table


class Slow(torch.nn.Module):
    """A tiny model; the test slows one backend down artificially."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.lin(x))


def _bench(**kw) -> Bench:
    model = Slow().eval()
    return Bench(model_ref(model), **kw)


def model_ref(model):
    from plus_tvm.loader import load_model

    return load_model(model, (torch.randn(2, 8),))


def test_budget_limits_runs_of_a_slow_backend(monkeypatch):
    bench = _bench(backends=["plus", "torch"], runs=6, warmup=0, budget_s=0.05, progress=False)
    orig = Bench._setup

    def slow_setup(self):
        backends = orig(self)
        plus = next(b for b in backends if b.name == "plus")
        fast = plus.run

        def slow_run():
            time.sleep(0.03)
            return fast()

        plus.run = slow_run
        return backends

    monkeypatch.setattr(Bench, "_setup", slow_setup)
    result = bench.run()
    plus, torch_ = result["backends"]["plus"], result["backends"]["torch"]
    assert 1 <= plus["runs"] < 6
    assert plus["status"].startswith("budget:")
    assert torch_["runs"] == 6 and torch_["status"] == "ok"
    assert result["speedup"]["torch"] == pytest.approx(
        torch_["median_ms"] / plus["median_ms"], rel=2e-3
    )


def test_wrong_backend_output_is_reported_not_hidden(monkeypatch):
    bench = _bench(backends=["plus", "torch"], runs=2, warmup=0, progress=False)
    orig = Bench._setup

    def broken_setup(self):
        backends = orig(self)
        plus = next(b for b in backends if b.name == "plus")
        good = plus.run
        plus.run = lambda: np.asarray(good().numpy()) + 0.5  # a wrong result
        return backends

    monkeypatch.setattr(Bench, "_setup", broken_setup)
    result = bench.run()
    assert result["reference"] == "torch"
    assert result["backends"]["plus"]["max_abs_err"] == pytest.approx(0.5, abs=1e-5)


def test_failing_peer_is_reported_and_plus_still_measured(monkeypatch):
    bench = _bench(backends=["plus", "torch"], runs=2, warmup=0, progress=False)
    orig = Bench._setup

    def failing(self):
        backends = orig(self)
        victim = next(b for b in backends if b.name == "torch")

        def boom():
            raise RuntimeError("peer exploded")

        victim.run = boom
        return backends

    monkeypatch.setattr(Bench, "_setup", failing)
    result = bench.run()
    assert "peer exploded" in result["backends"]["torch"]["status"]
    assert result["backends"]["plus"]["runs"] == 2
    assert "peer exploded" in str(result["speedup"]["torch"])
    assert "torch" in format_table(result)


def test_unknown_backend_is_rejected():
    from plus_tvm.errors import PlusError

    with pytest.raises(PlusError, match="tensorrt"):
        Bench("zoo:bert-base-tiny", ["plus", "tensorrt"])


def test_backend_defaults():
    b = Backend("x")
    assert not b.active and b.status == "ok"


def test_plus_variant_backend_is_compiled_with_its_options():
    bench = _bench(
        backends=["plus", "plus:dispatch=false+fusion=tvm"], runs=2, warmup=0, progress=False
    )
    result = bench.run()
    variant = result["backends"]["plus:dispatch=false+fusion=tvm"]
    assert variant["status"] == "ok" and variant["max_abs_err"] < 1e-4
    assert "plus:dispatch=false+fusion=tvm" in result["speedup"]
    with pytest.raises(Exception, match="unknown option"):
        _bench(backends=["plus", "plus:nonsense=1"], progress=False)
