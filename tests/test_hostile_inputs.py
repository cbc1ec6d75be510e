"""Hostile-input catalogue: what a new user throws at plus_tvm, and the exact outcome of each.

Every case asserts one of: the correct result; a typed exception from the API (an
:class:`~plus_tvm.PlusError` subclass naming the input, file, entry or option); or, on the
command line, one line on stderr and the documented exit code (2 bad input, 3 failed check,
130 interrupted). Never a crash, a traceback, or a silently wrong number.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import onnx
import plus_tvm
import pytest
import torch
from _shared_zoo import zoo_compiled
from onnx import TensorProto, helper
from plus_tvm import cli
from plus_tvm.cli import compare_outputs
from plus_tvm.errors import InputError, InternalCompileError, ModelLoadError, OutputWriteError
from plus_tvm.pattern_warehouse import WarehouseError

# --------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def bert(strict):
    """A tiny BERT whose library kernels run (cost model off: every match is a library call)."""
    with strict():
        opts = plus_tvm.Options(dispatch_cost_model=False)
        return plus_tvm.compile("zoo:bert-base-tiny", "llvm", options=opts)


@pytest.fixture(scope="module")
def exported(tmp_path_factory, strict):
    """Two compiled models with weights of the same shapes, exported side by side."""
    folder = tmp_path_factory.mktemp("exported")
    paths = []
    with strict():
        for seed in (0, 1):
            torch.manual_seed(seed)
            model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
            cm = plus_tvm.compile(model, "llvm", example_args=(torch.randn(2, 8),))
            paths.append(cm.export_library(str(folder / f"m{seed}.so")))
    return paths


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert lines and "Traceback" not in err, err
    assert lines[-1].startswith("plus-tvm: error:"), err
    return lines[-1]


def _gather_model(path: str, vocab: int = 10) -> str:
    """ONNX: ``Gather(table, ids)`` with the table an initializer and ids an input."""
    table = helper.make_tensor(
        "table", TensorProto.FLOAT, [vocab, 3], np.arange(vocab * 3, dtype=np.float32)
    )
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)],
        "gather",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3])],
        [table],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


# -------------------------------------------------------------------------------- threads
def test_one_compiled_model_from_four_threads_with_different_inputs(bert):
    assert bert.stats["library_calls"] > 0  # the library kernels' caches are exercised too
    rng = np.random.default_rng(0)
    inputs = [rng.integers(0, 1000, (1, 16)).astype("int64") for _ in range(8)]
    expected = [bert(x) for x in inputs]
    wrong: list[tuple[int, int]] = []
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for it in range(25):
                i = (k * 3 + it) % len(inputs)
                if not np.array_equal(bert(inputs[i]), expected[i]):
                    wrong.append((k, it))
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and not wrong


# --------------------------------------------------------------------------- index inputs
@pytest.mark.parametrize("bad", [1000, 100000, -1])
def test_out_of_range_token_ids_name_the_input_and_the_range(bert, bad):
    ids = np.zeros((1, 16), dtype="int64")
    ids[0, 5] = bad
    with pytest.raises(InputError, match=r"input_ids: value -?\d+ at \(0, 5\).*0\.\.999"):
        bert(ids)


def test_edge_token_ids_are_valid(bert):
    ids = np.full((1, 16), 999, dtype="int64")
    ids[0, 0] = 0
    module = bert.source.torch_module
    with torch.no_grad():
        ref = module(torch.from_numpy(ids))
    ref = ref[0] if isinstance(ref, tuple) else ref
    np.testing.assert_allclose(bert(ids), ref.numpy(), atol=1e-4)


def test_onnx_gather_accepts_negative_indices_and_refuses_outside(tmp_path):
    cm = plus_tvm.compile(_gather_model(str(tmp_path / "g.onnx")), "llvm")
    table = np.arange(30, dtype=np.float32).reshape(10, 3)
    ids = np.array([0, 9, -1, -10], dtype=np.int64)  # ONNX Gather: -n..n-1
    np.testing.assert_array_equal(cm(ids), table[ids])
    with pytest.raises(InputError, match=r"ids: value -11 .* -10\.\.9"):
        cm(np.array([0, 1, -11, 2], dtype=np.int64))
    with pytest.raises(InputError, match=r"ids: value 10 .* -10\.\.9"):
        cm(np.array([0, 10, 1, 2], dtype=np.int64))


def test_a_computed_negative_index_reads_from_the_end_as_in_torch():
    class LastButOne(torch.nn.Module):
        def forward(self, x):  # Falcon's qkv[:, :, :, [-2]]: take with a constant -2
            return x[:, [-2]] * 2

    x = torch.randn(3, 5)
    cm = plus_tvm.compile(LastButOne(), "llvm", example_args=(x,))
    np.testing.assert_allclose(cm(x.numpy()), LastButOne()(x).numpy())


# --------------------------------------------------------------------------------- NaN
def test_nan_in_an_image_gives_nan_logits_as_in_torch():
    cm = zoo_compiled("mobilenetv2-tiny")  # ReLU6 in oneDNN and in TIR (tests/_shared_zoo.py)
    (x,) = cm.source.example_inputs
    x = x.clone()
    x[0, 1, 7, 7] = float("nan")
    with torch.no_grad():
        ref = cm.source.torch_module(x)
    ref = (ref[0] if isinstance(ref, tuple) else ref).numpy()
    out = cm(x.numpy())
    assert np.isnan(ref).all()
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))


class _MaxFamily(torch.nn.Module):
    def forward(self, x):
        pooled = torch.nn.functional.max_pool2d(x, 2)
        return (
            torch.relu(x),
            torch.clamp(x, -0.5, 0.5),
            torch.maximum(x, torch.zeros_like(x)),
            torch.minimum(x, torch.ones_like(x)),
            pooled,
            x.max().reshape(1),  # a full max reduction (max over a dim imports as topk)
        )


def test_relu_clip_maximum_minimum_pool_and_max_propagate_nan():
    x = torch.randn(1, 2, 4, 4)
    x[0, 0, 1, 2] = float("nan")
    cm = plus_tvm.compile(_MaxFamily(), "llvm", example_args=(x,))
    for out, ref in zip(cm(x.numpy()), _MaxFamily()(x)):
        np.testing.assert_array_equal(np.isnan(out), torch.isnan(ref).numpy())
        np.testing.assert_allclose(out, ref.numpy(), equal_nan=True)


def test_propagate_nan_off_restores_tvm_semantics():
    x = torch.randn(1, 2, 4, 4)
    x[0, 0, 1, 2] = float("nan")
    opts = plus_tvm.Options(propagate_nan=False)
    cm = plus_tvm.compile(_MaxFamily(), "llvm", example_args=(x,), options=opts)
    relu = cm(x.numpy())[0]
    assert not np.isnan(relu).any()  # TVM's max(x, 0) drops the NaN: documented, opt-in


def test_the_run_check_fails_on_a_nan_mismatch():
    ref = np.array([1.0, np.nan, 3.0], dtype=np.float32)
    assert compare_outputs([ref.copy()], [ref], 1e-3, 1e-3)["ok"]  # NaN == NaN
    dropped = np.array([1.0, 0.0, 3.0], dtype=np.float32)
    check = compare_outputs([dropped], [ref], 1e-3, 1e-3)
    assert not check["ok"] and "NaN mismatch" in check["why"]
    assert np.isnan(check["max_abs_err"])
    infinite = np.array([1.0, np.inf, -np.inf], dtype=np.float32)
    assert compare_outputs([infinite.copy()], [infinite], 1e-3, 1e-3)["ok"]
    for wrong in ([1.0, np.inf, np.inf], [1.0, 7.0, -np.inf]):
        check = compare_outputs([np.array(wrong, np.float32)], [infinite], 1e-3, 1e-3)
        assert not check["ok"] and "infinities" in check["why"]


_RELU_MODEL = """
import torch


