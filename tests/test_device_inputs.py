"""Inputs already on an accelerator are checked where they are and handed to a GPU model by
DLPack: the plain call ``cm(*cuda_tensors)`` makes no host round trip. Here torch's shape-only
``meta`` device stands in for CUDA (the checks read shape and dtype, never the data); a CUDA
machine runs the last test."""

from __future__ import annotations

import re

import numpy as np
import plus_tvm
import pytest
import torch
from plus_tvm.errors import InputError
from plus_tvm.signature import IndexRange, InputSpec, check_inputs, is_device_tensor

SPECS = [InputSpec("x", (None, 8), "float32"), InputSpec("mask", (None, 8), "bool")]


def test_a_device_tensor_is_checked_in_place_and_not_brought_to_the_host():
    x = torch.empty(3, 8, device="meta")
    mask = torch.empty(3, 8, dtype=torch.bool, device="meta")
    out = check_inputs(SPECS, (x, mask))
    assert all(isinstance(a, torch.Tensor) and a.device.type == "meta" for a in out)
    # a transposed view comes back contiguous, still on its device
    t = torch.empty(8, 3, device="meta").t()
    assert check_inputs(SPECS[:1], (t,))[0].is_contiguous()


@pytest.mark.parametrize(
    "x,message",
    [
        (
            torch.empty(3, 8, dtype=torch.float16, device="meta"),
            "expected dtype float32, got float16",
        ),
        (torch.empty(3, 9, device="meta"), "expected shape (?, 8), got (3, 9)"),
    ],
)
def test_a_wrong_device_tensor_gets_the_same_error_as_a_host_one(x, message):
    for value in (x, torch.zeros(x.shape, dtype=x.dtype)):
        with pytest.raises(InputError, match=re.escape(message)):
            check_inputs(SPECS[:1], (value,))


def test_host_inputs_still_come_back_as_numpy_without_a_copy():
    x = torch.randn(2, 8)
    (arr,) = check_inputs(SPECS[:1], (x,))
    assert isinstance(arr, np.ndarray) and arr.ctypes.data == x.data_ptr()
    assert not is_device_tensor(x) and not is_device_tensor(arr)


def test_token_ids_out_of_range_are_refused_with_their_place():
    spec = InputSpec("ids", (1, 4), "int64", IndexRange(0, 9, "the vocabulary"))
    with pytest.raises(InputError, match=r"value 12 at \(0, 2\) is out of range"):
        check_inputs([spec], (torch.tensor([[1, 2, 12, 3]]),))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_cuda_model_takes_cuda_tensors_and_returns_cuda_tensors():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU()).eval()
    x = torch.randn(4, 8)
    cm = plus_tvm.compile(model, "cuda", example_args=(x,))
    got = cm(x.cuda())
    assert got.device.type == "cuda"
    torch.testing.assert_close(got.cpu(), model(x), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_aligned_host_tensor_is_handed_over_without_a_copy(dtype):
    """A CPU torch tensor (aligned, contiguous, writable) reaches the VM by DLPack, bfloat16
    too (numpy has no DLPack code for it: the same memory goes as a torch tensor), so a
    decode step's bfloat16 cache is not copied at every token."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 64)).eval().to(dtype)
    x = torch.randn(4, 64).to(dtype)
    base = torch.empty(4 * 64 + 64, dtype=dtype)  # a 64-byte aligned start inside it
    skip = next(i for i in range(64) if base[i:].data_ptr() % 64 == 0)
    aligned = base[skip : skip + 4 * 64].view(4, 64)
    aligned.copy_(x)
    cm = plus_tvm.compile(model, example_args=(x,))
    (placed,) = cm.prepare(aligned)
    assert placed.data_ptr() == aligned.data_ptr()
    torch.testing.assert_close(cm(aligned), model(x))
