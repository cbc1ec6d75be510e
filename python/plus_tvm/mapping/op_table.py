"""The mapping class of every ``relax.*`` operator, registered as the op attribute ``MapOpPattern``.

Paper 004 (section 3.1.2) stores the class as an operator attribute next to TVM's own
``TOpPattern``; here it is registered from Python with ``tvm.ir.register_op_attr`` when
``plus_tvm`` is imported. Every relax operator of TVM 0.27 (230) has a class: the tests fail when
TVM adds an operator this table does not cover. The classes follow the definitions of section
3.1.1; the TIR analysis in :mod:`plus_tvm.mapping.tir_analysis` derives the same class from the
legalized PrimFuncs, and a test checks that both agree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

import tvm

from .classes import MapPattern

ATTR_NAME = "MapOpPattern"

# Elementwise maps: unary math, activations, binary arithmetic / comparisons (with broadcast side
# operands), casts, quantization, masks by position (tril/triu), conditional select.
_ONE_TO_ONE = """
abs acos acosh add asin asinh astype atan atan2 atanh bitwise_and bitwise_not bitwise_or
bitwise_xor ceil clip cos cosh dequantize divide equal erf ewise_fma exp floor floor_divide
floor_mod greater greater_equal isfinite isinf isnan left_shift less less_equal log log_add_exp
logical_and logical_not logical_or logical_xor maximum minimum mod multiply negative not_equal
power quantize right_shift round rsqrt sigmoid sign sin sinh sqrt square subtract tan tanh tril
triu trunc where nn.dropout nn.gelu nn.gelu_tanh nn.leakyrelu nn.prelu nn.relu nn.selu nn.silu
nn.softplus
"""

# Elements rearranged without arithmetic: reshape-like views, slicing, joining and splitting,
# padding, gathers (one input element per output element, possibly data-dependent).
_REORGANIZE = """
concat dynamic_strided_slice expand_dims flatten flip gather_elements gather_nd index_tensor
layout_transform reshape reverse_sequence split squeeze stack strided_slice take
nn.batch_flatten nn.pad nn.pixel_shuffle
"""

# Dimensions permuted.
_SHUFFLE = """
permute_dims
"""

# One input element feeds many outputs, or outputs are generated from scalars.
_ONE_TO_MANY = """
arange broadcast_to eye eye_like full full_like hamming_window meshgrid one_hot ones ones_like
outer repeat tile zeros zeros_like
"""

# Several input elements combine: reductions, contractions, windows, normalizations, scans.
_MANY_TO_MANY = """
argmax argmin bucketize collapse_sum_like collapse_sum_to cumprod cumsum einsum matmul max mean
median min prod std sum variance
image.affine_grid image.grid_sample image.resize2d image.resize3d
nn.adaptive_avg_pool1d nn.adaptive_avg_pool2d nn.adaptive_avg_pool3d nn.attention
nn.attention_bias nn.attention_var_len nn.avg_pool1d nn.avg_pool2d nn.avg_pool3d nn.batch_norm
nn.conv1d nn.conv1d_transpose nn.conv2d nn.conv2d_transpose nn.conv3d nn.conv3d_transpose
nn.cross_entropy_with_logits nn.group_norm nn.instance_norm nn.layer_norm nn.log_softmax
nn.max_pool1d nn.max_pool2d nn.max_pool3d nn.nll_loss nn.rms_norm nn.softmax
vision.roi_align vision.roi_pool
"""

# Not tensor computations (calls, memory, shapes, closures, devices, printing, distributed and
# gradient bookkeeping), or kernels that must stay alone: sorting/selection with data-dependent
# output sizes, scatters whose writes may collide, sampling.
_NOT_FUSE = """
argsort assert_op call_builtin_with_ctx call_dps_packed call_inplace_packed call_pure_packed
call_py_func call_tir call_tir_inplace call_tir_with_grad hint_on_device index_put
invoke_closure invoke_pure_closure make_closure multinomial_from_uniform nonzero null_value
print scatter_elements scatter_nd shape_of shape_to_tensor size slice_scatter sort
tensor_to_shape to_vdevice topk unique wrap_param
builtin.alloc_tensor builtin.stop_lift_params
ccl.allgather ccl.allreduce ccl.broadcast_from_worker0 ccl.scatter_from_worker0
dist.annotate_sharding dist.call_tir_local_view dist.redistribute dist.redistribute_replica_to_shard
grad.avg_pool2d_backward grad.end_checkpoint grad.max_pool2d_backward grad.nll_loss_backward
grad.no_grad grad.start_checkpoint grad.take_backward
inspect.tensor_byte_offset inspect.tensor_dtype_bits inspect.tensor_dtype_code
inspect.tensor_dtype_lanes inspect.tensor_elem_offset inspect.tensor_ndim inspect.tensor_shape_i
inspect.tensor_stride_i
memory.alloc_storage memory.alloc_tensor memory.ensure_zero_offset memory.kill_storage
memory.kill_tensor memory.view
vision.all_class_non_max_suppression vision.get_valid_counts vision.multibox_transform_loc
vision.non_max_suppression
vm.alloc_storage vm.alloc_tensor vm.call_tir_dyn vm.kill_object
"""


def _table() -> Mapping[str, MapPattern]:
    table: dict[str, MapPattern] = {}
    for text, pattern in (
        (_ONE_TO_ONE, MapPattern.OneToOne),
        (_REORGANIZE, MapPattern.Reorganize),
        (_SHUFFLE, MapPattern.Shuffle),
        (_ONE_TO_MANY, MapPattern.OneToMany),
        (_MANY_TO_MANY, MapPattern.ManyToMany),
        (_NOT_FUSE, MapPattern.NotFuse),
    ):
        for short in text.split():
            name = f"relax.{short}"
            if name in table:
                raise ValueError(f"{name} is listed as {table[name].name} and {pattern.name}")
            table[name] = pattern
    return MappingProxyType(table)


OP_MAP_PATTERNS: Mapping[str, MapPattern] = _table()


def relax_op_names() -> list[str]:
    """Every ``relax.*`` operator TVM knows."""
    return sorted(n for n in tvm.ir.Op.list_op_names() if n.startswith("relax."))


def unclassified(names: Iterable[str] | None = None) -> list[str]:
    """Relax operators with no mapping class in the table (should be none)."""
    return [n for n in (names or relax_op_names()) if n not in OP_MAP_PATTERNS]


def register_op_map_patterns() -> None:
    """Register ``MapOpPattern`` on every relax operator in the table that TVM has.

    Idempotent: an operator that already carries the attribute is left alone (registering the
    same key twice raises in TVM).
    """
    known = set(tvm.ir.Op.list_op_names())
    for name, pattern in OP_MAP_PATTERNS.items():
        if name not in known:
            continue  # an operator of another TVM version
        if _get_attr(tvm.ir.Op.get(name)) is None:
            tvm.ir.register_op_attr(name, ATTR_NAME, int(pattern))


def _get_attr(op: tvm.ir.Op) -> object:
    """``op.get_attr`` that answers None, not an error, before the key was ever registered."""
    try:
        return op.get_attr(ATTR_NAME)
    except tvm.error.InternalError:
        return None


def op_map_pattern(op: tvm.ir.Op | str) -> MapPattern:
    """The registered mapping class of a relax operator.

    Raises
    ------
    KeyError
        If the operator has no ``MapOpPattern`` (not a relax operator, or an operator this
        table does not know).
    """
    op = tvm.ir.Op.get(op) if isinstance(op, str) else op
    value = _get_attr(op)
    if value is None:
        raise KeyError(f"operator {op.name} has no {ATTR_NAME} attribute")
    return MapPattern(int(value))
