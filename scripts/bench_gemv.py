"""Linears of a few rows (a decode step's) against the memory bound, per shape.

Per shape (K -> N, weight layout ``nk`` as ``nn.Linear`` holds it or ``kn`` as GPT-2's Conv1D)
and row count, in ``--dtype``: torch's linear, ``plus.linear`` (the Python kernel, or ``--vm``:
the native kernel as the VM calls it, then with the native GEMV switched off: oneDNN's GEMM in
float32, the widened or torch path in bfloat16), each on several copies of the weight taken in
turn (more bytes than the caches hold, as a model's weights are in a decode step), against the
bound: the weight's bytes / copy bandwidth (a large ``Tensor.copy_``, counted as read + write
bytes / time). Median of ``--repeat`` passes over the copies, us per call.

    .venv/bin/python scripts/bench_gemv.py [--shapes gpt2,llama] [--rows 1,2,4,8] \
        [--dtype bfloat16|float32] [--vm]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch.nn import functional as F  # noqa: N812

# (name, K, N, layout): GPT-2 small's Conv1D weights are [K, N]; LLaMA-150m's nn.Linear [N, K]
SHAPES = {
    "gpt2": [
        ("gpt2.c_attn", 768, 2304, "kn"),
        ("gpt2.attn.c_proj", 768, 768, "kn"),
        ("gpt2.c_fc", 768, 3072, "kn"),
        ("gpt2.mlp.c_proj", 3072, 768, "kn"),
        ("gpt2.lm_head", 768, 50257, "nk"),
    ],
    "llama": [
        ("llama.q|k|v|o", 768, 768, "nk"),
        ("llama.qkv", 768, 2304, "nk"),
        ("llama.gate|up", 768, 2048, "nk"),
        ("llama.gate_up", 768, 4096, "nk"),
        ("llama.down", 2048, 768, "nk"),
        ("llama.lm_head", 768, 32000, "nk"),
    ],
}
STREAM_BYTES = 256 << 20  # the weight copies taken in turn: far more than the caches


def copy_bandwidth(repeat: int) -> float:
    """GB/s of a 256 MiB float32 ``copy_`` (read + write bytes)."""
    src = torch.randn(STREAM_BYTES // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t)
    return 2 * STREAM_BYTES / min(times) / 1e9


def time_calls(fn, copies: int, repeat: int) -> float:
    """Median us per call of ``fn(i)`` over ``i`` in the copies, ``repeat`` passes."""
    for i in range(copies):
        fn(i)
    per = []
    for _ in range(repeat):
        t = time.perf_counter()
        for i in range(copies):
            fn(i)
        per.append((time.perf_counter() - t) / copies * 1e6)
    return statistics.median(per)


def mm_call(x, weights, out, layout: str):  # noqa: ANN001, ANN201
    """``i -> torch.mm`` of ``x`` and weight copy ``i`` (as a linear of that layout) into out."""
    if layout == "nk":
        return lambda i: torch.mm(x, weights[i].t(), out=out)
    return lambda i: torch.mm(x, weights[i], out=out)


def kernel_call(kernel, x, weights, config: str, out):  # noqa: ANN001, ANN201
    """``i -> kernel(x, weight copy i, config, out)``."""
    return lambda i: kernel(x, weights[i], config, out)


def vm_linear():
    """The native ``plus.linear`` as the VM calls it (DLTensors), or None without it."""
    import tvm_ffi
    from plus_tvm import runtime as rt
    from plus_tvm.runtime import native

    if not rt.use_native():
        return None
    fn = native.installed("plus.linear")

    def call(x, w, config, out):  # noqa: ANN001, ANN202
        fn(tvm_ffi.from_dlpack(x), tvm_ffi.from_dlpack(w), config, tvm_ffi.from_dlpack(out))

    return call


def forced(dtype: str):  # noqa: ANN201
    """The library's switch of the GEMV for ``dtype`` (``mode``: -1 default, 0 off), or None."""
    from plus_tvm.runtime import native

    return native.function("gemv_half_force" if dtype == "bfloat16" else "gemv_float_force")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="gpt2,llama")
    ap.add_argument("--rows", default="1,2,4,8")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--vm", action="store_true", help="plus.linear as the VM calls it")
    ap.add_argument("--no-plus", action="store_true", help="torch only")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    bw = copy_bandwidth(args.repeat)
    print(f"threads {torch.get_num_threads()}  copy bandwidth {bw:.1f} GB/s  dtype {args.dtype}")
    from plus_tvm import runtime as rt

    plus = None if args.no_plus else rt.KERNELS["plus.linear"]
    vm = vm_linear() if args.vm and not args.no_plus else None
    switch = forced(args.dtype) if vm is not None else None
    dtype = getattr(torch, args.dtype)
    size = torch.finfo(dtype).bits // 8
    rows_list = [int(r) for r in args.rows.split(",")]
    header = f"{'shape':18} {'KxN':>11} {'lay':>3} {'M':>2}  {'torch':>8}"
    header += f" {'plus':>8} {'gemv off':>8} {'bound':>8}  {'torch/bnd':>9} {'plus/bnd':>8}"
    print(header)
    results = []
    for group in args.shapes.split(","):
        for name, k, n, layout in SHAPES[group]:
            wshape = (n, k) if layout == "nk" else (k, n)
            nbytes = size * k * n
            copies = max(2, -(-STREAM_BYTES // (2 * nbytes)))  # about 128 MiB of weights
            ws = [(torch.randn(*wshape) / k**0.5).to(dtype) for _ in range(copies)]
            for m in rows_list:
                x = torch.randn(m, k).to(dtype)
                out = torch.empty(m, n, dtype=dtype)
                us_torch = time_calls(mm_call(x, ws, out, layout), copies, args.repeat)
                config = f"w={layout}"
                kernel = vm if vm is not None else plus
                tp = kernel_call(kernel, x, ws, config, out) if kernel is not None else None
                usp = time_calls(tp, copies, args.repeat) if tp is not None else float("nan")
                us_off = float("nan")
                if switch is not None:
                    switch(0)
                    us_off = time_calls(tp, copies, args.repeat)
                    switch(-1)
                if tp is not None:  # the plus result against torch's float32 on one copy
                    tp(0)
                    w0 = ws[0].float() if layout == "nk" else ws[0].float().t()
                    ref = F.linear(x.float(), w0)
                    err = float((out.float() - ref).abs().max() / ref.abs().max())
                else:
                    err = float("nan")
                bound = nbytes / (bw * 1e9) * 1e6
                row = dict(
                    shape=name,
                    k=k,
                    n=n,
                    layout=layout,
                    rows=m,
                    dtype=args.dtype,
                    torch_us=us_torch,
                    plus_us=usp,
                    gemv_off_us=us_off,
                    bound_us=bound,
                    plus_rel_err=err,
                )
                results.append(row)
                print(
                    f"{name:18} {k:>5}x{n:<5} {layout:>3} {m:>2}  {us_torch:8.1f}"
                    f" {usp:8.1f} {us_off:8.1f} {bound:8.1f}  {us_torch / bound:9.2f}"
                    f" {usp / bound:8.2f}",
                    flush=True,
                )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"copy_gbs": bw, "threads": torch.get_num_threads(), "rows": results}, f, indent=1
            )


if __name__ == "__main__":
    main()
