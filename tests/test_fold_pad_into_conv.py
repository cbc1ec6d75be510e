"""FoldPadIntoConv: zero pads of H/W in front of a conv2d become its padding when the result
is symmetric; other pads stay; results unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from plus_tvm.passes import FoldPadIntoConv
from tvm import relax


def _calls(mod, name: str) -> list:
    out = []

    def visit(e):
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name == name:
            out.append(e)

    relax.analysis.post_order_visit(mod["main"].body, visit)
    return out


def _module(pad_width, pad_value=0.0, layout="NCHW", padding=(0, 0), extra_use=False):
    bb = relax.BlockBuilder()
    shape = [1, 4, 9, 10] if layout == "NCHW" else [1, 9, 10, 4]
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    w = relax.Var(
        "w", relax.TensorType([6, 4, 3, 3] if layout == "NCHW" else [3, 3, 4, 6], "float32")
    )
    with bb.function("main", [x, w]):
        with bb.dataflow():
            p = bb.emit(relax.op.nn.pad(x, pad_width, pad_value=pad_value))
            y = bb.emit(
                relax.op.nn.conv2d(
                    p,
                    w,
                    strides=2,
                    padding=padding,
                    data_layout=layout,
                    kernel_layout="OIHW" if layout == "NCHW" else "HWIO",
                )
            )
            if extra_use:
                y = bb.emit(relax.Tuple([y, bb.emit(relax.op.sum(p))]))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _run(mod):
    ex = tvm.compile(mod, "llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    rng = np.random.default_rng(0)
    args = [
        tvm.runtime.tensor(rng.standard_normal([int(d) for d in p.ty.shape]).astype("float32"))
        for p in mod["main"].params
    ]
    out = vm["main"](*args)
    return [o.numpy() for o in out] if isinstance(out, tvm.ir.Array) else [out.numpy()]


@pytest.mark.parametrize(
    "pad_width, layout, padding, folded, want",
    [
        ([0, 0, 0, 0, 1, 1, 1, 1], "NCHW", (0, 0), True, (1, 1, 1, 1)),
        ([0, 0, 0, 0, 1, 1, 2, 2], "NCHW", (1, 0), True, (2, 2, 2, 2)),
        ([0, 0, 1, 1, 2, 2, 0, 0], "NHWC", (0, 0), True, (1, 2, 1, 2)),
        ([0, 0, 0, 0, 0, 1, 0, 1], "NCHW", (0, 0), False, None),  # TF "same", stride 2
        ([0, 0, 0, 0, 2, 0, 1, 3], "NCHW", (1, 1), False, None),  # asymmetric
        ([1, 0, 0, 0, 1, 1, 1, 1], "NCHW", (0, 0), False, None),  # a batch pad
    ],
)
def test_zero_spatial_pads_fold(pad_width, layout, padding, folded, want):
    mod = _module(pad_width, layout=layout, padding=padding)
    out = FoldPadIntoConv()(mod)
    assert (not _calls(out, "relax.nn.pad")) == folded
    if folded:
        assert tuple(int(p) for p in _calls(out, "relax.nn.conv2d")[0].attrs.padding) == want
    for got, ref in zip(_run(out), _run(mod)):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "pad_width, layout, padding, want",
    [
        ([0, 0, 0, 0, 0, 1, 0, 1], "NCHW", (0, 0), (0, 0, 1, 1)),  # TF "same", stride 2
        ([0, 0, 0, 0, 2, 0, 1, 3], "NCHW", (1, 1), (3, 2, 1, 4)),
        ([0, 0, 0, 1, 2, 0, 0, 0], "NHWC", (0, 0), (0, 2, 1, 0)),
    ],
)
def test_asymmetric_pads_fold_where_the_library_pads_itself(pad_width, layout, padding, want):
    mod = _module(pad_width, layout=layout, padding=padding)
    assert _calls(FoldPadIntoConv()(mod), "relax.nn.pad")  # default: symmetric only
    out = FoldPadIntoConv(asymmetric=True)(mod)
    assert not _calls(out, "relax.nn.pad")
    assert tuple(int(p) for p in _calls(out, "relax.nn.conv2d")[0].attrs.padding) == want
    for got, ref in zip(_run(out), _run(mod)):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_nonzero_pad_value_stays():
    mod = _module([0, 0, 0, 0, 1, 1, 1, 1], pad_value=1.5)
    out = FoldPadIntoConv()(mod)
    assert _calls(out, "relax.nn.pad")
    assert tuple(int(p) for p in _calls(out, "relax.nn.conv2d")[0].attrs.padding) == (0, 0, 0, 0)


def test_a_pad_read_elsewhere_stays_for_its_other_reader():
    mod = _module([0, 0, 0, 0, 1, 1, 1, 1], extra_use=True)
    out = FoldPadIntoConv()(mod)
    assert len(_calls(out, "relax.nn.pad")) == 1  # still feeds the sum
    assert tuple(int(p) for p in _calls(out, "relax.nn.conv2d")[0].attrs.padding) == (1, 1, 1, 1)
    for got, ref in zip(_run(out), _run(mod)):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4)


def test_input_module_not_mutated():
    mod = _module([0, 0, 0, 0, 1, 1, 1, 1])
    before = mod.script()
    FoldPadIntoConv()(mod)
    assert mod.script() == before
