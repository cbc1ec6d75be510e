"""``plus.rms_norm``: ``x * rsqrt(mean(x^2, -1) + eps) * gamma`` (T5LayerNorm, LLaMA RMSNorm).

Call: ``plus.rms_norm(x, [gamma], config, out)``; keys ``gamma=0|1``, ``eps=<float>`` (default
1e-6). Runs ``F.rms_norm`` (torch's fused kernel) and copies into ``out``.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._common import ConfigSpec, LibraryKernel, flag, real, write_out
from ._torch import F, torch

RMS_NORM_SPEC = ConfigSpec("plus.rms_norm", gamma=flag(), eps=real(1e-6))


class RMSNorm(LibraryKernel):
    """``plus.rms_norm(x, [gamma], config, out)``."""

    spec = RMS_NORM_SPEC
    implementations = ("torch.rms_norm",)
    cpu_gflops = 12.0  # 128x768, 4 flops per element

    def num_inputs(self, cfg) -> int:
        return 1 + cfg.gamma

    def run(self, cfg, inputs: Sequence[torch.Tensor], out: torch.Tensor) -> None:
        x = inputs[0]
        gamma = inputs[1] if cfg.gamma else None
        write_out(out, F.rms_norm(x, (x.shape[-1],), gamma, cfg.eps))