class ReluScale(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2.0


def build():
    return ReluScale(), (torch.randn(2, 8),)
"""


def test_plus_tvm_run_exits_3_when_outputs_differ_from_torch(tmp_path, capsys):
    source = tmp_path / "relu_model.py"
    source.write_text(_RELU_MODEL)
    model = f"python:{source}:build"
    inputs = tmp_path / "nan.npz"
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    x[1, 3] = np.nan
    np.savez(inputs, x)
    # TVM's semantics drop the NaN where torch keeps it: the check must fail, not pass
    code, _, err = run_cli(
        capsys, "run", model, "--inputs", str(inputs), "--opt", "propagate_nan=false"
    )
    assert code == cli.EXIT_CHECK_FAILED and "check failed" in err and "NaN" in err
    code, out, _ = run_cli(capsys, "run", model, "--inputs", str(inputs))
    assert code == 0 and "max abs error" in out


# ------------------------------------------------------------------------- saved models
def test_swapped_parameter_files_of_the_same_shapes_are_refused(exported, tmp_path):
    a, b = exported
    swapped = str(tmp_path / "swapped.so")
    for suffix in ("", ".json"):
        with open(a + suffix, "rb") as src, open(swapped + suffix, "wb") as dst:
            dst.write(src.read())
    with open(b + ".params", "rb") as src, open(swapped + ".params", "wb") as dst:
        dst.write(src.read())
    with pytest.raises(ModelLoadError, match=r"swapped\.so\.params does not belong"):
        plus_tvm.load(swapped)
    assert plus_tvm.load(a)(np.ones((2, 8), np.float32)).shape == (2, 8)


@pytest.mark.parametrize(
    "damage",
    ["truncate-params", "foreign-params", "corrupt-json", "old-json", "random-so", "no-params"],
)
def test_damaged_artifacts_are_refused_with_a_clear_error(exported, tmp_path, capsys, damage):
    src = exported[0]
    path = str(tmp_path / "m.so")
    for suffix in ("", ".params", ".json"):
        with open(src + suffix, "rb") as f, open(path + suffix, "wb") as g:
            g.write(f.read())
    if damage == "truncate-params":
        blob = open(path + ".params", "rb").read()
        open(path + ".params", "wb").write(blob[: len(blob) // 2])
        needle = "params does not belong"
    elif damage == "foreign-params":
        open(path + ".params", "wb").write(os.urandom(300))
        needle = "params does not belong"
    elif damage == "corrupt-json":
        open(path + ".json", "w").write('{"format": "plus_tvm.compiled/2", "inputs": [')
        needle = "not a readable model description"
    elif damage == "old-json":
        meta = json.load(open(path + ".json"))
        meta["format"] = "plus_tvm.compiled/1"
        json.dump(meta, open(path + ".json", "w"))
        needle = "export the model again"
    elif damage == "random-so":
        open(path, "wb").write(os.urandom(4096))
        needle = "does not match"
    else:
        os.remove(path + ".params")
        needle = "missing"
    with pytest.raises(ModelLoadError, match=needle):
        plus_tvm.load(path)
    code, _, err = run_cli(capsys, "run", path, "--no-check")
    assert code == 2 and needle in one_line_error(err)


# ------------------------------------------------------------------ command-line inputs
def _bad_warehouse(folder) -> str:
    folder.mkdir()
    (folder / "broken.toml").write_text('name = "broken"\ngraph = """\nloop0 [M, para\n"""\n')
    return str(folder)


@pytest.mark.parametrize("command", ["compile", "inspect"])
def test_a_broken_warehouse_entry_exits_2_naming_the_file(tmp_path, capsys, command):
    where = _bad_warehouse(tmp_path / "wh")
    extra = ["-o", str(tmp_path / "m.so")] if command == "compile" else []
    code, _, err = run_cli(
        capsys, command, "zoo:bert-base-tiny", "--opt", f"warehouse={where}", *extra
    )
    assert code == 2 and "broken.toml" in one_line_error(err)
    with pytest.raises(WarehouseError, match="broken.toml"):
        plus_tvm.inspect("zoo:bert-base-tiny", options=plus_tvm.Options(warehouse=(where,)))


def test_a_when_condition_20000_terms_deep_exits_2(tmp_path, capsys):
    folder = tmp_path / "deep"
    folder.mkdir()
    shipped = os.path.join(os.path.dirname(plus_tvm.warehouse.__file__), "softmax.toml")
    text = open(shipped).read().replace('name = "softmax"', 'name = "deep_softmax"')
    when = " and ".join(["M > 1"] * 20000)
    lines = [ln for ln in text.splitlines() if not ln.strip().startswith("when")]
    at = next(i for i, ln in enumerate(lines) if ln.strip().startswith("target ="))
    text = "\n".join([*lines[: at + 1], f'when = "{when}"', *lines[at + 1 :]])
    (folder / "deep_softmax.toml").write_text(text)
    code, _, err = run_cli(capsys, "warehouse", "validate", str(folder))
    assert code == 2 and "deep_softmax.toml" in one_line_error(err) and "when" in err


def test_a_folder_nobody_can_write_exits_2(capsys):
    # /proc refuses new files even to root, whom permission bits do not stop
    code, _, err = run_cli(capsys, "compile", "zoo:bert-base-tiny", "-o", "/proc/plus_tvm.so")
    assert code == 2 and "cannot write /proc/plus_tvm.so" in one_line_error(err)


@pytest.mark.parametrize("where", ["missing-folder", "a-file"])
def test_an_output_path_that_cannot_be_written_exits_2(tmp_path, capsys, where):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    target = tmp_path / "nope" / "m.so" if where == "missing-folder" else blocker / "m.so"
    import plus_tvm

    def no_compile(*args, **kwargs):
        raise AssertionError("compiled before the output path was checked")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plus_tvm, "compile", no_compile)  # refused before the compilation
        code, _, err = run_cli(capsys, "compile", "zoo:bert-base-tiny", "-o", str(target))
    assert code == 2 and "cannot write" in one_line_error(err)


def test_an_unwritable_dump_ir_folder_exits_2(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _, err = run_cli(
        capsys, "inspect", "zoo:bert-base-tiny", "--opt", f"dump_ir={blocker / 'ir'}"
    )
    assert code == 2 and "dump_ir" in one_line_error(err)
    with pytest.raises(OutputWriteError):
        plus_tvm.compile("zoo:bert-base-tiny", options=plus_tvm.Options(dump_ir=str(blocker)))


def test_a_declared_input_too_large_to_allocate_exits_2(tmp_path, capsys):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "huge",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1 << 20, 1 << 20, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1 << 20, 1 << 20, 64])],
    )
    path = str(tmp_path / "huge.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    code, _, err = run_cli(capsys, "run", path)
    assert code == 2 and "input x" in one_line_error(err) and "GiB" in err


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--budget", "0"], "budget"),
        (["--runs", "-3"], "runs"),
        (["--runs", "0"], "runs"),
        (["--warmup", "-1"], "warmup"),
    ],
)
def test_bench_arguments_are_validated(capsys, args, needle):
    code, _, err = run_cli(capsys, "bench", "zoo:bert-base-tiny", "--no-progress", *args)
    assert code == 2 and needle in one_line_error(err)


# ------------------------------------------------------------------------ weight updates
def test_a_weight_changed_in_place_is_followed():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    model.eval()
    x = torch.randn(3, 8)
    cm = plus_tvm.compile(model, "llvm", example_args=(x,))
    for _ in range(3):  # library weights get packed on their second call
        np.testing.assert_allclose(cm(x.numpy()), model(x).detach().numpy(), atol=1e-5)
    with torch.no_grad():
        model[0].weight.mul_(-2.0)
        model[2].bias.add_(1.0)
    for _ in range(2):
        np.testing.assert_allclose(cm(x.numpy()), model(x).detach().numpy(), atol=1e-5)


def test_a_buffer_compiled_in_as_a_constant_refuses_to_go_stale():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)).eval()
    x = torch.randn(2, 4)
    cm = plus_tvm.compile(model, "llvm", example_args=(x,))
    cm(x.numpy())
    model[1].running_mean.add_(1.0)
    with pytest.raises(InputError, match="running_mean.*compile the model again"):
        cm(x.numpy())


# ------------------------------------------------------------------- Ctrl-C and rule bugs
def test_an_interrupt_inside_a_schedule_rule_is_not_swallowed(monkeypatch):
    from plus_tvm.schedules import GIRLLVM

    def interrupted(self, func, target):
        os.kill(os.getpid(), signal.SIGINT)  # as if Ctrl-C arrived while the rule ran
        time.sleep(0.1)
        return None, "interrupted"

    monkeypatch.setattr(GIRLLVM, "apply_with_reason", interrupted)
    with pytest.raises(KeyboardInterrupt):
        plus_tvm.compile("zoo:bert-base-tiny", "llvm")


def test_a_crashing_schedule_rule_is_reported_with_its_reason(monkeypatch):
    from plus_tvm.schedules import GIRLLVM

    def broken(self, func, target):
        raise TypeError("a bug in the rule")

    monkeypatch.setattr(GIRLLVM, "apply_with_reason", broken)
    with pytest.warns(RuntimeWarning, match="GIRLLVM failed"):
        cm = plus_tvm.compile("zoo:bert-base-tiny", "llvm")
    failed = cm.stats["schedule"]["failed"]
    assert failed and all(f["rule"] == "GIRLLVM" for f in failed)
    assert "TypeError: a bug in the rule" in failed[0]["error"]
    ids = cm.source.example_inputs[0]
    with torch.no_grad():
        ref = cm.source.torch_module(ids)
    ref = ref[0] if isinstance(ref, tuple) else ref
    np.testing.assert_allclose(cm(ids.numpy()), ref.numpy(), atol=1e-4)  # still right


_INTERRUPT_AT_PASS = """
import os, signal, sys
import tvm
from plus_tvm import cli

@tvm.instrument.pass_instrument
class CtrlC:  # Ctrl-C as the user presses it, while a pass runs (no race with the clock)
    def run_before_pass(self, mod, info):
        if info.name == sys.argv[1]:
            os.kill(os.getpid(), signal.SIGINT)

with tvm.transform.PassContext(instruments=[CtrlC()]):
    sys.exit(cli.main(["compile", "zoo:bert-base-tiny", "-o", sys.argv[2]]))
"""


@pytest.mark.parametrize("at_pass", ["PlusDispatch", "DPFuseOps", "ApplyScheduleRules"])
def test_ctrl_c_during_a_compile_exits_130_and_writes_nothing(tmp_path, at_pass):
    out = tmp_path / "m.so"
    proc = subprocess.run(
        [sys.executable, "-c", _INTERRUPT_AT_PASS, at_pass, str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 130, proc.stderr
    assert "interrupted" in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no artifact, no temporary


# ------------------------------------------------------------------------- quiet output
def test_the_cli_is_quiet_by_default(tmp_path):
    def run(*extra: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "plus_tvm.cli", *extra, "inspect", "zoo:gpt2-tiny"],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "PYTHONWARNINGS": "default"},
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stderr

    quiet = run()
    assert "Warning" not in quiet and "warn" not in quiet.lower(), quiet
    assert "FutureWarning" not in quiet


def test_zero_dimensional_inputs_stay_zero_dimensional(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "s"], ["y"])],
        "scalar",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
            helper.make_tensor_value_info("s", TensorProto.FLOAT, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    )
    path = str(tmp_path / "scalar.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    cm = plus_tvm.compile(path, "llvm")
    out = cm(np.arange(3, dtype=np.float32), np.float32(2.5))
    np.testing.assert_array_equal(out, np.arange(3, dtype=np.float32) + 2.5)
    with pytest.raises(InputError, match="s: expected shape"):
        cm(np.arange(3, dtype=np.float32), np.array([2.5], np.float32))


def test_an_internal_error_names_the_phase_and_the_pass(monkeypatch, capsys):
    import plus_tvm.passes.dp_fuse_ops as dp_fuse_ops

    def broken(graph, plan):
        raise ZeroDivisionError("a bug in the plan search")

    monkeypatch.setattr(dp_fuse_ops, "_topological", broken)
    with pytest.raises(InternalCompileError, match="phase fuse, pass DPFuseOps.*plan search"):
        plus_tvm.compile("zoo:bert-base-tiny", "llvm")
    code, _, err = run_cli(capsys, "inspect", "zoo:bert-base-tiny")
    assert code == 1 and "internal error in phase fuse, pass DPFuseOps" in err
    assert "--opt fusion=tvm" in err  # the option that compiles without the failing pass
    assert "Traceback" not in err
    # and it does: the suggestion is one that works
    cm = plus_tvm.compile("zoo:bert-base-tiny", "llvm", options=plus_tvm.Options(fusion="tvm"))
    assert cm.stats["kernels"] > 0


def test_relu_and_clamp_keep_the_sign_of_zero_as_torch_does():
    x = torch.tensor([[-0.0, 0.0, float("nan"), -1.0, 2.0, float("inf"), -float("inf"), 7.0]])

    class ReluClamp(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x), torch.clamp(x, -0.5, 6.0)

    cm = plus_tvm.compile(ReluClamp(), "llvm", example_args=(x,))
    for out, ref in zip(cm(x.numpy()), ReluClamp()(x)):
        ref = ref.numpy()
        np.testing.assert_array_equal(out, ref)  # NaN == NaN here
        np.testing.assert_array_equal(np.signbit(out), np.signbit(ref))
