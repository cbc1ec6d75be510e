"""``any`` and ``all``, which TVM 0.27's torch importer has no converter for (T5 in float16
checks ``isinf(h).any()`` before clamping; masks are tested with ``all``).

Relax has no boolean reduction: ``any`` is the ``max`` of the values as 0/1 integers, ``all``
their ``min``, returned as ``bool`` as torch does. ``fn(node, importer) -> relax.Expr`` for the
importer's ``custom_convert_map``.
"""

from __future__ import annotations

from typing import Any

from tvm import relax


def _reduce(reduce: Any) -> Any:
    def convert(node: Any, importer: Any) -> relax.Expr:
        x = importer.env[node.args[0]]
        dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
        if isinstance(dims, int):
            dims = [dims]
        bb = importer.block_builder
        dtype = str(x.ty.dtype)
        if dtype == "bool":  # (0.27 compares booleans as floats: LLVM refuses fcmp on i1)
            as_int = bb.emit(relax.op.astype(x, "int8"))
        else:
            as_int = bb.emit(relax.op.astype(relax.op.not_equal(x, relax.const(0, dtype)), "int8"))
        reduced = bb.emit(reduce(as_int, dims, keepdim))
        return bb.emit(relax.op.astype(reduced, "bool"))

    return convert


REDUCTION_CONVERTERS = {
    "any.default": _reduce(relax.op.max),
    "any.dim": _reduce(relax.op.max),
    "any.dims": _reduce(relax.op.max),
    "all.default": _reduce(relax.op.min),
    "all.dim": _reduce(relax.op.min),
    "all.dims": _reduce(relax.op.min),
}
