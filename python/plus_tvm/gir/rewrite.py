"""GIR-graph rewriting: the three rules of paper 002 (section 5) and algorithm 1.

- :func:`insert_sync` replaces a DEVICE-scope synchronization between a store and a load of one
  tensor by the smallest scope that covers the units writing and reading it (figure 5), and
  raises the tensor's slice to the highest hierarchy that scope allows and its live footprint
  fits in; a LANE-scope exchange (same units, same pattern) needs no synchronization at all.
- :func:`merge_raw` joins two consecutive moves (write then read of one slice) into one, and
  into nothing when the pattern and hierarchy at both ends agree; :func:`merge_rar` joins two
  moves that read the same slice.
- :func:`swap_forward` moves an element-wise gOperator past the moves that stage its result, to
  each reader (only forward, so the rules are irreversible and the greedy loop terminates).

:func:`optimize` is algorithm 1: synchronization insertion and swapping everywhere, then
merging until no merge applies.
"""

from __future__ import annotations

import dataclasses
import itertools

from .analysis import Kernel
from .ir import GOp, Graph, Hierarchy, Kind, MemSlice, Scope

_versions = itertools.count(1000)


@dataclasses.dataclass(frozen=True)
class Capacity:
    """Bytes one parallel unit may keep live at each hierarchy (registers, cache)."""

    reg: int
    cache: int

    def highest(self, scope: Scope, nbytes: int, scalar: bool) -> Hierarchy:
        """The highest hierarchy allowed for data exchanged at ``scope`` (section 5.1)."""
        if scope is Scope.DEVICE:
            return Hierarchy.GLOBAL
        if scope is Scope.LANE or (scope is Scope.WARP and scalar):
            if nbytes <= self.reg:
                return Hierarchy.REG
        if nbytes <= self.cache:
            return Hierarchy.CACHE
        return Hierarchy.GLOBAL


def _block(node: GOp | None) -> str | None:
    return None if node is None else node.attrs.get("block")


def barrier_between(kernel: Kernel, first: str | None, later: str | None) -> bool:
    """Whether block ``later`` waits on a whole-row reduction that waits on ``first``: then
    data from ``first`` must stay live for the whole row until ``later`` reads it."""
    if first is None or later is None or first == later:
        return False
    for op in kernel.ops:
        if op.kind != "reduce" or op.block == later:
            continue
        if kernel.depends(later, op.block) and (
            op.block == first or kernel.depends(op.block, first)
        ):
            return True
    return False


def _fresh(s: MemSlice, hierarchy: Hierarchy) -> MemSlice:
    return dataclasses.replace(s, hierarchy=hierarchy, version=next(_versions))


def _footprint(
    kernel: Kernel, g: Graph, s: MemSlice, writer: str | None, readers: list[str | None]
) -> int:
    vector = g.parallel.vector * (g.parallel.lanes if g.parallel.unit == "warp" else 1)
    if any(barrier_between(kernel, writer, r) for r in readers):
        return s.nbytes
    return min(s.nbytes, vector * s.dtype_bytes)


