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
from .features import TIR_FEATURES, _log
from .learned import LearnedCostModel


def _amount(vector: Mapping[str, float], name: str) -> float:
    """A ``log2(1 + x)`` magnitude back as ``x``."""
    return 2.0 ** vector[name] - 1.0


def fused_features(
    members: Sequence[Mapping[str, float]], read_inside: float, kept_inside: float
) -> dict[str, float]:
    """The TIR vector of the kernel that fuses ``members`` (in program order): ``read_inside``
    bytes of their inputs come from other members, and ``kept_inside`` bytes of their outputs
    are read only inside the group (intermediates of the fused kernel)."""

    def total(name: str) -> float:
        return sum(_amount(m, name) for m in members)

    flops = total("flops")
    bytes_in = max(total("bytes_in") - read_inside, 0.0)
    bytes_out = max(total("bytes_out") - kept_inside, 0.0)
    values = {
        "flops": _log(flops),
        "transcendental": _log(total("transcendental")),
        "points": _log(total("points")),
        "bytes_in": _log(bytes_in),
        "bytes_out": _log(bytes_out),
        "bytes_local": _log(total("bytes_local") + kept_inside),
        "blocks": sum(m["blocks"] for m in members),
        "reduction_blocks": sum(m["reduction_blocks"] for m in members),
        "reduce_extent": max(m["reduce_extent"] for m in members),
        "spatial_extent": max(m["spatial_extent"] for m in members),
        "inner_extent": members[-1]["inner_extent"],
        "reduction": max(m["reduction"] for m in members),
        "gather": max(m["gather"] for m in members),
        "intensity": flops / max(bytes_in + bytes_out, 1.0),
        "gir": members[0]["gir"],
        "lanes": members[0]["lanes"],
        "threads": members[0]["threads"],
    }
    return {name: values[name] for name in TIR_FEATURES}


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
                    kept_inside += _amount(self.vectors[v], "bytes_out")
            vector = fused_features([self.vectors[v] for v in kernels], read_inside, kept_inside)
            us = self.model.predict_tir_us([vector])[0]
        self._groups[nodes] = us
        return us
