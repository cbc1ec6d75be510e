"""ONNX ``Attention`` (opset 23 and later): scaled dot-product attention in all its forms.

TVM 0.27 maps ``Attention`` to the ``com.microsoft`` contrib op (packed QKV weights,
``num_heads`` attribute), so every standard ``Attention`` node fails with ``KeyError:
'num_heads'``. This converter follows the operator's specification (and ONNX's reference
implementation) for 3-D inputs with ``q_num_heads`` / ``kv_num_heads`` and 4-D inputs;
grouped-query attention (KV heads repeated), boolean or additive masks shorter than the key
length, causal masking aligned to the past (``past_key``/``past_value`` concatenated into the
present outputs), external caches (``nonpad_kv_seqlen``), sliding windows, ``softcap``,
``softmax_precision`` and the four ``qk_matmul_output_mode`` values. A query row whose every key
is masked gives zeros, as the specification requires.
"""

from __future__ import annotations

from tvm import relax, tirx
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from ...errors import InputRefusedError
from ._common import DTYPE_OF_ONNX, dims, emit, full_like_dtype, scalar, static

_AFTER_BIAS = 2
_AFTER_SOFTMAX = 3


class Attention(OnnxOpConverter):
    """Standard ``Attention`` (the ``com.microsoft`` op keeps TVM's converter)."""

    @classmethod
    def _impl_v23(cls, bb, inputs, attr, params):
        del params
        q, k, v = inputs[0], inputs[1], inputs[2]
        mask = _input(inputs, 3)
        past_key, past_value = _input(inputs, 4), _input(inputs, 5)
        nonpad = _input(inputs, 6)
        if (past_key is None) != (past_value is None):
            raise InputRefusedError("Attention: past_key and past_value must be given together")
        if nonpad is not None and past_key is not None:
            raise InputRefusedError("Attention: nonpad_kv_seqlen cannot be combined with past_key")
        out_dtype = str(q.ty.dtype)
        if out_dtype in ("float16", "bfloat16"):
            # products and softmax accumulate in float32, as ONNX's reference and runtimes do
            q, k, v = (emit(bb, relax.op.astype(t, "float32")) for t in (q, k, v))
            if past_key is not None:
                past_key = emit(bb, relax.op.astype(past_key, "float32"))
                past_value = emit(bb, relax.op.astype(past_value, "float32"))
            if mask is not None and str(mask.ty.dtype) != "bool":
                mask = emit(bb, relax.op.astype(mask, "float32"))
        dtype = str(q.ty.dtype)
        rank = len(dims(q))
        batch = dims(q)[0]
        if rank == 3:
            q_heads, kv_heads = attr.get("q_num_heads"), attr.get("kv_num_heads")
            if q_heads is None or kv_heads is None:
                raise InputRefusedError(
                    "Attention with 3-D inputs needs q_num_heads and kv_num_heads"
                )
            q = _split_heads(bb, q, q_heads)
            k, v = _split_heads(bb, k, kv_heads), _split_heads(bb, v, kv_heads)
        elif rank != 4:
            raise InputRefusedError(f"Attention inputs must be 3-D or 4-D, got rank {rank}")

        scale = attr.get("scale")
        head = dims(q)[3]
        if scale is None:
            if not isinstance(head, tirx.IntImm):
                raise InputRefusedError("Attention without scale needs a static head size")
            scale = 1.0 / float(int(head)) ** 0.5
        root = scalar(float(scale) ** 0.5, dtype)  # applied to q and k, as the reference does

        if past_key is not None:
            k = emit(bb, relax.op.concat([past_key, k], axis=2))
            v = emit(bb, relax.op.concat([past_value, v], axis=2))
        present_key, present_value = k, v
        q_len, kv_len = dims(q)[2], dims(k)[2]

        bias = _bias(bb, attr, mask, past_key, nonpad, q_len, kv_len, batch, dtype)

        q_heads, k_heads = static(dims(q)[1], "heads"), static(dims(k)[1], "heads")
        if q_heads != k_heads and q_heads % k_heads == 0:
            reps = q_heads // k_heads
            k = emit(bb, relax.op.repeat(k, reps, axis=1))
            v = emit(bb, relax.op.repeat(v, reps, axis=1))

        qs = emit(bb, relax.op.multiply(q, root))
        ks = emit(bb, relax.op.multiply(k, root))
        qk = emit(bb, relax.op.matmul(qs, emit(bb, relax.op.permute_dims(ks, [0, 1, 3, 2]))))
        softcap = attr.get("softcap")
        if softcap is not None and float(softcap) > 0:
            cap = scalar(float(softcap), dtype)
            qk = emit(bb, relax.op.multiply(relax.op.tanh(relax.op.divide(qk, cap)), cap))
        qk_out = qk
        with_bias = qk if bias is None else emit(bb, relax.op.add(qk, bias))
        mode = int(attr.get("qk_matmul_output_mode", 0))
        if mode == _AFTER_BIAS:
            qk_out = with_bias

        logits = with_bias
        precision = attr.get("softmax_precision")
        if precision is not None:
            logits = emit(bb, relax.op.astype(logits, DTYPE_OF_ONNX[int(precision)]))
        if bias is None:
            probs = emit(bb, relax.op.nn.softmax(logits, axis=-1))
        else:
            probs = _guarded_softmax(bb, logits, bias)
        if mode == _AFTER_SOFTMAX:
            qk_out = probs
        qk_out = emit(bb, relax.op.astype(qk_out, out_dtype))
        probs = emit(bb, relax.op.astype(probs, dtype))

        out = emit(bb, relax.op.matmul(probs, v))
        if rank == 3:
            b, h, s, d = dims(out)
            out = emit(bb, relax.op.permute_dims(out, [0, 2, 1, 3]))
            out = emit(bb, relax.op.reshape(out, [b, s, h * d]))
        if out_dtype != dtype:
            out = emit(bb, relax.op.astype(out, out_dtype))
            present_key = emit(bb, relax.op.astype(present_key, out_dtype))
            present_value = emit(bb, relax.op.astype(present_value, out_dtype))
        return relax.Tuple([out, present_key, present_value, qk_out])


