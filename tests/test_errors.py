"""plus_tvm.errors: an error TVM raised (refusing an input) is told apart from a bug of plus_tvm's
own code, which the sites catching TVM's error types re-raise."""

from __future__ import annotations

import pytest
import tvm
import tvm_ffi
from plus_tvm import env
from plus_tvm.errors import TVM_FAILURE, InputRefusedError, is_refusal, raised_by, raised_by_tvm


def _caught(call):
    try:
        call()
    except TVM_FAILURE as err:
        return err
    raise AssertionError("no error")


def test_an_error_from_tvm_cpp_is_tvm_refusing():
    err = _caught(lambda: tvm.target.Target({"kind": "no-such-kind"}))
    assert getattr(err, "__tvm_ffi_error__", None) is not None and raised_by_tvm(err)


def test_an_error_of_plus_code_is_a_bug_even_through_the_ffi():
    err = _caught(lambda: env.raw("NOT_DOCUMENTED"))  # KeyError raised in plus_tvm
    assert not raised_by_tvm(err) and not is_refusal(err)
    through_ffi = tvm_ffi.convert(env.raw)  # called back from C++, converted twice
    err = _caught(lambda: through_ffi("NOT_DOCUMENTED"))
    assert not raised_by_tvm(err)


def test_a_refusal_of_plus_code_and_other_libraries():
    def refuse():
        raise InputRefusedError("no")

    assert is_refusal(_caught(refuse)) and not raised_by_tvm(_caught(refuse))
    import numpy as np

    err = _caught(lambda: np.reshape(np.zeros(3), (2, 2)))  # numpy's, called from here
    assert not raised_by(err, ("onnx",))  # no frame of the library named: not its refusal


@pytest.mark.parametrize("kind", [TypeError, AttributeError])
def test_errors_of_test_code_alone_are_nobodys(kind):
    def fail():
        raise kind("x")

    assert not raised_by_tvm(_caught(fail))
