"""TVM's operator-pattern fusion rules, for the ablation of paper 004 (figure 6: Rule_T).

The kernels' ``op_pattern`` (set by ``AnnotateTIROpPattern``) and the pairings FuseOps allows:
elementwise / broadcast / injective chains fuse; an out-elementwise-fusable kernel (matmul,
conv) takes elementwise and broadcast epilogues; injective producers fuse into a reduction;
opaque kernels and tuples never fuse. The group takes the larger pattern, as in FuseOps.
"""

from __future__ import annotations

import enum

from ..mapping import FuseDecision


class OpPattern(enum.IntEnum):
    """TVM's ``OpPatternKind`` values as stored in the ``op_pattern`` PrimFunc attribute."""

    ElemWise = 0
    Broadcast = 1
    Injective = 2
    CommReduce = 3
    OutEWiseFusable = 4
    Tuple = 7
    Opaque = 8


P = OpPattern


def tvm_rule(producer: int, consumer: int, consumer_needs_contiguous: bool = False) -> FuseDecision:
    """Whether FuseOps' pattern rules let a ``producer`` group absorb a ``consumer`` kernel."""
    del consumer_needs_contiguous  # TVM's rules do not look at access order
    p, c = P(producer), P(consumer)
    if P.Opaque in (p, c) or P.Tuple in (p, c):
        return FuseDecision(None, "tvm: opaque or tuple kernels are not fused")
    if p <= P.Injective and c <= P.Injective:
        return FuseDecision(P(max(p, c)), "tvm: injective chain")
    if p == P.OutEWiseFusable and c <= P.Broadcast:
        return FuseDecision(P.OutEWiseFusable, "tvm: elementwise epilogue")
    if p <= P.Injective and c == P.CommReduce:
        return FuseDecision(P.CommReduce, "tvm: injective into reduction")
    return FuseDecision(None, f"tvm: {p.name} then {c.name} is not fused")


def tvm_fusible(pattern: int) -> bool:
    return P(pattern) not in (P.Opaque, P.Tuple)
