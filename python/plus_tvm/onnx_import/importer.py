"""plus_tvm's ONNX importer: TVM's graph importer with fixes, never a patched TVM.

Before import, small constant computations (shape arithmetic) are folded into constants with
ONNX's reference implementation (:mod:`.fold_constants`). :class:`PlusONNXImporter` subclasses
TVM 0.27's ``ONNXGraphImporter`` and changes six things:

- **converters first from plus_tvm** (:data:`plus_tvm.onnx_import.converters.CONVERTERS`): ops
  TVM has no converter for, and ONNX forms TVM's converters get wrong, one file per op;
- **shape values where tensors are expected**: TVM keeps ``Shape`` results as ``ShapeExpr`` and
  refuses them as inputs of any op outside a short list ("cannot handle ShapeExpr inputs"); a
  node outside that list gets them as int64 tensors (``shape_to_tensor``), which every
  converter takes. This is what function-expanded ops (LayerNormalization, Attention, ...) need;
- **shape-like initializers are constants**: with weights kept as inputs, TVM turns *every*
  initializer into a parameter, so a Reshape, Slice or Reduce whose shape, axes or pads come
  from an initializer fails ("Only constant axes"); integer and boolean initializers and float
  scalars become constants, weights stay parameters;
- **half precision as ONNX Runtime computes it**: matrix products and convolutions of
  ``float16`` / ``bfloat16`` tensors accumulate in float32 and round once
  (:mod:`.converters.contraction`); reductions, normalizations and softmax run in float32
  (:mod:`.converters.half_precision`);
- **inputs keep the graph's names**: TVM renames an input whose name is not an identifier
  (``input.1`` becomes ``input_1``), so input errors named inputs the model does not have;
- **errors name the node**: a converter failure becomes an
  :class:`~plus_tvm.errors.UnsupportedOperatorError` naming the node's index, name and op type
  and the converter's reason; what TVM prints while converting is kept out of the user's
  stdout and added to the message.
"""

from __future__ import annotations

import contextlib
import io
import json
import warnings
from dataclasses import dataclass

import numpy as np
import onnx
import tvm
from onnx import numpy_helper
from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import ONNXGraphImporter, _get_convert_map

from ..errors import TVM_FAILURE, PlusError, UnsupportedOperatorError, is_refusal
from ..stats import HOST_NODES_ATTR
from . import host_nodes
from .converters import CONVERTERS, half_precision
from .fold_constants import fold_constants

# Ops whose TVM converters take ``ShapeExpr`` inputs (TVM's own list in ``_construct_nodes``;
# kept as data here because a node of any other op gets shape values as tensors).
SHAPE_OPS = frozenset(
    (
        "Reshape",
        "Resize",
        "ConstantOfShape",
        "Gather",
        "Slice",
        "Shape",
        "Expand",
        "Concat",
        "Equal",
        "Where",
        "Cast",
        "CastLike",
        "Squeeze",
    )
)
DIRECT_OPS = frozenset(("If", "Constant"))  # handled by the importer itself / a converter
ALL_OR_NOTHING = frozenset(("Concat",))  # take shape values only when every input is one


def supported_ops() -> set[str]:
    """Every ONNX op type the importer converts (TVM's converters and plus_tvm's)."""
    return set(_get_convert_map()) | set(CONVERTERS) | DIRECT_OPS


@dataclass(frozen=True)
class _OneNode:
    """A graph view holding one node: TVM's node loop runs on it, one node at a time."""

    node: tuple


