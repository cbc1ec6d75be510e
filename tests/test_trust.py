"""What plus_tvm loads from its cache is its own: private folders, libraries checked against the
digest recorded when they were built, damaged cache files named and ignored (plus_tvm.paths,
plus_tvm.runtime.native, the caches that read files back)."""

from __future__ import annotations

import ctypes
import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from plus_tvm import env, paths
from plus_tvm.errors import UnsafeCacheError
from plus_tvm.paths import CacheWarning, private_dir, read_private
from plus_tvm.runtime import native

# ------------------------------------------------------------------------- private folders


@pytest.fixture
def root(tmp_path, monkeypatch):
    """A cache root that does not exist yet."""
    folder = tmp_path / "cache"
    monkeypatch.setenv(env.CACHE_DIR, str(folder))
    return folder


def _mode(path) -> int:
    return os.stat(path).st_mode & 0o777


def test_folders_are_created_private_whatever_the_umask(root):
    old = os.umask(0)  # mkdir(0o700) alone is enough here; a umask cannot add bits either way
    try:
        folder = private_dir("a", "b")
    finally:
        os.umask(old)
    assert folder == root / "a" / "b"
    assert [_mode(p) for p in (root, root / "a", root / "a" / "b")] == [0o700] * 3


def test_the_default_root_follows_xdg_cache_home(tmp_path, monkeypatch):
    monkeypatch.delenv(env.CACHE_DIR)
    monkeypatch.setenv(env.XDG_CACHE_HOME, str(tmp_path / "xdg"))
    assert private_dir() == tmp_path / "xdg" / "plus_tvm"
    assert _mode(tmp_path / "xdg" / "plus_tvm") == 0o700


def test_a_folder_writable_by_others_is_refused(root):
    root.mkdir()
    os.chmod(root, 0o777)
    with pytest.raises(UnsafeCacheError, match=f"{root}: .*writable by group or others.*chmod"):
        private_dir()
    os.chmod(root, 0o755)  # not writable by others: kept as it is
    assert private_dir("x") == root / "x"
    os.chmod(root / "x", 0o770)
    with pytest.raises(UnsafeCacheError, match=f"{root / 'x'}: .*mode 770"):
        private_dir("x")


def test_a_folder_of_another_user_is_refused(root, monkeypatch):
    private_dir("mine")
    monkeypatch.setattr(paths, "_current_uid", lambda: os.geteuid() + 1)  # as someone else
    with pytest.raises(UnsafeCacheError, match=f"{root}: .*owned by uid .*remove it"):
        private_dir("mine")


def test_a_file_where_a_folder_should_be_is_refused(root):
    root.mkdir(mode=0o700)
    (root / "native").write_text("")
    with pytest.raises(UnsafeCacheError, match="needs a folder"):
        private_dir("native")


def test_a_cache_file_others_can_write_is_refused(root, monkeypatch):
    path = private_dir() / "figures.json"
    path.write_text("{}")
    os.chmod(path, 0o666)
    with pytest.raises(UnsafeCacheError, match=f"{path}: .*file is writable by group"):
        read_private(path)
    os.chmod(path, 0o644)
    assert read_private(path) == b"{}"
    monkeypatch.setattr(paths, "_current_uid", lambda: os.geteuid() + 1)
    with pytest.raises(UnsafeCacheError, match="owned by uid"):
        read_private(path)
    assert read_private(root / "absent.json") is None


# ------------------------------------------------------------------------- native libraries
GENUINE = 'extern "C" int plus_trust_answer() { return 42; }\n'
PLANTED = textwrap.dedent(
    """
    #include <cstdio>
    extern "C" int plus_trust_answer() { return 666; }
    __attribute__((constructor)) static void planted() {
      if (FILE* f = std::fopen("MARKER", "w")) std::fclose(f);
    }
    """
)


@pytest.fixture
def toolchain(tmp_path, monkeypatch):
    """A private build root, and the compile command of a tiny library (a second or less)."""
    try:
        cxx, _ = native.compiler()
    except native.NativeUnavailableError as err:
        pytest.skip(str(err))
    monkeypatch.setenv(env.NATIVE_CACHE, str(tmp_path / "native"))
    source = tmp_path / "genuine.cc"
    source.write_text(GENUINE)
    return cxx, [cxx, "-shared", "-fPIC", str(source)]


