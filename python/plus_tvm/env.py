"""Every environment variable plus_tvm reads, defined once, and the only module that reads them.

:data:`VARIABLES` is the table (name, meaning, default) the docs list; each variable's name is
a constant here, and a typed accessor below returns its value (parsed, with its default). Every
other module reads the environment through these accessors. (``plus_tvm.threads`` also *writes*
TVM's pool variables into the environment before TVM's pool starts: TVM reads them itself.)

Values are read when asked, never cached: a test (or a user) that sets a variable sees it on
the next call. No TVM or torch import: the runtime-only path (``plus_tvm.load``) uses this too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .errors import EnvVarError

CACHE_DIR = "PLUS_TVM_CACHE_DIR"
XDG_CACHE_HOME = "XDG_CACHE_HOME"
NATIVE = "PLUS_TVM_NATIVE"
NATIVE_CACHE = "PLUS_TVM_NATIVE_CACHE"
MEASURE_LIBRARY = "PLUS_TVM_MEASURE_LIBRARY"
WAREHOUSE = "PLUS_TVM_WAREHOUSE"
PREPACK_MB = "PLUS_TVM_PREPACK_MB"
CXX = "CXX"
TVM_CUDA_COMPILE_MODE = "TVM_CUDA_COMPILE_MODE"
TVM_BIND_THREADS = "TVM_BIND_THREADS"
TVM_NUM_THREADS = "TVM_NUM_THREADS"
TVM_THREAD_POOL_SPIN_COUNT = "TVM_THREAD_POOL_SPIN_COUNT"
OMP_NUM_THREADS = "OMP_NUM_THREADS"


@dataclass(frozen=True)
class Variable:
    """One environment variable: its name, what it means, its default (as documented)."""

    name: str
    meaning: str
    default: str


#: The table of every variable plus_tvm reads (or sets for TVM), in the order the docs list them.
VARIABLES: tuple[Variable, ...] = (
    Variable(
        CACHE_DIR,
        "The one cache root: native kernel builds, CUDA-graph decisions, measured GIR figures, "
        "calibrated cost models, the ONNX node-test cache. Created private (mode 0700); a root "
        "or sub-folder owned by another user or writable by group/others is refused",
        "`$XDG_CACHE_HOME/plus_tvm`",
    ),
    Variable(XDG_CACHE_HOME, "The base of the default cache root", "`~/.cache`"),
    Variable(
        NATIVE_CACHE,
        "Where the native kernels (`plus_native.so`, `torch_versions.so`) are built, instead "
        "of `<cache root>/native` (the tests share one build this way); kept private too",
        "`<cache root>/native`",
    ),
    Variable(
        NATIVE,
        "`0` / `false` / `off` / `no`: never build or load the native kernels (the Python "
        "kernels run); `cache`: never load the library built with the package, only the one "
        "built on this machine on first use",
        "`1`",
    ),
    Variable(
        MEASURE_LIBRARY,
        "`1`: the dispatch cost model measures the library GEMMs' throughput once per process "
        "instead of using the documented constants",
        "`0`",
    ),
    Variable(
        WAREHOUSE,
        "More pattern-warehouse folders (`os.pathsep`-separated), read once per compilation "
        "into `Options.warehouse_env`",
        "(none)",
    ),
    Variable(
        PREPACK_MB,
        "Budget in MiB of the weights the library kernels keep prepacked (least recently used "
        "dropped first)",
        "`4096`",
    ),
    Variable(CXX, "The C++ compiler that builds the native kernels", "`c++`"),
    Variable(
        TVM_CUDA_COMPILE_MODE,
        "How a loaded CUDA module's source is compiled for the GPU at load (`nvrtc` or `nvcc`), "
        "as TVM's own hook reads it",
        "`nvrtc`",
    ),
    Variable(
        TVM_BIND_THREADS,
        "TVM's: pin threads to cores. plus_tvm sets `0` at import where unset (TVM's pool would "
        "pin the calling thread, and every thread it creates, to one core)",
        "`0` (set by plus_tvm)",
    ),
    Variable(
        TVM_NUM_THREADS,
        "TVM's pool size; plus_tvm sets the physical cores of the process's affinity where "
        "unset, and sizes its plans by it",
        "physical cores (set by plus_tvm)",
    ),
    Variable(
        TVM_THREAD_POOL_SPIN_COUNT,
        "TVM's: how long an idle worker spins. plus_tvm sets `0` where unset (a spinning worker "
        "steals a core from the library kernels that run next)",
        "`0` (set by plus_tvm)",
    ),
    Variable(
        OMP_NUM_THREADS,
        "OpenMP's team size; the thread count when `TVM_NUM_THREADS` is unset, as TVM sizes its "
        "pool",
        "(unset)",
    ),
)

_NAMES = frozenset(v.name for v in VARIABLES)
_OFF = ("0", "false", "off", "no")


def raw(name: str) -> str | None:
    """The variable's text as set (None when unset); ``name`` must be one of :data:`VARIABLES`
    (a name read nowhere else has no meaning documented)."""
    if name not in _NAMES:
        raise KeyError(f"{name} is not an environment variable plus_tvm documents")
    return os.environ.get(name)


def _text(name: str) -> str:
    return (raw(name) or "").strip()


def markdown_table() -> str:
    """:data:`VARIABLES` as a markdown table (for the docs)."""
    rows = ["| variable | meaning | default |", "| --- | --- | --- |"]
    rows += [f"| `{v.name}` | {v.meaning} | {v.default} |" for v in VARIABLES]
    return "\n".join(rows)


def child_environment() -> dict[str, str]:
    """A copy of this process's environment, for a child process to start with."""
    return dict(os.environ)


