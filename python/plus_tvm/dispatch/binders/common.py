"""What every binder shares: reading the matched subgraph's Relax bindings.

A binder turns an identified subgraph into one library call. The match hands it the
subgraph's structure (``Match.follower``: the member absorbed after each one, where its value
goes nowhere else); the binder reads the operators along it from the skeleton, takes the
trivial operations the library has parameters for (bias, activation, residual, scale, mask,
gamma / beta, layouts) and stops at the first one it cannot express. What it does not absorb
stays as Relax operators around the call and is generated as TIR by the rest of the pipeline.
An absorbed value that is also used outside the absorbed set is never hidden: the chain ends
before it (the call's output must be the only way the absorbed values leave).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import tvm
import tvm_ffi
from tvm import relax

from ...runtime._common import ConfigSpec
from ..identify import Match
from ..opgraph import OpGraph

VIEW_OPS = {"relax.reshape", "relax.expand_dims", "relax.squeeze", "relax.flatten"}
ACTIVATIONS = {
    "relax.nn.relu": "relu",
    "relax.nn.gelu": "gelu",
    "relax.nn.gelu_tanh": "gelu_tanh",
    "relax.nn.silu": "silu",
    "relax.sigmoid": "sigmoid",
    "relax.tanh": "tanh",
}


@dataclass
class LibraryCall:
    """The rewrite a binder asks for: ``final`` (a binding index) becomes
    ``call_dps_packed(kernel, args + [config])``, after the extra ``pre`` bindings. ``spec``
    is the kernel's config spec (it names the kernel); ``config`` is checked against it."""

    spec: ConfigSpec
    args: list[relax.Expr]
    config: dict[str, object]
    final: int
    absorbed: list[int]
    pre: list[tuple[relax.Var, relax.Expr]] = field(default_factory=list)
    #: the kernel's own output shape when the final value is a view of it (reshaped after)
    out_shape: list | None = None
    #: bindings whose values the kernel also writes, as further outputs after ``final``'s
    extra: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.spec.format(self.config)  # a key or value the kernel does not take: fail here

    @property
    def kernel(self) -> str:
        """The kernel's global function name (``plus.<kernel>``)."""
        return self.spec.kernel

    def config_text(self) -> str:
        return self.spec.format(self.config)


@dataclass(frozen=True)
class CallSettings:
    """What the options ask of every library call a binder makes."""

    # NaN must reach the output through activations (Options.propagate_nan)
    propagate_nan: bool = True
    # 3x3 convolutions may run as Winograd F(2x2, 3x3) (Options.conv_winograd)
    conv_winograd: bool = True
    # ...on layers of at least this many channels in and out (the target CPU's entry of
    # runtime.conv2d.WINOGRAD_MIN_CHANNELS; 0: wherever the kernel finds it faster)
    winograd_min_channels: int = 0


