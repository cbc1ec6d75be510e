"""``CompiledLM``: a causal LM compiled for generation, its prefill and decode steps and the
loop of transformers' ``generate`` over them."""

from __future__ import annotations

import threading

import torch

from ..compiled_model import CompiledModel
from ..shared_weights import held_weights
from .checks import Limits, as_ids, check_request, eos_ids
from .export import MIN_DECODE_PAST, CacheLayout
from .kv_cache import KVCache
from .sampling import Sampling


class CompiledLM:
    """A causal LM compiled by :func:`plus_tvm.compile_lm`.

    ``prefill`` and ``decode`` are the two compiled steps (:class:`CompiledModel`), for a loop
    of one's own:

    - ``prefill(input_ids, attention_mask, position_ids)``, each ``[batch, length]`` int64,
      returns ``(logits, k0, v0, k1, v1, ...)``: the last position's logits ``[batch, vocab]``
      and each layer's keys and values of the prompt, ``[length, batch, kv_heads, head_dim]``.
    - ``decode(input_ids, attention_mask, position_ids, *past)``: one new token per sequence
      (``input_ids`` and ``position_ids`` ``[batch, 1]``, ``attention_mask``
      ``[batch, past + 1]``) and ``past``, the keys and values so far, k0, v0, k1, v1, ...
      (``[past, batch, kv_heads, head_dim]`` each); returns the logits and the new token's
      keys and values (``[1, batch, kv_heads, head_dim]``).

    :meth:`generate` runs that loop with transformers' meanings. ``stats`` holds both steps'
    compile statistics, the KV cache's memory and the weights' (``weights``: the distinct
    buffers both steps hold, one per weight when they share them as :func:`compile_lm` makes
    them).
    """

    def __init__(
        self,
        prefill: CompiledModel,
        decode: CompiledModel,
        layout: CacheLayout,
        limits: Limits,
        eos_token_id: object = None,
        pad_token_id: int | None = None,
        name: str = "model",
    ) -> None:
        self.prefill = prefill
        self.decode = decode
        self.layout = layout
        self.limits = limits
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.name = name
        self._cache = KVCache(layout)
        self._lock = threading.Lock()  # one request at a time uses the cache buffers

    @property
    def max_batch(self) -> int:
        return self.limits.max_batch

    @property
    def max_length(self) -> int:
        return self.limits.max_length

    @property
    def stats(self) -> dict[str, object]:
        per_token = self.layout.bytes_per_token()
        return {
            "model": self.name,
            "max_batch": self.max_batch,
            "max_length": self.max_length,
            "kv_cache": {
                "layout": "[length, batch, kv_heads, head_dim] per layer, keys and values",
                "tensors": len(self.layout.shapes),
                "dtype": str(self.layout.dtype).replace("torch.", ""),
                "bytes_per_token": per_token,
                "bytes_at_limits": per_token * self.max_batch * self.max_length,
                "allocated_bytes": self._cache.allocated_bytes(),
            },
            # the weight buffers both steps hold together (shared: each weight once)
            "weights": held_weights([self.prefill, self.decode]),
            "prefill": self.prefill.stats,
            "decode": self.decode.stats,
        }

    def __repr__(self) -> str:
        return (
            f"CompiledLM({self.name}, max_batch={self.max_batch}, max_length={self.max_length}, "
            f"{len(self.layout.shapes) // 2} layers)"
        )

    def generate(
        self,
        input_ids: object,
        max_new_tokens: int,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        eos_token_id: object = None,
        attention_mask: object = None,
        pad_token_id: int | None = None,
    ) -> torch.LongTensor:
        """The prompts followed by up to ``max_new_tokens`` new tokens, as transformers'
        ``model.generate`` returns them.

        ``attention_mask`` marks left padding (0) of prompts of different lengths. A sequence
        that produced an ``eos_token_id`` (default: the model's generation config) gets
        ``pad_token_id`` (default: the model's, else the first eos id) after it; generation
        stops when every sequence has finished. Every input is checked against the compiled
        limits (``max_batch``, ``max_length``, the vocabulary) before anything runs."""
        ids = as_ids(input_ids, "input_ids")
        mask = (
            torch.ones_like(ids)
            if attention_mask is None
            else as_ids(attention_mask, "attention_mask")
        )
        new = check_request(ids, mask, max_new_tokens, self.limits)
        sampling = Sampling(bool(do_sample), float(temperature), top_k, float(top_p))
        sampling.check()
        eos = eos_ids(
            self.eos_token_id if eos_token_id is None else eos_token_id, self.limits.vocab_size
        )
        pad = self.pad_token_id if pad_token_id is None else pad_token_id
        if pad is None and eos:
            pad = eos[0]
        if new == 0:
            return ids.clone()
        with self._lock:
            return self._loop(ids, mask, new, sampling, eos, pad)

    def _decode_step(
        self, token: torch.Tensor, mask: torch.Tensor, position: torch.Tensor, past: list
    ) -> list:
        """The decode step on the cache buffers themselves: on the CPU the past goes to the VM
        as views of the buffers (DLPack, no copy; ``self.decode(...)`` copies every input), and
        the step's attention reads it in place and writes the new token into its last slot."""
        import tvm

        from ..compiled_model import _is_cpu

        if not _is_cpu(self.decode.device):
            return self.decode(token, mask, position, *past)
        small = [tvm.runtime.tensor(t.numpy(), self.decode.device) for t in (token, mask, position)]
        views = [tvm.runtime.from_dlpack(p) for p in past]
        out = self.decode.run_prepared(small + views)
        return [torch.from_dlpack(leaf) for leaf in out]

    def _loop(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        new: int,
        sampling: Sampling,
        eos: list[int],
        pad: int | None,
    ) -> torch.Tensor:
        batch, length = ids.shape
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
        self._cache.reserve(batch, length + new)
        logits, *fresh = self.prefill(ids, mask, positions)
        self._cache.write(0, fresh)
        tokens = [ids]
        unfinished = torch.ones(batch, dtype=torch.bool)
        stop = torch.tensor(eos, dtype=torch.long)
        position = positions[:, -1:]
        for step in range(new):
            token = sampling.next_tokens(torch.as_tensor(logits))
            if eos:
                token = torch.where(unfinished, token, torch.full_like(token, pad))
                unfinished &= ~torch.isin(token, stop)
            tokens.append(token[:, None])
            if step == new - 1 or not bool(unfinished.any()):
                break
            mask = torch.cat([mask, torch.ones(batch, 1, dtype=mask.dtype)], dim=1)
            position = position + 1
            if length < MIN_DECODE_PAST:  # (a one-token prompt: its second step is a prefill)
                ids = torch.cat(tokens, dim=1)
                logits, *fresh = self.prefill(ids, mask, torch.cat([positions, position], 1))
                self._cache.write(0, fresh)
            else:  # the past and the slot of the new token
                past = self._cache.past(length + 1)
                new_ids = token[:, None].contiguous()
                logits, *fresh = self._decode_step(new_ids, mask, position, past)
                self._cache.write(length, fresh)  # (where the attention did not write the slot)
            length += 1
        return torch.cat(tokens, dim=1)
