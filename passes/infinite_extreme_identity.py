"""InfiniteExtremeIdentity: float max / min accumulations start from -inf / +inf, as torch's do.

TOPI starts a max reduction (a max pool, a row max) from the lowest *finite* value of its
dtype, and pads a max pool's input with that value: a window whose every element is ``-inf``
returned ``-3.4e38`` (float16: ``-65504``) where torch returns ``-inf``. This pass makes that
starting value and that padding the infinities they stand for, where that is exact:

- an *accumulator*: a float buffer every store of which is either the constant (its start) or
  ``B[i] = max(B[i], v)`` (``min`` with the largest finite value alike); max(-inf, v) is v for
  every v, so only a window of ``-inf`` changes, to ``-inf``;
- a *padding*: ``if_then_else(c, x, lowest)``, either written to a buffer that is read only as
  the ``v`` of an accumulator's update, or inlined as that ``v`` itself (a padded pool
  scheduled by ``ParallelSpatialLLVM``).

It runs after scheduling, because TVM's ``rfactor`` recognises a max reduction only by its
finite starting value; on GPU targets it does not run (TVM's cross-thread reduction lowering
matches the same starting value). It runs before ``PropagateNaN``, whose rewrite hides the
``max`` it looks for.
"""

from __future__ import annotations

import math
from collections import defaultdict

import tvm
from plus_tvm.tir_blocks import blocks, if_then_else, stores, walk_expr
from plus_tvm.tir_blocks.rebuild import map_block_stores, tvm_structural_equal
from tvm import tirx

from ._prim_func_rewrite import rewrite_prim_funcs

# the combiner, and the finite bound TOPI starts it from, of each accumulation
_KINDS = {tirx.Max: tirx.min_value, tirx.Min: tirx.max_value}


@tvm.transform.module_pass(opt_level=0, name="InfiniteExtremeIdentity")
class InfiniteExtremeIdentity:
    """Start float max / min accumulations and their paddings from ``∓inf`` (module docstring)."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return rewrite_prim_funcs(mod, rewrite)


def rewrite(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """``func`` with its accumulators and paddings made infinite, or None when it has none."""
    all_stores = [st for block in blocks(func.body) for st in _block_stores(block)]
    by_buffer = defaultdict(list)
    for store in all_stores:
        by_buffer[_key(store.buffer)].append(store)
    accumulators = {}  # buffer key -> the combiner type
    for key, group in by_buffer.items():
        kind = _accumulator(group)
        if kind is not None:
            accumulators[key] = kind
    if not accumulators:
        return None
    # a padding the caller sees (a parameter) keeps its value
    params = {_key(p) for p in func.params}
    paddings = {
        key: kind
        for key, kind in _paddings(by_buffer, accumulators, all_stores).items()
        if key not in params
    }

    def on_store(store: tirx.BufferStore) -> tirx.Stmt | None:
        key = _key(store.buffer)
        kind = accumulators.get(key) or paddings.get(key)
        if kind is None:
            return None
        infinite = _infinity(kind, store.buffer.dtype)
        value = store.value
        if isinstance(value, tirx.FloatImm):  # an accumulator's start
            value = infinite
        elif _padding(value, kind) is not None:  # a padding written out
            value = _with_fill(value, infinite)
        else:  # an update: its padding inlined, if any
            update = _update_operand(store, kind)
            if update is None or _padding(update, kind) is None:
                return None
            filled = _with_fill(update, infinite)
            value = kind(value.a, filled) if value.b.same_as(update) else kind(filled, value.b)
        return tirx.BufferStore(store.buffer, value, store.indices)

    body = map_block_stores(func.body, on_store)
    return None if body.same_as(func.body) else func.with_body(body)


def _block_stores(block: object) -> list[tirx.BufferStore]:
    found = list(stores(block.body))
    if block.init is not None:
        found += list(stores(block.init))
    return found


def _key(buffer: object) -> int:
    """A buffer (TVM 0.27: the variable stores name and loads read as their ``source``)."""
    return buffer.__chandle__()


def _is_bound(value: object, kind: type, dtype: str) -> bool:
    """``value`` is the finite bound TOPI starts ``kind`` from in ``dtype``."""
    if not isinstance(value, tirx.FloatImm):
        return False
    bound = _KINDS[kind](dtype)
    return float(value.value) == float(bound.value)


def _accumulator(group: list[tirx.BufferStore]) -> type | None:
    """The combiner (``tirx.Max`` / ``tirx.Min``) of a float buffer whose stores are only its
    finite start and ``B = combiner(B, v)`` updates, both present; else None."""
    dtype = str(group[0].buffer.dtype)
    if "float" not in dtype:
        return None
    for kind in _KINDS:
        starts = [st for st in group if _is_bound(st.value, kind, dtype)]
        updates = [st for st in group if _update_operand(st, kind) is not None]
        if starts and updates and len(starts) + len(updates) == len(group):
            return kind
    return None


def _update_operand(store: tirx.BufferStore, kind: type) -> tvm.ir.Expr | None:
    """``v`` of ``B[i] = kind(B[i], v)`` (either order), or None."""
    value = store.value
    if not isinstance(value, kind):
        return None
    for own, other in ((value.a, value.b), (value.b, value.a)):
        if (
            isinstance(own, tvm.ir.TensorLoad)
            and _key(own.source) == _key(store.buffer)
            and len(own.indices) == len(store.indices)
            and all(tvm_structural_equal(a, b) for a, b in zip(own.indices, store.indices))
        ):
            return other
    return None


def _padding(value: object, kind: type) -> tvm.ir.Expr | None:
    """``value`` is ``if_then_else(c, x, bound)`` with ``kind``'s finite bound: its fill."""
    parts = if_then_else(value)
    if parts is None:
        return None
    fill = parts[2]
    return fill if _is_bound(fill, kind, str(fill.ty)) else None


def _paddings(by_buffer: dict, accumulators: dict, all_stores: list) -> dict:
    """Buffers written only as paddings of one combiner's bound and read only as the ``v`` of
    that combiner's accumulators' updates."""
    reads = defaultdict(int)  # every load of each buffer, anywhere in a stored value or index
    as_update = defaultdict(int)  # the loads that are an update's whole ``v``

    def count(node: object) -> None:
        if isinstance(node, tvm.ir.TensorLoad):
            reads[_key(node.source)] += 1

    for store in all_stores:
        walk_expr(store.value, count)
        for index in store.indices:
            walk_expr(index, count)
        kind = accumulators.get(_key(store.buffer))
        operand = _update_operand(store, kind) if kind is not None else None
        if isinstance(operand, tvm.ir.TensorLoad):
            as_update[(_key(operand.source), kind)] += 1
    found = {}
    for key, group in by_buffer.items():
        if key in accumulators:
            continue
        for kind in _KINDS:
            if (
                all(_padding(st.value, kind) is not None for st in group)
                and reads[key] > 0
                and reads[key] == as_update[(key, kind)]
            ):
                found[key] = kind
    return found


def _with_fill(value: tvm.ir.Call, fill: tvm.ir.Expr) -> tvm.ir.Expr:
    return tvm.ir.Call(value.op, [value.args[0], value.args[1], fill], ret_ty=value.ty)


def _infinity(kind: type, dtype: str) -> tirx.FloatImm:
    return tirx.FloatImm(dtype, -math.inf if kind is tirx.Max else math.inf)
