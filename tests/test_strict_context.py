"""The tests' well-formedness instrument (tests/conftest.py ``WellFormedInstrument``): every
pass's input and output are checked, a module it has seen pass unchanged only once, and a
module updated in place since it passed is checked again."""

from __future__ import annotations

import pytest
import tvm
from conftest import WellFormedInstrument
from tvm import relax


def _module() -> tvm.IRModule:
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        bb.emit_func_output(bb.emit(relax.op.add(x, x)))
    return bb.get()


def _ill_formed() -> relax.Function:
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    free = relax.Var("free", relax.TensorType((4,), "float32"))  # bound nowhere
    return relax.Function([x], free, ret_ty=free.ty)


@tvm.transform.module_pass(opt_level=0, name="Identity")
def _identity(mod, _ctx):
    return mod


def _count_checks(monkeypatch) -> list:
    calls = []
    check = relax.analysis.check_well_formed

    def counted(mod, check_ty=True):
        calls.append(mod)
        return check(mod, check_ty)

    monkeypatch.setattr(relax.analysis, "check_well_formed", counted)
    return calls


def test_an_unchanged_module_is_checked_once(monkeypatch):
    calls = _count_checks(monkeypatch)
    mod = _module()
    with tvm.transform.PassContext(instruments=[WellFormedInstrument()]):
        tvm.transform.Sequential([_identity, _identity, _identity])(mod)
    assert len(calls) == 1  # (the stock instrument: 8, before and after each of the 4 passes)
    other = _module()
    with tvm.transform.PassContext(instruments=[WellFormedInstrument()]):
        _identity(mod)
        _identity(other)  # (an equal module, another object: checked)
    assert len(calls) == 3


def test_a_module_updated_in_place_after_it_passed_is_checked_again():
    mod = _module()
    with tvm.transform.PassContext(instruments=[WellFormedInstrument()]):
        _identity(mod)
        mod.update_func(mod.get_global_var("main"), _ill_formed())  # (outside any pass)
        with pytest.raises(AssertionError):
            _identity(mod)


def test_an_ill_formed_output_fails():
    @tvm.transform.module_pass(opt_level=0, name="Breaks")
    def breaks(mod, _ctx):
        return tvm.IRModule({"main": _ill_formed()})

    with tvm.transform.PassContext(instruments=[WellFormedInstrument()]):
        with pytest.raises(AssertionError):
            breaks(_module())
