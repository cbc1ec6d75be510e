"""ExpandIntegerPower: ``pow(x, n)`` with a small integer constant ``n`` becomes multiplications.

TVM's CUDA code is compiled with ``--use_fast_math`` (always with NVRTC, TVM's default; with
nvcc unless ``TVM_CUDA_NVCC_NO_FAST_MATH``), which turns ``powf(x, y)`` into
``exp2(y * log2(x))``: NaN for every negative ``x``, even where ``y`` is an integer. Models square
and cube negative values all the time: RMSNorm (LLaMA, T5: ``x.pow(2).mean()``), GPT-2's and
ALBERT's tanh GELU (``x + 0.044715 * x.pow(3)``), variance. Measured on an H100: LLaMA-tiny and
T5-tiny returned NaN under plus, GPT-2-tiny and ALBERT-tiny under TVM's own CUDA pipeline.

Every ``pow(x, c)`` in every PrimFunc whose exponent is a constant integer with
``|c| <=`` :data:`MAX_EXPONENT` is rewritten into a product of ``x`` (``1 / product`` for a negative
``c``, ``1`` for ``0``), and ``pow(x, 0.5)`` into ``sqrt(x)``; a non-trivial ``x`` is bound once
(``Let``). That is exact where ``powf`` is exact and cheaper on every target, so the pass runs on
CPU too.
"""

from __future__ import annotations

import tvm
from plus_tvm.tir_blocks import stores_any
from plus_tvm.tir_blocks.rebuild import map_blocks
from tvm import tirx

from ._prim_func_rewrite import rewrite_prim_funcs

MAX_EXPONENT = 4
_POW = tvm.ir.Op.get("tirx.pow")
_PLAIN = (tirx.Var, tvm.ir.TensorLoad, tirx.FloatImm, tirx.IntImm, tirx.Broadcast)


@tvm.transform.module_pass(opt_level=0, name="ExpandIntegerPower")
class ExpandIntegerPower:
    """Rewrite ``pow`` by small integer constants (and 0.5) in every PrimFunc (module doc)."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return rewrite_prim_funcs(mod, _expand)


def _expand(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    if not _has_pow(func):
        return None
    body = map_blocks(func.body, expand_power)
    return None if body.same_as(func.body) else func.with_body(body)


def expand_power(e: tvm.ir.Expr) -> tvm.ir.Expr | None:
    """The expansion of ``e`` when it is ``pow(x, small integer or 0.5)``, else None."""
    if not (isinstance(e, tvm.ir.Call) and e.op.same_as(_POW) and "float" in str(e.ty)):
        return None
    base, exponent = e.args
    if not isinstance(exponent, (tirx.FloatImm, tirx.IntImm)):
        return None
    value = float(exponent.value)
    if value == 0.5:
        return tirx.sqrt(base)
    if value != int(value) or abs(value) > MAX_EXPONENT:
        return None
    n = int(value)
    dtype = str(e.ty)
    if n == 0:
        return tirx.const(1.0, dtype)
    var = base if isinstance(base, _PLAIN) else tirx.Var("pow_base", dtype)
    product = var
    for _ in range(abs(n) - 1):
        product = product * var
    if n < 0:
        product = tirx.const(1.0, dtype) / product
    return product if var is base else tirx.Let(var, base, product)


def _has_pow(func: tirx.PrimFunc) -> bool:
    """Whether a block of ``func`` stores a value computed with ``pow`` (most kernels do not,
    and are left untouched without rebuilding them)."""
    return stores_any(func, lambda e: isinstance(e, tvm.ir.Call) and e.op.same_as(_POW))
