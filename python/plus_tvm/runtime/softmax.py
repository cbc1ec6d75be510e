"""``plus.softmax``: ``softmax(x * scale)`` over the last axis.

Call: ``plus.softmax(x, config, out)``; keys ``axis=<int>`` (only the last axis, ``-1`` or
``ndim-1``, is supported; others are rejected), ``scale=<float>`` (default 1). Written straight
into ``out`` with ``aten._softmax.out``.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._common import ConfigSpec, LibraryKernel, check_last_axis, integer, real
from ._torch import torch

SOFTMAX_SPEC = ConfigSpec("plus.softmax", axis=integer(-1), scale=real(1.0))


class Softmax(LibraryKernel):
    """``plus.softmax(x, config, out)``."""

    spec = SOFTMAX_SPEC
    implementations = ("torch.softmax",)
    cpu_gflops = 18.0  # 128x768, 5 flops per element

    def num_inputs(self, cfg) -> int:
        return 1

    def check(self, cfg, inputs: Sequence[torch.Tensor], out: torch.Tensor) -> None:
        check_last_axis(self.name, cfg.axis, inputs[0].dim())

    def run(self, cfg, inputs: Sequence[torch.Tensor], out: torch.Tensor) -> None:
        x = inputs[0]
        if cfg.scale != 1.0:
            x = x * cfg.scale
        torch.ops.aten._softmax.out(x.contiguous(), -1, False, out=out)
