"""The computation graph that fusion-plan search works on (paper 004, section 3, step 1).

Nodes are kernels of one dataflow block in program (topological) order, each with its mapping
class; edges carry the byte size of the tensor they move (the dependence weights of eq. 6) and
whether the consumer streams that input along its contiguous axis (supplement 1's condition).
The graph is plain data so the search algorithms can be tested without building IR.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from ..mapping import FuseDecision, MapPattern, fuse_rule

Rule = Callable[[int, int, bool], FuseDecision]


def _mapping_fusible(pattern: int) -> bool:
    return MapPattern(pattern) != MapPattern.NotFuse


@dataclass(frozen=True)
class Edge:
    """A tensor from ``src`` to ``dst``: its size in bytes and supplement 1's condition."""

    src: int
    dst: int
    weight: float
    dst_needs_contiguous: bool = False


@dataclass
class FusionGraph:
    """Kernels (nodes ``0..n-1``, topologically ordered) and the tensors between them.

    Parameters
    ----------
    patterns : sequence of MapPattern
        Mapping class of each node.
    edges : iterable of Edge
        Data dependences; ``src < dst`` for every edge.
    names : sequence of str, optional
        Node names for explanations.
    rule, fusible : callable, optional
        The fusion rule (default: table 1 over mapping classes) and which classes may fuse at
        all; the ablation passes TVM's op-pattern rules instead.
    """

    patterns: list[MapPattern]
    edges: list[Edge]
    names: list[str] = field(default_factory=list)
    rule: Rule = fuse_rule
    fusible: Callable[[int], bool] = _mapping_fusible

    def __post_init__(self) -> None:
        if self.rule is fuse_rule:
            self.patterns = [MapPattern(p) for p in self.patterns]
        n = len(self.patterns)
        if not self.names:
            self.names = [f"n{i}" for i in range(n)]
        self.succ: list[list[int]] = [[] for _ in range(n)]
        self.pred: list[list[int]] = [[] for _ in range(n)]
        self._edge: dict[tuple[int, int], Edge] = {}
        for e in self.edges:
            if not 0 <= e.src < e.dst < n:
                raise ValueError(f"edge {e.src}->{e.dst} is not forward in a graph of {n} nodes")
            if (e.src, e.dst) in self._edge:
                # two uses of one tensor by one consumer: one dependence, contiguous if either is
                old = self._edge[(e.src, e.dst)]
                contiguous = old.dst_needs_contiguous or e.dst_needs_contiguous
                e = Edge(e.src, e.dst, old.weight, contiguous)
            else:
                self.succ[e.src].append(e.dst)
                self.pred[e.dst].append(e.src)
            self._edge[(e.src, e.dst)] = e

    def __len__(self) -> int:
        return len(self.patterns)

    def edge(self, src: int, dst: int) -> Edge:
        return self._edge[(src, dst)]

    def all_edges(self) -> Iterable[Edge]:
        return self._edge.values()

    # ------------------------------------------------------------------------------ queries
    def judge(self, group_pattern: MapPattern, src: int, dst: int) -> FuseDecision:
        """Table 1 for extending a group of class ``group_pattern`` along edge ``src -> dst``."""
        contiguous = self.edge(src, dst).dst_needs_contiguous
        return self.rule(group_pattern, self.patterns[dst], contiguous)

    def is_convex(self, group: Iterable[int]) -> bool:
        """No path leaves ``group`` and comes back into it (so it can become one kernel)."""
        members = set(group)
        if not members:
            return True
        last = max(members)
        frontier = [s for m in members for s in self.succ[m] if s not in members and s < last]
        seen: set[int] = set()
        while frontier:
            node = frontier.pop()
            if node in seen:
                continue
            seen.add(node)
            for s in self.succ[node]:
                if s in members:
                    return False
                if s < last and s not in seen:
                    frontier.append(s)
        return True

    def plan_is_acyclic(self, assignment: Sequence[int]) -> bool:
        """Whether groups (``assignment[node]`` = group id, -1 = alone) form a DAG.

        Each group convex is not enough: two convex groups can still depend on each other both
        ways. Kahn's algorithm on the condensed graph.
        """
        ids = [a if a >= 0 else -(i + 1) - len(self) for i, a in enumerate(assignment)]
        succ: dict[int, set[int]] = {g: set() for g in ids}
        indeg: dict[int, int] = dict.fromkeys(ids, 0)
        for e in self.all_edges():
            a, b = ids[e.src], ids[e.dst]
            if a != b and b not in succ[a]:
                succ[a].add(b)
                indeg[b] += 1
        ready = [g for g, d in indeg.items() if d == 0]
        seen = 0
        while ready:
            g = ready.pop()
            seen += 1
            for h in succ[g]:
                indeg[h] -= 1
                if indeg[h] == 0:
                    ready.append(h)
        return seen == len(indeg)
