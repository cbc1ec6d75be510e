"""The module that is exported for generation: one step of a causal LM with its KV cache as
explicit tensors.

``LMStep.forward(input_ids, attention_mask, position_ids, past)`` builds transformers'
``DynamicCache`` over ``past`` (one key and one value tensor per layer, laid out
``[length, batch, kv_heads, head_dim]`` so that a prefix of a longer buffer is contiguous;
in a decode step its last position is the slot of the new token, not read, written by a select
(:func:`slot_layer`), so that the past, the attention mask and the attention all have one
symbolic length), runs the model on the new tokens, and returns the logits of the last
position and the keys and values of the new positions only (``[new, batch, kv_heads,
head_dim]``), which the caller writes into its buffer. Everything the model does with the
cache (rotary positions, sliding windows, ALiBi, multi-query heads, masks of left-padded
prompts) is the model's own code, traced by ``torch.export``.

The bucketed decode (``LMStep(model, slot=True)``, for CUDA graphs) takes one more input,
``slot``: an int64 tensor ``[1]`` holding the new token's position in the past, which is then
a length bucket ``Lb = S * m`` (a multiple of a step, :mod:`.export`) rather than ``slot + 1``
(the attention mask comes as ``[batch, m, S]``):
positions after the slot are masked (their mask is 0) and never count, so every step of a
bucket has the same shapes and the same cache views.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from ..errors import ModelLoadError


def forward_parameters(model: nn.Module) -> set[str]:
    """The keyword parameters of ``model.forward``."""
    return set(inspect.signature(model.forward).parameters)


def cache_argument(model: nn.Module) -> str:
    """The name ``model.forward`` takes its KV cache by (transformers 5.x: ``cache``, 4.x:
    ``past_key_values``); a module that takes none is refused."""
    params = forward_parameters(model)
    found = [name for name in ("cache", "past_key_values") if name in params]
    if not found:
        raise ModelLoadError(
            f"compile_lm: {type(model).__name__}.forward takes no cache (past_key_values): "
            "generation with a KV cache needs a transformers causal LM (or a module with "
            "its forward(input_ids, attention_mask, past_key_values, ...) contract)"
        )
    return found[0]


class LMStep(nn.Module):
    """One prefill (``past`` empty) or decode step of ``model`` (see the module docstring)."""

    def __init__(self, model: nn.Module, slot: bool = False) -> None:
        super().__init__()
        self.slot = slot  # the bucketed decode: the slot is an input (module docstring)
        params = forward_parameters(model)
        self.cache_argument = cache_argument(model)
        self.model = model
        self.takes_positions = "position_ids" in params
        self.takes_cache_position = "cache_position" in params
        self.takes_logits_to_keep = "logits_to_keep" in params

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past: tuple[torch.Tensor, ...] = (),
        slot: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        from transformers import DynamicCache

        new = input_ids.shape[1]
        if slot is not None:  # bucketed: ``slot`` is the new token's position, a tensor
            # (the mask comes as [batch, m, S], m the bucket count: a plain dim, from which
            # TVM's VM reads m; the past's S * m alone does not tell it)
            attention_mask = attention_mask.flatten(1)
            known = slot
            cache = DynamicCache()
            cache.layers = [
                slot_layer(_heads_first(past[i]), _heads_first(past[i + 1]), slot, bucket=True)
                for i in range(0, len(past), 2)
            ]
        elif past:  # the last position of ``past`` is the slot the new token fills
            known = past[0].shape[0] - new
            cache = DynamicCache()
            cache.layers = [
                slot_layer(_heads_first(past[i]), _heads_first(past[i + 1]), known)
                for i in range(0, len(past), 2)
            ]
        else:
            cache = DynamicCache()
            known = 0
        kwargs = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            self.cache_argument: cache,
            "use_cache": True,
        }
        if self.takes_positions:
            kwargs["position_ids"] = position_ids
        if self.takes_cache_position:
            kwargs["cache_position"] = (
                slot  # (one new token: its position in the cache)
                if slot is not None
                else torch.arange(known, known + new, device=input_ids.device)
            )
        if self.takes_logits_to_keep:
            kwargs["logits_to_keep"] = 1
        out = self.model(**kwargs)
        logits = out.logits if hasattr(out, "logits") else out[0]
        fresh = []
        for layer in cache.layers:
            # a decode step returns the new token's keys and values as the model made them,
            # not read back from the slot: the slot's select is then read by the attention
            # alone, which the warehouse's attention entry takes with the cache (cache=1)
            keys, values = getattr(layer, "fresh", (layer.keys, layer.values))
            fresh.append(keys.narrow(2, keys.shape[2] - new, new).permute(2, 0, 1, 3))
            fresh.append(values.narrow(2, values.shape[2] - new, new).permute(2, 0, 1, 3))
        return (logits[:, -1, :], *fresh)


def _heads_first(past: torch.Tensor) -> torch.Tensor:
    """``[length, batch, heads, dim]`` as the cache holds it, ``[batch, heads, length, dim]`` as
    transformers' cache layers hold it."""
    return past.permute(1, 2, 0, 3)


def slot_layer(
    keys: torch.Tensor, values: torch.Tensor, known: object, bucket: bool = False
) -> object:
    """A transformers cache layer over ``[batch, heads, known + 1, dim]`` keys and values whose
    last position is the new token's slot: ``update`` writes the new token there by a select,
    not a concatenation, so that every length in the step is the one symbolic length of the
    inputs (a concatenation's ``(length - 1) + 1`` is a length TVM's shape inference cannot
    prove equal to the mask's: BLOOM's ALiBi scores lost their shape).

    ``bucket``: ``known`` is a tensor ``[1]``, the slot anywhere in a past of a bucket's
    length ``Lb``; the masks are made over all ``Lb`` positions (``get_mask_sizes``), the
    causal one from the ``cache_position`` (the slot) the step passes, so the positions after
    the slot are masked (the causal and sliding-window masks count from the query's offset,
    ``get_seq_length``: the slot)."""
    from transformers.cache_utils import DynamicLayer

    length = keys.shape[-2]

    class SlotLayer(DynamicLayer):
        def get_seq_length(self) -> object:
            # (bucketed: the slot tensor; transformers' masks take it as the query's offset,
            # which a sliding window counts back from)
            return known

        def get_mask_sizes(self, query_length: int) -> tuple[object, int]:
            if bucket:
                return length, 0
            return super().get_mask_sizes(query_length)

        def update(self, key_states, value_states, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
            if key_states.shape[-2] != 1:
                raise ModelLoadError("compile_lm: a decode step takes one new token")
            self.fresh = (key_states, value_states)
            slot = (torch.arange(self.keys.shape[-2], device=self.keys.device) == known)[:, None]
            self.keys = torch.where(slot, key_states, self.keys)
            self.values = torch.where(slot, value_states, self.values)
            return self.keys, self.values

    layer = SlotLayer()
    layer.keys, layer.values, layer.device, layer.is_initialized = (
        keys,
        values,
        keys.device,
        True,
    )
    return layer
