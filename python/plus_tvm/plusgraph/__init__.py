"""+Loop / +Graph: the loop-centric subgraph identifiers of PluS (paper 000, section 4.1).

The builder reads each block's loops, accesses and reduction operator from the shared block
analysis (:mod:`plus_tvm.tir_blocks`); :mod:`plus_tvm.dispatch` matches the +Graphs against
the warehouse.
"""

from .build import (
    LoopOperator,
    PlusGraphBuilder,
    TensorAccess,
    collapse,
    loop_operators,
    plusgraph_of,
)
from .loops import KEY_OPS, PlusGraph, PlusGraphSyntaxError, PlusLoop, parse_plusgraph
from .match import full_match, full_match_units, partial_match, partial_match_units, unbatched

__all__ = [
    "KEY_OPS",
    "TensorAccess",
    "LoopOperator",
    "PlusGraph",
    "PlusGraphBuilder",
    "PlusGraphSyntaxError",
    "PlusLoop",
    "loop_operators",
    "collapse",
    "full_match",
    "full_match_units",
    "parse_plusgraph",
    "partial_match",
    "partial_match_units",
    "plusgraph_of",
    "unbatched",
]
