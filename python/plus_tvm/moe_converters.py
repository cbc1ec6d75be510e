"""Converters TVM 0.27's torch importer lacks for mixture-of-experts layers (issue 13).

transformers' default experts implementation (``grouped_mm``: Mixtral, Qwen-MoE, OLMoE, ...)
sorts the (token, expert) pairs by expert, counts the pairs per expert with ``torch.histc``,
turns the counts into offsets with ``cumsum`` and multiplies each group of rows by its expert's
weight: ``torch._grouped_mm``, or on CPU in float32 transformers' own custom op
``transformers::grouped_mm_fallback`` (a Python loop over the groups). None of the three has
a converter in 0.27, so every such model stopped at the importer.

- :func:`histc` follows ATen's CPU kernel: bin ``floor((x - min) * bins / (max - min))``
  corrected by one against the bin edges (ATen's local search), the top edge counted in the
  last bin, values outside ``[min, max]`` and NaN dropped; ``min == max`` takes the data's
  range (widened by one when the data are constant), as torch does.
- :func:`grouped_mm` computes the product with every expert in one batched matmul and keeps,
  for each row, its own group's (row ``s`` belongs to group ``#{e : offs[e] <= s}``; rows past
  the last offset are zero, as the fallback writes them). Exact, with static shapes and no
  data-dependent control flow, at ``num_experts / top_k`` times the multiply work of the
  grouped kernel: the price of a graph that TVM's static planner can compile.

Both are ``fn(node, importer) -> relax.Expr`` for the importer's ``custom_convert_map``.
"""

from __future__ import annotations

from typing import Any

from tvm import relax

from .errors import InputRefusedError

__all__ = ["MOE_CONVERTERS", "grouped_mm", "histc"]


def _arg(node: Any, i: int, name: str, default: Any) -> Any:
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


def _out_dtype(node: Any, importer: Any, fallback: str) -> str:
    val = node.meta.get("val")
    return importer._convert_data_type(val.dtype) if val is not None else fallback


def histc(node: Any, importer: Any) -> relax.Expr:
    """``aten.histc(x, bins=100, min=0, max=0)``: counts of ``x`` in ``bins`` equal bins."""
    bb = importer.block_builder
    x = importer.env[node.args[0]]
    bins = int(_arg(node, 1, "bins", 100))
    lo_v, hi_v = float(_arg(node, 2, "min", 0)), float(_arg(node, 3, "max", 0))
    if bins <= 0:
        raise InputRefusedError(f"histc: bins must be positive, got {bins}")
    if lo_v > hi_v:
        raise InputRefusedError(f"histc: max ({hi_v}) must not be below min ({lo_v})")
    work = "float64" if str(x.ty.dtype) == "float64" else "float32"
    flat = bb.emit(relax.op.astype(relax.op.reshape(x, [-1]), work))
    if lo_v == hi_v:  # torch: the data's range, widened by one when it is a point
        lo = bb.emit(relax.op.min(flat))
        hi = bb.emit(relax.op.max(flat))
        point = bb.emit(relax.op.equal(lo, hi))
        one = relax.const(1.0, work)
        lo = bb.emit(relax.op.where(point, relax.op.subtract(lo, one), lo))
        hi = bb.emit(relax.op.where(point, relax.op.add(hi, one), hi))
    else:
        lo, hi = relax.const(lo_v, work), relax.const(hi_v, work)
    width = bb.emit(relax.op.subtract(hi, lo))
    nbins = relax.const(float(bins), work)

    def edge(pos: relax.Expr) -> relax.Expr:  # lo + pos * (hi - lo) / bins
        return relax.op.add(lo, relax.op.divide(relax.op.multiply(pos, width), nbins))

    guess = bb.emit(
        relax.op.floor(
            relax.op.divide(relax.op.multiply(relax.op.subtract(flat, lo), nbins), width)
        )
    )
    up = relax.op.add(guess, relax.const(1.0, work))
    pos = bb.emit(
        relax.op.where(
            relax.op.greater(edge(guess), flat),
            relax.op.subtract(guess, relax.const(1.0, work)),
            relax.op.where(
                relax.op.logical_and(
                    relax.op.less_equal(up, nbins), relax.op.less_equal(edge(up), flat)
                ),
                up,
                guess,
            ),
        )
    )
    pos = bb.emit(relax.op.minimum(pos, relax.const(float(bins - 1), work)))  # top edge: last bin
    inside = bb.emit(
        relax.op.logical_and(relax.op.greater_equal(flat, lo), relax.op.less_equal(flat, hi))
    )
    ids = relax.op.arange(0, bins, 1, work)
    hit = relax.op.logical_and(
        relax.op.equal(relax.op.expand_dims(pos, 1), ids), relax.op.expand_dims(inside, 1)
    )
    out = _out_dtype(node, importer, str(x.ty.dtype))
    counts = bb.emit(relax.op.sum(relax.op.astype(hit, "int64"), axis=[0]))
    return bb.emit(relax.op.astype(counts, out))


def grouped_mm(node: Any, importer: Any) -> relax.Expr:
    """``input[S, K] @ weight[E, K, N]`` by groups of rows ending at ``offs[E]`` (cumulative)."""
    bb = importer.block_builder
    x, weight = importer.env[node.args[0]], importer.env[node.args[1]]
    offs_node = _arg(node, 2, "offs", None)
    if offs_node is None:
        raise InputRefusedError("grouped_mm without offs (a 3-D input) is not supported")
    offs = importer.env[offs_node]
    if _arg(node, 3, "bias", None) is not None:
        raise InputRefusedError("grouped_mm with a bias is not supported")
    if x.ty.ndim != 2 or weight.ty.ndim != 3:
        raise InputRefusedError(
            f"grouped_mm expects a 2-D input and 3-D weights, got ranks {x.ty.ndim} and "
            f"{weight.ty.ndim}"
        )
    rows_n = x.ty.shape.values[0]
    experts = weight.ty.shape.values[0]
    index = str(offs.ty.dtype)
    rows = relax.op.arange(rows_n, dtype=index)
    # group of row s: how many offsets are <= s (== num_experts past the last offset)
    le = relax.op.less_equal(relax.op.expand_dims(offs, 0), relax.op.expand_dims(rows, 1))
    group = bb.emit(relax.op.sum(relax.op.astype(le, "int32"), axis=[1]))
    mine = bb.emit(
        relax.op.equal(
            relax.op.expand_dims(group, 0),
            relax.op.expand_dims(relax.op.arange(experts, dtype="int32"), 1),
        )
    )  # [E, S]
    every = bb.emit(relax.op.matmul(relax.op.expand_dims(x, 0), weight))  # [E, S, N]
    dtype = _out_dtype(node, importer, str(every.ty.dtype))
    kept = relax.op.where(
        relax.op.expand_dims(mine, 2), every, relax.const(0.0, str(every.ty.dtype))
    )
    out = bb.emit(relax.op.sum(kept, axis=[0]))
    return out if str(out.ty.dtype) == dtype else bb.emit(relax.op.astype(out, dtype))


MOE_CONVERTERS = {
    "histc.default": histc,
    "grouped_mm_fallback.default": grouped_mm,
    "_grouped_mm.default": grouped_mm,
}
