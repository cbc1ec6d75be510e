"""Derive the mapping class of a TIR PrimFunc from its blocks' index maps.

This is what lets user-written ``call_tir`` functions and already fused kernels take part in
mapping-type fusion: nothing about the operator name is needed, only how each block's stores
index its loads (paper 004, section 3.1.1, read off the loop nest).

Per block:

- a reduction iterator (extent > 1)                                  -> ManyToMany
- per load of the stored value, compared with the store's indices:
  - indices that read another buffer (a gather)                      -> Reorganize
  - the load does not depend on every spatial iterator               -> a broadcast side input
  - same indices, same buffer shape                                  -> OneToOne
  - bare iterators, same set, another order                          -> Shuffle
  - affine and injective (slice, pad, concat piece, expand_dims)     -> Reorganize
  - otherwise: folded indices (div/mod); as many input elements as
    output elements is a reshape (Reorganize), fewer is tile/repeat  -> OneToMany
  The block's class is the most complex class among loads that depend on every spatial
  iterator; when no load does (broadcast_to, outer broadcasting) or there is no load at all
  (fills, arange), it is OneToMany.
- A PrimFunc with no analysable block (opaque extern code: sort, scans) is NotFuse.

The PrimFunc's class is the most complex class of its blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import tirx
from tvm.s_tir import SBlock

from ..tir_blocks import BlockInfo, blocks, expr_vars, has_load, is_opaque, nodes
from .classes import MapPattern, most_complex


# ----------------------------------------------------------------------------------- analysis
@dataclass(frozen=True)
class AccessClass:
    """How one load relates to the store it feeds."""

    pattern: MapPattern
    covers_all: bool  # depends on every spatial iterator (not a broadcast side input)
    rank_only: bool = False  # the output's elements at the output's indices, rank differs


def _shape(buffer: tirx.Var) -> list:
    """Shape of a buffer: in TVM 0.27 buffers are variables of ``BufferType``."""
    return list(buffer.ty.shape)


def _numel(buffer: tirx.Var) -> tvm.ir.Expr:
    total: tvm.ir.Expr = tirx.IntImm("int64", 1)
    for dim in _shape(buffer):
        total = (
            total * tirx.Cast("int64", dim)
            if not isinstance(dim, tirx.IntImm)
            else (total * tirx.IntImm("int64", int(dim)))
        )
    return total


def _affine_injective(indices: list, spatial: set[tirx.Var]) -> bool:
    """Each index uses at most one spatial iterator, each iterator exactly one index, and no
    index folds (div/mod): ``c * v + k`` forms, which read every input element at most once."""
    seen: set[tirx.Var] = set()
    for idx in indices:
        if any(isinstance(n, _FOLDING) for n in nodes(idx)):
            return False
        used = expr_vars(idx) & spatial
        if len(used) > 1 or used & seen:
            return False
        seen |= used
    return seen == spatial


_FOLDING = (tirx.FloorDiv, tirx.FloorMod, tirx.Div, tirx.Mod)


def _same_index(a: tvm.ir.Expr, b: tvm.ir.Expr, unit: frozenset[tirx.Var]) -> bool:
    """Structural equality, with iterators of extent 1 equal to the constant 0."""

    def norm(e: tvm.ir.Expr) -> object:
        if isinstance(e, tirx.Var) and e in unit:
            return 0
        if isinstance(e, tirx.IntImm) and int(e) == 0:
            return 0
        return e

    na, nb = norm(a), norm(b)
    if isinstance(na, int) or isinstance(nb, int):
        return isinstance(na, int) and isinstance(nb, int)
    return tvm_ffi.structural_equal(na, nb, map_free_vars=False)


def _drop_units(li: list, unit: frozenset[tirx.Var], wi: list) -> bool:
    """Whether ``li`` and ``wi`` are equal once unit iterators and zeros are removed."""

    def keep(e: tvm.ir.Expr) -> bool:
        return not (
            (isinstance(e, tirx.Var) and e in unit) or (isinstance(e, tirx.IntImm) and int(e) == 0)
        )

    a, b = [e for e in li if keep(e)], [e for e in wi if keep(e)]
    return len(a) == len(b) and all(
        tvm_ffi.structural_equal(x, y, map_free_vars=False) for x, y in zip(a, b)
    )


def classify_access(
    source: tirx.Var,
    indices: list,
    store: tirx.BufferStore,
    spatial: set[tirx.Var],
    unit: frozenset[tirx.Var] = frozenset(),
) -> AccessClass:
    """The mapping class of one load (of ``source`` at ``indices``) with respect to the store
    whose value it feeds, given the block's spatial iterators (and those of extent 1)."""
    li, wi = list(indices), list(store.indices)
    if any(has_load(i) for i in li):
        return AccessClass(MapPattern.Reorganize, True)  # gather: data-dependent index
    used: set[tirx.Var] = set()
    for i in li:
        used |= expr_vars(i) & spatial
    if used != spatial:
        return AccessClass(MapPattern.OneToMany, False)
    src_shape, dst_shape = _shape(source), _shape(store.buffer)
    same_shape = len(src_shape) == len(dst_shape) and all(
        tvm_ffi.structural_equal(a, b) for a, b in zip(src_shape, dst_shape)
    )
    if len(li) == len(wi) and same_shape and all(_same_index(a, b, unit) for a, b in zip(li, wi)):
        return AccessClass(MapPattern.OneToOne, True)
    if _drop_units(li, unit, wi):
        # x[i, j] stored to y[i, 0, j] (or b[j] added to x[0, j]): the same elements, another
        # rank -- expand_dims / squeeze alone, a broadcast operand beside an identity load.
        return AccessClass(MapPattern.Reorganize, True, rank_only=True)
    bare = all(isinstance(i, tirx.Var) for i in li) and all(isinstance(i, tirx.Var) for i in wi)
    if (
        bare
        and len(li) == len(wi)
        and {*li} == {*wi}
        and not all(x.same_as(y) for x, y in zip(li, wi))
    ):
        return AccessClass(MapPattern.Shuffle, True)
    if _affine_injective(li, spatial):
        return AccessClass(MapPattern.Reorganize, True)
    analyzer = tvm.sym.Analyzer()
    if analyzer.can_prove(_numel(source) >= _numel(store.buffer)):
        return AccessClass(MapPattern.Reorganize, True)  # reshape-like: a bijection
    return AccessClass(MapPattern.OneToMany, True)  # folded and smaller: tile / repeat


