"""ConvertToChannelsLast: 2-D convolutions, and what runs between them, in NHWC.

oneDNN's direct and depthwise convolutions run on channels-last activations; on NCHW they either
reorder every activation on the way in and out or fall back to slower kernels (measured on
MobileNetV2's 52 convolutions: 1.6 ms in NHWC against 9.8 ms for ATen's NCHW path with its copy
into TVM's buffer). So on CPU the whole convolutional trunk runs channels last, and the layout
changes only at its edges: the image is transposed once on the way in, and a tensor leaves NHWC
only where an operator that cares about the layout (a reshape, a matmul) reads it.

Per dataflow block, every 4-D NCHW ``conv2d`` becomes ``conv2d(x_nhwc, w, data_layout="NHWC",
kernel_layout=<unchanged>, out_layout="NHWC")`` (the weight keeps the model's layout: the
library packs it once, and TVM's legalization takes any kernel layout). The NHWC form then
flows through the operators whose meaning follows the layout: elementwise operators (operands
broadcast to NCHW are re-laid to broadcast to NHWC: a ``[1, C, 1, 1]`` bias becomes
``[1, 1, 1, C]``), ``batch_norm`` (axis 3), ``pad``, reductions over axes (mean, sum, max, ...),
pooling, ``concat``. An operator outside that set gets the NCHW tensor, transposed back once
where it is first needed and bound to the original variable, so everything after it, the
block's outputs included, is unchanged. Nothing changes in a block without a convolution.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..mapping.classes import MapPattern
from ..mapping.op_table import OP_MAP_PATTERNS
from ._dataflow_rewrite import map_functions, normalize_and_clean, op_name

TO_NHWC = (0, 2, 3, 1)
TO_NCHW = (0, 3, 1, 2)
# elementwise by mapping class, but with a positional or per-axis meaning of their own
_NOT_LAYOUT_FREE = {
    "relax.tril",
    "relax.triu",
    "relax.nn.prelu",
    "relax.quantize",
    "relax.dequantize",
    "relax.nn.dropout",
}
_REDUCTIONS = {
    "relax.sum": relax.op.sum,
    "relax.mean": relax.op.mean,
    "relax.max": relax.op.max,
    "relax.min": relax.op.min,
    "relax.prod": relax.op.prod,
    "relax.variance": relax.op.variance,
    "relax.std": relax.op.std,
}
_POOLS = ("relax.nn.max_pool2d", "relax.nn.avg_pool2d")


@tvm.transform.module_pass(opt_level=0, name="ConvertToChannelsLast")
class ConvertToChannelsLast:
    """Rewrite NCHW convolutions and the layout-following operators between them to NHWC."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return map_functions(mod, _rewrite_function, normalize_and_clean)


def _rewrite_function(func: relax.Function) -> relax.Function:
    blocks = []
    changed = False
    for block in func.body.blocks:
        if isinstance(block, relax.DataflowBlock) and any(
            _is_nchw_conv(b.value) for b in block.bindings
        ):
            block = _Block().rewrite(block)
            changed = True
        blocks.append(block)
    if not changed:
        return func
    body = relax.SeqExpr(blocks, func.body.body)
    return relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs)


def _is_nchw_conv(value: relax.Expr) -> bool:
    if op_name(value) != "relax.nn.conv2d":
        return False
    at = value.attrs
    return (
        str(at.data_layout) == "NCHW"
        and str(at.out_layout) in ("NCHW", "")
        and _rank(value.args[0]) == 4
    )


def _rank(expr: relax.Expr) -> int:
    ty = expr.ty
    return int(ty.ndim) if isinstance(ty, relax.TensorType) else -1


def _shape(expr: relax.Expr) -> list | None:
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    return list(ty.shape.values)


