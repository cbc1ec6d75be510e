"""A CPU model exported here loads and runs in a process where ``import torch`` fails and no C++
compiler is on PATH (issue 37 item 4): the runtime imports nothing from torch, and the native
kernels come built with the package (setup.py), not compiled on first use."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import plus_tvm
import pytest
import torch
from _shared_zoo import module_compiled
from plus_tvm import env
from plus_tvm.runtime import native
from plus_tvm.runtime.native import _build

# placed first on sys.path of the deployed process: torch cannot be imported there
BLOCK_TORCH = '''
import sys

class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"{name} is not installed here")
        return None

sys.meta_path.insert(0, _NoTorch())
'''


class _ConvMlp(torch.nn.Module):
    """Convolutions and linears that take the native kernels (plus.conv2d, plus.linear)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.c2 = torch.nn.Conv2d(16, 16, 3, padding=1)
        self.fc1 = torch.nn.Linear(16 * 8 * 8, 64)
        self.fc2 = torch.nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.c1(x))
        x = torch.relu(self.c2(x)) + x
        return self.fc2(torch.nn.functional.gelu(self.fc1(x.flatten(1))))


def _packaged_problem() -> str | None:
    try:
        native.packaged()
    except native.NativeUnavailableError as err:
        return str(err)
    return None


@pytest.fixture(scope="module")
def package_library() -> str | None:
    """Why the package's native library cannot be used (None: it can). In a working tree whose
    native sources changed since ``pip install -e .``, it is first built again in place, with
    setup.py's own build step (what the install would do), where a compiler is here."""
    problem = _packaged_problem()
    if problem is not None and "other sources" in problem:
        try:
            tools = _build.toolchain(env.cxx())
        except native.NativeUnavailableError:
            return problem
        library = native.SOURCE_DIR / _build.LIBRARY
        _build.build_library(
            library, tools, native.SOURCE_DIR, native.SOURCES, native.COMPILE_FLAGS
        )
        problem = _packaged_problem()
    return problem


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Two CPU models exported, with their inputs and the outputs computed here."""
    folder = tmp_path_factory.mktemp("deploy")
    torch.manual_seed(0)
    model, inputs = _ConvMlp().eval(), (torch.randn(2, 3, 8, 8),)
    models = {"convmlp": (inputs, plus_tvm.compile(model, example_args=inputs))}
    # zoo.load("bert-base-tiny") compiled with example_args=inputs (tests/_shared_zoo.py)
    models["bert"] = module_compiled("bert-base-tiny")[1:]
    for name, (inputs, compiled) in models.items():
        compiled.export_library(str(folder / f"{name}.so"))
        np.save(folder / f"{name}.in.npy", inputs[0].numpy())
        np.save(folder / f"{name}.out.npy", np.asarray(compiled(*inputs)))
    return folder, sorted(models)


def _deployed(tmp_path, script: str, **env_extra: str) -> subprocess.CompletedProcess:
    """Run ``script`` where torch cannot be imported, no compiler is on PATH, ``$CXX`` is
    unset and the cache is empty."""
    (tmp_path / "block").mkdir()
    (tmp_path / "block" / "sitecustomize.py").write_text(BLOCK_TORCH)
    (tmp_path / "bin").mkdir()  # PATH: an empty folder
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLUS_TVM_") and k != "CXX"}
    env.update(
        PATH=str(tmp_path / "bin"),
        PYTHONPATH=str(tmp_path / "block"),
        PLUS_TVM_CACHE_DIR=str(tmp_path / "cache"),
        **env_extra,
    )
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


RUN = """
import json, shutil, sys
try:
    import torch
except ImportError:
    blocked = True
else:
    blocked = False
import numpy as np
import plus_tvm
from plus_tvm.runtime import native

out = {{"blocked": blocked, "compilers": [c for c in ("c++", "g++", "cc", "gcc", "clang++")
                                          if shutil.which(c)], "errors": {{}}, "setup_s": {{}}}}
