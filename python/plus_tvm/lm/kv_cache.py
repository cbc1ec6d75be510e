"""The KV cache of one ``CompiledLM``: one buffer per layer for keys and one for values, each
``[capacity, batch, kv_heads, head_dim]``, allocated when a request needs more than the buffers
hold and reused by every later request of the same batch size that fits. The past of a decode
step is the prefix ``buffer[:past]``, contiguous in this layout, handed to the compiled step
without a gather; the step's new keys and values are written at ``buffer[past]``."""

from __future__ import annotations

import torch

from .export import CacheLayout


class KVCache:
    def __init__(self, layout: CacheLayout) -> None:
        self.layout = layout
        self.buffers: list[torch.Tensor] = []
        self.batch = 0
        self.capacity = 0

    def reserve(self, batch: int, length: int) -> None:
        """Buffers for ``batch`` sequences of up to ``length`` positions (kept if they fit)."""
        if self.buffers and batch == self.batch and length <= self.capacity:
            return
        self.buffers = []  # (the old buffers go before the new ones are allocated)
        self.buffers = [
            torch.empty(length, batch, heads, dim, dtype=self.layout.dtype)
            for heads, dim in self.layout.shapes
        ]
        self.batch, self.capacity = batch, length

    def write(self, start: int, fresh: list) -> None:
        """Write a step's new keys and values (``[new, batch, heads, dim]``) at ``start``."""
        for buffer, values in zip(self.buffers, fresh):
            buffer[start : start + values.shape[0]].copy_(torch.as_tensor(values))

    def past(self, length: int) -> list[torch.Tensor]:
        """The first ``length`` positions of every buffer (views, no copy)."""
        return [buffer[:length] for buffer in self.buffers]

    def allocated_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers)
