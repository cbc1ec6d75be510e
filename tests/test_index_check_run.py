"""``plus.check_indices`` at run time (runtime/index_check.py): its fast range test (a min and a
max against one extent) accepts exactly the range ``first_out_of_range`` does, on both sides of
every bound, for a decode step's few ids and for larger index tensors."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from plus_tvm.runtime import index_check


def check(values: np.ndarray, extent: int, negative: bool, last: bool = False):
    config = index_check.config_text("take", "n1", negative=negative, last=last, source="ids")
    return index_check.run(tvm.runtime.tensor(values), [extent] * max(1, values.shape[-1]), config)


@pytest.mark.parametrize("size", [3, 100])  # (Python's min / max under 65 values, numpy's above)
@pytest.mark.parametrize("negative", [False, True])
@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_bounds_on_both_sides(size, negative, dtype):
    n = 50
    low = -n if negative else 0
    for ok in (low, n - 1):
        values = np.full((2, size // 2 + 1), 7, dtype=dtype)
        values[1, -1] = ok
        out = check(values, n, negative)
        assert out.numpy().dtype == dtype and np.array_equal(out.numpy(), values)
    for bad in (low - 1, n):
        values = np.full((2, size // 2 + 1), 7, dtype=dtype)
        values[1, -1] = bad
        with pytest.raises(RuntimeError, match=rf"index {bad} at position \[1, {size // 2}\].*"):
            check(values, n, negative)


def test_result_is_a_copy_and_empty_indices_pass():
    values = np.array([[1], [2]], dtype=np.int64)
    src = tvm.runtime.tensor(values)
    out = index_check.run(src, [5], index_check.config_text("take", "n", False, False))
    assert np.array_equal(out.numpy(), values)
    assert np.from_dlpack(out).ctypes.data != np.from_dlpack(src).ctypes.data
    assert check(np.zeros((0, 3), dtype=np.int64), 1, False).numpy().shape == (0, 3)


def test_per_coordinate_extents_still_checked():
    """``last=1`` (gather_nd): each coordinate against its own extent (the slow path)."""
    config = index_check.config_text("gather_nd", "n", False, True)
    ok = np.array([[1, 4]], dtype=np.int64)
    assert np.array_equal(index_check.run(tvm.runtime.tensor(ok), [2, 5], config).numpy(), ok)
    with pytest.raises(RuntimeError, match="coordinate 0"):
        index_check.run(tvm.runtime.tensor(np.array([[2, 4]], dtype=np.int64)), [2, 5], config)
