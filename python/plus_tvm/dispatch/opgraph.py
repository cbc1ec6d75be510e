"""The operator graph of one dataflow block, each operator with its basic TIR operators.

+Graph identification needs loop structure, so every Relax operator call is legalized on its
own (memoised by operator, attributes and argument types) and its PrimFunc's blocks become
``LoopOperator``s whose tensors carry the block's Relax variable names. A ``call_tir`` of a user's
PrimFunc is read directly (the Relax paper's analysis feedback). Anything else -- tuples,
library calls, operators without a legalization -- is an opaque node that never joins a
subgraph.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import tvm
from tvm import relax

from .. import interrupt
from ..plusgraph import LoopOperator, loop_operators


@dataclass
class OpNode:
    """One binding of the dataflow block."""

    index: int
    var: relax.Var
    call: relax.Call | None
    op_name: str  # "relax.matmul", "call_tir:<name>", "" for opaque bindings
    basic: list[LoopOperator] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)  # producer node indices inside the block
    consumers: list[int] = field(default_factory=list)
    #: the operator's PrimFunc (legalized alone, or the ``call_tir``'s callee): what a cost
    #: model reads of the TIR the operator would become
    func: tvm.tirx.PrimFunc | None = None

    @property
    def fusible(self) -> bool:
        return bool(self.basic)


class OpGraph:
    """Nodes of a dataflow block, with producer/consumer edges and tensor names."""

    def __init__(self, block: relax.DataflowBlock, mod: tvm.IRModule, cache: dict) -> None:
        self.block = block
        self.nodes: list[OpNode] = []
        self.by_var: dict[int, int] = {}
        self.names: dict[int, str] = {}  # var id -> unique tensor name
        for index, binding in enumerate(block.bindings):
            var = binding.var
            self.by_var[var.id_] = index
            call = binding.value if isinstance(binding.value, relax.Call) else None
            node = OpNode(index, var, call, _op_name(call))
            self.nodes.append(node)
        for node in self.nodes:
            value = block.bindings[node.index].value
            for used in _free_vars(value):
                producer = self.by_var.get(used.id_)
                if producer is not None and producer not in node.inputs:
                    node.inputs.append(producer)
                    self.nodes[producer].consumers.append(node.index)
        self.outside_uses: set[int] = set()  # nodes whose value leaves the block
        for node in self.nodes:
            if not isinstance(node.var, relax.DataflowVar):
                self.outside_uses.add(node.index)
        for node in self.nodes:
            if node.call is not None:
                node.basic = _loop_operators(node, self, mod, cache)

    def sole_reader(self, index: int) -> int | None:
        """The binding reading ``index``'s value when it is the only one and the value does
        not leave the block, else None."""
        consumers = self.nodes[index].consumers
        if index in self.outside_uses or len(consumers) != 1:
            return None
        return consumers[0]

    def name(self, expr: relax.Expr) -> str:
        key = expr.id_
        if key not in self.names:
            base = expr.name if isinstance(expr, relax.Var) else "const"
            self.names[key] = f"{base}#{len(self.names)}"
        return self.names[key]

    def value(self, index: int) -> relax.Expr:
        return self.block.bindings[index].value


def _op_name(call: relax.Call | None) -> str:
    if call is None:
        return ""
    op = call.op
    if isinstance(op, tvm.ir.Op):
        if op.name == "relax.call_tir":
            return f"call_tir:{call.args[0].name_hint}"
        if op.name.startswith("relax.call_") or op.name.startswith("relax.builtin"):
            return ""
        return op.name
    return ""


def _free_vars(expr: relax.Expr) -> list[relax.Var]:
    return list(relax.analysis.free_vars(expr))


def _is_tensor(expr: relax.Expr) -> bool:
    return isinstance(expr.ty, relax.TensorType)


def _loop_operators(
    node: OpNode, graph: OpGraph, mod: tvm.IRModule, cache: dict
) -> list[LoopOperator]:
    call = node.call
    out_name = graph.name(node.var)
    if node.op_name.startswith("call_tir:"):
        gvar, args = call.args[0], call.args[1]
        func = mod[gvar]
        if not isinstance(func, tvm.tirx.PrimFunc) or not isinstance(node.var.ty, relax.TensorType):
            return []
        names = [graph.name(a) for a in args.fields] + [out_name]
        if len(names) != len(func.params):
            return []
        node.func = func
        return loop_operators(func, names, out_name)
    if not node.op_name or not _is_tensor(node.var):
        return []
    tensor_args = [a for a in call.args if isinstance(a, (relax.Var, tvm.ir.expr.Constant))]
    key = (
        node.op_name,
        str(call.attrs) if call.attrs is not None else "",
        tuple(str(a.ty) for a in call.args),
        tuple(str(a) for a in call.args if not isinstance(a, (relax.Var, tvm.ir.expr.Constant))),
        str(node.var.ty),
    )
    if key not in cache:
        cache[key] = _legalize_alone(call)
    found = cache[key]
    if found is None:
        return []
    func, arg_positions = found
    names = [graph.name(call.args[p]) for p in arg_positions] + [out_name]
    if len(names) != len(func.params):
        return []
    del tensor_args
    node.func = func
    return loop_operators(func, names, out_name)


def _definable(ty: relax.TensorType, fresh: dict) -> relax.TensorType:
    """``ty`` with every composite symbolic dimension (``s*8``) replaced by a variable of its
    own: a function parameter can only define bare variables. The +Loop sizes only need to be
    consistent, and equal expressions map to the same variable."""
    if ty.shape is None or not hasattr(ty.shape, "values"):
        return ty
    dims = []
    changed = False
    for d in ty.shape.values:
        if isinstance(d, (tvm.tirx.IntImm, tvm.tirx.Var)):
            dims.append(d)
            continue
        key = str(d).replace(" ", "")
        if key not in fresh:
            fresh[key] = tvm.tirx.Var(f"d{len(fresh)}", "int64")
        dims.append(fresh[key])
        changed = True
    return relax.TensorType(dims, ty.dtype) if changed else ty


def _legalize_alone(call: relax.Call) -> tuple[tvm.tirx.PrimFunc, list[int]] | None:
    """Legalize one call in a function of its own; the PrimFunc and which call arguments
    (by position) it takes, or None when the op does not become exactly one ``call_tir``."""
    params: list[relax.Var] = []
    args: list[relax.Expr] = []
    position_of: dict[int, int] = {}
    fresh: dict[str, tvm.tirx.Var] = {}
    for pos, arg in enumerate(call.args):
        if isinstance(arg, (relax.Var, tvm.ir.expr.Constant)) and _is_tensor(arg):
            param = relax.Var(f"a{pos}", _definable(arg.ty, fresh))
            params.append(param)
            position_of[param.id_] = pos
            args.append(param)
        else:
            args.append(arg)
    try:
        bb = relax.BlockBuilder()
        with bb.function("main", params):
            out = bb.emit(relax.Call(call.op, args, call.attrs, call.ty_args))
            bb.emit_func_output(out)
        # an analysis-only module: the caller's instruments (IR dumps, checks) are not for it
        with tvm.transform.PassContext(opt_level=3):
            legal = relax.transform.LegalizeOps()(bb.get())
    except Exception:  # noqa: BLE001 - an op TVM cannot legalize alone stays opaque
        # (an analysis only plus makes: whatever fails here must not fail the compile)
        interrupt.check()  # (a Ctrl-C comes back from TVM as a RuntimeError)
        return None
    calls = []
    for binding_block in legal["main"].body.blocks:
        for binding in binding_block.bindings:
            value = binding.value
            if isinstance(value, relax.Call) and getattr(value.op, "name", "") == "relax.call_tir":
                calls.append(value)
    if len(calls) != 1:
        return None
    tir_call = calls[0]
    positions = []
    for arg in tir_call.args[1].fields:
        if not isinstance(arg, relax.Var) or arg.id_ not in position_of:
            return None
        positions.append(position_of[arg.id_])
    func = legal[tir_call.args[0]]
    return func, positions