class _Block:
    """The rewrite of one dataflow block (its state lives as long as the block)."""

    def __init__(self) -> None:
        self.bb = relax.BlockBuilder()
        self.bindings: list[relax.Binding] = []
        self.twin: dict[int, relax.Var] = {}  # var id -> its NHWC form
        self.bound: set[int] = set()  # vars with an NHWC twin whose NCHW binding exists
        # batch_norm tuples computed in NHWC: tuple var id -> (NHWC tuple, original binding)
        self.tuples: dict[int, tuple[relax.Var, relax.VarBinding]] = {}
        self.pending: dict[int, relax.Var] = {}  # NHWC-only vars, by id (bound when needed)

    # ------------------------------------------------------------------ emitting
    def emit(self, var: relax.Var, value: relax.Expr) -> relax.Var:
        self.bindings.append(relax.VarBinding(var, value))
        return var

    def emit_new(self, name: str, value: relax.Expr) -> relax.Var:
        value = self.bb.normalize(value)
        return self.emit(relax.DataflowVar(name, value.ty), value)

    def nhwc(self, expr: relax.Expr) -> relax.Expr:
        """The NHWC form of a 4-D NCHW tensor expression (transposed once, then reused)."""
        if isinstance(expr, relax.Var) and expr.id_ in self.twin:
            return self.twin[expr.id_]
        new = self.emit_new("nhwc", relax.op.permute_dims(expr, TO_NHWC))
        if isinstance(expr, relax.Var):
            self.twin[expr.id_] = new
            self.bound.add(expr.id_)
        return new

    def nchw(self, expr: relax.Expr) -> relax.Expr:
        """``expr`` as its NCHW binding, transposing its NHWC twin back the first time (a
        batch_norm tuple read whole is computed again in NCHW)."""
        if not isinstance(expr, relax.Var):
            return expr
        if expr.id_ in self.pending:
            var = self.pending.pop(expr.id_)
            self.emit(var, self.bb.normalize(relax.op.permute_dims(self.twin[var.id_], TO_NCHW)))
            self.bound.add(var.id_)
        elif expr.id_ in self.tuples:
            _, original = self.tuples.pop(expr.id_)
            self.nchw(original.value.args[0])
            self.bindings.append(original)
        return expr

    def broadcast_operand(self, expr: relax.Expr, rank: int) -> relax.Expr | None:
        """An operand broadcast against a rank-4 NCHW result, re-laid for the NHWC result."""
        if isinstance(expr, relax.Var) and expr.id_ in self.twin:
            return self.twin[expr.id_]
        shape = _shape(expr)
        if shape is None or len(shape) > rank:
            return None
        dims = [tvm.tirx.IntImm("int64", 1)] * (rank - len(shape)) + shape
        if all(isinstance(d, tvm.tirx.IntImm) and int(d) == 1 for d in dims):
            return expr  # a scalar-like operand broadcasts the same in any layout
        moved = [dims[i] for i in TO_NHWC]
        unit = [not (isinstance(d, tvm.tirx.IntImm) and int(d) == 1) for d in dims]
        kept = [i for i in range(4) if unit[i]]
        if [i for i in TO_NHWC if unit[i]] == kept:  # only unit axes move: a reshape
            return self.emit_new("nhwc_operand", relax.op.reshape(expr, moved))
        full = self.emit_new("operand4d", relax.op.reshape(expr, dims)) if len(shape) < 4 else expr
        return self.emit_new("nhwc_operand", relax.op.permute_dims(full, TO_NHWC))

    # ------------------------------------------------------------------ the block
    def rewrite(self, block: relax.DataflowBlock) -> relax.DataflowBlock:
        for binding in block.bindings:
            if not isinstance(binding, relax.VarBinding):
                self.bindings.append(binding)
                continue
            new = self.convert(binding.var, binding.value)
            if new is None:
                self.keep(binding)
                continue
            if isinstance(new, relax.Var):  # already bound (a reduction with an NCHW-free result)
                continue
            value = self.bb.normalize(new)
            if isinstance(value.ty, relax.TupleType):
                tup = self.emit_new("nhwc_tuple", value)
                self.tuples[binding.var.id_] = (tup, binding)
                continue
            self.twin[binding.var.id_] = self.emit_new("nhwc", value)
            self.pending[binding.var.id_] = binding.var
        outputs = [v for v in self.pending.values() if not isinstance(v, relax.DataflowVar)]
        outputs += [
            b.var for _, b in self.tuples.values() if not isinstance(b.var, relax.DataflowVar)
        ]
        for var in outputs:  # block outputs are read after the block
            self.nchw(var)
        return relax.DataflowBlock(self.bindings)

    def keep(self, binding: relax.VarBinding) -> None:
        """An operator that reads NCHW: its inputs are transposed back where needed."""
        value = binding.value
        for arg in _tensor_args(value):
            self.nchw(arg)
        self.bindings.append(binding)

    def convert(self, var: relax.Var, value: relax.Expr) -> relax.Expr | None:
        """The NHWC value of the binding, or None when it stays NCHW."""
        if isinstance(value, relax.TupleGetItem):
            source = value.tuple_value
            hit = self.tuples.get(source.id_) if isinstance(source, relax.Var) else None
            if hit is None:
                return None
            if int(value.index) == 0:
                return relax.TupleGetItem(hit[0], 0)
            # the running statistics: per channel, the same in both layouts
            self.emit(var, self.bb.normalize(relax.TupleGetItem(hit[0], value.index)))
            return var
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
            return None
        name = value.op.name
        if _is_nchw_conv(value):
            return _conv(value, self.nhwc(value.args[0]))
        if not any(isinstance(a, relax.Var) and a.id_ in self.twin for a in _tensor_args(value)):
            return None
        first = value.args[0]
        x = self.twin.get(first.id_) if isinstance(first, relax.Var) else None
        if name == "relax.nn.batch_norm":
            ok = x is not None and int(value.attrs.axis) % 4 == 1
            return _batch_norm(value, x) if ok else None
        if name in _REDUCTIONS:
            return self.reduce(var, value)
        if _rank(var) != 4:
            return None
        if OP_MAP_PATTERNS.get(name) == MapPattern.OneToOne and name not in _NOT_LAYOUT_FREE:
            return self.elementwise(value)
        if name == "relax.concat":
            return self.concat(value)
        if x is None:
            return None
        if name == "relax.nn.pad":
            return _pad(value, x)
        if name in _POOLS or name == "relax.nn.adaptive_avg_pool2d":
            return _pool(value, x)
        return None

    def elementwise(self, value: relax.Call) -> relax.Expr | None:
        args = []
        for arg in value.args:
            if isinstance(arg.ty, relax.TensorType):
                arg = self.broadcast_operand(arg, 4)
                if arg is None:
                    return None
            args.append(arg)
        return relax.Call(value.op, args, value.attrs, value.ty_args)

    def reduce(self, var: relax.Var, value: relax.Call) -> relax.Expr | None:
        x = value.args[0]
        if not isinstance(x, relax.Var) or x.id_ not in self.twin or value.attrs.axis is None:
            return None
        axes = sorted(int(a) % 4 for a in value.attrs.axis)
        keepdims = bool(value.attrs.keepdims)
        new_axes = sorted(TO_NHWC.index(a) for a in axes)
        call = _REDUCTIONS[value.op.name](self.twin[x.id_], axis=new_axes, keepdims=keepdims)
        if keepdims:
            return call if _rank(var) == 4 else None
        left_nchw = [a for a in range(4) if a not in axes]
        left_nhwc = [TO_NHWC[i] for i in range(4) if i not in new_axes]
        if left_nchw != left_nhwc:
            return None
        self.emit(var, self.bb.normalize(call))  # the same tensor in both layouts
        return var

    def concat(self, value: relax.Call) -> relax.Expr | None:
        items = value.args[0]
        if not isinstance(items, relax.Tuple) or int(value.attrs.axis) % 4 != 1:
            return None
        parts = [self.nhwc(item) for item in items.fields]
        return relax.op.concat(parts, axis=3)


