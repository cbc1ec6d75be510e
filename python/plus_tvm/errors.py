"""Exceptions raised by plus_tvm.

Every error a user can cause (bad model file, unknown zoo name, unsupported operator, wrong
input at run time, bad option) is a :class:`PlusError` with a message that names what is wrong
and where. The CLI turns these into one line on stderr and exit code 2.
"""

from __future__ import annotations


class PlusError(Exception):
    """Base class of every user-facing plus_tvm error."""


class OptionsError(PlusError, ValueError):
    """An ``Options`` field has an unknown name or an invalid value."""


class TargetError(PlusError, ValueError):
    """A target name or JSON target description cannot be turned into a TVM target."""


class ModelLoadError(PlusError, ValueError):
    """A model file or model reference cannot be read (missing, corrupt, wrong kind)."""


class UnknownModelError(PlusError, KeyError):
    """A ``zoo:NAME`` reference names no zoo model."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class UnsupportedOperatorError(PlusError, NotImplementedError):
    """The importer met an operator it cannot convert; the message names the op and the node."""


class InputError(PlusError, ValueError):
    """Inputs passed to a compiled model do not match its signature (count, shape or dtype)."""


class OutputWriteError(PlusError, OSError):
    """An output file or folder (``-o``, ``dump_ir``, ``--json``) cannot be written."""


# What TVM raises when it refuses an IR, a target or a schedule primitive: ScheduleError and
# InternalError are RuntimeErrors, and the FFI's ValueError kind. A KeyboardInterrupt that
# crossed TVM's C++ arrives as a RuntimeError too: code catching these calls
# ``plus_tvm.interrupt.check()`` first.
TVM_REFUSAL = (RuntimeError, ValueError)

# What TVM's Python code (importers' converters, legalizers, schedule rules) raises when it
# fails on an input: the kinds the FFI maps C++ errors to, and the asserts of its Python code.
# Any other error type is a bug and propagates.
TVM_FAILURE = (
    RuntimeError,
    ValueError,
    TypeError,
    IndexError,
    KeyError,
    AttributeError,
    AssertionError,
)


class InternalCompileError(RuntimeError):
    """A pass failed on a model where it should not: a bug of the pipeline (not bad input).

    The message names the phase and the pass, and carries the pass's own error; the CLI
    reports it as an internal error (exit 1).
    """
