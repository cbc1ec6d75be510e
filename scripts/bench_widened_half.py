"""Where a half-precision GEMM computed in float32 beats torch's half GEMM on this CPU.

The measurement behind ``plus_tvm.runtime._common.WIDEN_MIN_ROWS``: on a CPU without GEMM
instructions for bfloat16 / float16 (``cpu_features.cpu_dtypes``), each case times the call as
plus's Python kernels run it both ways:

- ``half``: torch's half op writing into the output (``addmm`` / ``F.conv2d`` / ``baddbmm``),
  what the kernels call when they do not widen;
- ``widened``: the float32 op on the weight widened and packed once (oneDNN's
  ``_linear_pointwise`` on ``_reorder_linear_weight``), the activation widened per call and the
  result rounded once into the half output.

Sides alternate (A B B A ...) over ``--rounds`` rounds; each round takes the median of enough
calls for about 0.1 s; the table gives the median over rounds and the spread (max / min - 1).
``cold`` cycles each call over copies of the weight (300 MB of float32 in all, beyond the L3),
as a model's forward streams its weights; ``linear`` reuses one weight (it stays in cache).

Usage (each group well under 3 minutes on 2 cores; wrap in /work/quiet.sh on a shared host):
    .venv/bin/python scripts/bench_widened_half.py linear --shapes 768x768,768x3072
    .venv/bin/python scripts/bench_widened_half.py cold
    .venv/bin/python scripts/bench_widened_half.py conv
    .venv/bin/python scripts/bench_widened_half.py bmm
    .venv/bin/python scripts/bench_widened_half.py attention   (also plus's native kernel)
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

F = torch.nn.functional
LINEAR_SHAPES = "768x768,768x3072,3072x768,2048x2048,768x50257"
COLD_SHAPES = "768x768,768x3072,3072x768,2048x2048,2048x5632"


def _median(fn: Callable[[], object], calls: int) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def compare(label: str, half: Callable[[], object], wide: Callable[[], object], rounds: int):
    """Print one row: both sides' median time, spread and ratio."""
    for fn in (half, wide, half, wide):  # warm-up: primitive creation, first-touch pages
        fn()
    calls = int(max(3, min(40, 0.12 / max(_median(half, 1), _median(wide, 1), 1e-6))))
    times: dict[str, list[float]] = {"half": [], "wide": []}
    for r in range(rounds):
        order = (("half", half), ("wide", wide))
        for name, fn in order if r % 2 == 0 else order[::-1]:
            times[name].append(_median(fn, calls))
    a, b = statistics.median(times["half"]), statistics.median(times["wide"])
    spread = {k: max(v) / min(v) - 1 for k, v in times.items()}
    print(
        f"{label:36s} half {a * 1e3:9.3f} ms (±{spread['half'] * 100:3.0f}%)  "
        f"widened {b * 1e3:9.3f} ms (±{spread['wide'] * 100:3.0f}%)  half/widened {a / b:5.2f}",
        flush=True,
    )


def _shapes(text: str) -> list[tuple[int, int]]:
    return [tuple(int(v) for v in s.split("x")) for s in text.split(",") if s]  # type: ignore[misc]


def _linear_pair(x, w, bias, out):  # noqa: ANN001, ANN202
    packed = torch.ops.mkldnn._reorder_linear_weight(w.float().contiguous(), x.shape[0])
    b32 = bias.float()

    def half() -> None:
        torch.addmm(bias, x, w.t(), out=out)

    def wide() -> None:
        out.copy_(torch.ops.mkldnn._linear_pointwise(x.float(), packed, b32, "none", [], ""))

    return half, wide, packed


def linear(args: argparse.Namespace) -> None:
    for k, n in _shapes(args.shapes or LINEAR_SHAPES):
        w = (torch.randn(n, k) * 0.05).to(args.dtype)
        bias = (torch.randn(n) * 0.1).to(args.dtype)
        for m in args.rows:
            if m * k * n > 128 * 768 * 50257:  # (over a second a call in bfloat16)
                continue
            x = torch.randn(m, k).to(args.dtype)
            out = torch.empty(m, n, dtype=args.dtype)
            half, wide, _ = _linear_pair(x, w, bias, out)
            compare(f"linear M={m:5d} K={k} N={n}", half, wide, args.rounds)


