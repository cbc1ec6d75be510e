"""Benchmark the plus.* library kernels through the Relax VM against direct torch eager calls.

For each kernel at BERT-base shapes (M=128 tokens, hidden 768, FFN 3072, 12 heads) and at
ResNet-50 convolutions (batch 1), prints the median latency and GFLOP/s of

* ``vm``: a compiled Relax function whose body is one ``R.call_dps_packed("plus.<k>", ...)``,
* ``body``: the same kernel body called on torch tensors (no VM, no DLPack),
* ``torch``: the natural torch eager code for the op (``F.linear`` + ``F.gelu``, ...),
* ``copy``: a contiguous copy of the output's size (what a kernel without an ``out=`` variant
  pays to land its result in the DPS output; ``copy%`` is that against ``body``),

and the fixed VM -> Python -> torch crossing cost on a 4x4 ``plus.linear``. Each figure is the
lowest of ``--blocks`` interleaved block medians (robust to other processes on the machine).

Usage: ``python scripts/bench_kernels.py [--runs N] [--blocks B] [--only SUBSTRING] [--json FILE]``
"""

from __future__ import annotations

import argparse
import functools
import json
import math
from collections.abc import Callable

import plus_tvm
import plus_tvm.runtime as rt
import torch
import tvm
from plus_tvm.runtime.perf import time_us
from plus_tvm.target import resolve_target
from torch.nn import functional as F  # noqa: N812
from tvm import relax

M, HID, FFN, HEADS, HD = 128, 768, 3072, 12, 64


def median_ms(fn: Callable[[], object], runs: int, warmup: int = 5) -> float:
    return time_us(fn, runs, warmup) / 1e3


def vm_function(kernel: str, inputs: list[torch.Tensor], config: str, out_shape):
    bb = relax.BlockBuilder()
    params = [
        relax.Var(f"in{i}", relax.TensorType(tuple(t.shape), "float32"))
        for i, t in enumerate(inputs)
    ]
    with bb.function("main", params):
        out = bb.emit(
            relax.call_dps_packed(
                kernel,
                [*params, tvm.ir.StringImm(config)],
                out_ty=relax.TensorType(tuple(out_shape), "float32"),
            )
        )
        bb.emit_func_output(out)
    exe = tvm.compile(bb.get(), target=resolve_target("llvm"))
    vm = relax.VirtualMachine(exe, tvm.cpu())
    args = [tvm.runtime.tensor(t.contiguous().numpy()) for t in inputs]
    vm.set_input("main", *args)
    return lambda: vm.invoke_stateful("main"), lambda: vm.get_outputs("main")


def r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