def _planted(tmp_path, cxx) -> tuple[bytes, str]:
    """The bytes of a library whose constructor writes a marker file, and the marker's path."""
    marker = tmp_path / "constructor-ran"
    source = tmp_path / "planted.cc"
    source.write_text(PLANTED.replace("MARKER", str(marker)))
    out = tmp_path / "planted.so"
    subprocess.run([cxx, "-shared", "-fPIC", str(source), "-o", str(out)], check=True)
    return out.read_bytes(), str(marker)


def _answer(path: str) -> int:
    return ctypes.CDLL(path).plus_trust_answer()


def test_a_library_is_built_with_a_manifest_of_its_digest(toolchain):
    _, command = toolchain
    path = native.compile_library("k", "lib.so", command)
    manifest = json.loads(native.manifest_path(Path(path)).read_text())
    assert manifest["file"] == "lib.so" and len(manifest["sha256"]) == 64
    assert manifest["size"] == os.path.getsize(path)
    assert _mode(path) == 0o700 and _mode(os.path.dirname(path)) == 0o700
    assert native.library_problem(Path(path)) is None
    assert native.compile_library("k", "lib.so", command) == path  # found, not rebuilt


def test_a_planted_library_is_rebuilt_and_never_loaded(toolchain, tmp_path):
    cxx, command = toolchain
    path = native.compile_library("k", "lib.so", command)
    planted, marker = _planted(tmp_path, cxx)
    with open(path, "wb") as f:  # someone wrote over it (the manifest is the old one)
        f.write(planted)
    with pytest.warns(native.NativeCacheWarning, match="lib.so: its SHA-256 .*rebuilt"):
        again = native.compile_library("k", "lib.so", command)
    assert again == path and _answer(again) == 42
    assert not os.path.exists(marker)  # the planted constructor never ran


def test_a_truncated_library_is_rebuilt(toolchain):
    _, command = toolchain
    path = native.compile_library("k", "lib.so", command)
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    with pytest.warns(native.NativeCacheWarning, match=r"truncated \(\d+ of \d+ bytes\)"):
        assert _answer(native.compile_library("k", "lib.so", command)) == 42


@pytest.mark.parametrize("manifest", [None, "{not json", '{"sha256": 1}'])
def test_a_library_without_a_usable_manifest_is_rebuilt(toolchain, manifest):
    _, command = toolchain
    path = Path(native.compile_library("k", "lib.so", command))
    if manifest is None:
        native.manifest_path(path).unlink()
    else:
        native.manifest_path(path).write_text(manifest)
    with pytest.warns(native.NativeCacheWarning, match="manifest"):
        native.compile_library("k", "lib.so", command)
    assert native.library_problem(path) is None


def test_a_planted_library_that_cannot_be_rebuilt_leaves_the_python_kernels(
    toolchain, tmp_path, monkeypatch
):
    """No compiler to rebuild with: the planted file is removed, never loaded, and the
    native kernels are unavailable with the reason, as without a compiler."""
    cxx, command = toolchain
    path = native.compile_library("k", "lib.so", command)
    planted, marker = _planted(tmp_path, cxx)
    with open(path, "wb") as f:
        f.write(planted)
    broken = [str(tmp_path / "no-such-compiler"), *command[1:]]
    monkeypatch.setattr(native, "_STATE", native._State())  # this process's state, fresh
    monkeypatch.setenv("PLUS_TVM_NATIVE", "cache")  # not the library built with the package
    monkeypatch.setattr(native, "build", lambda: native.compile_library("k", "lib.so", broken))
    with pytest.warns(native.NativeCacheWarning, match="lib.so"):
        assert native.ensure({}) is False
    assert "compiling lib.so failed" in native.status()["reason"]
    assert not os.path.exists(path) and not os.path.exists(marker)