def _input(inputs, i: int):
    return inputs[i] if len(inputs) > i and inputs[i] is not None else None


def _split_heads(bb, x, heads: int):
    """(B, S, H*D) -> (B, H, S, D)."""
    b, s, hidden = dims(x)
    x = emit(bb, relax.op.reshape(x, [b, s, int(heads), hidden // int(heads)]))
    return emit(bb, relax.op.permute_dims(x, [0, 2, 1, 3]))


def _allow(bb, allowed, dtype: str):
    """0 where ``allowed``, -inf elsewhere."""
    return emit(bb, relax.op.where(allowed, scalar(0.0, dtype), scalar(float("-inf"), dtype)))


def _positions(bb, n) -> relax.Expr:
    return emit(bb, relax.op.arange(static(n, "Attention's sequence length"), dtype="int64"))


def _offset_grid(bb, q_len, kv_len, offset, batch):
    """``(i + offset) - j`` over (q, kv), or (B, 1, q, kv) for a per-batch offset."""
    i = emit(bb, relax.op.reshape(_positions(bb, q_len), [q_len, 1]))
    j = emit(bb, relax.op.reshape(_positions(bb, kv_len), [1, kv_len]))
    if isinstance(offset, int):
        shifted = emit(bb, relax.op.add(i, relax.const(offset, "int64")))
        return emit(bb, relax.op.subtract(shifted, j))
    per_batch = emit(bb, relax.op.reshape(relax.op.astype(offset, "int64"), [batch, 1, 1, 1]))
    shifted = emit(bb, relax.op.add(per_batch, i))
    return emit(bb, relax.op.subtract(shifted, j))


def _bias(bb, attr, mask, past_key, nonpad, q_len, kv_len, batch, dtype):
    """The additive bias of the specification, or None when nothing is masked."""
    causal = bool(int(attr.get("is_causal", 0)))
    left = int(attr.get("left_window_size", -1))
    right = int(attr.get("right_window_size", -1))
    window = left >= 0 or right >= 0
    zeros = full_like_dtype(bb, [q_len, kv_len], 0.0, dtype)
    if mask is not None:
        if str(mask.ty.dtype) == "bool":
            mask = _allow(bb, mask, dtype)
        mask_dims = dims(mask)
        short = kv_len - mask_dims[-1]
        if not isinstance(short, tirx.IntImm) or int(short) > 0:
            fill = full_like_dtype(bb, [*mask_dims[:-1], short], float("-inf"), dtype)
            mask = emit(bb, relax.op.concat([mask, fill], axis=-1))
    if nonpad is not None and past_key is None:
        length = relax.const(static(q_len, "Attention's query length"), "int64")
        offset = emit(bb, relax.op.subtract(relax.op.astype(nonpad, "int64"), length))
    else:
        offset = int(dims(past_key)[2]) if past_key is not None else 0

    bias = None
    if causal:
        base = zeros if mask is None else mask
        if window:
            base = emit(bb, relax.op.add(zeros, base))
        grid = _offset_grid(bb, q_len, kv_len, offset, batch)
        allowed = emit(bb, relax.op.greater_equal(grid, relax.const(0, "int64")))
        bias = emit(bb, relax.op.add(base, _allow(bb, allowed, dtype)))
    elif mask is not None:
        bias = emit(bb, relax.op.add(zeros, mask))
    if window:
        grid = _offset_grid(bb, q_len, kv_len, offset, batch)
        allowed = None
        if left >= 0:
            allowed = emit(bb, relax.op.less_equal(grid, relax.const(left, "int64")))
        if right >= 0:
            limit = relax.const(-right, "int64")
            cond = emit(bb, relax.op.greater_equal(grid, limit))
            allowed = cond if allowed is None else emit(bb, relax.op.logical_and(allowed, cond))
        bias = zeros if bias is None else emit(bb, relax.op.add(zeros, bias))
        bias = emit(bb, relax.op.add(bias, _allow(bb, allowed, dtype)))
    if nonpad is not None:
        keys = emit(bb, relax.op.reshape(_positions(bb, kv_len), [1, kv_len]))
        lengths = emit(bb, relax.op.reshape(relax.op.astype(nonpad, "int64"), [batch, 1]))
        valid = emit(bb, relax.op.less(keys, lengths))
        valid = emit(bb, relax.op.reshape(valid, [batch, 1, 1, kv_len]))
        padding = _allow(bb, valid, dtype)
        bias = padding if bias is None else emit(bb, relax.op.add(bias, padding))
    return bias


def _guarded_softmax(bb, logits, bias):
    """Softmax whose fully masked rows are zero (never NaN), as the specification says."""
    dtype = str(logits.ty.dtype)
    zero, one = scalar(0.0, dtype), scalar(1.0, dtype)
    neg_inf = scalar(float("-inf"), dtype)
    top = emit(bb, relax.op.max(logits, axis=-1, keepdims=True))
    all_masked = emit(bb, relax.op.equal(top, neg_inf))
    safe = emit(bb, relax.op.where(all_masked, zero, top))
    exps = emit(bb, relax.op.exp(relax.op.subtract(logits, safe)))
    total = emit(bb, relax.op.sum(exps, axis=-1, keepdims=True))
    total = emit(bb, relax.op.where(relax.op.equal(total, zero), one, total))
    probs = emit(bb, relax.op.divide(exps, total))
    bias_dtype = str(bias.ty.dtype)
    bias_top = emit(bb, relax.op.max(bias, axis=-1, keepdims=True))
    masked_row = emit(bb, relax.op.equal(bias_top, scalar(float("-inf"), bias_dtype)))
    return emit(bb, relax.op.where(masked_row, zero, probs))