def classify_block(block: SBlock) -> MapPattern | None:
    """The class of one block, or None for a block without computation (the root)."""
    info = BlockInfo(block)
    if not info.stores:
        return None
    if not info.data_parallel or info.accumulates:
        return MapPattern.ManyToMany  # a reduction, or accumulation into its own output
    spatial = {iv.var for iv in info.loops}
    classes = [
        classify_access(load.source, load.indices, store, spatial, info.units)
        for store, load in info.reads
    ]
    identity = any(c.pattern == MapPattern.OneToOne for c in classes)
    covering = [c.pattern for c in classes if c.covers_all and not (identity and c.rank_only)]
    if not covering:
        return MapPattern.OneToMany  # every input is broadcast, or values are generated
    return most_complex(*covering)


def analyze_primfunc(func: tirx.PrimFunc) -> MapPattern:
    """The mapping class of a PrimFunc: the most complex class among its blocks.

    A PrimFunc without any analysable block (opaque code from ``te.extern`` or the IR builder,
    such as sort or scan kernels) is ``NotFuse``.
    """
    if not _mergeable_buffers(func):
        return MapPattern.NotFuse
    found = list(blocks(func.body))
    if any(is_opaque(b) for b in found):
        return MapPattern.NotFuse
    classes = [c for c in (classify_block(b) for b in found) if c is not None]
    if not classes:
        return MapPattern.NotFuse
    return most_complex(*classes)


def _mergeable_buffers(func: tirx.PrimFunc) -> bool:
    """Whether every buffer parameter is a plain compact buffer (offset 0, no strides).

    The extern kernels of scatter / cumsum take buffers with a symbolic ``elem_offset``;
    FuseTIR cannot map them onto a fused kernel's buffers ("Inconsistent buffers ... mapped to
    the same relax var"), and TVM marks such kernels opaque.
    """
    for param in func.params:
        ty = param.ty
        if not hasattr(ty, "elem_offset"):
            continue  # a scalar parameter
        offset = ty.elem_offset
        if not (isinstance(offset, tirx.IntImm) and int(offset) == 0):
            return False
        if ty.strides is not None and len(ty.strides) > 0:
            return False
    return True
