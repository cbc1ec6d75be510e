"""Max pooling: the stride left out, and the indices ``return_indices=True`` asks for.

``F.max_pool2d(x, 2, padding=1)`` exports as ``max_pool2d_with_indices(x, [2, 2], [], [1, 1])``:
an empty stride list, which torch reads as "the kernel size". TVM 0.27's converters replace
only a missing (``None``) stride, and refused the empty list ("The input strides length is
expected to be 2"). Here an empty stride becomes the kernel size before TVM's own converter
runs (the graph being imported is not changed).

TVM 0.27's ``max_pool2d_with_indices`` / ``max_pool3d_with_indices`` return float zeros as the
indices (a placeholder): a model that uses them (``return_indices=True``, ``MaxUnpool2d``) got
zeros silently. Such a node is refused by name; one whose indices go unused (every plain max
pooling exports so) compiles. ``fn(node, importer) -> relax.Expr``.
"""

from __future__ import annotations

import operator
from typing import Any

from tvm import relax

from .errors import InputRefusedError

__all__ = ["POOL_CONVERTERS"]


class _WithArgs:
    """An fx.Node seen with other ``args`` (the converters only read its attributes)."""

    def __init__(self, node: Any, args: tuple) -> None:
        self._node = node
        self.args = args

    def __getattr__(self, name: str) -> Any:
        return getattr(self._node, name)


def _indices_used(node: Any) -> bool:
    """Whether a user of ``node`` takes its second output (the indices)."""
    return any(
        user.target is operator.getitem and len(user.args) > 1 and user.args[1] == 1
        for user in getattr(node, "users", ())
    )


def _default_stride(key: str) -> Any:
    def convert(node: Any, importer: Any) -> relax.Expr:
        if key.endswith("_with_indices.default") and _indices_used(node):
            raise InputRefusedError(
                "the indices of max pooling (return_indices=True) are not computed: TVM "
                "0.27's converter returns zeros for them"
            )
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