def test_a_foreign_build_folder_is_refused(toolchain, monkeypatch):
    _, command = toolchain
    native.compile_library("k", "lib.so", command)
    monkeypatch.setattr(paths, "_current_uid", lambda: os.geteuid() + 1)
    with pytest.raises(UnsafeCacheError, match="owned by uid"):
        native.compile_library("k", "lib.so", command)


@pytest.mark.slow
def test_a_planted_plus_native_is_rebuilt_by_the_runtime_and_not_loaded(toolchain, tmp_path):
    """The real library, as the runtime loads it (one full build, 30-60 s on 2 cores)."""
    cxx, _ = toolchain
    planted, marker = _planted(tmp_path, cxx)
    folder = native.build_folder(native._key(native._toolchain()))
    (folder / "plus_native.so").write_bytes(planted)
    native.manifest_path(folder / "plus_native.so").write_text(
        json.dumps({"file": "plus_native.so", "sha256": "0" * 64, "size": len(planted)})
    )
    script = (
        "import warnings; warnings.simplefilter('always')\n"
        "from plus_tvm.runtime import KERNELS, native\n"
        "print(native.ensure(KERNELS), native.status().get('reason'))\n"
    )
    env = dict(os.environ, PLUS_TVM_NATIVE="cache")  # not the library built with the package
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("True"), out.stdout + out.stderr[-2000:]
    assert "plus_native.so: its SHA-256" in out.stderr and "rebuilt" in out.stderr
    assert not os.path.exists(marker)


# ------------------------------------------------------------------- cache files read back
def test_a_gir_figure_that_is_no_number_is_named_and_ignored(root):
    from plus_tvm.gir import model as gir_model
    from plus_tvm.target import resolve_target

    llvm = resolve_target("llvm")
    path = gir_model.figures_path(llvm)
    with open(path, "w") as f:
        json.dump({"global_gbps": "fast", "cache_gbps": 100.0}, f)
    with pytest.warns(CacheWarning, match=f"{path}: .*global_gbps is 'fast'"):
        assert gir_model.load_figures(llvm) is None
    with pytest.warns(CacheWarning):
        assert not gir_model.machine_for(llvm).measured  # the defaults, no crash
        assert gir_model.cpu_figures(llvm)["global_gbps"] == 20.0
    with open(path, "w") as f:
        f.write("\x00\x01 not json")
    with pytest.warns(CacheWarning, match="not JSON"):
        assert gir_model.load_figures(llvm) is None


def test_a_damaged_cost_model_calibration_is_named_and_ignored(root):
    from plus_tvm.costmodel import learned

    path = learned.user_path("llvm", "machine")
    with open(path, "w") as f:
        json.dump({"format": learned.FORMAT, "tir": {"features": [], "booster": 3}}, f)
    with pytest.warns(CacheWarning, match=f"{path}: .*tir model is damaged"):
        assert learned.calibration("llvm", "machine") is None
    with pytest.warns(CacheWarning):  # the shipped model is used instead
        assert learned.model_path("llvm", "machine") == learned.shipped_path("llvm")
    from plus_tvm import Options
    from plus_tvm.compile_inputs import resolve_inputs
    from plus_tvm.gir.model import figures_key
    from plus_tvm.target import resolve_target

    llvm = resolve_target("llvm")
    mine = learned.user_path("llvm", figures_key(llvm))
    shutil.copy(path, mine)
    with pytest.warns(CacheWarning, match=f"{mine}: "):  # cost_model="auto": as uncalibrated
        assert resolve_inputs(llvm, Options(cpu_parallel="tvm")).cost_model == "analytic"
    with open(path, "w") as f:
        f.write("[1, 2")
    with pytest.warns(CacheWarning, match="not JSON"):
        assert learned.calibration("llvm", "machine") is None


