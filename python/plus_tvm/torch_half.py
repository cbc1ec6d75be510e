"""Half-precision torch models (``float16`` / ``bfloat16``) imported with torch's dtypes.

TVM 0.27's torch importer computes every matrix product and convolution with
``out_dtype="float32"`` and adds the bias in the same expression: on a half-precision model
the bias add mixes ``bfloat16`` and ``float32`` and the import fails; a ``mm`` / ``bmm`` /
``matmul`` silently returns ``float32``; and TVM's kernels for LayerNorm refuse ``bfloat16``
while its reductions would accumulate in half precision.

torch computes these ops in float32 inside and rounds the result once to the model's dtype.
:func:`compute_as_torch` rewrites the exported program's graph (a program of plus_tvm's own,
made by ``run_decompositions``) so that TVM's converters do the same:

- a contraction (:data:`CONTRACTIONS`) keeps its half-precision operands and float32
  accumulation; its bias is cast to float32 (added before the one rounding, as torch's CPU
  kernels do) and a cast to the model's dtype follows it;
- an op of :data:`FLOAT32_OPS` (norms, softmax, reductions) gets its half-precision operands
  cast to float32, and its results cast back.

Element-wise ops stay in the model's dtype: TVM's code generation computes each in float32 and
rounds it (``BF16ComputeLegalize``, LLVM's half promotion), as torch's kernels do. A float32
model is never touched.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

HALF = (torch.float16, torch.bfloat16)

_aten = torch.ops.aten

#: matrix products and convolutions: half operands, float32 accumulation, one rounding; the
#: positions of the operands cast to float32 before the op (the bias, or everything where
#: TVM's converter would accumulate in half precision)
CONTRACTIONS: dict[Any, tuple[int, ...]] = {
    _aten.mm.default: (),
    _aten.bmm.default: (),
    _aten.matmul.default: (),
    _aten.linear.default: (2,),
    _aten.addmm.default: (0,),
    _aten.convolution.default: (2,),
    _aten.conv1d.default: (2,),
    _aten.conv2d.default: (2,),
    _aten.conv3d.default: (2,),
    _aten.baddbmm.default: (0, 1, 2),  # (TVM's converter has no out_dtype here)
    _aten.einsum.default: (),
}

#: ops torch computes in float32 on half tensors (its norm, softmax and reduction kernels
#: accumulate in float32): every half operand cast to float32, every half result cast back.

#: The same table decides which ops stay float32 under ``Options(precision=...)``.
FLOAT32_OPS: frozenset = frozenset(
    {
        _aten.native_layer_norm.default,
        _aten.layer_norm.default,
        _aten.native_group_norm.default,
        _aten.group_norm.default,
        # (TVM's batch_norm of a bfloat16 tensor returned float32 under the bfloat16 type)
        _aten._native_batch_norm_legit_no_training.default,
        _aten.batch_norm.default,
        _aten._softmax.default,
        _aten._log_softmax.default,
        _aten.softmax.int,
        _aten.log_softmax.int,
        _aten.mean.dim,
        _aten.mean.default,
        _aten.sum.dim_IntList,
        _aten.sum.default,
        _aten.var.correction,
        _aten.var_mean.correction,
        _aten.cumsum.default,
        _aten.logsumexp.default,
        _aten.rms_norm.default,
        _aten.linalg_vector_norm.default,
        # TVM's power refuses bfloat16 ("power only applies to float"): GPT-2's gelu_new
        _aten.pow.Tensor_Scalar,
        _aten.pow.Tensor_Tensor,
        _aten.pow.Scalar,  # a scalar base: Funnel's `10000 ** (freq_seq / d)`
        # pooling (exact in float32 for max; torch averages in float32): TVM's pooling of a
        # bfloat16 tensor returned float32 under the bfloat16 type (ResNet's stem)
        _aten.max_pool2d_with_indices.default,
        _aten.max_pool2d.default,
        _aten.max_pool1d.default,
        _aten.max_pool3d.default,
        _aten.avg_pool2d.default,
        _aten.avg_pool1d.default,
        _aten.avg_pool3d.default,
        _aten.adaptive_avg_pool2d.default,
        _aten._adaptive_avg_pool2d.default,
        _aten.adaptive_avg_pool1d.default,
        # transcendental activations: torch's half kernels compute them in float32 and round
        # once; as float32 ops between casts the schedules' vectorized float32 functions take
        # them (a bfloat16 GELU over 112x112x32 ran 2.2 ms scalar, torch 0.06)
        _aten.gelu.default,
        _aten.silu.default,
        _aten.sigmoid.default,
        _aten.tanh.default,
        _aten.exp.default,
        _aten.erf.default,
    }
)


def is_half_program(program: torch.export.ExportedProgram) -> bool:
    """Whether any value of the program is a half-precision float tensor."""
    return any(_dtype(node) in HALF for node in program.graph.nodes)


def compute_as_torch(program: torch.export.ExportedProgram) -> int:
    """Rewrite ``program``'s graph in place (see the module docstring); returns how many ops
    were rewritten. Only for programs of plus_tvm's own (``run_decompositions``' result)."""
    graph = program.graph
    rewritten = 0
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target in CONTRACTIONS and _dtype(node) in HALF:
            _cast_args(graph, node, CONTRACTIONS[node.target])
            _cast_results(graph, node)
            rewritten += 1
        elif node.target in FLOAT32_OPS and any(_dtype(a) in HALF for a in _tensor_args(node)):
            _cast_args(graph, node, None)
            _cast_results(graph, node)
            rewritten += 1
    if rewritten:
        graph.lint()
    return rewritten


def _dtype(value: object) -> torch.dtype | None:
    meta = getattr(value, "meta", None)
    val = meta.get("val") if meta else None
    return getattr(val, "dtype", None) if isinstance(val, torch.Tensor) else None


def _tensor_args(node: Any) -> list:
    return [a for a in node.args if hasattr(a, "meta")]


def _cast(graph: Any, value: Any, dtype: torch.dtype, before: Any) -> Any:
    """A ``_to_copy(value, dtype=dtype)`` node, inserted before ``before``."""
    with graph.inserting_before(before):
        cast = graph.call_function(_aten._to_copy.default, (value,), {"dtype": dtype})
    cast.meta["val"] = value.meta["val"].to(dtype)
    return cast


def _cast_args(graph: Any, node: Any, positions: tuple[int, ...] | None) -> None:
    """Half tensor operands at ``positions`` (None: all) cast to float32."""
    args = list(node.args)
    for i, arg in enumerate(args):
        if (positions is None or i in positions) and _dtype(arg) in HALF:
            args[i] = _cast(graph, arg, torch.float32, node)
    node.args = tuple(args)


def _cast_results(graph: Any, node: Any) -> None:
    """The node now computes in float32: its half results become float32 (its ``val``
    says so, for converters that read it) and every reader gets them cast back. A tuple
    result's readers are its ``getitem`` nodes."""
    val = node.meta.get("val")
    if isinstance(val, (tuple, list)):
        node.meta["val"] = type(val)(_float32(v) for v in val)
        for item in list(node.users):
            if item.target is operator.getitem and _dtype(item) in HALF:
                want = _dtype(item)
                item.meta["val"] = _float32(item.meta["val"])
                _reroute(graph, item, want)
        return
    want = _dtype(node)
    if want in HALF:
        node.meta["val"] = _float32(val)
        _reroute(graph, node, want)


def _float32(value: object) -> object:
    if isinstance(value, torch.Tensor) and value.dtype in HALF:
        return value.to(torch.float32)
    return value


def _reroute(graph: Any, value: Any, dtype: torch.dtype) -> None:
    """Every user of ``value`` reads ``_to_copy(value, dtype)`` instead."""
    users = list(value.users)
    with graph.inserting_after(value):
        cast = graph.call_function(_aten._to_copy.default, (value,), {"dtype": dtype})
    cast.meta["val"] = value.meta["val"].to(dtype)
    for user in users:
        user.replace_input_with(value, cast)
