"""Library kernels (plus_tvm.runtime) called through R.call_dps_packed in a compiled Relax VM."""

from __future__ import annotations

import math

import numpy as np
import plus_tvm
import plus_tvm.runtime as rt
import pytest
import torch
import tvm
from _tensors import TORCH_ACTIVATIONS
from plus_tvm.runtime import _common
from plus_tvm.target import resolve_target
from torch.nn import functional as F  # noqa: N812
from tvm import relax

TARGET = resolve_target("llvm")


@pytest.fixture(autouse=True)
def python_kernels():
    """These tests are of the Python kernels (the reference implementations): the VMs built
    here get them, even where an earlier test put the native fast paths in front."""
    import tvm_ffi

    for name, kernel in rt.KERNELS.items():
        tvm_ffi.register_global_func(name, kernel, override=True)
    yield
    rt.register()


def compile_call(kernel: str, inputs, config: str, out_shape, dtype: str = "float32"):
    """A compiled VM function ``main(*inputs) = plus.<kernel>(*inputs, config)``."""
    bb = relax.BlockBuilder()
    params = [
        relax.Var(f"in{i}", relax.TensorType(tuple(t.shape), str(t.dtype).replace("torch.", "")))
        for i, t in enumerate(inputs)
    ]
    with bb.function("main", params):
        out = bb.emit(
            relax.call_dps_packed(
                f"plus.{kernel}",
                [*params, tvm.ir.StringImm(config)],
                out_ty=relax.TensorType(tuple(out_shape), dtype),
            )
        )
        bb.emit_func_output(out)
    exe = tvm.compile(bb.get(), target=TARGET)
    return relax.VirtualMachine(exe, tvm.cpu())["main"]


def run(kernel: str, inputs, config: str, out_shape, dtype: str = "float32") -> torch.Tensor:
    fn = compile_call(kernel, inputs, config, out_shape, dtype)
    args = [tvm.runtime.tensor(t.contiguous().numpy()) for t in inputs]
    return torch.from_numpy(fn(*args).numpy())


def close(got: torch.Tensor, want: torch.Tensor, rtol: float = 1e-4) -> None:
    scale = max(1.0, float(want.abs().max()))
    torch.testing.assert_close(got, want, rtol=rtol, atol=rtol * scale)