class PlusONNXImporter(ONNXGraphImporter):
    """TVM's ONNX graph importer with plus_tvm's converters and fixes (module docstring)."""

    def __init__(
        self, *args, where: str = "model", model: onnx.ModelProto | None = None, **kwargs
    ) -> None:
        super().__init__(*args, **kwargs)
        self.where = where
        self._domain = ""  # of the node being converted
        self._model = model  # for host nodes (None: none run on the host)
        self._types: dict | None = None  # shape inference's, on the first host node only
        self.host_nodes: list[str] = []  # "#index 'name' of type Op: why", in graph order

    # ------------------------------------------------------------------ initializers
    def _parse_graph_initializers(self, graph) -> None:
        super()._parse_graph_initializers(graph)
        if not self._keep_params_in_input:
            return
        for init in graph.initializer:
            var_name = init.name.removeprefix("onnx::")
            if var_name not in self._params or not _shape_like(init):
                continue
            array = numpy_helper.to_array(init)
            self._nodes[init.name] = relax.const(array, array.dtype.name)
            del self._params[var_name]

    # ---------------------------------------------------------------------- op support
    def _check_for_unsupported_ops(self, graph) -> None:
        known = supported_ops()
        for index, node in enumerate(graph.node):
            if node.op_type not in known and not self._may_run_on_host(node):
                raise UnsupportedOperatorError(
                    f"{self.where}: unsupported ONNX operator {_describe(node, index)}: neither "
                    "TVM 0.27's ONNX importer nor plus_tvm has a converter for it"
                )

    def _convert_operator(self, op_name, inputs, attrs, opset):
        standard = self._domain in ("", "ai.onnx")
        if standard and half_precision.needs_float32(op_name, inputs):
            return half_precision.in_float32(
                self.bb, inputs, lambda cast: self._convert_one(op_name, cast, attrs, opset)
            )
        return self._convert_one(op_name, inputs, attrs, opset)

    def _convert_one(self, op_name, inputs, attrs, opset):
        converter = CONVERTERS.get(op_name)
        if self._domain not in ("", "ai.onnx"):
            converter = None  # plus_tvm's converters are for the standard ops (not contrib)
        if converter is None:
            return super()._convert_operator(op_name, inputs, attrs, opset)
        sym = converter.get_converter(opset)(self.bb, inputs, attrs, [self._nodes, self._params])
        if isinstance(sym, relax.Expr):
            sym = self.bb.normalize(sym)
        return sym

    # ------------------------------------------------------------------------- nodes
    def _construct_nodes(self, graph) -> None:
        known = supported_ops()
        for index, node in enumerate(graph.node):
            if node.op_type not in known:  # (_check_for_unsupported_ops let it through)
                self._on_host(node, index, "no converter for it")
                continue
            restore = self._shape_inputs_as_tensors(node)
            self._domain = node.domain
            printed = io.StringIO()
            try:
                with contextlib.redirect_stdout(printed):
                    super()._construct_nodes(_OneNode((node,)))
            except PlusError:
                raise
            except TVM_FAILURE as err:  # a converter failing: the host, else which node and why
                if not is_refusal(err):
                    raise  # a bug of plus_tvm's own code (a converter of ours), not TVM refusing
                reason = _reason(err)
                if not self._may_run_on_host(node):
                    raise UnsupportedOperatorError(
                        f"{self.where}: cannot convert ONNX node {_describe(node, index)} "
                        f"(opset {self.opset}): {reason}"
                    ) from err
                self._on_host(node, index, reason)
            finally:
                for name, value in restore.items():
                    self._nodes[name] = value

    # -------------------------------------------------------------------- host nodes
    def _may_run_on_host(self, node) -> bool:
        return self._model is not None and host_nodes.supported(node, self.opset) is None

    def _on_host(self, node, index: int, why: str) -> None:
        """Run ``node`` through ``plus.onnx_host`` (host_nodes.py), or raise naming it."""
        inputs = []
        for name in node.input:
            value = self._nodes.get(name) if name else None
            inputs.append(self._shape_tensor(value) if _is_shape(value) else value)
        if self._types is None:
            self._types = host_nodes.infer_types(self._model)
        try:
            outs = host_nodes.host_call(
                self.bb, node, inputs, self._types, self._model, self.opset, f"host{index}"
            )
        except host_nodes.NotForHostError as err:
            raise UnsupportedOperatorError(
                f"{self.where}: cannot convert ONNX node {_describe(node, index)} "
                f"(opset {self.opset}): {why}; it cannot run on the host either: {err}"
            ) from None
        for name, value in zip([o for o in node.output if o], outs):
            self._nodes[name] = value
        self.host_nodes.append(f"{_describe(node, index)}: {why}")

    def _shape_inputs_as_tensors(self, node) -> dict[str, relax.Expr]:
        """Give ``node`` its shape-valued inputs as int64 tensors unless its op takes shapes.

        Returns the replaced entries, to restore after the node (other consumers of the same
        value may take the shape form).
        """
        values = {n: self._nodes.get(n) for n in node.input if n}
        shaped = [n for n, v in values.items() if _is_shape(v)]
        if not shaped:
            return {}
        if node.op_type in SHAPE_OPS:
            # Concat takes shapes or tensors, not a mix of the two; a constant shape piece
            # (a 1-D int64 constant) joins shapes: as a tensor, the result would reach Reshape
            # as a run-time tensor (the node on the host, its result's dims unknown)
            mixed = node.op_type in ALL_OR_NOTHING and any(
                n not in shaped and not _shape_piece(v) for n, v in values.items()
            )
            if not mixed:
                return {}
        replaced = {}
        for name in shaped:
            replaced[name] = values[name]
            self._nodes[name] = self._shape_tensor(values[name])
        return replaced

    def _shape_tensor(self, shape: relax.Expr) -> relax.Expr:
        """An int64 tensor of a shape value: a constant when every dim is static, so the
        converters that fold constant inputs (Pad, Slice, Range, ...) still can."""
        dims = _static_dims(shape)
        if dims is not None:
            return relax.const(np.asarray(dims, dtype="int64"), "int64")
        return self.bb.normalize(relax.op.shape_to_tensor(shape))


