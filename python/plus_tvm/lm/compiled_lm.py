"""``CompiledLM``: a causal LM compiled for generation, its prefill and decode steps and the
loop of transformers' ``generate`` over them."""

from __future__ import annotations

import threading

import torch

from ..compiled_model import ALIGNMENT, CompiledModel
from ..shared_weights import held_weights
from .checks import Limits, as_ids, check_request, eos_ids
from .export import MIN_DECODE_PAST, CacheLayout, batch_buckets
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

    - the bucketed decode (``decode_bucket`` = the length step ``S`` > 0, :func:`compile_lm`'s
      ``decode_buckets``): ``decode(input_ids, attention_mask, position_ids, *past, slot)``
      with ``past`` of a bucket's length ``Lb = S * m``, ``attention_mask`` ``[batch, m,
      S]`` (0 after the slot) and ``slot`` an int64 tensor ``[1]``, the new
      token's position in ``past`` (written there by the step's attention). ``generate``
      pads the batch to a bucket of ``batch_buckets`` (dummy rows, mask all 0), so the step
      runs at most ``len(batch_buckets) x length buckets`` shapes (a CUDA graph each).

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
        decode_bucket: int = 0,
    ) -> None:
        self.prefill = prefill
        self.decode = decode
        self.layout = layout
        self.limits = limits
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.name = name
        self.decode_bucket = decode_bucket
        self.batch_buckets = batch_buckets(limits.max_batch) if decode_bucket else []
        self._device = _torch_device(decode.device) if decode_bucket else None
        self._cache = KVCache(layout, decode_bucket, self._device)
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
            "decode_buckets": self._bucket_stats(),
            "prefill": self.prefill.stats,
            "decode": self.decode.stats,
        }

    def _bucket_stats(self) -> dict[str, object]:
        """The bucketed decode's shapes: each (batch bucket, length bucket) is one shape of
        the step, one CUDA graph per captured region on a CUDA target."""
        if not self.decode_bucket:
            return {"enabled": False}
        lengths = -(-self.max_length // self.decode_bucket)
        return {
            "enabled": True,
            "length_step": self.decode_bucket,
            "length_buckets": lengths,
            "batch_buckets": list(self.batch_buckets),
            "shapes": lengths * len(self.batch_buckets),
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
        self,
        token: torch.Tensor,
        mask: torch.Tensor,
        position: torch.Tensor,
        past: list,
        *slot: torch.Tensor,
    ) -> list:
        """The decode step on the cache buffers themselves: on the CPU the past goes to the VM
        as views of the buffers (DLPack, no copy; ``self.decode(...)`` copies every input), and
        the step's attention reads it in place and writes the new token into its last slot."""
        import tvm

        from ..compiled_model import _is_cpu

        if not _is_cpu(self.decode.device):
            return self.decode(token, mask, position, *past, *slot)
        small = [_host_view(t, self.decode.device) for t in (token, mask, position, *slot)]
        views = [tvm.runtime.from_dlpack(p) for p in past]
        out = self.decode.run_prepared(small[:3] + views + small[3:])
        return [torch.from_dlpack(leaf) for leaf in out]

    def _bucketed_step(
        self, token: torch.Tensor, mask: torch.Tensor, position: torch.Tensor, known: int
    ) -> tuple[torch.Tensor, list]:
        """One bucketed decode step: the new token at position ``known`` of the cache, the
        past the length bucket holding it, the batch padded to the cache's batch bucket with
        dummy rows (token 0, mask all 0, position 1); the real rows' logits and keys/values."""
        batch, padded = token.shape[0], self._cache.batch
        lb = -(-(known + 1) // self.decode_bucket) * self.decode_bucket
        ids = torch.zeros(padded, 1, dtype=torch.long)
        ids[:batch] = token[:, None]
        positions = torch.ones(padded, 1, dtype=torch.long)
        positions[:batch] = position
        masks = torch.zeros(padded, lb, dtype=mask.dtype)
        masks[:batch, : known + 1] = mask
        masks = masks.view(padded, lb // self.decode_bucket, self.decode_bucket)
        small = [ids, masks, positions, torch.tensor([known])]
        if self._device is not None:
            small = [t.to(self._device) for t in small]
        logits, *fresh = self._decode_step(*small[:3], self._cache.past(lb), small[3])
        return torch.as_tensor(logits)[:batch].cpu(), fresh

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
        if self.decode_bucket:  # (the padded batch: a bucket of batch_buckets)
            self._cache.reserve(next(b for b in self.batch_buckets if b >= batch), length + new)
        else:
            self._cache.reserve(batch, length + new)
        logits, *fresh = self.prefill(ids, mask, positions)
        self._cache.write(0, fresh)
        if self.decode_bucket:
            self._cache.clear_from(length)
        tokens = [ids]
        unfinished = torch.ones(batch, dtype=torch.bool)
        stop = torch.tensor(eos, dtype=torch.long)
        position = positions[:, -1:]
        for step in range(new):
            # (on the host: a step on a GPU returns its logits there, the tokens stay here)
            token = sampling.next_tokens(torch.as_tensor(logits).cpu())
            if eos:
                token = torch.where(unfinished, token, torch.full_like(token, pad))
                unfinished &= ~torch.isin(token, stop)
            tokens.append(token[:, None])
            if step == new - 1 or not bool(unfinished.any()):
                break
            mask = torch.cat([mask, torch.ones(batch, 1, dtype=mask.dtype)], dim=1)
            position = position + 1
            if self.decode_bucket:  # the slot at ``length`` of the bucket holding it
                logits, fresh = self._bucketed_step(token, mask, position, length)
                self._cache.write(length, [f[:, :batch] for f in fresh])
            elif length < MIN_DECODE_PAST:  # (a one-token prompt: its second step is a prefill)
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


def _torch_device(device: object) -> torch.device | None:
    """The torch device of a compiled step's TVM device (None: the CPU, the host's tensors)."""
    from ..compiled_model import _is_cpu

    if _is_cpu(device):
        return None
    return torch.device("cuda", device.index)


def _host_view(tensor: torch.Tensor, device: object) -> object:
    """A CPU tensor as the VM takes it: a view of its memory (DLPack) where TVM accepts one
    (contiguous, ``ALIGNMENT``-byte aligned, as torch allocates), else a copy. A decode step's
    ids, mask and positions are made afresh for each step and only read by it; a copy through
    numpy costs about 30 us a tensor, a view 1 us."""
    import tvm

    if tensor.is_contiguous() and tensor.data_ptr() % ALIGNMENT == 0:
        return tvm.runtime.from_dlpack(tensor)
    return tvm.runtime.tensor(tensor.numpy(), device)
