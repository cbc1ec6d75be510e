"""The native kernels (plus_tvm.runtime.native): built here, called by the VM without Python,
and equal to torch on every form of their contract; everything else falls back to Python."""

from __future__ import annotations

import itertools
import os
import platform
import subprocess
import sys
import threading

import numpy as np
import plus_tvm.runtime as rt
import pytest
import torch
import tvm
from _tensors import TORCH_ACTIVATIONS, from_tvm, to_tvm
from plus_tvm.runtime import native
from plus_tvm.target import resolve_target
from torch.nn import functional as F  # noqa: N812
from tvm import relax

TARGET = resolve_target("llvm")
ACT = TORCH_ACTIVATIONS


@pytest.fixture(scope="module", autouse=True)
def natives():
    if not rt.use_native():
        pytest.fail(f"native kernels unavailable: {native.status()['reason']}")


def conv_exe(shapes, config: str, out_shape):
    bb = relax.BlockBuilder()
    params = [relax.Var(f"in{i}", relax.TensorType(s, "float32")) for i, s in enumerate(shapes)]
    with bb.function("main", params):
        out = bb.emit(
            relax.call_dps_packed(
                "plus.conv2d",
                [*params, tvm.ir.StringImm(config)],
                out_ty=relax.TensorType(tuple(out_shape), "float32"),
            )
        )
        bb.emit_func_output(out)
    return tvm.compile(bb.get(), target=TARGET)


def conv_vm(shapes, config: str, out_shape):
    return relax.VirtualMachine(conv_exe(shapes, config, out_shape), tvm.cpu())["main"]


def conv_stats() -> dict:
    return native.status()["kernels"]["plus.conv2d"]


def reference(x_nchw, w, bias, stats, residual, cfg) -> torch.Tensor:
    t, left, b, r = cfg["padding"]
    y = F.conv2d(
        F.pad(x_nchw, (left, r, t, b)), w, bias, cfg["stride"], 0, cfg["dilation"], cfg["groups"]
    )
    if stats is not None:
        gamma, beta, mean, var = stats
        y = F.batch_norm(y, mean, var, gamma, beta, False, 0.0, cfg["eps"])
    y = ACT[cfg["act"]](y)
    if residual is not None:
        y = y + residual
    return ACT[cfg["post_act"]](y)


def run_native(x_nchw, w, bias, stats, residual, cfg, nan=True) -> tuple[torch.Tensor, int]:
    """Run plus.conv2d in NHWC through a VM; returns the NCHW result and how many calls fell
    back to Python."""
    x = x_nchw.permute(0, 2, 3, 1).contiguous()
    inputs = [x, w]
    config = {
        "layout": "nhwc",
        "stride": ",".join(map(str, cfg["stride"])),
        "padding": ",".join(map(str, cfg["padding"])),
        "dilation": ",".join(map(str, cfg["dilation"])),
        "groups": cfg["groups"],
        "act": cfg["act"],
        "post_act": cfg["post_act"],
        "nan": int(nan),
    }
    if bias is not None:
        inputs.append(bias)
        config["bias"] = 1
    if stats is not None:
        inputs.extend(stats)
        config["bn"], config["bn_eps"] = 1, cfg["eps"]
    if residual is not None:
        inputs.append(residual.permute(0, 2, 3, 1).contiguous())
        config["residual"] = 1
    want = reference(x_nchw, w, bias, stats, residual, cfg)
    out_shape = tuple(want.permute(0, 2, 3, 1).shape)
    text = ";".join(f"{k}={v}" for k, v in config.items())
    fn = conv_vm([tuple(t.shape) for t in inputs], text, out_shape)
    args = [tvm.runtime.tensor(t.numpy()) for t in inputs]
    before = conv_stats()["fallbacks"]
    # torch's reference on a NaN leaves this thread's invalid-operation flag set: cleared, so
    # that the NaN guard (nan_guard.h) reruns for the NaN it sees itself, or not at all
    native.take_invalid_flags()
    got = fn(*args).numpy()
    fallbacks = conv_stats()["fallbacks"] - before
    return torch.from_numpy(got).permute(0, 3, 1, 2), fallbacks


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    scale = max(1.0, float(want.abs().max()))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * scale, equal_nan=True)


BF16 = pytest.mark.skipif(
    "bfloat16" not in native.cpu_dtypes(), reason="the CPU computes no bfloat16 natively"
)


SHAPES = [
    # cin, cout, k, stride, padding (t, l, b, r), dilation, groups, image
    (3, 8, 3, 2, (0, 0, 1, 1), 1, 1, 11),  # TF "same" stride 2: one-sided padding
    (8, 16, 3, 1, (1, 1, 1, 1), 1, 1, 9),
    (8, 8, 3, 2, (1, 1, 1, 1), 1, 8, 10),  # depthwise
    (8, 8, 5, 1, (2, 2, 2, 2), 1, 8, 9),
    (6, 12, 3, 1, (1, 1, 1, 1), 1, 3, 8),  # grouped
    (16, 24, 1, 1, (0, 0, 0, 0), 1, 1, 7),  # pointwise
    (16, 24, 1, 2, (0, 0, 0, 0), 1, 1, 7),  # strided pointwise
    (4, 8, 3, 1, (2, 2, 2, 2), 2, 1, 9),  # dilated
    (4, 6, (3, 1), 1, (1, 0, 1, 0), 1, 1, 6),  # non-square kernel
    (32, 16, 1, 1, (0, 0, 0, 0), 1, 1, 1),  # a 1x1 image (squeeze-excitation)
    (3, 4, 7, 2, (3, 3, 3, 3), 1, 1, 16),  # a 7x7 stem
]


