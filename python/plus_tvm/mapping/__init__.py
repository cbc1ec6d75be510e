"""Mapping-type operator classes (paper 004, section 3.1): registry, TIR analysis, fusion rules."""

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