class Ctx:
    """Read access to the block of a match for binders."""

    def __init__(
        self,
        graph: OpGraph,
        match: Match,
        weights: set[int],
        taken: set[int] = frozenset(),
        settings: CallSettings = CallSettings(),  # noqa: B008 - frozen
    ) -> None:
        self.g = graph
        self.match = match
        self.members = set(match.members)
        self.weights = weights  # var ids of function parameters that are weights
        self.taken = taken  # bindings earlier library calls absorbed
        self.settings = settings

    @property
    def propagate_nan(self) -> bool:
        return self.settings.propagate_nan

    # --- bindings -------------------------------------------------------------------------
    def index(self, expr: relax.Expr) -> int | None:
        return self.g.by_var.get(expr.id_) if isinstance(expr, relax.Var) else None

    def call(self, index: int) -> relax.Call | None:
        return self.g.nodes[index].call

    def op(self, index: int) -> str:
        return self.g.nodes[index].op_name

    def member_call(self, expr: relax.Expr) -> tuple[int, relax.Call] | None:
        """(index, call) when ``expr`` is bound in the subgraph by an operator call."""
        i = self.index(expr)
        if i is None or i not in self.members or self.g.nodes[i].call is None:
            return None
        return i, self.g.nodes[i].call

    def block_call(self, expr: relax.Expr) -> tuple[int, relax.Call] | None:
        """(index, call) when ``expr`` is bound by an operator call anywhere in the block
        (reading through a value never changes what it is)."""
        i = self.index(expr)
        if i is None or self.g.nodes[i].call is None:
            return None
        return i, self.g.nodes[i].call

    def follow(self, index: int) -> int | None:
        """The member the match absorbs after ``index`` (:meth:`Match.follower`), unless an
        earlier library call took it."""
        nxt = self.match.follower(index)
        return None if nxt is None or nxt in self.taken else nxt

    def follow_outside(self, index: int) -> int | None:
        """The only reader of ``index``'s value anywhere in the block, for the operators
        +Graphs do not cover (a tuple-valued batch_norm and what follows it); the dispatcher
        keeps calls from sharing bindings."""
        nxt = self.g.sole_reader(index)
        return None if nxt is None or nxt in self.taken else nxt

    def value(self, index: int) -> relax.Expr:
        return self.g.value(index)

    def var(self, index: int) -> relax.Var:
        return self.g.nodes[index].var

    # --- values ---------------------------------------------------------------------------
    def is_weight(self, expr: relax.Expr) -> bool:
        return isinstance(expr, tvm.ir.expr.Constant) or (
            isinstance(expr, relax.Var) and expr.id_ in self.weights
        )

    def is_weight_view(self, expr: relax.Expr) -> bool:
        """A weight, or a reshape-like view of one bound in the block (a bias broadcast as
        ``[1, C, 1, 1]``, re-laid as ``[1, 1, 1, C]`` for channels last): the same values in
        the same order, which a library reads through its own reshape."""
        seen = 0
        while not self.is_weight(expr):
            found = self.block_call(expr)
            if found is None or self.op(found[0]) not in VIEW_OPS or seen > 8:
                return False
            expr = found[1].args[0]
            seen += 1
        return True

    def is_scalar_const(self, expr: relax.Expr) -> float | None:
        if isinstance(expr, tvm.ir.expr.Constant):
            value = expr.value
            if isinstance(value, (bool, int, float)):  # a scalar constant (hardswish's 3, 6)
                return float(value)
            arr = value.numpy()
            if arr.size == 1:
                return float(arr.reshape(()))
        return None

    def defined_before(self, expr: relax.Expr, position: int) -> bool:
        """``expr`` is available at binding ``position`` (a parameter, a constant or an
        earlier binding)."""
        i = self.index(expr)
        return i is None or i < position


HALF_DTYPES = ("float16", "bfloat16")


def half_accumulation(ctx: Ctx, index: int) -> str | None:
    """The half dtype of a contraction that accumulates in float32 (half operands,
    ``out_dtype="float32"``: how half-precision models are imported), else None."""
    call = ctx.call(index)
    dtypes = {dtype_of(a) for a in call.args if isinstance(a.ty, relax.TensorType)}
    if len(dtypes) == 1 and dtypes <= set(HALF_DTYPES) and dtype_of(ctx.var(index)) == "float32":
        return dtypes.pop()
    return None


def rounds_to(ctx: Ctx, index: int, dtype: str) -> bool:
    """Binding ``index`` is ``astype(float32 value, dtype)``: the one rounding of a
    float32-accumulated half-precision result."""
    if ctx.op(index) != "relax.astype":
        return False
    source = ctx.call(index).args[0]
    return dtype_of(source) == "float32" and dtype_of(ctx.var(index)) == dtype


def widened(ctx: Ctx, expr: relax.Expr, dtype: str) -> relax.Expr | None:
    """The ``dtype`` tensor behind ``astype(tensor, "float32")``, seen through views of the
    widened value (a half bias or operand the import widened for float32 accumulation; a
    convolution's bias comes reshaped to ``[1, C, 1, 1]``), else None."""
    for _ in range(8):
        found = ctx.block_call(expr)
        if found is None:
            return None
        if ctx.op(found[0]) == "relax.astype":
            source = found[1].args[0]
            return source if dtype_of(source) == dtype else None
        if ctx.op(found[0]) not in VIEW_OPS:
            return None
        expr = found[1].args[0]
    return None


