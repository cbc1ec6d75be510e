"""Converter fixes for TVM 0.27's torch importer (``from_exported_program``).

transformers builds its attention masks from boolean tensors (``cumsum`` over a bool mask,
``==`` between the results, ...). TVM 0.27 imports those ops keeping the boolean dtype where
torch promotes, so GPT-2 and LLaMA (among others) fail to compile or compile to wrong code:

- ``cumsum`` of a bool tensor stays bool (torch returns int64); LLVM codegen then aborts with
  ``Check failed: (t.MatchesCode(DLDataTypeCode::kDLFloat))`` in ``CodeGenLLVM::CreateAdd``.
- comparisons (``==``, ``!=``, ``<``, ...) of bool operands are emitted as floating-point
  compares on ``i1`` (``fcmp oeq i1``), which LLVM rejects; a bool tensor compared with a
  Python int (``mask == 2``) has the int cast to bool, which is also wrong. In GPT-2/LLaMA
  the mask code compares the (wrongly bool) ``cumsum`` results; any model comparing boolean
  masks meets it directly.
- ``slice`` along a negative dim (``x[..., :-1]``) becomes a ``strided_slice`` with a negative
  axis, which legalization rejects once a shape is symbolic (``Check failed: axis <
  src_tensor_dim (-1 vs. 2)``): GPT-2 and LLaMA with a dynamic batch dimension.
- true division and floating-point math of integer tensors (``a / b``, ``log(n)``) keep the
  integer dtype, where torch computes in floating point: DeBERTa-v2's relative positions
  (``log`` of an int64 tensor) fail to import, an integer ``/`` silently truncates.
- ``cat`` of an empty 1-D tensor with tensors of higher rank (torch skips it: transformers'
  KV cache starts as ``torch.tensor([])``) fails "Concat expects all input tensors to have
  same ndim": Mistral, Falcon, BLOOM, every model with a cache and ``use_cache`` on.

:func:`custom_convert_map` returns converters for those ops, in the format of the importer's
``custom_convert_map`` argument: ``fn(node: torch.fx.Node, importer) -> relax.Expr``, keyed by
the ATen overload name (``"cumsum.default"``, ``"eq.Tensor"``). They follow torch's type
promotion and hand every case that 0.27 gets right back to its own converter.

Examples
--------
>>> from tvm.relax.frontend.torch import from_exported_program
>>> mod = from_exported_program(ep, custom_convert_map=custom_convert_map())  # doctest: +SKIP
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from tvm import relax

from .errors import InputRefusedError
from .moe_converters import MOE_CONVERTERS
from .torch_advanced_index_converters import ADVANCED_INDEX_CONVERTERS
from .torch_arange_converters import ARANGE_CONVERTERS
from .torch_arg_extremes import ARG_EXTREME_CONVERTERS
from .torch_bool_arith import BOOL_ARITH_CONVERTERS
from .torch_clamp import CLAMP_CONVERTERS
from .torch_empty_converters import EMPTY_CONVERTERS
from .torch_index_converters import INDEX_CONVERTERS
from .torch_minmax_converters import MINMAX_CONVERTERS
from .torch_pool_converters import POOL_CONVERTERS
from .torch_random_refusal import RANDOM_REFUSALS
from .torch_reductions import REDUCTION_CONVERTERS
from .torch_scatter_converters import SCATTER_CONVERTERS
from .torch_sort_converters import SORT_CONVERTERS

__all__ = ["custom_convert_map"]

Converter = Callable[[Any, Any], relax.Expr]


def _tensor_dtype(value: object) -> str | None:
    """The dtype of a Relax tensor expression, or None for anything else (scalars, shapes)."""
    if isinstance(value, relax.Expr):
        ty = getattr(value, "ty", None)
        if isinstance(ty, relax.TensorType):
            return str(ty.dtype)
    return None


def cumsum_promote(node: Any, importer: Any) -> relax.Expr:
    """``aten.cumsum`` with torch's result dtype.

    Works around TVM 0.27 passing ``dtype=None`` to ``relax.op.cumsum`` unless the torch call
    gave one, so the sum keeps the input dtype: torch sums bool and integer inputs in int64,
    and a bool ``cumsum`` crashes LLVM codegen (``CreateAdd ... kDLFloat``); an int32 one
    silently returns int32. transformers' mask code (GPT-2, LLaMA) runs ``cumsum`` on a bool
    mask. The dtype is read from the node's fake tensor, which also covers ``dtype=``.
    """
    x = importer.env[node.args[0]]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if "out" in node.kwargs:
        raise InputRefusedError("cumsum with out= is not supported")
    val = node.meta.get("val")
    torch_dtype = val.dtype if val is not None else node.kwargs.get("dtype")
    dtype = importer._convert_data_type(torch_dtype) if torch_dtype is not None else None
    return importer.block_builder.emit(relax.op.cumsum(x, dim, dtype))


class _NodeWithArgs:
    """An fx.Node seen with other ``args``, to reuse a 0.27 converter on normalised arguments.

    The converters only read the node's attributes, so a view is enough and the graph being
    imported is never modified.
    """

    def __init__(self, node: Any, args: tuple[Any, ...]) -> None:
        self._node = node
        self.args = args

    def __getattr__(self, name: str) -> Any:
        return getattr(self._node, name)


def slice_positive_dim(node: Any, importer: Any) -> relax.Expr:
    """``aten.slice.Tensor`` with its dim made non-negative before conversion.

    Works around TVM 0.27 passing a negative dim straight to ``relax.op.strided_slice``: static
    shapes cope with it, but when a shape is symbolic (dynamic batch) legalization calls
    ``topi.dynamic_strided_slice_with_axes``, which fails ``axis < src_tensor_dim (-1 vs. 2)``.
    transformers' GPT-2/LLaMA mask code (``torch.diff``) slices along dim -1.
    """
    # torch.export passes dim positionally (0.27's _slice reads only args too).
    dim = node.args[1] if len(node.args) > 1 else 0
    ndim = importer.env[node.args[0]].ty.ndim
    if isinstance(dim, int) and dim < 0 and ndim >= 0:  # ndim -1: unknown rank, leave as is
        node = _NodeWithArgs(node, (node.args[0], dim + ndim, *node.args[2:]))
    return importer._slice(node)


def _bool_safe_comparison(relax_op: Callable, intrinsic: Callable, key: str) -> Converter:
    """A converter for comparison ``key`` that never compares in the bool dtype."""

    def convert(node: Any, importer: Any) -> relax.Expr:
        lhs, rhs = importer.retrieve_args(node)[:2]
        ldt, rdt = _tensor_dtype(lhs), _tensor_dtype(rhs)
        if ldt != "bool" and rdt != "bool":
            return importer._binary_op(relax_op, intrinsic)(node)
        if ldt is not None and rdt is not None:
            if ldt != rdt:
                # Mixed dtypes: 0.27 promotes to the non-bool dtype, which is correct.
                return importer._binary_op(relax_op, intrinsic)(node)
            work = "int8"  # both bool: compare as 0/1 integers
        else:
            scalar = rhs if ldt is not None else lhs
            if isinstance(scalar, bool):
                work = "int8"
            elif isinstance(scalar, int):
                work = "int64"
            elif isinstance(scalar, float):
                work = "float32"
            else:
                return importer._binary_op(relax_op, intrinsic)(node)

        def operand(value: object) -> relax.Expr:
            if _tensor_dtype(value) is not None:
                return importer.block_builder.emit(relax.op.astype(value, work))
            return relax.const(value, work)

        return importer.block_builder.emit(relax_op(operand(lhs), operand(rhs)))

    convert.__name__ = f"compare_{key.replace('.', '_')}"
    convert.__doc__ = (
        f"``aten.{key}`` on bool operands, compared as integers.\n\n"
        "Works around TVM 0.27 emitting the comparison in the bool dtype, which LLVM turns "
        "into a float compare on ``i1`` (``fcmp oeq i1``) and rejects; with a Python int "
        "operand (``mask == 2``) 0.27 also casts the int to bool, giving wrong results. "
        "Models comparing boolean masks meet it (and GPT-2/LLaMA's mask code does once "
        "0.27's bool ``cumsum`` feeds it)."
    )
    return convert


_COMPARISONS = {
    "eq": (relax.op.equal, operator.eq),
    "ne": (relax.op.not_equal, operator.ne),
    "lt": (relax.op.less, operator.lt),
    "le": (relax.op.less_equal, operator.le),
    "gt": (relax.op.greater, operator.gt),
    "ge": (relax.op.greater_equal, operator.ge),
}


# ATen ops whose result is floating point whatever the operands: torch promotes integer and
# bool operands (to the default float dtype); TVM 0.27's converters keep the integer dtype.
FLOAT_RESULT_OPS = (
    "div.Tensor",
    "div.Scalar",
    "log.default",
    "log2.default",
    "log10.default",
    "log1p.default",
    "exp.default",
    "expm1.default",
    "sqrt.default",
    "rsqrt.default",
    "sin.default",
    "cos.default",
    "tan.default",
    "tanh.default",
    "sigmoid.default",
    "erf.default",
    "reciprocal.default",
)


def _original(importer: Any, key: str) -> Callable[[Any], relax.Expr]:
    """TVM 0.27's own converter for ``key`` (the importer's map has ours in its place)."""
    return type(importer).create_convert_map(importer)[key]


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


def promote_to_result_dtype(key: str) -> Converter:
    """``key``'s converter with integer / bool tensor operands cast to the node's floating
    result dtype first (torch's type promotion for true division and float math).

    The cast operands reach TVM's converter through placeholder nodes of a scratch fx graph
    bound in the importer's environment; the graph being imported is never modified.
    """

    def convert(node: Any, importer: Any) -> relax.Expr:
        import torch

        val = node.meta.get("val")
        out = importer._convert_data_type(val.dtype) if val is not None else None
        if out is not None and _is_float(out):
            scratch = torch.fx.Graph()
            args, changed = [], False
            for arg in node.args:
                dtype = (
                    _tensor_dtype(importer.env.get(arg)) if isinstance(arg, torch.fx.Node) else None
                )
                if dtype is not None and not _is_float(dtype):
                    cast = importer.block_builder.emit(relax.op.astype(importer.env[arg], out))
                    arg = scratch.placeholder(f"{arg.name}_as_{out}")
                    importer.env[arg] = cast
                    changed = True
                args.append(arg)
            if changed:
                node = _NodeWithArgs(node, tuple(args))
        return _original(importer, key)(node)

    return convert


def cat_skip_empty(node: Any, importer: Any) -> relax.Expr:
    """``aten.cat`` without the empty 1-D operands torch skips (legacy rule: a tensor of shape
    ``(0,)`` concatenates with anything); TVM 0.27 rejects the rank mismatch."""
    tensors = node.args[0]
    rank = max((_rank(t) for t in tensors), default=-1)
    kept = [t for t in tensors if not (rank > 1 and _shape(t) == (0,))]
    if len(kept) == 1 and len(tensors) > 1:
        return importer.env[kept[0]]  # the cache's first step: the new keys themselves
    if len(kept) != len(tensors) and kept:
        node = _NodeWithArgs(node, (kept, *node.args[1:]))
    return importer._cat(node)


def div_mode_typed_scalar(node: Any, importer: Any) -> relax.Expr:
    """``aten.div.Tensor_mode`` (``//``, ``div(rounding_mode=)``) with a Python number operand
    made a constant of the tensor's dtype; TVM 0.27 makes every int an int32 constant, and
    ``floor_divide`` of an int64 tensor by it fails to import ("Binary operators must have the
    same datatype"): ``perm // top_k`` in transformers' mixture-of-experts routing."""
    x, divisor = importer.env[node.args[0]], node.args[1]
    dtype = _tensor_dtype(x)
    mode = node.args[2] if len(node.args) > 2 else node.kwargs.get("rounding_mode")
    if dtype is None or not isinstance(divisor, (int, float)) or isinstance(divisor, bool):
        return _original(importer, "div.Tensor_mode")(node)
    if not _is_float(dtype) and isinstance(divisor, float):
        return _original(importer, "div.Tensor_mode")(node)  # torch promotes: not this case
    rhs = relax.const(divisor, dtype)
    bb = importer.block_builder
    if mode == "floor":
        return bb.emit(relax.op.floor_divide(x, rhs))
    if mode == "trunc" and _is_float(dtype):
        return bb.emit(relax.op.trunc(bb.emit(relax.op.divide(x, rhs))))
    if mode == "trunc":
        return bb.emit(relax.op.divide(x, rhs))  # integer division truncates
    return _original(importer, "div.Tensor_mode")(node)


def _shape(node: Any) -> tuple | None:
    val = node.meta.get("val") if hasattr(node, "meta") else None
    return tuple(val.shape) if val is not None and hasattr(val, "shape") else None


def _rank(node: Any) -> int:
    shape = _shape(node)
    return len(shape) if shape is not None else -1


def custom_convert_map() -> dict[str, Converter]:
    """Converters that replace buggy TVM 0.27 ones, for ``from_exported_program``.

    Returns
    -------
    dict of str to callable
        A new dict on every call (callers may extend it), mapping ATen overload names such as
        ``"cumsum.default"`` and ``"eq.Tensor"`` to ``fn(node, importer) -> relax.Expr``.
    """
    fixes: dict[str, Converter] = {
        "cumsum.default": cumsum_promote,
        "slice.Tensor": slice_positive_dim,
        "cat.default": cat_skip_empty,
        "div.Tensor_mode": div_mode_typed_scalar,
        **MOE_CONVERTERS,  # ops 0.27 has no converter for at all
        **INDEX_CONVERTERS,  # indexing with torch's bounds checked
        **REDUCTION_CONVERTERS,  # any / all, which 0.27 lacks
        **CLAMP_CONVERTERS,  # integer bounds, clamp_max's bound, bound dtypes
        **MINMAX_CONVERTERS,  # amax / amin, which 0.27 lacks
        **ARG_EXTREME_CONVERTERS,  # argmax / argmin / max.dim / min.dim with torch's NaN rule
        **POOL_CONVERTERS,  # max pooling with the stride left out (the kernel size)
        **SORT_CONVERTERS,  # sort / argsort / topk with torch's NaN order
        **SCATTER_CONVERTERS,  # scatter_add / scatter_reduce, which 0.27 lacks
        **ADVANCED_INDEX_CONVERTERS,  # x[i, :, j], x[mask], index_put (index_add, y[mask] = v)
        **ARANGE_CONVERTERS,  # a negative step, which 0.27 sizes wrongly
        **EMPTY_CONVERTERS,  # empty / empty_permuted with symbolic sizes
        **RANDOM_REFUSALS,  # randn / exponential / bernoulli, which 0.27 makes constants
        **BOOL_ARITH_CONVERTERS,  # bool * bool (isfinite's decomposition) as a logical and
    }
    for key in FLOAT_RESULT_OPS:
        fixes[key] = promote_to_result_dtype(key)
    for op, (relax_op, intrinsic) in _COMPARISONS.items():
        for overload in ("Tensor", "Scalar"):
            key = f"{op}.{overload}"
            fixes[key] = _bool_safe_comparison(relax_op, intrinsic, key)
    return fixes
