"""How the native library is compiled, shared by the package build (``setup.py``) and the
build on first use (:func:`plus_tvm.runtime.native.build`).

Standard library only: ``setup.py`` loads this file by its path in pip's build environment,
where neither plus_tvm nor TVM is importable. It finds oneDNN's headers and library and
tvm-ffi's headers and library through the installed distributions' file lists (the
``onednn-devel-cpu-gomp`` / ``onednn-cpu-gomp`` and ``apache-tvm-ffi`` wheels put them in the
environment's ``include`` / ``lib`` folders and in ``tvm_ffi/``).

The library built with the package lies beside the sources as ``plus_native.so``, with
``plus_native.so.manifest.json`` recording what it was built from (:func:`build_info`): the
digest of the sources and flags, the oneDNN and tvm-ffi versions, and the library's own
SHA-256 and size. :func:`packaged_problem` says why such a library must not be loaded here.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

ONEDNN_PACKAGE = "onednn-cpu-gomp"
ONEDNN_HEADERS_PACKAGE = "onednn-devel-cpu-gomp"
FFI_PACKAGE = "apache-tvm-ffi"
LIBRARY = "plus_native.so"  # the library's name, in the package and in the cache
MANIFEST_SUFFIX = ".manifest.json"  # beside each library: ``plus_native.so.manifest.json``


class NativeUnavailableError(Exception):
    """The native kernels cannot be built or loaded here (the message says why)."""


def distribution_dir(package: str, suffix: str) -> Path:
    """The folder holding ``suffix`` (a file's path ending) among ``package``'s installed
    files."""
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        raise NativeUnavailableError(f"the {package} package is not installed") from None
    for f in dist.files or ():
        if str(f).endswith(suffix):
            return Path(dist.locate_file(f)).resolve().parent
    raise NativeUnavailableError(f"the {package} package has no {suffix}")


def onednn_lib() -> Path:
    """The folder of ``libdnnl.so.3`` (the ``onednn-cpu-gomp`` wheel's)."""
    return distribution_dir(ONEDNN_PACKAGE, "libdnnl.so.3")


def find_compiler(cxx: str) -> tuple[str, str]:
    """The path of the C++ compiler ``cxx`` and the first line of its ``--version``."""
    path = shutil.which(cxx)
    if path is None:
        raise NativeUnavailableError(f"no C++ compiler ({cxx}) on PATH")
    version = subprocess.run(
        [path, "--version"], capture_output=True, text=True, check=False
    ).stdout.splitlines()[:1]
    return path, version[0] if version else ""


def toolchain(cxx: str) -> dict[str, str]:
    """Compiler, include and library folders, and what identifies them."""
    compiler, compiler_version = find_compiler(cxx)
    ffi_include = distribution_dir(FFI_PACKAGE, "tvm/ffi/c_api.h").parent.parent
    return {
        "compiler": compiler,
        "compiler_version": compiler_version,
        "onednn_include": str(
            distribution_dir(ONEDNN_HEADERS_PACKAGE, "oneapi/dnnl/dnnl.hpp").parent.parent
        ),
        "onednn_lib": str(onednn_lib()),
        "onednn_version": importlib.metadata.version(ONEDNN_PACKAGE),
        "ffi_include": str(ffi_include),
        "dlpack_include": str(distribution_dir(FFI_PACKAGE, "include/dlpack/dlpack.h").parent),
        "ffi_lib": str(distribution_dir(FFI_PACKAGE, "libtvm_ffi.so")),
        "ffi_version": importlib.metadata.version(FFI_PACKAGE),
    }


def sources_digest(source_dir: Path, sources: Sequence[str], flags: Sequence[str]) -> str:
    """SHA-256 (hex) of the compile flags and the sources' names and contents."""
    digest = hashlib.sha256(json.dumps(list(flags)).encode())
    for name in sources:
        digest.update(name.encode() + b"\0")
        digest.update((source_dir / name).read_bytes())
    return digest.hexdigest()


def command(
    tools: dict[str, str],
    source_dir: Path,
    sources: Sequence[str],
    flags: Sequence[str],
    rpaths: Sequence[str] = (),
) -> list[str]:
    """The compile-and-link command (without ``-o``): the ``.cc`` files of ``sources`` against
    oneDNN and tvm-ffi, with ``rpaths`` searched for their libraries first, then the folders
    they were found in at build time. (tvm-ffi's library is loaded by ``import tvm_ffi``
    before this one and found by its soname; :func:`plus_tvm.runtime.native.ensure` loads
    oneDNN's from its installed package first too.)"""
    return [
        tools["compiler"],
        *flags,
        *[str(source_dir / name) for name in sources if name.endswith(".cc")],
        f"-I{tools['onednn_include']}",
        f"-I{tools['ffi_include']}",
        f"-I{tools['dlpack_include']}",
        f"-L{tools['ffi_lib']}",
        "-ltvm_ffi",
        f"-L{tools['onednn_lib']}",
        "-l:libdnnl.so.3",
        *[f"-Wl,-rpath,{path}" for path in (*rpaths, tools["onednn_lib"], tools["ffi_lib"])],
    ]


def sha256_file(path: Path) -> tuple[str, int]:
    """The SHA-256 (hex) and size of the file ``path``."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
        return digest.hexdigest(), f.tell()


def manifest_path(library: Path) -> Path:
    """Where what ``library`` was built from is recorded."""
    return library.with_name(library.name + MANIFEST_SUFFIX)


def build_library(
    library: Path,
    tools: dict[str, str],
    source_dir: Path,
    sources: Sequence[str],
    flags: Sequence[str],
    rpaths: Sequence[str] = (),
) -> None:
    """Compile the package's library to ``library`` and write its manifest (the library is
    compiled beside it and renamed into place: a process loading the old one keeps it).

    Raises
    ------
    NativeUnavailableError
        The compiler could not start or failed (with the end of its output).
    """
    partial = library.with_name(f"{library.name}.{os.getpid()}.partial")
    # the digest of the sources as they were before the compiler read them: a source changed
    # during the build then makes the manifest disagree with the sources, and the library is
    # rebuilt rather than loaded as what it is not
    read = sources_digest(source_dir, sources, flags)
    full = [*command(tools, source_dir, sources, flags, rpaths), "-o", str(partial)]
    try:
        result = subprocess.run(full, capture_output=True, text=True, check=False)
    except OSError as err:
        raise NativeUnavailableError(f"the compiler failed to start: {err}") from None
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        tail = (result.stdout + result.stderr)[-4000:]
        raise NativeUnavailableError(f"compiling failed ({' '.join(full)}):\n{tail}")
    info = dict(build_info(partial, tools, source_dir, sources, flags), sources=read)
    os.replace(partial, library)
    write_manifest(library, dict(info, file=library.name))


def build_info(
    library: Path, tools: dict[str, str], source_dir: Path, sources: Sequence[str], flags
) -> dict[str, object]:
    """The manifest of a library just built: its digest and size, what it was built from."""
    sha, size = sha256_file(library)
    return {
        "file": library.name,
        "sha256": sha,
        "size": size,
        "sources": sources_digest(source_dir, sources, flags),
        "onednn_version": tools["onednn_version"],
        "ffi_version": tools["ffi_version"],
        "compiler_version": tools["compiler_version"],
    }


def packaged_problem(
    library: Path, source_dir: Path, sources: Sequence[str], flags: Sequence[str]
) -> str | None:
    """Why the library built with the package (``library``) must not be loaded here, or None:
    it must be there, whole (the SHA-256 and size its manifest records), built from these
    sources and flags (an editable install whose sources changed since) and against the
    oneDNN and tvm-ffi versions installed now."""
    if not library.is_file():
        return "the package was installed without it (no C++ compiler or oneDNN at build time)"
    try:
        manifest = json.loads(manifest_path(library).read_text())
    except (OSError, ValueError):  # (UnicodeDecodeError is a ValueError)
        return "its manifest is missing or unreadable"
    if not isinstance(manifest, dict):
        return "its manifest is damaged"
    if manifest.get("sources") != sources_digest(source_dir, sources, flags):
        return "it was built from other sources (changed since the package was built)"
    for key, package in (("onednn_version", ONEDNN_PACKAGE), ("ffi_version", FFI_PACKAGE)):
        try:
            installed = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return f"the {package} package is not installed"
        if manifest.get(key) != installed:
            return f"it was built against {package} {manifest.get(key)}, {installed} is installed"
    sha, size = sha256_file(library)
    if size != manifest.get("size") or sha != manifest.get("sha256"):
        return f"its SHA-256 or size is not the one its manifest records ({size} bytes)"
    return None


def write_manifest(library: Path, info: dict[str, object]) -> None:
    """Write ``library``'s manifest (whole or not at all)."""
    path = manifest_path(library)
    partial = path.with_name(f"{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(info, indent=1, sort_keys=True))
    os.replace(partial, path)
