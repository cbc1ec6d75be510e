"""Where plus_tvm keeps what it measures or builds once per machine (no TVM import: the runtime
uses it too)."""

from __future__ import annotations

import os

CACHE_DIR_ENV = "PLUS_TVM_CACHE_DIR"


def cache_dir() -> str:
    """``$PLUS_TVM_CACHE_DIR``, else ``$XDG_CACHE_HOME/plus_tvm`` (``~/.cache/plus_tvm``)."""
    return os.environ.get(CACHE_DIR_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "plus_tvm"
    )
