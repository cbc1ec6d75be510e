"""Text generation with a KV cache (issue 38): :func:`compile_lm` compiles a causal LM's
prefill and decode steps once for every batch and length within limits; :class:`CompiledLM`
generates with them as transformers' ``generate`` does (docs/generation.md)."""

from .compile_lm import compile_lm
from .compiled_lm import CompiledLM

__all__ = ["CompiledLM", "compile_lm"]
