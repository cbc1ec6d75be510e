"""A fusion plan priced in predicted microseconds (``Options.fusion_cost="learned"``).

Eq. 6-8 of paper 004 count the bytes that cross group boundaries; here every group is priced
by the learned TIR regressor (:meth:`LearnedCostModel.predict_tir_us`) on the vector its fused
kernel would have, built from its members' vectors (each kernel legalized alone,
:func:`.features.tir_features`) as ``FuseTIR`` builds the kernel: work and blocks summed, the
tensors that stay inside the group no longer read or written as parameters but allocated
between its blocks, the other sizes the largest of the members'. A plan costs the sum over its
groups; a kernel that stays alone costs its own prediction. Nodes that are no TIR kernel
(library calls, projections) cost nothing: every plan keeps them alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..fusion.cost import group_ids
from ..fusion.graph import FusionGraph
from .features import amount, fused_features
from .learned import LearnedCostModel


class LearnedFusionCost:
    """The plan cost of :func:`plus_tvm.fusion.dp_plan` in predicted microseconds.

    Parameters
    ----------
    model : LearnedCostModel
        A model with a TIR regressor.
    vectors : sequence of dict or None
        Each node's TIR vector; None for nodes that are no TIR kernel.
    """

    def __init__(self, model: LearnedCostModel, vectors: Sequence[Mapping[str, float] | None]):
        if not model.has("tir"):
            raise ValueError("LearnedFusionCost: the cost model has no TIR regressor")
        self.model = model
        self.vectors = list(vectors)
        self._groups: dict[tuple[int, ...], float] = {}

    def __call__(self, graph: FusionGraph, assignment: Sequence[int]) -> float:
        ids = group_ids(assignment)
        groups: dict[int, list[int]] = {}
        for node, gid in enumerate(ids):
            groups.setdefault(gid, []).append(node)
        return sum(self.group_us(graph, tuple(nodes)) for nodes in groups.values())

    def group_us(self, graph: FusionGraph, nodes: tuple[int, ...]) -> float:
        """Predicted microseconds of the kernel made of ``nodes`` (cached)."""
        cached = self._groups.get(nodes)
        if cached is not None:
            return cached
        kernels = [v for v in nodes if self.vectors[v] is not None]
        if not kernels:
            us = 0.0
        elif len(kernels) == 1:
            us = self.model.predict_tir_us([self.vectors[kernels[0]]])[0]
        else:
            inside = set(nodes)
            read_inside = kept_inside = 0.0
            for e in graph.all_edges():
                if e.src in inside and e.dst in inside:
                    read_inside += e.weight
            for v in kernels:
                users = graph.succ[v]
                if users and all(u in inside for u in users):
                    kept_inside += amount(self.vectors[v], "bytes_out")
            vector = fused_features([self.vectors[v] for v in kernels], read_inside, kept_inside)
            us = self.model.predict_tir_us([vector])[0]
        self._groups[nodes] = us
        return us
