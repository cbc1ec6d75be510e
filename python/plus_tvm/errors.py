"""Exceptions raised by plus_tvm.

Every error a user can cause (bad model file, unknown zoo name, unsupported operator, wrong
input at run time, bad option) is a :class:`PlusError` with a message that names what is wrong
and where. The CLI turns these into one line on stderr and exit code 2.
"""

from __future__ import annotations

import os
import sys
from types import TracebackType


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


class IndexOutOfRangeError(PlusError, IndexError):
    """An index a gather or scatter uses is outside the tensor it indexes (checked as the model
    runs, or at compile time for a constant); the message names the operator, the node, the
    value, its position and the valid range."""


class HostNodeError(PlusError, RuntimeError):
    """A node run on the host (ONNX's reference implementation, or torch eager for a torch op
    without a converter) refused the values it got as the model ran; the message names it."""


class BranchSpeculationError(PlusError, RuntimeError):
    """A call took a Python branch on a tensor's value the other way than the compiled path
    (plus_tvm.torch_branch_speculation), and no torch module can run it; names the line."""


# What the runtime's services (packed functions the VM calls) put in the message of an error
# they raise on bad values: TVM hands such an error back as a bare RuntimeError (from a run, or
# from a pass that evaluated the service at compile time), and :func:`service_error` finds
# the user-facing error again by its marker.
INDEX_MARKER = "index out of range: "
HOST_NODE_MARKER = "(run on the host by ONNX's reference implementation) failed"
_SERVICE_ERRORS = ((INDEX_MARKER, IndexOutOfRangeError), (HOST_NODE_MARKER, HostNodeError))
TORCH_HOST_MARKER = "(run on the host by torch eager) failed"  # runtime.torch_host
_SERVICE_ERRORS += ((TORCH_HOST_MARKER, HostNodeError),)
TORCH_NEEDED_MARKER = "needs torch, which cannot be imported in this process"  # runtime._torch
_SERVICE_ERRORS += ((TORCH_NEEDED_MARKER, PlusError),)


def service_error(err: BaseException) -> PlusError | None:
    """The user-facing error behind ``err`` when a runtime service raised it, else None."""
    text = str(err)
    for marker, kind in _SERVICE_ERRORS:
        if marker in text:
            return kind(text[text.find(marker) if kind is IndexOutOfRangeError else 0 :].strip())
    return None


class OutputWriteError(PlusError, OSError):
    """An output file or folder (``-o``, ``dump_ir``, ``--json``) cannot be written."""


class EnvVarError(PlusError, ValueError):
    """An environment variable plus_tvm reads (``plus_tvm.env``) has a value it cannot use."""


class CacheDirError(PlusError):
    """plus_tvm's cache folder cannot be created or used (not writable, not a folder); not an
    ``OSError``, so that code falling back on a missing file does not hide it."""


class UnsafeCacheError(PlusError):
    """A folder or file of plus_tvm's cache is owned by another user or writable by group or
    others, so someone else could have planted what plus_tvm would load from it; the message
    names the path, what is wrong and how to fix it. (Not an ``OSError``: code that treats an
    unreadable cache file as absent must not swallow this.)"""


# What TVM raises when it refuses an IR, a target or a schedule primitive: ScheduleError and
# InternalError are RuntimeErrors, and the FFI's ValueError kind. A KeyboardInterrupt that
# crossed TVM's C++ arrives as a RuntimeError too: code catching these calls
# ``plus_tvm.interrupt.check()`` first.
TVM_REFUSAL = (RuntimeError, ValueError)

# What TVM's Python code (importers' converters, legalizers, schedule rules) raises when it
# fails on an input: the kinds the FFI maps C++ errors to, and the asserts of its Python code.
# Any other error type is a bug and propagates. These types are also what plus_tvm's own bugs
# raise: a site catching them re-raises what :func:`is_refusal` does not call a refusal.
TVM_FAILURE = (
    RuntimeError,
    ValueError,
    TypeError,
    IndexError,
    KeyError,
    AttributeError,
    AssertionError,
)