def rand(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


ACT = TORCH_ACTIVATIONS


def test_registered_on_import():
    assert plus_tvm.runtime is rt
    for name in rt.KERNELS:
        assert tvm.get_global_func(name, allow_missing=True) is not None
    rt.register()  # idempotent
    # the kernels the warehouse's shipped entries use (a new kernel file adds itself)
    assert set(rt.KERNELS) >= {
        "plus.linear",
        "plus.linear_layernorm",
        "plus.matmul",
        "plus.attention",
        "plus.layer_norm",
        "plus.rms_norm",
        "plus.softmax",
        "plus.conv2d",
    }


# ---------------------------------------------------------------------------------------------
# linear


@pytest.fixture(params=["onednn", "blas"])
def linear_path(request, monkeypatch):
    """Run a linear test on oneDNN's prepacked path and on the small-GEMM BLAS path."""
    threshold = 0.0 if request.param == "onednn" else float("inf")
    monkeypatch.setattr(rt.linear, "ONEDNN_MIN_FLOPS", threshold)
    return request.param


def test_activation_references_cover_the_kernels_contract():
    assert sorted(ACT) == sorted(_common.ACTIVATIONS)


@pytest.mark.parametrize("act", list(ACT))
def test_linear_activations(act, linear_path):
    x, w, b = rand(6, 16), rand(24, 16), rand(24)
    got = run("linear", [x, w, b], f"w=nk;bias=1;act={act}", (6, 24))
    close(got, ACT[act](F.linear(x, w, b)))


@pytest.mark.parametrize("layout", ["nk", "kn"])
@pytest.mark.parametrize("bias", [0, 1])
@pytest.mark.parametrize("residual", [0, 1])
def test_linear_layouts_bias_residual(layout, bias, residual, linear_path):
    x, w, b, r = rand(2, 5, 16), rand(24, 16), rand(24), rand(2, 5, 24)
    inputs = [x, w if layout == "nk" else w.t().contiguous()]
    want = F.linear(x, w, b if bias else None)
    if bias:
        inputs.append(b)
    if residual:
        inputs.append(r)
        want = want + r
    got = run("linear", inputs, f"w={layout};bias={bias};residual={residual}", (2, 5, 24))
    close(got, want)


def test_linear_act_then_residual(linear_path):
    x, w, b, r = rand(3, 4, 16), rand(8, 16), rand(8), rand(3, 4, 8)
    got = run("linear", [x, w, b, r], "bias=1;residual=1;act=gelu", (3, 4, 8))
    close(got, F.gelu(F.linear(x, w, b)) + r)


def test_linear_no_prepack_and_float64_generic_path():
    x, w, b = rand(4, 8), rand(6, 8), rand(6)
    close(run("linear", [x, w, b], "bias=1;prepack=0;act=relu", (4, 6)), F.relu(F.linear(x, w, b)))
    xd, wd, bd, rd = x.double(), w.t().contiguous().double(), b.double(), rand(4, 6).double()
    got = run("linear", [xd, wd, bd, rd], "w=kn;bias=1;residual=1;act=silu", (4, 6), "float64")
    close(got, F.silu(F.linear(xd, wd.t(), bd)) + rd)


def test_linear_layernorm(linear_path):
    x, w, b, r = rand(2, 6, 32), rand(32, 32), rand(32), rand(2, 6, 32)
    g, beta = rand(32), rand(32)
    got = run(
        "linear_layernorm",
        [x, w, b, r, g, beta],
        "w=nk;bias=1;residual=1;gamma=1;beta=1;eps=1e-12",
        (2, 6, 32),
    )
    close(got, F.layer_norm(F.linear(x, w, b) + r, (32,), g, beta, 1e-12))
    # kn weight, no bias, gamma only
    got = run(
        "linear_layernorm", [x, w.t().contiguous(), r, g], "w=kn;residual=1;gamma=1", (2, 6, 32)
    )
    close(got, F.layer_norm(F.linear(x, w) + r, (32,), g, None, 1e-5))


# ---------------------------------------------------------------------------------------------
# matmul and attention


@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_matmul_transposes_scale(ta, tb):
    a, b = rand(3, 5, 7), rand(3, 7, 4)
    ia = a.transpose(-1, -2).contiguous() if ta else a
    ib = b.transpose(-1, -2).contiguous() if tb else b
    got = run("matmul", [ia, ib], f"ta={ta};tb={tb};scale=0.125", (3, 5, 4))
    close(got, (a @ b) * 0.125)


def test_matmul_broadcast_and_bias():
    a, b, bias = rand(2, 3, 5, 7), rand(7, 4), rand(4)
    close(run("matmul", [a, b, bias], "bias=1", (2, 3, 5, 4)), a @ b + bias)
    a2, b2 = rand(5, 7), rand(7, 4)
    close(run("matmul", [a2, b2, bias], "bias=1", (5, 4)), a2 @ b2 + bias)
    a4, b4 = rand(2, 3, 7, 5), rand(2, 3, 7, 4)  # same batch dims, a transposed, bias
    close(
        run("matmul", [a4, b4, bias], "ta=1;bias=1;scale=0.5", (2, 3, 5, 4)),
        a4.transpose(-1, -2) @ b4 * 0.5 + bias,
    )
    bias2 = rand(2, 3, 1, 4)  # a batched bias takes the matmul path
    close(
        run("matmul", [a4, b4, bias2], "ta=1;bias=1", (2, 3, 5, 4)),
        a4.transpose(-1, -2) @ b4 + bias2,
    )
    close(run("matmul", [a2, b2], "scale=3", (5, 4)), a2 @ b2 * 3)  # out is an ignored input
    a3, b3 = rand(1, 3, 5, 7), rand(2, 1, 7, 4)
    close(run("matmul", [a3, b3], "", (2, 3, 5, 4)), a3 @ b3)


def ref_attention(q, k, v, scale, mask=None, causal=False):
    s = q @ k.transpose(-1, -2) * scale
    if mask is not None:
        s = s + mask
    if causal:
        keep = torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool).tril()
        s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, -1) @ v


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("out_layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("causal", [0, 1])
def test_attention_layouts_causal(layout, out_layout, causal):
    b, h, s, d = 2, 3, 8, 16
    q, k, v = rand(b, h, s, d), rand(b, h, s, d), rand(b, h, s, d)
    want = ref_attention(q, k, v, 1 / math.sqrt(d), causal=bool(causal))
    inputs = [q, k, v] if layout == "bhsd" else [t.transpose(1, 2).contiguous() for t in (q, k, v)]
    out_shape = (b, h, s, d) if out_layout == "bhsd" else (b, s, h, d)
    got = run(
        "attention", inputs, f"layout={layout};out_layout={out_layout};causal={causal}", out_shape
    )
    close(got, want if out_layout == "bhsd" else want.transpose(1, 2))


@pytest.mark.parametrize("causal", [0, 1])
def test_attention_mask_and_scale(causal):
    b, h, sq, sk, d = 2, 2, 6, 6, 8
    q, k, v = rand(b, h, sq, d), rand(b, h, sk, d), rand(b, h, sk, d)
    # a BERT-style padding mask [B, 1, 1, Sk]: the last two keys of batch 1 masked out
    mask = torch.zeros(b, 1, 1, sk)
    mask[1, ..., -2:] = -10000.0
    got = run("attention", [q, k, v, mask], f"mask=1;scale=0.3;causal={causal}", (b, h, sq, d))
    close(got, ref_attention(q, k, v, 0.3, mask, bool(causal)))


def test_attention_cross_lengths():
    q, k, v = rand(1, 2, 3, 8), rand(1, 2, 10, 8), rand(1, 2, 10, 8)
    close(run("attention", [q, k, v], "scale=0.5", (1, 2, 3, 8)), ref_attention(q, k, v, 0.5))


# ---------------------------------------------------------------------------------------------
# normalization, softmax


def test_layer_norm_variants():
    x, g, b = rand(2, 5, 12), rand(12), rand(12)
    close(
        run("layer_norm", [x, g, b], "gamma=1;beta=1;eps=1e-6", x.shape),
        F.layer_norm(x, (12,), g, b, 1e-6),
    )
    close(run("layer_norm", [x, g], "gamma=1", x.shape), F.layer_norm(x, (12,), g, None))
    close(run("layer_norm", [x], "", x.shape), F.layer_norm(x, (12,)))
    g2 = rand(5, 12)
    close(run("layer_norm", [x, g2], "gamma=1;axes=2", x.shape), F.layer_norm(x, (5, 12), g2))


def test_rms_norm():
    x, g = rand(3, 7, 16), rand(16)
    want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * g
    close(run("rms_norm", [x, g], "gamma=1;eps=1e-6", x.shape), want)
    want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
    close(run("rms_norm", [x], "eps=1e-5", x.shape), want)


def test_softmax():
    x = rand(2, 3, 9)
    close(run("softmax", [x], "", x.shape), torch.softmax(x, -1))
    close(run("softmax", [x], "axis=2;scale=0.25", x.shape), torch.softmax(x * 0.25, -1))


# ---------------------------------------------------------------------------------------------
# conv2d


@pytest.fixture(params=["onednn", "aten"])
def conv_impl(request, monkeypatch):
    """Force one of plus.conv2d's two CPU implementations (instead of the timed choice)."""
    conv = rt.KERNELS["plus.conv2d"]
    impl = request.param

    def choose(cfg, args):
        (conv._onednn if impl == "onednn" else conv._aten)(cfg, *args)
        return impl

    monkeypatch.setattr(conv, "_choose", choose)
    conv.choices.clear()
    yield impl
    conv.choices.clear()


@pytest.mark.parametrize(
    "cin,cout,k,stride,padding,groups",
    [
        (3, 8, 3, 1, (1, 1, 1, 1), 1),
        (4, 6, 3, 2, (1, 1, 1, 1), 1),
        (8, 8, 3, 1, (1, 1, 1, 1), 8),  # depthwise
        (4, 8, 1, 1, (0, 0, 0, 0), 2),
        (3, 4, 3, 1, (0, 1, 2, 1), 1),  # asymmetric padding
    ],
)
def test_conv2d_shapes(cin, cout, k, stride, padding, groups, conv_impl):
    x, w = rand(2, cin, 9, 9), rand(cout, cin // groups, k, k)
    t, left, b, r = padding
    want = F.conv2d(F.pad(x, (left, r, t, b)), w, None, stride, 0, 1, groups)
    cfg = f"stride={stride},{stride};padding={t},{left},{b},{r};groups={groups}"
    close(run("conv2d", [x, w], cfg, want.shape), want)


@pytest.mark.parametrize("act", ["none", "relu", "silu", "gelu"])
@pytest.mark.parametrize("residual", [0, 1])
def test_conv2d_bias_act_residual(act, residual, conv_impl):
    x, w, b = rand(1, 8, 10, 10), rand(16, 8, 3, 3), rand(16)
    y = ACT[act](F.conv2d(x, w, b, 1, 1, 2))
    inputs = [x, w, b]
    if residual:
        r = rand(*y.shape)
        inputs.append(r)
        y = y + r
    cfg = f"padding=1;dilation=2,2;bias=1;residual={residual};act={act}"
    w_out = (10 + 2 - 2 * 2) // 1 + 0  # dilation 2, kernel 3, padding 1 -> 8
    assert y.shape[-1] == w_out
    close(run("conv2d", inputs, cfg, y.shape), y)
    # second run uses the per-shape implementation chosen at the first call
    close(run("conv2d", inputs, cfg, y.shape), y)


# ---------------------------------------------------------------------------------------------
# config errors


@pytest.mark.parametrize(
    "config,match",
    [
        ("act=swishy", r"plus\.linear.*'act'"),
        ("w=kn;colour=red", r"plus\.linear.*unknown config key 'colour'"),
        ("bias=2", r"plus\.linear.*'bias'"),
        ("bias", r"plus\.linear.*not key=value"),
    ],
)
def test_bad_config_raises_naming_kernel_and_key(config, match):
    x, w = rand(2, 4), rand(3, 4)
    with pytest.raises(Exception, match=match):
        run("linear", [x, w], config, (2, 3))


def test_bad_config_direct_and_wrong_input_count():
    spec = rt.KERNELS["plus.attention"].spec
    with pytest.raises(ValueError, match=r"plus\.attention.*'scale'"):
        spec.parse("scale=big")
    with pytest.raises(Exception, match=r"plus\.linear.*implies 3 tensor inputs"):
        run("linear", [rand(2, 4), rand(3, 4)], "bias=1", (2, 3))
    with pytest.raises(Exception, match=r"plus\.attention.*additive float mask"):
        q = rand(1, 1, 2, 4)
        rt.KERNELS["plus.attention"].call(
            q, q, q, torch.ones(1, 1, 2, 2, dtype=torch.bool), config="mask=1", out=q.clone()
        )
    with pytest.raises(Exception, match=r"plus\.softmax.*last axis"):
        run("softmax", [rand(2, 4)], "axis=0", (2, 4))


def test_shape_mismatches_raise_before_running():
    with pytest.raises(Exception, match=r"plus\.linear.*disagree on K"):
        run("linear", [rand(2, 4), rand(3, 5)], "", (2, 3))
    with pytest.raises(Exception, match=r"plus\.matmul.*output shape \(2, 4\)"):
        run("matmul", [rand(2, 3), rand(3, 5)], "", (2, 4))
    with pytest.raises(Exception, match=r"plus\.conv2d.*output shape"):
        run("conv2d", [rand(1, 2, 5, 5), rand(3, 2, 3, 3)], "padding=1", (1, 3, 3, 3))


def test_linear_residual_broadcast(linear_path):
    x, w, r = rand(2, 8, 32), rand(64, 32), rand(64)
    close(run("linear", [x, w, r], "residual=1", (2, 8, 64)), F.linear(x, w) + r)


def test_config_parse_is_cached():
    spec = rt.KERNELS["plus.linear"].spec
    a = spec.parse("act=gelu;bias=1")
    assert spec.parse("act=gelu;bias=1") is a
    assert a.act == "gelu" and a.bias and not a.residual and a.w == "nk"


# ---------------------------------------------------------------------------------------------
# prepack cache


def test_prepack_once_and_no_collisions():
    assert 2 * 64 * 128 * 256 >= rt.linear.ONEDNN_MIN_FLOPS
    rt.clear_caches()
    cache = rt.KERNELS["plus.linear"].cache
    x = rand(64, 128)  # 4 MFLOP: above ONEDNN_MIN_FLOPS, so the weight is packed
    w1, w2 = rand(256, 128), rand(256, 128)
    fn = compile_call("linear", [x, w1], "w=nk", (64, 256))
    tx, t1, t2 = (tvm.runtime.tensor(t.numpy()) for t in (x, w1, w2))
    packs = cache.packs
    close(torch.from_numpy(fn(tx, t1).numpy()), F.linear(x, w1))
    assert cache.packs == packs  # first sighting: plain weight, nothing packed
    close(torch.from_numpy(fn(tx, t1).numpy()), F.linear(x, w1))
    assert cache.packs == packs + 1  # seen again: packed once
    for _ in range(3):
        close(torch.from_numpy(fn(tx, t1).numpy()), F.linear(x, w1))
    assert cache.packs == packs + 1  # not re-packed
    for _ in range(2):
        close(torch.from_numpy(fn(tx, t2).numpy()), F.linear(x, w2))  # a different weight
    assert cache.packs == packs + 2
    close(torch.from_numpy(fn(tx, t1).numpy()), F.linear(x, w1))
    assert cache.packs == packs + 2 and len(cache) == 2
    rt.clear_caches()
    assert len(cache) == 0


@pytest.mark.parametrize("rows", [2, 64])  # below and above ONEDNN_MIN_FLOPS
@pytest.mark.parametrize("layout", ["nk", "kn"])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_parts_is_the_concatenation_of_its_parts(rows, layout, bias):
    rt.clear_caches()
    kernel = rt.KERNELS["plus.linear"]
    x = rand(rows, 128)
    sizes = (96, 128, 40)
    ws = [rand(n, 128) for n in sizes]
    bs = [rand(n) for n in sizes]
    args = [w if layout == "nk" else w.t().contiguous() for w in ws]
    cfg = f"w={layout};parts=3;act=gelu;bias={int(bias)}"
    expected = torch.cat(
        [F.gelu(F.linear(x, w, b if bias else None)) for w, b in zip(ws, bs)], dim=-1
    )
    for _ in range(4):  # first sighting (joined per call), then packed / cached
        out = torch.empty(rows, sum(sizes))
        kernel.call(x, *args, *(bs if bias else []), config=cfg, out=out)
        close(out, expected)
    joined = [k for k in kernel.cache.entries if k[0] == "joined"]
    assert len(joined) == 1
    # a part replaced (forgotten by address): its joined form goes with it
    kernel.cache.forget(args[1].data_ptr())
    assert not [k for k in kernel.cache.entries if k[0] == "joined"]
    with pytest.raises(ValueError, match="residual cannot be added"):
        kernel.call(
            x,
            *args,
            x,
            config="parts=3;w=" + layout + ";residual=1",
            out=torch.empty(rows, sum(sizes)),
        )
    with pytest.raises(ValueError, match="disagree on K"):
        kernel.call(x, ws[0], rand(8, 64), config="parts=2", out=torch.empty(rows, 104))


def test_prepack_cache_keys_and_keeps_source_alive():
    cache = rt.PrepackCache("test", pack_after=1)
    w = torch.randn(4, 4)
    calls = []

    def pack(t):
        calls.append(t)
        return t.t().contiguous()

    p1 = cache.get(w, ("v", "nk"), pack)
    assert cache.get(w, ("v", "nk"), pack) is p1
    cache.get(w, ("v", "kn"), pack)  # another variant of the same weight
    cache.get(w.t(), ("v", "nk"), pack)  # same pointer, other strides
    assert cache.packs == 3 and len(calls) == 3
    assert all(
        entry[0] is w or entry[0].data_ptr() == w.data_ptr() for entry in cache.entries.values()
    )
    assert cache.bytes == 3 * 16 * 4


def test_prepack_cache_budget_drops_least_recently_used():
    cache = rt.PrepackCache(
        "test", budget_bytes=2 * 64, pack_after=1
    )  # room for two 4x4 fp32 packs
    a, b, c = torch.randn(4, 4), torch.randn(4, 4), torch.randn(4, 4)
    pack = torch.clone
    cache.get(a, ("v",), pack)
    cache.get(b, ("v",), pack)
    cache.get(a, ("v",), pack)  # a is now the most recently used
    cache.get(c, ("v",), pack)  # evicts b
    assert len(cache) == 2 and cache.bytes == 128
    cache.get(a, ("v",), pack)
    assert cache.packs == 3
    cache.get(b, ("v",), pack)
    assert cache.packs == 4


def test_fresh_weight_every_call_is_never_packed():
    cache = rt.PrepackCache("test")
    weights = [torch.randn(4, 4) for _ in range(5)]  # alive, so no address is recycled
    for w in weights:
        assert cache.get(w, ("v",), torch.clone) is None
    assert cache.packs == 0 and len(cache) == 0


def test_conv2d_prepack_once():
    rt.clear_caches()
    conv = rt.KERNELS["plus.conv2d"]
    x, w, b = rand(1, 16, 14, 14), rand(32, 16, 3, 3), rand(32)
    out = torch.empty(1, 32, 14, 14)
    packs = conv.cache.packs
    for _ in range(3):
        conv.call(x, w, b, config="padding=1;bias=1;act=relu", out=out)
        close(out, F.relu(F.conv2d(x, w, b, 1, 1)))
    assert conv.cache.packs - packs <= 1  # 0 when the timing chose F.conv2d (entry dropped)
    assert len(conv.choices) == 1


# ---------------------------------------------------------------------------------------------
# cost figures and threads


def test_overhead_and_gflops_figures():
    us = rt.call_overhead_us()
    assert 0.0 <= us < 1000.0
    assert rt.call_overhead_us() == us  # measured once
    assert rt.library_gflops("plus.linear", "cuda") > rt.library_gflops("plus.linear", "llvm") > 1
    assert rt.library_gflops("plus.matmul", "llvm", measure=True) > 1  # a real measurement
    assert rt.physical_cores() >= 1
    small, big = rt.library_time_us("plus.linear", 2e3), rt.library_time_us("plus.linear", 6e8)
    assert small == pytest.approx(us, abs=0.1) and big > small + 100


# ---------------------------------------------------------------------------------------------
# CUDA (skipped without a GPU)


@pytest.mark.gpu
def test_cuda_kernels_direct():
    dev = torch.device("cuda")
    x, w, b, r = (t.to(dev) for t in (rand(2, 5, 32), rand(48, 32), rand(48), rand(2, 5, 48)))
    out = torch.empty(2, 5, 48, device=dev)
    for act in ACT:
        rt.KERNELS["plus.linear"].call(x, w, b, r, config=f"bias=1;residual=1;act={act}", out=out)
        close(out.cpu(), (ACT[act](F.linear(x, w, b)) + r).cpu(), rtol=2e-3)
    q, k, v = (rand(1, 2, 16, 32).to(dev) for _ in range(3))
    o = torch.empty(1, 2, 16, 32, device=dev)
    rt.KERNELS["plus.attention"].call(q, k, v, config="causal=1", out=o)
    close(o.cpu(), ref_attention(q, k, v, 32**-0.5, causal=True).cpu(), rtol=2e-3)
    xc, wc = rand(1, 8, 10, 10).to(dev), rand(8, 8, 3, 3).to(dev)
    oc = torch.empty(1, 8, 10, 10, device=dev)
    rt.KERNELS["plus.conv2d"].call(xc, wc, config="padding=1;act=relu", out=oc)
    close(oc.cpu(), F.relu(F.conv2d(xc, wc, None, 1, 1)).cpu(), rtol=2e-3)


@pytest.mark.gpu
def test_cuda_linear_through_vm():
    target = resolve_target("cuda")
    x, w = rand(4, 16), rand(8, 16)
    bb = relax.BlockBuilder()
    px = relax.Var("x", relax.TensorType((4, 16), "float32"))
    pw = relax.Var("w", relax.TensorType((8, 16), "float32"))
    with bb.function("main", [px, pw]):
        out = bb.emit(
            relax.call_dps_packed(
                "plus.linear",
                [px, pw, tvm.ir.StringImm("act=relu")],
                out_ty=relax.TensorType((4, 8), "float32"),
            )
        )
        bb.emit_func_output(out)
    exe = tvm.compile(bb.get(), target=target)
    dev = tvm.cuda(0)
    vm = relax.VirtualMachine(exe, dev)
    got = vm["main"](tvm.runtime.tensor(x.numpy(), dev), tvm.runtime.tensor(w.numpy(), dev))
    close(torch.from_numpy(got.numpy()), F.relu(F.linear(x, w)), rtol=2e-3)


def test_numpy_interop_of_outputs():
    x = rand(2, 3)
    got = run("softmax", [x], "scale=2", (2, 3))
    assert isinstance(got, torch.Tensor)
    np.testing.assert_allclose(got.numpy(), torch.softmax(x * 2, -1).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_kernels(dtype, linear_path):
    tdt = getattr(torch, dtype)
    x, w, b = rand(4, 32).to(tdt), rand(16, 32).to(tdt), rand(16).to(tdt)

    def run_half(kernel, inputs, config, shape):
        fn = compile_call(kernel, inputs, config, shape, dtype)
        args = [tvm.runtime.from_dlpack(t.contiguous()) for t in inputs]
        return torch.from_dlpack(fn(*args)).clone().float()

    def near(got, want):
        torch.testing.assert_close(got, want.float(), rtol=3e-2, atol=3e-2)

    near(run_half("linear", [x, w, b], "bias=1;act=gelu", (4, 16)), F.gelu(F.linear(x, w, b)))
    q, k, v = (rand(1, 2, 8, 16).to(tdt) for _ in range(3))
    near(
        run_half("attention", [q, k, v], "causal=1", (1, 2, 8, 16)),
        F.scaled_dot_product_attention(q, k, v, is_causal=True),
    )
    g = rand(32).to(tdt)
    near(run_half("layer_norm", [x, g], "gamma=1", (4, 32)), F.layer_norm(x, (32,), g))
    near(run_half("rms_norm", [x, g], "gamma=1", (4, 32)), F.rms_norm(x, (32,), g, 1e-6))
    near(run_half("softmax", [x], "", (4, 32)), torch.softmax(x, -1))
    xc, wc = rand(1, 4, 6, 6).to(tdt), rand(8, 4, 3, 3).to(tdt)
    near(
        run_half("conv2d", [xc, wc], "padding=1;act=relu", (1, 8, 6, 6)),
        F.relu(F.conv2d(xc, wc, None, 1, 1)),
    )


def test_float16_on_a_cpu_without_float16_gemm_computes_in_float32(monkeypatch):
    """Where the CPU has no float16 GEMM instructions (torch's float16 GEMM runs 4.5x slower
    than float32 there), a float16 linear widens its weights once (packed by the cache) and
    computes in float32: as exact as float32 rounded once, never worse than torch's float16."""
    monkeypatch.setattr(rt.linear, "ONEDNN_MIN_FLOPS", 0.0)
    monkeypatch.setattr(rt._common, "cpu_dtypes", lambda: ("float32",))
    rt.clear_caches()
    cache = rt.KERNELS["plus.linear"].cache
    torch.manual_seed(0)
    x, w, b, r = (t.half() for t in (rand(3, 5, 64), rand(48, 64), rand(48), rand(3, 5, 48)))
    want64 = F.gelu(F.linear(x.double(), w.double(), b.double())) + r.double()
    torch_err = float((F.gelu(F.linear(x, w, b)) + r).double().sub(want64).abs().max())
    fn = compile_call("linear", [x, w, b, r], "bias=1;residual=1;act=gelu", (3, 5, 48), "float16")
    args = [tvm.runtime.tensor(t.numpy()) for t in (x, w, b, r)]
    for _ in range(3):
        got = torch.from_numpy(fn(*args).numpy())
        assert got.dtype == torch.float16
        err = float(got.double().sub(want64).abs().max())
        assert err <= max(torch_err, 1e-3)
        exact = (F.gelu(F.linear(x.float(), w.float(), b.float())) + r.float()).half()
        close(got.float(), exact.float(), rtol=1e-3)
    # the widened weight was packed once, as float32
    packed = [e[1] for e in cache.entries.values()]
    assert len(packed) == 1 and packed[0].dtype == torch.float32


@pytest.mark.parametrize("bn", [0, 1])
def test_float16_conv2d_on_a_cpu_without_float16_computes_in_float32(bn, monkeypatch):
    """The convolution in float32 on parameters widened once, rounded where torch's float16
    graph rounds (the convolution's result; the BatchNorm in float32 on it): at least as
    accurate as torch's float16 against float64, NHWC and NCHW."""
    monkeypatch.setattr(rt._common, "cpu_dtypes", lambda: ("float32",))
    rt.clear_caches()
    cache = rt.KERNELS["plus.conv2d"].cache
    torch.manual_seed(0)
    x, w, b = rand(1, 8, 10, 10).half(), rand(16, 8, 3, 3).half() * 0.3, rand(16).half()
    stats = [rand(16).half(), rand(16).half(), rand(16).half(), rand(16).abs().half() + 0.5]

    def reference(dtype):
        g, beta, mean, var = (t.to(dtype) for t in stats)
        y = F.conv2d(x.to(dtype), w.to(dtype), b.to(dtype), padding=1)
        if bn:
            y = F.batch_norm(y, mean, var, g, beta, eps=1e-5)
        return F.relu(y)

    want64 = reference(torch.float64)
    torch_err = float(reference(torch.float16).double().sub(want64).abs().max())
    inputs = [x, w, b, *(stats if bn else [])]
    cfg = "padding=1;bias=1;act=relu" + (";bn=1;bn_eps=1e-5" if bn else "")
    for layout in ("nchw", "nhwc"):
        args = [x.permute(0, 2, 3, 1).contiguous() if layout == "nhwc" else x, *inputs[1:]]
        shape = (1, 10, 10, 16) if layout == "nhwc" else (1, 16, 10, 10)
        fn = compile_call("conv2d", args, f"{cfg};layout={layout}", shape, "float16")
        targs = [tvm.runtime.tensor(t.contiguous().numpy()) for t in args]
        for _ in range(3):
            got = torch.from_numpy(fn(*targs).numpy())
            got = got.permute(0, 3, 1, 2) if layout == "nhwc" else got
            assert float(got.double().sub(want64).abs().max()) <= max(torch_err, 1e-3)
    # the weight and bias were widened once per layout's copy of them (3 calls each), kept as
    # float32 by the cache (the BatchNorm's statistics: once, as its float32 scale and shift)
    widened = [e[1] for k, e in cache.entries.items() if k[-1] == ("float32",)]
    assert len(widened) == 2 * 2
    assert all(t.dtype == torch.float32 for t in widened)


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_float16_conv2d_overflow_before_its_batch_norm_is_inf_as_in_torch(layout, monkeypatch):
    """A float16 convolution whose result overflows (above 65504) before a BatchNorm that
    would scale it back: torch's float16 graph gives inf there (and a residual add keeps it),
    so must the float32-computed path, rather than a finite value from a folded BatchNorm."""
    monkeypatch.setattr(rt._common, "cpu_dtypes", lambda: ("float32",))
    rt.clear_caches()
    torch.manual_seed(1)
    x, w = (rand(1, 4, 6, 6) * 30).half(), (rand(8, 4, 1, 1) * 1000).half()
    b, r = torch.zeros(8).half(), rand(1, 8, 6, 6).half()
    g, beta = torch.full((8,), 1e-3).half(), torch.zeros(8).half()
    mean, var = torch.zeros(8).half(), torch.ones(8).half()
    want = F.relu(F.batch_norm(F.conv2d(x, w, b), mean, var, g, beta, eps=1e-5)) + r
    assert bool(torch.isinf(want).any()) and bool(torch.isfinite(want).any())
    args = [x, w, b, g, beta, mean, var, r]
    if layout == "nhwc":
        args = [
            t.permute(0, 2, 3, 1).contiguous() if t.dim() == 4 and t is not w else t for t in args
        ]
    shape = tuple(args[-1].shape)
    cfg = f"bias=1;bn=1;bn_eps=1e-5;act=relu;residual=1;layout={layout}"
    fn = compile_call("conv2d", args, cfg, shape, "float16")
    got = torch.from_numpy(fn(*[tvm.runtime.tensor(t.contiguous().numpy()) for t in args]).numpy())
    got = got.permute(0, 3, 1, 2) if layout == "nhwc" else got
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    finite = torch.isfinite(want)
    torch.testing.assert_close(got[finite], want[finite], rtol=2e-3, atol=2e-3)


def test_float16_linear_layernorm_and_matmul_on_a_cpu_without_float16(monkeypatch):
    """linear + LayerNorm and matmul in float16 compute in float32 and round once where the
    CPU has no float16 instructions: within one float16 rounding of the float32 result, and
    the linear's weight, bias, gamma and beta widened once (kept by the cache)."""
    monkeypatch.setattr(rt.linear, "ONEDNN_MIN_FLOPS", 0.0)
    monkeypatch.setattr(rt._common, "cpu_dtypes", lambda: ("float32",))
    rt.clear_caches()
    torch.manual_seed(0)
    x, w, b, r = (t.half() for t in (rand(2, 6, 32), rand(32, 32), rand(32), rand(2, 6, 32)))
    g, beta = rand(32).half(), rand(32).half()
    want = F.layer_norm(
        F.linear(x.float(), w.float(), b.float()) + r.float(), (32,), g.float(), beta.float()
    )
    cfg = "w=nk;bias=1;residual=1;gamma=1;beta=1"
    fn = compile_call("linear_layernorm", [x, w, b, r, g, beta], cfg, (2, 6, 32), "float16")
    args = [tvm.runtime.tensor(t.numpy()) for t in (x, w, b, r, g, beta)]
    for _ in range(3):
        got = torch.from_numpy(fn(*args).numpy())
        assert got.dtype == torch.float16
        close(got.float(), want.half().float(), rtol=1e-3)
    cache = rt.KERNELS["plus.linear_layernorm"].cache
    widened = [e[1] for k, e in cache.entries.items() if k[-1] == ("float32",)]
    assert len(widened) == 4 and all(t.dtype == torch.float32 for t in widened)

    a, m, bias = rand(2, 3, 5, 64).half(), rand(2, 3, 64, 4).half(), rand(4).half()
    got = run("matmul", [a, m, bias], "bias=1;scale=0.5", (2, 3, 5, 4), "float16")
    assert got.dtype == torch.float16
    close(got.float(), (a.float() @ m.float() * 0.5 + bias.float()).half().float(), rtol=1e-3)


def test_float16_computed_in_float32_still_overflows_where_torch_does(monkeypatch):
    """Widened to float32, a float16 call still rounds where torch's graph does: a linear's
    output past float16's range is inf before the residual brings it back (torch: inf), and a
    linear + LayerNorm's sum past it gives NaN (BART's finiteness test relies on it)."""
    monkeypatch.setattr(rt.linear, "ONEDNN_MIN_FLOPS", 0.0)
    monkeypatch.setattr(rt._common, "cpu_dtypes", lambda: ("float32",))
    rt.clear_caches()
    x = torch.ones(2, 16).half()
    w = torch.full((8, 16), 5000.0).half()  # x @ w.T = 80000 > 65504
    r = torch.full((2, 8), -60000.0).half()  # back in range in float32
    want = F.linear(x, w) + r
    assert torch.isinf(want).all()
    got = run("linear", [x, w, r], "residual=1", (2, 8), "float16")
    assert torch.equal(got, want)
    g, b = torch.ones(8).half(), torch.zeros(8).half()
    want = F.layer_norm(F.linear(x, w), (8,), g, b)
    assert torch.isnan(want).all()
    got = run("linear_layernorm", [x, w, g, b], "gamma=1;beta=1", (2, 8), "float16")
    assert torch.isnan(got).all()
