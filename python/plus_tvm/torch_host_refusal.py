"""``host_fallback`` off for a model imported before: its torch host nodes refused by name.

``plus_tvm.compile(module, options=Options(host_fallback=False))`` refuses a torch op without a
converter while importing. A model handed over already imported (a :class:`LoadedModel`, such as
:func:`plus_tvm.dynamic_sequence.load_dynamic_sequence` returns) was imported with the host
fallback of its own import; :func:`refuse_torch_host_nodes` gives it the same refusal when the
compile's options turn the fallback off. ONNX host nodes (ONNX's reference implementation,
:mod:`plus_tvm.onnx_import.host_nodes`) are not what the option governs and stay.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import UnsupportedOperatorError
from .stats import host_nodes

if TYPE_CHECKING:
    from .loader import LoadedModel

# how torch_host_fallback's lines in stats["host_nodes"] name their op
TORCH_HOST_MARK = " of torch operator "


def refuse_torch_host_nodes(loaded: LoadedModel) -> LoadedModel:
    """``loaded`` itself when no torch node of it runs on the host, else an
    :class:`~plus_tvm.errors.UnsupportedOperatorError` naming those nodes and their ops."""
    torch_nodes = [line for line in host_nodes(loaded.mod) if TORCH_HOST_MARK in line]
    if not torch_nodes:
        return loaded
    raise UnsupportedOperatorError(
        f"{loaded.name}: host_fallback is off, but the model was imported with "
        f"{len(torch_nodes)} torch node(s) on the host (no converter): {'; '.join(torch_nodes)}"
    )
