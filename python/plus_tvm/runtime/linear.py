"""``plus.linear``: ``out = act(x @ W + bias) + residual``.

Call: ``plus.linear(x, w, [bias], [residual], config, out)``; ``x`` is ``[..., K]``, ``w`` is
``[N, K]`` (``w=nk``, as ``nn.Linear``) or ``[K, N]`` (``w=kn``), ``bias`` is ``[N]``,
``residual`` is ``[..., N]``. Keys: ``w=nk|kn``, ``bias=0|1``, ``residual=0|1``,
``act=none|relu|relu6|gelu|gelu_tanh|silu|sigmoid|tanh``, ``prepack=1|0``, ``parts=<int>``.

``parts=P`` (sibling linears on one input, e.g. Q/K/V, merged by ``MergeSiblingLinears``):
``plus.linear(x, w_1..w_P, [b_1..b_P], config, out)`` computes ``x @ [W_1; ...; W_P]`` (+ the
biases) into ``out`` ``[..., N_1 + ... + N_P]`` as one GEMM; the joined weight is built and
packed once (keyed by every part, see ``PrepackCache.get_joined``). No residual with P > 1.

CPU fp32 runs oneDNN's ``_linear_pointwise`` on a weight reordered once into its blocked layout
(about 2.5x MKL's ``F.linear`` at BERT shapes), with the activation or the residual add fused
as a post-op. Other dtypes and devices use ``addmm``/``mm`` writing straight into ``out``
(cuBLAS, with ``_addmm_activation``'s cuBLASLt epilogue for relu/gelu_tanh on CUDA).

Widened half precision: on a CPU without GEMM instructions for float16 / bfloat16 (no
avx512_fp16 / avx512_bf16 nor AMX: ``cpu_features.cpu_dtypes``), torch's half GEMMs run 4-7x
slower than float32 (bfloat16 ``addmm`` on an AVX2 EPYC: 31 ms at 128x768x3072 against 4.7 ms
widened). Such a call computes the float32 way instead: the weights widened to float32 once
and packed by the cache, the activation widened per call, the result rounded to the half dtype
once, where torch rounds (products of half values are exact in float32). float16 always
widens; bfloat16 from 3 rows (``_common.WIDEN_MIN_ROWS``). ``linear_layernorm``, ``matmul``
and ``conv2d`` follow the same rule (``_common.widened_half``); CPUs that compute bfloat16
natively keep their bfloat16 kernels.

bfloat16 linears of one to eight rows (a decode step's, one row per sequence) on such a CPU
read the bfloat16 weight as stored (widening it would stream twice the bytes) in the native
library's GEMV (``native/gemv.cc``: AVX2 + FMA, float32 sums, rounded as torch's graph rounds),
which the native ``plus.linear`` calls without Python and this kernel calls when the library is
loaded (:func:`half_gemv`); torch's bfloat16 GEMV there runs well below the memory's speed.
Without the library (or AVX2) they stay on torch's ``addmm`` (one and two rows) or widen.
(float32 calls of two to eight rows take the library's float32 GEMV in the native kernel.)
"""

from __future__ import annotations

from collections.abc import Sequence

from . import _common
from ._common import (
    ACTIVATIONS,
    ONEDNN_SCALARS,
    ONEDNN_UNARY,
    ConfigSpec,
    LibraryKernel,
    PrepackCache,
    apply_activation_,
    choice,
    flag,
    integer,
    onednn_usable,
    widened_half,
    write_out,
)
from ._torch import torch

# Below this many FLOPs (2*M*K*N) oneDNN's fixed cost per call (about 13 us: primitive lookup,
# post-op attributes) loses to MKL's addmm writing into ``out`` (measured on 2 cores: 1 MFLOP
# 16 vs 9 us, 4 MFLOP 23 vs 25 us, 17 MFLOP 50 vs 84 us).
ONEDNN_MIN_FLOPS = 3e6

LINEAR_SPEC = ConfigSpec(
    "plus.linear",
    w=choice("nk", "kn"),
    bias=flag(),
    residual=flag(),
    act=choice(*ACTIVATIONS),
    prepack=flag(True),
    parts=integer(1),
)


