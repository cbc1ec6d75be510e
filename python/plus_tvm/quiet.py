"""Quiet by default: keep TVM's log warnings and Python's FutureWarnings off the console.

TVM's C++ code logs warnings straight to file descriptor 2 (``Warning: Fast mode segfaults when
there are out-of-bounds indices``, ``Unknown pragma``), once per kernel, and torch /
transformers emit FutureWarnings while exporting. :func:`quiet` sends descriptor 2 to a buffer
while Python's own ``sys.stderr`` (error messages, progress bars) keeps the terminal, and
ignores FutureWarning and DeprecationWarning. ``plus-tvm --verbose`` and ``scripts/demo
--verbose`` turn it off.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator


@contextlib.contextmanager
def quiet(enabled: bool = True) -> Iterator[None]:
    """Silence native stderr output and noisy Python warnings inside the block."""
    if not enabled:
        yield
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        with _native_stderr_to_buffer():
            yield


@contextlib.contextmanager
def _native_stderr_to_buffer() -> Iterator[None]:
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no real descriptor 2 (a notebook)
        yield
        return
    old_stderr = sys.stderr
    try:
        on_fd2 = old_stderr.fileno() == 2
    except (OSError, ValueError, AttributeError):  # captured (pytest, a notebook): not fd 2
        on_fd2 = False
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        if on_fd2:  # Python's own messages keep the terminal
            sys.stderr = os.fdopen(os.dup(saved), "w", buffering=1, closefd=True)
        try:
            yield
        finally:
            if on_fd2:
                with contextlib.suppress(OSError, ValueError):
                    sys.stderr.flush()
                    sys.stderr.close()
                sys.stderr = old_stderr
            os.dup2(saved, 2)
            os.close(saved)
