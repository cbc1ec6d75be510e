"""Fold an ONNX graph's shape arithmetic into constants before import.

Exporters and function-expanded operators compute shapes at run time: ``Shape`` of a tensor,
sliced, concatenated, divided, compared and fed to ``Reshape`` / ``Expand`` / ``Pad``. When the
shapes are static (ONNX shape inference knows them), every such value is a constant, but TVM's
converters only fold some of them: the rest reach ``Expand`` or ``Reshape`` as run-time tensors,
the result gets symbolic dimensions, and kernels over symbolic shapes both run slowly and (with
chains of symbolic divisions) take LLVM minutes to compile.

:func:`fold_constants` evaluates, with ONNX's own reference implementation, every node whose
inputs are all known and small (constants, ``Shape`` / ``Size`` of a statically shaped tensor,
or values folded before), and replaces it by ``Constant`` nodes. Weights are never folded into
the graph (inputs larger than :data:`MAX_FOLD_ELEMENTS` elements stop folding), nor are random,
control-flow and non-standard-domain nodes.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import TVM_FAILURE, raised_by

MAX_FOLD_ELEMENTS = 4096  # folded values are shapes, indices and scalars, never weights
_NEVER = frozenset(
    (
        "If",
        "Loop",
        "Scan",
        "RandomNormal",
        "RandomNormalLike",
        "RandomUniform",
        "RandomUniformLike",
        "Bernoulli",
        "Multinomial",
        "Dropout",  # training-mode dropout is random
        "SequenceConstruct",
        "SequenceEmpty",
        "Optional",
    )
)


def fold_constants(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose small constant computations are ``Constant`` nodes (or
    ``model`` itself when nothing folds)."""
    shapes = _static_shapes(model)
    known: dict[str, np.ndarray] = {}
    for init in model.graph.initializer:
        if _small(init.dims):
            known[init.name] = numpy_helper.to_array(init)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    folded: dict[int, list[tuple[str, np.ndarray]]] = {}
    for index, node in enumerate(model.graph.node):
        values = _fold(node, known, shapes, opset)
        if values is None:
            continue
        outputs = [(name, value) for name, value in zip(node.output, values) if name]
        if not all(_small(v.shape) for _, v in outputs):
            continue
        for name, value in outputs:
            known[name] = value
        if node.op_type != "Constant":
            folded[index] = outputs
    if not folded:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    for index, node in enumerate(model.graph.node):
        if index not in folded:
            out.graph.node.append(node)
            continue
        for name, value in folded[index]:
            out.graph.node.append(
                helper.make_node(
                    "Constant",
                    [],
                    [name],
                    name=f"{node.name or node.op_type}_folded_{name}"[:200],
                    value=numpy_helper.from_array(np.asarray(value), name),
                )
            )
    return out


def _small(dims) -> bool:
    total = 1
    for d in dims:
        total *= int(d)
    return total <= MAX_FOLD_ELEMENTS


def _static_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """Static shapes ONNX's shape inference finds for the graph's values."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError, ValueError):
        inferred = model
    out: dict[str, tuple[int, ...]] = {}
    graph = inferred.graph
    for info in (*graph.input, *graph.value_info, *graph.output):
        tensor = info.type.tensor_type
        if not info.type.HasField("tensor_type") or not tensor.HasField("shape"):
            continue
        dims = tensor.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            out[info.name] = tuple(int(d.dim_value) for d in dims)
    for init in graph.initializer:
        out[init.name] = tuple(int(d) for d in init.dims)
    return out


def _fold(node, known: dict, shapes: dict, opset: int) -> list[np.ndarray] | None:
    """The values of ``node``'s outputs when they are constant, else None."""
    if node.domain not in ("", "ai.onnx") or node.op_type in _NEVER:
        return None
    graphs = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
    if any(a.type in graphs for a in node.attribute):
        return None
    if node.op_type == "Constant":
        return _evaluate(node, [], opset)
    if node.op_type in ("Shape", "Size"):
        shape = shapes.get(node.input[0])
        if shape is None:
            return None
        if node.op_type == "Size":
            return [np.asarray(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        start, end = attrs.get("start", 0), attrs.get("end")
        return [np.asarray(shape[start:end], dtype=np.int64)]
    inputs = [name for name in node.input]
    if not inputs or not all(name == "" or name in known for name in inputs):
        return None
    return _evaluate(node, [known.get(name) if name else None for name in inputs], opset)


def _evaluate(node, values: list, opset: int) -> list[np.ndarray] | None:
    """Run one node with ONNX's reference evaluator (None when it cannot)."""
    from onnx.reference import ReferenceEvaluator

    names = [f"in{i}" if name else "" for i, name in enumerate(node.input)]
    single = helper.make_node(
        node.op_type, names, [f"out{i}" for i in range(len(node.output))], domain=node.domain
    )
    single.attribute.extend(node.attribute)
    graph = helper.make_graph(
        [single],
        "fold",
        [helper.make_tensor_value_info(n, _elem(v), v.shape) for n, v in zip(names, values) if n],
        [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in single.output],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    feeds = {n: v for n, v in zip(names, values) if n}
    try:
        # log(0) = -inf is a value, not a problem: numpy's floating-point warnings are muted
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            outputs = ReferenceEvaluator(model).run(None, feeds)
    except (*TVM_FAILURE, ArithmeticError) as err:  # the reference cannot run it: the node stays
        if not raised_by(err, ("onnx",)):
            raise  # plus_tvm's own bug
        return None
    arrays = []
    for value in outputs:
        if not isinstance(value, (np.ndarray, np.generic)) or np.asarray(value).dtype == object:
            return None
        arrays.append(np.asarray(value))
    return arrays


def _elem(value: np.ndarray) -> int:
    return helper.np_dtype_to_tensor_dtype(np.asarray(value).dtype)
