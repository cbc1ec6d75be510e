"""torch, imported when a kernel first uses it: the CPU runtime path runs without it.

A deployed CPU model runs on TVM's runtime and the native kernels (:mod:`.native`, C++ on
oneDNN, no torch); only the Python kernels (the fallbacks of the native ones and the kernels
without a native form) compute with torch. The runtime modules therefore import torch through
this module: ``from ._torch import torch`` gives a stand-in that imports torch on its first
attribute access, so ``import plus_tvm`` and :func:`plus_tvm.load` work where torch is not
installed, and a call that truly needs torch raises a :class:`~plus_tvm.errors.PlusError`
saying so (:func:`require`), not an ``ImportError`` from deep inside a kernel.
"""

from __future__ import annotations

import importlib
import threading
from types import ModuleType

from ..errors import TORCH_NEEDED_MARKER, PlusError


class _Import:
    """The outcome of importing torch, once per process (the lock: two threads import once)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.module: ModuleType | None = None
        self.error: str | None = None

    def get(self) -> ModuleType | None:
        if self.module is None and self.error is None:
            with self.lock:
                if self.module is None and self.error is None:
                    try:
                        self.module = importlib.import_module("torch")
                    except ImportError as err:  # (only the absence of torch is expected)
                        self.error = f"{type(err).__name__}: {err}"
        return self.module


IMPORT = _Import()


def available() -> bool:
    """Whether torch can be imported here (imports it the first time)."""
    return IMPORT.get() is not None


def require(what: str) -> ModuleType:
    """torch, or a :class:`PlusError` naming ``what`` (a kernel, a call) that needs it."""
    module = IMPORT.get()
    if module is None:
        raise PlusError(
            f"{what} {TORCH_NEEDED_MARKER} ({IMPORT.error}). This call runs a Python kernel "
            "computed with torch: install torch (pip install torch) to run it; a CPU model "
            "whose library calls all take the native kernels (plus_tvm.runtime.native) runs "
            "without torch"
        )
    return module


class _Lazy:
    """A stand-in for a module of torch (``torch``, ``torch.nn.functional``): imports it on the
    first attribute access, or raises :func:`require`'s error where torch is absent. An
    attribute read once is kept on the stand-in: later reads cost a plain attribute lookup,
    as on the module itself (a module's functions, dtypes and submodules do not change)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attr: str) -> object:
        module = self._module
        if module is None:
            require(f"plus_tvm's runtime ({self._name}.{attr})")
            module = self._module = importlib.import_module(self._name)
        value = getattr(module, attr)
        setattr(self, attr, value)
        return value

    def __repr__(self) -> str:
        return f"<lazily imported {self._name}>"


torch = _Lazy("torch")
F = _Lazy("torch.nn.functional")  # noqa: N816 (torch's own conventional name)
