"""End to end: every tiny zoo model through both frontends and the plus pipeline vs torch eager.

The tolerance is per model (max abs error against torch eager, fp32); measured errors are
around 1e-6, the bounds leave a margin of ~10x without letting a wrong kernel through (a wrong
fusion or importer bug gives errors of order 1e-1 or NaN).
"""

from __future__ import annotations

import numpy as np
import plus_tvm
import pytest
import torch
from _shared_zoo import zoo_compiled
from plus_tvm import zoo

# max abs error vs torch eager allowed per tiny model (outputs have std 0.1 .. 1)
TOLERANCE = {
    "albert-base-tiny": 5e-5,
    "bert-base-tiny": 5e-5,
    "efficientnet-b0-tiny": 5e-5,
    "gpt2-tiny": 5e-5,
    "llama-tiny": 5e-5,
    "mobilenetv2-tiny": 1e-4,
    "resnet50-tiny": 1e-4,
    "t5-encoder-tiny": 5e-5,
    "vgg16-tiny": 5e-5,
    "vit-tiny": 5e-5,
}


def test_every_tiny_model_has_a_tolerance():
    assert sorted(TOLERANCE) == sorted(n for n in zoo.names() if n.endswith("-tiny"))


def _eager(name: str) -> tuple[tuple, np.ndarray]:
    module, args = zoo.load(name)
    with torch.inference_mode():
        return args, module(*args).numpy()


@pytest.mark.parametrize("name", sorted(TOLERANCE))
def test_torch_frontend_plus_pipeline_matches_eager(name):
    args, ref = _eager(name)
    compiled = zoo_compiled(name)  # plus_tvm.compile(f"zoo:{name}", "llvm"), once per session
    out = compiled(*args)
    assert out.shape == ref.shape
    err = float(np.abs(out - ref).max())
    assert err <= TOLERANCE[name], f"{name}: max abs err {err:.2e}"
    stats = compiled.stats
    assert 0 < stats["kernels"] < stats["ops"], stats  # fusion happened on the CPU


@pytest.mark.parametrize("name", sorted(TOLERANCE))
def test_onnx_frontend_plus_pipeline_matches_eager(name, tmp_path):
    args, ref = _eager(name)
    path = zoo.export_onnx(name, str(tmp_path / f"{name}.onnx"))
    compiled = plus_tvm.compile(path, "llvm")
    assert [s.name for s in compiled.inputs] == list(zoo.get(name).input_names())
    out = compiled(*[a.numpy() for a in args])
    out = out[0] if isinstance(out, tuple) else out
    err = float(np.abs(out - ref).max())
    assert err <= TOLERANCE[name], f"{name}: max abs err {err:.2e}"
