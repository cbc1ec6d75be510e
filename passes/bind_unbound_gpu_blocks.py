"""BindUnboundGPUBlocks: no block of a GPU kernel left to run on the host.

After the schedule rules, a GPU PrimFunc may still hold blocks outside every thread-bound
loop (dlight's ``gpu.Matmul`` schedules a fused function's matmul and leaves its other outputs
as host loops; no rule took the function at all). TVM would compile them as host loops over
device buffers, which its 0.27 ``VerifyMemory`` does not catch (``plus_tvm.gpu_binding``).
This pass binds each such block with dlight ``gpu.Fallback``'s mapping, and refuses a kernel it
cannot bind with an error naming the kernel and its blocks: never a silently wrong library.
"""

from __future__ import annotations

import tvm
from plus_tvm.errors import InternalCompileError
from plus_tvm.gpu_binding import bind_unbound, is_gpu_target, unbound_blocks
from tvm import tirx


@tvm.transform.module_pass(opt_level=0, name="BindUnboundGPUBlocks")
class BindUnboundGPUBlocks:
    """Bind (or refuse) every GPU PrimFunc's blocks that would run on the host."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        current = tvm.target.Target.current(allow_none=True)
        functions = {}
        changed = False
        for gvar, func in mod.functions_items():
            if isinstance(func, tirx.PrimFunc):
                target = func.attrs.get("target", current) if func.attrs is not None else current
                if is_gpu_target(target) and unbound_blocks(func):
                    func = _bound(gvar.name_hint, func, target)
                    changed = True
            functions[gvar] = func
        if not changed:
            return mod
        return tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)


def _bound(name: str, func: tirx.PrimFunc, target: tvm.target.Target) -> tirx.PrimFunc:
    bound = bind_unbound(func, target)
    if bound is None:
        blocks = ", ".join(unbound_blocks(func)[:8])
        raise InternalCompileError(
            f"GPU kernel {name}: blocks {blocks} are bound to no GPU thread after the schedule "
            "rules and cannot be bound by the fallback mapping; it would run as a host loop "
            "over device memory"
        )
    return bound.with_attr("tirx.is_scheduled", True)