class InputRefusedError(ValueError):
    """plus_tvm's own code (a converter of its importers) refusing an input it cannot handle,
    as TVM's code refuses one with its errors: the sites that catch :data:`TVM_FAILURE` take it
    for a refusal (:func:`is_refusal`), where any other error of plus_tvm's code is a bug."""


TVM_PACKAGES = ("tvm", "tvm_ffi")
# frames tvm-ffi appends to an error from C++ (its backtrace: ``.cc`` / ``.h`` files, or
# ``<unknown>`` without debug information) and the frames of its Cython core (``.pxi``)
_NATIVE_FRAME_SUFFIXES = (".cc", ".cpp", ".cxx", ".h", ".hpp", ".pxi", ".pyx")


def _package_dirs(names: tuple[str, ...]) -> tuple[str, ...]:
    """The folders of the packages ``names`` that are imported (one not imported raised
    nothing), each ending in a separator."""
    dirs = []
    for name in names:
        module = sys.modules.get(name)
        for folder in getattr(module, "__path__", None) or ():
            dirs.append(os.path.join(os.path.realpath(folder), ""))
    return tuple(dirs)


def _own_dirs() -> tuple[str, ...]:
    # plus_tvm and the folders mapped into it (pyproject: passes, schedules, warehouse)
    return _package_dirs(
        ("plus_tvm", "plus_tvm.passes", "plus_tvm.schedules", "plus_tvm.warehouse")
    )


def raised_by(err: BaseException, packages: tuple[str, ...]) -> bool:
    """Whether ``err`` was raised by the code of ``packages`` rather than by plus_tvm's own.

    The traceback is read from the innermost frame outwards; frames of other code (numpy, the
    standard library, ...) are skipped, and the first frame that is plus_tvm's or one of
    ``packages``' decides. With ``packages`` including ``tvm_ffi``, the frames tvm-ffi appends
    to an error converted from C++ (C++ sources, its Cython core) count as that package's.

    So a bug in plus_tvm's code (an ``AttributeError`` in one of its converters, even when TVM
    called that converter, and through the FFI) is plus_tvm's; TVM refusing an input, also
    when TVM's Python code fails inside numpy, is TVM's.
    """
    own = _own_dirs()
    theirs = _package_dirs(packages)
    native = "tvm_ffi" in packages
    frames: list[TracebackType] = []
    tb = err.__traceback__
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    for tb in reversed(frames):
        filename = tb.tb_frame.f_code.co_filename
        path = os.path.realpath(filename) if os.path.isabs(filename) else filename
        if path.startswith(own):
            return False
        if path.startswith(theirs):
            return True
        if native and (filename == "<unknown>" or filename.endswith(_NATIVE_FRAME_SUFFIXES)):
            return True
    return False  # no frame of either: not raised inside the library


def raised_by_tvm(err: BaseException) -> bool:
    """Whether ``err`` (one of :data:`TVM_FAILURE`) is TVM refusing something, not a bug of
    plus_tvm's own code (:func:`raised_by` with TVM's packages)."""
    return raised_by(err, TVM_PACKAGES)


def is_refusal(err: BaseException) -> bool:
    """Whether ``err`` refuses the input (TVM's error: :func:`raised_by_tvm`, or plus_tvm's
    :class:`InputRefusedError`) rather than being a bug of plus_tvm's own code. A site that
    catches :data:`TVM_FAILURE` re-raises the rest::

        except TVM_FAILURE as err:
            if not is_refusal(err):
                raise  # plus_tvm's own bug
    """
    return isinstance(err, InputRefusedError) or raised_by_tvm(err)


class InternalCompileError(RuntimeError):
    """A pass failed on a model where it should not: a bug of the pipeline (not bad input).

    The message names the phase and the pass, and carries the pass's own error; the CLI
    reports it as an internal error (exit 1).
    """
