"""amax / amin, scatter_add, scatter_reduce, index_add, index_put (integer and boolean-mask
indices, accumulate) and advanced indexing (``x[:, i, j]``, ``h[mask]``) imported with torch's
semantics (python/plus_tvm/torch_{minmax,scatter,advanced_index}_converters.py): each module
is compiled for llvm and compared with torch eager on several inputs."""

from __future__ import annotations

import plus_tvm
import pytest
import torch


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def _outputs(value):
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _check(fn, *input_sets):
    """Compile ``fn`` on the first inputs; every input set gives torch's result."""
    model = Fn(fn)
    cm = plus_tvm.compile(model, example_args=input_sets[0], target="llvm")
    assert not cm.stats.get("host_nodes"), "compiled, not run through torch on the host"
    for inputs in input_sets:
        want = _outputs(model(*inputs))
        got = _outputs(cm(*inputs))
        assert len(got) == len(want)
        for g, w in zip(got, want):
            g = torch.as_tensor(g)
            assert g.dtype == w.dtype
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6, equal_nan=True)


# ------------------------------------------------------------------------------ amax / amin
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_amax_amin_over_several_dims_with_keepdim(dtype):
    def fn(x):
        return (
            torch.amax(x, dim=(0, -1), keepdim=True),
            torch.amin(x, dim=(-2, 2)),
            torch.amax(x, dim=1),
            torch.amin(x),  # dim=(): every axis
        )

    gen = torch.Generator().manual_seed(0)
    xs = [(torch.randint(-50, 50, (3, 4, 5), generator=gen).to(dtype),) for _ in range(2)]
    _check(fn, *xs)


def test_amax_of_a_bool_tensor():
    x = torch.tensor([[True, False], [False, False]])
    _check(lambda m: (torch.amax(m, dim=1), torch.amin(m, dim=0)), (x,), (~x,))