def cold(args: argparse.Namespace) -> None:
    for k, n in _shapes(args.shapes or COLD_SHAPES):
        copies = max(2, int(300e6 // (4 * k * n)))
        ws = [(torch.randn(n, k) * 0.05).to(args.dtype) for _ in range(copies)]
        bias = (torch.randn(n) * 0.1).to(args.dtype)
        for m in (1, 2, 3, 4, 8):
            x = torch.randn(m, k).to(args.dtype)
            out = torch.empty(m, n, dtype=args.dtype)
            pairs = [_linear_pair(x, w, bias, out) for w in ws]

            def half(pairs=pairs) -> None:  # noqa: ANN001
                for p in pairs:
                    p[0]()

            def wide(pairs=pairs) -> None:  # noqa: ANN001
                for p in pairs:
                    p[1]()

            compare(f"cold x{copies} M={m} K={k} N={n}", half, wide, args.rounds)


# ResNet-50's convolutions at batch 1: (in channels, out channels, size, kernel, stride)
RESNET_CONVS = [
    (64, 64, 56, 3, 1),
    (64, 256, 56, 1, 1),
    (256, 64, 56, 1, 1),
    (128, 128, 28, 3, 1),
    (512, 128, 28, 1, 1),
    (256, 256, 14, 3, 1),
    (1024, 256, 14, 1, 1),
    (512, 512, 7, 3, 1),
    (2048, 512, 7, 1, 1),
    (3, 64, 224, 7, 2),
]


def conv(args: argparse.Namespace) -> None:
    for c, o, size, k, s in RESNET_CONVS:
        for fmt in (torch.contiguous_format, torch.channels_last):
            x = torch.randn(1, c, size, size).to(args.dtype).contiguous(memory_format=fmt)
            w = (torch.randn(o, c, k, k) * 0.05).to(args.dtype)
            b = (torch.randn(o) * 0.1).to(args.dtype)
            w32, b32 = w.float().contiguous(memory_format=fmt), b.float()

            def half(x=x, w=w, b=b, s=s, k=k) -> None:  # noqa: ANN001
                F.conv2d(x, w, b, s, k // 2)

            def wide(x=x, w32=w32, b32=b32, s=s, k=k) -> None:  # noqa: ANN001
                F.conv2d(x.float(), w32, b32, s, k // 2).to(args.dtype)

            tag = "nhwc" if fmt is torch.channels_last else "nchw"
            compare(f"conv {c}->{o} {size}x{size} k{k}s{s} {tag}", half, wide, args.rounds)


# attention's batched matmuls: (batch * heads, rows, K, N); one row: a decode step
ATTENTION_BMMS = [
    (12, 128, 64, 128),
    (12, 128, 128, 64),
    (12, 1, 64, 128),
    (12, 1, 128, 64),
    (12, 1, 64, 1024),
    (12, 1, 1024, 64),
    (16, 128, 128, 128),
    (16, 512, 64, 512),
]


def bmm(args: argparse.Namespace) -> None:
    for batch, m, k, n in ATTENTION_BMMS:
        a = torch.randn(batch, m, k).to(args.dtype)
        b = torch.randn(batch, k, n).to(args.dtype)
        out = torch.empty(batch, m, n, dtype=args.dtype)

        def half(a=a, b=b, out=out) -> None:  # noqa: ANN001
            torch.baddbmm(out, a, b, beta=0, alpha=0.125, out=out)

        def wide(a=a, b=b, out=out) -> None:  # noqa: ANN001
            r = torch.empty(out.shape)
            torch.baddbmm(r, a.float(), b.float(), beta=0, alpha=0.125, out=r)
            out.copy_(r)

        compare(f"bmm {batch}x{m}x{k}x{n}", half, wide, args.rounds)


# plus.attention at the models' shapes: (label, batch, heads, queries, keys, head dim, causal,
# padding mask [B, 1, 1, S] in the call's dtype); one query: a decode step over a KV cache
ATTENTION_SHAPES = [
    ("bert-base", 1, 12, 128, 128, 64, False, True),
    ("vit-b16", 1, 12, 197, 197, 64, False, False),
    ("gpt2", 1, 12, 128, 128, 64, True, False),
    ("decode T=128", 1, 12, 1, 128, 64, False, False),
    ("decode T=1024", 1, 12, 1, 1024, 64, False, False),
]


def compare_sides(label: str, sides: dict[str, Callable[[], object]], rounds: int) -> None:
    """Print one row: each side's median time and spread, and the first side's time over
    each other's (sides rotate their order every round)."""
    fns = list(sides.items())
    for _, fn in fns + fns:  # warm-up
        fn()
    slowest = max(_median(fn, 1) for _, fn in fns)
    calls = int(max(3, min(40, 0.12 / max(slowest, 1e-6))))
    times: dict[str, list[float]] = {name: [] for name, _ in fns}
    for r in range(rounds):
        for name, fn in fns[r % len(fns) :] + fns[: r % len(fns)]:
            times[name].append(_median(fn, calls))
    first = statistics.median(times[fns[0][0]])
    cells = []
    for name, values in times.items():
        t = statistics.median(values)
        spread = max(values) / min(values) - 1
        ratio = "" if name == fns[0][0] else f" x{first / t:5.2f}"
        cells.append(f"{name} {t * 1e3:8.3f} ms (±{spread * 100:3.0f}%){ratio}")
    print(f"{label:22s} " + "  ".join(cells), flush=True)


def attention(args: argparse.Namespace) -> None:
    """torch's half SDPA (``half``), SDPA in float32 on q, k, v widened per call and rounded
    once into the output (``widened``: the Python kernel's path), and plus's native kernel as
    the VM calls it (``native``: its widened C++ path for bfloat16 with more than one query,
    the direct loop for one; float16 goes on to the Python kernel)."""
    try:
        import plus_tvm.runtime as rt
        from plus_tvm.runtime import native

        kernel = native.installed("plus.attention") if rt.use_native() else None
    except ImportError:
        kernel = None
    for label, b, h, sq, sk, d, causal, padded in ATTENTION_SHAPES:
        q = torch.randn(b, h, sq, d).to(args.dtype)
        k, v = (torch.randn(b, h, sk, d).to(args.dtype) for _ in range(2))
        mask = None
        if padded:
            mask = torch.zeros(b, 1, 1, sk).to(args.dtype)
            mask[..., -sk // 8 :] = torch.finfo(args.dtype).min
        out = torch.empty(b, h, sq, d, dtype=args.dtype)

        def half(q=q, k=k, v=v, mask=mask, causal=causal, out=out) -> None:  # noqa: ANN001
            out.copy_(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal))

        def wide(q=q, k=k, v=v, mask=mask, causal=causal, out=out) -> None:  # noqa: ANN001
            m = None if mask is None else mask.float()
            o = F.scaled_dot_product_attention(
                q.float(), k.float(), v.float(), attn_mask=m, is_causal=causal
            )
            out.copy_(o)

        sides = {"half": half, "widened": wide}
        if kernel is not None:
            import tvm_ffi

            tensors = [tvm_ffi.from_dlpack(t) for t in (q, k, v, *([mask] if padded else []))]
            config = f"causal={int(causal)};mask={int(padded)}"
            target = tvm_ffi.from_dlpack(out)

            def plus(tensors=tensors, config=config, target=target) -> None:  # noqa: ANN001
                kernel(*tensors, config, target)

            sides["native"] = plus
        compare_sides(f"{label} {b}x{h}x{sq}x{sk}x{d}", sides, args.rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("group", choices=("linear", "cold", "conv", "bmm", "attention"))
    parser.add_argument("--shapes", default="", help="KxN,... (linear, cold)")
    parser.add_argument("--rows", default="1,2,4,8,16,32,128,1024", help="M,... (linear)")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    args.rows = [int(v) for v in args.rows.split(",")]
    args.dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.dtype}")
    groups = {"linear": linear, "cold": cold, "conv": conv, "bmm": bmm, "attention": attention}
    groups[args.group](args)


if __name__ == "__main__":
    main()
