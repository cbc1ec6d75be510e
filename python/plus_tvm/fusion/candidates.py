"""Algorithm 1 of paper 004: longest fusible paths and their prefixes (the candidate set R).

From every node, a depth-first walk follows successor edges while table 1 allows the growing
group (of the accumulated, most complex class) to absorb the next node and the path stays convex;
a path that cannot grow is recorded. Every prefix of a recorded path is a fusion candidate of its
first node. Bounds keep the walk linear in practice: paths no longer than ``max_group_size``, at
most ``max_paths`` recorded paths per start node.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..mapping import MapPattern
from .graph import FusionGraph


@dataclass(frozen=True)
class Candidate:
    """A fusible path (nodes in path order) and the class of the group it would form."""

    nodes: tuple[int, ...]
    pattern: MapPattern

    def __len__(self) -> int:
        return len(self.nodes)


def longest_paths(
    graph: FusionGraph, start: int, max_group_size: int = 64, max_paths: int = 16
) -> list[Candidate]:
    """The maximal fusible paths that start at ``start`` (``DFS`` of algorithm 1)."""
    first = graph.patterns[start]
    if not graph.fusible(first):
        return [Candidate((start,), first)]
    found: list[Candidate] = []

    def dfs(path: tuple[int, ...], pattern: MapPattern) -> None:
        grew = False
        if len(path) < max_group_size:
            for nxt in graph.succ[path[-1]]:
                if len(found) >= max_paths:
                    return
                decision = graph.judge(pattern, path[-1], nxt)
                if not decision.ok:
                    continue
                longer = path + (nxt,)
                if not graph.is_convex(longer):
                    continue
                grew = True
                dfs(longer, decision.fused)
        if not grew and len(found) < max_paths:
            found.append(Candidate(path, pattern))

    dfs((start,), first)
    return found


def build_candidates(
    graph: FusionGraph, max_group_size: int = 64, max_paths: int = 16
) -> list[list[Candidate]]:
    """The candidate set R per start node: every prefix of its longest paths, longest first.

    Returns
    -------
    list of list of Candidate
        ``R[node]``: candidates beginning at ``node``, sorted by length (descending), then by
        node ids, without duplicates; the singleton ``(node,)`` is always last.
    """
    table: list[list[Candidate]] = []
    for start in range(len(graph)):
        prefixes: dict[tuple[int, ...], MapPattern] = {}
        for cand in longest_paths(graph, start, max_group_size, max_paths):
            pattern = graph.patterns[start]
            for k in range(1, len(cand.nodes) + 1):
                nodes = cand.nodes[:k]
                if k > 1:
                    pattern = graph.judge(pattern, nodes[-2], nodes[-1]).fused
                prefixes.setdefault(nodes, pattern)
        ordered = sorted(prefixes.items(), key=lambda kv: (-len(kv[0]), kv[0]))
        table.append([Candidate(nodes, pattern) for nodes, pattern in ordered])
    return table
