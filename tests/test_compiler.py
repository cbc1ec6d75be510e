"""plus_tvm.compile / CompiledModel / inspect / load: numerics, stats contract, inputs, export."""

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
from plus_tvm import InputError, ModelLoadError, PlusError
from small_models import SmallNet

# fp32 with a different summation order than torch's kernels: a few ulps on O(1) outputs.
RTOL = 1e-4
ATOL = 1e-5


class TwoInTwoOut(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 5)

    def forward(self, x: torch.Tensor, y: torch.Tensor):
        h = self.fc(x)
        return torch.relu(h) * y, h.sum(dim=-1)


def _eager(model: torch.nn.Module, *args: torch.Tensor):
    with torch.no_grad():
        out = model(*args)
    return tuple(o.numpy() for o in out) if isinstance(out, tuple) else out.numpy()


@pytest.fixture(scope="module")
def small(strict):
    torch.manual_seed(0)
    model = SmallNet().eval()
    x = torch.randn(2, 8)
    with strict():
        plus = plus_tvm.compile(model, "llvm", (x,))
        baseline = plus_tvm.compile(model, "llvm", (x,), pipeline="tvm")
    return model, x, plus, baseline


@pytest.fixture(scope="module")
def two_out(strict):
    torch.manual_seed(0)
    model = TwoInTwoOut().eval()
    args = (torch.randn(3, 6), torch.randn(3, 5))
    with strict():
        compiled = plus_tvm.compile(model, "llvm", args)
    return model, args, compiled


# --------------------------------------------------------------------------------- numerics
def test_matches_torch_eager(small):
    model, x, plus, _ = small
    got = plus(x)  # a torch tensor in: a torch tensor out
    assert isinstance(got, torch.Tensor) and got.shape == (2, 4) and got.dtype == torch.float32
    np.testing.assert_allclose(got, _eager(model, x), rtol=RTOL, atol=ATOL)
    from_numpy = plus(x.numpy())  # numpy in: numpy out
    assert isinstance(from_numpy, np.ndarray) and from_numpy.dtype == np.float32
    np.testing.assert_array_equal(from_numpy, got.numpy())
    x2 = torch.randn(2, 8)  # not just the example input
    np.testing.assert_allclose(plus(x2), _eager(model, x2), rtol=RTOL, atol=ATOL)


def test_tvm_pipeline_same_numerics_comparable_kernels(small):
    model, x, plus, baseline = small
    np.testing.assert_allclose(baseline(x), plus(x), rtol=RTOL, atol=ATOL)
    assert baseline.stats["pipeline"] == "tvm" and plus.stats["pipeline"] == "plus"
    assert baseline.stats["ops"] == plus.stats["ops"]  # same import
    assert 0 < plus.stats["kernels"] <= baseline.stats["kernels"] < baseline.stats["ops"]


def test_unknown_pipeline_rejected(small):
    model, x, _, _ = small
    with pytest.raises(PlusError, match="unknown pipeline 'fast'"):
        plus_tvm.compile(model, "llvm", (x,), pipeline="fast")


# ------------------------------------------------------------------------------------ stats
def test_stats_contract(small):
    model, _, plus, _ = small
    s = plus.stats
    expected_types = {
        "model": str,
        "target": str,
        "pipeline": str,
        "ops": int,
        "gemm_flops": int,
        "kernels": int,
        "fusion_ratio": float,
        "library_calls": int,
        "patterns": dict,
        "groups": list,
        "compile_s": float,
    }
    for key, typ in expected_types.items():
        assert isinstance(s[key], typ), (key, s.get(key))
    assert s["model"] == "SmallNet"
    assert s["target"].startswith("llvm")
    assert s["pipeline"] == "plus"
    # linear = permute + matmul + add (x2), gelu, layer_norm
    assert s["ops"] == 8
    assert s["gemm_flops"] == 2 * 2 * 8 * 16 + 2 * 2 * 16 * 4  # x[2, 8] @ [8, 16], then @ [16, 4]
    assert s["fusion_ratio"] == pytest.approx(s["ops"] / s["kernels"], rel=1e-3)
    assert s["fusion_ratio"] > 1  # fusion happened
    assert s["library_calls"] == 0 and s["patterns"] == {}
    assert 0 < s["compile_s"] < 60
    # every group lists its member kernels; the bias add joins a matmul in some group
    assert any("matmul" in g["ops"] and "add" in g["ops"] for g in s["groups"])
    assert all(isinstance(g["name"], str) and isinstance(g["ops"], list) for g in s["groups"])
    json.dumps(s)  # the CLI prints it as JSON


