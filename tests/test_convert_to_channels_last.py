"""ConvertToChannelsLast: convolutions and the operators between them run in NHWC, the layout
changes only at the trunk's edges, and results never change (random CNNs against torch)."""

from __future__ import annotations

import random

import numpy as np
import plus_tvm
import pytest
import torch
import tvm
from plus_tvm.passes import ConvertToChannelsLast
from torch import nn
from torch.nn import functional as F  # noqa: N812
from tvm import relax


def _ops(mod: tvm.IRModule) -> dict[str, int]:
    counts: dict[str, int] = {}
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
                counts[value.op.name] = counts.get(value.op.name, 0) + 1
    return counts


def _layouts(mod: tvm.IRModule) -> list[str]:
    out = []
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call) and getattr(value.op, "name", "") == "relax.nn.conv2d":
                out.append(str(value.attrs.data_layout))
    return out


class Trunk(nn.Module):
    """conv-BN-ReLU6, depthwise, a residual, a one-sided pad, max pooling, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.pw = nn.Conv2d(8, 8, 1)
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu6(self.bn(self.stem(x)))
        y = y + self.pw(F.relu(self.dw(y)))
        y = F.max_pool2d(F.pad(y, (0, 1, 0, 1)), 2)
        return self.head(y.mean(dim=(2, 3)))


def _imported(module: nn.Module, shape=(1, 3, 16, 16)) -> tuple[tvm.IRModule, torch.Tensor]:
    module.eval()
    x = torch.randn(*shape)
    mod, _ = plus_tvm.from_torch(module, (x,))
    return mod, x


def _canonical(mod: tvm.IRModule) -> tvm.IRModule:
    """What the pipeline runs first: max_pool2d's (value, unused indices) tuple dissolved."""
    return relax.transform.DeadCodeElimination()(relax.transform.CanonicalizeBindings()(mod))


def test_trunk_runs_channels_last_with_one_transpose_at_each_edge():
    mod, _ = _imported(Trunk())
    mod = _canonical(mod)
    before = _ops(mod)
    after_mod = ConvertToChannelsLast()(mod)
    after = _ops(after_mod)
    assert set(_layouts(mod)) == {"NCHW"}
    assert set(_layouts(after_mod)) == {"NHWC"}
    # in: the image; out: before the head's reshape (the mean over H, W is the same [N, C])
    assert after.get("relax.permute_dims", 0) - before.get("relax.permute_dims", 0) == 1
    assert after["relax.nn.conv2d"] == before["relax.nn.conv2d"]


def test_module_without_convolutions_is_returned_unchanged():
    mod, _ = _imported(nn.Sequential(nn.Linear(16, 4), nn.ReLU()), shape=(2, 16))
    assert ConvertToChannelsLast()(mod).same_as(mod)


