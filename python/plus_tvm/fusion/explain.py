"""Why a plan keeps two kernels apart: one line per dependence that crosses groups.

For each edge ``a -> b`` whose ends are in different groups of a plan, the first reason that
applies: table 1 rejects the two groups' classes (the rule is named), the merged group would
exceed the size limit, merging would break convexity (a path leaves and re-enters), or the rules
allow it but the cost model chose a cheaper plan (eq. 8; or the learned model, whose predicted
times of the two kernels apart and merged the line then gives).
"""

from __future__ import annotations

from collections.abc import Callable

from .graph import FusionGraph
from .search import Plan


def explain_plan(
    graph: FusionGraph,
    plan: Plan,
    max_group_size: int,
    group_us: Callable[[tuple[int, ...]], float] | None = None,
) -> list[str]:
    """One ``"producer -> consumer: reason"`` line per edge the plan does not fuse;
    ``group_us``: the learned cost's predicted microseconds of a group's kernel."""
    groups = {gid: [] for gid in set(plan.assignment)}
    for node, gid in enumerate(plan.assignment):
        groups[gid].append(node)
    lines = []
    for e in sorted(graph.all_edges(), key=lambda e: (e.src, e.dst)):
        a, b = plan.assignment[e.src], plan.assignment[e.dst]
        if a == b:
            continue
        decision = graph.rule(plan.patterns[a], plan.patterns[b], e.dst_needs_contiguous)
        if not decision.ok:
            reason = f"rule: {decision.rule}"
        elif len(groups[a]) + len(groups[b]) > max_group_size:
            reason = f"size: the merged group would exceed {max_group_size} kernels"
        elif not graph.is_convex(groups[a] + groups[b]):
            reason = "convexity: another path leaves the group and comes back"
        elif group_us is not None:
            apart = group_us(tuple(groups[a])) + group_us(tuple(groups[b]))
            merged = group_us(tuple(sorted(groups[a] + groups[b])))
            reason = (
                f"cost: {decision.rule} allows it, but the chosen plan is predicted faster "
                f"({apart:.1f} us apart, {merged:.1f} us merged)"
            )
        else:
            reason = f"cost: {decision.rule} allows it, but the chosen plan has a lower eq. 8 cost"
        src, dst = graph.names[e.src], graph.names[e.dst]
        lines.append(
            f"{src}#{e.src} ({plan.patterns[a].name}) -> {dst}#{e.dst} "
            f"({plan.patterns[b].name}): {reason}"
        )
    return lines
