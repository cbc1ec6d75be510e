"""``plus.log_softmax``: ``log(softmax(x))`` over the last axis (language-model heads' log
probabilities, CTC heads).

Call: ``plus.log_softmax(x, config, out)``; key ``axis=<int>`` (only the last axis, ``-1`` or
``ndim-1``). Written straight into ``out`` with ``aten._log_softmax.out``.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._common import ConfigSpec, LibraryKernel, check_last_axis, integer
from ._torch import torch

LOG_SOFTMAX_SPEC = ConfigSpec("plus.log_softmax", axis=integer(-1))


class LogSoftmax(LibraryKernel):
    """``plus.log_softmax(x, config, out)``."""

    spec = LOG_SOFTMAX_SPEC
    implementations = ("torch.log_softmax",)
    cpu_gflops = 18.0  # like plus.softmax: 5 flops per element at 128x768

    def num_inputs(self, cfg) -> int:
        return 1

    def check(self, cfg, inputs: Sequence[torch.Tensor], out: torch.Tensor) -> None:
        check_last_axis(self.name, cfg.axis, inputs[0].dim())

    def run(self, cfg, inputs: Sequence[torch.Tensor], out: torch.Tensor) -> None:
        torch.ops.aten._log_softmax.out(inputs[0].contiguous(), -1, False, out=out)
