"""``torch.export`` of a causal LM's prefill and decode steps with symbolic batch and lengths.

Prefill takes ``input_ids``, ``attention_mask`` and ``position_ids`` of ``[batch, length]``;
decode takes them for one new token (``attention_mask`` covers the past and the new token) and
the past keys and values (``[past, batch, kv_heads, head_dim]`` each). ``batch`` is a symbolic
dim up to ``max_batch``, ``length`` and ``past`` up to ``max_length``: one compile of each
serves every size within them.

The bucketed decode (``export_steps(..., bucket=S)``, for CUDA graphs) takes the past as a
length bucket ``Lb = S * m`` (torch.export's derived dim: ``m`` takes at most
``ceil(max_length / S)`` values, so a graph per value can be captured; the attention mask
comes as ``[batch, m, S]``, so that ``m`` is a dim of an input) and the new token's
slot as an int64 tensor ``[1]`` after the mask and positions (:class:`LMStep` with
``slot=True``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..errors import ModelLoadError
from .step_module import LMStep

_EXAMPLE_BATCH = 2  # (torch.export specializes a dim whose example size is 0 or 1)
_EXAMPLE_LENGTH = 3
MIN_DECODE_PAST = 2  # the decode step's shortest past (a shorter one is run by prefill)


@dataclass(frozen=True)
class CacheLayout:
    """The KV cache of one model: per cache tensor (key, value per layer) its heads and head
    size, and the dtype."""

    shapes: tuple[tuple[int, int], ...]  # (kv_heads, head_dim) per tensor, key then value
    dtype: torch.dtype

    def bytes_per_token(self) -> int:
        """Cache bytes one position of one sequence takes (every layer, keys and values)."""
        item = torch.empty((), dtype=self.dtype).element_size()
        return sum(h * d for h, d in self.shapes) * item


@dataclass(frozen=True)
class StepPrograms:
    prefill: torch.export.ExportedProgram | None
    decode: torch.export.ExportedProgram
    layout: CacheLayout
    vocab_size: int
    bucket: int = 0  # the bucketed decode's length step S (0: today's decode, past = slot + 1)


def bucket_step(max_length: int, max_buckets: int, step: int = 64) -> int:
    """The length step ``S`` of the bucketed decode: ``step`` (64), halved while fewer than 4
    buckets would cover ``max_length`` (torch.export needs the example's bucket count strictly
    inside its range, and a few buckets keep the padding short), doubled while more than
    ``max_buckets`` would (each bucket is a CUDA graph per batch bucket: at most
    ``cuda_graph_max_sizes`` values). At least 2."""
    while step > 2 and -(-max_length // step) < 4:
        step //= 2
    while -(-max_length // step) > max(max_buckets, 1):
        step *= 2
    return step


def batch_buckets(max_batch: int) -> list[int]:
    """The batch sizes a bucketed decode runs: 1, 2, 4, ... below ``max_batch``, and it."""
    sizes, size = [], 1
    while size < max_batch:
        sizes.append(size)
        size *= 2
    return [*sizes, max_batch]


def _example(batch: int, length: int, vocab: int, start: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (batch, length), generator=gen)
    positions = torch.arange(start, start + length).expand(batch, length).contiguous()
    return ids, positions


def export_steps(
    model: torch.nn.Module,
    vocab_size: int,
    max_batch: int,
    max_length: int,
    bucket: int = 0,
    with_prefill: bool = True,
) -> StepPrograms:
    """Export ``model``'s prefill and decode steps (the module is not changed); ``bucket``:
    the bucketed decode's length step (module docstring), 0 for today's decode;
    ``with_prefill=False``: the decode alone (``prefill`` None)."""
    step = LMStep(model)
    name = type(model).__name__
    batch = _EXAMPLE_BATCH if max_batch >= 2 else 1
    length = min(_EXAMPLE_LENGTH, max_length - 1)
    if length < 2:
        raise ModelLoadError(f"compile_lm: max_length={max_length} is too short (at least 3)")
    # (the example must lie strictly inside the range: with max == the example batch the
    # program's sizes came out unknown to TVM; generate checks max_batch itself)
    b_dim = torch.export.Dim("batch", min=1, max=max(max_batch, batch + 1)) if batch > 1 else None
    t_dim = torch.export.Dim("length", min=1, max=max_length)
    # past + the new token; a past of 1 is a special case to torch.export (prefill runs then)
    total = torch.export.Dim("total", min=MIN_DECODE_PAST + 1, max=max_length)

    ids, positions = _example(batch, length, vocab_size)
    mask = torch.ones(batch, length, dtype=torch.long)
    with torch.no_grad(), eager_attention(model):
        first = step(ids, mask, positions)
    layout = CacheLayout(
        tuple((int(t.shape[2]), int(t.shape[3])) for t in first[1:]), first[1].dtype
    )
    seq = {0: b_dim, 1: t_dim}
    prefill = (
        _export(step, (ids, mask, positions), (seq, seq, seq), name, "prefill")
        if with_prefill
        else None
    )

    new_ids, new_positions = _example(batch, 1, vocab_size, start=length)
    one = {0: b_dim}
    if bucket:
        return StepPrograms(
            prefill,
            _export_bucketed(model, first[1:], new_ids, new_positions, b_dim, bucket, max_length),
            layout,
            vocab_size,
            bucket,
        )
    new_mask = torch.ones(batch, length + 1, dtype=torch.long)
    past = tuple(torch.cat([t, torch.zeros_like(t[:1])]) for t in first[1:])  # + the slot
    shapes = (one, {0: b_dim, 1: total}, one, tuple({0: total, 1: b_dim} for _ in past))
    decode = _export(step, (new_ids, new_mask, new_positions, past), shapes, name, "decode")
    return StepPrograms(prefill, decode, layout, vocab_size)


def _export_bucketed(
    model: torch.nn.Module,
    prompt_kv: tuple,
    new_ids: torch.Tensor,
    new_positions: torch.Tensor,
    b_dim: object,
    bucket: int,
    max_length: int,
) -> torch.export.ExportedProgram:
    """The bucketed decode: past ``[bucket * m, batch, heads, dim]``, the slot a tensor."""
    known = prompt_kv[0].shape[0]
    buckets = -(-max_length // bucket)
    example = max(2, -(-(known + 1) // bucket))  # (not 1: torch.export specializes it)
    # (the example strictly inside the range, as for the batch: a tiny max_length gets one
    # bucket more than it can use)
    m = torch.export.Dim("buckets", min=1, max=max(buckets, example + 1))
    total = bucket * m
    lb = bucket * example
    batch = new_ids.shape[0]
    past = tuple(
        torch.cat([t, torch.zeros(lb - known, *t.shape[1:], dtype=t.dtype)]) for t in prompt_kv
    )
    mask = torch.zeros(batch, lb, dtype=torch.long)
    mask[:, : known + 1] = 1
    mask = mask.view(batch, example, bucket)  # ([batch, m, S]: m a dim TVM can read)
    slot = torch.tensor([known])
    one = {0: b_dim}
    shapes = (one, {0: b_dim, 1: m}, one, tuple({0: total, 1: b_dim} for _ in past), None)
    args = (new_ids, mask, new_positions, past, slot)
    return _export(LMStep(model, slot=True), args, shapes, type(model).__name__, "decode")


@contextlib.contextmanager
def eager_attention(model: torch.nn.Module) -> Iterator[None]:
    """transformers' eager attention in ``model`` while it is exported, its own afterwards.

    Eager attention exports as matmul, mask, softmax and matmul, which the pipeline's attention
    entry matches (and ``torch.export``'s decomposition of SDPA fails on some models with a
    symbolic batch: GPT-2's output view after it)."""
    configs = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if hasattr(config, "_attn_implementation"):
            configs[id(config)] = config
    before = {key: config._attn_implementation for key, config in configs.items()}
    try:
        for config in configs.values():
            config._attn_implementation = "eager"
        yield
    finally:
        for key, config in configs.items():
            config._attn_implementation = before[key]


@contextlib.contextmanager
def without_fake_tensor_cache() -> Iterator[None]:
    """torch's fake-tensor dispatch cache off while a step is exported (the setting restored
    afterwards; the same graph is traced).

    The program's fake mode is created with the setting and kept in it, so the program's
    ``run_decompositions`` (:func:`plus_tvm.frontend.export_torch`) runs without the cache too.
    With the steps' symbolic batch and lengths a cache hit costs more than the fake kernel it
    saves: it rebuilds the output tensor with ``empty_strided`` over symbolic sizes, whose
    strides and contiguity are worked out again in Python ``SymInt`` arithmetic (on a tiny
    2-layer Qwen2, export and decomposition of both steps took 17-19 s of CPU with the cache,
    13.5-15 s without)."""
    import torch._dynamo.config as dynamo_config

    with dynamo_config.patch(fake_tensor_cache_enabled=False):
        yield


def _export(
    step: LMStep, args: tuple, dynamic_shapes: tuple, name: str, what: str
) -> torch.export.ExportedProgram:
    try:
        with torch.no_grad(), eager_attention(step.model), without_fake_tensor_cache():
            program = torch.export.export(
                step,
                args,
                dynamic_shapes=dynamic_shapes,
            )
    except Exception as err:  # noqa: BLE001 - the model's own forward runs here: any error
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ModelLoadError(
            f"compile_lm: torch.export of {name}'s {what} step failed: {first}"
        ) from err
    return _without_shape_asserts(program)


def _without_shape_asserts(
    program: torch.export.ExportedProgram,
) -> torch.export.ExportedProgram:
    """``program`` without the run-time asserts torch.export defers on symbolic sizes (a guard
    such as ``min(8 + 8 * past, 16 + 16 * past) == 8 + 8 * past`` on the cache's strides that it
    cannot prove over the whole range): they hold for every size within the limits, which
    ``generate`` checks before it runs, and TVM's importer has no converter for ``sym_min``."""
    graph = program.graph_module.graph
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target in _ASSERTS:
            graph.erase_node(node)
    graph.eliminate_dead_code()
    program.graph_module.recompile()
    return program


_ASSERTS = (
    torch.ops.aten._assert_scalar.default,
    torch.ops.aten.sym_constrain_range_for_size.default,
)