# ------------------------------------------------------------------------------ accessors
def cache_dir() -> str:
    """``$PLUS_TVM_CACHE_DIR``, else ``$XDG_CACHE_HOME/plus_tvm`` (``~/.cache/plus_tvm``)."""
    base = _text(XDG_CACHE_HOME) or os.path.join(os.path.expanduser("~"), ".cache")
    return _text(CACHE_DIR) or os.path.join(base, "plus_tvm")


def native_cache() -> str | None:
    """``$PLUS_TVM_NATIVE_CACHE`` (None: ``<cache root>/native``)."""
    return _text(NATIVE_CACHE) or None


def native_enabled() -> bool:
    """Whether native kernels may be used (``PLUS_TVM_NATIVE`` is not 0/false/off/no)."""
    return _text(NATIVE).lower() not in _OFF


def native_cache_only() -> bool:
    """``PLUS_TVM_NATIVE=cache``: the library built on first use, never the package's."""
    return _text(NATIVE).lower() == "cache"


def measure_library() -> bool:
    """``PLUS_TVM_MEASURE_LIBRARY=1``."""
    return _text(MEASURE_LIBRARY) == "1"


def warehouse_folders() -> tuple[str, ...]:
    """The folders ``$PLUS_TVM_WAREHOUSE`` names now (``os.pathsep``-separated)."""
    return tuple(d.strip() for d in (raw(WAREHOUSE) or "").split(os.pathsep) if d.strip())


PREPACK_MB_DEFAULT = 4096.0


def prepack_budget_mb() -> float:
    """``$PLUS_TVM_PREPACK_MB`` (default 4096); :class:`EnvVarError` when it is no number."""
    value = _text(PREPACK_MB)
    if not value:
        return PREPACK_MB_DEFAULT
    try:
        mb = float(value)
    except ValueError:
        mb = -1.0
    if not mb >= 0:  # (also NaN)
        raise EnvVarError(f"{PREPACK_MB}={value!r}: expected a number of MiB (>= 0)")
    return mb


def cxx() -> str:
    """The C++ compiler command: ``$CXX``, default ``c++``."""
    return _text(CXX) or "c++"


def cuda_compile_mode() -> str:
    """``$TVM_CUDA_COMPILE_MODE`` lower-cased, default ``nvrtc``."""
    return (_text(TVM_CUDA_COMPILE_MODE) or "nvrtc").lower()


def thread_count() -> int | None:
    """``TVM_NUM_THREADS``, else ``OMP_NUM_THREADS``, when set to a positive integer (as TVM
    sizes its pool); None otherwise."""
    for name in (TVM_NUM_THREADS, OMP_NUM_THREADS):
        value = _text(name)
        if value.isdigit() and int(value) > 0:
            return int(value)
    return None