def cases():
    """(name, kernel, inputs, config, out_shape, flops, torch_eager)."""
    x, x3 = r(M, HID), r(M, FFN)
    w_qkv, b_qkv = r(3 * HID, HID), r(3 * HID)
    w1, b1, w2, b2 = r(FFN, HID), r(FFN), r(HID, FFN), r(HID)
    wo, bo, res, g, beta = r(HID, HID), r(HID), r(M, HID), r(HID), r(HID)
    q, k, v = r(1, HEADS, M, HD), r(1, HEADS, M, HD), r(1, HEADS, M, HD)
    mask = torch.zeros(1, 1, 1, M)
    scores = r(1, HEADS, M, M)
    scale = 1 / math.sqrt(HD)
    yield (
        "linear qkv 128x768x2304 +b",
        "plus.linear",
        [x, w_qkv, b_qkv],
        "bias=1",
        (M, 3 * HID),
        2 * M * HID * 3 * HID,
        lambda: F.linear(x, w_qkv, b_qkv),
    )
    yield (
        "linear ffn1 128x768x3072 +b gelu",
        "plus.linear",
        [x, w1, b1],
        "bias=1;act=gelu",
        (M, FFN),
        2 * M * HID * FFN,
        lambda: F.gelu(F.linear(x, w1, b1)),
    )
    yield (
        "linear ffn2 128x3072x768 +b +res",
        "plus.linear",
        [x3, w2, b2, res],
        "bias=1;residual=1",
        (M, HID),
        2 * M * FFN * HID,
        lambda: F.linear(x3, w2, b2) + res,
    )
    yield (
        "linear kn 128x768x3072 +b",
        "plus.linear",
        [x, w1.t().contiguous(), b1],
        "w=kn;bias=1",
        (M, FFN),
        2 * M * HID * FFN,
        lambda: F.linear(x, w1, b1),
    )
    yield (
        "linear_layernorm 128x768x768",
        "plus.linear_layernorm",
        [x, wo, bo, res, g, beta],
        "bias=1;residual=1;gamma=1;beta=1;eps=1e-12",
        (M, HID),
        2 * M * HID * HID,
        lambda: F.layer_norm(F.linear(x, wo, bo) + res, (HID,), g, beta, 1e-12),
    )
    yield (
        "matmul q@k^T 12x128x64x128",
        "plus.matmul",
        [q[0], k[0]],
        f"tb=1;scale={scale}",
        (HEADS, M, M),
        2 * HEADS * M * M * HD,
        lambda: (q[0] @ k[0].transpose(-1, -2)) * scale,
    )
    yield (
        "attention 1x12x128x64 +mask",
        "plus.attention",
        [q, k, v, mask],
        "mask=1",
        (1, HEADS, M, HD),
        4 * HEADS * M * M * HD,
        lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
    )
    yield (
        "attention decomposed (torch ref)",
        "plus.attention",
        [q, k, v, mask],
        "mask=1",
        (1, HEADS, M, HD),
        4 * HEADS * M * M * HD,
        lambda: torch.softmax(q @ k.transpose(-1, -2) * scale + mask, -1) @ v,
    )
    yield (
        "layer_norm 128x768",
        "plus.layer_norm",
        [x, g, beta],
        "gamma=1;beta=1",
        (M, HID),
        8 * M * HID,
        lambda: F.layer_norm(x, (HID,), g, beta),
    )
    yield (
        "rms_norm 128x768",
        "plus.rms_norm",
        [x, g],
        "gamma=1",
        (M, HID),
        4 * M * HID,
        lambda: F.rms_norm(x, (HID,), g, 1e-6),
    )
    yield (
        "softmax 12x128x128",
        "plus.softmax",
        [scores],
        "",
        (1, HEADS, M, M),
        5 * HEADS * M * M,
        lambda: torch.softmax(scores, -1),
    )
    for cin, cout, hw, ksz, stride, pad in [
        (3, 64, 224, 7, 2, 3),
        (64, 64, 56, 3, 1, 1),
        (256, 64, 56, 1, 1, 0),
        (64, 256, 56, 1, 1, 0),
        (128, 128, 28, 3, 1, 1),
        (512, 512, 7, 3, 1, 1),
    ]:
        xc, wc, bc = r(1, cin, hw, hw), r(cout, cin, ksz, ksz), r(cout)
        ho = (hw + 2 * pad - ksz) // stride + 1
        yield (
            f"conv2d r50 {cin}->{cout} {hw}x{hw} k{ksz}s{stride} +b relu",
            "plus.conv2d",
            [xc, wc, bc],
            f"stride={stride},{stride};padding={pad};bias=1;act=relu",
            (1, cout, ho, ho),
            2 * cout * cin * ksz * ksz * ho * ho,
            lambda xc=xc, wc=wc, bc=bc, s=stride, p=pad: F.relu(F.conv2d(xc, wc, bc, s, p)),
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--only", default="")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(
        f"plus_tvm {plus_tvm.__version__}  torch {torch.__version__}  "
        f"threads {torch.get_num_threads()} (physical cores {rt.physical_cores()})"
    )
    header = (
        f"{'case':44s} {'vm ms':>8s} {'body ms':>8s} {'torch ms':>8s} {'copy ms':>8s} "
        f"{'copy%':>6s} {'vm GF/s':>8s} {'torch GF/s':>10s} {'torch/vm':>8s}"
    )
    print(header)
    print("-" * len(header))
    rows = []
    for name, kernel, inputs, config, out_shape, flops, eager in cases():
        if args.only and args.only not in name:
            continue
        through_vm, outputs = vm_function(kernel, inputs, config, out_shape)
        through_vm()
        want = eager()
        got = torch.from_numpy(outputs().numpy())
        err = float((got - want).abs().max())
        kobj = rt.KERNELS[kernel]
        cfg = kobj.spec.parse(config)
        out = torch.empty(out_shape)
        src = torch.empty(out_shape)
        # interleave the measurements in blocks so that drift on a shared machine hits every
        # column alike; report the lowest block median (other processes only ever add time)
        vm_ms, body_ms, torch_ms, copy_ms = [], [], [], []
        n = max(args.runs // args.blocks, 3)
        for _ in range(args.blocks):
            vm_ms.append(median_ms(through_vm, n))
            body_ms.append(median_ms(functools.partial(kobj.run, cfg, inputs, out), n))
            torch_ms.append(median_ms(eager, n))
            copy_ms.append(median_ms(functools.partial(out.copy_, src), n))
        row = {
            "case": name,
            "kernel": kernel,
            "config": config,
            "vm_ms": min(vm_ms),
            "body_ms": min(body_ms),
            "torch_ms": min(torch_ms),
            "copy_ms": min(copy_ms),
            "gflop": flops / 1e9,
            "max_abs_err": err,
        }
        rows.append(row)
        print(
            f"{name:44s} {row['vm_ms']:8.3f} {row['body_ms']:8.3f} {row['torch_ms']:8.3f} "
            f"{row['copy_ms']:8.3f} {100 * row['copy_ms'] / row['body_ms']:6.1f} "
            f"{flops / row['vm_ms'] / 1e6:8.1f} "
            f"{flops / row['torch_ms'] / 1e6:10.1f} {row['torch_ms'] / row['vm_ms']:8.2f}"
            f"   err {err:.1e}"
        )
    # crossing overhead: tiny plus.linear through the VM vs the same F.linear called directly
    through_vm, _ = vm_function("plus.linear", [r(4, 4), r(4, 4)], "prepack=0", (4, 4))
    a, b = r(4, 4), r(4, 4)
    vm_us = min(median_ms(through_vm, 400, 50) for _ in range(5)) * 1e3
    torch_us = min(median_ms(lambda: F.linear(a, b), 400, 50) for _ in range(5)) * 1e3
    print(
        f"\ncrossing: 4x4 plus.linear through the VM {vm_us:.1f} us, F.linear direct "
        f"{torch_us:.1f} us, overhead {vm_us - torch_us:.1f} us; "
        f"runtime.call_overhead_us() = {rt.call_overhead_us():.1f} us"
    )
    print(
        "library_gflops(llvm, measure=True): "
        + ", ".join(
            f"{k} {rt.library_gflops(k, 'llvm', measure=True):.0f}"
            for k in (
                "plus.linear",
                "plus.linear_layernorm",
                "plus.matmul",
                "plus.attention",
                "plus.conv2d",
            )
        )
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "overhead_us": vm_us - torch_us}, f, indent=1)


if __name__ == "__main__":
    main()