def activation_of(op: str, call: relax.Call) -> str | None:
    """The library activation an operator is (``clip(x, 0, 6)`` is ``relu6``), else None."""
    if op in ACTIVATIONS:
        return ACTIVATIONS[op]
    if op == "relax.clip":
        bounds = []
        for arg in call.args[1:3]:
            value = getattr(arg, "value", None)  # a FloatImm, or a PrimValue holding one
            value = getattr(value, "value", value)
            bounds.append(float(value) if isinstance(value, (int, float)) else None)
        if bounds == [0.0, 6.0]:
            return "relu6"
    return None


def classify_add(
    ctx: Ctx,
    cur: int,
    nxt: int,
    bias_fits,  # noqa: ANN001
    can_bias: bool,
    can_residual: bool,
    widened_from: str | None = None,
) -> tuple[str, relax.Expr] | None:
    """What ``add(cur, other)`` at ``nxt`` is to a library epilogue: ``("bias", other)`` for a
    weight whose shape ``bias_fits``, ``("residual", other)`` for an earlier tensor of the
    result's shape, None for anything else (including ``cur + cur``). ``widened_from``: the
    half dtype of a float32 accumulator, whose bias comes as ``astype(bias, "float32")``
    (the half bias is returned)."""
    call = ctx.call(nxt)
    a, b = call.args
    other = b if a.same_as(ctx.var(cur)) else a
    if other.same_as(ctx.var(cur)):
        return None
    if widened_from is not None:  # a bias of the float32 accumulator: the half weight behind
        source = widened(ctx, other, widened_from)
        if source is None or not can_bias or not ctx.is_weight_view(source):
            return None
        return ("bias", source) if bias_fits(shape_of(other)) else None
    if can_bias and ctx.is_weight_view(other) and bias_fits(shape_of(other)):
        return "bias", other
    if can_residual and same_shape(other, ctx.var(nxt)) and ctx.defined_before(other, nxt):
        return "residual", other
    return None


def take_add(epilogue: object, found: tuple[str, relax.Expr] | None) -> bool:
    """Record :func:`classify_add`'s finding on an epilogue walk (its ``bias`` or its
    ``residual`` attribute); False when the add is neither."""
    if found is None:
        return False
    setattr(epilogue, found[0], found[1])
    return True


def pre_binding(name: str, expr: relax.Expr) -> tuple[relax.Var, relax.Expr]:
    """A dataflow binding emitted before the call (a view or small TIR around the library
    call); the variable carries the normalized type."""
    value = relax.BlockBuilder().normalize(expr)
    return relax.DataflowVar(name, value.ty), value


def shape_of(expr: relax.Expr) -> list[int | None]:
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return []
    return [int(d) if isinstance(d, tvm.tirx.IntImm) else None for d in ty.shape.values]


def dtype_of(expr: relax.Expr) -> str:
    return str(expr.ty.dtype)


def same_shape(a: relax.Expr, b: relax.Expr) -> bool:
    sa, sb = a.ty.shape, b.ty.shape
    if sa is None or sb is None or len(sa.values) != len(sb.values):
        return False
    return all(tvm_ffi.structural_equal(x, y) for x, y in zip(sa.values, sb.values))


def last_dim(expr: relax.Expr) -> object:
    return expr.ty.shape.values[-1]


def is_view_keeping_last(ctx: Ctx, index: int) -> bool:
    """A reshape-like op that keeps the innermost dimension (a free view for a row kernel)."""
    if ctx.op(index) not in VIEW_OPS:
        return False
    call = ctx.call(index)
    src, dst = call.args[0], ctx.var(index)
    try:
        return tvm_ffi.structural_equal(last_dim(src), last_dim(dst))
    except (AttributeError, IndexError):
        return False


def permute_axes(call: relax.Call) -> list[int] | None:
    axes = call.attrs.axes if call.attrs is not None else None
    if axes is None:
        return None
    return [int(a) for a in axes]
