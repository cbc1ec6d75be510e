"""GIR: the instruction-level graph IR of PowerFusion (paper 002, section 4).

A GIR graph describes one memory-intensive kernel *per parallel unit*: its nodes are gOperators
(computation, data movement, synchronization) and its edges are memory slices on a memory
hierarchy. The parallel primitive (:class:`Parallel`) says how rows of the kernel map onto
parallel units (GPU: warps; CPU: cores whose SIMD lanes are the lanes).

The graph is small (tens of nodes) and rewritten often, so it is a plain Python structure:
nodes in a list (program order is a topological order), edges implied by the slices that a node
reads and writes.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
from dataclasses import dataclass, field


class Hierarchy(enum.IntEnum):
    """Memory hierarchy of a slice; a larger value is a higher (smaller, faster) level."""

    GLOBAL = 0  # DRAM: GPU global memory, CPU main memory
    CACHE = 1  # GPU shared memory, CPU per-core cache (L1/L2)
    REG = 2  # registers: GPU thread registers, CPU vector registers


class Scope(enum.IntEnum):
    """Synchronization scope: which parallel units exchange data through a slice."""

    LANE = 0  # same lane, same pattern: no synchronization at all
    WARP = 1  # lanes of one parallel unit (GPU warp shuffle; CPU in-core vector shuffle)
    BLOCK = 2  # units of one block (GPU shared memory + barrier)
    DEVICE = 3  # every unit: a global synchronization (a kernel boundary)


class Kind(enum.Enum):
    """gOperator kinds."""

    EWISE = "ewise"  # element-wise computation in registers
    REDUCE = "reduce"  # reduce a slice to fewer elements
    BROADCAST = "broadcast"  # expand a slice to more elements
    MOVE = "move"  # data movement between (or within) hierarchies
    SYNC = "sync"  # synchronization with a scope; may change the slice pattern


COMPUTE_KINDS = (Kind.EWISE, Kind.REDUCE, Kind.BROADCAST)


@dataclass(frozen=True)
class MemSlice:
    """Contiguous segments of one tensor on one hierarchy: ``num`` segments of ``width``
    elements, ``stride`` elements apart (per parallel unit and row)."""

    tensor: str
    hierarchy: Hierarchy
    num: int
    width: int
    stride: int
    dtype_bytes: int = 4
    version: int = 0  # distinguishes values of one tensor after a rewrite raised a copy
    shared: bool = False  # the same data for every row (weights such as LayerNorm's gamma)

    @property
    def pattern(self) -> tuple[int, int, int]:
        return (self.num, self.width, self.stride if self.num > 1 else 0)

    @property
    def elements(self) -> int:
        return self.num * self.width

    @property
    def nbytes(self) -> int:
        return self.elements * self.dtype_bytes

    def at(self, hierarchy: Hierarchy) -> MemSlice:
        return dataclasses.replace(self, hierarchy=hierarchy)


_ids = itertools.count()


@dataclass(eq=False)
class GOp:
    """A gOperator: computation, data movement or synchronization.

    ``attrs`` carries what the performance model and the lowering need: ``block`` (the TIR
    block it comes from), ``flops`` and ``transcendental`` per element, ``cheap`` (an
    element-wise operator that may be recomputed freely).
    """

    kind: Kind
    inputs: list[MemSlice]
    outputs: list[MemSlice]
    scope: Scope | None = None
    attrs: dict = field(default_factory=dict)
    uid: int = field(default_factory=lambda: next(_ids))

    def __repr__(self) -> str:
        ins = ",".join(f"{s.tensor}@{s.hierarchy.name}" for s in self.inputs)
        outs = ",".join(f"{s.tensor}@{s.hierarchy.name}" for s in self.outputs)
        scope = f"[{self.scope.name}]" if self.scope is not None else ""
        return f"{self.kind.value}{scope}({ins} -> {outs})"

    @property
    def is_movement(self) -> bool:
        return self.kind in (Kind.MOVE, Kind.SYNC)


@dataclass(frozen=True)
class Parallel:
    """The parallel primitive: rows of the kernel over parallel units.

    ``unit`` is ``"warp"`` (GPU) or ``"core"`` (CPU); ``lanes`` the lanes of one unit (32
    threads, or SIMD lanes of ``vector`` elements); ``units_per_row`` units share one row (their
    ids are contiguous, so units ``u`` and ``u'`` are in one block iff ``u // units_per_block``
    agree); ``units_per_block`` is the GPU block size in warps (1 on CPU).
    """

    unit: str
    lanes: int
    vector: int
    units_per_row: int = 1
    units_per_block: int = 1

    def row_unit(self, row: int, segment: int = 0) -> int:
        """The unit that handles ``segment`` (of ``units_per_row``) of ``row``."""
        return row * self.units_per_row + segment % self.units_per_row

    def scope_between(self, writer_units: set[int], reader_units: set[int]) -> Scope:
        """The smallest scope containing every unit that writes and reads a slice (fig. 5)."""
        units = writer_units | reader_units
        if len(units) == 1:
            return Scope.WARP
        blocks = {u // self.units_per_block for u in units}
        return Scope.BLOCK if len(blocks) == 1 else Scope.DEVICE


@dataclass(eq=False)
class Graph:
    """A GIR graph for one kernel: gOperators in program order plus the parallel primitive."""

    parallel: Parallel
    nodes: list[GOp] = field(default_factory=list)
    params: dict = field(default_factory=dict)  # template parameters that produced the graph
    pinned: set = field(default_factory=set)  # slices that must stay: live across a barrier

    def add(self, node: GOp) -> GOp:
        self.nodes.append(node)
        return node

    def copy(self) -> Graph:
        nodes = [
            dataclasses.replace(
                n, inputs=list(n.inputs), outputs=list(n.outputs), attrs=dict(n.attrs)
            )
            for n in self.nodes
        ]
        return Graph(self.parallel, nodes, dict(self.params), set(self.pinned))

    # ------------------------------------------------------------------ structure
    def producer(self, s: MemSlice) -> GOp | None:
        for n in self.nodes:
            if s in n.outputs:
                return n
        return None

    def consumers(self, s: MemSlice) -> list[GOp]:
        return [n for n in self.nodes if s in n.inputs]

    def successors(self, node: GOp) -> list[GOp]:
        return [n for n in self.nodes if any(o in n.inputs for o in node.outputs)]

    def replace_input(self, old: MemSlice, new: MemSlice) -> None:
        for n in self.nodes:
            n.inputs = [new if s == old else s for s in n.inputs]

    def remove(self, node: GOp) -> None:
        self.nodes = [n for n in self.nodes if n is not node]

    def slices(self) -> set[MemSlice]:
        out: set[MemSlice] = set()
        for n in self.nodes:
            out.update(n.inputs)
            out.update(n.outputs)
        return out

    def tensor_hierarchies(self) -> dict[str, Hierarchy]:
        """For each tensor still in the graph, the lowest hierarchy one of its slices is on."""
        found: dict[str, Hierarchy] = {}
        for s in self.slices():
            found[s.tensor] = min(found.get(s.tensor, Hierarchy.REG), s.hierarchy)
        return found

    def count(self, kind: Kind, scope: Scope | None = None) -> int:
        return sum(1 for n in self.nodes if n.kind is kind and (scope is None or n.scope is scope))

    def check(self) -> None:
        """Every input is produced before it is read or is a kernel input (a GLOBAL slice)."""
        seen: set[MemSlice] = set()
        for n in self.nodes:
            for s in n.inputs:
                if s not in seen and s.hierarchy is not Hierarchy.GLOBAL:
                    raise ValueError(f"GIR: {n} reads {s} before it is produced")
            seen.update(n.outputs)

    def __repr__(self) -> str:
        return "\n".join(repr(n) for n in self.nodes)
