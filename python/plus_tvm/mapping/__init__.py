"""Mapping-type operator classes (paper 004, section 3.1): registry, TIR analysis, fusion rules.

The classes of PrimFuncs are read off the shared block analysis (:mod:`plus_tvm.tir_blocks`);
the plan search that uses the rules is :mod:`plus_tvm.fusion` (paper 004, section 3.3).
"""

from .classes import MapPattern, most_complex
from .op_table import OP_MAP_PATTERNS, op_map_pattern, register_op_map_patterns
from .rules import FuseDecision, fuse_rule, needs_contiguous_input
from .tir_analysis import analyze_primfunc

register_op_map_patterns()

__all__ = [
    "OP_MAP_PATTERNS",
    "FuseDecision",
    "fuse_rule",
    "needs_contiguous_input",
    "MapPattern",
    "analyze_primfunc",
    "most_complex",
    "op_map_pattern",
    "register_op_map_patterns",
]
