"""A long compile shows where it is, on a terminal only (``stderr`` a TTY): one line, rewritten
as passes start, after the first few seconds; cleared when the compile ends. Pipes, logs and
the Python API in notebooks or scripts with redirected output see nothing."""

from __future__ import annotations

import sys
import time

#: seconds a compile runs before its progress line appears (short compiles stay silent)
DELAY_S = 3.0


class CompileProgress:
    """Writes ``[plus_tvm] MODEL: phase P, pass X (N s)`` to stderr as passes start (the
    compiler's pass tracker calls :meth:`update`)."""

    def __init__(self, model: str, stream: object = None) -> None:
        self.model = model
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = time.perf_counter()
        self.shown = False

    def update(self, where: str) -> None:
        """A pass starts at ``where`` (phase and pass, in words)."""
        elapsed = time.perf_counter() - self.start
        if not self.enabled or elapsed < DELAY_S:
            return
        line = f"[plus_tvm] {self.model}: {where} ({elapsed:.0f} s)"
        self.stream.write(f"\r\033[K{line[:160]}")
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        """Clear the line (the compile ended, or failed)."""
        if self.shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.shown = False