def test_inspect_matches_compile(small):
    model, x, plus, baseline = small
    stats = plus_tvm.inspect(model, example_args=(x,))
    assert stats["kernels"] == plus.stats["kernels"]
    assert stats["ops"] == plus.stats["ops"]
    assert stats["groups"] == plus.stats["groups"]
    tvm_stats = plus_tvm.inspect(model, example_args=(x,), pipeline="tvm")
    assert tvm_stats["kernels"] == baseline.stats["kernels"]


def test_repr_and_html(small):
    _, _, plus, _ = small
    s = plus.stats
    text = repr(plus)
    assert f"kernels={s['kernels']}" in text and "SmallNet" in text
    page = plus._repr_html_()
    assert f"<td>{s['kernels']}</td>" in page and f"<td>{s['ops']}</td>" in page
    assert "SmallNet" in page and "fusion_ratio" in page
    assert f"fused groups ({len(s['groups'])})" in page
    for group in s["groups"]:
        assert group["name"] in page and " -&gt; ".join(group["ops"]) in page


# ----------------------------------------------------------------------------------- inputs
def test_torch_and_numpy_inputs_agree(small):
    _, x, plus, _ = small
    from_numpy = plus(x.numpy())
    from_torch = plus(x)
    from_grad = plus(x.clone().requires_grad_(True))
    np.testing.assert_array_equal(from_numpy, from_torch)
    np.testing.assert_array_equal(from_grad, from_torch)
    np.testing.assert_array_equal(plus(np.asfortranarray(x.numpy())), from_torch)


def test_wrong_input_count(small):
    _, x, plus, _ = small
    with pytest.raises(InputError, match=r"takes 1 input\(s\) \(x\), got 2"):
        plus(x, x)
    with pytest.raises(InputError, match="got 0"):
        plus()


def test_wrong_dtype(small):
    _, x, plus, _ = small
    with pytest.raises(InputError, match="input x: expected dtype float32, got float64"):
        plus(x.double())


@pytest.mark.parametrize("shape", [(3, 8), (2, 9), (2, 8, 1), (16,)])
def test_wrong_shape(small, shape):
    _, _, plus, _ = small
    with pytest.raises(InputError, match=r"input x: expected shape \(2, 8\)"):
        plus(np.zeros(shape, dtype="float32"))


def test_symbolic_dims_must_agree(strict):
    class Add(torch.nn.Module):
        def forward(self, a, b):
            return a * 2 + b

    batch = torch.export.Dim("batch")
    mod, params = plus_tvm.from_torch(
        Add(),
        (torch.randn(3, 4), torch.randn(3, 4)),
        dynamic_shapes={"a": {0: batch}, "b": {0: batch}},
    )
    compiled = plus_tvm.compile((mod, params))
    a, b = np.ones((5, 4), "float32"), np.ones((5, 4), "float32")
    np.testing.assert_array_equal(compiled(a, b), np.full((5, 4), 3, "float32"))
    with pytest.raises(InputError, match="input b: symbolic dim .* is 2 here but 5"):
        compiled(a, np.ones((2, 4), "float32"))


def test_tuple_outputs(two_out):
    model, (x, y), compiled = two_out
    out = compiled(x, y)
    assert isinstance(out, tuple) and len(out) == 2
    assert all(isinstance(o, torch.Tensor) for o in out)  # torch in, torch out
    assert all(isinstance(o, np.ndarray) for o in compiled(x.numpy(), y.numpy()))
    for got, expected in zip(out, _eager(model, x, y)):
        np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)
    with pytest.raises(InputError, match="input y: expected shape"):
        compiled(x, torch.randn(3, 6))


