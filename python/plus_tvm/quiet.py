"""Quiet by default: keep TVM's log warnings and Python's FutureWarnings off the console.

TVM's C++ code logs warnings straight to file descriptor 2 (``Warning: Fast mode segfaults when
there are out-of-bounds indices``, ``Unknown pragma``), once per kernel, and torch /
transformers emit FutureWarnings while exporting. :func:`quiet` sends descriptor 2 to a buffer
(dropped at the end) while Python's own ``sys.stderr`` (error messages, progress bars) keeps
the terminal, and ignores FutureWarning and DeprecationWarning. ``plus-tvm --verbose`` and
``scripts/demo --verbose`` turn it off.

The Python API (:func:`plus_tvm.compile`, :func:`plus_tvm.inspect`) uses :func:`filtered`
instead: the same Python warnings are ignored, and what native code writes to descriptor 2 is
held during the compile and written back afterwards without the lines of :data:`NOISE` (TVM's
log lines about its own internals), so nothing a user's other threads print is lost.
``Options(verbose=True)`` keeps everything.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator

# native log lines plus's own compiles cause and a user cannot act on (substrings)
NOISE = (
    "Fast mode segfaults when there are out-of-bounds indices",
    "BlockBuilder destroyed with remaining blocks",
    "Unknown pragma",
    "Detected pow(x, y) where y >= 3",  # TVM's note on a model's x ** 3 (GELU's tanh form)
)


@contextlib.contextmanager
def quiet(enabled: bool = True) -> Iterator[None]:
    """Silence native stderr output and noisy Python warnings inside the block (the CLI)."""
    with _ignored_warnings(enabled), _CAPTURE.held(enabled, keep=False):
        yield


@contextlib.contextmanager
def filtered(enabled: bool = True) -> Iterator[None]:
    """Ignore torch's / TVM's FutureWarning and DeprecationWarning and drop :data:`NOISE`
    lines from native stderr inside the block; everything else native code wrote comes back
    to descriptor 2 when the block ends (the Python API)."""
    with _ignored_warnings(enabled), _CAPTURE.held(enabled, keep=True):
        yield


@contextlib.contextmanager
def _ignored_warnings(enabled: bool) -> Iterator[None]:
    if not enabled:
        yield
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


class _SharedCapture:
    """Descriptor 2 is one per process: compiles running in several threads (and the CLI's
    capture around them) share one capture, taken by the first to enter and released by the
    last to leave, so no thread restores a descriptor another thread's capture put there. On
    release the lines outside :data:`NOISE` are written back, unless a holder asked for
    nothing back (``keep=False``: the CLI's ``quiet``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.depth = 0
        self.keep = True
        self.saved: int | None = None
        self.sink = None
        self.python_stderr = None

    @contextlib.contextmanager
    def held(self, enabled: bool, keep: bool) -> Iterator[None]:
        with self.lock:
            counted = enabled and (self.depth > 0 or self._start())
            if counted:
                self.depth += 1
                self.keep = self.keep and keep
        try:
            yield
        finally:
            if counted:
                with self.lock:
                    self.depth -= 1
                    if self.depth == 0:
                        self._stop()

    def _start(self) -> bool:
        try:
            sys.stderr.flush()
            saved = os.dup(2)
        except (OSError, ValueError, AttributeError):  # no real descriptor 2 (a notebook)
            return False
        self.saved, self.sink = saved, tempfile.TemporaryFile()
        os.dup2(self.sink.fileno(), 2)
        self.python_stderr = None
        with contextlib.suppress(OSError, ValueError, AttributeError):
            if sys.stderr.fileno() == 2:  # Python's own messages (progress) keep the terminal
                self.python_stderr = sys.stderr
                sys.stderr = os.fdopen(os.dup(saved), "w", buffering=1, closefd=True)
        return True

    def _stop(self) -> None:
        saved, sink = self.saved, self.sink
        self.saved = self.sink = None
        if self.python_stderr is not None:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.flush()
                sys.stderr.close()
            sys.stderr, self.python_stderr = self.python_stderr, None
        os.dup2(saved, 2)
        os.close(saved)
        keep, self.keep = self.keep, True
        with sink:
            sink.seek(0)
            kept = _without_noise(sink.read()) if keep else b""
        if kept:
            with contextlib.suppress(OSError):
                os.write(2, kept)


_CAPTURE = _SharedCapture()  # descriptor 2 is process-wide state; so is its capture


def _without_noise(data: bytes) -> bytes:
    lines = data.splitlines(keepends=True)
    return b"".join(ln for ln in lines if not any(n.encode() in ln for n in NOISE))
