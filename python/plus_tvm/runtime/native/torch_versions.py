"""Version counters of many torch tensors read in one C++ pass (``torch_versions.cc``).

A :class:`~plus_tvm.compiled_model.CompiledModel` checks before every call whether a torch tensor
it copied a weight from changed in place. In Python that is one ``t._version`` per tensor, about
0.7 us each right after a run (cold objects): 150-250 us a call on MobileNetV2's 314 followed
tensors, 3-5% of its run; the C++ pass takes 35-40 us. The library is compiled once per machine
beside the native kernels (``build_dir()``, keyed by its source, the compiler, torch and
Python), against torch's and Python's headers; without a compiler, with ``PLUS_TVM_NATIVE=0`` or
when the build fails, :func:`reader` returns None and the caller reads the counters in Python.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import sys
import sysconfig
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ... import env
from . import SOURCE_DIR, NativeUnavailableError, compile_library, compiler, enabled

SOURCE = "torch_versions.cc"
FLAGS = ("-O2", "-std=c++17", "-fPIC", "-shared", "-fvisibility=hidden", "-w")


@dataclass
class _Loaded:
    """The loaded function, or why there is none (once per process, like the native kernels)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    function: object | None = None
    reason: str | None = None


_LOADED = _Loaded()


def _command() -> tuple[list[str], str]:
    """The compile command (without its output) and the key naming its build folder."""
    import torch

    cxx, version = compiler()
    torch_dir = Path(torch.__file__).resolve().parent
    include, lib = torch_dir / "include", torch_dir / "lib"
    if not (include / "torch" / "csrc" / "autograd" / "python_variable.h").exists():
        raise NativeUnavailableError(f"torch's C++ headers are not under {include}")
    command = [
        cxx,
        *FLAGS,
        str(SOURCE_DIR / SOURCE),
        f"-I{include}",
        f"-I{include / 'torch' / 'csrc' / 'api' / 'include'}",
        f"-I{sysconfig.get_paths()['include']}",
        f"-L{lib}",
        "-lc10",
        f"-Wl,-rpath,{lib}",
    ]
    identity = [command, version, torch.__version__, sys.version]
    digest = hashlib.sha256(json.dumps(identity).encode())
    digest.update((SOURCE_DIR / SOURCE).read_bytes())
    return command, "versions-" + digest.hexdigest()[:16]


def _function() -> object | None:
    """``plus_first_changed`` from the library, built first where needed; None when unavailable."""
    with _LOADED.lock:
        if _LOADED.function is not None or _LOADED.reason is not None:
            return _LOADED.function
        if not enabled():
            _LOADED.reason = f"{env.NATIVE}=0"
            return None
        try:
            command, key = _command()
            path = compile_library(key, "torch_versions.so", command)
            function = ctypes.PyDLL(path).plus_first_changed
        except (NativeUnavailableError, OSError, AttributeError) as err:
            _LOADED.reason = str(err)
            return None
        function.argtypes = [ctypes.py_object, ctypes.c_void_p]
        function.restype = ctypes.c_int64
        _LOADED.function = function
        return function


def unavailable_reason() -> str | None:
    """Why :func:`reader` returns None (None while it has not been asked, or it works)."""
    return _LOADED.reason


class VersionReader:
    """The version counters of a fixed list of torch tensors against the ones last seen."""

    def __init__(self, tensors: list, versions: list[int], function: object) -> None:
        self._tensors = list(tensors)  # (the C++ side reads a list, never another sequence)
        self._seen = np.array(versions, dtype=np.uint64)
        self._address = self._seen.ctypes.data
        self._function = function

    def first_changed(self) -> int:
        """The position of the first tensor whose counter moved since it was seen, or -1."""
        return int(self._function(self._tensors, self._address))

    def seen(self, index: int, version: int) -> None:
        self._seen[index] = version


def reader(tensors: list, versions: list[int]) -> VersionReader | None:
    """A :class:`VersionReader` over ``tensors`` (each a ``torch.Tensor``) last seen at
    ``versions``, or None where the library is unavailable (read them in Python)."""
    import torch

    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return None  # the C++ side would read any object as a tensor
    function = _function()
    return VersionReader(tensors, versions, function) if function is not None else None