def _is_shape(value: object) -> bool:
    return isinstance(value, relax.Expr) and isinstance(value.ty, relax.ShapeType)


def _shape_piece(value: object) -> bool:
    """A 1-D int64 constant that TVM's Concat joins with shape values: no entry 0 (ONNX's
    Reshape reads 0 as "keep the input's dim", a shape value as a dim of size 0)."""
    if not isinstance(value, tvm.ir.GenericConst):
        return False
    array = value.value.numpy()
    return array.ndim == 1 and array.dtype == np.int64 and bool(np.all(array != 0))


def _static_dims(shape: relax.Expr) -> list[int] | None:
    if isinstance(shape, relax.ShapeExpr):
        values = shape.values
    else:
        values = getattr(shape.ty, "values", None)
    if values is None or not all(isinstance(v, tvm.tirx.IntImm) for v in values):
        return None
    return [int(v) for v in values]


def _shape_like(init) -> bool:
    """Integer / boolean data (shapes, axes, pads, indices) or a float scalar (eps, bounds)."""
    size = 1
    for d in init.dims:
        size *= int(d)
    return init.data_type in _INTEGER_TYPES or size <= 1


_INTEGER_TYPES = frozenset(
    getattr(onnx.TensorProto, name)
    for name in ("BOOL", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64")
)


def _describe(node, index: int) -> str:
    name = f"'{node.name}'" if node.name else "(unnamed)"
    domain = f"{node.domain}." if node.domain not in ("", "ai.onnx") else ""
    return f"#{index} {name} of type {domain}{node.op_type}"


def _reason(err: BaseException) -> str:
    lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
    text = lines[-1] if lines else ""
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def import_model(
    model,
    shape_dict: dict | None,
    dtype_dict: dict,
    keep_params_in_input: bool = True,
    where: str = "model",
) -> tvm.IRModule:
    """Import ``model`` (an ``onnx.ModelProto``) to Relax with :class:`PlusONNXImporter`."""
    if model.ir_version < 3:
        raise UnsupportedOperatorError(
            f"{where}: ONNX IR version {model.ir_version} is older than ONNX 1.1, not supported"
        )
    opset = next(
        (o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
        1,
    )
    folded = fold_constants(model)
    importer = PlusONNXImporter(
        shape_dict,
        dtype_dict,
        keep_params_in_input=keep_params_in_input,
        # the inputs keep the graph's names ("input.1", "x:0"): a call binds them by those and
        # input errors name them so (TVM's renaming made "input.1" and "1" "input_1" and
        # "input_1_1"; a Relax variable's name need not be an identifier)
        sanitize=False,
        where=where,
        model=folded,
    )
    mod = importer.from_onnx(folded.graph, opset)
    if importer.host_nodes:
        mod = mod.with_attr(HOST_NODES_ATTR, json.dumps(importer.host_nodes))
        warnings.warn(
            f"{where}: {len(importer.host_nodes)} ONNX node(s) run on the host through ONNX's "
            f"reference implementation (numpy, slow): {'; '.join(importer.host_nodes)}",
            RuntimeWarning,
            stacklevel=2,
        )
    return mod