def test_a_damaged_cuda_graph_decision_is_named_and_replaced(root):
    from plus_tvm.runtime import cuda_graph

    cache = cuda_graph.DecisionCache()
    assert cache.path == str(root / cuda_graph.CACHE_FILE)
    with open(cache.path, "w") as f:
        json.dump({"gpu|module|region": "run it twice"}, f)
    with pytest.warns(CacheWarning, match="decisions.json: .*'run it twice'"):
        assert cache.get("gpu|module|region") is None
    with pytest.warns(CacheWarning):
        cache.put("gpu|module|region", cuda_graph.GRAPH)  # rewritten whole
    assert cache.get("gpu|module|region") == cuda_graph.GRAPH
    assert _mode(cache.path) == 0o600


class _Planted:
    """A pickle that runs code when loaded (writes a marker)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (shutil.copy, (__file__, self.marker))


def test_the_node_test_cache_never_runs_code_and_a_damaged_one_is_regenerated(root, monkeypatch):
    from plus_tvm.conformance import case_store
    from plus_tvm.conformance import cases as cases_mod

    marker = root.parent / "unpickled"
    path = cases_mod.cache_path()
    with open(path, "wb") as f:  # a planted pickle where the store is
        pickle.dump([_Planted(str(marker))], f)
    with pytest.raises(case_store.StoreError, match="not a node-test store"):
        case_store.load(path)  # what the worker calls: refuses, runs nothing
    one = cases_mod.NodeCase("test_relu", "Relu", b"model", (), 1e-3, 1e-7)
    monkeypatch.setattr(cases_mod, "generate", lambda: [one])
    with pytest.warns(CacheWarning, match=f"{path}: .*not a node-test store"):
        assert cases_mod.load_cases() == [one]
    assert not marker.exists()
    assert cases_mod.load_cases() == [one]  # the regenerated store reads back


# ----------------------------------------------------------------------------- artifacts
# (a small ONNX model: compiles in about a second)


def _tiny_model():
    from onnx import TensorProto, helper

    node = helper.make_node("Gather", ["table", "ids"], ["y"], name="lookup", axis=0)
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info("table", TensorProto.FLOAT, [10, 4]),
            helper.make_tensor_value_info("ids", TensorProto.INT64, [3]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def compiled():
    import plus_tvm

    return plus_tvm.compile(_tiny_model())


def test_outputs_replace_a_link_and_never_write_through_it(compiled, tmp_path):
    """``-o`` through symlinks once overwrote files elsewhere (.params and .json)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    for suffix in ("", ".params", ".json"):
        victim = elsewhere / f"victim{suffix}"
        victim.write_text("keep me")
        (out / f"m.so{suffix}").symlink_to(victim)
    compiled.export_library(str(out / "m.so"))
    for suffix in ("", ".params", ".json"):
        assert (elsewhere / f"victim{suffix}").read_text() == "keep me"
        assert not (out / f"m.so{suffix}").is_symlink()
    assert sorted(p.name for p in out.iterdir()) == ["m.so", "m.so.json", "m.so.params"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(compiled, tmp_path, monkeypatch):
    from plus_tvm import output_files
    from plus_tvm.errors import OutputWriteError

    path = tmp_path / "m.so"
    compiled.export_library(str(path))
    before = (tmp_path / "m.so.json").read_bytes()

    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(output_files.os, "fsync", full_disk)
    with pytest.raises(OutputWriteError, match=r"m\.so.*No space left"):
        compiled.export_library(str(path))
    assert (tmp_path / "m.so.json").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.so", "m.so.json", "m.so.params"]


def test_an_output_that_is_a_folder_or_device_is_refused(tmp_path):
    from plus_tvm.errors import OutputWriteError
    from plus_tvm.output_files import check_target, write_bytes

    with pytest.raises(OutputWriteError, match="is a folder"):
        check_target(str(tmp_path))
    with pytest.raises(OutputWriteError, match="not a regular file"):
        write_bytes("/dev/full", b"x")  # once "succeeded"
    with pytest.raises(OutputWriteError, match="does not exist"):
        check_target(str(tmp_path / "no" / "such" / "m.so"))


@pytest.mark.parametrize(
    "edit",
    [
        lambda meta: meta["inputs"][1].update(shape=[5]),
        lambda meta: meta["inputs"][1]["index_range"].update(high=10**12),
        lambda meta: meta["inputs"][0].update(dtype="float16"),
        lambda meta: meta.update(num_params=meta["num_params"] + 1),
    ],
    ids=["shape", "index_range", "dtype", "num_params"],
)
def test_load_refuses_a_description_the_executable_does_not_match(compiled, tmp_path, edit):
    """Edited fields once reached TVM's raw checks or widened an index range; the executable
    carries its own signature, and load compares (the digests in the json are recomputed as
    an editor would)."""
    import plus_tvm
    from plus_tvm.errors import ModelLoadError

    path = tmp_path / "m.so"
    compiled.export_library(str(path))
    meta_path = tmp_path / "m.so.json"
    meta = json.loads(meta_path.read_text())
    assert meta["inputs"][1]["index_range"]["high"] == 9  # Gather's ids: [-10, 9]
    edit(meta)
    meta_path.write_text(json.dumps(meta))
    # (an extra weight is already missing from .params; the rest only the executable knows)
    with pytest.raises(ModelLoadError, match="does not match its executable|cannot be read"):
        plus_tvm.load(str(path))


def test_a_loaded_model_runs_as_exported(compiled, tmp_path):
    import numpy as np
    import plus_tvm

    path = tmp_path / "m.so"
    compiled.export_library(str(path))
    table = np.arange(40, dtype=np.float32).reshape(10, 4)
    ids = np.array([0, -1, 9])
    np.testing.assert_array_equal(plus_tvm.load(str(path))(table, ids), table[ids])


# ----------------------------------------------------------------------------- processes


_FORKED: dict = {}  # what forked workers inherit (a compiled model does not pickle)


def _run_inherited(x):
    import numpy as np

    return np.asarray(_FORKED["model"](x))


def test_a_model_runs_in_forked_workers_after_running_in_the_parent():
    """Workers forked after the parent ran the model once hung in the VM call (OpenMP's team,
    which oneDNN's GEMMs ran on, does not survive fork): the children now run it on one
    thread."""
    import multiprocessing

    import numpy as np
    import plus_tvm
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU()).eval()
    x = torch.randn(64, 256)
    compiled = plus_tvm.compile(model, example_args=(x,))
    want = np.asarray(compiled(x.numpy()))  # the parent's OpenMP team now exists
    _FORKED["model"] = compiled
    try:
        with multiprocessing.get_context("fork").Pool(2) as pool:
            got = pool.map_async(_run_inherited, [x.numpy()] * 4).get(timeout=120)
    finally:
        _FORKED.clear()
    for out in got:
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(compiled(x.numpy())), want)  # parent unaffected


