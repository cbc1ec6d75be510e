"""GIR: PowerFusion's instruction-level graph IR for memory-intensive kernels (paper 002).

``analysis`` splits a fused PrimFunc into basic operators, ``generate`` instantiates and merges
per-operator GIR templates, ``rewrite`` applies the rewrite rules (algorithm 1), ``model``
estimates a graph's time from measured machine figures and ``search`` picks the best graph.
The rules of ``plus_tvm.schedules`` lower the chosen graph to a TensorIR schedule. The basic
operators are read off the shared block analysis (:mod:`plus_tvm.tir_blocks`).
"""

from .analysis import Kernel, MemoryOperator, analyze
from .generate import generate, merge, op_graph
from .ir import GOp, Graph, Hierarchy, Kind, MemSlice, Parallel, Scope
from .model import Machine, estimate, machine_for, measure_cpu
from .rewrite import Capacity, optimize, placement
from .search import Plan, candidates, plan, plan_kernel

__all__ = [
    "MemoryOperator",
    "Capacity",
    "GOp",
    "Graph",
    "Hierarchy",
    "Kernel",
    "Kind",
    "Machine",
    "MemSlice",
    "Parallel",
    "Plan",
    "Scope",
    "analyze",
    "candidates",
    "estimate",
    "generate",
    "machine_for",
    "measure_cpu",
    "merge",
    "op_graph",
    "optimize",
    "placement",
    "plan",
    "plan_kernel",
]
