"""Causal LMs to generate with, by reference: ``zoo:NAME`` (a zoo entry whose model is a
transformers LM head model: ``gpt2``, ``gpt2-tiny``, ``llama``, ``llama-tiny``) or
``arch:NAME`` (a decoder of :mod:`plus_tvm.arch_suite` with its causal-LM head, from the
suite's tiny config; ``arch:gpt2`` and ``arch:llama`` are tiny configs of those two, and
``arch:llama-150m`` the full-size LLaMA-style model of issue 38's generation table). Random
weights from ``seed``; nothing is downloaded."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import torch

from ..errors import UnknownModelError

# tiny configs of the two families the suite has no entry for (the suite's decoder sizes)
_EXTRA = MappingProxyType(
    {
        "gpt2": (
            "GPT2Config",
            {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64, "n_inner": 64},
        ),
        "llama": (
            "LlamaConfig",
            {
                "hidden_size": 32,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "intermediate_size": 64,
                "max_position_embeddings": 64,
            },
        ),
        # LLaMA-style, 134M parameters (about GPT-2 small's size; its LM head is untied):
        # 12 layers, hidden 768, 12 heads (no GQA), SwiGLU 2048, vocabulary 32000
        "llama-150m": (
            "LlamaConfig",
            {
                "vocab_size": 32000,
                "hidden_size": 768,
                "num_hidden_layers": 12,
                "num_attention_heads": 12,
                "num_key_value_heads": 12,
                "intermediate_size": 2048,
                "max_position_embeddings": 2048,
            },
        ),
    }
)
_TOKENS = {"vocab_size": 100, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2}


def arch_names() -> list[str]:
    """Every ``arch:NAME`` this module builds."""
    from .. import arch_suite

    decoders = [n for n, e in arch_suite.ENTRIES.items() if e["family"] == "decoder"]
    return [*_EXTRA, *decoders]


def parameter_count(model: torch.nn.Module) -> int:
    """Parameters of ``model``, each shared (tied) tensor counted once."""
    return sum(p.numel() for p in model.parameters())


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of ``model``'s parameters in their dtypes, each shared (tied) tensor once: what
    a decode step streams from memory (every weight is read once a step)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def arch_config(name: str, **overrides: Any) -> object:
    """The transformers config of ``arch:NAME`` (``overrides`` replace its fields)."""
    import transformers

    from .. import arch_suite

    if name in _EXTRA:
        cls, fields = _EXTRA[name]
        fields = {**_TOKENS, **fields}
    elif name in arch_suite.ENTRIES and arch_suite.ENTRIES[name]["family"] == "decoder":
        cls, fields = arch_suite.ENTRIES[name]["config"], dict(arch_suite.ENTRIES[name]["fields"])
    else:
        raise UnknownModelError(f"unknown decoder arch:{name}; known: {', '.join(arch_names())}")
    return getattr(transformers, cls)(**{**fields, **overrides})


def load_causal_lm(reference: str, seed: int = 0, **overrides: Any) -> torch.nn.Module:
    """The causal LM ``reference`` names (eval mode, random weights from ``seed``)."""
    import transformers

    kind, _, name = reference.partition(":")
    if kind == "arch":
        config = arch_config(name, **overrides)
        torch.manual_seed(seed)
        return transformers.AutoModelForCausalLM.from_config(config).eval()
    if kind == "zoo":
        from .. import zoo

        model = zoo.get(name).build(seed)
        inner = getattr(model, "model", None)
        if not isinstance(inner, transformers.GenerationMixin):
            raise UnknownModelError(
                f"zoo:{name} is not a causal LM (generation needs one: zoo:gpt2, zoo:llama, ...)"
            )
        return inner.eval()
    raise UnknownModelError(
        f"generate takes zoo:NAME or arch:NAME, got {reference!r} (arch: {', '.join(arch_names())})"
    )
