"""``plus.linear_layernorm``: ``LayerNorm(x @ W + bias + residual) * gamma + beta``.

The PluS paper's GEMM + bias + residual + LayerNorm group (its S2/S4 patterns at the end of
every transformer sub-layer). Call: ``plus.linear_layernorm(x, w, [bias], [residual], [gamma],
[beta], config, out)``; keys ``w=nk|kn``, ``bias``, ``residual``, ``gamma``, ``beta`` (``0|1``),
``eps=<float>`` (default 1e-5), ``prepack=1|0``, ``sum_out=1|0``. The normalization is over
the last dim (N). With ``sum_out=1`` a second output receives the normalized input
``x @ W + bias + residual`` itself: pre-LN transformers (GPT-2, ViT) carry that sum on as the
next residual, and PluS's multi-output rule keeps it instead of computing it twice.

CPU fp32: the GEMM with bias and the residual add fused as oneDNN's binary post-op on a
prepacked weight, then ``F.layer_norm``; elsewhere ``addmm`` into ``out`` and ``layer_norm``.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._common import ConfigSpec, LibraryKernel, choice, flag, real, widened_half, write_out
from ._torch import F, torch
from .linear import (
    ONEDNN_MIN_FLOPS,
    generic_linear,
    linear_out_shape,
    onednn_linear,
    use_onednn,
)

LINEAR_LAYERNORM_SPEC = ConfigSpec(
    "plus.linear_layernorm",
    w=choice("nk", "kn"),
    bias=flag(),
    residual=flag(),
    gamma=flag(),
    beta=flag(),
    eps=real(1e-5),
    prepack=flag(True),
    sum_out=flag(),
)


class LinearLayerNorm(LibraryKernel):
    """``plus.linear_layernorm(x, w, [bias], [residual], [gamma], [beta], config, out)``."""

    spec = LINEAR_LAYERNORM_SPEC
    implementations = ("torch.linear_layernorm",)
    cpu_gflops = 370.0  # 128x768x768: 350-400
    native_dtypes = ("float32", "bfloat16")  # native/onednn_linear.cc
    cuda_gflops = 15000.0

    def probe(self, rand):  # noqa: ANN001, ANN201
        m, k, n = 128, 768, 768
        return (rand(m, k), rand(n, k), rand(n)), "bias=1", torch.empty(m, n), 2.0 * m * k * n

    def native_config(self, cfg) -> bool:
        return cfg.prepack

    def num_inputs(self, cfg) -> int:
        return 2 + cfg.bias + cfg.residual + cfg.gamma + cfg.beta

    def num_outputs(self, cfg) -> int:
        return 1 + cfg.sum_out

    def out_shape(self, cfg, inputs: Sequence[torch.Tensor]) -> tuple[int, ...]:
        return linear_out_shape(self.name, cfg.w, inputs[0], inputs[1])

    def run(
        self,
        cfg,
        inputs: Sequence[torch.Tensor],
        out: torch.Tensor,
        sum_out: torch.Tensor | None = None,
    ) -> None:
        x, w = inputs[0], inputs[1]
        rest = list(inputs[2:])
        bias = rest.pop(0) if cfg.bias else None
        residual = rest.pop(0) if cfg.residual else None
        gamma = rest.pop(0) if cfg.gamma else None
        beta = rest.pop(0) if cfg.beta else None
        n = out.shape[-1]
        widened = widened_half(x, x.numel() // max(x.shape[-1], 1))
        if widened:
            # float32 throughout on parameters widened once (their packing follows), the sum
            # and the normalized result rounded once each
            def wide(t: torch.Tensor | None) -> torch.Tensor | None:
                if t is None:
                    return None
                hit = self.cache.get(t, ("float32",), torch.Tensor.float) if cfg.prepack else None
                return hit if hit is not None else t.float()

            x, w, bias, gamma, beta = x.float(), wide(w), wide(bias), wide(gamma), wide(beta)
            residual = residual.float() if residual is not None else None
        if use_onednn(x, w, out) or (widened and 2.0 * x.numel() * n >= ONEDNN_MIN_FLOPS):
            cache = self.cache if cfg.prepack else None
            y = onednn_linear(cache, x, w, cfg.w, bias, residual, "none")
        else:
            y = torch.empty_like(out, dtype=x.dtype)
            generic_linear(x, w, cfg.w, bias, residual, "none", y)
        if widened:
            # the sum rounded to the half dtype before the norm, as torch's graph holds it: a
            # sum past its range is inf there, and the norm of it NaN (what a model's
            # finiteness test, BART's, looks for)
            y = y.to(out.dtype).float()
        if sum_out is not None:
            write_out(sum_out, y.view(sum_out.shape))
        write_out(out, F.layer_norm(y, (n,), gamma, beta, cfg.eps))
