"""StageGraphInputs / StageGraphOutputs: library kernels reading a model input or writing the
returned tensor move into the CUDA graph (sm_90 code, no GPU needed); the staged program computes
the same values (run on the CPU, where the same passes apply)."""

from __future__ import annotations

import numpy as np
import plus_tvm
import pytest
import tvm
from plus_tvm import Options, zoo
from plus_tvm.compiler import pre_lowering
from plus_tvm.loader import load_model
from plus_tvm.passes import StageGraphInputs, StageGraphOutputs
from plus_tvm.pipeline import PHASE_NAMES, phase_passes
from plus_tvm.target import resolve_target
from tvm import relax

CUDA = {"kind": "cuda", "arch": "sm_90"}


def _library_calls(func: relax.Function) -> list[str]:
    return [
        str(b.value.op.global_symbol)
        for block in func.body.blocks
        for b in block.bindings
        if isinstance(b.value, relax.Call)
        and isinstance(b.value.op, relax.ExternFunc)
        and not str(b.value.op.global_symbol).startswith("vm.")
    ]


def _lowered(name: str, target: object, options: Options):
    model, inputs = zoo.load(name)
    tgt = resolve_target(target)
    loaded = load_model(model, inputs)
    mod, _ = pre_lowering(loaded, tgt, options, "plus")
    with tgt:
        low = tvm.transform.Sequential(phase_passes(tgt, options, PHASE_NAMES[4:5]))(mod)
    return model, inputs, tgt, low


@pytest.mark.parametrize("cuda_graph, outside", [("off", None), ("always", [])])
def test_no_library_call_is_left_outside_the_graph_of_vit(cuda_graph, outside):
    model, inputs, tgt, low = _lowered("vit-tiny", CUDA, Options(cuda_graph=cuda_graph))
    with tgt:
        final = tvm.transform.Sequential(
            phase_passes(tgt, Options(cuda_graph=cuda_graph), PHASE_NAMES[5:])
        )(low)
    left = _library_calls(final["main"])
    if outside is None:  # without graphs every library call is in main
        assert len(left) > 2
    else:  # the input's plus.conv2d and the output's plus.linear_layernorm are captured now
        assert left == outside
        captured = [f for g, f in final.functions_items() if "cuda_graph_capture" in g.name_hint]
        assert any("plus.conv2d" in _library_calls(f) for f in captured)


@pytest.mark.parametrize("name", ["vit-tiny", "gpt2-tiny"])
def test_staged_program_computes_the_same_values(name):
    model, inputs, tgt, low = _lowered(name, "llvm", Options())
    inputs_pass, outputs_pass = StageGraphInputs(tgt, min_readers=1), StageGraphOutputs(tgt)
    with tgt:
        staged = outputs_pass(inputs_pass(low))
        final = tvm.transform.Sequential(phase_passes(tgt, Options(), PHASE_NAMES[5:]))(staged)
    assert inputs_pass.staged and outputs_pass.staged
    assert not low.same_as(staged) and "plus_stage_copy" not in low.script()  # input untouched
    vm = relax.VirtualMachine(tvm.compile(final, tgt, relax_pipeline=None), tvm.cpu())
    weights = plus_tvm.compile(model, example_args=inputs)._current_weights()
    out = vm["main"](*[tvm.runtime.tensor(i.numpy()) for i in inputs], *weights)
    np.testing.assert_allclose(out.numpy(), model(*inputs).numpy(), rtol=1e-5, atol=1e-5)


def test_an_input_read_by_one_generated_kernel_is_staged_by_default_only():
    _, _, tgt, low = _lowered("bert-base-tiny", CUDA, Options(cuda_graph="always"))
    stage = StageGraphInputs(tgt)
    stage(low)
    assert stage.staged == {"input_ids": 1 * 16 * 8}  # so the embedding gather is captured
    only_shared = StageGraphInputs(tgt, min_readers=2)
    only_shared(low)
    assert only_shared.staged == {}  # input_ids feeds only the embedding gather
