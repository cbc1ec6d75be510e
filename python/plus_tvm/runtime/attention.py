"""``plus.attention``: ``softmax(q @ k^T * scale + mask [+ causal]) @ v``.

Call: ``plus.attention(q, k, v, [mask], config, out)``. Keys: ``layout=bhsd|bshd`` (of q, k,
v: ``[B, H, S, D]`` or ``[B, S, H, D]``), ``out_layout=bhsd|bshd``, ``scale=<float>`` (default
``1/sqrt(D)``), ``causal=0|1`` (``-inf`` above the diagonal, aligned top-left as in torch's
``is_causal``: query ``i`` sees keys ``0..i``), ``mask=0|1`` (an additive float mask
broadcastable to ``[B, H, Sq, Sk]``), ``zero_masked=0|1`` (a query whose mask row is all
``-inf`` gets 0, SDPA's safe softmax, instead of NaN), ``cache=0|1`` (a decode step with a KV
cache: ``plus.attention(q, k, v, k_new, v_new, [mask], config, out)``, k and v the cache's
``[T, B, Hkv, D]`` views whose last position is the new token's slot, read in place; ``k_new``
and ``v_new``, one position in ``layout``, are written into that slot first). k and v may have
fewer heads than q (grouped-query attention: query head ``h`` reads kv head
``h // (H / Hkv)``). ``slot=1`` (with ``cache=1``, the bucketed decode): one more input after
``v_new``, an int64 device tensor ``[1]``, the slot's position in the cache (not the last
one); the new token is written there with ``index_copy_`` (no host sync: capturable in a CUDA
graph). Not run natively (the C++ kernel writes the last slot): the torch path runs it.

Runs ``torch.nn.functional.scaled_dot_product_attention``: flash attention on CPU and on CUDA
(or memory-efficient/cuDNN attention where flash does not apply). ``bshd`` inputs are passed as
transposed views (no copy); the result is copied into ``out`` in the requested layout.

A float16 / bfloat16 call on a CPU without instructions for its dtype computes in float32
(:func:`~._common.widened_half`, its rows the queries ``Sq``: k and v are widened per call, for
them all): q, k, v (and a half mask) are widened, SDPA runs in float32 and its result is rounded
once into ``out``. torch's half flash attention rounds its probabilities before the product with
v, so the widened error is float32's rounded once, lower than torch's. Measured on the AVX2 host
(``scripts/bench_widened_half.py attention``): float16 2.5-3x faster at 128-197 queries and
3.7-7.5x at one; bfloat16 1.1x at 128-197 queries, and at one query torch's bfloat16 wins on long
caches (0.27x at 1024 keys), so a bfloat16 decode step keeps it (``WIDEN_MIN_ROWS``). The native
kernel widens bfloat16 in C++ likewise (native/onednn_attention.cc).
"""

from __future__ import annotations

from collections.abc import Sequence

from ._common import ConfigSpec, LibraryKernel, choice, flag, real, widened_half
from ._torch import F, torch

ATTENTION_SPEC = ConfigSpec(
    "plus.attention",
    layout=choice("bhsd", "bshd"),
    out_layout=choice("bhsd", "bshd"),
    scale=real(None),
    causal=flag(),
    mask=flag(),
    zero_masked=flag(),
    cache=flag(),
    slot=flag(),
)


