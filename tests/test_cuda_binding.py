"""Every GPU kernel bound to GPU threads (issue 36, CUDA half compile): blocks the schedule
rules leave on the host are bound by BindUnboundGPUBlocks or refused by name; dlight's Matmul is
never offered its WMMA path, whose tensorize segfaults in TVM 0.27. CUDA code generation only
(no GPU needed)."""

from __future__ import annotations

import sys
import types

import pytest
import torch
import tvm
from plus_tvm.compile_inputs import resolve_inputs
from plus_tvm.gpu_binding import unbound_blocks
from plus_tvm.loader import load_model
from plus_tvm.options import Options
from plus_tvm.passes.bind_unbound_gpu_blocks import BindUnboundGPUBlocks
from plus_tvm.pipeline import phase_passes, schedule_phase
from plus_tvm.schedules.matmul_without_tensor_cores import (
    MatmulWithoutTensorCores,
    would_tensorize,
)
from tvm.s_tir import dlight as dl
from tvm.script import tirx as T  # noqa: N812

SM90 = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})


class _Residual(torch.nn.Module):
    """ResNet's first block in miniature: the pooled input (float32 inside, cast to half) feeds
    a 1x1 convolution with batch norm and, as a second output of the same fused kernel, the
    shortcut convolution."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(16, 8, 1, bias=False)
        self.bn = torch.nn.BatchNorm2d(8)
        self.short = torch.nn.Conv2d(16, 8, 1, bias=False)

    def forward(self, x):
        p = torch.nn.functional.max_pool2d(x, 2)
        return torch.relu(self.bn(self.conv(p))) + self.short(p)


def _prim_funcs(mod):
    return {g.name_hint: f for g, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_tiny_half_model_compiles_for_cuda_with_every_kernel_bound(dtype):
    model = _Residual().eval().to(dtype)
    loaded = load_model(model, (torch.randn(1, 16, 32, 32).to(dtype),))
    options = resolve_inputs(SM90, Options())
    with SM90:
        mod = tvm.transform.Sequential(
            phase_passes(SM90, options, ("dispatch", "legalize", "fuse"))
        )(loaded.mod)
        host_loops = {}
        for p in schedule_phase(SM90, options):
            if p.info.name == "BindUnboundGPUBlocks":  # what the rules alone leave
                host_loops = {n: unbound_blocks(f) for n, f in _prim_funcs(mod).items()}
            mod = p(mod)
    assert any(host_loops.values()), "the rules alone bind everything: the test lost its case"
    funcs = _prim_funcs(mod)
    assert funcs and all(unbound_blocks(f) == [] for f in funcs.values())
    tir = tvm.IRModule({n: f.with_attr("global_symbol", n) for n, f in funcs.items()})
    tvm.tirx.build(tir, target=SM90)  # CUDA code generation (bf16 failed here before)


@T.prim_func(private=True, s_tir=True)
def _shared_host_nest(a: T.Buffer((64,), "float32"), b: T.Buffer((64,), "float32")):
    for i in range(64):  # one host loop around two blocks: no fallback mapping binds it
        with T.sblock("first"):
            vi = T.axis.spatial(64, i)
            b[vi] = a[vi] * T.float32(2)
        with T.sblock("second"):
            vi = T.axis.spatial(64, i)
            b[vi] = b[vi] + T.float32(1)


@T.prim_func(private=True, s_tir=True)
def _plain(a: T.Buffer((64, 32), "float32"), b: T.Buffer((64,), "float32")):
    for i, k in T.grid(64, 32):
        with T.sblock("rowsum"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                b[vi] = T.float32(0)
            b[vi] = b[vi] + a[vi, vk]


def test_an_unbindable_kernel_is_refused_by_name():
    mod = tvm.IRModule({"shared_nest": _shared_host_nest})
    assert unbound_blocks(_shared_host_nest) == ["first", "second"]
    # (InternalCompileError; TVM's pass manager hands it on as a RuntimeError, which the
    # compile API names with the phase and the pass)
    with SM90, pytest.raises(RuntimeError, match="GPU kernel shared_nest: blocks first, second"):
        BindUnboundGPUBlocks()(mod)


def test_an_unscheduled_kernel_gets_the_fallback_mapping_and_llvm_is_untouched():
    mod = tvm.IRModule({"rowsum": _plain})
    with SM90:
        out = BindUnboundGPUBlocks()(mod)
    assert unbound_blocks(_plain) == ["rowsum"] and unbound_blocks(out["rowsum"]) == []
    tvm.tirx.build(tvm.IRModule({"rowsum": out["rowsum"].with_attr("global_symbol", "r")}), SM90)
    with tvm.target.Target("llvm"):
        assert BindUnboundGPUBlocks()(mod).same_as(mod)


def _matmul(dtype: str, acc: str):
    @T.prim_func(private=True, s_tir=True)
    def mm(a: T.Buffer((128, 128), dtype), b: T.Buffer((128, 128), dtype),
           c: T.Buffer((128, 128), acc)):
        for i, j, k in T.grid(128, 128, 128):
            with T.sblock("C"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    c[vi, vj] = T.Cast(acc, 0)
                c[vi, vj] = c[vi, vj] + T.Cast(acc, a[vi, vk]) * T.Cast(acc, b[vk, vj])

    return mm


def test_which_matmuls_dlight_would_tensorize():
    assert would_tensorize(_matmul("float16", "float32"), SM90)
    assert not would_tensorize(_matmul("bfloat16", "float32"), SM90)
    assert not would_tensorize(_matmul("float32", "float32"), SM90)
    assert not would_tensorize(_matmul("float16", "float32"), tvm.target.Target("llvm"))
    old = tvm.target.Target({"kind": "cuda", "arch": "sm_61"})
    assert not would_tensorize(_matmul("float16", "float32"), old)


class _Intrinsics(types.ModuleType):
    """The stand-in module: records every name read from it (an import of it reads them)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.read: list[str] = []

    def __getattribute__(self, name: str):
        if not name.startswith("__") and name != "read":
            object.__getattribute__(self, "read").append(name)
        return super().__getattribute__(name)


