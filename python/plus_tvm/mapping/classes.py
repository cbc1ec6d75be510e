"""The mapping classes of paper 004 (section 3.1): how an operator's outputs map to its inputs.

Ordered by complexity, as the paper orders them; the class of a fused group is the most complex
class among its members (section 3.2.2), i.e. the maximum.
"""

from __future__ import annotations

import enum


class MapPattern(enum.IntEnum):
    """Input-output mapping class of an operator or kernel.

    - ``OneToOne``: each output element from the input elements at the same index
      (elementwise ops, activations; broadcast side operands allowed).
    - ``Reorganize``: outputs are input elements rearranged (reshape, slice, concat, gather).
    - ``Shuffle``: outputs are input elements with dimensions permuted (transpose).
    - ``OneToMany``: an input element feeds several outputs (broadcast_to, tile, repeat, fill).
    - ``ManyToMany``: several input elements combine into outputs (reductions, matmul, conv,
      pooling, softmax, norms).
    - ``NotFuse``: not a tensor computation, or must stay alone (shape ops, allocation,
      library calls, sort/top-k, scatter).
    """

    OneToOne = 0
    Reorganize = 1
    Shuffle = 2
    OneToMany = 3
    ManyToMany = 4
    NotFuse = 5


def most_complex(*patterns: MapPattern) -> MapPattern:
    """The class of a group of operators: the most complex member class."""
    return MapPattern(max(int(p) for p in patterns))
