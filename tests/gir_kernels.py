"""Memory-intensive Relax kernels for the GIR tests, fused the way the pipeline fuses them."""

from __future__ import annotations

import numpy as np
import tvm
from plus_tvm.options import Options
from plus_tvm.pipeline import phase_passes
from tvm import relax


def _var(name, shape, dtype="float32"):
    return relax.Var(name, relax.TensorType(shape, dtype))


def build(kind: str, shape: list) -> tvm.IRModule:
    """A Relax module with one memory-intensive kernel of ``kind`` on input ``shape``."""
    bb = relax.BlockBuilder()
    last = shape[-1]
    x = _var("x", shape)
    params = [x]
    op = relax.op
    with bb.function("main"):
        with bb.dataflow():
            if kind == "layernorm":
                g, b = _var("g", [last]), _var("b", [last])
                params += [g, b]
                y = bb.emit(op.nn.layer_norm(x, g, b, axes=[-1]))
            elif kind == "add_layernorm":
                r, g, b = _var("r", shape), _var("g", [last]), _var("b", [last])
                params += [r, g, b]
                y = bb.emit(op.nn.layer_norm(bb.emit(op.add(x, r)), g, b, axes=[-1]))
            elif kind == "add_layernorm_2out":  # residual stream: the sum is an output too
                r, g, b = _var("r", shape), _var("g", [last]), _var("b", [last])
                params += [r, g, b]
                s = bb.emit(op.add(x, r))
                y = bb.emit(relax.Tuple([s, bb.emit(op.nn.layer_norm(s, g, b, axes=[-1]))]))
            elif kind == "rmsnorm":
                g = _var("g", [last])
                params += [g]
                y = bb.emit(op.nn.rms_norm(x, g, axes=[-1]))
            elif kind == "rmsnorm_two_shapes":  # LLaMA: the norm returned as [1, n, d] and [n, d]
                g = _var("g", [last])
                params += [g]
                n = bb.emit(op.nn.rms_norm(x, g, axes=[-1]))
                flat = bb.emit(op.reshape(n, [shape[-2], last]))
                y = bb.emit(relax.Tuple([bb.emit(op.reshape(n, shape)), flat]))
            elif kind == "se_gate":  # squeeze-excite: x * sigmoid(conv1x1(s) + b), s [1, 8, 1, 1]
                squeezed = _var("s", [1, 8, 1, 1])
                w, b = _var("w", [shape[1], 8, 1, 1]), _var("b", [shape[1]])
                params += [squeezed, w, b]
                conv = bb.emit(op.nn.conv2d(squeezed, w))
                gate = bb.emit(op.add(conv, bb.emit(op.reshape(b, [1, shape[1], 1, 1]))))
                y = bb.emit(op.multiply(x, bb.emit(op.sigmoid(gate))))
            elif kind == "softmax":
                y = bb.emit(op.nn.softmax(x, axis=-1))
            elif kind == "gelu":
                y = bb.emit(op.nn.gelu(x))
            elif kind == "silu_mul":
                r = _var("r", shape)
                params += [r]
                y = bb.emit(op.multiply(bb.emit(op.nn.silu(x)), r))
            elif kind == "add_scale":
                r = _var("r", shape)
                params += [r]
                y = bb.emit(op.multiply(bb.emit(op.add(x, r)), relax.const(0.5, "float32")))
            elif kind == "transpose_add":
                r = _var("r", [shape[1], shape[0]])
                params += [r]
                y = bb.emit(op.add(bb.emit(op.permute_dims(x, [1, 0])), r))
            elif kind == "rowsum":
                y = bb.emit(op.sum(x, axis=[-1]))
            elif kind == "colsum":
                y = bb.emit(op.sum(x, axis=[0]))
            elif kind == "colmean":
                y = bb.emit(op.mean(x, axis=[0]))
            elif kind == "mean_hw":  # global average pooling of a CNN (NCHW)
                y = bb.emit(op.mean(x, axis=[2, 3]))
            elif kind == "gemv":  # a classifier head at batch 1: x[1, K] @ W[N, K].T + b
                w, b = _var("w", [shape[1], shape[0]]), _var("b", [shape[1]])
                params = [_var("x", [1, shape[0]]), w, b]
                mm = bb.emit(op.matmul(params[0], bb.emit(op.permute_dims(w, [1, 0]))))
                y = bb.emit(op.add(mm, b))
            elif kind == "gemv_bias":  # x[1, K] @ W[K, N] + b: a column reduction with an epilogue
                w, b = _var("w", [shape[0], shape[1]]), _var("b", [shape[1]])
                params = [_var("x", [1, shape[0]]), w, b]
                y = bb.emit(op.add(bb.emit(op.matmul(params[0], w)), b))
            elif kind == "gemm":  # several rows: a contraction, left to libraries
                w = _var("w", [shape[1], shape[2]])
                params = [_var("x", shape[:2]), w]
                y = bb.emit(op.matmul(params[0], w))
            elif kind == "silu_pad":  # EfficientNet: x * sigmoid(x), then a 1-pixel pad (NCHW)
                silu = bb.emit(op.multiply(x, bb.emit(op.sigmoid(x))))
                y = bb.emit(op.nn.pad(silu, [0, 0, 0, 0, 1, 1, 1, 1]))
            elif kind == "silu_mean_2out":  # squeeze-excite: the activation and its HW mean
                silu = bb.emit(op.multiply(x, bb.emit(op.sigmoid(x))))
                y = bb.emit(relax.Tuple([silu, bb.emit(op.mean(silu, axis=[2, 3], keepdims=True))]))
            elif kind == "transcendental_chain":  # sqrt|x|+r, exp*r, gelu+r, relu*r, tanh+r
                r = _var("r", shape)
                params += [r]
                t = bb.emit(op.add(bb.emit(op.sqrt(bb.emit(op.abs(x)))), r))
                t = bb.emit(op.multiply(bb.emit(op.exp(t)), r))
                t = bb.emit(op.add(bb.emit(op.nn.gelu(t)), r))
                t = bb.emit(op.multiply(bb.emit(op.nn.relu(t)), r))
                y = bb.emit(op.add(bb.emit(op.tanh(t)), r))
            elif kind == "transpose_exp_tanh":  # a tiled transpose over nested functions
                r = _var("r", [shape[1], shape[0]])
                params += [r]
                t = bb.emit(op.exp(bb.emit(op.permute_dims(bb.emit(op.tanh(x)), [1, 0]))))
                y = bb.emit(op.tanh(bb.emit(op.multiply(t, r))))
            elif kind == "softmax_exp_tanh":  # a row kernel over nested functions
                y = bb.emit(op.nn.softmax(bb.emit(op.exp(bb.emit(op.tanh(x)))), axis=-1))
            elif kind == "colsum_exp_tanh":  # a column reduction of nested functions
                y = bb.emit(op.sum(bb.emit(op.exp(bb.emit(op.tanh(x)))), axis=[0]))
            elif kind == "relu_odd_rows":  # rows (28) that a 16-lane vector does not divide
                y = bb.emit(op.nn.relu(bb.emit(op.add(x, x))))
            else:
                raise ValueError(kind)
            out = bb.emit_output(y)
        bb.emit_func_output(out, params)
    return bb.get()


