"""GIR-graph generation: templates per basic operator and merging (paper 002, section 6).

A *template* is a graph structure plus parameters; instantiated with concrete parameters it
gives the GIR graph of one basic operator for one row of the kernel on one group of parallel
units. Templates here:

- element-wise / broadcast: load every input (GLOBAL -> REG), broadcast row scalars, compute,
  store (REG -> GLOBAL);
- transpose: without blocking the permuted input is a strided load (``num = length`` segments of
  width 1); with cache-sized blocking (parameter ``tile``) a ``tile x tile`` block is moved to
  CACHE with contiguous segments and read transposed from there;
- reduce, one parallel unit per row: load, element-wise prologue, reduce to one partial per
  lane, a lane-crossing (WARP-scope) synchronization that combines the partials, store;
- reduce, several units per row (GPU, parameter ``units_per_row``): as above, then the warps'
  partials meet in CACHE behind a BLOCK-scope synchronization and are reduced again.

:func:`merge` joins the per-operator graphs of one kernel (they share one parallel primitive,
the merge condition of the paper) and inserts a DEVICE-scope synchronization between the store
of every intermediate tensor and each load of it: the correct but slow starting point that the
rewrite rules then improve.
"""

from __future__ import annotations

import dataclasses

from .analysis import Kernel, MemoryOperator, OperandRead
from .ir import GOp, Graph, Hierarchy, Kind, MemSlice, Parallel, Scope

G, C, R = Hierarchy.GLOBAL, Hierarchy.CACHE, Hierarchy.REG


def op_len(kernel: Kernel, op: MemoryOperator, params: dict) -> int:
    """Elements of one row that ``op`` touches: its reduction length, the row length, or 1
    for an operator on row scalars (a mean computed from a sum)."""
    if kernel.structure != "row":
        return _row_len(kernel, params)
    if op.kind == "reduce":
        return kernel.row_len
    total = 1
    for e in op.spatial[kernel.num_leading :]:
        total *= e
    return total


