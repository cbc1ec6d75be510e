"""``gpu_check --profile`` (issue 39 item 1): the kernels of profiled inferences classified by
kind, counted and timed per inference, with each inference's busy time and idle gaps; tested on
synthetic kernel events shaped like torch.profiler's (the profiled run itself needs a GPU)."""

from __future__ import annotations

import enum
from types import SimpleNamespace

import pytest
from plus_tvm.errors import PlusError
from plus_tvm.gpu.profile import (
    KINDS,
    MARK,
    KernelEvent,
    busy_and_gaps,
    classify,
    kernel_events,
    profile_table,
    summarize,
    tir_function,
)

NAMES = {
    "sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n_tilesize128x128x32_warpgroupsize1x1x1_execute": "gemm",
    "cutlass_80_simt_sgemm_128x32_8x5_nn_align1": "gemm",
    "sgemm_largek_lds64": "gemm",
    "void scal_kernel<float, float, 1, true, 6, 5, 5, 3>(cublasTransposeParams<float>, float "
    "const*, float*, float const*)": "gemm",
    "scal_kernel": "gemm",  # cuBLAS's, though shaped like a TVM kernel name
    "splitKreduce_kernel": "gemm",
    "fused_conv2d_NCHWc_add_relu_kernel": "tir",
    "void cublasLt::epilogue::impl::globalKernel<8, 32, float, float, true, false>()": "gemm",
    "triton_tem_fused_addmm_0": "gemm",
    "fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float, "
    "cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)": "attention",
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128>>(Flash_fwd_params)": (
        "attention"
    ),
    "sm90_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x32": "conv",
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float, false>"
    "(int, float, float const*, float const*, float const*, float*, float*, float*)": "norm",
    "triton_per_fused_add_native_layer_norm_3": "norm",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps>>()": (
        "reduction"
    ),
    "triton_red_fused_mean_2": "reduction",
    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>()": (
        "elementwise"
    ),
    "triton_poi_fused_convolution_relu_1": "elementwise",  # an epilogue, not the convolution
    "void at::native::elementwise_kernel<128, 2, at::native::direct_copy_kernel_cuda>()": "copy",
    "Memset (Device)": "copy",
    "Memcpy DtoH (Device -> Pageable)": "copy",
    "Memcpy HtoD (Pageable -> Device)": "copy",
    "fused_add_layer_norm_kernel": "tir",
    "fused_matmul_add_kernel_1": "tir",
    "default_function_kernel": "tir",
    "plus_stage_copy_1x16x64_float32_kernel": "tir",
    "void at::native::indexSelectLargeIndex<float, long, unsigned int, 2, 2, -2, true>()": "other",
}


@pytest.mark.parametrize("name", sorted(NAMES))
def test_kernels_are_classified_by_name(name):
    assert classify(name) == NAMES[name]


def test_the_bundles_tir_functions_decide_and_kernel_names_map_to_them():
    assert tir_function("fused_add_layer_norm_kernel") == "fused_add_layer_norm"
    assert tir_function("fused_layer_norm_reshape_kernel_2") == "fused_layer_norm_reshape"
    assert tir_function("void at::native::reduce_kernel<1>()") is None
    assert tir_function("triton_poi_fused_add_0") is None
    # a TIR function whose kernel looks like a cuBLAS one is still plus's own
    assert classify("scal_kernel", tir_functions={"scal"}) == "tir"
    assert classify("scal_kernel", tir_functions={"fused_add"}) == "gemm"
    assert set(NAMES.values()) <= set(KINDS)


def test_busy_time_and_gaps_from_sorted_merged_intervals():
    events = [  # out of order, two overlapping (concurrent streams), one inside another
        KernelEvent("c", 30.0, 10.0),
        KernelEvent("a", 0.0, 10.0),
        KernelEvent("b", 5.0, 10.0),  # overlaps a: busy 0..15
        KernelEvent("d", 32.0, 2.0),  # inside c
        KernelEvent("e", 40.0, 5.0),  # touches c's end: no gap
    ]
    got = busy_and_gaps(events)
    assert got == {"busy_us": 30.0, "span_us": 45.0, "gaps_us": [15.0]}
    assert busy_and_gaps([]) == {"busy_us": 0.0, "span_us": 0.0, "gaps_us": []}