def test_layout_sensitive_consumer_gets_nchw_back():
    """A softmax over the channel axis reads the NCHW tensor, transposed back once."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 6, 3, padding=1)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            y = torch.relu(self.conv(x))
            return torch.softmax(y, dim=1), y * 2.0

    mod, x = _imported(Net())
    new = ConvertToChannelsLast()(mod)
    assert set(_layouts(new)) == {"NHWC"}
    _check_pass_keeps_results(mod, new, x)


def test_trunk_results_unchanged_by_the_pass():
    mod, x = _imported(Trunk())
    _check_pass_keeps_results(mod, ConvertToChannelsLast()(mod), x)


def _check_pass_keeps_results(before: tvm.IRModule, after: tvm.IRModule, x: torch.Tensor) -> None:
    target = plus_tvm.target.resolve_target("llvm")
    rng = np.random.default_rng(0)
    main = before["main"]
    args = [x.numpy()]
    for p in main.params[1:]:
        shape = [int(d) for d in p.ty.shape.values]
        args.append(rng.standard_normal(shape).astype("float32"))
    outs = []
    for mod in (before, after):
        vm = relax.VirtualMachine(tvm.compile(mod, target=target), tvm.cpu())
        out = vm["main"](*[tvm.runtime.tensor(a) for a in args])
        outs.append(
            [o.numpy() for o in out]
            if isinstance(out, (list, tuple, tvm.ir.Array))
            else [out.numpy()]
        )
    for a, b in zip(*outs):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# random CNNs through the whole plus pipeline (NHWC, native convolutions) against torch


class RandomCNN(nn.Module):
    """A random chain of the operators CNNs are made of."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        rng = random.Random(seed)
        self.steps: list[tuple] = []
        self.layers = nn.ModuleList()
        c = rng.choice([3, 4])
        size = 12
        for _ in range(rng.randint(3, 7)):
            kind = rng.choice(["conv", "conv", "dw", "bn_act", "res", "pad", "pool", "se", "cat"])
            if kind in ("conv", "dw"):
                k = rng.choice([1, 3]) if kind == "conv" else 3
                stride = rng.choice([1, 2]) if size > 4 else 1
                out = c if kind == "dw" else rng.choice([4, 8, 12])
                groups = (
                    c
                    if kind == "dw"
                    else rng.choice([g for g in (1, 2) if c % g == 0 and out % g == 0])
                )
                conv = nn.Conv2d(c, out, k, stride, k // 2, groups=groups, bias=rng.random() < 0.5)
                self.layers.append(conv)
                self.steps.append(("layer", len(self.layers) - 1))
                c, size = out, (size + 2 * (k // 2) - k) // stride + 1
            elif kind == "bn_act":
                self.layers.append(nn.BatchNorm2d(c))
                self.layers[-1].running_mean.normal_()
                self.layers[-1].running_var.uniform_(0.5, 2.0)
                self.steps.append(("layer", len(self.layers) - 1))
                self.steps.append(("act", rng.choice(["relu", "relu6", "silu", "sigmoid"])))
            elif kind == "res":
                self.layers.append(nn.Conv2d(c, c, 3, 1, 1))
                self.steps.append(("res", len(self.layers) - 1, rng.choice(["none", "relu"])))
            elif kind == "pad" and size > 2:
                self.layers.append(nn.Conv2d(c, c, 3, 2))
                self.steps.append(("padconv", len(self.layers) - 1))
                size = (size + 1 - 3) // 2 + 1
            elif kind == "pool" and size >= 4:
                self.steps.append(("pool", rng.choice(["max", "avg"])))
                size = size // 2
            elif kind == "se":
                self.layers.append(nn.Conv2d(c, 4, 1))
                self.layers.append(nn.Conv2d(4, c, 1))
                self.steps.append(("se", len(self.layers) - 2))
            elif kind == "cat":
                self.layers.append(nn.Conv2d(c, 4, 1))
                self.steps.append(("cat", len(self.layers) - 1))
                c += 4
        self.head = nn.Linear(c, 3)
        self.in_channels = (
            3 if not isinstance(self.layers[0], nn.Conv2d) else self.layers[0].in_channels
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for step in self.steps:
            kind = step[0]
            if kind == "layer":
                x = self.layers[step[1]](x)
            elif kind == "act":
                x = {"relu": F.relu, "relu6": F.relu6, "silu": F.silu, "sigmoid": torch.sigmoid}[
                    step[1]
                ](x)
            elif kind == "res":
                y = self.layers[step[1]](x) + x
                x = F.relu(y) if step[2] == "relu" else y
            elif kind == "padconv":
                x = self.layers[step[1]](F.pad(x, (0, 1, 0, 1)))
            elif kind == "pool":
                x = F.max_pool2d(x, 2) if step[1] == "max" else F.avg_pool2d(x, 2)
            elif kind == "se":
                s = x.mean(dim=(2, 3), keepdim=True)
                s = torch.sigmoid(self.layers[step[1] + 1](F.silu(self.layers[step[1]](s))))
                x = x * s
            elif kind == "cat":
                x = torch.cat([x, self.layers[step[1]](x)], dim=1)
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


@pytest.mark.parametrize(
    "seed", range(int(__import__("os").environ.get("PLUS_TVM_DIFF_SEEDS", 10)))
)
def test_random_cnn_channels_last_equals_torch(seed):
    torch.manual_seed(seed)
    model = RandomCNN(seed).eval()
    x = torch.randn(1, model.in_channels, 12, 12)
    with torch.no_grad():
        want = model(x).numpy()
    options = plus_tvm.Options(conv_layout="nhwc", dispatch_cost_model=False)
    cm = plus_tvm.compile(model, example_args=(x,), options=options)
    np.testing.assert_allclose(cm(x), want, rtol=1e-4, atol=1e-4)
    if any(isinstance(layer, nn.Conv2d) for layer in model.layers):
        assert cm.stats["library_calls"] > 0
