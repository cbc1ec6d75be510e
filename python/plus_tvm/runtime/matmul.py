"""``plus.matmul``: ``out = scale * (A @ B) + bias`` with broadcast batch dims.

Call: ``plus.matmul(a, b, [bias], config, out)``; ``a`` is ``[..., M, K]`` (``[..., K, M]`` if
``ta=1``), ``b`` is ``[..., K, N]`` (``[..., N, K]`` if ``tb=1``), ``bias`` broadcasts to
``[..., N]``. Keys ``ta=0|1``, ``tb=0|1``, ``scale=<float>`` (default 1), ``bias=0|1``.

Transposes are strided views (BLAS takes them without copying); the product is written into
``out`` by ``torch.matmul(..., out=out)``; scale and bias are applied in place.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._common import ConfigSpec, LibraryKernel, flag, real

MATMUL_SPEC = ConfigSpec("plus.matmul", ta=flag(), tb=flag(), scale=real(1.0), bias=flag())


class Matmul(LibraryKernel):
    """``plus.matmul(a, b, [bias], config, out)``."""

    name = "plus.matmul"
    spec = MATMUL_SPEC

    def num_inputs(self, cfg) -> int:
        return 2 + cfg.bias

    def out_shape(self, cfg, inputs: Sequence[torch.Tensor]) -> tuple[int, ...]:
        a, b = inputs[0], inputs[1]
        if a.dim() < 2 or b.dim() < 2:
            raise ValueError(f"{self.name}: a and b must be at least 2-D")
        m, ka = (a.shape[-1], a.shape[-2]) if cfg.ta else (a.shape[-2], a.shape[-1])
        kb, n = (b.shape[-1], b.shape[-2]) if cfg.tb else (b.shape[-2], b.shape[-1])
        if ka != kb:
            raise ValueError(
                f"{self.name}: a {tuple(a.shape)} (ta={cfg.ta:d}) and b {tuple(b.shape)} "
                f"(tb={cfg.tb:d}) disagree on K"
            )
        try:
            batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        except RuntimeError:
            raise ValueError(
                f"{self.name}: batch dims of {tuple(a.shape)} and {tuple(b.shape)} do not broadcast"
            ) from None
        return (*batch, m, n)

    def run(self, cfg, inputs: Sequence[torch.Tensor], out: torch.Tensor) -> None:
        a, b = inputs[0], inputs[1]
        if cfg.ta:
            a = a.transpose(-1, -2)
        if cfg.tb:
            b = b.transpose(-1, -2)
        if a.dim() == 2 and b.dim() == 2 and cfg.bias and cfg.scale == 1.0:
            torch.addmm(inputs[2], a, b, out=out)
            return
        torch.matmul(a, b, out=out)
        if cfg.scale != 1.0:
            out.mul_(cfg.scale)
        if cfg.bias:
            out.add_(inputs[2])