def fused_primfunc(kind: str, shape: list, target: tvm.target.Target) -> tvm.tirx.PrimFunc:
    """The single fused kernel that legalize + fuse make of ``build(kind, shape)``."""
    mod = build(kind, shape)
    with target:
        mod = tvm.transform.Sequential(
            phase_passes(target, Options(), phases=("legalize", "fuse"))
        )(mod)
    funcs = [f for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert len(funcs) == 1, f"{kind}: expected one fused kernel, got {len(funcs)}"
    return funcs[0]


def random_args(func: tvm.tirx.PrimFunc, sizes: dict | None = None, seed: int = 0):
    """Random inputs (and a zero output) for ``func``'s buffer parameters."""
    rng = np.random.default_rng(seed)
    sizes = sizes or {}
    arrays = []
    for p in func.params:
        if not hasattr(p.ty, "shape"):
            continue
        shape = [int(d) if isinstance(d, tvm.tirx.IntImm) else sizes[d.name] for d in p.ty.shape]
        arrays.append(rng.standard_normal(shape).astype("float32"))
    return arrays


def run(func: tvm.tirx.PrimFunc, target: tvm.target.Target, arrays: list) -> list:
    """Compile ``func`` alone and run it; returns every buffer afterwards (all outputs of a
    multi-output kernel included)."""
    f = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target)
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(a, dev) for a in arrays]
    f["main"](*args)
    return [a.numpy() for a in args]


def run_cuda(func: tvm.tirx.PrimFunc, arrays: list) -> list:
    """Compile a GPU-scheduled ``func`` alone for the GPU at hand and run it on ``arrays``;
    returns every buffer afterwards, like :func:`run`."""
    from plus_tvm.target import resolve_target

    target = resolve_target("cuda")
    f = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target)
    dev = tvm.cuda(0)
    args = [tvm.runtime.tensor(a, dev) for a in arrays]
    f["main"](*args)
    return [a.numpy() for a in args]
