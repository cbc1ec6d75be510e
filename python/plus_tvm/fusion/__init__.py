"""Fusion-plan search of paper 004 (section 3.3): graph, candidates, cost model, search.

The rules it applies are the mapping classes of :mod:`plus_tvm.mapping` (section 3.1); the pass
that runs it is ``plus_tvm.passes.DPFuseOps``.
"""

from .candidates import Candidate, build_candidates, longest_paths
from .cost import PlanCost, balance_cost, eq8, fused_cost, memory_cost
from .explain import explain_plan
from .graph import Edge, FusionGraph
from .search import Plan, dp_plan, greedy_plan, split_groups
from .tvm_rules import OpPattern, tvm_fusible, tvm_rule

__all__ = [
    "Candidate",
    "Edge",
    "FusionGraph",
    "OpPattern",
    "PlanCost",
    "Plan",
    "balance_cost",
    "build_candidates",
    "dp_plan",
    "eq8",
    "explain_plan",
    "fused_cost",
    "greedy_plan",
    "longest_paths",
    "memory_cost",
    "split_groups",
    "tvm_fusible",
    "tvm_rule",
]
