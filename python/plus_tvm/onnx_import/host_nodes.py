"""ONNX nodes no converter compiles, run on the host by ONNX's reference implementation.

A node goes to the host (``plus.onnx_host``, :mod:`plus_tvm.runtime.onnx_host`) when its op has
no converter, or when its converter fails, typically because an input it needs as a constant is
a runtime value (``axes`` of a Reduce, the shape of a Reshape, the sizes of a Resize, the pads of
a Pad given as graph inputs). It must be a standard-domain, deterministic op that ONNX's reference
implementation has for the model's opset, with every output's element type and rank known from
ONNX's shape inference. The call's outputs are matched to those ranks (static dims where
inference knew them, fresh symbolic ones elsewhere), so the rest of the graph compiles as usual.
Anything else keeps the converter's error.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import tvm
from onnx import helper
from tvm import relax

from ..runtime import onnx_host

# Random ops (every call must draw anew: a pure call could be merged or hoisted) and ops of
# training graphs; ``If``/``Loop``/``Scan`` bodies read outer-scope values a one-node model lacks.
EXCLUDED = frozenset(
    (
        "Bernoulli",
        "Dropout",
        "If",
        "Loop",
        "Multinomial",
        "RandomNormal",
        "RandomNormalLike",
        "RandomUniform",
        "RandomUniformLike",
        "Scan",  # (ONNX's reference gets Scan-8 and a scalar Scan-9 test wrong)
    )
)


class NotForHostError(Exception):
    """The node cannot run on the host (the message says why)."""


@dataclass(frozen=True)
class ValueType:
    """An ONNX value's element type and dims (None: unknown; a dim None: not static)."""

    elem: int
    dims: tuple[int | None, ...] | None


def infer_types(model: onnx.ModelProto) -> dict[str, ValueType]:
    """Element type and dims of every value ONNX's shape inference can type."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except (onnx.shape_inference.InferenceError, ValueError, RuntimeError):
        inferred = model
    graph = inferred.graph
    types = {}
    for info in [*graph.input, *graph.value_info, *graph.output]:
        if info.type.WhichOneof("value") != "tensor_type":
            continue
        tensor = info.type.tensor_type
        if not tensor.elem_type:
            continue
        dims = None
        if tensor.HasField("shape"):
            dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim)
        types[info.name] = ValueType(tensor.elem_type, dims)
    return types


def supported(node: onnx.NodeProto, opset: int) -> str | None:
    """Why ``node`` cannot go to the host, or None when its op can."""
    from onnx.reference.ops import load_op

    if node.domain not in ("", "ai.onnx"):
        return f"domain {node.domain} is not ONNX's standard one"
    if node.op_type in EXCLUDED:
        return f"{node.op_type} is not run on the host (random, training-only or with a body)"
    try:
        load_op("", node.op_type, opset)
    except (RuntimeError, ValueError, NotImplementedError, KeyError) as err:
        return f"ONNX's reference implementation has no {node.op_type} for opset {opset} ({err})"
    return None


def host_call(
    bb: relax.BlockBuilder,
    node: onnx.NodeProto,
    inputs: list[relax.Expr | None],
    types: dict[str, ValueType],
    model: onnx.ModelProto,
    opset: int,
    tag: str,
) -> list[relax.Expr]:
    """The node's outputs (one per non-empty output name) from a ``plus.onnx_host`` call.

    Raises :class:`NotForHostError` when it cannot run there (a reason above)."""
    reason = supported(node, opset)
    if reason is not None:
        raise NotForHostError(reason)
    outputs = [o for o in node.output if o]
    out_types = []
    for name in outputs:
        value = types.get(name)
        if value is None or value.dims is None:
            rank = _reduce_rank(node, inputs)  # (a Reduce's output has its input's dtype)
            if rank is not None:
                elem = helper.np_dtype_to_tensor_dtype(np.dtype(str(inputs[0].ty.dtype)))
                value = ValueType(value.elem if value else elem, (None,) * rank)
        if value is None or value.dims is None:
            raise NotForHostError(f"ONNX's shape inference gives no rank for output {name!r}")
        out_types.append(value)
    args, graph_inputs = [], []
    for name, expr in zip(node.input, inputs):
        if not name:
            continue
        if expr is None or not isinstance(expr.ty, relax.TensorType) or expr.ty.dtype == "":
            raise NotForHostError(f"input {name!r} is not a tensor of known dtype")
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(str(expr.ty.dtype)))
        graph_inputs.append(helper.make_tensor_value_info(name, elem, None))
        args.append(expr)
    graph = helper.make_graph(
        [node],
        f"{node.op_type} node {node.name or '(unnamed)'}",
        graph_inputs,
        [helper.make_tensor_value_info(n, t.elem, None) for n, t in zip(outputs, out_types)],
    )
    one = helper.make_model(graph, opset_imports=list(model.opset_import))
    one.ir_version = model.ir_version
    text = onnx_host.encode(one)
    try:
        onnx_host.prepared(text)  # a node the reference cannot even load fails here, not later
    except Exception as err:  # noqa: BLE001 - the reference raises anything on a bad node
        raise NotForHostError(f"ONNX's reference implementation refuses it ({err})") from err
    dtypes = [str(helper.tensor_dtype_to_np_dtype(t.elem)) for t in out_types]
    loose = [relax.TensorType(ndim=len(t.dims), dtype=d) for t, d in zip(out_types, dtypes)]
    ty = loose[0] if len(loose) == 1 else relax.TupleType(loose)
    call = bb.emit(
        relax.call_pure_packed(onnx_host.NAME, *args, tvm.ir.StringImm(text), ty_args=ty)
    )
    results = []
    for i, (value, dtype) in enumerate(zip(out_types, dtypes)):
        item = call if len(out_types) == 1 else bb.emit(relax.TupleGetItem(call, i))
        dims = [
            d if d is not None else tvm.tirx.Var(f"{tag}_{i}_{k}", "int64")
            for k, d in enumerate(value.dims)
        ]
        results.append(bb.match_cast(item, relax.TensorType(dims, dtype)))
    return results


def _reduce_rank(node: onnx.NodeProto, inputs: list[relax.Expr | None]) -> int | None:
    """The output rank of a Reduce* node whose ``axes`` is a runtime tensor of static length,
    which ONNX's shape inference leaves unknown when ``keepdims`` is 0: the input's rank less
    the number of axes (every axis once, as the specification requires), or with no axes the
    input's rank (``noop_with_empty_axes``) or 0 (every axis reduced)."""
    if not node.op_type.startswith("Reduce") or len(inputs) < 2 or inputs[1] is None:
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    data, axes = inputs[0].ty, inputs[1].ty
    if data.ndim < 0:
        return None
    if attrs.get("keepdims", 1):
        return data.ndim
    if axes.ndim != 1 or not isinstance(axes.shape, relax.ShapeExpr):
        return None
    length = axes.shape.values[0]
    if not isinstance(length, tvm.tirx.IntImm):
        return None  # (TVM's importer reads a declared length 0 as unknown)
    if int(length) == 0:
        return data.ndim if attrs.get("noop_with_empty_axes", 0) else 0
    return data.ndim - int(length)
