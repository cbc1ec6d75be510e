"""A deployed model runs on TVM's runtime library alone: plus_tvm.load and the library kernels
import and run in a process where TVM's compiler library cannot load (issue 12 item 6)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import plus_tvm
import pytest
import torch
import tvm
from _shared_zoo import module_compiled
from plus_tvm import ModelLoadError, zoo

RUNTIME_LIBS = ("libtvm_runtime.so", "libtvm_runtime_cuda.so", "libtvm_runtime_extra.so")


def _runtime_only_tvm(root) -> str:
    """A copy of TVM's Python package (by symlinks) whose lib/ holds the runtime libraries
    only: importing it cannot load libtvm_compiler, as on a machine that ships the runtime."""
    real = os.path.dirname(tvm.__file__)
    pkg = root / "tvm"
    (pkg / "lib").mkdir(parents=True)
    for entry in os.listdir(real):
        if entry != "lib":
            os.symlink(os.path.join(real, entry), pkg / entry)
    for lib in RUNTIME_LIBS:
        if os.path.exists(os.path.join(real, "lib", lib)):
            os.symlink(os.path.join(real, "lib", lib), pkg / "lib" / lib)
    return str(root)


def _run_runtime_only(tmp_path, script: str) -> dict:
    site = _runtime_only_tvm(tmp_path / "site")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([site, *sys.path]))
    env.pop("TVM_USE_RUNTIME_LIB", None)  # the fallback must come from the missing library
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("deploy")
    model, inputs, compiled = module_compiled("bert-base-tiny")  # (tests/_shared_zoo.py)
    assert compiled.stats["library_calls"] > 0  # the library kernels are exercised too
    embedded = compiled.export_library(str(folder / "embedded.so"))
    external = compiled.export_library(str(folder / "external.so"), weights="external")
    torch.save(model.state_dict(), folder / "state.pt")
    np.save(folder / "input.npy", inputs[0].numpy())
    np.save(folder / "expected.npy", np.asarray(compiled(*inputs)))
    return folder, embedded, external


def test_load_and_run_without_the_compiler_library(tmp_path, exported):
    folder, embedded, external = exported
    result = _run_runtime_only(
        tmp_path,
        f"""
        import json, numpy as np, torch, tvm, plus_tvm
        x = np.load({str(folder / "input.npy")!r})
        expected = np.load({str(folder / "expected.npy")!r})
        out = {{"runtime_only": bool(tvm.base._RUNTIME_ONLY),
                "libs": sorted(tvm.base._LOADED_LIBS),
                "compiler_available": plus_tvm.compiler_available()}}
        m = plus_tvm.load({embedded!r})
        out["embedded_err"] = float(np.abs(np.asarray(m(x)) - expected).max())
        state = torch.load({str(folder / "state.pt")!r})
        m2 = plus_tvm.load({external!r}, weights=state)
        out["external_err"] = float(np.abs(np.asarray(m2(x)) - expected).max())
        try:
            plus_tvm.compile
        except plus_tvm.PlusError as err:
            out["compile_error"] = str(err)
        print(json.dumps(out))
        """,
    )
    assert result["runtime_only"] and not result["compiler_available"]
    assert "tvm_compiler" not in result["libs"]
    assert result["embedded_err"] == 0.0 and result["external_err"] == 0.0
    assert "compiler library" in result["compile_error"]


def test_external_weights_are_left_out_and_checked_on_load(exported):
    folder, embedded, external = exported
    assert os.path.getsize(external + ".params") < os.path.getsize(embedded + ".params") / 100
    meta = json.load(open(external + ".json"))
    assert meta["external"] and all(e["name"] for e in meta["external"].values())
    with pytest.raises(ModelLoadError, match="exported without"):
        plus_tvm.load(external)
    state = torch.load(folder / "state.pt")
    name = next(iter(meta["external"].values()))["name"]
    with pytest.raises(ModelLoadError, match=f"weight {name} .* not in the given"):
        plus_tvm.load(external, weights={k: v for k, v in state.items() if k != name})
    wrong = dict(state, **{name: state[name][:1]})
    with pytest.raises(ModelLoadError, match=f"weight {name} .* expected"):
        plus_tvm.load(external, weights=wrong)
    with pytest.raises(ModelLoadError, match="holds all its weights"):
        plus_tvm.load(embedded, weights=state)


def test_external_weights_follow_in_place_updates(exported):
    folder, _, external = exported
    model, inputs = zoo.load("bert-base-tiny")
    model.load_state_dict(torch.load(folder / "state.pt"))
    loaded = plus_tvm.load(external, weights=model)
    before = np.asarray(loaded(*inputs))
    np.testing.assert_array_equal(before, np.load(folder / "expected.npy"))
    buffers = [id(w) for w in loaded._device_weights]
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)
    after = np.asarray(loaded(*inputs))
    np.testing.assert_allclose(after, model(*inputs).numpy(), rtol=1e-4, atol=1e-4)
    assert not np.allclose(after, before)
    # updated in the buffers they had: a captured CUDA graph replays recorded addresses
    assert [id(w) for w in loaded._device_weights] == buffers


def test_kernels_are_timed_one_by_one_on_the_runtime_alone(tmp_path):
    """gpu_check --kernels: shapes recorded with the compiler, kernels timed without it."""
    from plus_tvm import Options
    from plus_tvm.compile_inputs import resolve_inputs
    from plus_tvm.compiler import pre_lowering
    from plus_tvm.kernel_timing import signatures
    from plus_tvm.loader import load_model
    from plus_tvm.target import resolve_target

    model, inputs = zoo.load("resnet50-tiny")
    tgt = resolve_target("llvm")
    options = resolve_inputs(tgt, Options())
    mod, _ = pre_lowering(load_model(model, inputs), tgt, options, "plus")
    sigs = signatures(mod)
    assert "max_pool2d" in sigs and sigs["max_pool2d"]["launches"] == 1
    path = str(tmp_path / "resnet.so")
    module_compiled("resnet50-tiny")[2].export_library(path)  # (compile(model, inputs), shared)
    (tmp_path / "sigs.json").write_text(json.dumps(sigs))
    result = _run_runtime_only(
        tmp_path,
        f"""
        import json, tvm, plus_tvm
        from plus_tvm.kernel_timing import time_kernels
        sigs = json.load(open({str(tmp_path / "sigs.json")!r}))
        ms = time_kernels(plus_tvm.load({path!r}).executable, sigs, tvm.cpu(), 3, 0)
        print(json.dumps({{"runtime_only": bool(tvm.base._RUNTIME_ONLY), "ms": ms}}))
        """,
    )
    assert result["runtime_only"]
    assert set(result["ms"]) == set(sigs) and all(t > 0 for t in result["ms"].values())
