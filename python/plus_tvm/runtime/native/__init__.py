"""Native library kernels: C++ on oneDNN, called by TVM's VM without entering Python.

A library call through Python costs the VM -> Python crossing, the DLPack views and torch's own
dispatch (about 10 us), and torch's convolutions cannot write into the VM's output buffer (a
copy per call, up to twice the kernel's time on large activations). The kernels here are the
fast paths of the Python kernels of the same name that declare ``native_dtypes``
(``plus.conv2d``, ``plus.linear``, ``plus.linear_layernorm``, ``plus.attention``; the kernel's
module holds its contract, :func:`native_kernels`): the VM calls the C++ function
directly, it runs oneDNN primitives created once per shape on weights packed once, writing the
output buffer in place, and it hands every call it does not support (another layout, dtype or
device, an unknown config key) to the Python kernel it was created with. Results are the same
either way (tested); only the speed differs.

The library is compiled when the package is installed (``setup.py``: ``plus_native.so`` beside
these sources, with a manifest of what it was built from, ``_build.py``), so that a deployed
model needs neither a compiler nor torch. It is used when it is whole and was built from these
sources against the oneDNN and tvm-ffi installed now (:func:`packaged`); otherwise (installed
without a compiler, sources edited since an editable install, other versions) the C++ sources
are compiled once per machine into ``<build_dir>/<key>/`` (``$PLUS_TVM_NATIVE_CACHE``, else
``<cache root>/native``, see :mod:`plus_tvm.paths`; ``key`` hashes the sources, the compiler,
and the oneDNN and tvm-ffi versions) with ``$CXX`` (default ``c++``), against oneDNN from the
``onednn-cpu-gomp`` / ``onednn-devel-cpu-gomp`` packages and tvm-ffi's headers. Without either
the Python kernels run, and :func:`status` says why. ``PLUS_TVM_NATIVE=0`` keeps the Python
kernels (for comparisons), ``PLUS_TVM_NATIVE=cache`` ignores the package's library.

The package's library is checked against its manifest (SHA-256 and size) before it is loaded,
against accidents (a truncated or half-copied install); it is trusted as the package's Python
code is (whoever can write the package's folder can change that code too), so its folder is
not required to be private as the cache's is.

A library in the cache is loaded only as it was built (:func:`compile_library`): its SHA-256 is
recorded in a manifest beside it when it is built, and checked before it is loaded; a library
without a manifest, with another digest, or truncated is rebuilt, never loaded (a
:class:`NativeCacheWarning` names it). The build folders are private (mode 0700, owned by the
user: :func:`plus_tvm.paths.private_dir`): the manifest sits in the same folder, so it protects
against accidents (a half-written or truncated file, a crash mid-build) and, only because no one
else can write that folder, against a library planted by another user.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import subprocess
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ... import env
from ...paths import check_private, private_dir, read_private, write_json
from ..cpu_features import cpu_dtypes
from . import _build
from ._build import MANIFEST_SUFFIX, NativeUnavailableError

SOURCE_DIR = Path(__file__).resolve().parent
SOURCES = (
    "onednn_common.h",
    "onednn_attention.cc",
    "onednn_conv2d.cc",
    "onednn_linear.cc",
    "gemv.cc",
    "gemv.h",
    "linear_config.h",
    "index_check.cc",
    "nan_guard.cc",
    "nan_guard.h",
    "parallel_launch.cc",
    "silu_pass.h",
    "winograd.h",
)
# -O3: the Winograd transforms (winograd.h) vectorize only with it (measured 1.5-2x slower at
# -O2); -fopenmp: parallel_launch.cc, nan_guard.h, silu_pass.h and winograd.h (libgomp, the
# OpenMP runtime oneDNN and torch use)
COMPILE_FLAGS = ("-O3", "-std=c++17", "-fPIC", "-shared", "-fvisibility=hidden", "-fopenmp")


def prefix(kernel: str) -> str:
    """The prefix of the exported functions of ``kernel``'s native form
    (``<prefix>_create(fallback, dtypes)`` etc.): its name without ``plus.``."""
    return kernel.removeprefix("plus.")


def native_kernels(kernels: dict[str, object]) -> dict[str, object]:
    """The Python ``kernels`` (name -> kernel) that have a native form: those declaring
    ``native_dtypes`` (the kernel's module is the one place that says so)."""
    return {name: k for name, k in kernels.items() if getattr(k, "native_dtypes", ())}


def native_dtypes(kernel: object) -> tuple[str, ...]:
    """The dtypes the native form of a Python ``kernel`` runs here: those its C++ computes
    (the kernel's ``native_dtypes``, the one list of them) that this CPU computes natively.
    The C++ kernel gets them when it is created and checks every call against them."""
    return tuple(d for d in getattr(kernel, "native_dtypes", ()) if d in cpu_dtypes())


def runs_natively(kernel: str, config: dict[str, object], dtype: str = "float32") -> bool:
    """Whether a CPU call of ``kernel`` with ``config`` (the binder's dict) on ``dtype``
    tensors is one the native kernels run: the dispatcher's cost model prices its crossing
    accordingly. The kernel says which configs (``LibraryKernel.native_config``, what the C++
    decides as ``cfg.native``) and dtypes (:func:`native_dtypes`, checked per call)."""
    from .. import KERNELS

    python = KERNELS.get(kernel)
    if python is None or dtype not in native_dtypes(python):
        return False
    return bool(python.native_config(python.spec.parse(python.spec.format(config))))


class NativeCacheWarning(UserWarning):
    """A compiled library in the cache was not the one built there (no manifest, another
    digest, truncated): it is not loaded, and is rebuilt."""


@dataclass
class _State:
    """What this process knows of the native library (one per process, like the kernels)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    module: object | None = None
    installed: dict[str, object] = field(default_factory=dict)
    reason: str | None = None  # why it is unavailable, once known
    path: str | None = None
    origin: str | None = None  # "package" (built with it) or "cache" (built on first use)
    load_s: float | None = None  # seconds ensure() took: loading, or building and loading
    use_openmp: object | None = None  # parallel_use_openmp, once the launch is installed


_STATE = _State()


def build_dir() -> str:
    """Where compiled native libraries are kept: ``$PLUS_TVM_NATIVE_CACHE``, else
    ``<cache root>/native`` (a build artifact, apart from measured figures). Not created here:
    :func:`build_folder` creates (privately) and checks the folders it uses."""
    return env.native_cache() or os.path.join(env.cache_dir(), "native")


def build_folder(key: str) -> Path:
    """``<build_dir>/<key>``, created private where missing and checked
    (:func:`plus_tvm.paths.private_dir`; :class:`~plus_tvm.errors.UnsafeCacheError` when
    another user could write it)."""
    return private_dir(key, root=build_dir())


def enabled() -> bool:
    """Whether native kernels may be used (``PLUS_TVM_NATIVE`` is not 0/false/off/no)."""
    return env.native_enabled()


def compiler() -> tuple[str, str]:
    """The C++ compiler (``$CXX``, default ``c++``) and the first line of its ``--version``."""
    return _build.find_compiler(env.cxx())


def _toolchain() -> dict[str, str]:
    """Compiler, include and library folders, and what identifies them (for the cache key)."""
    return _build.toolchain(env.cxx())


def _key(tools: dict[str, str]) -> str:
    digest = hashlib.sha256(json.dumps([tools, COMPILE_FLAGS], sort_keys=True).encode())
    for name in SOURCES:
        digest.update((SOURCE_DIR / name).read_bytes())
    return digest.hexdigest()[:16]


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Holds an exclusive lock on ``path`` (processes building at once build once)."""
    import fcntl

    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build() -> str:
    """The path of the compiled native library, compiling it first if this machine has not.

    Raises
    ------
    NativeUnavailableError
        No compiler, no oneDNN, or the compilation failed (the message names the log).
    """
    tools = _toolchain()
    command = _build.command(tools, SOURCE_DIR, SOURCES, COMPILE_FLAGS)
    return compile_library(_key(tools), _build.LIBRARY, command)


def packaged() -> str:
    """The path of the library built with the package (``setup.py``), checked against its
    manifest: whole, built from these sources and flags, against the installed oneDNN and
    tvm-ffi (:func:`plus_tvm.runtime.native._build.packaged_problem`).

    Raises
    ------
    NativeUnavailableError
        Saying why it cannot be used.
    """
    library = SOURCE_DIR / _build.LIBRARY
    problem = _build.packaged_problem(library, SOURCE_DIR, SOURCES, COMPILE_FLAGS)
    if problem is not None:
        raise NativeUnavailableError(f"the package's {library.name}: {problem}")
    return str(library)


def _library() -> tuple[str, str]:
    """The library to load and where it came from: the package's, else the cache's (built
    first where needed); the error names why neither can be had."""
    if env.native_cache_only():
        return build(), "cache"
    try:
        return packaged(), "package"
    except NativeUnavailableError as err:
        why = str(err)
    try:
        return build(), "cache"
    except NativeUnavailableError as err:
        raise NativeUnavailableError(f"{err}; {why}") from None


def _sha256(path: Path) -> tuple[str, int]:
    """The SHA-256 (hex) and size of the file ``path`` (checked private while open)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        check_private(path, os.fstat(f.fileno()))
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
        return digest.hexdigest(), f.tell()


def manifest_path(library: Path) -> Path:
    """Where the digest of ``library`` is recorded when it is built."""
    return library.with_name(library.name + MANIFEST_SUFFIX)


def library_problem(library: Path) -> str | None:
    """Why ``library`` must not be loaded (None: it is the file built there, as its manifest
    records). Reads the whole file; a library or manifest that another user could have
    written raises :class:`~plus_tvm.errors.UnsafeCacheError`."""
    if not library.exists():
        return "missing"
    try:
        raw = read_private(manifest_path(library))
    except IsADirectoryError:
        raw = b""
    if raw is None:
        return "no manifest records its digest"
    try:
        manifest = json.loads(raw)
    except ValueError:  # (UnicodeDecodeError is a ValueError)
        manifest = None
    sha = manifest.get("sha256") if isinstance(manifest, dict) else None
    size = manifest.get("size") if isinstance(manifest, dict) else None
    if not isinstance(sha, str) or not isinstance(size, int):
        return "its manifest is damaged"
    actual, actual_size = _sha256(library)
    if actual_size < size:
        return f"truncated ({actual_size} of {size} bytes)"
    if actual != sha:
        return f"its SHA-256 {actual[:16]}... is not the {sha[:16]}... its manifest records"
    return None


def compile_library(key: str, name: str, command: list[str]) -> str:
    """``<build_dir>/<key>/<name>``, compiled first with ``command`` (``-o`` and the output
    are appended) unless it is there as it was built: its digest is checked against the
    manifest written beside it when it was built (:func:`library_problem`); any other file is
    removed and rebuilt, with a :class:`NativeCacheWarning` naming it. Processes building at
    once build once.

    Raises
    ------
    NativeUnavailableError
        The compiler failed (the message names the log).
    UnsafeCacheError
        The build folder, the library or its manifest could have been written by another user.
    """
    folder = build_folder(key)
    library = folder / name
    if library_problem(library) is None:
        return str(library)
    with _file_lock(folder / "build.lock"):
        problem = library_problem(library)  # another process may have built it meanwhile
        if problem is None:
            return str(library)
        if problem != "missing":
            warnings.warn(
                f"{library}: {problem}; not loaded, rebuilt", NativeCacheWarning, stacklevel=2
            )
            library.unlink()  # (a process that mapped it keeps its inode: never truncated)
        partial = folder / f"{library.stem}.{os.getpid()}{library.suffix}"
        full = [*command, "-o", str(partial)]
        try:
            result = subprocess.run(full, capture_output=True, text=True, check=False)
        except OSError as err:  # the compiler went away since it was found
            raise NativeUnavailableError(f"compiling {name} failed: {err}") from None
        if result.returncode != 0:
            partial.unlink(missing_ok=True)
            log = folder / "build.log"
            log.write_text(" ".join(full) + "\n\n" + result.stdout + result.stderr)
            raise NativeUnavailableError(f"compiling {name} failed (see {log})")
        os.chmod(partial, 0o700)  # the compiler's mode follows the umask: may be group-writable
        sha, size = _sha256(partial)
        os.replace(partial, library)
        write_json(manifest_path(library), {"file": name, "sha256": sha, "size": size})
    return str(library)


def ensure(kernels: dict[str, object]) -> bool:
    """Build (once per machine) and load the native library, and register its kernels in front
    of the Python ``kernels`` of the same names. Returns whether native kernels are in use.

    Call it before a ``VirtualMachine`` is built: the VM resolves kernel names once, when it is
    constructed. Idempotent and cheap after the first call.
    """
    if not enabled():
        return False
    with _STATE.lock:
        if _STATE.module is not None:
            return True
        if _STATE.reason is not None:
            return False
        start = time.perf_counter()
        try:
            _STATE.path, _STATE.origin = _library()
            _install(kernels)
        except NativeUnavailableError as err:
            _STATE.reason = str(err)
            return False
        finally:
            _STATE.load_s = round(time.perf_counter() - start, 4)
        return True


def _install(kernels: dict[str, object]) -> None:
    import tvm_ffi

    try:
        # oneDNN from its installed package, found then by its soname whatever the library's
        # rpaths say (a wheel built in a build environment that is gone)
        ctypes.CDLL(str(_build.onednn_lib() / "libdnnl.so.3"))
        module = tvm_ffi.load_module(_STATE.path)
    except (OSError, RuntimeError) as err:
        raise NativeUnavailableError(f"loading {_STATE.path} failed: {err}") from None
    for name, kernel in native_kernels(kernels).items():
        native = module[f"{prefix(name)}_create"](kernel, ",".join(native_dtypes(kernel)))
        tvm_ffi.register_global_func(name, native, override=True)
        _STATE.installed[name] = native
    from ..index_check import install_native

    install_native(module)  # plus.check_indices in C++ (the Python check as its fallback)
    if module["parallel_install"]():
        _STATE.use_openmp = module["parallel_use_openmp"]
    _STATE.module = module


def openmp_parallel_available() -> bool:
    """Whether TVM's parallel loops can run on OpenMP's pool here (``parallel_launch.cc``: the
    native library is loaded and routes the launches of TVM modules loaded after it)."""
    return _STATE.use_openmp is not None


def use_openmp(on: bool) -> bool:
    """Route the parallel loops of TVM kernels this thread calls to OpenMP's pool (``on``) or to
    TVM's; returns the previous setting (restore it when done). Without the native library a
    no-op returning False."""
    switch = _STATE.use_openmp
    return bool(switch(on)) if switch is not None else False


@contextlib.contextmanager
def openmp_parallel(on: bool = True) -> Iterator[None]:
    """The TVM kernels this thread calls inside the block launch their parallel loops on
    OpenMP's pool (``on``), or on TVM's."""
    before = use_openmp(on)
    try:
        yield
    finally:
        use_openmp(before)


def openmp_threads() -> int:
    """Threads an OpenMP launch from this thread uses (what torch sets), 0 when unavailable."""
    return int(_STATE.module["parallel_threads"]()) if openmp_parallel_available() else 0


def openmp_launches() -> int:
    """Parallel loops of TVM kernels launched on OpenMP in this process so far."""
    return int(_STATE.module["parallel_launches"]()) if openmp_parallel_available() else 0


def take_invalid_flags() -> int:
    """Clears the x86 invalid-operation flag on this thread and its OpenMP team, which the NaN
    guard of the ReLU / ReLU6 convolutions reads (``nan_guard.h``); returns how many threads had
    it set (0 without the native library). Work that met a NaN leaves it set, and the next
    guarded call then runs twice."""
    return int(_STATE.module["nan_guard_take_flags"]()) if _STATE.module is not None else 0


def installed(name: str) -> object | None:
    """The native function registered for kernel ``name``, if native kernels are in use."""
    return _STATE.installed.get(name)


def function(name: str) -> object | None:
    """The loaded library's exported function ``name`` (e.g. ``gemv_half_function``), or None
    while the library is not loaded. Loading is not started here."""
    module = _STATE.module
    return module[name] if module is not None else None


def parse(kernel: str, config: str) -> tuple[bool, bool] | None:
    """What the C++ parser of ``kernel`` makes of ``config``: (every item understood, the call
    runs natively); None when the native library is not loaded or ``kernel`` has no native
    form. For checking the parsers against the kernel's spec (tests/test_kernel_contract.py)."""
    if _STATE.module is None or kernel not in _STATE.installed:
        return None
    code = int(_STATE.module[f"{prefix(kernel)}_parse"](str(config)))
    return code > 0, code == 2


def _each(suffix: str, *args: object) -> dict[str, object]:
    module = _STATE.module
    if module is None:
        return {}
    return {name: module[f"{prefix(name)}_{suffix}"](*args) for name in _STATE.installed}


def forget(data_ptr: int) -> None:
    """Drop every packed form of the tensor at ``data_ptr`` (a weight being replaced)."""
    _each("forget", int(data_ptr))


def clear() -> None:
    """Drop every packed weight and primitive."""
    _each("clear")


def status() -> dict[str, object]:
    """Whether native kernels are in use, and why not; per kernel its calls, fallbacks to
    Python, primitives and packed weights; the parallel loops of TVM kernels launched on
    OpenMP (``openmp_launches``, absent when the launch is not installed)."""
    if not enabled():
        return {"available": False, "reason": f"{env.NATIVE}=0"}
    if _STATE.module is None:
        return {"available": False, "reason": _STATE.reason or "not loaded yet"}
    stats = {name: json.loads(str(text)) for name, text in _each("stats").items()}
    out = {
        "available": True,
        "library": _STATE.path,
        "origin": _STATE.origin,
        "load_s": _STATE.load_s,
        "kernels": stats,
    }
    if openmp_parallel_available():
        out["openmp_launches"] = openmp_launches()
    return out
