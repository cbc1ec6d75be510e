"""fold_divmod: a reshape's ``//`` and ``%`` over symbolic sizes fold where the iterators'
ranges prove them, and stay where they do not (an iterator one past its size)."""

from __future__ import annotations

import pytest
from plus_tvm.tir_blocks.symbolic_divmod import fold_divmod
from tvm import tirx

b, n, d = (tirx.Var(name, "int64") for name in "bnd")
i, j, k = (tirx.Var(name, "int64") for name in "ijk")


@pytest.mark.parametrize(
    "expr,extents,want",
    [
        (tirx.floormod(i * n + j, b * n), {i: b, j: n}, "i * n + j"),
        (tirx.floormod(tirx.floordiv(i, n), b), {i: b * n}, "i // n"),
        (tirx.floordiv(i * n + j, n), {i: b, j: n}, "i"),
        (tirx.floordiv(i * (n * d) + j * d + k, d), {i: b, j: n, k: d}, "i * n + j"),
        (
            tirx.floormod(i * 3072 + k, b * 3072),
            {i: b, k: tirx.IntImm("int64", 3072)},
            "i * T.int64(3072) + k",
        ),
    ],
)
def test_provable_folds(expr, extents, want):
    assert str(fold_divmod(expr, extents)) == want


@pytest.mark.parametrize(
    "expr,extents",
    [
        (tirx.floormod(i * n + j, b * n), {i: b + 1, j: n}),  # i can reach b
        (tirx.floormod(i * n + j, b * n), {i: b, j: n + 1}),  # j can reach n
        (tirx.floordiv(i * n + j, n), {i: b, j: n + 1}),
        (tirx.floormod(tirx.floordiv(i, n), b), {i: b * n + 1}),
        (tirx.floormod(i * n - j, b * n), {i: b, j: n}),  # may be negative
        (tirx.floormod(i * j, b * n), {i: b, j: n}),  # not linear in the iterators
    ],
)
def test_unprovable_ones_stay(expr, extents):
    assert str(fold_divmod(expr, extents)) == str(expr)
