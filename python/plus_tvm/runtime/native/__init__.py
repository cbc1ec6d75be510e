"""Native library kernels: C++ on oneDNN, called by TVM's VM without entering Python.

A library call through Python costs the VM -> Python crossing, the DLPack views and torch's own
dispatch (about 10 us), and torch's convolutions cannot write into the VM's output buffer (a
copy per call, up to twice the kernel's time on large activations). The kernels here are the
fast paths of Python kernels of the same name (``plus.conv2d``, ``plus.linear``,
``plus.linear_layernorm``, ``plus.attention``): the VM calls the C++ function
directly, it runs oneDNN primitives created once per shape on weights packed once, writing the
output buffer in place, and it hands every call it does not support (another layout, dtype or
device, an unknown config key) to the Python kernel it was created with. Results are the same
either way (tested); only the speed differs.

The C++ sources ship with the package and are compiled once per machine into
``<build_dir>/<key>/`` (``$PLUS_TVM_NATIVE_CACHE``, else ``<cache>/native`` with
``plus_tvm.paths.cache_dir``; ``key`` hashes the sources, the
compiler, and the oneDNN and tvm-ffi versions) with ``$CXX`` (default ``c++``), against oneDNN
from the ``onednn-cpu-gomp`` / ``onednn-devel-cpu-gomp`` packages and tvm-ffi's headers.
Without a compiler or oneDNN the Python kernels run, and :func:`status` says why.
``PLUS_TVM_NATIVE=0`` keeps the Python kernels (for comparisons).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ...paths import cache_dir

SOURCE_DIR = Path(__file__).resolve().parent
SOURCES = (
    "onednn_common.h",
    "onednn_attention.cc",
    "onednn_conv2d.cc",
    "onednn_linear.cc",
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
ONEDNN_PACKAGE = "onednn-cpu-gomp"
ONEDNN_HEADERS_PACKAGE = "onednn-devel-cpu-gomp"
ENABLE_ENV = "PLUS_TVM_NATIVE"
BUILD_DIR_ENV = "PLUS_TVM_NATIVE_CACHE"
# kernel name -> prefix of its exported functions (``<prefix>_create(fallback)`` etc.)
KERNELS = {
    "plus.attention": "attention",
    "plus.conv2d": "conv2d",
    "plus.linear": "linear",
    "plus.linear_layernorm": "linear_layernorm",
}


def runs_natively(kernel: str, config: dict[str, object]) -> bool:
    """Whether a CPU call of ``kernel`` with ``config`` (the binder's dict) is one the native
    kernels run (fp32 aside, which they check per call): the dispatcher's cost model prices its
    crossing accordingly. Kept next to the C++ that decides the same (``cfg.native``)."""
    if config.get("prepack", True) is False:
        return False
    if kernel == "plus.conv2d":
        return config.get("layout") == "nhwc"
    if kernel == "plus.linear":
        return int(config.get("parts", 1)) == 1
    return kernel in ("plus.linear_layernorm", "plus.attention")


class NativeUnavailableError(Exception):
    """The native kernels cannot be built or loaded here (the message says why)."""


@dataclass
class _State:
    """What this process knows of the native library (one per process, like the kernels)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    module: object | None = None
    installed: dict[str, object] = field(default_factory=dict)
    reason: str | None = None  # why it is unavailable, once known
    path: str | None = None
    use_openmp: object | None = None  # parallel_use_openmp, once the launch is installed


_STATE = _State()


def build_dir() -> str:
    """Where compiled native libraries are kept: ``$PLUS_TVM_NATIVE_CACHE``, else
    ``<plus_tvm cache>/native`` (a build artifact, apart from measured figures)."""
    return os.environ.get(BUILD_DIR_ENV) or os.path.join(cache_dir(), "native")


def enabled() -> bool:
    """Whether native kernels may be used (``PLUS_TVM_NATIVE`` is not 0/false/off)."""
    return os.environ.get(ENABLE_ENV, "1").strip().lower() not in ("0", "false", "off", "no")


def _distribution_dir(package: str, suffix: str) -> Path:
    """The folder holding ``suffix`` (a file name) among ``package``'s installed files."""
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        raise NativeUnavailableError(f"the {package} package is not installed") from None
    for f in dist.files or ():
        if str(f).endswith(suffix):
            return Path(dist.locate_file(f)).resolve().parent
    raise NativeUnavailableError(f"the {package} package has no {suffix}")


def compiler() -> tuple[str, str]:
    """The C++ compiler (``$CXX``, default ``c++``) and the first line of its ``--version``."""
    path = shutil.which(os.environ.get("CXX", "c++"))
    if path is None:
        raise NativeUnavailableError(f"no C++ compiler ({os.environ.get('CXX', 'c++')}) on PATH")
    version = subprocess.run(
        [path, "--version"], capture_output=True, text=True, check=False
    ).stdout.splitlines()[:1]
    return path, version[0] if version else ""


def _toolchain() -> dict[str, str]:
    """Compiler, include and library folders, and what identifies them (for the cache key)."""
    import tvm_ffi.libinfo

    cxx, cxx_version = compiler()
    lib = _distribution_dir(ONEDNN_PACKAGE, "libdnnl.so.3")
    include = _distribution_dir(ONEDNN_HEADERS_PACKAGE, "oneapi/dnnl/dnnl.hpp").parent.parent
    ffi_lib = Path(tvm_ffi.libinfo.find_libtvm_ffi()).resolve()
    return {
        "compiler": cxx,
        "compiler_version": cxx_version,
        "onednn_include": str(include),
        "onednn_lib": str(lib),
        "onednn_version": importlib.metadata.version(ONEDNN_PACKAGE),
        "ffi_include": tvm_ffi.libinfo.find_include_path(),
        "dlpack_include": tvm_ffi.libinfo.find_dlpack_include_path(),
        "ffi_lib": str(ffi_lib),
        "ffi_version": importlib.metadata.version("apache-tvm-ffi"),
    }


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
    return compile_library(
        Path(build_dir()) / _key(tools),
        "plus_native.so",
        [
            tools["compiler"],
            *COMPILE_FLAGS,
            *[str(SOURCE_DIR / name) for name in SOURCES if name.endswith(".cc")],
            f"-I{tools['onednn_include']}",
            f"-I{tools['ffi_include']}",
            f"-I{tools['dlpack_include']}",
            f"-L{Path(tools['ffi_lib']).parent}",
            "-ltvm_ffi",
            f"-L{tools['onednn_lib']}",
            "-l:libdnnl.so.3",
            f"-Wl,-rpath,{tools['onednn_lib']}",
            f"-Wl,-rpath,{Path(tools['ffi_lib']).parent}",
        ],
    )


def compile_library(folder: Path, name: str, command: list[str]) -> str:
    """``folder/name``, compiled first with ``command`` (``-o`` and the output are appended)
    unless it exists; processes building at once build once. Raises
    :class:`NativeUnavailableError` naming the log when the compiler fails."""
    library = folder / name
    if library.exists():
        return str(library)
    folder.mkdir(parents=True, exist_ok=True)
    with _file_lock(folder / "build.lock"):
        if library.exists():  # another process built it while we waited
            return str(library)
        partial = folder / f"{library.stem}.{os.getpid()}{library.suffix}"
        full = [*command, "-o", str(partial)]
        result = subprocess.run(full, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            log = folder / "build.log"
            log.write_text(" ".join(full) + "\n\n" + result.stdout + result.stderr)
            raise NativeUnavailableError(f"compiling {name} failed (see {log})")
        os.replace(partial, library)
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
        try:
            _STATE.path = build()
            _install(kernels)
        except NativeUnavailableError as err:
            _STATE.reason = str(err)
            return False
        return True


def _install(kernels: dict[str, object]) -> None:
    import tvm_ffi

    try:
        module = tvm_ffi.load_module(_STATE.path)
    except (OSError, RuntimeError) as err:
        raise NativeUnavailableError(f"loading {_STATE.path} failed: {err}") from None
    for name, prefix in KERNELS.items():
        native = module[f"{prefix}_create"](kernels[name])
        tvm_ffi.register_global_func(name, native, override=True)
        _STATE.installed[name] = native
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


def _each(suffix: str, *args: object) -> dict[str, object]:
    module = _STATE.module
    if module is None:
        return {}
    return {name: module[f"{prefix}_{suffix}"](*args) for name, prefix in KERNELS.items()}


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
        return {"available": False, "reason": f"{ENABLE_ENV}=0"}
    if _STATE.module is None:
        return {"available": False, "reason": _STATE.reason or "not loaded yet"}
    stats = {name: json.loads(str(text)) for name, text in _each("stats").items()}
    out = {"available": True, "library": _STATE.path, "kernels": stats}
    if openmp_parallel_available():
        out["openmp_launches"] = openmp_launches()
    return out
