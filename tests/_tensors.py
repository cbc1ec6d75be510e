"""Test helpers shared by the kernel tests: torch tensors to and from TVM (bfloat16 through
ml_dtypes, as numpy has none), a one-call executable of a ``plus.*`` packed kernel, and torch's
own form of every activation a kernel config names."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch
import tvm
from torch.nn import functional as F  # noqa: N812
from tvm import relax

# The activations of plus_tvm.runtime._common (ACTIVATIONS) as torch computes them: the
# references the kernels' outputs are checked against.
TORCH_ACTIVATIONS = {
    "none": lambda t: t,
    "relu": F.relu,
    "relu6": F.relu6,
    "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "silu": F.silu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
}


def to_tvm(t: torch.Tensor):
    """``t`` as a TVM CPU tensor (a copy)."""
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: ml_dtypes' (TVM's)
        return tvm.runtime.tensor(t.view(torch.int16).numpy().view(ml_dtypes.bfloat16))
    return tvm.runtime.tensor(t.numpy())


def from_tvm(t) -> torch.Tensor:
    """A TVM CPU tensor as a torch tensor."""
    arr = t.numpy()
    if arr.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(arr)


def packed_call_vm(kernel: str, shapes: list, config: str, out_shape: tuple, dtypes=None):  # noqa: ANN001, ANN201
    """The VM function ``main(in0, in1, ...)`` calling ``kernel`` once in destination-passing
    style with ``config``; ``dtypes``: each input's dtype (float32 where not given), the
    output float32."""
    dtypes = dtypes or ["float32"] * len(shapes)
    bb = relax.BlockBuilder()
    params = [
        relax.Var(f"in{i}", relax.TensorType(s, d)) for i, (s, d) in enumerate(zip(shapes, dtypes))
    ]
    with bb.function("main", params):
        out = bb.emit(
            relax.call_dps_packed(
                kernel,
                [*params, tvm.ir.StringImm(config)],
                out_ty=relax.TensorType(out_shape, "float32"),
            )
        )
        bb.emit_func_output(out)
    return relax.VirtualMachine(tvm.compile(bb.get(), target="llvm"), tvm.cpu())["main"]


def gemv_stats() -> dict:
    """The native GEMV's counters and limits (``native/gemv.cc``: calls, float_calls,
    max_rows, available)."""
    import json

    from plus_tvm.runtime import native

    return json.loads(str(native.function("gemv_half_stats")()))


def require_native_gemv() -> None:
    """Fail where the native kernels are unavailable; skip where the CPU has no AVX2 + FMA
    (the GEMV then declines every call)."""
    import plus_tvm.runtime as rt
    import pytest
    from plus_tvm.runtime import native

    if not rt.use_native():
        pytest.fail(f"native kernels unavailable: {native.status()['reason']}")
    if not gemv_stats()["available"]:
        pytest.skip("the CPU has no AVX2 + FMA: the GEMV declines every call")