@pytest.mark.parametrize("cin,cout,k,stride,padding,dilation,groups,image", SHAPES)
def test_conv2d_native_shapes(cin, cout, k, stride, padding, dilation, groups, image):
    kh, kw = k if isinstance(k, tuple) else (k, k)
    x, w = torch.randn(2, cin, image, image + 1), torch.randn(cout, cin // groups, kh, kw)
    cfg = {
        "stride": (stride, stride),
        "padding": padding,
        "dilation": (dilation, dilation),
        "groups": groups,
        "act": "none",
        "post_act": "none",
    }
    got, fallbacks = run_native(x, w, None, None, None, cfg)
    assert fallbacks == 0
    close(got, reference(x, w, None, None, None, cfg))


@pytest.mark.parametrize(
    "bias,bn,act,residual,post_act",
    [
        (b, bn, a, r, p)
        for b, bn, a, r, p in itertools.product(
            (False, True), (False, True), ACT, (False, True), ("none", "relu", "relu6")
        )
        if (r or p == "none") and (a == "none" or p == "none" or r)
    ][::3],  # every third combination (the product is large), all epilogues covered
)
def test_conv2d_native_epilogues(bias, bn, act, residual, post_act):
    torch.manual_seed(hash((bias, bn, act, residual, post_act)) % 1000)
    x, w = torch.randn(1, 8, 7, 7), torch.randn(12, 8, 3, 3)
    b = torch.randn(12) if bias else None
    stats = None
    if bn:
        stats = (torch.rand(12) + 0.5, torch.randn(12), torch.randn(12), torch.rand(12) + 0.1)
    cfg = {
        "stride": (1, 1),
        "padding": (1, 1, 1, 1),
        "dilation": (1, 1),
        "groups": 1,
        "act": act,
        "post_act": post_act,
        "eps": 1e-3,
    }
    res = torch.randn(1, 12, 7, 7) if residual else None
    got, fallbacks = run_native(x, w, b, stats, res, cfg)
    assert fallbacks == 0
    close(got, reference(x, w, b, stats, res, cfg))


@pytest.mark.parametrize("act", ["relu", "relu6"])
def test_conv2d_native_nan_reaches_the_output(act):
    """oneDNN's ReLU / clip turn NaN into 0; with nan=1 (the default) NaN comes out, as in torch."""
    x, w = torch.randn(1, 4, 5, 5), torch.randn(4, 4, 1, 1)
    x[0, :, 2, 3] = float("nan")
    cfg = {
        "stride": (1, 1),
        "padding": (0, 0, 0, 0),
        "dilation": (1, 1),
        "groups": 1,
        "act": act,
        "post_act": "none",
    }
    reruns = conv_stats()["nan_reruns"]
    got, _ = run_native(x, w, None, None, None, cfg)
    want = reference(x, w, None, None, None, cfg)
    if GUARDED:  # the fast form ran, saw the NaN and ran again NaN-keeping
        assert conv_stats()["nan_reruns"] == reruns + 1
    assert torch.isnan(got[0, :, 2, 3]).all()
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    close(got, want)
    assert (got[~torch.isnan(got)] >= 0).all()  # ReLU's output never negative (no -0 either)
    assert not torch.signbit(got[~torch.isnan(got)]).any()
    dropped, _ = run_native(x, w, None, None, None, cfg, nan=False)  # allowed to drop NaN
    close(dropped[~torch.isnan(want)], want[~torch.isnan(want)])


GUARDED = platform.machine() in ("x86_64", "AMD64")  # the NaN guard (nan_guard.h) runs on x86


def guard_counts() -> tuple[int, int]:
    stats = conv_stats()
    return stats["guarded"], stats["nan_reruns"]


NAN_GUARD_CASES = [
    # (cin, cout, k, stride, groups, image, act, residual, post_act)
    (16, 96, 1, 1, 1, 56, "relu6", False, "none"),  # pointwise expansion
    (48, 48, 3, 2, 48, 57, "relu6", False, "none"),  # depthwise, strided
    (8, 32, 3, 1, 1, 40, "relu", False, "none"),
    (32, 32, 3, 1, 1, 28, "none", True, "relu"),  # ResNet's add, then ReLU
]


@pytest.mark.parametrize("cin,cout,k,stride,groups,image,act,residual,post_act", NAN_GUARD_CASES)
def test_conv2d_native_nan_guard(cin, cout, k, stride, groups, image, act, residual, post_act):
    """ReLU / ReLU6 run as oneDNN's max / min, and again NaN-keeping only when a NaN reached them:
    wherever the NaN is (so whichever thread computed it), and NaN made on the way (inf - inf)."""
    torch.manual_seed(cin + image)
    w = torch.randn(cout, cin // groups, k, k)
    b = torch.randn(cout)
    cfg = {
        "stride": (stride, stride),
        "padding": (k // 2,) * 4,
        "dilation": (1, 1),
        "groups": groups,
        "act": act,
        "post_act": post_act,
    }
    x = torch.randn(1, cin, image, image)
    res_shape = reference(x, w, b, None, None, cfg).shape
    res = torch.randn(res_shape) if residual else None
    guarded, reruns = guard_counts()
    got, fallbacks = run_native(x, w, b, None, res, cfg)
    assert fallbacks == 0
    close(got, reference(x, w, b, None, res, cfg))
    if GUARDED:  # finite input: the fast form ran once, no second run
        assert guard_counts() == (guarded + 1, reruns)
    places = [(0, 0), (image // 2, image // 3), (image - 1, image - 1), (image - 1, 0)]
    for h, wpos in places:
        bad = x.clone()
        bad[0, cin // 2, h, wpos] = float("nan")
        got, _ = run_native(bad, w, b, None, res, cfg)
        want = reference(bad, w, b, None, res, cfg)
        assert torch.isnan(want).any()
        assert torch.equal(torch.isnan(got), torch.isnan(want)), (h, wpos)
        close(got, want)
    if residual:  # a NaN arriving through the residual alone
        bad_res = res.clone()
        bad_res[0, 0, -1, -1] = float("nan")
        got, _ = run_native(x, w, b, None, bad_res, cfg)
        want = reference(x, w, b, None, bad_res, cfg)
        assert torch.equal(torch.isnan(got), torch.isnan(want))
    if groups == 1:  # two infinities meeting weights of opposite signs: inf - inf = NaN
        ch = torch.nonzero(w[:, 0, 0, 0] * w[:, 1, 0, 0] < 0)[0, 0]
        assert ch is not None
        bad = x.clone()
        bad[0, :2, 0, 0] = float("inf")
        got, _ = run_native(bad, w, b, None, res, cfg)
        want = reference(bad, w, b, None, res, cfg)
        assert torch.isnan(want).any()
        # every NaN of torch's here too (the NaN-keeping forms also give NaN for the infinities
        # torch's ReLU / ReLU6 map to 0 or 6: AppendActivation)
        assert torch.isnan(got)[torch.isnan(want)].all()
    if GUARDED:
        assert guard_counts()[1] > reruns  # the NaN inputs ran again


def _has_avx512f() -> bool:
    try:
        with open("/proc/cpuinfo") as info:
            return " avx512f" in info.read()
    except OSError:
        return False


SILU_PASS = GUARDED and _has_avx512f()  # silu_pass.h: x86 with AVX-512, else oneDNN's post-op

SILU_CASES = [
    # (cin, cout, k, groups, image, act, residual, post_act, pass runs)
    (40, 40, 3, 40, 57, "silu", False, "none", True),  # depthwise, both threads and a tail
    (8, 12, 3, 1, 5, "silu", False, "none", True),  # small: one thread, a tail
    (16, 24, 1, 1, 41, "relu", True, "silu", True),  # after the residual add
    (16, 24, 1, 1, 9, "relu6", True, "silu", True),  # under the NaN guard too
    (16, 24, 1, 1, 41, "silu", True, "none", False),  # the add follows: oneDNN's post-op
]


@pytest.mark.parametrize("cin,cout,k,groups,image,act,residual,post_act,runs", SILU_CASES)
def test_conv2d_native_silu_pass(cin, cout, k, groups, image, act, residual, post_act, runs):
    """A trailing SiLU runs after the convolution (silu_pass.h): torch's values for outputs
    from -hundreds to hundreds, NaN where torch has NaN."""
    torch.manual_seed(cin + image)
    w = torch.randn(cout, cin // groups, k, k) * 4
    b = torch.randn(cout)
    cfg = {
        "stride": (1, 1),
        "padding": (k // 2,) * 4,
        "dilation": (1, 1),
        "groups": groups,
        "act": act,
        "post_act": post_act,
    }
    x = torch.randn(1, cin, image, image) * 8
    x[0, cin // 2, image // 2, image - 1] = float("nan")
    want_shape = reference(x, w, b, None, None, cfg).shape
    res = torch.randn(want_shape) * 8 if residual else None
    passes = conv_stats()["silu_passes"]
    got, fallbacks = run_native(x, w, b, None, res, cfg)
    want = reference(x, w, b, None, res, cfg)
    assert fallbacks == 0
    assert want.nan_to_num().max() > 30 and (want < -0.1).any(), want.nan_to_num().max()
    assert torch.isnan(want).any()
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    close(got, want)
    assert conv_stats()["silu_passes"] == passes + int(runs and SILU_PASS)


def test_conv2d_native_silu_pass_special_values():
    """Each value through a one-channel 1x1 convolution of weight 1 (exact), then the SiLU:
    torch's x / (1 + exp(-x)) for infinities, NaN, the extremes and the tiny."""
    values = [float("nan"), float("inf"), -float("inf"), 3e38, -3e38, 100.0, -100.0, -87.5]
    values += [-20.0, -1e-30, -0.0, 0.0, 1e-30, 0.5, -0.5, 20.0, 89.0, 1e-40]
    x = torch.tensor(values).reshape(1, 1, 1, -1)
    w = torch.ones(16, 1, 1, 1)
    cfg = {
        "stride": (1, 1),
        "padding": (0, 0, 0, 0),
        "dilation": (1, 1),
        "groups": 1,
        "act": "silu",
        "post_act": "none",
    }
    got, fallbacks = run_native(x, w, None, None, None, cfg)
    assert fallbacks == 0
    want = F.silu(x).expand(1, 16, 1, -1)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-30, equal_nan=True)


def test_conv2d_native_nan_guard_from_several_threads():
    """Each thread's guard reads its own team's flags: a NaN in one thread's input reruns that
    call only, and every thread gets torch's result, NaN where torch has NaN."""
    torch.manual_seed(5)
    w = torch.randn(32, 16, 1, 1)
    exe = conv_exe(
        [(1, 20, 20, 16), (32, 16, 1, 1)], "layout=nhwc;act=relu6;nan=1", (1, 20, 20, 32)
    )
    xs = [torch.randn(1, 16, 20, 20) for _ in range(4)]
    for i in (1, 3):
        xs[i][0, i, 6 * i, 19 - i] = float("nan")
    wants = [F.conv2d(x, w).clamp(0, 6) for x in xs]
    guarded, reruns = guard_counts()
    assert not conv_in_threads(exe, tvm.runtime.tensor(w.numpy()), xs, wants, 25, differs)
    if GUARDED:
        assert guard_counts()[0] - guarded == 100
        assert guard_counts()[1] - reruns == 50  # the two NaN threads, every call; no other


WINOGRAD_CASES = [
    # (cin, cout, padding t, l, b, r, image (h, w), batch, bias, bn, act, residual, post_act)
    # 4x4 output tiles (F(4x4, 3x3)): min(cin, cout) >= 64 and 16 tiles
    (128, 144, (1, 1, 1, 1), (21, 19), 1, True, False, "relu", False, "none"),  # edge tiles
    (64, 80, (0, 1, 2, 1), (42, 39), 1, False, True, "relu6", True, "relu"),  # thin, asymmetric
    (64, 64, (1, 1, 1, 1), (14, 14), 1, True, False, "relu", False, "none"),  # thin, 16 tiles
    (160, 128, (1, 1, 1, 1), (9, 10), 3, True, False, "silu", False, "none"),  # batch 3
    (128, 128, (1, 1, 1, 1), (60, 58), 1, True, False, "relu", True, "none"),  # per thread
    (128, 128, (1, 1, 1, 1), (47, 45), 1, True, False, "relu", True, "none"),  # per thread
    (256, 256, (1, 1, 1, 1), (14, 14), 1, True, True, "relu", True, "relu"),  # ResNet's block
    (256, 256, (1, 1, 1, 1), (15, 15), 1, True, False, "relu", False, "none"),  # edge tiles
    (288, 256, (0, 0, 0, 0), (18, 16), 1, True, False, "none", False, "none"),  # valid
    (256, 256, (1, 1, 1, 1), (14, 14), 1, True, False, "silu", False, "none"),  # SiLU pass
    # 2x2 output tiles (F(2x2, 3x3)): fewer than 16 4x4 tiles, at least 40 2x2 ones
    (256, 256, (1, 1, 1, 1), (12, 13), 1, True, False, "relu", False, "none"),  # edge tiles
    (256, 320, (1, 1, 1, 1), (8, 11), 2, False, True, "relu6", False, "none"),  # batch 2, BN
    (288, 256, (0, 0, 0, 0), (14, 15), 1, True, False, "none", False, "none"),  # valid
    (256, 256, (0, 1, 2, 1), (11, 13), 1, False, False, "none", False, "relu"),  # asymmetric
    (256, 256, (1, 1, 1, 1), (13, 12), 1, True, True, "relu", True, "relu"),  # residual
    (256, 256, (1, 1, 1, 1), (12, 14), 1, False, True, "relu", True, "silu"),  # after the add
]


@pytest.mark.parametrize(
    "cin,cout,padding,image,batch,bias,bn,act,residual,post_act", WINOGRAD_CASES
)
def test_conv2d_native_winograd(
    cin, cout, padding, image, batch, bias, bn, act, residual, post_act
):
    """Wide 3x3 stride-1 convolutions run as Winograd F(2x2, 3x3): torch's result for every
    epilogue, padding and edge tile, and for NaN and infinite inputs."""
    torch.manual_seed(cin + cout + image[1])
    x = torch.randn(batch, cin, *image)
    w = torch.randn(cout, cin, 3, 3) * 0.1
    b = torch.randn(cout) if bias else None
    stats = None
    if bn:
        stats = [
            torch.rand(cout) + 0.5,
            torch.randn(cout),
            torch.randn(cout),
            torch.rand(cout) + 0.1,
        ]
    cfg = {
        "stride": (1, 1),
        "padding": padding,
        "dilation": (1, 1),
        "groups": 1,
        "act": act,
        "post_act": post_act,
        "eps": 1e-5,
    }
    out = reference(x, w, b, stats, None, cfg)
    res = torch.randn(out.shape) if residual else None
    before = {k: conv_stats()[k] for k in ("winograd", "winograd4", "silu_passes")}
    got, fallbacks = run_native(x, w, b, stats, res, cfg)
    assert fallbacks == 0
    silu = "silu" in (act, post_act)  # Winograd takes a trailing SiLU where the pass runs
    runs = int(SILU_PASS or not silu)
    oh, ow = out.shape[2:]
    narrow, tiles4 = min(cin, cout), batch * -(-oh // 4) * -(-ow // 4)
    four = narrow >= 64 and tiles4 >= 16
    assert conv_stats()["winograd"] == before["winograd"] + runs
    assert conv_stats()["winograd4"] == before["winograd4"] + runs * int(four)
    assert conv_stats()["silu_passes"] == before["silu_passes"] + int(SILU_PASS and silu)
    close(got, reference(x, w, b, stats, res, cfg))
    # an infinity or a NaN in the input: torch's result exactly (the call falls back to the
    # Python kernel when Winograd met one: its transforms subtract infinities)
    for value in (float("nan"), float("inf"), -float("inf")):
        bad = x.clone()
        bad[0, 3, image[0] // 2, 0] = value
        bad[-1, 5, image[0] - 1, image[1] - 1] = value
        got, fallbacks = run_native(bad, w, b, stats, res, cfg)
        want = reference(bad, w, b, stats, res, cfg)
        # (ReLU6 maps torch's infinities to 6: the values must agree)
        assert fallbacks == int(SILU_PASS or not silu)
        assert torch.equal(torch.isnan(got), torch.isnan(want)), value
        assert torch.equal(torch.isinf(got), torch.isinf(want)), value
        close(got, want)


@pytest.mark.parametrize("image", [14, 47])  # chunks on the team / per thread
def test_conv2d_native_winograd_from_several_threads(image):
    """One Winograd plan called from four threads at once (each its own transform buffers)."""
    torch.manual_seed(image)
    c = 256 if image == 14 else 128
    w = torch.randn(c, c, 3, 3) * 0.05
    exe = conv_exe(
        [(1, image, image, c), (c, c, 3, 3)], "layout=nhwc;padding=1;act=relu", (1, image, image, c)
    )
    xs = [torch.randn(1, c, image, image) for _ in range(4)]
    wants = [F.relu(F.conv2d(x, w, padding=1)) for x in xs]
    before = conv_stats()["winograd"]
    assert not conv_in_threads(exe, tvm.runtime.tensor(w.numpy()), xs, wants, 8, differs)
    assert conv_stats()["winograd"] == before + 32


@pytest.mark.parametrize("winograd", [True, False])
def test_conv2d_winograd_follows_options(winograd):
    """``Options.conv_winograd`` reaches the compiled convolution: a model's wide 3x3 layer runs
    as Winograd by default and directly with the option off, torch's result either way."""
    import plus_tvm

    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Conv2d(128, 128, 3, padding=1), torch.nn.ReLU()).eval()
    x = torch.randn(1, 128, 14, 14)
    options = plus_tvm.Options(conv_winograd=winograd)
    compiled = plus_tvm.compile(model, "llvm", example_args=(x,), options=options)
    before = conv_stats()["winograd"]
    got = torch.from_numpy(np.asarray(compiled(x.numpy())))
    assert conv_stats()["winograd"] == before + (1 if winograd else 0)
    close(got, model(x).detach())


@pytest.mark.parametrize("mcpu", ["znver4", "znver5"])
def test_winograd_on_thin_layers_follows_the_target_cpu(mcpu, tmp_path, monkeypatch):
    """A 64-channel 3x3 layer of 100 4x4 tiles may run as Winograd F(4x4) by the kernel's own
    table, but the call says ``winograd=0`` for a target CPU whose entry in
    ``WINOGRAD_MIN_CHANNELS`` says oneDNN's direct convolution is faster there (an entry for
    Zen 5 set here); a 256-channel layer may take it everywhere. (Compiled only: the target
    need not be this CPU.)"""
    import plus_tvm
    from plus_tvm.runtime.conv2d import WINOGRAD_MIN_CHANNELS

    monkeypatch.setitem(WINOGRAD_MIN_CHANNELS, "znver5", 128)
    direct = mcpu == "znver5"
    target = {"kind": "llvm", "mcpu": mcpu, "num-cores": 2}
    for channels, refused in ((64, direct), (256, False)):
        model = torch.nn.Sequential(
            torch.nn.Conv2d(channels, channels, 3, padding=1), torch.nn.ReLU()
        ).eval()
        x = torch.randn(1, channels, 40, 40)
        dump = tmp_path / f"{channels}"
        options = plus_tvm.Options(dump_ir=str(dump))
        plus_tvm.compile(model, target, example_args=(x,), options=options)
        (dispatched,) = dump.glob("*_dispatch.py")
        text = dispatched.read_text()
        assert text.count('"plus.conv2d"') == 1
        assert ("winograd=0" in text) == refused, (channels, mcpu)


def test_conv2d_native_winograd_only_where_it_wins():
    """Thin layers, layers of few tiles, strides, dilations, groups and activations Winograd's
    epilogue does not compute stay on oneDNN's direct convolution."""
    direct = [
        (64, 256, 1, 1, 1, "relu", 12),  # too few 4x4 tiles (9), too thin for 2x2
        (32, 256, 1, 1, 1, "relu", 56),  # too few input channels
        (48, 48, 1, 1, 1, "relu", 32),  # too thin
        (128, 128, 1, 1, 1, "relu", 10),  # too few tiles (9 4x4, 25 2x2)
        (256, 48, 1, 1, 1, "relu", 16),  # too few output channels
        (256, 256, 1, 1, 1, "relu", 7),  # too few tiles (16)
        (256, 256, 2, 1, 1, "relu", 16),  # strided
        (256, 256, 1, 2, 1, "relu", 16),  # dilated
        (256, 256, 1, 1, 2, "relu", 16),  # grouped
        (256, 256, 1, 1, 1, "gelu", 16),
    ]
    for cin, cout, stride, dilation, groups, act, image in direct:
        x = torch.randn(1, cin, image, image)
        w = torch.randn(cout, cin // groups, 3, 3) * 0.1
        cfg = {
            "stride": (stride, stride),
            "padding": (dilation,) * 4,
            "dilation": (dilation, dilation),
            "groups": groups,
            "act": act,
            "post_act": "none",
        }
        before = conv_stats()["winograd"]
        got, fallbacks = run_native(x, w, None, None, None, cfg)
        assert fallbacks == 0
        assert conv_stats()["winograd"] == before, (cin, stride, dilation, groups, act)
        close(got, reference(x, w, None, None, None, cfg))


@BF16
@pytest.mark.parametrize(
    "bias,bn,act,residual,post_act,k,groups",
    [
        (True, False, "relu", False, "none", 3, 1),
        (False, True, "relu", False, "none", 3, 1),
        (True, True, "relu6", True, "relu", 1, 1),
        (True, True, "silu", False, "none", 3, 8),  # depthwise
        (False, False, "none", True, "none", 3, 1),
    ],
)
def test_conv2d_native_bfloat16(bias, bn, act, residual, post_act, k, groups):
    """A bfloat16 convolution runs natively: float32 accumulation, the BatchNorm as float32
    post-ops (not folded into the bfloat16 weight), one rounding; equal to the Python kernel's
    (torch's order: the convolution rounded, the BatchNorm in float32, rounded)."""
    torch.manual_seed(k + groups + 2 * bn)
    c, oc, image = 8, 8 if groups > 1 else 16, 9
    x = torch.randn(1, image, image, c).bfloat16()  # NHWC
    w = (torch.randn(oc, c // groups, k, k) * 0.3).bfloat16()
    inputs = [x, w]
    cfg = f"layout=nhwc;padding={k // 2};groups={groups};act={act};post_act={post_act}"
    if bias:
        inputs.append(torch.randn(oc).bfloat16())
        cfg += ";bias=1"
    if bn:
        gamma, beta = torch.rand(oc) + 0.5, torch.randn(oc)
        mean, var = torch.randn(oc) * 0.1, torch.rand(oc) + 0.5
        inputs += [t.bfloat16() for t in (gamma, beta, mean, var)]
        cfg += ";bn=1;bn_eps=1e-5"
    out_shape = (1, image, image, oc)
    if residual:
        inputs.append(torch.randn(*out_shape).bfloat16())
        cfg += ";residual=1"
    # torch's float32 computation of the same rounded tensors
    f = [t.float() for t in inputs]
    y = F.conv2d(f[0].permute(0, 3, 1, 2), f[1], f[2] if bias else None, 1, k // 2, 1, groups)
    if bn:
        g, b, m, v = f[2 + bias : 6 + bias]
        y = F.batch_norm(y, m, v, g, b, False, 0.0, 1e-5)
    y = ACT[act](y)
    if residual:
        y = y + f[-1].permute(0, 3, 1, 2)
    want = ACT[post_act](y).permute(0, 2, 3, 1)
    (got,), fallbacks = run_kernel("plus.conv2d", inputs, cfg, [out_shape])
    assert fallbacks == 0
    close_half(got, want.bfloat16())
    close_half(got, python_kernel("plus.conv2d", inputs, cfg, [out_shape])[0])


def test_conv2d_native_falls_back_to_python_for_what_it_does_not_run():
    x, w = torch.randn(1, 4, 6, 6), torch.randn(8, 4, 3, 3)
    fn = conv_vm([(1, 4, 6, 6), (8, 4, 3, 3)], "layout=nchw;padding=1", (1, 8, 6, 6))
    before = conv_stats()["fallbacks"]
    got = fn(tvm.runtime.tensor(x.numpy()), tvm.runtime.tensor(w.numpy())).numpy()
    assert conv_stats()["fallbacks"] == before + 1
    close(torch.from_numpy(got), F.conv2d(x, w, padding=1))
    bad = conv_vm([(1, 6, 6, 4), (8, 4, 3, 3)], "layout=nhwc;colour=red", (1, 4, 4, 8))
    with pytest.raises(Exception, match=r"plus\.conv2d.*unknown config key 'colour'"):
        bad(tvm.runtime.tensor(np.zeros((1, 6, 6, 4), "float32")), tvm.runtime.tensor(w.numpy()))


def test_conv2d_native_forget_repacks_a_weight_changed_in_place():
    x, w = torch.randn(1, 4, 6, 6), torch.randn(8, 4, 3, 3)
    fn = conv_vm([(1, 6, 6, 4), (8, 4, 3, 3)], "layout=nhwc;padding=1", (1, 6, 6, 8))
    xt, wt = (
        tvm.runtime.tensor(x.permute(0, 2, 3, 1).contiguous().numpy()),
        tvm.runtime.tensor(w.numpy()),
    )
    first = fn(xt, wt).numpy()
    w2 = torch.randn(8, 4, 3, 3)
    wt.copyfrom(w2.numpy())
    assert np.array_equal(fn(xt, wt).numpy(), first)  # packed once: the cache cannot see the change
    rt.forget_tensor(wt)
    got = torch.from_numpy(fn(xt, wt).numpy()).permute(0, 3, 1, 2)
    close(got, F.conv2d(x, w2, padding=1))


def conv_in_threads(exe, wt, xs, wants, calls: int, problem) -> list:  # noqa: ANN001
    """Run ``exe`` on ``xs[i]`` (NCHW) with weight ``wt`` in thread i, ``calls`` times each (one
    VM per thread: a VM holds per-call state); returns ``(i, what)`` for every result
    ``problem(got, want)`` names."""
    errors = []

    def work(i: int) -> None:
        fn = relax.VirtualMachine(exe, tvm.cpu())["main"]
        xt = tvm.runtime.tensor(xs[i].permute(0, 2, 3, 1).contiguous().numpy())
        native.take_invalid_flags()  # this thread's: see run_native
        for _ in range(calls):
            got = torch.from_numpy(fn(xt, wt).numpy()).permute(0, 3, 1, 2)
            what = problem(got, wants[i])
            if what:
                errors.append((i, what))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def differs(got: torch.Tensor, want: torch.Tensor) -> str:
    if not torch.equal(torch.isnan(got), torch.isnan(want)):
        return "nan"
    return "" if torch.allclose(got, want, rtol=1e-4, atol=1e-4, equal_nan=True) else "value"


# (act, cin, cout, image): the SiLU case's outputs are large enough for the SiLU pass to split
# over each thread's team
@pytest.mark.parametrize("act,cin,cout,image", [("relu", 8, 16, 12), ("silu", 16, 32, 24)])
def test_conv2d_native_from_several_threads(act, cin, cout, image):
    torch.manual_seed(3)
    w = torch.randn(cout, cin, 3, 3)
    exe = conv_exe(
        [(1, image, image, cin), (cout, cin, 3, 3)],
        f"layout=nhwc;padding=1;act={act}",
        (1, image, image, cout),
    )
    xs = [torch.randn(1, cin, image, image) for _ in range(4)]
    wants = [ACT[act](F.conv2d(x, w, padding=1)) for x in xs]
    passes = conv_stats()["silu_passes"]
    assert not conv_in_threads(exe, tvm.runtime.tensor(w.numpy()), xs, wants, 20, differs)
    assert conv_stats()["silu_passes"] - passes == (80 if act == "silu" and SILU_PASS else 0)


def test_status_names_why_native_kernels_are_unavailable(tmp_path):
    """Without a compiler the Python kernels run, and status() says why."""
    code = (
        "import plus_tvm.runtime as rt, json;print(rt.use_native(), json.dumps(rt.native.status()))"
    )
    env = dict(os.environ, CXX=str(tmp_path / "no-such-compiler"), PLUS_TVM_CACHE_DIR=str(tmp_path))
    env["PLUS_TVM_NATIVE"] = "cache"  # not the library built with the package
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert out.startswith("False") and "no C++ compiler" in out
    env = dict(os.environ, PLUS_TVM_NATIVE="0")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert out.startswith("False") and "PLUS_TVM_NATIVE=0" in out


# ---------------------------------------------------------------------------------------------
# plus.linear / plus.linear_layernorm


def kernel_exe(kernel: str, shapes, config: str, out_shapes, dtypes=None):
    """``dtypes``: of the inputs (default float32); the outputs have the first's."""
    dtypes = dtypes or ["float32"] * len(shapes)
    bb = relax.BlockBuilder()
    params = [
        relax.Var(f"in{i}", relax.TensorType(s, t)) for i, (s, t) in enumerate(zip(shapes, dtypes))
    ]
    out_ty = [relax.TensorType(tuple(s), dtypes[0]) for s in out_shapes]
    with bb.function("main", params):
        out = bb.emit(
            relax.call_dps_packed(
                kernel,
                [*params, tvm.ir.StringImm(config)],
                out_ty=out_ty if len(out_ty) > 1 else out_ty[0],
            )
        )
        bb.emit_func_output(out)
    return tvm.compile(bb.get(), target=TARGET)


def run_kernel(kernel: str, inputs, config: str, out_shapes) -> tuple[list, int]:
    dtypes = [str(t.dtype).removeprefix("torch.") for t in inputs]
    exe = kernel_exe(kernel, [tuple(t.shape) for t in inputs], config, out_shapes, dtypes)
    fn = relax.VirtualMachine(exe, tvm.cpu())["main"]
    before = native.status()["kernels"][kernel]
    out = fn(*[to_tvm(t) for t in inputs])
    after = native.status()["kernels"][kernel]
    outs = list(out) if isinstance(out, (list, tuple, tvm.ir.Array)) else [out]
    assert after["calls"] + after["fallbacks"] > before["calls"] + before["fallbacks"]
    return [from_tvm(o) for o in outs], after["fallbacks"] - before["fallbacks"]


def python_kernel(kernel: str, inputs, config: str, out_shapes) -> list:
    """The Python kernel's outputs for the same call (the native one's reference)."""
    outs = [torch.empty(s, dtype=inputs[0].dtype) for s in out_shapes]
    rt.KERNELS[kernel](*inputs, config, *outs)
    return outs


def close_half(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal within a unit in the last place of bfloat16 (both round a float32 result once;
    float32 sums in another order may round to the neighbour)."""
    assert got.dtype == want.dtype == torch.bfloat16
    scale = max(1.0, float(want.float().abs().max()))
    torch.testing.assert_close(
        got.float(), want.float(), rtol=2.0**-7, atol=2.0**-7 * scale, equal_nan=True
    )


@pytest.mark.parametrize("layout", ["nk", "kn"])
@pytest.mark.parametrize("bias,residual", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("act", ["none", "relu", "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("lead", [(5,), (2, 7)])
def test_linear_native(layout, bias, residual, act, lead):
    torch.manual_seed(len(lead) + len(act))
    k, n = 24, 40
    x, w = torch.randn(*lead, k), torch.randn(n, k)
    want = x @ w.t()
    inputs = [x, w if layout == "nk" else w.t().contiguous()]
    cfg = f"w={layout};act={act}"
    if bias:
        b = torch.randn(n)
        inputs.append(b)
        want = want + b
        cfg += ";bias=1"
    want = ACT[act](want)
    if residual:
        r = torch.randn(*lead, n)
        inputs.append(r)
        want = want + r
        cfg += ";residual=1"
    (got,), fallbacks = run_kernel("plus.linear", inputs, cfg, [want.shape])
    assert fallbacks == 0
    close(got, want)


def test_linear_native_one_weight_at_several_row_counts():
    """A symbolic batch: primitives per row count, the weight packed for the first one serves."""
    w, b = torch.randn(48, 32), torch.randn(48)
    for rows in (1, 3, 64, 3):
        x = torch.randn(rows, 32)
        (got,), fallbacks = run_kernel(
            "plus.linear", [x, w, b], "w=nk;bias=1;act=relu", [(rows, 48)]
        )
        assert fallbacks == 0
        close(got, F.relu(x @ w.t() + b))


def test_linear_native_relu_keeps_nan():
    x, w = torch.randn(4, 8), torch.randn(6, 8)
    x[1, 3] = float("nan")
    (got,), _ = run_kernel("plus.linear", [x, w], "w=nk;act=relu", [(4, 6)])
    want = F.relu(x @ w.t())
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    close(got, want)


@pytest.mark.parametrize("gamma,beta", [(True, True), (True, False), (False, False)])
@pytest.mark.parametrize("sum_out", [False, True])
def test_linear_layernorm_native(gamma, beta, sum_out):
    torch.manual_seed(int(gamma) + 2 * int(beta) + 4 * int(sum_out))
    x, w, b, r = torch.randn(2, 6, 32), torch.randn(48, 32), torch.randn(48), torch.randn(2, 6, 48)
    s = x @ w.t() + b + r
    g, be = torch.rand(48) + 0.5, torch.randn(48)
    inputs = [x, w, b, r]
    cfg = "w=nk;bias=1;residual=1;eps=1e-6"
    if gamma:
        inputs.append(g)
        cfg += ";gamma=1"
    if beta:
        inputs.append(be)
        cfg += ";beta=1"
    if sum_out:
        cfg += ";sum_out=1"
    want = F.layer_norm(s, (48,), g if gamma else None, be if beta else None, 1e-6)
    outs, fallbacks = run_kernel(
        "plus.linear_layernorm", inputs, cfg, [s.shape] * (2 if sum_out else 1)
    )
    assert fallbacks == 0
    close(outs[0], want)
    if sum_out:
        close(outs[1], s)


@BF16
@pytest.mark.parametrize("layout", ["nk", "kn"])
@pytest.mark.parametrize("bias,residual", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("act", ["none", "relu", "gelu", "silu"])
def test_linear_native_bfloat16(layout, bias, residual, act):
    """A bfloat16 call runs natively (float32 accumulation, bias and epilogue in float32, one
    rounding) and equals the Python kernel's and torch's."""
    torch.manual_seed(len(act) + 3 * bias + 5 * residual)
    k, n, lead = 96, 40, (2, 7)
    x, w = torch.randn(*lead, k).bfloat16(), torch.randn(n, k).bfloat16()
    inputs = [x, w if layout == "nk" else w.t().contiguous()]
    want = x.float() @ w.float().t()
    cfg = f"w={layout};act={act}"
    if bias:
        b = torch.randn(n).bfloat16()
        inputs.append(b)
        want = want + b.float()
        cfg += ";bias=1"
    want = ACT[act](want)
    if residual:
        r = torch.randn(*lead, n).bfloat16()
        inputs.append(r)
        want = want + r.float()
        cfg += ";residual=1"
    (got,), fallbacks = run_kernel("plus.linear", inputs, cfg, [want.shape])
    assert fallbacks == 0
    close_half(got, want.bfloat16())
    close_half(got, python_kernel("plus.linear", inputs, cfg, [want.shape])[0])


@BF16
@pytest.mark.parametrize("sum_out", [False, True])
def test_linear_layernorm_native_bfloat16(sum_out):
    """The sum rounded once to bfloat16, normalized in float32 with gamma / beta widened, and
    rounded once: torch's half layer_norm of torch's half addmm."""
    torch.manual_seed(int(sum_out))
    x, w = torch.randn(2, 6, 64).bfloat16(), torch.randn(48, 64).bfloat16()
    b, r = torch.randn(48).bfloat16(), torch.randn(2, 6, 48).bfloat16()
    g, be = (torch.rand(48) + 0.5).bfloat16(), torch.randn(48).bfloat16()
    inputs = [x, w, b, r, g, be]
    cfg = "w=nk;bias=1;residual=1;gamma=1;beta=1;eps=1e-6" + (";sum_out=1" if sum_out else "")
    s = (x.float() @ w.float().t() + b.float() + r.float()).bfloat16()
    want = F.layer_norm(s, (48,), g, be, 1e-6)
    shapes = [s.shape] * (2 if sum_out else 1)
    outs, fallbacks = run_kernel("plus.linear_layernorm", inputs, cfg, shapes)
    assert fallbacks == 0
    close_half(outs[0], want)
    reference = python_kernel("plus.linear_layernorm", inputs, cfg, shapes)
    close_half(outs[0], reference[0])
    if sum_out:
        close_half(outs[1], s)
        close_half(outs[1], reference[1])


def test_linear_native_takes_only_its_dtypes():
    """The dtypes the C++ kernel takes are the Python kernel's list (on this CPU), and the
    dispatcher's cost model agrees; float16 (not among them) and float64 fall back."""
    for name in native.native_kernels(rt.KERNELS):
        assert native.status()["kernels"][name]["dtypes"] == list(
            native.native_dtypes(rt.KERNELS[name])
        )
    assert native.runs_natively("plus.linear", {"w": "nk"}, "float32")
    assert not native.runs_natively("plus.linear", {"w": "nk"}, "float64")
    assert native.runs_natively("plus.linear", {"w": "nk"}, "bfloat16") == (
        "bfloat16" in native.cpu_dtypes()
    )
    for dtype in (torch.float16, torch.float64):
        x, w, b = torch.randn(3, 8, dtype=dtype), torch.randn(5, 8, dtype=dtype), torch.randn(5)
        (got,), fallbacks = run_kernel("plus.linear", [x, w, b.to(dtype)], "w=nk;bias=1", [(3, 5)])
        assert fallbacks == 1
        torch.testing.assert_close(got, (x @ w.t() + b.to(dtype)), rtol=1e-2, atol=1e-2)


def test_linear_native_merged_parts_fall_back_to_python():
    # (12 rows: past the few-row GEMV's 8, which reads the parts natively; tests/test_float_gemv.py)
    x, w1, w2 = torch.randn(12, 8), torch.randn(4, 8), torch.randn(5, 8)
    (got,), fallbacks = run_kernel("plus.linear", [x, w1, w2], "w=nk;parts=2", [(12, 9)])
    assert fallbacks == 1
    close(got, torch.cat([x @ w1.t(), x @ w2.t()], dim=1))


# ---------------------------------------------------------------------------------------------
# plus.attention


def _attention_reference(q, k, v, mask, causal, scale):
    s = q @ k.transpose(-1, -2) * scale
    if mask is not None:
        s = s + mask
    if causal:
        sq, sk = s.shape[-2:]
        s = s.masked_fill(torch.ones(sq, sk, dtype=torch.bool).tril().logical_not(), float("-inf"))
    return torch.softmax(s, -1) @ v


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("out_layout", ["bhsd", "bshd"])
@pytest.mark.parametrize(
    "mask_shape,causal",
    [(None, False), (None, True), ((2, 1, 1, 9), False), ((7, 9), True), ((2, 3, 7, 9), False)],
)
@pytest.mark.parametrize("scale", [None, 0.3])
def test_attention_native(layout, out_layout, mask_shape, causal, scale):
    torch.manual_seed(1)
    b, h, sq, sk, d, dv = 2, 3, 7, 9, 8, 5
    q, k, v = torch.randn(b, h, sq, d), torch.randn(b, h, sk, d), torch.randn(b, h, sk, dv)
    mask = torch.randn(*mask_shape) if mask_shape is not None else None
    want = _attention_reference(q, k, v, mask, causal, scale if scale else d**-0.5)

    def laid(t: torch.Tensor, to: str) -> torch.Tensor:
        return t.transpose(1, 2).contiguous() if to == "bshd" else t

    inputs = [laid(q, layout), laid(k, layout), laid(v, layout)]
    cfg = f"layout={layout};out_layout={out_layout};causal={int(causal)}"
    if mask is not None:
        inputs.append(mask)
        cfg += ";mask=1"
    if scale:
        cfg += f";scale={scale}"
    out_shape = tuple(laid(want, out_layout).shape)
    (got,), fallbacks = run_kernel("plus.attention", inputs, cfg, [out_shape])
    assert fallbacks == 0
    close(got, laid(want, out_layout))


@BF16
@pytest.mark.parametrize("mask_dtype", [None, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_native_bfloat16(mask_dtype, causal):
    """Scores and softmax in float32, the probabilities rounded once for the product with v,
    rounded once into out; equal to the Python kernel's (SDPA) and to torch's."""
    torch.manual_seed(2)
    b, h, sq, sk, d = 2, 3, 7, 9, 16
    q, k, v = (torch.randn(b, h, s, d).bfloat16() for s in (sq, sk, sk))
    inputs = [q, k, v]
    cfg = f"causal={int(causal)};zero_masked=1"
    mask = None
    if mask_dtype is not None:
        mask = torch.randn(b, 1, 1, sk).to(mask_dtype)
        mask[1, ..., :] = float("-inf")  # a batch whose every key is masked: zero_masked
        inputs.append(mask)
        cfg += ";mask=1"
    want = _attention_reference(
        q.float(), k.float(), v.float(), None if mask is None else mask.float(), causal, d**-0.5
    )
    if mask is not None:
        want[1] = 0.0
    (got,), fallbacks = run_kernel("plus.attention", inputs, cfg, [q.shape])
    assert fallbacks == 0
    close_half(got, want.bfloat16())
    close_half(got, python_kernel("plus.attention", inputs, cfg, [q.shape])[0])


def test_attention_native_causal_with_more_queries_than_keys_falls_back():
    q, k, v = torch.randn(1, 2, 6, 4), torch.randn(1, 2, 4, 4), torch.randn(1, 2, 4, 4)
    (got,), fallbacks = run_kernel("plus.attention", [q, k, v], "causal=1", [(1, 2, 6, 4)])
    assert fallbacks == 1
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-4, atol=1e-4)
