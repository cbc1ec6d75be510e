"""SimplifyViews: reshape chains fold, identity broadcasts / reshapes / zero pads disappear,
everything else stays, and results are unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from plus_tvm.passes import SimplifyViews
from tvm import relax


def _ops(mod) -> list[str]:
    return [
        b.value.op.name
        for blk in mod["main"].body.blocks
        for b in blk.bindings
        if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)
    ]


def _module(make) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([2, 3, 4, 4], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(x))
            out = bb.emit_output(make(bb, y))
        bb.emit_func_output(out)
    return bb.get()


def _run(mod, x):
    ex = tvm.compile(mod, "llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


CASES = {
    "zero pad": (lambda bb, y: bb.emit(relax.op.nn.pad(y, [0] * 8)), "relax.nn.pad", False),
    "real pad": (
        lambda bb, y: bb.emit(relax.op.nn.pad(y, [0, 0, 0, 0, 1, 0, 0, 1])),
        "relax.nn.pad",
        True,
    ),
    "identity reshape": (
        lambda bb, y: bb.emit(relax.op.reshape(y, [2, 3, 4, 4])),
        "relax.reshape",
        False,
    ),
    "identity broadcast": (
        lambda bb, y: bb.emit(relax.op.broadcast_to(y, [2, 3, 4, 4])),
        "relax.broadcast_to",
        False,
    ),
    "real broadcast": (
        lambda bb, y: bb.emit(relax.op.broadcast_to(y, [5, 2, 3, 4, 4])),
        "relax.broadcast_to",
        True,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_identities_are_dropped_and_the_rest_kept(case):
    make, op, kept = CASES[case]
    mod = _module(make)
    out = SimplifyViews()(mod)
    assert (op in _ops(out)) == kept
    x = np.random.default_rng(0).standard_normal([2, 3, 4, 4]).astype("float32")
    np.testing.assert_array_equal(_run(out, x), _run(mod, x))


def test_reshape_chains_fold_into_one_reshape():
    def chain(bb, y):
        a = bb.emit(relax.op.reshape(y, [6, 16]))
        b = bb.emit(relax.op.reshape(a, [6, 4, 4]))
        return bb.emit(relax.op.reshape(b, [2, 48]))

    mod = _module(chain)
    out = SimplifyViews()(mod)
    # every reshape now views the relu directly; the unused ones are dead code
    assert _ops(relax.transform.DeadCodeElimination()(out)).count("relax.reshape") == 1
    x = np.random.default_rng(1).standard_normal([2, 3, 4, 4]).astype("float32")
    np.testing.assert_array_equal(_run(out, x), _run(mod, x))


def _permutes(out) -> list[list[int]]:
    out = relax.transform.DeadCodeElimination()(out)
    return [
        [int(a) for a in b.value.attrs.axes]
        for blk in out["main"].body.blocks
        for b in blk.bindings
        if isinstance(b.value, relax.Call)
        and isinstance(b.value.op, tvm.ir.Op)
        and b.value.op.name == "relax.permute_dims"
    ]


@pytest.mark.parametrize(
    "chain, left",
    [
        # torch's SDPA output: the first two cancel, the head merge stays
        ([[2, 0, 1, 3], [1, 2, 0, 3], [0, 2, 1, 3]], [[0, 2, 1, 3]]),
        ([[0, 2, 1, 3], [0, 2, 1, 3]], []),  # a transpose undone
        ([[0, 1, 2, 3]], []),  # a lone identity
        # a head split then k^T (eager attention): kept as the binders read it
        ([[0, 2, 1, 3], [0, 1, 3, 2]], [[0, 2, 1, 3], [0, 1, 3, 2]]),
    ],
    ids=["sdpa-output", "undone", "identity", "head-split-then-kT"],
)
def test_permute_chains_that_cancel_disappear(chain, left):
    def permutes(bb, y):
        for axes in chain:
            y = bb.emit(relax.op.permute_dims(y, axes))
        return y

    mod = _module(permutes)
    out = SimplifyViews()(mod)
    assert _permutes(out) == left
    x = np.random.default_rng(2).standard_normal([2, 3, 4, 4]).astype("float32")
    np.testing.assert_array_equal(_run(out, x), _run(mod, x))
