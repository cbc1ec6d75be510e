"""The half-precision accuracy contract (issue 36), shared by the tests and the GPU check.

A model run in ``bf16`` or ``fp16`` is judged against a float64 run of the same rounded
weights and inputs: plus's relative error (max |err| / max |ref|) is at most
:data:`TORCH_FACTOR` times torch eager's own in that dtype, plus a small :data:`FLOOR` (a few
units in the last place of the dtype: torch's own error can be about zero). Only numpy here, so
that :mod:`plus_tvm.gpu.check` uses it with TVM's runtime library alone.
"""

from __future__ import annotations

import numpy as np

TORCH_FACTOR = 2.0
FLOOR = {"fp32": 1e-6, "bf16": 2.0**-7, "fp16": 2.0**-10}
# the dtype names the contract knows, as torch and numpy spell them
DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    """max |got - ref| / max |ref|, in float64; NaN in ``got`` where ``ref`` is finite counts
    as an infinite error (NaN in both: none)."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if got.shape != ref.shape:
        raise ValueError(f"output shape {got.shape} is not the reference's {ref.shape}")
    if not got.size:
        return 0.0
    diff = np.abs(got - ref)
    diff[np.isnan(got) & ~np.isnan(ref)] = np.inf
    diff[np.isnan(got) & np.isnan(ref)] = 0.0
    scale = float(np.nanmax(np.abs(ref))) if not np.isnan(ref).all() else 0.0
    return float(diff.max()) / max(scale, 1e-12)


def bound(torch_err: float, dtype: str) -> float:
    """The largest error plus may have where torch eager's own is ``torch_err``."""
    if dtype not in FLOOR:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(FLOOR)}")
    return TORCH_FACTOR * torch_err + FLOOR[dtype]


def within(plus_err: float, torch_err: float, dtype: str) -> bool:
    """Whether plus's error keeps the contract (a NaN error never does)."""
    return bool(plus_err <= bound(torch_err, dtype))