# ---------------------------------------------------------------------------- export / load
def test_export_library_and_load_in_fresh_process(two_out, tmp_path):
    _, (x, y), compiled = two_out
    lib = tmp_path / "two_out.so"
    assert compiled.export_library(str(lib)) == str(lib)
    for suffix in ("", ".params", ".json"):
        assert (tmp_path / f"two_out.so{suffix}").exists()
    np.save(tmp_path / "x.npy", x.numpy())
    np.save(tmp_path / "y.npy", y.numpy())
    code = textwrap.dedent(
        f"""
        import json, numpy as np, plus_tvm
        m = plus_tvm.load({str(lib)!r})
        out = m(np.load({str(tmp_path / "x.npy")!r}), np.load({str(tmp_path / "y.npy")!r}))
        np.savez({str(tmp_path / "out.npz")!r}, *out)
        print(json.dumps({{"kernels": m.stats["kernels"],
                          "inputs": [s.name for s in m.inputs]}}))
        """
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    info = json.loads(run.stdout.strip().splitlines()[-1])
    assert info == {"kernels": compiled.stats["kernels"], "inputs": ["x", "y"]}
    saved = np.load(tmp_path / "out.npz")
    expected = compiled(x, y)
    for i, exp in enumerate(expected):
        np.testing.assert_array_equal(saved[f"arr_{i}"], exp)


def test_load_in_process_checks_inputs(two_out, tmp_path):
    _, (x, y), compiled = two_out
    lib = compiled.export_library(str(tmp_path / "m.so"))
    loaded = plus_tvm.load(lib)
    for got, exp in zip(loaded(x, y), compiled(x, y)):
        np.testing.assert_array_equal(got, exp)
    with pytest.raises(InputError, match="input x: expected dtype float32"):
        loaded(x.double(), y)


def test_cpu_weights_are_held_once(small, tmp_path):
    """On the CPU a loaded model's VM runs on the weight tensors it holds: no second copy."""
    _, x, plus, _ = small
    cm = plus_tvm.load(plus.export_library(str(tmp_path / "w.so")))
    np.testing.assert_array_equal(cm(x), plus(x))
    held = cm._weights  # noqa: SLF001
    placed = cm._current_weights()  # noqa: SLF001
    assert len(placed) == len(held) > 0
    assert all(isinstance(b, tvm.runtime.Tensor) and a is b for a, b in zip(placed, held))


def test_load_errors(two_out, tmp_path):
    with pytest.raises(ModelLoadError, match="missing.*nothing.so"):
        plus_tvm.load(str(tmp_path / "nothing.so"))
    _, _, compiled = two_out
    lib = compiled.export_library(str(tmp_path / "m.so"))
    (tmp_path / "m.so.json").write_text(json.dumps({"format": "something/else"}))
    with pytest.raises(ModelLoadError, match="not a plus_tvm compiled-model"):
        plus_tvm.load(lib)


# ------------------------------------------------------------------------- edge cases
def test_missing_weights_is_a_model_load_error():
    mod, _ = plus_tvm.from_torch(torch.nn.Linear(4, 3).eval(), (torch.randn(2, 4),))
    with pytest.raises(ModelLoadError, match="p_weight"):
        plus_tvm.compile(mod)


@pytest.mark.skipif(
    tvm.cuda(0).exist,
    reason="a GPU is present: compiling for it simply works",
)
def test_compile_for_cuda_without_gpu_is_clear(tmp_path):
    # Code generation needs no GPU: the model compiles and exports; running it says why not.
    compiled = plus_tvm.compile(torch.nn.Linear(4, 3).eval(), "cuda", (torch.randn(2, 4),))
    lib = str(tmp_path / "m.so")
    assert compiled.export_library(lib) == lib
    assert os.path.getsize(lib) > 0
    assert compiled.stats["kernels"] >= 1
    with pytest.raises(PlusError, match="no cuda"):
        compiled(np.zeros((2, 4), dtype="float32"))


class Tied(torch.nn.Module):
    """An embedding and an output projection that share one weight (GPT-2's wte / lm_head)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.mid = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, 50, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(torch.tanh(self.mid(self.emb(ids))))


def test_tied_weights_are_held_placed_and_exported_once(tmp_path):
    torch.manual_seed(0)
    model = Tied().eval()
    ids = torch.randint(0, 50, (2, 7))
    cm = plus_tvm.compile(model, "llvm", (ids,))
    with torch.no_grad():
        expected = model(ids).numpy()
    np.testing.assert_allclose(cm(ids), expected, rtol=1e-5, atol=1e-5)
    held = cm._weights  # noqa: SLF001
    shared = [(i, j) for i in range(len(held)) for j in range(i) if held[i] is held[j]]
    assert len(shared) == 1  # the embedding table and the head: one object
    placed = cm._current_weights()  # noqa: SLF001
    i, j = shared[0]
    assert placed[i] is placed[j]
    lib = cm.export_library(str(tmp_path / "tied.so"))
    meta = json.loads((tmp_path / "tied.so.json").read_text())
    assert meta["aliases"] == {str(i): j}
    table = tvm.runtime.load_param_dict((tmp_path / "tied.so.params").read_bytes())
    assert len(table) == len(held) - 1
    again = plus_tvm.load(lib)
    assert again._weights[i] is again._weights[j]  # noqa: SLF001
    np.testing.assert_allclose(again(ids), expected, rtol=1e-5, atol=1e-5)
    # the tied torch weight updated in place: both uses see the new values
    with torch.no_grad():
        model.emb.weight.mul_(0.5)
        expected = model(ids).numpy()
    np.testing.assert_allclose(cm(ids), expected, rtol=1e-5, atol=1e-5)
    # a damaged alias table is a clear load error
    meta["aliases"] = {str(j): i} if i > j else {"0": 5}
    (tmp_path / "tied.so.json").write_text(json.dumps(meta))
    with pytest.raises(ModelLoadError, match="aliases"):
        plus_tvm.load(lib)