def _tensor_args(value: relax.Expr) -> list[relax.Expr]:
    if isinstance(value, relax.Call):
        out = []
        for arg in value.args:
            out.extend(arg.fields if isinstance(arg, relax.Tuple) else [arg])
        return out
    if isinstance(value, relax.Tuple):
        return list(value.fields)
    if isinstance(value, relax.TupleGetItem):
        return [value.tuple_value]
    return [value]


def _conv(conv: relax.Call, x: relax.Expr) -> relax.Call:
    at = conv.attrs
    return relax.op.nn.conv2d(
        x,
        conv.args[1],
        strides=[int(s) for s in at.strides],
        padding=[int(p) for p in at.padding],
        dilation=[int(d) for d in at.dilation],
        groups=int(at.groups),
        data_layout="NHWC",
        kernel_layout=str(at.kernel_layout),
        out_layout="NHWC",
        out_dtype=at.out_dtype,
    )


def _batch_norm(bn: relax.Call, x: relax.Expr) -> relax.Call:
    at = bn.attrs
    return relax.op.nn.batch_norm(
        x,
        *bn.args[1:5],
        axis=3,
        epsilon=float(at.epsilon),
        center=bool(at.center),
        scale=bool(at.scale),
        momentum=float(at.momentum),
        training=bool(getattr(at, "training", False)),
    )


def _pad(pad: relax.Call, x: relax.Expr) -> relax.Call:
    at = pad.attrs
    widths = [int(w) for w in at.pad_width]
    pairs = [widths[2 * i : 2 * i + 2] for i in range(4)]
    moved = [w for i in TO_NHWC for w in pairs[i]]
    return relax.op.nn.pad(x, moved, pad_mode=str(at.pad_mode), pad_value=float(at.pad_value))


def _pool(pool: relax.Call, x: relax.Expr) -> relax.Call | None:
    at = pool.attrs
    if str(at.layout) != "NCHW" or str(at.out_layout) not in ("NCHW", ""):
        return None
    if pool.op.name == "relax.nn.adaptive_avg_pool2d":
        size = None if at.output_size is None else [int(s) for s in at.output_size]
        return relax.op.nn.adaptive_avg_pool2d(x, size, layout="NHWC", out_layout="NHWC")
    fn = relax.op.nn.max_pool2d if pool.op.name == "relax.nn.max_pool2d" else relax.op.nn.avg_pool2d
    kwargs = {
        "pool_size": [int(p) for p in at.pool_size],
        "strides": [int(s) for s in at.strides],
        "padding": [int(p) for p in at.padding],
        "dilation": [int(d) for d in at.dilation],
        "ceil_mode": bool(at.ceil_mode),
        "layout": "NHWC",
        "out_layout": "NHWC",
    }
    if pool.op.name == "relax.nn.avg_pool2d":
        kwargs["count_include_pad"] = bool(at.count_include_pad)
    return fn(x, **kwargs)
