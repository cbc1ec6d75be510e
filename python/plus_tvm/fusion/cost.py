"""The fusion cost model of paper 004, equations 6-8.

- eq. 6, memory: the bytes that still cross group boundaries, i.e. the weights of the edges
  whose ends lie in different groups (inside a group a tensor stays in registers / cache);
- eq. 7, parallel balance: the variance of the number of operators per group;
- eq. 8: ``alpha * memory + beta * balance``. The two terms have different units; ``alpha``
  defaults to 1 / (all edge bytes) so the memory term is the fraction of traffic left.

An assignment maps each node to a group id (``-1``: the node stays alone). Another plan cost
(``PlanCost``: the learned model's predicted time, ``plus_tvm.costmodel.LearnedFusionCost``)
can replace eq. 8 in the search.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from .graph import FusionGraph

#: a plan's cost from its graph and assignment (lower is better)
PlanCost = Callable[[FusionGraph, Sequence[int]], float]


def group_ids(assignment: Sequence[int]) -> list[int]:
    """Group ids with every unfused node (-1) given a group of its own."""
    top = max(assignment, default=-1) + 1
    return [a if a >= 0 else top + i for i, a in enumerate(assignment)]


def memory_cost(graph: FusionGraph, assignment: Sequence[int]) -> float:
    """Eq. 6: the total weight of edges between different groups."""
    ids = group_ids(assignment)
    return float(sum(e.weight for e in graph.all_edges() if ids[e.src] != ids[e.dst]))


def balance_cost(assignment: Sequence[int]) -> float:
    """Eq. 7: the variance of group sizes (operators per group)."""
    sizes = list(Counter(group_ids(assignment)).values())
    if not sizes:
        return 0.0
    mean = sum(sizes) / len(sizes)
    return sum((s - mean) ** 2 for s in sizes) / len(sizes)


def fused_cost(
    graph: FusionGraph, assignment: Sequence[int], alpha: float | None = None, beta: float = 0.0
) -> float:
    """Eq. 8: ``alpha * memory_cost + beta * balance_cost``.

    ``alpha=None`` normalises the memory term by the graph's total edge weight.
    """
    if alpha is None:
        total = sum(e.weight for e in graph.all_edges())
        alpha = 1.0 / total if total else 0.0
    return alpha * memory_cost(graph, assignment) + beta * balance_cost(assignment)


def eq8(alpha: float | None = None, beta: float = 0.0) -> PlanCost:
    """Eq. 8 with these weights as a :data:`PlanCost`."""

    def cost(graph: FusionGraph, assignment: Sequence[int]) -> float:
        return fused_cost(graph, assignment, alpha, beta)

    return cost
