"""max / min / argmax / argmin / amax / amin / maximum / minimum against torch eager, NaN included
(python/plus_tvm/torch_arg_extremes.py, torch_minmax_converters.py, passes/propagate_nan.py).

torch's rule: a NaN is the extreme of its row (the value is NaN, the index that of the first
NaN); otherwise the index is that of the first extreme value. TVM 0.27 returned a finite value
and another index for ``max.dim`` / ``argmax`` / ``argmin`` of a row holding a NaN, and had no
converter for ``min.dim`` (it ran on the host); ``maximum`` / ``amax`` / ``max()`` of float16 /
bfloat16 tensors dropped a NaN (PropagateNaN's half-precision form compared ``a != a``, which
TVM folds to false); ``max()`` / ``maximum`` of bool tensors failed to compile; rows of
infinities (or of the finite extremes) got index -1 and a finite max / min (TOPI's reductions
start from the lowest / highest finite value)."""

from __future__ import annotations

import warnings

import plus_tvm
import pytest
import torch
from plus_tvm.options import Options

FLOATS = (torch.float32, torch.bfloat16, torch.float16)


class Extremes(torch.nn.Module):
    """Every form of max / min torch exports (flat outputs)."""

    def __init__(self, with_arg: bool = True) -> None:
        super().__init__()
        self.with_arg = with_arg  # torch's argmax / argmin refuse bool

    def forward(self, x, y):
        v0, i0 = torch.max(x, 1)
        v1, i1 = torch.min(x, -1)
        v2, i2 = torch.max(x, 0, keepdim=True)
        v3, i3 = x.min(2, keepdim=True)
        out = [v0, i0, v1, i1, v2, i2, v3, i3]
        if self.with_arg:
            out += [
                torch.argmax(x, 1),
                torch.argmin(x, -1, keepdim=True),
                torch.argmax(x),  # of the flattened tensor
                torch.argmin(x, keepdim=True),
            ]
        out += [
            torch.amax(x, (0, 2)),
            torch.amin(x, 1),
            torch.amax(x, -1),
            torch.amin(x, -1, keepdim=True),
            torch.max(x),
            torch.min(x),
            torch.maximum(x, y),
            torch.minimum(x, y),
            torch.max(x, y),
            torch.min(x, y),
        ]
        return tuple(out)


def _with_specials(shape: tuple, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Small integers (many ties) with NaN, +-inf, -0.0 sprinkled in, an all-NaN row, a row of
    NaN after an inf and a row without NaN."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-3, 4, shape, generator=g).double()
    r = torch.rand(shape, generator=g)
    x[r < 0.12] = float("nan")
    x[(r >= 0.12) & (r < 0.17)] = float("inf")
    x[(r >= 0.17) & (r < 0.22)] = -float("inf")
    x[(r >= 0.22) & (r < 0.30)] = -0.0
    x[0, 0, :] = float("nan")
    x[1, 1, :] = torch.tensor([float("inf"), -float("inf"), float("nan"), 1.0, float("nan")])
    x[2, :, :] = torch.arange(shape[1] * shape[2]).reshape(shape[1], shape[2]) % 3  # no NaN
    # rows of infinities, and the finite extremes, where TOPI's reductions start from
    lowest, highest = torch.finfo(dtype).min, torch.finfo(dtype).max
    x[3, :, :] = -float("inf")
    x[3, 2, :2] = lowest  # argmax along dim 1 of x[3, :, 0]: 2
    x[3, 5, :] = float("inf")  # argmin along dim 2: 0
    x[3, 1, :] = torch.tensor([highest, float("inf"), float("inf"), float("inf"), lowest])
    return x.to(dtype)


def _random(shape: tuple, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype)


def _compile(model: torch.nn.Module, args: tuple) -> object:
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no op may go to the host
        return plus_tvm.compile(model, example_args=args, target="llvm")


def _assert_same(got: tuple, want: tuple) -> None:
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        g = torch.as_tensor(g)
        assert g.dtype == w.dtype and g.shape == w.shape, (k, g.dtype, w.dtype, g.shape, w.shape)
        # values are copies of input elements and indices integers: exact, NaN where torch's is
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True, msg=f"output {k}")


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_float_extremes_match_torch_nan_included(dtype):
    shape = (4, 6, 5)
    model = Extremes().eval()
    special = (_with_specials(shape, dtype, 0), _with_specials(shape, dtype, 1))
    cm = _compile(model, special)
    inf = torch.full(shape, float("inf"), dtype=dtype)
    randoms = (_random(shape, dtype, 2), _random(shape, dtype, 3))
    for args in (special, randoms, (-inf, inf), (inf, -inf)):
        _assert_same(cm(*args), model(*args))


@pytest.mark.parametrize("dtype", (torch.int64, torch.int32, torch.bool), ids=str)
def test_integer_and_bool_extremes_match_torch(dtype):
    shape = (3, 5, 4)
    model = Extremes(with_arg=dtype != torch.bool).eval()
    g = torch.Generator().manual_seed(0)
    args = tuple(torch.randint(-2, 3, shape, generator=g).to(dtype) for _ in range(2))
    cm = _compile(model, args)
    _assert_same(cm(*args), model(*args))
    if dtype != torch.bool:  # rows at the dtype's extremes, where TOPI's argmax starts from
        x = args[0].clone()
        x[0, :, :] = torch.iinfo(dtype).min
        x[1, :, :] = torch.iinfo(dtype).max
        x[2, 3, :] = torch.iinfo(dtype).min
        _assert_same(cm(x, args[1]), model(x, args[1]))


def test_a_0d_tensor_is_its_own_extreme():
    class Scalar(torch.nn.Module):
        def forward(self, x):
            v, i = torch.max(x, 0)
            w, j = torch.min(x, -1, keepdim=True)
            return v, i, w, j, torch.argmax(x), torch.argmin(x, 0)

    for value in (2.5, float("nan")):
        x = torch.tensor(value)
        _assert_same(_compile(Scalar(), (x,))(x), Scalar()(x))


def test_min_dim_compiles_without_the_host():
    """min.dim had no converter: with host_fallback off it was refused."""

    class MinDim(torch.nn.Module):
        def forward(self, x):
            return torch.min(x, 1)[1]

    x = torch.tensor([[1.0, float("nan"), -2.0], [3.0, -2.0, -2.0]])
    cm = plus_tvm.compile(MinDim(), example_args=(x,), options=Options(host_fallback=False))
    assert cm(x).tolist() == [1, 1]

