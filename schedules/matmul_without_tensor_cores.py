"""dlight ``gpu.Matmul`` without its tensor-core (WMMA) path, which crashes TVM 0.27.

For a float16 (or int8) matmul whose normalized I, J and K all exceed 64 on CUDA sm_70 and
newer, dlight's ``gpu.Matmul`` hands the function to ``MatmulTensorization`` (or its int8
twin), and TVM 0.27's ``tensorize`` of the WMMA ``load_a`` intrinsic segfaults (in
``ToJSONGraph``), even on a plain 128x128x128 float16 matmul: a crash no ``try`` can catch.
:class:`MatmulWithoutTensorCores` decides from the function's structure whether dlight would
take that path (a reduction block reading float16 / int8) and then marks the function
``dlight.do_not_tensorize`` (dlight's own switch), so ``gpu.Matmul`` schedules it with its
SIMT tiles instead; every other function goes to ``gpu.Matmul`` unchanged. Such a function is
also handed over under the target with its ``arch`` read as ``sm_60`` (what ``gpu.Matmul``
reads the arch for is the tensorization test alone): dlight's tensorization rule imports TVM's
CUDA tensor intrinsics before it reads the switch, 23 s of CPU once per process.
"""

from __future__ import annotations

import tvm
from tvm import tirx
from tvm.s_tir import dlight as dl
from tvm.s_tir.dlight.gpu.base import GPUScheduleRule

#: operand dtypes for which dlight 0.27 tries its tensorization rules
TENSORIZED_DTYPES = frozenset({"float16", "int8"})


def would_tensorize(func: tirx.PrimFunc, target: tvm.target.Target) -> bool:
    """Whether dlight's ``gpu.Matmul`` could hand ``func`` to a tensorization rule: CUDA
    sm_70+, and a reduction block (an axis of reduce type) reading a buffer of a dtype of
    :data:`TENSORIZED_DTYPES`."""
    if target.kind.name != "cuda":
        return False
    arch = str(target.attrs.get("arch", "")).replace("sm_", "")
    if not arch.isdigit() or int(arch) < 70:
        return False
    from tvm import s_tir

    found = False

    def visit(block: object) -> None:
        nonlocal found
        reduces = any(v.iter_type == tirx.IterVar.CommReduce for v in block.iter_vars)
        if reduces and any(r.source.dtype in TENSORIZED_DTYPES for r in block.reads):
            found = True

    import tvm_ffi

    tvm_ffi.structural_walk(func.body, [(s_tir.SBlock, visit)], order="post")
    return found


class MatmulWithoutTensorCores(GPUScheduleRule):
    """dlight ``gpu.Matmul``, never entering its WMMA tensorization (see the module doc)."""

    def __init__(self) -> None:
        self.matmul = dl.gpu.Matmul()

    def apply(self, func: tirx.PrimFunc, target: tvm.target.Target, tunable: bool):
        if not isinstance(func, tirx.PrimFunc):
            return None
        if would_tensorize(func, target):
            func = func.with_attr("dlight.do_not_tensorize", True)
            target = _before_tensor_cores(target)
        try:
            return self.matmul.apply(func, target, tunable)
        except AssertionError:  # dlight asserts on kernels it was not written for: declines
            return None


def _before_tensor_cores(target: tvm.target.Target) -> tvm.target.Target:
    """``target`` with its arch read as sm_60 (no tensor cores); everything else kept."""
    config = {str(k): v for k, v in target.export().items()}
    config["arch"] = "sm_60"
    return tvm.target.Target(config)