def packed_linear_weight(cache: PrepackCache, w: torch.Tensor, layout: str, rows: int):
    """``w`` as oneDNN's prepacked ``[N, K]`` weight (cached), or the plain ``[N, K]`` weight
    while the cache has not yet seen it often enough to pack it."""

    def pack(weight: torch.Tensor) -> torch.Tensor:
        nk = weight if layout == "nk" else weight.t()
        return torch.ops.mkldnn._reorder_linear_weight(nk.contiguous(), rows)

    packed = cache.get(w, ("linear", layout), pack)
    if packed is None:
        return (w if layout == "nk" else w.t()).contiguous()
    return packed


def onednn_linear(
    cache: PrepackCache | None,
    x: torch.Tensor,
    w: torch.Tensor,
    layout: str,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    act: str,
) -> torch.Tensor:
    """``act(x @ W + bias) + residual`` with oneDNN post-ops; returns a new tensor.

    ``cache=None`` runs on the plain weight (no packing; used for run-time weights).
    """
    rows = x.numel() // max(x.shape[-1], 1)
    if cache is None:
        weight = (w if layout == "nk" else w.t()).contiguous()
    else:
        weight = packed_linear_weight(cache, w, layout, rows)
    return onednn_apply(x, weight, bias, residual, act)


def onednn_apply(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    act: str,
) -> torch.Tensor:
    """``act(x @ W + bias) + residual`` on ``weight``, oneDNN's packed or a plain ``[N, K]``."""
    x = x.contiguous()
    if (
        residual is not None
        and act == "none"
        and residual.shape == (*x.shape[:-1], weight.shape[0])
    ):
        # the binary post-op: (x @ W + b) + residual in one pass over the output
        return torch.ops.mkldnn._linear_pointwise.binary(
            x, residual.contiguous(), weight, bias, "add"
        )
    attr, algorithm = ONEDNN_UNARY[act]
    y = torch.ops.mkldnn._linear_pointwise(
        x, weight, bias, attr, ONEDNN_SCALARS.get(act, []), algorithm
    )
    if residual is not None:
        y.add_(residual)
    return y


def linear_out_shape(kernel: str, layout: str, x: torch.Tensor, w: torch.Tensor):
    """``[..., N]`` for ``x`` ``[..., K]``; ``ValueError`` when ``x`` and ``w`` disagree on K."""
    if w.dim() != 2 or x.dim() < 1:
        raise ValueError(f"{kernel}: w must be 2-D, got {tuple(w.shape)}")
    n, k = w.shape if layout == "nk" else (w.shape[1], w.shape[0])
    if x.shape[-1] != k:
        raise ValueError(
            f"{kernel}: x {tuple(x.shape)} and w {tuple(w.shape)} (w={layout}) disagree on K"
        )
    return (*x.shape[:-1], n)


