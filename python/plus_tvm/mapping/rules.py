"""The fusion rules of paper 004 (table 1) over mapping classes.

| rule | operator 1 | operator 2 | fused class |
| --- | --- | --- | --- |
| 1 | OneToOne | any | the other's class |
| 2 | Reorganize | OneToOne / Reorganize / Shuffle | Reorganize / Reorganize / Shuffle |
| 3 | Shuffle | OneToOne / Reorganize / Shuffle | Shuffle |
| suppl. 1 | Reorganize / Shuffle | OneToMany / ManyToMany | OneToMany / ManyToMany (*) |
| suppl. 2 | ManyToMany (many-to-one) | OneToMany | ManyToMany |

(*) unless the OneToMany / ManyToMany consumer needs its input in contiguous order.

The table names pairs of classes; a pair is fusible whichever of the two produces the other's
input (an elementwise epilogue after a matmul fuses as well as an elementwise prologue before it;
a reshape after a matmul is an index remap of its output). The one directed condition is
supplement 1's: a reorganized or shuffled input is bad only for a *consumer* that streams that
input along its contiguous axis, which :func:`needs_contiguous_input` reads off the consumer's
loop nest. OneToMany before ManyToMany (section 3.2.1, case 3), ManyToMany with ManyToMany (case
4) and OneToMany with OneToMany are not fused; NotFuse never is. The fused group takes the most
complex class of the two (section 3.2.2).
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx

from ..tir_blocks import block_infos, expr_vars
from .classes import MapPattern, most_complex

M = MapPattern
_REORDERING = (M.Reorganize, M.Shuffle)
_EXPANDING = (M.OneToMany, M.ManyToMany)


@dataclass(frozen=True)
class FuseDecision:
    """Outcome of a rule check: the fused class (None if rejected) and which rule decided."""

    fused: MapPattern | None
    rule: str

    @property
    def ok(self) -> bool:
        return self.fused is not None


def fuse_rule(
    producer: MapPattern, consumer: MapPattern, consumer_needs_contiguous: bool = False
) -> FuseDecision:
    """Decide whether a producer of class ``producer`` fuses with its consumer (table 1).

    Parameters
    ----------
    producer, consumer : MapPattern
        Classes of the producing group and the consuming operator.
    consumer_needs_contiguous : bool
        Whether the consumer reads the producer's output along its contiguous axis in its inner
        loop (supplement 1's condition; see :func:`needs_contiguous_input`).
    """
    pair = {producer, consumer}
    if M.NotFuse in pair:
        return FuseDecision(None, "NotFuse: never fused")
    if producer == M.OneToOne or consumer == M.OneToOne:
        return FuseDecision(most_complex(producer, consumer), "rule 1 (OneToOne + any)")
    if producer in _REORDERING and consumer in _REORDERING:
        rule = "rule 2" if producer == M.Reorganize else "rule 3"
        return FuseDecision(
            most_complex(producer, consumer), f"{rule} ({producer.name} + {consumer.name})"
        )
    if producer in _REORDERING and consumer in _EXPANDING:
        if consumer_needs_contiguous:
            return FuseDecision(
                None, "supplement 1: the consumer needs its input in contiguous order"
            )
        return FuseDecision(consumer, "supplement 1 (reordering into OneToMany/ManyToMany)")
    if producer in _EXPANDING and consumer in _REORDERING:
        return FuseDecision(producer, "supplement 1 (OneToMany/ManyToMany, then reordered)")
    if producer == M.ManyToMany and consumer == M.OneToMany:
        return FuseDecision(M.ManyToMany, "supplement 2 (ManyToMany + OneToMany)")
    if producer == M.OneToMany and consumer == M.ManyToMany:
        return FuseDecision(None, "no rule: OneToMany before ManyToMany breaks contiguous reads")
    if producer == M.ManyToMany and consumer == M.ManyToMany:
        return FuseDecision(None, "no rule: ManyToMany + ManyToMany (register/cache pressure)")
    return FuseDecision(None, f"no rule for {producer.name} + {consumer.name}")


def needs_contiguous_input(consumer: tirx.PrimFunc, param_index: int) -> bool:
    """Whether ``consumer`` streams its ``param_index``-th parameter along its contiguous axis.

    True when some block loads that buffer with its last index driven by the block's innermost
    iterator (e.g. ``A[i, k]`` in a matmul over ``k``, ``x[i, k]`` in a row reduction): then a
    shuffled or reorganized producer would turn the inner loop's unit-stride reads into strided
    ones (supplement 1).
    """
    buffer = consumer.params[param_index]
    for info in block_infos(consumer):
        if not info.loops:
            continue
        innermost = info.loops[-1].var
        for _, load in info.reads:
            if load.source.same_as(buffer) and load.indices:
                if innermost in expr_vars(load.indices[-1]):
                    return True
    return False
