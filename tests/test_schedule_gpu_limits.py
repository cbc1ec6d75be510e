"""A schedule the GPU could not run is declined, and the next rule takes the kernel.

dlight's ``GeneralReduction`` caches a fused reduction's whole output in static shared memory:
VGG-16's last max-pool fused with the flatten (512x7x7 floats, 98 KiB) compiled for sm_90, and
the CUDA module then failed to load on an H200 (static ``__shared__`` arrays are capped at
48 KiB per block), a failure no compile-time step of TVM reports."""

from __future__ import annotations

import json
import re

import tvm
from plus_tvm import Options, zoo
from plus_tvm.compiler import compile as plus_compile
from plus_tvm.passes import ApplyScheduleRules
from plus_tvm.passes.apply_schedule_rules import STATIC_SHARED_LIMIT
from plus_tvm.tir_blocks import static_shared_bytes
from tvm import te
from tvm.s_tir import dlight as dl
from tvm.s_tir.dlight.base.schedule_rule import ScheduleRule

SM90 = {"kind": "cuda", "arch": "sm_90"}


def _pool_then_flatten(channels: int) -> tvm.IRModule:
    x = te.placeholder((1, channels, 14, 14), name="x")
    rh = te.reduce_axis((0, 2), name="rh")
    rw = te.reduce_axis((0, 2), name="rw")
    pool = te.compute(
        (1, channels, 7, 7),
        lambda n, c, h, w: te.max(x[n, c, h * 2 + rh, w * 2 + rw], axis=[rh, rw]),
        name="pool",
    )
    flat = te.compute(
        (1, channels * 49), lambda n, i: pool[0, i // 49, (i // 7) % 7, i % 7], name="flat"
    )
    func = te.create_prim_func([x, flat]).with_attr("global_symbol", "pool_flat")
    return tvm.IRModule({"pool_flat": func})


def test_a_schedule_over_the_shared_memory_limit_is_declined():
    mod = _pool_then_flatten(512)
    target = tvm.target.Target(SM90)
    with target:
        alone = dl.gpu.GeneralReduction().apply(mod["pool_flat"], target, False)
        out = ApplyScheduleRules(dl.gpu.GeneralReduction(), dl.gpu.Fallback())(mod)
    assert static_shared_bytes(alone.mod["main"]) == 512 * 49 * 4  # the whole pooled map
    report = json.loads(out.attrs["plus.schedule"])
    assert report["scheduled"] == {"Fallback": 1}
    (reason,) = report["declined_because"]["GeneralReduction"]
    assert "100352 bytes" in reason and str(STATIC_SHARED_LIMIT) in reason
    assert static_shared_bytes(out["pool_flat"]) <= STATIC_SHARED_LIMIT


def test_a_schedule_within_the_limit_is_kept():
    mod = _pool_then_flatten(64)  # 12.25 KiB cached: fine
    target = tvm.target.Target(SM90)
    with target:
        out = ApplyScheduleRules(dl.gpu.GeneralReduction(), dl.gpu.Fallback())(mod)
    report = json.loads(out.attrs["plus.schedule"])
    assert report["scheduled"] == {"GeneralReduction": 1}
    assert report["declined_because"] == {}


class _Given(ScheduleRule):
    """A rule returning a schedule made beforehand, whatever the target."""

    def __init__(self, sch) -> None:  # noqa: ANN001
        self.sch = sch

    def apply(self, func, target, tunable):  # noqa: ANN001, ANN201, ARG002
        return self.sch


def test_the_limit_is_a_gpu_limit():
    mod = _pool_then_flatten(512)
    with tvm.target.Target(SM90) as gpu:
        sch = dl.gpu.GeneralReduction().apply(mod["pool_flat"], gpu, False)
    with tvm.target.Target("llvm"):
        out = ApplyScheduleRules(_Given(sch))(mod)
    assert json.loads(out.attrs["plus.schedule"])["scheduled"] == {"_Given": 1}


def test_vgg16_kernels_fit_a_block_s_static_shared_memory():
    """Every kernel of the full VGG-16 built for sm_90 declares at most 48 KiB of __shared__."""
    entry = zoo.get("vgg16")
    compiled = plus_compile(
        entry.build(0), SM90, entry.example_inputs(0), options=Options(cuda_graph="off")
    )
    (cuda,) = [m for m in compiled.executable.mod.imports[0].imports if m.kind == "cuda"]
    source = cuda.inspect_source()
    kernels = re.split(r'extern "C" __global__', source)[1:]
    assert kernels
    for body in kernels:
        used = sum(
            int(n) * 4 for n in re.findall(r"__shared__ alignas\(\d+\) float \w+\[(\d+)\]", body)
        )
        assert used <= STATIC_SHARED_LIMIT, body.split("(")[0]


def test_what_counts_is_the_memory_one_block_keeps_after_lowering():
    """A schedule declares shared buffers at full size; lowering places each where it is used
    and compacts it to one thread block's region. GIR's softmax over 64 rows of 1000 declares
    the whole 64x1000 input (250 KiB) but a block keeps one row: it is kept."""
    from gir_kernels import fused_primfunc
    from plus_tvm.schedules import GIRCUDA

    target = tvm.target.Target(SM90)
    func = fused_primfunc("softmax", [64, 1000], target)
    mod = tvm.IRModule({"softmax": func.with_attr("global_symbol", "softmax")})
    with target:
        alone = GIRCUDA().apply(func, target, False)
        out = ApplyScheduleRules(GIRCUDA(), dl.gpu.Fallback())(mod)
    assert static_shared_bytes(alone.mod["main"]) > STATIC_SHARED_LIMIT  # as declared
    assert json.loads(out.attrs["plus.schedule"])["scheduled"] == {"GIRCUDA": 1}


def test_a_schedule_tvm_cannot_lower_is_declined():
    """GIR's CUDA row schedule of a softmax over rows of one element (MobileViT's attention
    over a 1x1 patch grid) puts a ``__syncthreads`` under a thread-dependent condition, which
    TVM's ``ThreadSync`` refuses at build time: the schedule is declined, the next rule takes the
    kernel and the model compiles."""
    from gir_kernels import fused_primfunc
    from plus_tvm.schedules import GIRCUDA

    target = tvm.target.Target(SM90)
    func = fused_primfunc("softmax", [16, 1], target)
    mod = tvm.IRModule({"softmax": func})
    with target:
        out = ApplyScheduleRules(GIRCUDA(), dl.gpu.Fallback())(mod)
        main = out["softmax"].with_attr("global_symbol", "main")
        tvm.compile(tvm.IRModule({"main": main}), target)  # no schedule TVM cannot lower
    report = json.loads(out.attrs["plus.schedule"])
    assert report["scheduled"] == {"Fallback": 1}
    (reason,) = report["declined_because"]["GIRCUDA"]
    assert "TVM's lowering refused the schedule" in reason and "syncs inside condition" in reason