def _no_tensor_core_intrinsics(monkeypatch) -> _Intrinsics:
    """dlight's WMMA intrinsics, as tensorization rules import them, replaced by a module whose
    ``get_wmma_intrin_group`` (the first use of an intrinsic: the start of the crashing path)
    raises. The real module's import registers every target's intrinsics (~20 s on 2 cores);
    restored after the test."""

    def entered(*args, **kwargs):
        raise RuntimeError("dlight entered its WMMA tensorization path")

    package = types.ModuleType("tvm.s_tir.tensor_intrin")
    package.__path__ = []
    cuda = _Intrinsics("tvm.s_tir.tensor_intrin.cuda")
    cuda.get_wmma_intrin_group = entered
    package.cuda = cuda
    monkeypatch.setitem(sys.modules, package.__name__, package)
    monkeypatch.setitem(sys.modules, cuda.__name__, cuda)
    return cuda


def test_float16_matmul_is_scheduled_without_the_crashing_tensor_core_path(monkeypatch):
    # dlight's own gpu.Matmul takes its WMMA path on this function (whose tensorize kills the
    # process, SIGSEGV): here the path raises where it starts, so no child process is needed
    intrinsics = _no_tensor_core_intrinsics(monkeypatch)
    func = _matmul("float16", "float32")
    with SM90, pytest.raises(RuntimeError, match="entered its WMMA"):
        dl.gpu.Matmul().apply(func, SM90, False)  # (the test sees the path: it is taken)
    intrinsics.read.clear()
    with SM90:
        sch = MatmulWithoutTensorCores().apply(func, SM90, False)
    assert sch is not None and unbound_blocks(sch.mod["main"]) == []
    # nor are the intrinsics imported (the real import: 23 s of CPU per process)
    assert intrinsics.read == []


def test_a_schedule_tvm_lowers_into_a_type_error_is_declined_not_fatal():
    """Tiny ResNet-50 in bfloat16 for CUDA: dlight's matmul schedule of two fused
    convolution kernels (the block's batch-norm statistics copies left unbound) makes TVM's
    BF16StorageLegalize store a bfloat16 value into uint16 storage, a TypeError. The rule's
    schedule is declined with TVM's reason and the next rule schedules the kernel, where the
    TypeError used to fail the whole compile."""
    import plus_tvm

    loaded = load_model("zoo:resnet50-tiny")
    model = loaded.torch_module.eval().to(torch.bfloat16)
    args = tuple(a.to(torch.bfloat16) for a in loaded.example_inputs)
    compiled = plus_tvm.compile(model, "cuda", example_args=args)
    report = compiled.stats["schedule"]
    reasons = report["declined_because"].get("MatmulWithoutTensorCores", {})
    assert any("dtype mismatch on BufferStore" in r for r in reasons), reasons
    assert report["unscheduled"] == 0 and not report["failed"]