def _two_inferences():
    """Two inferences (host windows 0..100 and 100..200): a GEMM and a TIR kernel each; the
    second inference's TIR kernel starts after its GEMM ends with a 20 us gap; a warm-up
    straggler before the first window."""
    gemm = "sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n_tilesize64x64x32"
    events = [
        KernelEvent("fused_add_kernel", -5.0, 2.0),  # before any window: not counted
        KernelEvent(gemm, 10.0, 40.0),
        KernelEvent("fused_add_kernel", 50.0, 10.0),
        KernelEvent(gemm, 110.0, 40.0),
        KernelEvent("fused_add_kernel", 170.0, 10.0),
        KernelEvent("Memset (Device)", 195.0, 1.0),  # ends after... still the 2nd inference
    ]
    return events, [(0.0, 100.0), (100.0, 200.0)]


def test_summary_counts_and_times_per_inference_and_sums_by_kind():
    events, windows = _two_inferences()
    p = summarize(events, 2, windows)
    assert p["outside_windows"] == 1 and p["windows"] == 2
    assert p["kernels_per_inference"] == 2.5
    assert p["kinds"]["gemm"] == {"count": 1.0, "ms": 0.04}
    assert p["kinds"]["tir"] == {"count": 1.0, "ms": pytest.approx(0.01)}
    assert p["kinds"]["copy"] == {"count": 0.5, "ms": pytest.approx(0.0005)}
    assert p["kinds"]["attention"] == {"count": 0, "ms": 0}
    names = [k["name"] for k in p["kernels"]]
    assert names[0].startswith("sm90_xmma_gemm") and names[-1] == "Memset (Device)"
    # busy: 50 + (50 + 1); idle: 0 + (20 + 15); span: 50 + 86
    assert p["busy_ms"] == pytest.approx(0.0505)
    assert p["idle_ms"] == pytest.approx(0.0175)
    assert p["span_ms"] == pytest.approx(0.068)
    assert p["gaps_per_inference"] == 1.0 and p["gap_max_us"] == 20.0
    assert p["gap_median_us"] == pytest.approx(17.5)


def test_without_windows_all_kernels_are_one_stretch():
    events, _ = _two_inferences()
    p = summarize(events, 2)
    assert p["outside_windows"] == 0 and p["kernels_per_inference"] == 3.0
    assert p["span_ms"] is None and p["gap_max_us"] == 50.0  # the host's time between them
    with pytest.raises(PlusError, match="at least one"):
        summarize(events, 0)


class _Device(enum.Enum):  # as torch.autograd.DeviceType
    CPU = 0
    CUDA = 1


def _fe(name, device, start, end, **extra):
    return SimpleNamespace(
        name=name, device_type=device, time_range=SimpleNamespace(start=start, end=end), **extra
    )


def test_profiler_events_give_kernels_and_inference_windows():
    events = [
        _fe(MARK, _Device.CPU, 100.0, 200.0, is_user_annotation=True),
        _fe(MARK, _Device.CPU, 0.0, 100.0, is_user_annotation=True),
        _fe("aten::addmm", _Device.CPU, 1.0, 5.0),
        _fe(MARK, _Device.CUDA, 10.0, 60.0, is_user_annotation=True),  # GPU-side annotation
        _fe("gpu range", _Device.CUDA, 10.0, 60.0, activity_type="gpu_user_annotation"),
        _fe("fused_add_kernel", _Device.CUDA, 50.0, 60.0),
        _fe("Memcpy HtoD (Pageable -> Device)", "DeviceType.CUDA", 120.0, 121.5),
    ]
    kernels, windows = kernel_events(events)
    assert windows == [(0.0, 100.0), (100.0, 200.0)]
    assert kernels == [
        KernelEvent("fused_add_kernel", 50.0, 10.0),
        KernelEvent("Memcpy HtoD (Pageable -> Device)", 120.0, 1.5),
    ]


def test_profile_table_has_a_summary_row_and_top_kernels_per_run():
    events, windows = _two_inferences()
    p = dict(summarize(events, 2, windows), wall_ms=0.09)
    long = "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int)"
    q = summarize([KernelEvent(long, 0.0, 3.0)], 1, [(0.0, 10.0)])
    text = profile_table(
        [("m fp32 b1 plus-auto", p), ("m fp32 b1 eager", q), ("x", {"error": "E"})]
    )
    lines = text.splitlines()
    rows = [ln for ln in lines if ln.startswith("| ")]
    assert len({ln.count("|") for ln in rows[:4]}) == 1  # the summary's rows line up
    auto = next(ln for ln in rows if ln.startswith("| m fp32 b1 plus-auto | 0.090 |"))
    assert "| 2.5 | 0.051 | 0.018 | 1.0 | 20.0 | 0.040 | - | - |" in auto
    assert "| x | E |" in text
    assert (
        "| m fp32 b1 eager | `at::native::vectorized_layer_norm_kernel<"
        "float, float>` | norm | 1 | 0.0030 |" in text
    )
