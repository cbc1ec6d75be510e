"""``torch.empty`` and friends with symbolic sizes (TVM 0.27's converters pass the raw size).

TVM 0.27 converts ``empty.default`` / ``empty.memory_format`` / ``empty_permuted.default`` by
handing ``node.args[0]`` to ``relax.op.zeros`` unconverted: a size that holds a symbolic
dimension (a ``sym_size`` node: transformers' mixture-of-experts layers allocate their output as
``torch.empty_permuted((tokens, hidden), ...)`` under a symbolic batch) reaches ``ShapeExpr``
as an opaque Python object and the import stops. These converters resolve every size through
the importer (constants stay ints, symbolic ones become the graph's shape variables), take the
dtype torch computed for the node, and give zeros: ``empty``'s contents are undefined, so any
value is correct, and zeros keep an uninitialised read from ever being garbage. The physical
layout of ``empty_permuted`` (strides) has no meaning for a Relax tensor; its logical shape is
the size.
"""

from __future__ import annotations

from typing import Any

from tvm import relax

__all__ = ["EMPTY_CONVERTERS", "empty"]


def empty(node: Any, importer: Any) -> relax.Expr:
    """Zeros of the node's logical size (symbolic dimensions resolved) and torch's dtype."""
    size = importer.retrieve_args(node)[0]
    size = list(size) if isinstance(size, (list, tuple)) else [size]
    val = node.meta.get("val")
    if val is None:
        dtype = "float32"  # torch's default dtype, as TVM's own converter assumes
        if node.kwargs.get("dtype") is not None:
            dtype = importer._convert_data_type(node.kwargs["dtype"], importer.env)
    else:
        dtype = importer._convert_data_type(val.dtype)
    return importer.block_builder.emit(relax.op.zeros(relax.ShapeExpr(size), dtype))


EMPTY_CONVERTERS = {
    "empty.default": empty,
    "empty.memory_format": empty,
    "empty_permuted.default": empty,
}
