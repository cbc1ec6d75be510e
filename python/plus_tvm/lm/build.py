"""``plus_tvm.compile_lm``: a causal LM compiled for generation with a KV cache."""

from __future__ import annotations

import typing

from ..errors import ModelLoadError, OptionsError
from ..options import Options

if typing.TYPE_CHECKING:  # pragma: no cover
    from .compiled_lm import CompiledLM


def compile_lm(
    model: object,
    target: object = "llvm",
    options: Options | None = None,
    max_batch: int = 8,
    max_length: int = 2048,
    decode_buckets: object = "auto",
) -> CompiledLM:
    """Compile a transformers causal LM (or a module with the same ``forward(input_ids,
    attention_mask, past_key_values, ...) -> logits`` contract) for text generation.

    The prefill step and the decode step are exported once each with symbolic batch (up to
    ``max_batch``) and lengths (up to ``max_length``, at most the model's position table:
    ``config.n_positions`` or ``config.max_position_embeddings`` where it has one) and
    compiled by :func:`plus_tvm.compile` (the plus pipeline: the linears, norms and attention
    are dispatched as in a forward pass). Both steps take the same weight buffers (one copy of
    each weight, placed on the device once: :mod:`plus_tvm.shared_weights`). The module is
    not changed.

    Parameters
    ----------
    decode_buckets : "auto", True or False
        The decode step's form. ``True``: the bucketed decode, whose shapes a CUDA graph can
        replay: the past is a length bucket (a multiple of a step ``S``: 64, or the power of
        two that makes ``ceil(max_length / S)`` at least 4 and at most
        ``options.cuda_graph_max_sizes``), the new token's slot a device tensor input, the
        batch padded to 1, 2, 4, ... ``max_batch``; attention then runs over the bucket's
        ``Lb`` positions instead of ``past + 1``. ``False``: the past is exactly the tokens
        so far (one shape per token). ``"auto"`` (default): bucketed on CUDA targets.
        ``stats["decode_buckets"]`` says which and how many shapes.

    Returns
    -------
    CompiledLM
        ``generate(input_ids, max_new_tokens, ...)``, and the two steps ``prefill`` and
        ``decode`` for a loop of one's own.
    """
    import torch  # (imported here: ``import plus_tvm`` does not need torch)

    from ..compiler import compile as plus_compile
    from ..shared_weights import share_weights
    from .checks import Limits
    from .compiled_lm import CompiledLM
    from .export import bucket_step, export_steps, without_fake_tensor_cache
    from .step_module import cache_argument

    if not isinstance(model, torch.nn.Module):
        raise ModelLoadError(
            f"compile_lm expects a torch causal LM module, got {type(model).__name__}"
        )
    for name, value, low in (("max_batch", max_batch, 1), ("max_length", max_length, 3)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise OptionsError(f"compile_lm: {name} must be an int >= {low}, got {value!r}")
    cache_argument(model)  # (refuses a module without a KV cache before anything else)
    options = options or Options()
    if decode_buckets not in ("auto", True, False):
        raise OptionsError(
            f"compile_lm: decode_buckets must be 'auto', True or False, got {decode_buckets!r}"
        )
    if any(m.training for m in model.modules()):
        if options.train_mode != "eval":
            raise ModelLoadError(
                f"compile_lm: {type(model).__name__} is in training mode: call model.eval() "
                "(or Options(train_mode='eval') to compile an eval-mode copy)"
            )
        from ..torch_model_prep import eval_copy

        model = eval_copy(model)
    config = getattr(model, "config", None)
    max_length = min(max_length, _position_limit(config) or max_length)
    vocab = _vocab_size(model, config)
    if decode_buckets == "auto":
        from ..target import resolve_target

        decode_buckets = resolve_target(target).kind.name == "cuda"
    # (at least 4 buckets: the export's example must lie strictly inside their range)
    bucket = bucket_step(max_length, max(options.cuda_graph_max_sizes, 4)) if decode_buckets else 0
    # (the steps' decompositions, in the compiles, without the fake-tensor cache as well)
    with without_fake_tensor_cache():
        programs = export_steps(model, vocab, max_batch, max_length, bucket)
        prefill = plus_compile(programs.prefill, target, options=options)
        decode = plus_compile(programs.decode, target, options=options)
    share_weights([prefill, decode])  # (each compile copied every weight: held once now)
    generation = getattr(model, "generation_config", None)
    eos = getattr(generation, "eos_token_id", None)
    pad = getattr(generation, "pad_token_id", None)
    limits = Limits(max_batch, max_length, vocab)
    return CompiledLM(
        prefill, decode, programs.layout, limits, eos, pad, type(model).__name__, programs.bucket
    )


def _position_limit(config: object) -> int | None:
    """The model's position table: the longest sequence it was built for, if it says."""
    for field in ("n_positions", "max_position_embeddings"):
        value = getattr(config, field, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _vocab_size(model: object, config: object) -> int:
    embeddings = getattr(model, "get_input_embeddings", None)
    table = embeddings() if callable(embeddings) else None
    rows = getattr(table, "num_embeddings", None)
    if isinstance(rows, int):
        return rows
    vocab = getattr(config, "vocab_size", None)
    if isinstance(vocab, int):
        return vocab
    raise ModelLoadError(
        f"compile_lm: cannot tell the vocabulary size of {type(model).__name__} "
        "(no input embedding table, no config.vocab_size)"
    )