class Attention(LibraryKernel):
    """``plus.attention(q, k, v, [mask], config, out)``."""

    name = "plus.attention"
    spec = ATTENTION_SPEC
    implementations = ("torch.sdpa", "torch.sdpa_flash")
    cpu_gflops = 130.0  # 1x12x128x64, SDPA flash: 120-150
    # the dtypes its native form (native/onednn_attention.cc) runs, on CPUs that compute them
    # natively (native.native_dtypes; on others it runs bfloat16 in float32 itself, widened)
    native_dtypes = ("float32", "bfloat16")
    cuda_gflops = 5000.0

    def probe(self, rand):  # noqa: ANN001, ANN201
        q, k, v = (rand(1, 12, 128, 64) for _ in range(3))
        return (q, k, v), "", torch.empty(1, 12, 128, 64), 4.0 * 12 * 128 * 128 * 64

    def __init__(self) -> None:
        super().__init__()
        # additive causal masks for causal=1 together with an explicit mask (SDPA refuses
        # is_causal with attn_mask), one per (Sq, Sk, dtype, device)
        self.causal_masks: dict[tuple, torch.Tensor] = {}

    def clear(self) -> None:
        super().clear()
        self.causal_masks.clear()

    def num_inputs(self, cfg) -> int:
        return 3 + 2 * cfg.cache + (cfg.cache and cfg.slot) + cfg.mask

    def native_config(self, cfg: tuple) -> bool:
        return bool(self.native_dtypes) and not cfg.slot  # (native: the last slot only)

    def check(self, cfg, inputs: Sequence[torch.Tensor], out: torch.Tensor) -> None:
        for t in inputs[: 3 + 2 * cfg.cache]:
            if t.dim() != 4:
                raise ValueError(
                    f"{self.name}: q, k, v must be 4-D ({cfg.layout}), got shape {tuple(t.shape)}"
                )
        heads = inputs[0].shape[2 if cfg.layout == "bshd" else 1]
        kv_heads = inputs[1].shape[2 if cfg.cache or cfg.layout == "bshd" else 1]
        if heads % kv_heads:
            raise ValueError(
                f"{self.name}: {heads} query heads are not a multiple of {kv_heads} kv heads"
            )
        if cfg.cache:
            k, k_new = inputs[1], inputs[3]
            if k_new.numel() != k[-1].numel() or inputs[4].numel() != inputs[2][-1].numel():
                raise ValueError(
                    f"{self.name}: k_new / v_new must hold one position of the cache "
                    f"{tuple(k.shape[1:])}, got {tuple(k_new.shape)}"
                )
        if cfg.mask and not inputs[-1].is_floating_point():
            raise ValueError(
                f"{self.name}: the mask must be an additive float mask, got {inputs[-1].dtype}"
            )

    def out_shape(self, cfg, inputs: Sequence[torch.Tensor]) -> tuple[int, ...]:
        q, v = inputs[0], inputs[2]
        if cfg.layout == "bhsd":
            b, h, s = q.shape[0], q.shape[1], q.shape[2]
        else:
            b, s, h = q.shape[0], q.shape[1], q.shape[2]
        d = v.shape[-1]
        return (b, h, s, d) if cfg.out_layout == "bhsd" else (b, s, h, d)

    def causal_mask(self, sq: int, sk: int, like: torch.Tensor) -> torch.Tensor:
        """The additive top-left causal mask ``[Sq, Sk]`` (0 on and below the diagonal)."""
        key = (sq, sk, like.dtype, like.device)
        mask = self.causal_masks.get(key)
        if mask is None:
            keep = torch.ones(sq, sk, dtype=torch.bool, device=like.device).tril()
            mask = torch.zeros(sq, sk, dtype=like.dtype, device=like.device)
            mask.masked_fill_(~keep, float("-inf"))
            self.causal_masks[key] = mask
        return mask

    def run(self, cfg, inputs: Sequence[torch.Tensor], out: torch.Tensor) -> None:
        q, k, v = inputs[0], inputs[1], inputs[2]
        if cfg.cache and cfg.slot:  # the new token at the slot tensor's position
            at = inputs[5].reshape(1)
            for cache, new in ((k, inputs[3]), (v, inputs[4])):
                cache.index_copy_(0, at, new.reshape(1, *cache.shape[1:]))
            k, v = k.permute(1, 2, 0, 3), v.permute(1, 2, 0, 3)
        elif cfg.cache:  # the new token into the slot, then the cache read in place as bhsd
            for cache, new in ((k, inputs[3]), (v, inputs[4])):
                cache[-1].copy_(new.reshape(cache[-1].shape))
            k, v = k.permute(1, 2, 0, 3), v.permute(1, 2, 0, 3)
        elif cfg.layout == "bshd":
            k, v = k.transpose(1, 2), v.transpose(1, 2)
        if cfg.layout == "bshd":
            q = q.transpose(1, 2)
        mask = inputs[-1] if cfg.mask else None
        if widened_half(q, q.shape[-2]):  # rows: the queries, sharing each widened k and v
            # float32 on q, k, v (and a half mask) widened here, rounded once into out
            q, k, v = q.float(), k.float(), v.float()
            mask = None if mask is None else mask.float()
        if k.shape[1] != q.shape[1]:  # grouped-query: each kv head serves consecutive q heads
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        causal = bool(cfg.causal)
        if mask is not None:
            if mask.dtype != q.dtype:
                mask = mask.to(q.dtype)
            if causal:
                mask = mask + self.causal_mask(q.shape[-2], k.shape[-2], q)
                causal = False
        o = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, scale=cfg.scale
        )
        if cfg.zero_masked and mask is not None:
            o = o.masked_fill((mask == float("-inf")).all(-1, keepdim=True), 0.0)
        if cfg.out_layout == "bshd":
            o = o.transpose(1, 2)
        out.copy_(o)
