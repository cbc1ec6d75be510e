"""Fusion-plan search of paper 004 (algorithm 2), its greedy ablation, and the second round.

``dp`` follows algorithm 2 with the paper's pruning: for each start node it fixes that node's
longest candidate as the first group, fills the remaining nodes with ``Other_Fuse_Search``
(longest still-available candidate, scanning cyclically from a random index so that low
indices are not always preferred), runs the second-round fusion (``Group_Fuse_Second``: groups
whose classes table 1 lets fuse are merged), scores the plan with the cost model (eq. 8) and
keeps the cheapest. Start nodes are tried in order of their longest candidate, at most
``max_starts`` of them; the random scan is seeded, so the result is deterministic.

``greedy`` is the ablation baseline: one scan in program order taking each node's longest
available candidate, then the second round.

Every group is convex and the groups form a DAG, so each can be outlined as one kernel.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..mapping import MapPattern
from .candidates import Candidate, build_candidates
from .cost import PlanCost, eq8
from .graph import FusionGraph


@dataclass
class Plan:
    """A fusion plan: ``assignment[node]`` is the node's group id (every node has one)."""

    assignment: list[int]
    patterns: dict[int, MapPattern]
    cost: float = 0.0
    plans_tried: int = 0
    search_s: float = 0.0
    rejected: list[str] = field(default_factory=list)

    def groups(self) -> list[list[int]]:
        """Members of each group, groups ordered by their first member."""
        by_id: dict[int, list[int]] = {}
        for node, gid in enumerate(self.assignment):
            by_id.setdefault(gid, []).append(node)
        return sorted(by_id.values(), key=lambda g: g[0])


class _State:
    """A partial plan with the checks that keep every group convex and the plan acyclic."""

    def __init__(self, graph: FusionGraph, max_group_size: int) -> None:
        self.graph = graph
        self.max_group_size = max_group_size
        self.fused = [-1] * len(graph)
        self.members: dict[int, list[int]] = {}
        self.pattern: dict[int, MapPattern] = {}
        self.next_id = 0

    def free(self, nodes: Sequence[int]) -> bool:
        return all(self.fused[n] < 0 for n in nodes)

    def creates_cycle(self, nodes: set[int]) -> bool:
        """Would making ``nodes`` one group close a cycle through other nodes or groups?"""
        frontier = [s for n in nodes for s in self.graph.succ[n] if s not in nodes]
        seen: set[int] = set()
        while frontier:
            x = frontier.pop()
            if x in seen:
                continue
            seen.add(x)
            gid = self.fused[x]
            group = self.members[gid] if gid >= 0 else [x]
            for m in group:
                if m in nodes:
                    return True
                seen.add(m)
                for s in self.graph.succ[m]:
                    if s in nodes:
                        return True
                    if s not in seen:
                        frontier.append(s)
        return False

    def add(self, cand: Candidate) -> bool:
        nodes = set(cand.nodes)
        if not self.free(cand.nodes):
            return False
        if len(nodes) > 1 and self.creates_cycle(nodes):
            return False
        gid = self.next_id
        self.next_id += 1
        for n in cand.nodes:
            self.fused[n] = gid
        self.members[gid] = sorted(nodes)
        self.pattern[gid] = cand.pattern
        return True

    def add_single(self, node: int) -> None:
        self.add(Candidate((node,), self.graph.patterns[node]))

    def second_round(self) -> None:
        """Merge groups joined by an edge while table 1 allows it (``Group_Fuse_Second``)."""
        graph = self.graph
        changed = True
        while changed:
            changed = False
            for e in sorted(graph.all_edges(), key=lambda e: (e.src, e.dst)):
                a, b = self.fused[e.src], self.fused[e.dst]
                if a == b:
                    continue
                size = len(self.members[a]) + len(self.members[b])
                if size > self.max_group_size:
                    continue
                contiguous = any(
                    graph.edge(s, d).dst_needs_contiguous
                    for s in self.members[a]
                    for d in graph.succ[s]
                    if self.fused[d] == b
                )
                decision = graph.rule(self.pattern[a], self.pattern[b], contiguous)
                if not decision.ok:
                    continue
                merged = set(self.members[a]) | set(self.members[b])
                if self.creates_cycle(merged):
                    continue
                for n in self.members[b]:
                    self.fused[n] = a
                self.members[a] = sorted(merged)
                self.pattern[a] = decision.fused
                del self.members[b], self.pattern[b]
                changed = True

    def plan(self, cost: float) -> Plan:
        # renumber groups by first member so equal plans compare equal
        order = {
            gid: k for k, gid in enumerate(sorted(self.members, key=lambda g: self.members[g][0]))
        }
        return Plan(
            [order[g] for g in self.fused],
            {order[g]: p for g, p in self.pattern.items()},
            cost,
        )


