"""ONNX nodes run on the host by ONNX's reference implementation (``plus.onnx_host``).

The importer (:mod:`plus_tvm.onnx_import.host_nodes`) sends here the nodes no converter can
compile: an op neither TVM nor plus_tvm converts, or a form that needs a runtime value where a
compiler needs a constant (a Reduce whose ``axes`` is a graph input, a Reshape to a computed
shape, a Resize to runtime sizes, ...). Such a node becomes

    R.call_pure_packed("plus.onnx_host", *inputs, model: str)

where ``model`` is a one-node ONNX model (base64) holding the node; its outputs are then matched
to the rank and dtype ONNX's shape inference gave (checked when it runs). A call evaluates the
node with ``onnx.reference.ReferenceEvaluator`` (made once per distinct node) on numpy copies of
the inputs and returns the outputs on the inputs' device. Slow (numpy, copies) but exactly the
ONNX specification's semantics; the compiled model reports such nodes in ``stats["host_nodes"]``.
"""

from __future__ import annotations

import base64
import threading
from dataclasses import dataclass

import numpy as np

from ..errors import HOST_NODE_MARKER

NAME = "plus.onnx_host"


@dataclass(frozen=True)
class HostNode:
    """A node ready to run: its evaluator, input names, output dtypes and description."""

    reference: object  # onnx.reference.ReferenceEvaluator
    inputs: list[str]
    dtypes: list[str]
    description: str  # "ReduceSum node sum_it" (the one-node graph's name)


class _Evaluators:
    """One ReferenceEvaluator per distinct node model (their ``run`` keeps no state)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._made: dict[str, HostNode] = {}

    def get(self, text: str) -> HostNode:
        with self._lock:
            made = self._made.get(text)
            if made is None:
                made = self._made[text] = evaluator(text)
            return made


def encode(model: object) -> str:
    """The string a host call carries for ``model`` (an ``onnx.ModelProto``)."""
    return base64.b64encode(model.SerializeToString()).decode("ascii")


def evaluator(text: str) -> HostNode:
    """The :class:`HostNode` of an :func:`encode`-d one-node model."""
    import onnx
    from onnx.reference import ReferenceEvaluator

    model = onnx.ModelProto()
    model.ParseFromString(base64.b64decode(text))
    dtypes = [
        str(onnx.helper.tensor_dtype_to_np_dtype(o.type.tensor_type.elem_type))
        for o in model.graph.output
    ]
    inputs = [i.name for i in model.graph.input]
    return HostNode(ReferenceEvaluator(model), inputs, dtypes, model.graph.name)


_EVALUATORS = _Evaluators()


def prepared(text: str) -> HostNode:
    """The :class:`HostNode` of ``text``, made once per process (the importer makes it to check
    the node, and the calls reuse it)."""
    return _EVALUATORS.get(text)


def run(*args: object) -> object:
    """``plus.onnx_host(*inputs, model)``: the node's outputs (one tensor, or a tuple)."""
    import tvm

    *tensors, text = args
    node = prepared(str(text))
    device = tensors[0].device if tensors else tvm.cpu()
    feeds = {name: t.numpy() for name, t in zip(node.inputs, tensors)}
    try:
        outs = node.reference.run(None, feeds)
    except Exception as err:  # noqa: BLE001 - the reference raises anything on bad values
        why = f"{type(err).__name__}: {err}"
        raise RuntimeError(f"ONNX {node.description} {HOST_NODE_MARKER}: {why}") from None
    results = [
        tvm.runtime.tensor(np.asarray(o, dtype=d, order="C"), device)  # (0-d stays 0-d)
        for o, d in zip(outs, node.dtypes)
    ]
    return results[0] if len(results) == 1 else tuple(results)


def register() -> None:
    import tvm_ffi

    tvm_ffi.register_global_func(NAME, run, override=True)
