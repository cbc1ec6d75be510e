"""``plus.matmul``: ``out = scale * (A @ B) + bias`` with broadcast batch dims.

Call: ``plus.matmul(a, b, [bias], config, out)``; ``a`` is ``[..., M, K]`` (``[..., K, M]`` if
``ta=1``), ``b`` is ``[..., K, N]`` (``[..., N, K]`` if ``tb=1``), ``bias`` broadcasts to
``[..., N]``. Keys ``ta=0|1``, ``tb=0|1``, ``scale=<float>`` (default 1), ``bias=0|1``.

Transposes are strided views (BLAS takes them without copying). With equal batch dims the
product, the scale (``alpha``) and the bias (``beta``) are one ``addmm``/``baddbmm`` writing
into ``out``; broadcast batch dims go through ``torch.matmul(..., out=out)`` with the scale and
bias applied in place.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._common import ConfigSpec, LibraryKernel, flag, real, widened_half
from ._torch import torch

MATMUL_SPEC = ConfigSpec("plus.matmul", ta=flag(), tb=flag(), scale=real(1.0), bias=flag())


class Matmul(LibraryKernel):
    """``plus.matmul(a, b, [bias], config, out)``."""

    spec = MATMUL_SPEC
    implementations = ("torch.matmul",)
    cpu_gflops = 190.0  # 12x128x64x128 (attention scores)
    cuda_gflops = 10000.0

    def probe(self, rand):  # noqa: ANN001, ANN201
        flops = 2.0 * 12 * 128 * 64 * 128
        return (rand(12, 128, 64), rand(12, 64, 128)), "", torch.empty(12, 128, 128), flops

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
        # computed in float32, rounded once (rows: the output's over its batch)
        if widened_half(inputs[0], out.numel() // max(out.shape[-1], 1)):
            result = torch.empty(out.shape, dtype=torch.float32)
            self.run(cfg, [t.float() for t in inputs], result)
            out.copy_(result)
            return
        a, b = inputs[0], inputs[1]
        if cfg.ta:
            a = a.transpose(-1, -2)
        if cfg.tb:
            b = b.transpose(-1, -2)
        bias = inputs[2] if cfg.bias else None
        # scale and bias folded into one BLAS call (alpha, beta) where the batch dims match
        same_batch = (
            a.shape[:-2] == b.shape[:-2]
            and out.is_contiguous()
            and (bias is None or bias.dim() <= 2)  # broadcasts over the flattened batch
        )
        if a.dim() == 2 and b.dim() == 2:
            if bias is None:
                torch.addmm(out, a, b, beta=0, alpha=cfg.scale, out=out)
            else:
                torch.addmm(bias, a, b, alpha=cfg.scale, out=out)
            return
        if same_batch:
            m, n = out.shape[-2], out.shape[-1]
            a3 = a.reshape(-1, a.shape[-2], a.shape[-1])
            b3 = b.reshape(-1, b.shape[-2], b.shape[-1])
            o3 = out.view(-1, m, n)
            if bias is None:
                torch.baddbmm(o3, a3, b3, beta=0, alpha=cfg.scale, out=o3)
            else:
                torch.baddbmm(bias, a3, b3, alpha=cfg.scale, out=o3)
            return
        torch.matmul(a, b, out=out)
        if cfg.scale != 1.0:
            out.mul_(cfg.scale)
        if bias is not None:
            out.add_(bias)
