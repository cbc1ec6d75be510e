"""Torch-path host fallback: an ATen op no converter compiles runs through torch eager.

torch.compile meets an op it cannot compile with a graph break; plus_tvm does the same per node.
A ``call_function`` node whose op has no converter (neither TVM 0.27's torch importer nor
:func:`plus_tvm.torch_fixes.custom_convert_map`) becomes

    R.call_pure_packed("plus.torch_host", *tensor_inputs, spec, ty_args=<its output types>)

(:mod:`plus_tvm.runtime.torch_host`), its outputs ``match_cast`` to the shapes of the node's fake
tensors, so the rest of the graph compiles as usual. :func:`plan` decides node by node, before
the import, and refuses (``UnsupportedOperatorError`` naming the op, the node and why):

- ops that are not ATen operator overloads (higher-order ops, other namespaces' custom ops);
- random ops (tag ``nondeterministic_seeded``, or named ``rand*`` / ``*dropout*`` / ``bernoulli``
  / ``multinomial`` / ``normal`` ...): a pure call may be merged, hoisted or removed;
- ops that write to an argument (a mutable schema, an alias annotation with ``!``);
- outputs that are not tensors (scalars, symbolic sizes, None) or complex;
- non-tensor arguments that are not constants (a symbolic size) or cannot be written down.

An output dim that is a model input's symbolic size (or a sum / product of them) is that size;
a data-dependent one (an unbacked size, ``nonzero``'s count) is a fresh symbolic dim, checked
when the call returns. Such calls are never folded at compile time: ``FoldStaticSubgraphs`` and
TVM's ``FoldConstant`` leave ``call_pure_packed`` alone, as they do ``plus.onnx_host``.
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass

import tvm
from tvm import relax

from .runtime import torch_host

# Names of random ops (besides those tagged ``nondeterministic_seeded``): each call must draw
# anew, which a pure call does not promise.
_RANDOM_WORDS = (
    "rand",
    "dropout",
    "bernoulli",
    "multinomial",
    "normal",
    "poisson",
    "uniform",
    "exponential",
    "geometric",
    "cauchy",
    "random",
)


class NotForHostError(Exception):
    """The node cannot run on the host (the message says why)."""


@dataclass(frozen=True)
class HostNode:
    """A node planned for the host: its spec, its tensor arguments, its outputs' fake tensors."""

    op_name: str  # "aten::i0.default"
    spec: str
    tensors: tuple  # the fx nodes whose values are the call's tensor arguments, in order
    outputs: tuple  # the fake tensors of its outputs
    multiple: bool  # the op returns a tuple


def op_name(node: object) -> str:
    """``aten::i0.default`` (an OpOverload's qualified name), else the target's name."""
    target = node.target
    schema = getattr(target, "_schema", None)
    if schema is not None:
        overload = schema.overload_name or "default"
        return f"{schema.name}.{overload}"
    return getattr(target, "__name__", str(target))


def _is_random(target: object, torch: object) -> bool:
    if torch.Tag.nondeterministic_seeded in getattr(target, "tags", ()):
        return True
    packet = target._schema.name.split("::")[-1].lower()
    return any(word in packet for word in _RANDOM_WORDS)


def _writes(target: object) -> str | None:
    """The argument ``target`` writes to, or None."""
    schema = target._schema
    for arg in schema.arguments:
        if arg.alias_info is not None and arg.alias_info.is_write:
            return arg.name
    return "an argument" if schema.is_mutable else None


def _fake_outputs(node: object, torch: object) -> tuple[tuple, bool]:
    """The node's output fake tensors and whether it returns a tuple."""
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        outs, multiple = (val,), False
    elif isinstance(val, (tuple, list)) and val and all(isinstance(v, torch.Tensor) for v in val):
        outs, multiple = tuple(val), True
    else:
        kind = "nothing" if val is None else type(val).__name__
        raise NotForHostError(f"its output is not a tensor or a tuple of tensors ({kind})")
    for i, out in enumerate(outs):
        if out.dtype.is_complex:
            raise NotForHostError(f"output {i} is {out.dtype} (complex: no Relax dtype)")
    return outs, multiple


def encode_value(value: object, tensors: list, torch: object) -> object:
    """A non-tensor argument as JSON (see :mod:`plus_tvm.runtime.torch_host`), tensor nodes as
    ``{"tensor": i}`` (appended to ``tensors``)."""
    from torch import fx

    if isinstance(value, fx.Node):
        val = value.meta.get("val")
        if isinstance(val, torch.Tensor):
            if val.dtype.is_complex:
                raise NotForHostError(f"argument {value.name} is {val.dtype} (complex)")
            tensors.append(value)
            return {"tensor": len(tensors) - 1}
        raise NotForHostError(
            f"argument {value.name} is a {type(val).__name__} computed in the graph "
            "(a symbolic size or scalar), not a tensor or a constant"
        )
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return {"float": repr(value) if math.isfinite(value) else str(value)}
    if isinstance(value, (list, tuple)):
        items = [encode_value(v, tensors, torch) for v in value]
        return {"list" if isinstance(value, list) else "tuple": items}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.layout):
        return {"layout": str(value).removeprefix("torch.")}
    if isinstance(value, torch.memory_format):
        return {"memory_format": str(value).removeprefix("torch.")}
    raise NotForHostError(f"argument {value!r} ({type(value).__name__}) cannot be passed on")


