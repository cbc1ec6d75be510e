"""Fusion-plan search of paper 004: algorithm 1 candidates, eq. 6-8 cost, algorithm 2 plans."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st
from plus_tvm.fusion import (
    Edge,
    FusionGraph,
    OpPattern,
    balance_cost,
    build_candidates,
    dp_plan,
    fused_cost,
    greedy_plan,
    longest_paths,
    memory_cost,
    tvm_rule,
)
from plus_tvm.mapping import MapPattern

M = MapPattern


def chain(*patterns: MapPattern, weight: float = 4.0) -> FusionGraph:
    edges = [Edge(i, i + 1, weight) for i in range(len(patterns) - 1)]
    return FusionGraph(list(patterns), edges)


# ------------------------------------------------------------------------------ algorithm 1
def test_matmul_reshape_transpose_add_is_one_candidate():
    g = chain(M.ManyToMany, M.Reorganize, M.Shuffle, M.OneToOne)
    (path,) = longest_paths(g, 0)
    assert path.nodes == (0, 1, 2, 3) and path.pattern == M.ManyToMany
    table = build_candidates(g)
    assert [c.nodes for c in table[0]] == [(0, 1, 2, 3), (0, 1, 2), (0, 1), (0,)]
    plan = dp_plan(g)
    assert plan.groups() == [[0, 1, 2, 3]]


def test_paths_stop_where_table_1_says_no():
    # matmul -> matmul: ManyToMany + ManyToMany never fuses
    assert [c.nodes for c in longest_paths(chain(M.ManyToMany, M.ManyToMany), 0)] == [(0,)]
    # broadcast -> matmul: OneToMany before ManyToMany breaks contiguous reads
    assert [c.nodes for c in longest_paths(chain(M.OneToMany, M.ManyToMany), 0)] == [(0,)]
    # the elementwise epilogue of a reduction fuses, a second reduction after it does not
    g = chain(M.ManyToMany, M.OneToOne, M.ManyToMany)
    assert [c.nodes for c in longest_paths(g, 0)] == [(0, 1)]
    assert greedy_plan(g).groups() == [[0, 1], [2]]


def test_notfuse_nodes_stay_alone():
    g = chain(M.OneToOne, M.NotFuse, M.OneToOne)
    assert dp_plan(g).groups() == [[0], [1], [2]]


def test_supplement_1_condition_comes_from_the_edge():
    contiguous = FusionGraph([M.Shuffle, M.ManyToMany], [Edge(0, 1, 4.0, True)])
    strided_ok = FusionGraph([M.Shuffle, M.ManyToMany], [Edge(0, 1, 4.0, False)])
    assert greedy_plan(contiguous).groups() == [[0], [1]]
    assert greedy_plan(strided_ok).groups() == [[0, 1]]


def test_branches_give_one_path_each_and_groups_stay_convex():
    # 0 -> 1 -> 3 and 0 -> 2 -> 3, with node 2 not fusible: {0, 1, 3} would not be convex
    g = FusionGraph(
        [M.OneToOne, M.OneToOne, M.NotFuse, M.OneToOne],
        [Edge(0, 1, 1), Edge(0, 2, 1), Edge(1, 3, 1), Edge(2, 3, 1)],
    )
    paths = {c.nodes for c in longest_paths(g, 0)}
    assert paths == {(0, 1)}  # (0, 1, 3) is rejected as not convex; 2 is NotFuse
    for plan in (greedy_plan(g), dp_plan(g)):
        for group in plan.groups():
            assert g.is_convex(group)
        assert g.plan_is_acyclic(plan.assignment)


# ------------------------------------------------------------------------------- eq. 6 - 8
def test_cost_model_terms():
    g = chain(M.OneToOne, M.OneToOne, M.OneToOne, weight=10.0)
    alone = [-1, -1, -1]
    together = [0, 0, 0]
    split = [0, 0, 1]
    assert memory_cost(g, alone) == 20.0
    assert memory_cost(g, together) == 0.0
    assert memory_cost(g, split) == 10.0
    assert balance_cost(together) == 0.0
    assert balance_cost(split) == 0.25  # sizes 2 and 1
    assert fused_cost(g, split) == 0.5  # alpha defaults to 1 / total edge bytes
    assert fused_cost(g, split, alpha=1.0, beta=2.0) == 10.5


def test_dp_is_never_worse_than_greedy_and_deterministic():
    g = _transformer_like(layers=3)
    greedy = greedy_plan(g)
    dp1, dp2 = dp_plan(g, seed=7), dp_plan(g, seed=7)
    assert dp1.cost <= greedy.cost + 1e-12
    assert dp1.assignment == dp2.assignment
    assert dp1.plans_tried > 1


def test_max_group_size_is_respected():
    g = chain(*([M.OneToOne] * 10))
    plan = dp_plan(g, max_group_size=3)
    assert max(len(grp) for grp in plan.groups()) <= 3
    assert len(plan.groups()) == 4


# --------------------------------------------------------------------------- random graphs
PATTERNS = st.sampled_from(list(M))


@st.composite
def random_graphs(draw):
    n = draw(st.integers(2, 14))
    patterns = draw(st.lists(PATTERNS, min_size=n, max_size=n))
    edges = []
    for dst in range(1, n):
        srcs = draw(st.lists(st.integers(0, dst - 1), min_size=1, max_size=3, unique=True))
        for src in srcs:
            edges.append(Edge(src, dst, float(draw(st.integers(1, 64))), draw(st.booleans())))
    return FusionGraph(patterns, edges)


def _check_plan(g: FusionGraph, plan, max_group_size: int) -> None:
    assert len(plan.assignment) == len(g)
    assert g.plan_is_acyclic(plan.assignment)
    for group in plan.groups():
        assert g.is_convex(group), group
        assert len(group) <= max_group_size
        kinds = [g.patterns[v] for v in group]
        if len(group) > 1:
            assert M.NotFuse not in kinds, group
        assert kinds.count(M.ManyToMany) <= 1, group  # ManyToMany + ManyToMany never fuses


@settings(max_examples=150, deadline=None)
@given(random_graphs(), st.integers(2, 6))
def test_random_graphs_give_convex_acyclic_rule_respecting_plans(g, max_group_size):
    greedy = greedy_plan(g, max_group_size=max_group_size)
    dp = dp_plan(g, max_group_size=max_group_size, seed=1)
    _check_plan(g, greedy, max_group_size)
    _check_plan(g, dp, max_group_size)
    assert dp.cost <= greedy.cost + 1e-12


# ----------------------------------------------------------------------------- search time
def _transformer_like(layers: int) -> FusionGraph:
    """A BERT-like layer sequence: matmul+bias, reshape/transpose, attention, norms, GELU."""
    layer = [
        M.ManyToMany,
        M.OneToOne,
        M.Reorganize,
        M.Shuffle,  # q projection
        M.ManyToMany,
        M.OneToOne,
        M.Reorganize,
        M.Shuffle,  # k projection
        M.ManyToMany,
        M.OneToMany,
        M.ManyToMany,  # scores, mask, softmax
        M.ManyToMany,
        M.Shuffle,
        M.Reorganize,  # context
        M.ManyToMany,
        M.OneToOne,
        M.OneToOne,
        M.ManyToMany,  # out proj, residual, norm
        M.ManyToMany,
        M.OneToOne,
        M.OneToOne,  # ffn1 + gelu
        M.ManyToMany,
        M.OneToOne,
        M.OneToOne,
        M.ManyToMany,
    ]  # ffn2, residual, norm
    patterns: list[MapPattern] = []
    edges: list[Edge] = []
    for _ in range(layers):
        base = len(patterns)
        patterns += layer
        edges += [Edge(base + i, base + i + 1, 4096.0) for i in range(len(layer) - 1)]
        if base:
            edges.append(Edge(base - 1, base, 4096.0))  # previous layer's output feeds q
            edges.append(Edge(base - 1, base + 16, 4096.0))  # ... and the residual
    return FusionGraph(patterns, edges)


def test_search_time_on_a_model_sized_graph():
    g = _transformer_like(layers=40)  # 1000 kernels: larger than BERT-base after legalization
    start = time.perf_counter()
    plan = dp_plan(g)
    elapsed = time.perf_counter() - start
    _check_plan(g, plan, 64)
    assert len(plan.groups()) < len(g) / 2
    assert elapsed < 5.0, f"plan search took {elapsed:.1f} s"


def test_tvm_rules_follow_fuseops_patterns():
    P = OpPattern  # noqa: N806
    assert tvm_rule(P.ElemWise, P.Injective).fused == P.Injective
    assert tvm_rule(P.OutEWiseFusable, P.Broadcast).fused == P.OutEWiseFusable
    assert tvm_rule(P.Injective, P.CommReduce).fused == P.CommReduce
    assert not tvm_rule(P.OutEWiseFusable, P.Injective).ok  # matmul then reshape
    assert not tvm_rule(P.CommReduce, P.ElemWise).ok
    assert not tvm_rule(P.Opaque, P.ElemWise).ok
    g = FusionGraph(
        [P.OutEWiseFusable, P.Injective, P.Injective, P.ElemWise],
        [Edge(i, i + 1, 4.0) for i in range(3)],
        rule=tvm_rule,
        fusible=lambda p: p not in (P.Opaque, P.Tuple),
    )
    assert dp_plan(g).groups() == [[0], [1, 2, 3]]