def test_a_model_on_tvms_pool_refuses_in_a_forked_child(compiled, monkeypatch):
    """TVM's pool cannot be made serial in the child: an error naming the fix, not a hang."""
    import numpy as np
    from plus_tvm.errors import PlusError

    monkeypatch.setattr(compiled, "_openmp", False)
    monkeypatch.setattr(compiled, "_ran_in", os.getpid() + 1)  # as if it ran in a parent
    with pytest.raises(PlusError, match="'spawn' or 'forkserver'"):
        compiled(np.zeros((10, 4), np.float32), np.array([0, 1, 2]))


# ---------------------------------------------------------------- bad input: one line, exit 2


def _relu_onnx(path, opset: int = 17, dims=(1, 4)) -> str:
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node("Relu", ["x"], ["y"], name="r")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(dims))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(dims))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.opset_import[0].version = opset
    onnx.save(model, str(path))
    return str(path)


def _external_data_outside(tmp_path) -> str:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        initializer=[w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "ext.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="w.bin", size_threshold=0)
    model = onnx.load(str(path), load_external_data=False)
    for entry in model.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = "../../../etc/passwd"  # outside the model's folder
    onnx.save(model, str(path))
    return str(path)


def _case(tmp_path, name):  # noqa: PLR0911 - one arm per hostile input
    """(argv, environment changes, words the one line must hold) of a hostile input."""
    import numpy as np

    ok = _relu_onnx(tmp_path / "ok.onnx")
    if name == "external data outside the folder":
        return ["run", _external_data_outside(tmp_path)], {}, "points outside"
    if name == "opset 99":
        return ["run", _relu_onnx(tmp_path / "o.onnx", opset=99)], {}, "opset 99"
    if name == "a negative dimension":
        return ["run", _relu_onnx(tmp_path / "n.onnx", dims=(1, -3))], {}, "dimension -3"
    if name == "the reference refuses the model":
        return ["run", _relu_onnx(tmp_path / "o1.onnx", opset=1)], {}, "--no-check"
    if name == "--inputs of a .npy":
        np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
        return ["run", ok, "--inputs", str(tmp_path / "x.npy")], {}, ".npz archive"
    if name == "an object array in the .npz":
        np.savez(tmp_path / "o.npz", x=np.array([object()], dtype=object))
        return ["run", ok, "--inputs", str(tmp_path / "o.npz")], {}, "Object arrays"
    if name == "a cache root on /proc":
        return ["run", ok], {env.CACHE_DIR: "/proc/plus_tvm_cache"}, "cache folder"
    if name == "a cache root that is a file":
        (tmp_path / "afile").write_text("x")
        return ["run", ok], {env.CACHE_DIR: str(tmp_path / "afile")}, "needs a folder"
    if name == "target kind c":
        return ["run", ok, "--target", '{"kind": "c"}'], {}, "not supported"
    if name == "code for another CPU":
        triple = '{"kind": "llvm", "mtriple": "aarch64-linux-gnu"}'
        return ["run", ok, "--target", triple], {}, "cannot run"
    if name == "--rtol nan":
        return ["run", ok, "--rtol", "nan"], {}, "finite number >= 0"
    if name == "a negative tolerance":
        return ["run", ok, "--atol=-1e-3"], {}, "finite number >= 0"
    if name == "a JSON nested 100,000 deep":
        (tmp_path / "deep.json").write_text("[" * 100000 + "]" * 100000)
        return ["run", str(tmp_path / "deep.json")], {}, "cannot load ONNX file"
    if name == "a warehouse graph nested 3,000 deep":
        lines = "".join("  " * i + f"loop{i} [N{i}, para]\n" for i in range(3000))
        (tmp_path / "wh").mkdir()
        (tmp_path / "wh" / "deep.toml").write_text(
            'name = "deep"\ndescription = "x"\nallow_prologue = false\nallow_epilogue = false\n'
            f'priority = 1\ngraph = """\n{lines}"""\n[[implementation]]\n'
            'name = "torch.linear"\ntarget = "any"\n'
        )
        return ["warehouse", "validate", str(tmp_path / "wh")], {}, "nests at most"
    if name == "a missing library":
        return ["run", str(tmp_path / "nothere.so")], {}, "not found"
    raise AssertionError(name)


BAD_INPUTS = [
    "external data outside the folder",
    "opset 99",
    "a negative dimension",
    "the reference refuses the model",
    "--inputs of a .npy",
    "an object array in the .npz",
    "a cache root on /proc",
    "a cache root that is a file",
    "target kind c",
    "code for another CPU",
    "--rtol nan",
    "a negative tolerance",
    "a JSON nested 100,000 deep",
    "a warehouse graph nested 3,000 deep",
    "a missing library",
]


@pytest.mark.parametrize("name", BAD_INPUTS)
def test_bad_input_exits_2_with_one_line(tmp_path, monkeypatch, capsys, name):
    """Each was an internal error (exit 1, a raw exception or a RecursionError) or silently
    accepted (``--rtol nan`` turned the check off)."""
    from plus_tvm import cli

    argv, environment, words = _case(tmp_path, name)
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    code = cli.main(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert code == 2, err
    assert lines[-1].startswith("plus-tvm: error:") and words in lines[-1], err
    assert "Traceback" not in err


def test_options_of_the_wrong_type_are_refused():
    from plus_tvm import Options, OptionsError

    for bad in ({"dump_ir": 123}, {"fusion_alpha": float("nan")}, {"warehouse": [1]}):
        with pytest.raises(OptionsError, match=next(iter(bad))):
            Options(**bad)
