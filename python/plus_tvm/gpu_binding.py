"""Every block of a GPU kernel bound to GPU threads: the check and the fallback binding.

A TIR function compiled for a GPU runs on the host wherever a block is not under a loop bound
to ``blockIdx`` / ``threadIdx`` (or a ``launch_thread``): TVM then emits a host loop that reads
and writes device buffers (wrong results or a crash on the GPU; in bfloat16 TVM's storage
legalization fails on it). dlight's rules leave such blocks: ``gpu.Matmul`` schedules the
matmul and leaves a fused function's other outputs (the cast input a residual branch also
reads) on the host. TVM 0.27's ``tirx.transform.VerifyMemory`` misses them: it runs after
``FlattenBuffer``, whose flattened views of the parameters it does not trace to the
function's arguments.

:func:`unbound_blocks` finds those blocks in a scheduled or unscheduled function;
:func:`bind_unbound` binds each one as dlight's ``gpu.Fallback`` binds a block (spatial loops
fused, split over ``blockIdx.x`` / ``threadIdx.x``, reductions kept inside the thread).
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx

from .errors import TVM_REFUSAL

_KERNEL_TAGS = ("blockIdx.", "threadIdx.")


def is_gpu_target(target: tvm.target.Target | None) -> bool:
    return target is not None and "gpu" in target.keys


def unbound_blocks(func: tirx.PrimFunc) -> list[str]:
    """Names of the leaf blocks of ``func`` that would run on the host (no enclosing loop
    bound to a GPU block or thread, no enclosing ``launch_thread``), in program order."""
    found: list[str] = []
    _walk(func.body, False, found)
    return found


def _walk(node: object, bound: bool, found: list[str]) -> bool:
    """Visit ``node``; returns whether it holds a kernel launch (a bound loop, a
    ``launch_thread``) anywhere inside."""
    if node is None:
        return False
    if isinstance(node, tirx.SeqStmt):
        launches = [_walk(s, bound, found) for s in node.seq]
        return any(launches)
    if isinstance(node, tirx.For):
        here = node.kind == tirx.ForKind.THREAD_BINDING and _is_kernel_tag(node.thread_binding)
        return _walk(node.body, bound or here, found) or here
    if isinstance(node, tirx.AttrStmt):
        here = node.attr_key == "thread_extent"
        return _walk(node.body, bound or here, found) or here
    if isinstance(node, s_tir.stmt.SBlockRealize):
        block = node.block
        mark = len(found)
        inner = _walk(block.body, bound, found) | _walk(block.init, bound, found)
        if not bound and not inner and len(found) == mark and block.name_hint != "root":
            found.append(block.name_hint)  # a leaf block on the host
        return inner
    if isinstance(node, tirx.IfThenElse):
        return _walk(node.then_case, bound, found) | _walk(node.else_case, bound, found)
    body = getattr(node, "body", None)
    if isinstance(body, tirx.Stmt):
        return _walk(body, bound, found)
    return False


def _is_kernel_tag(binding: object) -> bool:
    tag = getattr(binding, "thread_tag", "") if binding is not None else ""
    return str(tag).startswith(_KERNEL_TAGS)


def bind_unbound(func: tirx.PrimFunc, target: tvm.target.Target) -> tirx.PrimFunc | None:
    """``func`` with each of its :func:`unbound_blocks` bound to GPU threads (dlight
    ``gpu.Fallback``'s mapping), or None where a block cannot be bound this way (its loops
    also hold other blocks, or it is not a child of the root block)."""
    names = unbound_blocks(func)
    if not names:
        return func
    max_threads = int(target.attrs.get("max_num_threads", 1024))
    sch = s_tir.Schedule(func)
    try:
        for name in names:
            block = sch.get_sblock(name)
            loops = sch.get_loops(block)
            if loops and len(sch.get_child_blocks(loops[0])) != 1:
                return None  # a loop nest shared with other blocks
            stmt = sch.get(block)
            spatial, reduce = [], []
            for loop, var in zip(loops, stmt.iter_vars):
                kind = var.iter_type
                (spatial if kind == tirx.IterVar.DataPar else reduce).append(loop)
            if len(loops) != len(stmt.iter_vars) and loops:
                return None  # loops and block axes do not map one to one
            if not spatial:
                spatial.append(sch.add_unit_loop(block))
            sch.reorder(*spatial, *reduce)
            bx, tx = sch.split(sch.fuse(*spatial), factors=[None, max_threads])
            sch.bind(bx, "blockIdx.x")
            sch.bind(tx, "threadIdx.x")
            if reduce and stmt.init is not None:
                sch.decompose_reduction(block, reduce[0])
    except TVM_REFUSAL:  # a schedule primitive refused the block
        return None
    out = sch.mod["main"]
    return out if not unbound_blocks(out) else None
