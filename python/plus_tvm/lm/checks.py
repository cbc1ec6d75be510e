"""What ``CompiledLM.generate`` checks before it computes anything: each refusal names the limit
or the input it breaks."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import InputError


@dataclass(frozen=True)
class Limits:
    max_batch: int
    max_length: int
    vocab_size: int


def as_ids(value: object, what: str) -> torch.Tensor:
    """``value`` (a tensor, array or nested list) as a 2-D int64 tensor on the CPU."""
    try:
        tensor = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as err:
        raise InputError(f"generate: {what} is not an array of integers ({err})") from None
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex or tensor.dtype == torch.bool:
        raise InputError(f"generate: {what} must hold integers, got {tensor.dtype}")
    if tensor.dim() != 2:
        raise InputError(
            f"generate: {what} must be 2-D [batch, length], got shape {tuple(tensor.shape)}"
        )
    return tensor.to(torch.long).cpu()


def check_request(
    ids: torch.Tensor, mask: torch.Tensor, max_new_tokens: object, limits: Limits
) -> int:
    """Check a request against the compiled limits; returns ``max_new_tokens`` as an int."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise InputError(f"generate: max_new_tokens must be an int, got {max_new_tokens!r}")
    if max_new_tokens < 0:
        raise InputError(f"generate: max_new_tokens must be >= 0, got {max_new_tokens}")
    batch, length = ids.shape
    if batch == 0:
        raise InputError("generate: the batch is empty (input_ids has 0 rows)")
    if length == 0:
        raise InputError("generate: empty prompt (input_ids has length 0): give at least one token")
    if batch > limits.max_batch:
        raise InputError(
            f"generate: batch {batch} is above max_batch={limits.max_batch} the model was "
            "compiled for (compile_lm(..., max_batch=...))"
        )
    if length + max_new_tokens > limits.max_length:
        raise InputError(
            f"generate: prompt length {length} + max_new_tokens {max_new_tokens} = "
            f"{length + max_new_tokens} is above max_length={limits.max_length} the model was "
            "compiled for (compile_lm(..., max_length=...))"
        )
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= limits.vocab_size:
        bad = low if low < 0 else high
        raise InputError(
            f"generate: token id {bad} in input_ids is outside the vocabulary "
            f"[0, {limits.vocab_size})"
        )
    if tuple(mask.shape) != tuple(ids.shape):
        raise InputError(
            f"generate: attention_mask has shape {tuple(mask.shape)}, input_ids "
            f"{tuple(ids.shape)}: they must match"
        )
    if bool(((mask != 0) & (mask != 1)).any()):
        raise InputError("generate: attention_mask must hold only 0 and 1")
    if bool((mask[:, -1] == 0).any()) or bool((mask[:, 1:] < mask[:, :-1]).any()):
        raise InputError(
            "generate: attention_mask must pad on the left (zeros before the prompt, the last "
            "position a token): a decoder-only model continues from the last position"
        )
    return max_new_tokens


def eos_ids(value: object, vocab_size: int) -> list[int]:
    """``eos_token_id`` (None, an int or a list of ints) as a list, each in the vocabulary."""
    if value is None:
        return []
    ids = [value] if isinstance(value, int) else list(value)
    for token in ids:
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab_size:
            raise InputError(
                f"generate: eos_token_id {token!r} is not a token id in [0, {vocab_size})"
            )
    return ids
