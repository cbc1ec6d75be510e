"""Build step of plus-tvm (the metadata is in pyproject.toml): compiles the native library
kernels (``plus_tvm/runtime/native``: C++ on oneDNN) into the package, so that an installed
plus-tvm runs them without a C++ compiler or torch at run time.

``pip install .``, a wheel and ``pip install -e .`` all build ``plus_native.so`` beside the
sources, with a manifest of what it was built from (``runtime/native/_build.py``); oneDNN's
headers and library come from the ``onednn-devel-cpu-gomp`` / ``onednn-cpu-gomp`` packages and
tvm-ffi's from ``apache-tvm-ffi`` (``[build-system] requires`` puts them in pip's build
environment). Without a C++ compiler (``$CXX``, default ``c++``) or those packages, or when the
compilation fails, the package installs without the library and says so: plus_tvm then
builds it on first use where a compiler is, else runs the Python kernels.
"""

from __future__ import annotations

import ast
import importlib.util
import os
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

NATIVE = Path(__file__).resolve().parent / "python" / "plus_tvm" / "runtime" / "native"
# from <site-packages>/plus_tvm/runtime/native to <prefix>/lib, where the onednn-cpu-gomp
# wheel puts libdnnl.so.3 (a venv, --user, a system prefix)
ONEDNN_RPATH = "$ORIGIN/../../../../.."


def _build_module():
    """``runtime/native/_build.py``, loaded by its path (plus_tvm is not importable here)."""
    spec = importlib.util.spec_from_file_location("plus_native_build", NATIVE / "_build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _constants() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``SOURCES`` and ``COMPILE_FLAGS`` of ``runtime/native/__init__.py`` (read, not
    imported: its imports need TVM), the one list of both."""
    found = {}
    for node in ast.parse((NATIVE / "__init__.py").read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            name = getattr(node.targets[0], "id", None)
            if name in ("SOURCES", "COMPILE_FLAGS"):
                found[name] = tuple(ast.literal_eval(node.value))
    return found["SOURCES"], found["COMPILE_FLAGS"]


class BuildNative(build_ext):
    """Compiles the native library with its own command (oneDNN, tvm-ffi, OpenMP), never
    failing the install: a library that cannot be built is left out with a warning."""

    def get_ext_filename(self, fullname: str) -> str:
        return os.path.join(*fullname.split(".")) + ".so"  # a plain library, not a module

    def build_extension(self, ext: Extension) -> None:
        out = Path(self.get_ext_fullpath(ext.name))
        build = _build_module()
        sources, flags = _constants()
        try:
            tools = build.toolchain(os.environ.get("CXX") or "c++")
        except build.NativeUnavailableError as err:
            self._skip(out, str(err))
            return
        out.parent.mkdir(parents=True, exist_ok=True)
        print(f"plus_tvm: building the native kernels ({tools['compiler']}) into {out}")
        try:
            build.build_library(out, tools, NATIVE, sources, flags, [ONEDNN_RPATH])
        except build.NativeUnavailableError as err:
            self._skip(out, str(err))

    def _skip(self, out: Path, why: str) -> None:
        for stale in (out, _manifest(out)):
            stale.unlink(missing_ok=True)
        self.warn(
            f"plus_tvm: the native kernels are not built with the package ({why}); plus_tvm "
            "builds them on first use where a C++ compiler is, else runs the Python kernels"
        )

    def copy_extensions_to_source(self) -> None:
        """An editable install: the library and its manifest beside the sources (a library
        from an earlier build is removed when this one could not be built)."""
        build_py = self.get_finalized_command("build_py")
        for ext in self.extensions:
            inplace, regular = (Path(p) for p in self._get_inplace_equivalent(build_py, ext))
            for src, dst in ((regular, inplace), (_manifest(regular), _manifest(inplace))):
                if src.exists():
                    self.copy_file(str(src), str(dst), level=self.verbose)
                else:
                    dst.unlink(missing_ok=True)

    def get_outputs(self) -> list[str]:
        outputs = super().get_outputs()
        return [*outputs, *(str(_manifest(Path(p))) for p in outputs if Path(p).exists())]


def _manifest(library: Path) -> Path:
    return library.with_name(library.name + ".manifest.json")


_SOURCES = [f"python/plus_tvm/runtime/native/{name}" for name in _constants()[0]]
setup(
    ext_modules=[
        Extension(
            "plus_tvm.runtime.native.plus_native",
            sources=[s for s in _SOURCES if s.endswith(".cc")],
            depends=[s for s in _SOURCES if not s.endswith(".cc")],
            optional=True,
        )
    ],
    cmdclass={"build_ext": BuildNative},
)
