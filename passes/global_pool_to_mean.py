"""GlobalPoolToMean: an average pool whose window covers the whole input becomes a mean.

transformers' EfficientNet pools with ``nn.AvgPool2d(hidden_dim=1280, ceil_mode=True)`` on a 7x7
map: one output per channel, the average of the 49 inputs (the divisor is clamped to the
input). TVM imports it faithfully and legalizes it as a 1280x1280 window over a zero-padded
1286x1286 buffer per channel: 2.1 G elements, 1.45 s of EfficientNet-B0's 1.5 s on this CPU.
``mean(x, axis=[2, 3], keepdims=True)`` computes the same values (checked in the tests against
torch) in one pass over the 7x7 map.

Rewritten only when it is exact: NCHW layout, no padding, a 1x1 output, and a window at least
as large as the input in both dims (then both the count_include_pad divisor, clamped to the
input, and the plain one are H*W).
"""

from __future__ import annotations

import tvm
from tvm import relax


def _static(values: list) -> list[int] | None:
    out = []
    for v in values:
        if not isinstance(v, tvm.tirx.IntImm):
            return None
        out.append(int(v))
    return out


def _global_avg_pool(call: relax.Call) -> bool:
    if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.avg_pool2d"):
        return False
    at = call.attrs
    if str(at.layout) != "NCHW" or str(at.out_layout) not in ("NCHW", ""):
        return False
    if any(int(p) != 0 for p in at.padding) or any(int(d) != 1 for d in at.dilation):
        return False
    shape_in = call.args[0].ty.shape
    shape_out = call.ty.shape if hasattr(call, "ty") else None
    if shape_in is None or shape_out is None:
        return False
    dims_in, dims_out = _static(list(shape_in.values)), _static(list(shape_out.values))
    if dims_in is None or dims_out is None or dims_out[2:] != [1, 1]:
        return False
    pool = [int(k) for k in at.pool_size]
    return pool[0] >= dims_in[2] and pool[1] >= dims_in[3]


@tvm.transform.module_pass(opt_level=0, name="GlobalPoolToMean")
class GlobalPoolToMean:
    """Replace whole-input average pools by ``mean`` over the spatial axes."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        functions = {}
        changed = False
        bb = relax.BlockBuilder()
        for gvar, func in mod.functions_items():
            if isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr):
                blocks = []
                for block in func.body.blocks:
                    bindings = []
                    for binding in block.bindings:
                        value = binding.value
                        if isinstance(value, relax.Call) and _global_avg_pool(value):
                            value = bb.normalize(
                                relax.op.mean(value.args[0], axis=[2, 3], keepdims=True)
                            )
                            changed = True
                        bindings.append(relax.VarBinding(binding.var, value))
                    cls = (
                        relax.DataflowBlock
                        if isinstance(block, relax.DataflowBlock)
                        else (relax.BindingBlock)
                    )
                    blocks.append(cls(bindings))
                body = relax.SeqExpr(blocks, func.body.body)
                func = relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs)
            functions[gvar] = func
        if not changed:
            return mod
        out = tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)
        return relax.transform.Normalize()(out)