def row_slice(kernel: Kernel, op: MemoryOperator, access: OperandRead, params: dict) -> MemSlice:
    """The GLOBAL slice of ``access.buffer`` that one row of ``op`` reads."""
    size = kernel.sizes.get(access.buffer, 1)
    nbytes = op.dtype_bytes
    length = op_len(kernel, op, params)
    if kernel.structure == "row" and size <= kernel.rows:
        return MemSlice(access.buffer, G, 1, 1, 1, nbytes)
    if kernel.structure == "column":
        width = params.get("col_tile", 1)
        if params.get("split_k") and size > kernel.rows:
            # the reduced axis split over units: each reads a contiguous block of rows
            block = (kernel.row_len // params["split_k"]) * kernel.rows
            return MemSlice(access.buffer, G, 1, block, block, nbytes)
        if op.kind == "reduce" and not op.trailing_reduce:
            return MemSlice(access.buffer, G, kernel.row_len, width, kernel.rows, nbytes)
        if size <= kernel.rows:
            return MemSlice(access.buffer, G, 1, width, width, nbytes)
        return MemSlice(access.buffer, G, kernel.row_len, width, kernel.rows, nbytes)
    tile = params.get("tile", 0) if kernel.structure == "elementwise" else 0
    last = kernel.ops[-1].spatial[-1] if kernel.ops[-1].spatial else 1
    if access.kind == "permute":
        stride = max(size // max(last, 1), 1)
        if tile:
            return MemSlice(access.buffer, G, tile, tile, stride, nbytes)
        return MemSlice(access.buffer, G, length, 1, stride, nbytes)
    if tile and access.kind == "same":
        return MemSlice(access.buffer, G, tile, tile, last, nbytes)
    if access.kind == "broadcast":
        rows = kernel.rows
        if kernel.structure == "row" and size <= rows:
            return MemSlice(access.buffer, G, 1, 1, 1, nbytes)
        return MemSlice(
            access.buffer, G, 1, min(size, length), min(size, length), nbytes, shared=True
        )
    return MemSlice(access.buffer, G, 1, length, length, nbytes)


def _row_len(kernel: Kernel, params: dict) -> int:
    if kernel.structure == "column":
        return params.get("col_tile", 1)
    if kernel.structure == "elementwise":
        if params.get("tile"):
            return params["tile"] ** 2
        return params.get("row_len", kernel.ops[-1].spatial[-1] if kernel.ops[-1].spatial else 1)
    return kernel.row_len


def _reg(s: MemSlice) -> MemSlice:
    return MemSlice(
        s.tensor,
        R,
        1,
        s.width if s.num == 1 else s.num * s.width,
        s.width if s.num == 1 else s.num * s.width,
        s.dtype_bytes,
        shared=s.shared,
    )


def op_graph(kernel: Kernel, op: MemoryOperator, parallel: Parallel, params: dict) -> Graph:
    """Instantiate the template of ``op`` with ``params`` (one row, one group of units)."""
    g = Graph(parallel, params=dict(params))
    length = op_len(kernel, op, params)
    operands: list[MemSlice] = []
    for acc in _unique(op.accesses):
        src = row_slice(kernel, op, acc, params)
        if acc.kind == "permute" and params.get("tile"):
            t = params["tile"]  # cache-sized blocking: a t x t block through CACHE
            staged = MemSlice(acc.buffer, C, t, t, t, src.dtype_bytes)
            g.add(GOp(Kind.MOVE, [src], [staged], attrs={"block": op.block}))
            src = staged
        reg = _reg(src)
        g.add(GOp(Kind.MOVE, [src], [reg], attrs={"block": op.block}))
        if reg.elements == 1 and length > 1 and op.kind != "reduce" and kernel.structure == "row":
            wide = MemSlice(reg.tensor, R, 1, length, length, reg.dtype_bytes, version=1)
            g.add(GOp(Kind.BROADCAST, [reg], [wide], attrs={"block": op.block}))
            reg = wide
        operands.append(reg)
    nbytes = op.dtype_bytes
    attrs = {
        "block": op.block,
        "flops": op.flops,
        "transcendental": op.transcendental,
        "cheap": op.transcendental == 0,
    }
    if op.kind != "reduce":
        out = MemSlice(op.output, R, 1, length, length, nbytes)
        g.add(GOp(Kind.EWISE, operands, [out], attrs=attrs))
        if op.output_is_param or kernel.consumers.get(op.output):
            t = params.get("tile", 0) if kernel.structure == "elementwise" else 0
            last = kernel.ops[-1].spatial[-1] if kernel.ops[-1].spatial else 1
            dst = MemSlice(op.output, G, t, t, last, nbytes) if t else out.at(G)
            g.add(GOp(Kind.MOVE, [out], [dst], attrs={"block": op.block}))
        return g
    # reduce templates
    # partials of one unit: a warp's threads x elements, or a core's accumulator lanes
    lanes = parallel.lanes * parallel.vector if parallel.unit == "warp" else parallel.lanes
    red_len = max(sum(o.elements for o in operands[:1]), 1)
    width = params.get("col_tile", 1) if kernel.structure == "column" else 1
    cur = operands
    if op.flops > 1:  # an element-wise prologue inside the reduction, e.g. (x - mean)^2
        pro = MemSlice(op.output + ".prologue", R, 1, red_len, red_len, nbytes)
        g.add(GOp(Kind.EWISE, cur, [pro], attrs=dict(attrs, flops=op.flops - 1)))
        cur = [pro]
    if kernel.structure == "column" and params.get("split_k"):
        # multi-unit column template: a partial per unit for every column (CACHE-resident
        # accumulators), stored, a DEVICE-scope synchronization, then the partials reduced
        k, cols = params["split_k"], kernel.rows
        part = MemSlice(op.output + ".partial", C, 1, cols, cols, nbytes)
        g.add(GOp(Kind.REDUCE, cur, [part], attrs=dict(attrs, flops=1)))
        stored = MemSlice(op.output + ".partial", G, 1, cols, cols, nbytes)
        g.add(GOp(Kind.MOVE, [part], [stored], attrs={"block": op.block}))
        share = max(cols // k, 1)
        read = MemSlice(op.output + ".partial", G, k, share, cols, nbytes, version=1)
        g.add(
            GOp(Kind.SYNC, [stored], [read], Scope.DEVICE, attrs={"block": op.block, "final": True})
        )
        regs = MemSlice(op.output + ".partial", R, 1, k * share, k * share, nbytes)
        g.add(GOp(Kind.MOVE, [read], [regs], attrs={"block": op.block}))
        final = MemSlice(op.output, R, 1, share, share, nbytes)
        g.add(GOp(Kind.REDUCE, [regs], [final], attrs=dict(attrs, flops=1)))
    elif kernel.structure == "column":
        part = MemSlice(op.output, R, 1, width, width, nbytes)
        g.add(GOp(Kind.REDUCE, cur, [part], attrs=dict(attrs, flops=1)))
        final = part
    else:
        part = MemSlice(
            op.output + ".lanes", R, 1, min(lanes, red_len), min(lanes, red_len), nbytes
        )
        g.add(GOp(Kind.REDUCE, cur, [part], attrs=dict(attrs, flops=1)))
        warp_total = MemSlice(op.output + ".warp", R, 1, 1, 1, nbytes)
        g.add(GOp(Kind.SYNC, [part], [warp_total], Scope.WARP, attrs={"block": op.block}))
        final = warp_total
        if parallel.units_per_row > 1:
            u = parallel.units_per_row
            staged = MemSlice(op.output + ".units", C, 1, u, u, nbytes)
            g.add(GOp(Kind.MOVE, [warp_total], [staged], attrs={"block": op.block}))
            synced = MemSlice(op.output + ".units", C, 1, u, u, nbytes, version=1)
            g.add(GOp(Kind.SYNC, [staged], [synced], Scope.BLOCK, attrs={"block": op.block}))
            final = MemSlice(op.output, R, 1, 1, 1, nbytes)
            g.add(GOp(Kind.REDUCE, [synced], [final], attrs=dict(attrs, flops=1)))
        else:
            final = MemSlice(op.output, R, 1, 1, 1, nbytes)
            g.add(
                GOp(
                    Kind.EWISE,
                    [warp_total],
                    [final],
                    attrs={"block": op.block, "flops": 0, "transcendental": 0, "cheap": True},
                )
            )
    g.add(GOp(Kind.MOVE, [final], [final.at(G)], attrs={"block": op.block}))
    return g


def _unique(accesses: list[OperandRead]) -> list[OperandRead]:
    seen, out = set(), []
    for a in accesses:
        if (a.buffer, a.kind) not in seen:
            seen.add((a.buffer, a.kind))
            out.append(a)
    return out


def merge(kernel: Kernel, graphs: list[Graph]) -> Graph:
    """Merge per-operator graphs (in program order) with global synchronization insertion.

    Between the store of an intermediate tensor and every load of it a DEVICE-scope SYNC is
    inserted; its output slice has the reader's pattern (a synchronization may change the
    pattern, section 4).
    """
    parallel = graphs[0].parallel
    if any(g.parallel != parallel for g in graphs):
        raise ValueError("GIR graphs merge only with one parallel structure")
    merged = Graph(parallel, params=dict(graphs[0].params))
    stores: dict[str, MemSlice] = {}
    version = 10
    for g in graphs:
        # slices inside one operator's graph are values of that operator only: give them
        # versions of their own so equal-looking slices of two operators stay distinct
        local: dict[MemSlice, MemSlice] = {}

        def own(s: MemSlice, local: dict = local) -> MemSlice:
            nonlocal version
            if s.hierarchy is G:
                return s
            if s not in local:
                version += 1
                local[s] = dataclasses.replace(s, version=version)
            return local[s]

        for node in g.nodes:
            node = GOp(
                node.kind,
                [own(s) for s in node.inputs],
                [own(s) for s in node.outputs],
                node.scope,
                dict(node.attrs),
            )
            for i, s in enumerate(node.inputs):
                if s.hierarchy is G and s.tensor in stores:
                    version += 1
                    synced = MemSlice(
                        s.tensor, G, s.num, s.width, s.stride, s.dtype_bytes, version=version
                    )
                    merged.add(
                        GOp(
                            Kind.SYNC,
                            [stores[s.tensor]],
                            [synced],
                            Scope.DEVICE,
                            attrs={"block": node.attrs.get("block"), "reader_pattern": s.pattern},
                        )
                    )
                    node.inputs[i] = synced
            merged.add(node)
            for s in node.outputs:
                if s.hierarchy is G and node.kind is Kind.MOVE:
                    stores[s.tensor] = s
    merged.check()
    return merged


def generate(kernel: Kernel, parallel: Parallel, params: dict) -> Graph:
    """The merged GIR graph of ``kernel`` for one choice of template parameters; a layout copy
    of an output is one more store of the value the kernel holds in registers."""
    g = merge(kernel, [op_graph(kernel, op, parallel, params) for op in kernel.ops])
    for block, source in kernel.copies.items():
        stores = [
            n
            for n in g.nodes
            if n.kind is Kind.MOVE and n.outputs[0].tensor == source and n.outputs[0].hierarchy is G
        ]
        if stores:
            value = stores[-1].inputs[0]
            dst = dataclasses.replace(stores[-1].outputs[0], tensor=block)
            g.add(GOp(Kind.MOVE, [value], [dst], attrs={"block": block}))
    return g