def use_onednn(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> bool:
    """Whether the prepacked oneDNN path applies and pays off for this GEMM."""
    return onednn_usable(x, w, out) and 2.0 * x.numel() * out.shape[-1] >= ONEDNN_MIN_FLOPS


# The most rows a bfloat16 linear runs the native GEMV with (one per sequence of a decode step
# at batch 1 to 8: native/gemv.cc's kMaxRows, which the library reports); more rows compute in
# float32 on a widened weight (``_common.widened_half``).
HALF_GEMV_MAX_ROWS = 8
_HALF_GEMV: list = []  # the native GEMV (gemv.cc), once the library is loaded


def half_gemv_applies(x: torch.Tensor, rows: int) -> bool:
    """Whether a linear on ``x`` (``rows`` rows) is one for the native bfloat16 GEMV: bfloat16
    on a CPU without bfloat16 GEMM instructions (``cpu_features``), at most
    ``HALF_GEMV_MAX_ROWS`` rows."""
    return (
        x.dtype == torch.bfloat16
        and 1 <= rows <= HALF_GEMV_MAX_ROWS
        and x.device.type == "cpu"
        and "bfloat16" not in _common.cpu_dtypes()
    )


def _native_half_gemv():
    if not _HALF_GEMV:
        from . import native

        make = native.function("gemv_half_function")
        if make is None:  # the library is not loaded (PLUS_TVM_NATIVE=0, no compiler, not yet)
            return None
        _HALF_GEMV.append(make())
    return _HALF_GEMV[0]


def half_gemv(
    x: torch.Tensor,
    weights: Sequence[torch.Tensor],
    layout: str,
    biases: Sequence[torch.Tensor] | None,
    residual: torch.Tensor | None,
    act: str,
    out: torch.Tensor,
) -> bool:
    """``act(x @ [W_1; ...] + bias) + residual`` into ``out`` by the native bfloat16 GEMV
    (``native/gemv.cc``); False, with nothing written, where it does not run the call
    (the library not loaded, a CPU without AVX2, a tensor strided or of another dtype, more
    than ``HALF_GEMV_MAX_ROWS`` rows). Call it where :func:`half_gemv_applies`."""
    gemv = _native_half_gemv()
    if gemv is None:
        return False
    config = (
        f"w={layout};bias={int(biases is not None)};residual={int(residual is not None)};"
        f"act={act};parts={len(weights)}"
    )
    tail = [residual] if residual is not None else []
    return bool(gemv(x, *weights, *(biases or ()), *tail, config, out))


def generic_linear(
    x: torch.Tensor,
    w: torch.Tensor,
    layout: str,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    act: str,
    out: torch.Tensor,
) -> None:
    """``act(x @ W + bias) + residual`` written straight into ``out`` (BLAS ``out=`` variants;
    the native bfloat16 GEMV for a few rows where :func:`half_gemv_applies`)."""
    k = x.shape[-1]
    n = out.shape[-1]
    if half_gemv_applies(x, x.numel() // max(k, 1)):
        biases = [bias] if bias is not None else None
        if half_gemv(x, [w], layout, biases, residual, act, out):
            return
    x2 = x.reshape(-1, k)
    wt = w.t() if layout == "nk" else w  # [K, N]
    o2 = out.view(-1, n) if out.is_contiguous() else None
    target = (
        o2 if o2 is not None else torch.empty(x2.shape[0], n, dtype=out.dtype, device=out.device)
    )
    fused = bias is not None and act in ("relu", "gelu_tanh") and x.is_cuda
    if fused:
        # cuBLASLt epilogue (bias + relu / tanh-approximated gelu in the GEMM)
        torch._addmm_activation(bias, x2, wt, use_gelu=act == "gelu_tanh", out=target)
    elif bias is not None:
        torch.addmm(bias, x2, wt, out=target)
    else:
        torch.mm(x2, wt, out=target)
    if not fused:
        apply_activation_(target, act)
    if residual is not None:
        target.add_(residual.reshape(-1, n))
    if o2 is None:
        out.copy_(target.view(out.shape))


class Linear(LibraryKernel):
    """``plus.linear(x, w, [bias], [residual], config, out)``; with ``parts=P``:
    ``plus.linear(x, w_1..w_P, [b_1..b_P], config, out)``."""

    spec = LINEAR_SPEC
    implementations = ("torch.linear",)
    cpu_gflops = 420.0  # 128x768x{768,2304,3072}, prepacked weight: 390-460
    # native/onednn_linear.cc; float16 stays in Python until a CPU with it tests it
    native_dtypes = ("float32", "bfloat16")
    cuda_gflops = 20000.0

    def probe(self, rand):  # noqa: ANN001, ANN201
        m, k, n = 128, 768, 3072
        return (rand(m, k), rand(n, k), rand(n)), "bias=1", torch.empty(m, n), 2.0 * m * k * n

    def native_config(self, cfg) -> bool:
        return cfg.prepack and cfg.parts == 1

    def num_inputs(self, cfg) -> int:
        return 1 + cfg.parts * (1 + cfg.bias) + cfg.residual

    @staticmethod
    def _split(cfg, inputs: Sequence[torch.Tensor]):
        """(x, weights, biases or None, residual or None)."""
        p = cfg.parts
        weights = list(inputs[1 : 1 + p])
        biases = list(inputs[1 + p : 1 + 2 * p]) if cfg.bias else None
        residual = inputs[-1] if cfg.residual else None
        return inputs[0], weights, biases, residual

    def check(self, cfg, inputs: Sequence[torch.Tensor], out: torch.Tensor) -> None:
        if cfg.parts < 1:
            raise ValueError(f"{self.name}: parts must be at least 1, got {cfg.parts}")
        if cfg.parts > 1 and cfg.residual:
            raise ValueError(f"{self.name}: a residual cannot be added to {cfg.parts} parts")

    def out_shape(self, cfg, inputs: Sequence[torch.Tensor]) -> tuple[int, ...]:
        x, weights, _, _ = self._split(cfg, inputs)
        shapes = [linear_out_shape(self.name, cfg.w, x, w) for w in weights]
        return (*shapes[0][:-1], sum(s[-1] for s in shapes))

    def _joined(self, cfg, x: torch.Tensor, weights: list, onednn: bool) -> torch.Tensor:
        """The parts as one weight: oneDNN's packed ``[N, K]`` on the oneDNN path, else the
        plain ``[N, K]`` concatenation; cached (keyed by every part) once seen twice, joined
        for this call only before that or with ``prepack=0``."""

        def nk_cat(ws: Sequence[torch.Tensor]) -> torch.Tensor:
            return torch.cat([w if cfg.w == "nk" else w.t() for w in ws]).contiguous()

        if cfg.prepack:
            if onednn:
                rows = x.numel() // max(x.shape[-1], 1)
                variant = ("linear-joined", cfg.w, rows)

                def pack(ws: Sequence[torch.Tensor]) -> torch.Tensor:
                    return torch.ops.mkldnn._reorder_linear_weight(nk_cat(ws), rows)
            else:
                variant, pack = ("linear-joined-plain", cfg.w), nk_cat
            joined = self.cache.get_joined(weights, variant, pack)
            if joined is not None:
                return joined
        return nk_cat(weights)

    def run(self, cfg, inputs: Sequence[torch.Tensor], out: torch.Tensor) -> None:
        x, weights, biases, residual = self._split(cfg, inputs)
        rows = x.numel() // max(x.shape[-1], 1)
        if half_gemv_applies(x, rows) and half_gemv(
            x, weights, cfg.w, biases, residual, cfg.act, out
        ):
            return  # every part read as stored: no joined copy
        if widened_half(x, rows) and 2.0 * x.numel() * out.shape[-1] >= ONEDNN_MIN_FLOPS:
            self._run_widened(cfg, x, weights, biases, residual, out)
            return
        onednn = use_onednn(x, weights[0], out)
        if cfg.parts == 1:
            w, layout = weights[0], cfg.w
            bias = biases[0] if biases else None
            if onednn:
                cache = self.cache if cfg.prepack else None
                write_out(out, onednn_linear(cache, x, w, layout, bias, residual, cfg.act))
                return
        else:
            w, layout = self._joined(cfg, x, weights, onednn), "nk"
            bias = torch.cat(biases) if biases else None
            if onednn:
                write_out(out, onednn_apply(x, w, bias, residual, cfg.act))
                return
        generic_linear(x, w, layout, bias, residual, cfg.act, out)

    def _run_widened(self, cfg, x, weights, biases, residual, out) -> None:  # noqa: ANN001
        """float16 / bfloat16 computed in float32 (:func:`widened_half`): the weights (every
        part, as one ``[N, K]``) widened and packed once by the cache, the rest widened per
        call; each result rounded to the half dtype where torch's op-by-op graph rounds it."""
        rows = x.numel() // max(x.shape[-1], 1)

        def nk_float(ws: Sequence[torch.Tensor]) -> torch.Tensor:
            return torch.cat([w if cfg.w == "nk" else w.t() for w in ws]).float().contiguous()

        def pack(ws: Sequence[torch.Tensor]) -> torch.Tensor:
            return torch.ops.mkldnn._reorder_linear_weight(nk_float(ws), rows)

        w = self.cache.get_joined(weights, ("linear-float32", cfg.w), pack) if cfg.prepack else None
        if w is None:
            w = nk_float(weights)
        bias = torch.cat(biases).float() if biases else None
        # rounded where torch's graph rounds: the linear's output, then the activation's and
        # the residual sum's (a value past the half dtype's range is inf there, as in torch)
        y = onednn_apply(x.float(), w, bias, None, "none").to(out.dtype)
        if cfg.act != "none":
            y32 = y.float()
            apply_activation_(y32, cfg.act)
            y = y32.to(out.dtype)
        if residual is not None:
            y = (y.float() + residual.float()).to(out.dtype)
        write_out(out, y)
