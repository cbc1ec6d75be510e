"""The run a half-precision result is judged against (:mod:`plus_tvm.accuracy`'s contract).

The same rounded weights and inputs, computed in float64; in float32 where torch has no
float64 kernel for an op (a mixture of experts' grouped matmul). Either is far more precise
than the half-precision runs judged against it. The model itself is not changed (a copy is
widened: ``nn.Module.to`` works in place, and a compiled model may share its weights).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch

__all__ = ["widened_run"]


def widened_run(half: torch.nn.Module, args: Sequence) -> object:
    """``half``'s outputs from its weights and ``args`` widened to float64 (float32 where
    torch has no float64 kernel), as the module returns them."""
    with torch.no_grad():
        for wide in (torch.float64, torch.float32):
            model = copy.deepcopy(half).to(wide)
            try:
                return model(*[_cast(a, wide) for a in args])
            except RuntimeError as err:
                if wide is torch.float32 or "Double" not in str(err):
                    raise
    raise AssertionError("unreachable")  # (the float32 pass returns or raises)


def _cast(a: object, dtype: torch.dtype) -> object:
    return a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
