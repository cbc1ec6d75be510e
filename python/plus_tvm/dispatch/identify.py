"""Subgraph identification from skeleton operators (paper 000, §4.2, algorithms 1 and 2).

Algorithm 1 takes unfused operators in program order: the first *skeleton operator* (one with
a non-parallelizable +Loop, e.g. a matmul or a reduction) or, when none is left, the first
*root* (no unfused producer), and grows a subgraph from it with algorithm 2:

- prologues: while some producer of the subgraph keeps it a (partial) match of a warehouse
  pattern that allows prologues, fuse it;
- epilogues: while some consumer keeps it a (partial) match of a pattern that allows
  epilogues, fuse it, then try the producers of that consumer's other inputs (line 9-11:
  after ``matmul + add`` the producer of the added tensor).

After each step the subgraph is checked against the warehouse (``Matching``): a *full* match
archives it as the latest successful subgraph; a *partial* match lets the extension go on;
neither rejects the candidate. The final subgraph of a skeleton operator is the last archived
one; operators in it leave ``unfused_ops``. Epilogue fusion wins over prologue fusion simply
because operators are visited in program order, so an operator is claimed as the epilogue of
an earlier skeleton before a later one can take it as a prologue; an operator whose outputs
feed both a fused consumer and others stays where it is and its value is computed again by
the others (the greedy multi-output rule).

Every extension keeps the subgraph convex (no path leaves it and comes back).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..plusgraph import (
    PlusGraph,
    PlusGraphBuilder,
    full_match_units,
    partial_match_units,
    unbatched,
)
from .opgraph import OpGraph


@dataclass(frozen=True)
class Match:
    """An identified subgraph: members in program order, the entries it fully matches, and
    its inner structure as the binders read it (what follows what, and which values leave)."""

    members: tuple[int, ...]
    entries: tuple[object, ...]  # WarehouseEntry, best first
    graph: PlusGraph
    sizes: dict
    #: member -> the members reading its value, in program order: the edges along which the
    #: extension fused its epilogues (and its prologues into their readers)
    readers: Mapping[int, tuple[int, ...]] = field(default_factory=dict, compare=False)
    #: members whose value is also read outside the subgraph or leaves the block: a library
    #: call cannot absorb past one (the value would be lost)
    escapes: frozenset[int] = frozenset()
    #: earlier archived states of the same extension, latest first: when no implementation
    #: can express this subgraph, the dispatcher falls back to the largest one that can
    fallbacks: tuple[Match, ...] = ()

    def follower(self, index: int) -> int | None:
        """The member the subgraph absorbs right after ``index``: the only reader of its
        value, when the value goes nowhere else; None at the end of a chain."""
        readers = self.readers.get(index, ())
        if index in self.escapes or len(readers) != 1:
            return None
        return readers[0]


class Identifier:
    """Runs algorithms 1-2 over one ``OpGraph`` against a list of warehouse entries."""

    def __init__(
        self, graph: OpGraph, entries: list, max_members: int = 64, exclude: set[int] = frozenset()
    ) -> None:
        self.g = graph
        self.entries = entries
        self.max_members = max_members
        self.exclude = exclude
        self._states: dict = {}  # (+Graph, entries) -> _match_state's result, for this run

    # --------------------------------------------------------------------------- algorithm 1
    def run(self) -> list[Match]:
        unfused = [n.index for n in self.g.nodes if n.fusible and n.index not in self.exclude]
        unfused_set = set(unfused)
        # algorithm 1's order: the first unfused skeleton, else the first unfused operator
        # (in program order every producer of the first one is fused already: it is a root).
        # Both scans only move forward past taken operators: linear in the block's size.
        skeletons = [i for i in unfused if self._is_skeleton(i)]
        next_skeleton = next_any = 0
        matches: list[Match] = []
        while unfused_set:
            while next_skeleton < len(skeletons) and skeletons[next_skeleton] not in unfused_set:
                next_skeleton += 1
            if next_skeleton < len(skeletons):
                start = skeletons[next_skeleton]
            else:
                while unfused[next_any] not in unfused_set:
                    next_any += 1
                start = unfused[next_any]
            found = self._match_from(start, unfused_set)
            taken = set(found.members) if found is not None else {start}
            if found is not None:
                matches.append(found)
            unfused_set -= taken
        return matches

    def _is_skeleton(self, index: int) -> bool:
        return any(op.is_skeleton for op in self.g.nodes[index].basic)

    # --------------------------------------------------------------------------- algorithm 2
    def _match_from(self, start: int, unfused: set[int]) -> Match | None:
        builder = PlusGraphBuilder()
        for op in self.g.nodes[start].basic:
            builder.add(op)
        members = [start]
        state = self._state(builder)
        if state is None:
            return None
        archived = self._archive(members, builder, state)
        rejected: set[int] = set()
        prologues: set[int] = set()
        history: list[Match] = []

        def try_add(index: int, prologue: bool) -> bool:
            nonlocal builder, state, archived
            if index in rejected or index in members or index not in unfused:
                return False
            sources = prologues | ({index} if prologue else set())
            if len(members) >= self.max_members or not self._convex(members, index, sources):
                return False
            allowed = [e for e in state[0] if (e.allow_prologue if prologue else e.allow_epilogue)]
            if not allowed:
                return False
            trial = builder.copy()
            ops = self.g.nodes[index].basic
            for op in reversed(ops) if prologue else ops:
                trial.add(op, prologue=prologue)
            trial_state = self._state(trial, allowed)
            if trial_state is None or (prologue and state[4] and not trial_state[3]):
                # (a prologue that only an imagined unit loop admits would trade a full match
                # read without one -- a half CNN's 1x1 convolution -- for entries that take no
                # epilogue it can have)
                rejected.add(index)
                return False
            builder, state = trial, trial_state
            members.append(index)
            if prologue:
                prologues.add(index)
            latest = self._archive(members, builder, state)
            if latest is not None:
                if archived is not None:
                    history.insert(0, archived)
                archived = latest
            return True

        progress = True
        while progress:  # prologues (lines 1-4)
            progress = any(try_add(p, True) for p in self._producers(members))
        progress = True
        while progress:  # epilogues, then the producers of each epilogue (lines 5-11)
            progress = False
            for c in self._consumers(members, prologues):
                if try_add(c, False):
                    progress = True
                    for p in self.g.nodes[c].inputs:
                        try_add(p, True)
                    break
        if archived is None:
            return None
        return dataclasses.replace(archived, fallbacks=tuple(history))

    def _state(self, builder: PlusGraphBuilder, entries: list | None = None):  # noqa: ANN202
        """(entries still reachable, entries fully matched with their size bindings), memoised
        by +Graph and entries: an element-wise operator joins the loops already there, so a
        long chain of them gives the same +Graph again and again."""
        graph = builder.graph()
        pool = self.entries if entries is None else entries
        key = (graph, tuple(id(e) for e in pool))
        if key not in self._states:
            self._states[key] = self._match_state(graph, pool)
        return self._states[key]

    def _match_state(self, graph: PlusGraph, pool: list):  # noqa: ANN202
        batch = unbatched(graph)  # the forest a leading batch loop repeats, if any

        def forms(e) -> tuple[PlusGraph, ...]:  # noqa: ANN001
            return (graph, batch) if e.batched and batch is not None else (graph,)

        # still reachable: a partial match (read without unit loops), or a full one with them
        # (a one-row GEMM grows as a full match at every step; see ``plusgraph.match``)
        partial, full = [], []
        unit_free = False  # some entry is reachable without imagining a unit loop
        for e in pool:
            found = [f for g in forms(e) if (f := full_match_units(e.graph, g)) is not None]
            if found:
                b, units = min(found, key=lambda f: f[1])
                full.append((e, b, units))
                unit_free |= units == 0
            if found and unit_free:  # (nothing a partial reading could add: skip the search)
                partial.append(e)
                continue
            grows = [f for g in forms(e) if (f := partial_match_units(e.graph, g)) is not None]
            unit_free |= any(units == 0 for _, units in grows)
            if found or grows:
                partial.append(e)
        if not partial:
            return None
        # an entry that fits without taking loops as unit loops (see ``plusgraph.match``)
        # beats one that needs them: a GEMM is no 1x1 convolution of one pixel
        fewest = min((units for _, _, units in full), default=0)
        has_unit_free_full = bool(full) and fewest == 0
        full = [(e, b) for e, b, units in full if units == fewest]
        return partial, full, graph, unit_free, has_unit_free_full

    def _archive(self, members: list[int], builder: PlusGraphBuilder, state) -> Match | None:  # noqa: ANN001
        _, full, graph, _, _ = state
        if not full:
            return None
        order = tuple(sorted(members))
        inside = set(order)
        nodes = self.g.nodes
        readers = {m: tuple(c for c in nodes[m].consumers if c in inside) for m in order}
        escapes = frozenset(
            m
            for m in order
            if m in self.g.outside_uses or any(c not in inside for c in nodes[m].consumers)
        )
        entries = tuple(e for e, _ in full)
        return Match(order, entries, graph, dict(full[0][1]), readers, escapes)

    # ----------------------------------------------------------------------------- structure
    def _producers(self, members: list[int]) -> list[int]:
        seen: list[int] = []
        for m in sorted(members, reverse=True):
            for p in self.g.nodes[m].inputs:
                if p not in members and p not in seen:
                    seen.append(p)
        return seen

    def _consumers(self, members: list[int], prologues: set[int] = frozenset()) -> list[int]:
        """Consumers of the subgraph's computation: an operator reading only prologue members
        (the mask an attention adds, read again elsewhere) is not an epilogue of it."""
        seen: list[int] = []
        for m in sorted(members):
            if m in prologues:
                continue
            for c in self.g.nodes[m].consumers:
                if c not in members and c not in seen:
                    seen.append(c)
        return sorted(seen)

    def _convex(self, members: list[int], new: int, prologues: set[int] = frozenset()) -> bool:
        """Adding ``new`` keeps the set convex: no path between two members through an
        outsider. A prologue's outside consumers compute its value again (the greedy
        multi-output rule), so paths from a prologue do not leave the subgraph."""
        group = set(members) | {new}
        lo = min(group)
        hi = max(group)
        # outsiders reachable from the group (forward), within the index window
        reach: set[int] = set()
        stack = [c for m in group - prologues for c in self.g.nodes[m].consumers if c not in group]
        while stack:
            i = stack.pop()
            if i in reach or i > hi:
                continue
            reach.add(i)
            stack.extend(self.g.nodes[i].consumers)
        del lo
        return not any(p in reach for m in group for p in self.g.nodes[m].inputs)
