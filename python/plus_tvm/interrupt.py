"""Ctrl-C that always ends a compilation.

A ``KeyboardInterrupt`` raised inside a pass or schedule rule that TVM's C++ pass manager calls
comes back to Python as a plain ``RuntimeError`` with an empty message: any ``except Exception``
on the way (a rule declining a kernel it cannot schedule) would swallow it, and the compilation
would go on and write its artifact. :func:`guard` therefore installs a SIGINT handler that
latches the interrupt before raising, and re-raises ``KeyboardInterrupt`` when the guarded
block ends; code that catches broad errors calls :func:`check` first so it stops at once.

The latch is process state by nature (signals are delivered to the process); it is only set
from the handler and cleared when the outermost guard exits.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


class _Latch:
    def __init__(self) -> None:
        self.set = False
        self.depth = 0


_LATCH = _Latch()


def interrupted() -> bool:
    """Whether Ctrl-C was pressed inside the current :func:`guard`."""
    return _LATCH.set


def check() -> None:
    """Raise ``KeyboardInterrupt`` if Ctrl-C was pressed inside the current :func:`guard`."""
    if _LATCH.set:
        raise KeyboardInterrupt


def _on_sigint(signum: int, frame: object) -> None:
    del signum, frame
    _LATCH.set = True
    raise KeyboardInterrupt


@contextlib.contextmanager
def guard() -> Iterator[None]:
    """Run a block so that Ctrl-C inside it ends it with ``KeyboardInterrupt``, even when TVM
    turned the interrupt into another error on the way. A no-op off the main thread (signals
    are only delivered there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    outer = _LATCH.depth == 0
    previous = signal.getsignal(signal.SIGINT) if outer else None
    if outer:
        _LATCH.set = False
        signal.signal(signal.SIGINT, _on_sigint)
    _LATCH.depth += 1
    try:
        yield
    except BaseException:
        if _LATCH.set:
            raise KeyboardInterrupt from None
        raise
    else:
        check()
    finally:
        _LATCH.depth -= 1
        if outer:
            signal.signal(signal.SIGINT, previous)
            _LATCH.set = False
