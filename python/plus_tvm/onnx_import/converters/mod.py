"""ONNX ``Mod`` of floats with ``fmod=0``: Python's (numpy's) modulo, infinities included.

TVM's converter uses ``floor_mod``, computed as ``a - floor(a / b) * b``: with an infinite
divisor that is ``nan`` where numpy gives ``a`` or ``b`` (``-3 mod inf = inf``, ``3 mod inf =
3``), and a zero result loses the divisor's sign (``0 mod -2 = -0``). Here the result is C's
``fmod`` moved into the divisor's sign: ``r = fmod(a, b)``; ``r + b`` where ``r`` is non-zero with
a sign other than ``b``'s; a zero ``r`` takes ``b``'s sign. Integers and ``fmod=1`` keep TVM's
converter.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import Mod as TVMMod

from ._common import emit


class Mod(TVMMod):
    """``Mod`` with numpy's floating-point modulo."""

    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        a, b = inputs[0], inputs[1]
        constant = isinstance(a, tvm.ir.GenericConst) and isinstance(b, tvm.ir.GenericConst)
        if attr.get("fmod", 0) != 0 or constant or not (_float(a) and _float(b)):
            return super()._impl_v10(bb, inputs, attr, params)  # (constants: numpy's mod)
        dtype = str(a.ty.dtype)
        zero = relax.const(0.0, dtype)
        r = emit(bb, relax.op.mod(a, b))  # C's fmod: the dividend's sign
        differ = relax.op.logical_xor(relax.op.less(r, zero), relax.op.less(b, zero))
        moved = relax.op.where(
            relax.op.logical_and(relax.op.not_equal(r, zero), differ), relax.op.add(r, b), r
        )
        signed_zero = relax.op.where(relax.op.less(b, zero), relax.const(-0.0, dtype), zero)
        return relax.op.where(relax.op.equal(r, zero), signed_zero, emit(bb, moved))


def _float(x: object) -> bool:
    ty = getattr(x, "ty", None)
    return isinstance(ty, relax.TensorType) and str(ty.dtype).startswith(("float", "bfloat"))
