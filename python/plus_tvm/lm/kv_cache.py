"""The KV cache of one ``CompiledLM``: one buffer per layer for keys and one for values, each
``[capacity, batch, kv_heads, head_dim]``, allocated when a request needs more than the buffers
hold and reused by every later request of the same batch size that fits. The past of a decode
step is the prefix ``buffer[:past]``, contiguous in this layout, handed to the compiled step
without a gather; the step's new keys and values are written at ``buffer[past]``.

The bucketed decode (``bucket`` > 0) keeps one flat storage per tensor instead, zeroed when
allocated, grown only when a request needs more, and viewed as ``[capacity, batch, kv_heads,
head_dim]`` for every batch bucket: every past ``buffer[:Lb]`` of every batch starts at the
same address (what a CUDA graph replays), and the positions after a step's slot, which the
step reads masked, hold finite values (:meth:`clear_from` zeroes them for each request: a
masked position weighs exactly 0, but ``0 * nan`` is ``nan``)."""

from __future__ import annotations

import torch

from .export import CacheLayout


class KVCache:
    def __init__(self, layout: CacheLayout, bucket: int = 0, device: object = None) -> None:
        self.layout = layout
        self.bucket = bucket
        self.device = device
        self.buffers: list[torch.Tensor] = []
        self.storage: list[torch.Tensor] = []  # (bucketed: the flat storage behind the views)
        self.batch = 0
        self.capacity = 0

    def reserve(self, batch: int, length: int) -> None:
        """Buffers for ``batch`` sequences of up to ``length`` positions (kept if they fit)."""
        if self.bucket:
            return self._reserve_flat(batch, length)
        if self.buffers and batch == self.batch and length <= self.capacity:
            return
        self.buffers = []  # (the old buffers go before the new ones are allocated)
        self.buffers = [
            torch.empty(length, batch, heads, dim, dtype=self.layout.dtype)
            for heads, dim in self.layout.shapes
        ]
        self.batch, self.capacity = batch, length

    def _reserve_flat(self, batch: int, length: int) -> None:
        capacity = -(-length // self.bucket) * self.bucket  # (whole buckets)
        per_position = [batch * heads * dim for heads, dim in self.layout.shapes]
        if not self.storage or any(
            s.numel() < capacity * n for s, n in zip(self.storage, per_position)
        ):
            self.buffers, self.storage = [], []
            self.storage = [
                torch.zeros(capacity * n, dtype=self.layout.dtype, device=self.device)
                for n in per_position
            ]
        self.buffers = [
            s[: capacity * n].view(capacity, batch, heads, dim)
            for s, n, (heads, dim) in zip(self.storage, per_position, self.layout.shapes)
        ]
        self.batch, self.capacity = batch, capacity

    def clear_from(self, start: int) -> None:
        """Zero every position from ``start`` on (bucketed: read masked, must be finite)."""
        for buffer in self.buffers:
            buffer[start:].zero_()

    def write(self, start: int, fresh: list) -> None:
        """Write a step's new keys and values (``[new, batch, heads, dim]``) at ``start`` (the
        first ``batch`` rows of a bucketed cache's padded batch)."""
        for buffer, values in zip(self.buffers, fresh):
            values = torch.as_tensor(values)
            rows = buffer[start : start + values.shape[0], : values.shape[1]]
            rows.copy_(values.to(rows.device))

    def past(self, length: int) -> list[torch.Tensor]:
        """The first ``length`` positions of every buffer (views, no copy)."""
        return [buffer[:length] for buffer in self.buffers]

    def allocated_bytes(self) -> int:
        held = self.storage or self.buffers
        return sum(b.numel() * b.element_size() for b in held)