def _fill(state: _State, table: list[list[Candidate]], order: Sequence[int]) -> None:
    """Give every unfused node (in ``order``) its longest still-available candidate."""
    for node in order:
        if state.fused[node] >= 0:
            continue
        for cand in table[node]:
            if len(cand) <= state.max_group_size and state.add(cand):
                break
        else:  # pragma: no cover - the singleton always fits
            state.add_single(node)


def greedy_plan(
    graph: FusionGraph,
    table: list[list[Candidate]] | None = None,
    max_group_size: int = 64,
    alpha: float | None = None,
    beta: float = 0.0,
    cost: PlanCost | None = None,
) -> Plan:
    """One program-order scan taking each node's longest candidate, then the second round
    (scored by ``cost``, default eq. 8 with ``alpha`` and ``beta``)."""
    start = time.perf_counter()
    cost = cost or eq8(alpha, beta)
    table = table if table is not None else build_candidates(graph, max_group_size)
    state = _State(graph, max_group_size)
    _fill(state, table, range(len(graph)))
    state.second_round()
    plan = state.plan(cost(graph, state.fused))
    plan.plans_tried = 1
    plan.search_s = time.perf_counter() - start
    return plan


def dp_plan(
    graph: FusionGraph,
    table: list[list[Candidate]] | None = None,
    max_group_size: int = 64,
    alpha: float | None = None,
    beta: float = 0.0,
    seed: int = 0,
    max_starts: int = 32,
    cost: PlanCost | None = None,
) -> Plan:
    """Algorithm 2: try first groups from up to ``max_starts`` start nodes, keep the cheapest
    by ``cost`` (default eq. 8 with ``alpha`` and ``beta``)."""
    start_time = time.perf_counter()
    cost = cost or eq8(alpha, beta)
    table = table if table is not None else build_candidates(graph, max_group_size)
    n = len(graph)
    rng = random.Random(seed)
    best = greedy_plan(graph, table, max_group_size, cost=cost)
    tried = 1
    fusible = [v for v in range(n) if graph.fusible(graph.patterns[v])]
    fusible.sort(key=lambda v: (-len(table[v][0]), v))
    for start in fusible[:max_starts]:
        state = _State(graph, max_group_size)
        first = next((c for c in table[start] if len(c) <= max_group_size), None)
        if first is None or not state.add(first):
            continue
        offset = rng.randrange(n) if n else 0
        _fill(state, table, [(offset + k) % n for k in range(n)])
        state.second_round()
        value = cost(graph, state.fused)
        tried += 1
        if value < best.cost - 1e-12:
            best = state.plan(value)
    best.plans_tried = tried
    best.search_s = time.perf_counter() - start_time
    return best


def split_groups(graph: FusionGraph, plan: Plan, cost: PlanCost, max_rounds: int = 64) -> Plan:
    """``plan`` with groups cut in two where ``cost`` prices the two kernels below the one.

    Algorithm 2 only assembles maximal groups; a cost that can prefer two kernels to one (the
    learned model's predicted time, where a fused kernel schedules worse than its halves)
    needs this step, while eq. 8 never does (a cut only adds crossing bytes). A group is cut
    between two of its members in program order, both halves convex and the plan acyclic;
    the cut that lowers the cost most is taken, until none lowers it."""
    assignment = list(plan.assignment)
    patterns = dict(plan.patterns)
    best = cost(graph, assignment)
    for _ in range(max_rounds):
        groups: dict[int, list[int]] = {}
        for node, gid in enumerate(assignment):
            groups.setdefault(gid, []).append(node)
        fresh = max(groups, default=-1) + 1
        choice = None
        for gid, members in groups.items():
            for k in range(1, len(members)):
                head, tail = members[:k], members[k:]
                if not (graph.is_convex(head) and graph.is_convex(tail)):
                    continue
                trial = list(assignment)
                for node in tail:
                    trial[node] = fresh
                if not graph.plan_is_acyclic(trial):
                    continue
                value = cost(graph, trial)
                if value < best - 1e-9 and (choice is None or value < choice[0]):
                    choice = (value, trial, gid, head, tail)
        if choice is None:
            break
        best, assignment, gid, head, tail = choice
        patterns[gid], patterns[fresh] = _group_pattern(graph, head), _group_pattern(graph, tail)
    order = {gid: k for k, gid in enumerate(dict.fromkeys(assignment))}
    return Plan(
        [order[g] for g in assignment],
        {order[g]: p for g, p in patterns.items() if g in order},
        best,
        plan.plans_tried,
        plan.search_s,
        plan.rejected,
    )


def _group_pattern(graph: FusionGraph, members: Sequence[int]) -> MapPattern:
    """The class of a group, table 1 folded over its members in program order."""
    pattern = graph.patterns[members[0]]
    inside = set(members)
    for node in members[1:]:
        preds = [p for p in graph.pred[node] if p in inside]
        decision = (
            graph.judge(pattern, preds[0], node)
            if preds
            else graph.rule(pattern, graph.patterns[node], False)
        )
        if decision.ok:
            pattern = decision.fused
    return pattern
