"""``host_fallback`` off for a model imported with host nodes: refused by name.

``plus_tvm.compile(module, options=Options(host_fallback=False))`` refuses a torch op without a
converter while importing. A model imported with host nodes all the same is refused here with
the same error when the compile's options turn the fallback off: a :class:`LoadedModel` handed
over already imported (such as :func:`plus_tvm.dynamic_sequence.load_dynamic_sequence` returns),
and an ONNX model whose nodes the importer sent to ONNX's reference implementation
(:mod:`plus_tvm.onnx_import.host_nodes`: slow numpy on copies, which a user turning the fallback
off asked not to get).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import UnsupportedOperatorError
from .stats import host_nodes

if TYPE_CHECKING:
    from .loader import LoadedModel

# how torch_host_fallback's lines in stats["host_nodes"] name their op
TORCH_HOST_MARK = " of torch operator "


def refuse_host_nodes(loaded: LoadedModel) -> LoadedModel:
    """``loaded`` itself when no node of it runs on the host, else an
    :class:`~plus_tvm.errors.UnsupportedOperatorError` naming those nodes and their ops."""
    found = host_nodes(loaded.mod)
    if not found:
        return loaded
    kind = "torch" if all(TORCH_HOST_MARK in line for line in found) else "host"
    raise UnsupportedOperatorError(
        f"{loaded.name}: host_fallback is off, but the model was imported with "
        f"{len(found)} {kind} node(s) on the host (no converter): {'; '.join(found)}"
    )