# ------------------------------------------------------------------------ synchronization
def insert_sync(kernel: Kernel, g: Graph, cap: Capacity, sync: GOp) -> bool:
    """Rule 1 on the DEVICE-scope SYNCs that follow one store; returns whether ``g`` changed.

    Every reader of the stored slice is considered together: the slice is raised to the
    highest hierarchy that all of their scopes allow and that its live footprint fits in.
    """
    if sync.kind is not Kind.SYNC or sync.scope is not Scope.DEVICE or sync.attrs.get("final"):
        return False
    src = sync.inputs[0]
    store = g.producer(src)
    syncs = [n for n in g.consumers(src) if n.kind is Kind.SYNC and n.scope is Scope.DEVICE]
    if store is None or store.kind is not Kind.MOVE or len(syncs) != len(g.consumers(src)):
        sync.attrs["final"] = True
        return False
    par = g.parallel
    units = set(range(par.units_per_row))  # the units of one row write and read it
    plans, readers = [], []
    for sy in syncs:
        dst = sy.outputs[0]
        loads = g.consumers(dst)
        reader_pattern = sy.attrs.get("reader_pattern", dst.pattern)
        inside = (dst.num - 1) * dst.stride + dst.width <= max(src.num * src.stride, src.width)
        if not loads or not inside:
            scope = Scope.DEVICE  # re-read with another row mapping (a strided re-read)
        elif reader_pattern == src.pattern:
            scope = Scope.LANE
        else:
            scope = par.scope_between(units, units)
        plans.append((sy, dst, scope))
        readers += [_block(n) for n in loads]
    nbytes = _footprint(kernel, g, src, _block(store), readers)
    level = min(cap.highest(scope, nbytes, scalar=src.elements == 1) for _, _, scope in plans)
    if level is Hierarchy.GLOBAL:
        for sy in syncs:
            sy.attrs["final"] = True
        return False
    raised = _fresh(src, level)
    store.outputs = [raised if s == src else s for s in store.outputs]
    if nbytes == src.nbytes and src.elements > 1:
        g.pinned.add(raised)
    for sy, dst, scope in plans:
        if scope is Scope.LANE:
            g.replace_input(dst, raised)
            g.remove(sy)
        else:
            sy.inputs = [raised]
            synced = _fresh(dst, level)
            sy.outputs = [synced]
            sy.scope = scope
            g.replace_input(dst, synced)
            if raised in g.pinned:
                g.pinned.add(synced)
    return True


# ------------------------------------------------------------------------------ swapping
def swap_forward(kernel: Kernel, g: Graph, node: GOp) -> bool:
    """Rule 3: move element-wise ``node`` past the moves that stage its only output to the
    readers of the staged copy, recomputing it there from its own sources."""
    if node.kind is not Kind.EWISE or len(node.outputs) != 1:
        return False
    if not (node.attrs.get("cheap") or g.params.get("recompute")):
        return False
    out = node.outputs[0]
    if out.tensor in kernel.params:
        return False
    stages = g.consumers(out)
    if len(stages) != 1 or stages[0].kind is not Kind.MOVE:
        return False
    stage = stages[0]
    staged = stage.outputs[0]
    if staged.hierarchy is Hierarchy.GLOBAL or staged not in g.pinned:
        return False  # another kernel's data (GLOBAL), or nothing staged to save
    readers = g.consumers(staged)
    if not readers or any(r.kind is not Kind.MOVE for r in readers):
        return False
    sources = []
    for s in node.inputs:
        prod = g.producer(s)
        if prod is not None and prod.kind is Kind.MOVE and prod.inputs[0].hierarchy < s.hierarchy:
            sources.append(("load", prod.inputs[0], s))
        elif prod is not None and prod.kind is Kind.BROADCAST and prod.inputs[0].elements == 1:
            sources.append(("keep", None, s))
        elif s.hierarchy is Hierarchy.GLOBAL:
            sources.append(("load", s, s))
        else:
            return False
    for reader in readers:
        idx = g.nodes.index(reader)
        new_nodes, operands = [], []
        for how, src, s in sources:
            if how == "keep":
                operands.append(s)
                continue
            reg = _fresh(s, Hierarchy.REG)
            new_nodes.append(
                GOp(Kind.MOVE, [src], [reg], attrs={"block": reader.attrs.get("block")})
            )
            operands.append(reg)
        new_nodes.append(
            GOp(
                Kind.EWISE,
                operands,
                list(reader.outputs),
                attrs=dict(node.attrs, block=reader.attrs.get("block")),
            )
        )
        g.nodes[idx : idx + 1] = new_nodes
    g.remove(stage)
    g.remove(node)
    g.pinned.discard(staged)
    for s in node.inputs:  # inputs nobody reads any more
        prod = g.producer(s)
        if prod is not None and not g.consumers(s) and prod.kind in (Kind.MOVE, Kind.BROADCAST):
            g.remove(prod)
    return True


