"""FoldStaticSubgraphs: what does not depend on a model input is computed once, at compile time.

Exported transformers build their masks and position tables from ``arange``: GPT-2's and
LLaMA's (transformers' packed-sequence check) run ``arange -> slice -> subtract -> not_equal ->
cumsum -> index_tensor -> equal -> where`` on every call, although every value is fixed by the
static sequence length. On CUDA those kernels also cut the CUDA-graph region: TVM's scan dispatch
puts ``vm.builtin.reshape`` host calls around the cumsum (issue 12, item 1). TVM's
``FoldConstant`` folds only ``call_tir`` on constants and a few ops (``full``), not ``arange``
chains, and after the scan dispatch the cumsum is a GPU kernel it cannot run on the host.

This pass, first in phase 1, takes per dataflow block the bindings that are Relax operator calls
(with a legalization, pure) whose arguments are constants or earlier such bindings, with static
result shapes; compiles them as one function for the host CPU, runs it once and binds the values
other bindings use to constants. The arithmetic is TVM's own legalization of each operator, so
the values are the ones the kernels would compute. A block whose folded values would exceed
``max_bytes`` (constants live in the executable) is left as it is.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..index_inputs import is_index_check
from ._dataflow_rewrite import map_functions, normalize_and_clean
from ._graph_staging import static_shape, tensor_bytes

_NOT_FOLDED = frozenset(
    {
        "relax.call_tir",
        "relax.call_tir_inplace",
        "relax.call_tir_with_grad",
        "relax.call_dps_packed",
        "relax.call_pure_packed",
        "relax.call_builtin_with_ctx",
        "relax.call_inplace_packed",
    }
)


def _operands(call: relax.Call) -> list[relax.Expr]:
    """The arguments that carry values (a check's callee and message are not operands)."""
    return list(call.args[1:3]) if is_index_check(call) else list(call.args)


# legalized by TVM's sort / scan dispatch (run before legalization when they are evaluated)
_SORT_SCAN = frozenset(
    {
        "relax.bucketize",
        "relax.sort",
        "relax.argsort",
        "relax.topk",
        "relax.cumsum",
        "relax.cumprod",
    }
)


def _foldable_op(call: relax.Call) -> bool:
    op = call.op
    if is_index_check(call):  # pure; a constant index out of range then fails the compile
        return True
    if not isinstance(op, tvm.ir.Op) or op.name in _NOT_FOLDED:
        return False
    if op.get_attr("FLegalize") is None and op.name not in _SORT_SCAN:
        return False
    return op.get_attr("FPurity") is not False


def _static_arg(arg: relax.Expr, static: set) -> bool:
    if isinstance(arg, tvm.ir.Constant):  # tensors, integers, strings, dtypes
        return True
    if isinstance(arg, relax.ShapeExpr):
        return all(isinstance(v, tvm.tirx.IntImm) for v in arg.values)
    if isinstance(arg, relax.Tuple):
        return all(_static_arg(f, static) for f in arg.fields)
    return isinstance(arg, relax.Var) and arg in static


@tvm.transform.module_pass(opt_level=0, name="FoldStaticSubgraphs")
class FoldStaticSubgraphs:
    """Evaluate input-independent operator chains at compile time.

    Parameters
    ----------
    max_bytes : int
        Most bytes of constants one dataflow block may gain; a block above it is not folded.
    """

    def __init__(self, max_bytes: int = 8 << 20) -> None:
        self.max_bytes = max_bytes

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return map_functions(mod, self._fold_function, normalize_and_clean)

    def _fold_function(self, func: relax.Function) -> relax.Function:
        blocks = list(func.body.blocks)
        changed = False
        for i, block in enumerate(blocks):
            if not isinstance(block, relax.DataflowBlock):
                continue
            folded = self._fold_block(func, block)
            if folded is not None:
                blocks[i] = folded
                changed = True
        if not changed:
            return func
        body = relax.SeqExpr(blocks, func.body.body)
        return relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs)

    def _fold_block(
        self, func: relax.Function, block: relax.DataflowBlock
    ) -> relax.DataflowBlock | None:
        static: set = set()
        chain: list[relax.VarBinding] = []
        for binding in block.bindings:
            if not isinstance(binding, relax.VarBinding):
                continue
            value = binding.value
            if isinstance(value, relax.Var) and value in static:
                static.add(binding.var)
                chain.append(binding)
            elif (
                isinstance(value, relax.Call)
                and _foldable_op(value)
                and static_shape(binding.var.ty) is not None
                and all(_static_arg(a, static) for a in _operands(value))
            ):
                static.add(binding.var)
                chain.append(binding)
        if not any(isinstance(b.value, relax.Call) for b in chain):
            return None
        needed = self._needed(func, block, static)
        if not needed or sum(tensor_bytes(v.ty) for v in needed) > self.max_bytes:
            return None
        values = _evaluate(chain, needed)
        consts = {v: relax.const(t.numpy(), str(v.ty.dtype)) for v, t in zip(needed, values)}
        bindings = []
        for binding in block.bindings:
            if binding.var in consts:
                bindings.append(relax.VarBinding(binding.var, consts[binding.var]))
            elif binding.var not in static:
                bindings.append(binding)
        return relax.DataflowBlock(bindings)

    @staticmethod
    def _needed(func: relax.Function, block: relax.DataflowBlock, static: set) -> list:
        """The folded variables something outside the folded chain reads, in binding order."""
        used: set = set()
        for other in func.body.blocks:
            for binding in other.bindings:
                if binding.var not in static:
                    used.update(relax.analysis.free_vars(binding.value))
        used.update(relax.analysis.free_vars(func.body.body))
        return [b.var for b in block.bindings if b.var in static and b.var in used]


def _evaluate(chain: list[relax.VarBinding], needed: list) -> list:
    """Compile ``chain`` for the host CPU as one function returning ``needed``; run it once."""
    bb = relax.BlockBuilder()
    with bb.function("main", []):
        with bb.dataflow():
            for binding in chain:
                bb.emit_normalized(binding)
            out = bb.emit_output(relax.Tuple(list(needed)))
        bb.emit_func_output(out)
    target = tvm.target.Target("llvm")
    with tvm.transform.PassContext(opt_level=3), target:
        mod = relax.backend.DispatchSortScan()(bb.get())
        exe = tvm.compile(mod, target=target)
    result = relax.VirtualMachine(exe, tvm.cpu())["main"]()
    return [result[i] for i in range(len(needed))]