def host_node(node: object, where: str) -> HostNode:
    """The :class:`HostNode` of ``node``, or :class:`NotForHostError` saying why it has none."""
    import torch

    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        raise NotForHostError("it is not an ATen operator overload")
    if target.namespace != "aten":
        raise NotForHostError(
            f"it is an operator of namespace {target.namespace!r}; only ATen operators run on "
            "the host (a deployed model cannot rely on a custom op's registration)"
        )
    if _is_random(target, torch):
        raise NotForHostError("it is a random op (each call must draw anew)")
    written = _writes(target)
    if written is not None:
        raise NotForHostError(f"it writes to its input {written} in place")
    outputs, multiple = _fake_outputs(node, torch)
    tensors: list = []
    args = encode_value(list(node.args), tensors, torch)
    kwargs = {k: encode_value(v, tensors, torch) for k, v in node.kwargs.items()}
    name = op_name(node)
    dtypes = [str(o.dtype).removeprefix("torch.") for o in outputs]
    spec = torch_host.encode(name, args, kwargs, dtypes, multiple, f"{name} at node{where}")
    torch_host.prepared(spec)  # (it resolves to the op)
    return HostNode(name, spec, tuple(tensors), outputs, multiple)


def _tir(expr: object, symbols: dict[str, tvm.ir.PrimExpr]) -> tvm.ir.PrimExpr | None:
    """A sympy size expression of input sizes as a TIR expression, or None."""
    import sympy

    if isinstance(expr, sympy.Integer):
        return tvm.tirx.IntImm("int64", int(expr))
    if isinstance(expr, sympy.Symbol):
        return symbols.get(str(expr))
    if isinstance(expr, (sympy.Add, sympy.Mul)):
        parts = [_tir(a, symbols) for a in expr.args]
        if any(p is None for p in parts):
            return None
        out = parts[0]
        for part in parts[1:]:
            out = out + part if isinstance(expr, sympy.Add) else out * part
        return out
    return None


def _input_symbols(node: object, importer: object) -> dict[str, tvm.ir.PrimExpr]:
    """Torch size symbol -> the TIR variable the importer gave that input size."""
    import torch

    symbols: dict[str, tvm.ir.PrimExpr] = {}
    for ph in node.graph.find_nodes(op="placeholder"):
        val = ph.meta.get("val")
        var = importer.env.get(ph)
        if not isinstance(val, torch.Tensor) or not isinstance(var, relax.Expr):
            continue
        shape = getattr(var.ty, "shape", None)
        if not isinstance(shape, relax.ShapeExpr):
            continue
        for dim, value in zip(val.shape, shape.values):
            if isinstance(dim, torch.SymInt):
                symbols.setdefault(str(dim.node.expr), value)
    return symbols


def converter(planned: dict[str, HostNode]) -> typing.Callable:
    """A ``custom_convert_map`` converter emitting the host call of each planned node."""
    import torch

    def convert(node: object, importer: object) -> relax.Expr | tuple:
        host = planned[node.name]
        bb = importer.block_builder
        args = [importer.env[n] for n in host.tensors]
        symbols = _input_symbols(node, importer)
        loose, shapes = [], []
        for i, out in enumerate(host.outputs):
            dtype = str(out.dtype).removeprefix("torch.")
            dims = []
            for k, dim in enumerate(out.shape):
                value = None
                if isinstance(dim, torch.SymInt):
                    value = _tir(dim.node.expr, symbols)
                else:
                    value = int(dim)
                if value is None:  # data-dependent: a fresh size, checked as the call returns
                    value = tvm.tirx.Var(f"{node.name}_{i}_{k}", "int64")
                dims.append(value)
            loose.append(relax.TensorType(ndim=len(dims), dtype=dtype))
            shapes.append(relax.TensorType(dims, dtype))
        ty = relax.TupleType(loose) if host.multiple else loose[0]
        call = bb.emit(
            relax.call_pure_packed(torch_host.NAME, *args, tvm.ir.StringImm(host.spec), ty_args=ty)
        )
        results = []
        for i, shaped in enumerate(shapes):
            item = bb.emit(relax.TupleGetItem(call, i)) if host.multiple else call
            results.append(bb.match_cast(item, shaped))
        return tuple(results) if host.multiple else results[0]

    return convert


def plan(nodes: list, where: typing.Callable[[object], str]) -> dict[str, HostNode]:
    """The :class:`HostNode` of every node in ``nodes`` (those without a converter), by node
    name; raises :class:`NotForHostError` as ``(node, why)`` for the first that cannot go."""
    planned = {}
    for node in nodes:
        try:
            planned[node.name] = host_node(node, f" '{node.name}'{where(node)}")
        except NotForHostError as err:
            raise NotForHostError(node, str(err)) from None
    return planned