# ----------------------------------------------------------------------------- scatter_add
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
def test_scatter_add_accumulates_duplicate_indices(dtype):
    def fn(x, index, src):
        return x.scatter_add(1, index, src), x.scatter_add(-2, index[:, :2] // 2, src)

    x = torch.arange(12).reshape(3, 4).to(dtype)
    src = (torch.arange(15).reshape(3, 5) * 3 - 7).to(dtype)  # larger than index: torch cuts
    index = torch.tensor([[0, 0, 1], [3, 3, 3], [1, 2, 1]])  # duplicates within a row
    other = torch.tensor([[2, 2, 2], [0, 1, 0], [3, 0, 3]])
    _check(fn, (x, index, src), (x * 2, other, src))


# -------------------------------------------------------------------------- scatter_reduce
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_scatter_reduce_every_mode(dtype, include_self):
    modes = ("sum", "prod", "mean", "amax", "amin")

    def fn(x, index, src):
        return tuple(
            x.scatter_reduce(-1, index, src, mode, include_self=include_self) for mode in modes
        )

    gen = torch.Generator().manual_seed(1)
    x = torch.randint(-9, 10, (3, 5), generator=gen).to(dtype)
    src = torch.randint(-9, 10, (3, 4), generator=gen).to(dtype)
    # duplicates, and positions no index names (they keep x's value)
    index = torch.tensor([[0, 1, 1, 1], [4, 4, 0, 4], [2, 2, 2, 2]])
    other = torch.tensor([[3, 3, 0, 1], [1, 1, 1, 1], [0, 4, 0, 4]])
    _check(fn, (x, index, src), (-x, other, src * 3))


def test_scatter_reduce_along_dim_zero_in_float():
    def fn(x, index, src):
        return x.scatter_reduce(0, index, src, "mean", include_self=False)

    x = torch.randn(4, 3)
    index = torch.tensor([[0, 3, 3], [0, 3, 1]])
    _check(fn, (x, index, torch.randn(2, 3)))


# ------------------------------------------------------------------------------- index_add
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_index_add_with_alpha_and_duplicate_indices(dtype):
    def fn(x, index, src, cols, by_cols):
        return x.index_add(0, index, src, alpha=3), x.index_add(-1, cols, by_cols)

    x = torch.arange(20).reshape(5, 4).to(dtype)
    src = torch.arange(-8, 8).reshape(4, 4).to(dtype)
    by_cols = torch.arange(-7, 8).reshape(5, 3).to(dtype)
    first = (x, torch.tensor([0, 2, 0, 4]), src, torch.tensor([1, 1, 3]), by_cols)
    second = (x, torch.tensor([3, 3, 3, 1]), src, torch.tensor([0, 2, 0]), by_cols)
    _check(fn, first, second)


# ------------------------------------------------------------------ index_put (int indices)
def test_index_put_accumulate_with_duplicate_and_negative_indices():
    def fn(x, rows, cols, v):
        return (
            x.index_put((rows,), v, accumulate=True),  # whole rows, -1 is the last one
            x.index_put((rows, cols), v[:, 0], accumulate=True),  # single elements
            x.index_put((rows, cols), v[:, 0]),  # assignment
        )

    x = torch.zeros(4, 5)
    rows = torch.tensor([1, -1, 1, 3])
    cols = torch.tensor([0, 2, 0, -5])
    v = torch.arange(20.0).reshape(4, 5)
    _check(fn, (x, rows, cols, v), (x + 1, torch.tensor([0, 0, 0, 0]), cols, v))


def test_index_put_along_a_middle_axis_and_with_a_slice_between():
    def fn(x, i, v):
        y = x.clone()
        y[:, i] += v  # index_put(accumulate) with a leading slice
        z = x.clone()
        z[i, :, i] = 7  # index tensors apart: their axis comes first
        return y, z

    x = torch.randn(4, 4, 4)
    i = torch.tensor([1, 1, 2])
    v = torch.arange(48.0).reshape(4, 3, 4)
    _check(fn, (x, i, v), (x, torch.tensor([0, 3, 3]), v))


def test_index_put_out_of_range_names_the_node():
    def fn(x, i):
        return x.index_put((i,), torch.tensor(1.0), accumulate=True)

    cm = plus_tvm.compile(
        Fn(fn), example_args=(torch.zeros(4), torch.tensor([0, 1])), target="llvm"
    )
    with pytest.raises(plus_tvm.errors.IndexOutOfRangeError, match="index_put"):
        cm(torch.zeros(4), torch.tensor([0, 4]))


# ------------------------------------------------------------------ boolean-mask assignment
def test_mask_assignment_of_a_number_a_row_and_one_value_per_position():
    def fn(x, v, z):
        a = x.clone()
        a[x > 0] = 0  # y[mask] = 0
        b = x.clone()
        b[x[:, 0] > 0] = v  # a row broadcast to every selected row
        c = x.clone()
        c[x < 0] = z[x < 0]  # one value per True position, in row-major order
        d = x.clone()
        d[x > 0] += 2.5  # accumulate
        return a, b, c, d

    gen = torch.Generator().manual_seed(2)
    x = torch.randn(4, 3, generator=gen)
    v, z = torch.randn(3, generator=gen), torch.randn(4, 3, generator=gen)
    everything_negative = -x.abs() - 1  # a mask of all False for a, b and d
    _check(fn, (x, v, z), (everything_negative, v, z), (x.abs() + 1, v, z))


def test_mask_assignment_in_integers_with_a_2d_mask_over_a_3d_tensor():
    def fn(x, m, rows):
        a = x.clone()
        a[m] = rows  # each selected [i, j] gets a row of length 5
        b = x.clone()
        b[:, m[0]] = -1  # a mask after a slice
        return a, b

    x = torch.arange(60).reshape(3, 4, 5)
    m = torch.tensor([[True, False, True, False]] * 3)
    _check(fn, (x, m, torch.arange(5)), (x, torch.zeros(3, 4, dtype=torch.bool), torch.arange(5)))


# --------------------------------------------------------------------- boolean-mask gather
def test_mask_gather_has_a_data_dependent_length():
    def fn(x, h):
        return h[x > 0], h[:, x[0] > 0] * 2

    x = torch.tensor([[1.0, -1.0, 2.0], [0.5, 3.0, -2.0]])
    h = torch.arange(6.0).reshape(2, 3)
    _check(fn, (x, h), (-x.abs(), h), (x.abs() + 1, h + 1))  # some, none, all selected


# ------------------------------------------------------------------------ advanced indexing
def test_index_tensor_with_slices_before_and_between_index_tensors():
    def fn(x, i, j):
        return x[:, i, j], x[i, :, j], x[i[:, None], i], x[..., -1, i]

    x = torch.arange(60.0).reshape(3, 4, 5)
    i = torch.tensor([0, 2, -1])
    j = torch.tensor([4, 0, 1])
    _check(fn, (x, i, j), (x, torch.tensor([1, 1, 0]), torch.tensor([-1, 2, 3])))


def test_a_mask_mixed_with_integer_indices_is_a_clear_error():
    def fn(x, i):  # x[mask, i] = 0: the mask's count must broadcast with i, known only at run
        return torch.ops.aten.index_put(x, [x[:, 0] > 0, i], torch.tensor(0.0))

    args = (torch.randn(3, 4), torch.tensor([0, 1, 1]))
    with pytest.raises(plus_tvm.errors.UnsupportedOperatorError) as info:
        plus_tvm.compile(Fn(fn), example_args=args, target="llvm")
    message = str(info.value)
    assert "index_put" in message and "combined with integer index" in message
    assert "test_torch_index_converters.py" in message  # the node's source line


# ------------------------------------------------------------------- arange, negative step
def test_arange_with_a_negative_step_has_torch_length_and_values():
    def fn(x):
        n = x.shape[0]
        return (
            torch.arange(n, -n, -1) + x.sum().long(),  # Funnel's relative positions
            torch.arange(5.0, -1.0, -1.5) * x.mean(),
            torch.arange(n, 0, -3, dtype=torch.uint8),
        )

    _check(fn, (torch.ones(12),), (torch.full((12,), 2.0),))


def test_a_single_index_tensor_counts_negatives_from_the_end():
    def fn(x, i):
        return x[:, i], x[i], x[..., i[0]]

    x = torch.arange(60.0).reshape(3, 4, 5)
    i = torch.tensor([[0, -1], [2, 2]])
    _check(fn, (x, i), (x, torch.tensor([[1, 0], [-3, 2]])))


def test_nan_propagates_through_amax_and_scatter_reduce_as_in_torch():
    nan = float("nan")

    def fn(x, index, src):
        reduced = tuple(
            x.scatter_reduce(1, index, src, mode, include_self=include_self)
            for mode in ("amax", "amin")
            for include_self in (True, False)
        )
        return (torch.amax(x, -1), torch.amin(src, 0), *reduced)

    x = torch.tensor([[0.0, 0.0, 1.0, nan], [2.0, 1.0, 0.0, -1.0]])
    index = torch.tensor([[1, 1, 2, 2, 0, 0, 3], [0, 0, 0, 1, 1, 2, 3]])
    src = torch.tensor([[3.0, nan, nan, 0.5, 1.0, nan, 7.0], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, nan]])
    _check(fn, (x, index, src))
