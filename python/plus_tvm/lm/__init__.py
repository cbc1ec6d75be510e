"""Text generation with a KV cache (issue 38): :func:`compile_lm` compiles a causal LM's
prefill and decode steps once for every batch and length within limits; :class:`CompiledLM`
generates with them as transformers' ``generate`` does (docs/generation.md). torch is imported
when they are used, not with this package."""

from .build import compile_lm

__all__ = ["CompiledLM", "compile_lm"]


def __getattr__(name: str) -> object:
    if name == "CompiledLM":
        from .compiled_lm import CompiledLM

        return CompiledLM
    raise AttributeError(f"module 'plus_tvm.lm' has no attribute {name!r}")
