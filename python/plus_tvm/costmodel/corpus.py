"""The programs ``plus-tvm calibrate`` measures: small torch models drawn from families of
operator shapes (GEMMs, convolutions, normalizations, attention, memory-bound chains and
reductions), each at sizes drawn from a grid, and the zoo's tiny models.

Each family is a function ``(rng) -> (module, inputs, name)``; the grids are data at the top of
the file. A program is drawn by seed, so a calibration is reproducible and two calibrations
with one seed measure the same programs.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
WIDTHS = (8, 16, 32, 64, 96, 128, 256, 384, 512, 768, 1024, 2048, 3072)
CHANNELS = (3, 8, 16, 24, 32, 64, 96, 128, 256)
IMAGES = (7, 8, 14, 16, 28, 32, 56)
ACTIVATIONS = ("none", "relu", "gelu", "silu", "tanh")
UNARY = ("exp", "tanh", "sigmoid", "relu", "gelu", "neg", "sqrt_abs", "square", "erf")
#: unary operations of an elementwise chain at most (GIR builds such chains in seconds since it
#: stops fast-math functions nesting in one expression)
MAX_CHAIN = 6
#: TIR timings of programs whose dot flops exceed this are skipped: untuned TIR GEMMs run at
#: well under a GFLOP/s here, and the model only needs to know they are slow
TIR_FLOP_LIMIT = 3e7


@dataclass(frozen=True)
class Program:
    """One model to measure: ``build()`` gives the module and its example inputs."""

    name: str
    family: str
    build: Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]
    flops: float = 0.0  # dot flops (GEMMs, convolutions, attention)


def _act(name: str, x: torch.Tensor) -> torch.Tensor:
    if name == "relu":
        return F.relu(x)
    if name == "gelu":
        return F.gelu(x)
    if name == "silu":
        return F.silu(x)
    if name == "tanh":
        return torch.tanh(x)
    return x


def _unary(name: str, x: torch.Tensor) -> torch.Tensor:
    if name == "sqrt_abs":
        return torch.sqrt(torch.abs(x))
    if name == "square":
        return x * x
    if name == "neg":
        return -x
    if name == "gelu":
        return F.gelu(x)
    return getattr(torch, name)(x)


class _Fn(nn.Module):
    def __init__(self, fn: Callable, **params: torch.Tensor) -> None:
        super().__init__()
        self.fn = fn
        for key, value in params.items():
            self.register_parameter(key, nn.Parameter(value, requires_grad=False))

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return self.fn(self, *xs)


def _linear(rng: random.Random) -> Program:
    m, k, n = rng.choice(ROWS), rng.choice(WIDTHS), rng.choice(WIDTHS)
    act = rng.choice(ACTIVATIONS)
    lead = (m,) if rng.random() < 0.5 else (1, m)

    def build() -> tuple:
        g = torch.Generator().manual_seed(m * 7 + k * 3 + n)
        w, b = torch.randn(n, k, generator=g) / k**0.5, torch.randn(n, generator=g)
        mod = _Fn(lambda s, x: _act(act, F.linear(x, s.w, s.b)), w=w, b=b)
        return mod, (torch.randn(*lead, k, generator=g),)

    return Program(f"linear-{m}x{k}x{n}-{act}", "linear", build, 2.0 * m * k * n)


def _matmul(rng: random.Random) -> Program:
    b, m, k, n = (
        rng.choice((1, 2, 4, 8, 12)),
        rng.choice(ROWS),
        rng.choice(WIDTHS[:8]),
        rng.choice(ROWS),
    )

    def build() -> tuple:
        g = torch.Generator().manual_seed(b + m + k + n)
        mod = _Fn(lambda s, x, y: torch.matmul(x, y))
        return mod, (torch.randn(b, m, k, generator=g), torch.randn(b, k, n, generator=g))

    return Program(f"bmm-{b}x{m}x{k}x{n}", "matmul", build, 2.0 * b * m * k * n)


def _conv(rng: random.Random) -> Program:
    c, h = rng.choice(CHANNELS), rng.choice(IMAGES)
    depthwise = c > 3 and rng.random() < 0.35
    o = c if depthwise else rng.choice(CHANNELS[1:])
    k = rng.choice((1, 1, 3, 3, 5)) if not depthwise else rng.choice((3, 5))
    stride = rng.choice((1, 1, 2))
    act = rng.choice(("none", "relu", "silu"))
    groups = c if depthwise else 1
    out = (h + 2 * (k // 2) - k) // stride + 1

    def build() -> tuple:
        g = torch.Generator().manual_seed(c * 31 + h * 7 + o + k)
        w = torch.randn(o, c // groups, k, k, generator=g) / (c * k * k / groups) ** 0.5
        bias = torch.randn(o, generator=g)
        mod = _Fn(
            lambda s, x: _act(act, F.conv2d(x, s.w, s.b, stride, k // 2, 1, groups)), w=w, b=bias
        )
        return mod, (torch.randn(1, c, h, h, generator=g),)

    flops = 2.0 * o * out * out * (c // groups) * k * k
    kind = "dw" if depthwise else "conv"
    return Program(f"{kind}-{c}x{h}-{o}k{k}s{stride}-{act}", "conv", build, flops)


def _norm(rng: random.Random) -> Program:
    m, c = rng.choice(ROWS), rng.choice(WIDTHS)
    kind = rng.choice(("layer_norm", "rms_norm", "softmax", "log_softmax"))

    def build() -> tuple:
        g = torch.Generator().manual_seed(m * 13 + c)
        weight, bias = torch.randn(c, generator=g), torch.randn(c, generator=g)

        def fn(s: nn.Module, x: torch.Tensor) -> torch.Tensor:
            if kind == "layer_norm":
                return F.layer_norm(x, (c,), s.w, s.b)
            if kind == "rms_norm":
                return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * s.w
            if kind == "softmax":
                return torch.softmax(x, -1)
            return torch.log_softmax(x, -1)

        return _Fn(fn, w=weight, b=bias), (torch.randn(1, m, c, generator=g),)

    return Program(f"{kind}-{m}x{c}", "norm", build)


def _attention(rng: random.Random) -> Program:
    heads, s, d = (
        rng.choice((1, 2, 4, 8, 12)),
        rng.choice((8, 16, 32, 64, 128, 256)),
        rng.choice((16, 32, 64)),
    )
    causal = rng.random() < 0.4

    def build() -> tuple:
        g = torch.Generator().manual_seed(heads * 100 + s + d)
        mod = _Fn(lambda _s, q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
        return mod, tuple(torch.randn(1, heads, s, d, generator=g) for _ in range(3))

    flops = 4.0 * heads * s * s * d
    return Program(f"sdpa-{heads}x{s}x{d}{'-causal' if causal else ''}", "attention", build, flops)


def _shape(rng: random.Random) -> tuple[int, ...]:
    rank = rng.choice((2, 3, 4))
    dims = [rng.choice((1, 2, 4, 8, 16, 32, 64, 128, 256, 768)) for _ in range(rank)]
    while _numel(dims) > 1 << 21:
        dims[dims.index(max(dims))] //= 2
    return tuple(dims)


def _numel(dims: list[int] | tuple[int, ...]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def _elementwise(rng: random.Random) -> Program:
    shape = _shape(rng)
    ops = [rng.choice(UNARY) for _ in range(rng.randint(1, MAX_CHAIN))]
    broadcast = rng.random() < 0.5

    def build() -> tuple:
        g = torch.Generator().manual_seed(_numel(shape) + len(ops))
        bias = torch.randn(shape[-1], generator=g)

        def fn(s: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            for k, op in enumerate(ops):
                x = _unary(op, x)
                x = x + (s.b if broadcast and k == 0 else y) if k % 2 == 0 else x * y
            return x

        return _Fn(fn, b=bias), (torch.randn(shape, generator=g), torch.randn(shape, generator=g))

    return Program(f"ew-{'x'.join(map(str, shape))}-{'-'.join(ops)}", "elementwise", build)


def _reduction(rng: random.Random) -> Program:
    shape = _shape(rng)
    axis = rng.randrange(len(shape))
    kind = rng.choice(("sum", "mean", "amax", "var"))

    def build() -> tuple:
        g = torch.Generator().manual_seed(_numel(shape) + axis)

        def fn(_s: nn.Module, x: torch.Tensor) -> torch.Tensor:
            if kind == "var":
                return torch.var(x, axis, keepdim=True)
            if kind == "amax":
                return x.max(dim=axis, keepdim=True).values
            return getattr(torch, kind)(torch.exp(x) if kind == "sum" else x, axis, keepdim=True)

        return _Fn(fn), (torch.randn(shape, generator=g),)

    return Program(f"reduce-{kind}{axis}-{'x'.join(map(str, shape))}", "reduction", build)


def _movement(rng: random.Random) -> Program:
    shape = _shape(rng)
    perm = list(range(len(shape)))
    rng.shuffle(perm)
    kind = rng.choice(("transpose", "concat", "slice"))

    def build() -> tuple:
        g = torch.Generator().manual_seed(_numel(shape) + sum(perm))

        def fn(_s: nn.Module, x: torch.Tensor) -> torch.Tensor:
            if kind == "transpose":
                return x.permute(*perm).contiguous() + 1.0
            if kind == "concat":
                return torch.cat([x, x * 2.0], dim=perm[0])
            return x[..., : max(1, shape[-1] // 2)] * 3.0

        return _Fn(fn), (torch.randn(shape, generator=g),)

    return Program(f"{kind}-{'x'.join(map(str, shape))}-{perm}", "movement", build)


def _pool(rng: random.Random) -> Program:
    c, h = rng.choice(CHANNELS[1:]), rng.choice(IMAGES)
    kind = rng.choice(("max", "avg", "global"))

    def build() -> tuple:
        g = torch.Generator().manual_seed(c * 5 + h)

        def fn(_s: nn.Module, x: torch.Tensor) -> torch.Tensor:
            if kind == "global":
                return x.mean((2, 3), keepdim=True) * x
            pool = F.max_pool2d if kind == "max" else F.avg_pool2d
            return pool(x, 3, 2, 1)

        return _Fn(fn), (torch.randn(1, c, h, h, generator=g),)

    return Program(f"pool-{kind}-{c}x{h}", "pool", build)


#: family -> (draw, programs in a full calibration, in a quick one)
FAMILIES: dict[str, tuple[Callable[[random.Random], Program], int, int]] = {
    "linear": (_linear, 70, 2),
    "matmul": (_matmul, 16, 1),
    "conv": (_conv, 50, 1),
    "norm": (_norm, 30, 1),
    "attention": (_attention, 14, 0),
    "elementwise": (_elementwise, 30, 1),
    "reduction": (_reduction, 20, 1),
    "movement": (_movement, 12, 0),
    "pool": (_pool, 10, 0),
}


def programs(quick: bool = False, seed: int = 0) -> list[Program]:
    """The drawn programs of every family (distinct names), in family order."""
    out: list[Program] = []
    for family, (draw, full, small) in FAMILIES.items():
        rng = random.Random(f"{seed}:{family}")
        names: set[str] = set()
        want = small if quick else full
        for _ in range(want * 20):
            if len(names) == want:
                break
            program = draw(rng)
            if program.name not in names:
                names.add(program.name)
                out.append(program)
    return out
