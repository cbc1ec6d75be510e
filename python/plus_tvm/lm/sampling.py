"""The next token from the last position's logits, as transformers' ``generate`` picks it:
greedy (``argmax``), or sampling after the temperature, top-k and top-p warpers in that order
(transformers' ``TemperatureLogitsWarper``, ``TopKLogitsWarper``, ``TopPLogitsWarper``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import InputError


@dataclass(frozen=True)
class Sampling:
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def check(self) -> None:
        """Refuse settings transformers refuses (before anything is computed)."""
        if self.do_sample and not self.temperature > 0:
            raise InputError(f"generate: temperature must be > 0, got {self.temperature}")
        if int(self.top_k) != self.top_k or self.top_k < 0:
            raise InputError(f"generate: top_k must be an integer >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise InputError(f"generate: top_p must be in (0, 1], got {self.top_p}")

    def next_tokens(self, logits: torch.Tensor) -> torch.Tensor:
        """``[batch]`` token ids from ``[batch, vocab]`` logits."""
        scores = logits.float()
        if not self.do_sample:
            return scores.argmax(dim=-1)
        if self.temperature != 1.0:
            scores = scores / self.temperature
        if self.top_k > 0:
            k = min(int(self.top_k), scores.shape[-1])
            kth = torch.topk(scores, k, dim=-1).values[..., -1, None]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if self.top_p < 1.0:
            ordered, order = torch.sort(scores, descending=False, dim=-1)
            cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
            drop = cumulative <= (1 - self.top_p)
            drop[..., -1:] = False  # keep at least one token
            scores = scores.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
        probs = scores.softmax(dim=-1)
        return torch.multinomial(probs, num_samples=1).squeeze(1)
