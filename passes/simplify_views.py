"""SimplifyViews: fold chains of reshapes and drop same-shape broadcasts.

Importers emit ``reshape(reshape(x))`` and ``broadcast_to(x, shape_of_x)`` around every
attention head split; once library calls take the surrounding operators, such chains are left
between kernels. A single reshape lowers to a view (``RewriteDataflowReshape``), but a fused
chain of them becomes a copy kernel, so the chain (``expand_dims``, ``squeeze`` and
``flatten`` are reshapes too) is folded into one reshape of its source and an identity
broadcast (or a pad of zero widths) into its input.

Chains of ``permute_dims`` that cancel out disappear: torch's SDPA decomposition returns the
attention output through three transposes (``[2, 0, 1, 3]``, ``[1, 2, 0, 3]``, ``[0, 2, 1, 3]``)
of which the first two cancel, leaving the single ``[0, 2, 1, 3]`` the attention entry takes as
its output layout (before, a copy kernel per layer).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax

from ._dataflow_rewrite import op_name, rewrite_bindings


def _same_shape(a: relax.Expr, b: relax.Expr) -> bool:
    sa, sb = getattr(a.ty, "shape", None), getattr(b.ty, "shape", None)
    if sa is None or sb is None or not hasattr(sa, "values") or not hasattr(sb, "values"):
        return False
    return len(sa.values) == len(sb.values) and all(
        tvm_ffi.structural_equal(x, y) for x, y in zip(sa.values, sb.values)
    )


def _zero_pad(value: relax.Expr) -> bool:
    """A ``nn.pad`` that pads nothing (importers emit them for TF-style "same" padding whose
    amount comes out zero): a copy kernel otherwise."""
    if op_name(value) != "relax.nn.pad":
        return False
    widths = getattr(value.attrs, "pad_width", None)
    return widths is not None and all(int(w) == 0 for w in widths)


@tvm.transform.module_pass(opt_level=0, name="SimplifyViews")
class SimplifyViews:
    """Fold ``reshape(reshape(x, a), b)`` into ``reshape(x, b)`` (``expand_dims``, ``squeeze``
    and ``flatten`` count as reshapes), ``reshape(astype(reshape(x, a)), shape(x))`` into
    ``astype(x)`` (a half-precision batched matmul's rounding between torch's flattening and its
    inverse); ``broadcast_to(x, shape(x))``, ``reshape(x, shape(x))`` and ``pad(x, 0...)`` into
    ``x``."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return rewrite_bindings(mod, _simplify, _finish)


def _finish(mod: tvm.IRModule) -> tvm.IRModule:
    # the views a folded chain skipped are read by nobody: dropped, so that use counts of
    # later passes (a scale behind a view read once) see only the live readers
    folded = relax.transform.CanonicalizeBindings()(relax.transform.Normalize()(mod))
    return relax.transform.DeadCodeElimination()(folded)


def _simplify(binding: relax.VarBinding, source: dict, bb: relax.BlockBuilder) -> relax.Expr | None:
    """The binding's simpler value, or None; ``source`` maps a reshape's var to the tensor it
    views (within one dataflow block)."""
    value = binding.value
    op = op_name(value)
    if (op in ("relax.reshape", "relax.broadcast_to") or _zero_pad(value)) and _same_shape(
        value.args[0], binding.var
    ):
        return value.args[0]
    if op == "relax.permute_dims":
        return _composed_permute(binding, value, source)
    if op == "relax.astype":  # a cast of a view: a reshape back to the source's shape folds
        inner = value.args[0]
        src = source.get(inner.id_) if isinstance(inner, relax.Var) else None
        if src is not None:
            source.setdefault(_CAST, {})[binding.var.id_] = (src, value.attrs.dtype)
        return None
    if op not in _RESHAPES or (op != "relax.reshape" and not _has_shape(binding.var)):
        return None
    inner = value.args[0]
    cast = source.get(_CAST, {}).get(inner.id_) if isinstance(inner, relax.Var) else None
    if cast is not None and _same_shape(cast[0], binding.var):
        return bb.normalize(relax.op.astype(*cast))  # reshape(astype(reshape(x)), shape(x))
    src = source.get(inner.id_) if isinstance(inner, relax.Var) else None
    source[binding.var.id_] = inner if src is None else src
    if src is None:
        return None
    shape = value.args[1] if op == "relax.reshape" else binding.var.ty.shape
    return bb.normalize(relax.op.reshape(src, shape))


# operators that only reshape (same elements, same order): a chain of them is one reshape
_RESHAPES = frozenset(("relax.reshape", "relax.expand_dims", "relax.squeeze", "relax.flatten"))


_CAST = "cast"  # key of the state: astype var -> (the tensor its input views, dtype)
_PERMUTED = "permuted"  # key of the state: permute_dims var -> (its source, axes from the source)


def _composed_permute(
    binding: relax.VarBinding, value: relax.Call, state: dict
) -> relax.Expr | None:
    """``permute_dims(...permute_dims(x, p)..., q)`` whose composition is the identity -> ``x``
    (a lone identity permutation too); later permutations of the chain then read ``x``."""
    rank = len(value.args[0].ty.shape.values) if _has_shape(value.args[0]) else None
    if rank is None:
        return None
    axes = value.attrs.axes
    own = list(range(rank))[::-1] if axes is None else [int(a) % rank for a in axes]
    permuted = state.setdefault(_PERMUTED, {})
    inner = value.args[0]
    earlier = permuted.get(inner.id_) if isinstance(inner, relax.Var) else None
    src, axes_from_src = (
        (inner, own) if earlier is None else (earlier[0], [earlier[1][a] for a in own])
    )
    permuted[binding.var.id_] = (src, axes_from_src)
    # only a chain that cancels out is rewritten: a composed non-identity permutation would
    # hide the two-step forms the binders read (k^T as a head split then a transpose)
    return src if axes_from_src == list(range(rank)) else None


def _has_shape(expr: relax.Expr) -> bool:
    shape = getattr(expr.ty, "shape", None)
    return shape is not None and hasattr(shape, "values")
