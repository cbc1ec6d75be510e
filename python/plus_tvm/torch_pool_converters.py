"""Max pooling with the stride left out: torch's default, the kernel size.

``F.max_pool2d(x, 2, padding=1)`` exports as ``max_pool2d_with_indices(x, [2, 2], [], [1, 1])``:
an empty stride list, which torch reads as "the kernel size". TVM 0.27's converters replace
only a missing (``None``) stride, and refused the empty list ("The input strides length is
expected to be 2"). Here an empty stride becomes the kernel size before TVM's own converter
runs (the graph being imported is not changed). ``fn(node, importer) -> relax.Expr``.
"""

from __future__ import annotations

from typing import Any

from tvm import relax

__all__ = ["POOL_CONVERTERS"]


class _WithArgs:
    """An fx.Node seen with other ``args`` (the converters only read its attributes)."""

    def __init__(self, node: Any, args: tuple) -> None:
        self._node = node
        self.args = args

    def __getattr__(self, name: str) -> Any:
        return getattr(self._node, name)


def _default_stride(key: str) -> Any:
    def convert(node: Any, importer: Any) -> relax.Expr:
        args = tuple(node.args)
        if len(args) > 2 and isinstance(args[2], (list, tuple)) and len(args[2]) == 0:
            node = _WithArgs(node, (args[0], args[1], args[1], *args[3:]))
        return type(importer).create_convert_map(importer)[key](node)

    convert.__name__ = key.replace(".", "_")
    return convert


POOL_CONVERTERS = {
    key: _default_stride(key)
    for key in (
        "max_pool2d.default",
        "max_pool2d_with_indices.default",
        "max_pool3d.default",
        "max_pool3d_with_indices.default",
    )
}
