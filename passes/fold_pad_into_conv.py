"""FoldPadIntoConv: a zero pad of the spatial axes in front of a convolution becomes the
convolution's own padding.

Importers of models with TensorFlow-style "same" padding (transformers' MobileNetV2 and
EfficientNet) emit ``conv2d(nn.pad(x, ...), padding=0)``. The pad is then a kernel of its own
that writes a padded copy of the activation before every such convolution, while the
convolution (a library call after dispatch, or TVM's legalization) pads for free. The pass
adds the pad's widths to the convolution's ``padding`` (Relax's ``(top, left, bottom,
right)``) when the pad is constant zero and touches only the layout's ``H`` and ``W`` axes.

``asymmetric``: whether a padding that differs between top / bottom or left / right (TF's
stride-2 "same" pads one side) is folded too. Yes where the library convolution pads itself
(oneDNN's native kernel takes separate begin / end padding: the CPU's NHWC plan); no where it
would pad a copy of the activation first (ATen / cuDNN through torch: 2.7 ms for a 96x112x112
activation against 0.08 ms for the GIR-scheduled pad kernel). A pad that other operators also
read stays for them.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ._dataflow_rewrite import normalize_and_clean, op_name, rewrite_bindings


def _spatial_pad(pad: relax.Call, layout: str) -> tuple[int, int, int, int] | None:
    """``(top, left, bottom, right)`` of a constant-zero pad of ``layout``'s H and W only."""
    attrs = pad.attrs
    if str(attrs.pad_mode) != "constant" or float(attrs.pad_value) != 0.0:
        return None
    widths = [int(w) for w in attrs.pad_width]
    if len(widths) != 2 * len(layout) or any(w < 0 for w in widths):
        return None
    per_axis = {axis: (widths[2 * i], widths[2 * i + 1]) for i, axis in enumerate(layout)}
    if any(per_axis[a] != (0, 0) for a in layout if a not in "HW"):
        return None
    (top, bottom), (left, right) = per_axis["H"], per_axis["W"]
    return top, left, bottom, right


@tvm.transform.module_pass(opt_level=0, name="FoldPadIntoConv")
class FoldPadIntoConv:
    """Fold ``conv2d(pad(x), padding=p)`` into ``conv2d(x, padding=p + pad)``."""

    def __init__(self, asymmetric: bool = False) -> None:
        self.asymmetric = asymmetric

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        def fold(binding: relax.VarBinding, pads: dict, bb: relax.BlockBuilder):  # noqa: ANN202
            return _fold(binding, pads, bb, self.asymmetric)

        return rewrite_bindings(mod, fold, normalize_and_clean)


def _fold(
    binding: relax.VarBinding, pads: dict, bb: relax.BlockBuilder, asymmetric: bool
) -> relax.Expr | None:
    """The folded convolution, or None; ``pads`` maps a var to the pad call bound to it
    (within one dataflow block)."""
    value = binding.value
    if op_name(value) == "relax.nn.pad":
        pads[binding.var.id_] = value
    elif op_name(value) == "relax.nn.conv2d" and isinstance(value.args[0], relax.Var):
        new = _folded_conv(value, pads.get(value.args[0].id_), asymmetric)
        if new is not None:
            return bb.normalize(new)
    return None


def _folded_conv(conv: relax.Call, pad: relax.Call | None, asymmetric: bool) -> relax.Call | None:
    if pad is None:
        return None
    attrs = conv.attrs
    extra = _spatial_pad(pad, str(attrs.data_layout))
    if extra is None:
        return None
    padding = [int(p) + e for p, e in zip(attrs.padding, extra)]
    top, left, bottom, right = padding
    if not asymmetric and (top != bottom or left != right):
        return None  # a library convolution would pad a copy itself (see the module doc)
    return relax.op.nn.conv2d(
        pad.args[0],
        conv.args[1],
        strides=[int(s) for s in attrs.strides],
        padding=padding,
        dilation=[int(d) for d in attrs.dilation],
        groups=int(attrs.groups),
        data_layout=str(attrs.data_layout),
        kernel_layout=str(attrs.kernel_layout),
        out_layout=str(attrs.out_layout),
        out_dtype=attrs.out_dtype,
    )