for name in {names!r}:
    model = plus_tvm.load({folder!r} + f"/{{name}}.so")
    x = np.load({folder!r} + f"/{{name}}.in.npy")
    try:
        got = np.asarray(model(x))
    except plus_tvm.PlusError as err:
        out["errors"][name] = f"{{type(err).__name__}}: {{err}}"
        continue
    out[name] = float(np.abs(got - np.load({folder!r} + f"/{{name}}.out.npy")).max())
    out["setup_s"][name] = model.stats["setup_s"]
out["torch_imported"] = "torch" in sys.modules
out["native"] = native.status()
print(json.dumps(out))
"""


def test_an_exported_cpu_model_runs_without_torch_and_without_a_compiler(
    tmp_path, exported, package_library
):
    folder, names = exported
    proc = _deployed(tmp_path, RUN.format(folder=str(folder), names=names))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["blocked"] and not result["torch_imported"] and not result["compilers"]
    problem = package_library
    if problem is not None:  # installed without the library: the Python kernels need torch
        assert result["native"]["available"] is False
        assert all("needs torch" in e for e in result["errors"].values()), result["errors"]
        pytest.fail(
            f"the package's native library cannot be used ({problem}): install the package "
            "again with a C++ compiler (pip install -e . / scripts/_bootstrap.sh)"
        )
    assert not result["errors"], result["errors"]
    for name in names:
        assert result[name] < 1e-5, (name, result[name])
        assert result["setup_s"][name] >= 0
    status = result["native"]
    assert status["available"] and status["origin"] == "package", status
    kernels = status["kernels"]
    for kernel in ("plus.conv2d", "plus.linear", "plus.linear_layernorm", "plus.attention"):
        assert kernels[kernel]["calls"] > 0 and kernels[kernel]["fallbacks"] == 0, kernel


def test_a_python_kernel_without_torch_is_a_clear_error(tmp_path, exported):
    """PLUS_TVM_NATIVE=0: every library call takes the Python kernel, which needs torch."""
    folder, names = exported
    proc = _deployed(tmp_path, RUN.format(folder=str(folder), names=names), PLUS_TVM_NATIVE="0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["blocked"] and set(result["errors"]) == set(names)
    for error in result["errors"].values():
        assert error.startswith("PlusError: the Python kernel plus.")
        assert "needs torch, which cannot be imported" in error and "pip install torch" in error


def test_the_packaged_library_is_loaded_only_as_it_was_built(tmp_path, package_library):
    """A copy of the package's library checked as the runtime checks it: whole, with its
    manifest, built from these sources and flags."""
    library = native.SOURCE_DIR / _build.LIBRARY
    if not library.exists():
        problem = _build.packaged_problem(
            library, native.SOURCE_DIR, native.SOURCES, native.COMPILE_FLAGS
        )
        assert "installed without it" in problem
        pytest.skip("this install has no packaged native library (built without a compiler)")
    copy = tmp_path / _build.LIBRARY
    shutil.copy(library, copy)
    shutil.copy(_build.manifest_path(library), _build.manifest_path(copy))

    def problem(flags=native.COMPILE_FLAGS):
        return _build.packaged_problem(copy, native.SOURCE_DIR, native.SOURCES, flags)

    if package_library is None:
        assert problem() is None
    assert "other sources" in problem((*native.COMPILE_FLAGS, "-DOTHER"))
    manifest = json.loads(_build.manifest_path(copy).read_text())
    manifest["sources"] = _build.sources_digest(
        native.SOURCE_DIR, native.SOURCES, native.COMPILE_FLAGS
    )
    _build.write_manifest(copy, dict(manifest, onednn_version="0.0"))
    assert "built against onednn-cpu-gomp 0.0" in problem()
    _build.write_manifest(copy, manifest)
    assert problem() is None
    with open(copy, "r+b") as f:
        f.truncate(os.path.getsize(copy) // 2)
    assert "SHA-256 or size" in problem()
    _build.manifest_path(copy).unlink()
    assert "manifest is missing" in problem()