# ------------------------------------------------------------------------------- merging
def merge_raw(g: Graph, first: GOp, second: GOp) -> bool:
    """Rule 2a: MOVE(a -> b); MOVE(b -> c) becomes MOVE(a -> c), or nothing when a and c have
    the same hierarchy and pattern."""
    if first.kind is not Kind.MOVE or second.kind is not Kind.MOVE:
        return False
    b = first.outputs[0]
    if second.inputs != [b] or g.consumers(b) != [second] or b in g.pinned:
        return False
    a, c = first.inputs[0], second.outputs[0]
    if a.hierarchy is c.hierarchy and a.pattern == c.pattern and a.tensor == c.tensor:
        g.remove(second)
        g.remove(first)
        g.replace_input(c, a)
        return True
    if (
        a.tensor != c.tensor
        and (a.hierarchy is Hierarchy.GLOBAL)
        and (c.hierarchy is Hierarchy.GLOBAL)
    ):
        return False  # a copy between two kernel tensors stays a copy through registers
    second.inputs = [a]
    g.remove(first)
    return True


def merge_rar(kernel: Kernel, g: Graph, cap: Capacity, first: GOp, second: GOp) -> bool:
    """Rule 2b: two moves reading the same slice into one hierarchy become one; when the two
    readers are separated by a row-wide barrier the shared copy is staged where it fits."""
    if first.kind is not Kind.MOVE or second.kind is not Kind.MOVE or first is second:
        return False
    if first.inputs != second.inputs or first.attrs.get("staging"):
        return False
    a, b1, b2 = first.inputs[0], first.outputs[0], second.outputs[0]
    if b1.hierarchy is not b2.hierarchy or b1.pattern != b2.pattern:
        return False
    if a.hierarchy >= b1.hierarchy:
        return False
    live = barrier_between(kernel, _block(first), _block(second))
    if not live:
        g.remove(second)
        g.replace_input(b2, b1)
        return True
    level = cap.highest(Scope.LANE, b1.nbytes, scalar=b1.elements == 1)
    if level <= a.hierarchy:
        return False  # the row does not fit anywhere above its source: read it twice
    if level is Hierarchy.REG:
        g.remove(second)
        g.replace_input(b2, b1)
        g.pinned.add(b1)
        return True
    staged = _fresh(b1, level)
    g.pinned.add(staged)
    stage = GOp(Kind.MOVE, [a], [staged], attrs={"block": _block(first), "staging": True})
    g.nodes.insert(g.nodes.index(first), stage)
    first.inputs = [staged]
    second.inputs = [staged]
    return True


# ---------------------------------------------------------------------------- algorithm 1
def optimize(kernel: Kernel, g: Graph, cap: Capacity, max_rounds: int = 64) -> Graph:
    """Algorithm 1 of paper 002 on a copy of ``g``."""
    g = g.copy()
    for _ in range(max_rounds):
        for node in list(g.nodes):
            if node in g.nodes:
                insert_sync(kernel, g, cap, node)
        for node in list(g.nodes):
            if node in g.nodes:
                swap_forward(kernel, g, node)
        changed = False
        for first in list(g.nodes):
            for second in list(g.nodes):
                if first in g.nodes and second in g.nodes and first is not second:
                    if g.nodes.index(first) < g.nodes.index(second) and (
                        merge_raw(g, first, second) or merge_rar(kernel, g, cap, first, second)
                    ):
                        changed = True
        if not changed:
            break
    g.check()
    return g


def placement(kernel: Kernel, g: Graph) -> dict[str, str]:
    """Where every intermediate (and every staged input) lives in the optimized graph:
    ``inline`` (recomputed or in registers for one vector), ``reg`` / ``cache`` (a row-local
    buffer in registers / cache or shared memory) or ``global`` (materialized in memory)."""
    out: dict[str, str] = {}
    names = set(kernel.intermediates) | set(kernel.params)
    for s in g.slices():
        if s.tensor not in names:
            continue
        if s.tensor in kernel.params:
            if s in g.pinned and s.hierarchy is not Hierarchy.GLOBAL:
                level = "cache" if s.hierarchy is Hierarchy.CACHE else "reg"
                if out.get(s.tensor) != "cache":
                    out[s.tensor] = level
            continue
        if s.hierarchy is Hierarchy.GLOBAL:
            level = "global"
        elif s in g.pinned:
            level = "cache" if s.hierarchy is Hierarchy.CACHE else "reg"
        else:
            level = "inline"
        order = ["inline", "reg", "cache", "global"]
        prev = out.get(s.tensor, "inline")
        out[s.tensor] = max(prev, level, key=order.index)
    for t in kernel.intermediates:
        out.setdefault(t, "inline")
    return out
