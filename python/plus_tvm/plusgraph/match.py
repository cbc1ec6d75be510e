"""Match conditions between a subgraph's +Graph and a warehouse pattern (paper 000, §4.2).

*Full match*: the two forests have the same shape; each loop pair has the same parallelism;
sizes unify (a pattern size name binds to one subgraph size everywhere it appears, an integer
must be equal); every operation a pattern loop names is performed by the subgraph loop, and a
pattern loop that names operations admits no other key operation (``KEY_OPS``) there. A pattern
loop naming no operation matches any (trivial operations never take part).

*Partial match* (the subgraph can still grow into the pattern), per the paper's four criteria
applied recursively over the loop tree:

1. a non-parallelizable pattern loop accepts a parallelizable or non-parallelizable loop
   (primitive 2 may still turn it non-parallelizable);
2. a parallelizable pattern loop needs a parallelizable loop;
3. a pattern loop nests at least as many loops as the subgraph loop (further extension only
   adds loops); the subgraph's nested loops align, in order, with a subsequence of the
   pattern's;
4. key operations must agree: the subgraph loop performs no key operation the pattern loop
   does not name.

*Unit loops*: the builder drops every loop of extent 1, so a pattern's parallelizable loop that
performs no operation itself also matches where the subgraph has no loop for it, its size bound
to 1 and its nested loops standing in its place. A one-row GEMM -- a matrix-vector product,
``[1, K] x [K, N]`` -- is the GEMM pattern with ``M = 1``. A reading with fewer unit loops wins.
A subgraph still growing is read without unit loops where it can be, else with one (a decode
step's one-row attention); more imagined loops on a partial reading let a GEMV's cast prologue
pass for the second half of an attention of one row.
"""

from __future__ import annotations

from collections.abc import Iterator

from .loops import PlusGraph, PlusLoop, Size

Binding = dict[str, Size]


def _unify(pattern: Size, actual: Size, binding: Binding) -> Binding | None:
    if isinstance(pattern, int):
        return binding if actual == pattern else None
    if "*" in pattern:  # a collapsed product in the pattern: compare literally
        return binding if str(actual).replace(" ", "") == pattern else None
    if pattern in binding:
        return binding if binding[pattern] == actual else None
    return {**binding, pattern: actual}


def _ops_ok(p: PlusLoop, s: PlusLoop, full: bool) -> bool:
    if not p.ops:
        return True
    named = set(p.ops)
    if not s.key_ops <= named:
        return False
    return named <= set(s.ops) if full else True


def _unit(p: PlusLoop, binding: Binding) -> Binding | None:
    """The binding with ``p`` taken as a unit loop the subgraph does not show, or None.

    The builder drops every loop of extent 1 (it indexes nothing), so a GEMM of one row (a
    matrix-vector product) has no ``M`` loop at all. A parallelizable pattern loop that
    performs no operation itself still matches there, its size bound to 1: the subgraph is the
    pattern with that loop of extent 1, its nested loops standing in its place. A loop whose
    size is an integer other than 1, or a name already bound to another size, cannot be unit.
    """
    if not p.parallel or p.ops:
        return None
    return _unify(p.size, 1, binding)


Found = Iterator[tuple[Binding, int]]  # a binding and how many pattern loops it took as unit


def _loop_full(p: PlusLoop, s: PlusLoop, binding: Binding) -> Found:
    if p.parallel != s.parallel or not _ops_ok(p, s, True):
        return
    b = _unify(p.size, s.size, binding)
    if b is None:
        return
    yield from _seq_full(p.children, s.children, b)


def _seq_full(ps: tuple[PlusLoop, ...], ss: tuple[PlusLoop, ...], b: Binding) -> Found:
    if not ps:
        if not ss:
            yield b, 0
        return
    unit = _unit(ps[0], b)
    if unit is not None:  # the pattern loop is a unit loop: its nested loops take its place
        for b1, n in _seq_full(ps[0].children + ps[1:], ss, unit):
            yield b1, n + 1
    if ss:
        for b1, n1 in _loop_full(ps[0], ss[0], b):
            for b2, n2 in _seq_full(ps[1:], ss[1:], b1):
                yield b2, n1 + n2


def _loop_partial(p: PlusLoop, s: PlusLoop, binding: Binding, units: int) -> Iterator[Binding]:
    if p.parallel and not s.parallel:
        return
    if len(p.children) < len(s.children) or not _ops_ok(p, s, False):
        return
    b = _unify(p.size, s.size, binding)
    if b is None:
        return
    yield from _seq_partial(p.children, s.children, b, units)


def _seq_partial(
    ps: tuple[PlusLoop, ...], ss: tuple[PlusLoop, ...], b: Binding, units: int
) -> Iterator[Binding]:
    """The subgraph's loops ``ss`` align, in order, with a subsequence of ``ps`` (a pattern
    loop left out is one a later extension may still add); at most ``units`` pattern loops
    are taken as unit loops, their nested loops standing in their place."""
    if not ss:
        yield b
        return
    for i in range(len(ps) - len(ss) + 1):
        for b1 in _loop_partial(ps[i], ss[0], b, units):
            yield from _seq_partial(ps[i + 1 :], ss[1:], b1, units)
    if units and ps:
        unit = _unit(ps[0], b)
        if unit is not None:
            yield from _seq_partial(ps[0].children + ps[1:], ss, unit, units - 1)


def unbatched(graph: PlusGraph) -> PlusGraph | None:
    """``graph`` without a leading batch loop, or None when it has none.

    A batch loop encloses every nest of the subgraph: each root is a parallelizable loop of
    the same size that performs no operation itself (the builder merges a batched
    convolution's ``[N, P, C]`` pad and ``[N, HW, O, ...]`` product under such loops, where
    batch 1 has no loop at all, unit loops being dropped). Its children, in order, are the
    forest the batch repeats; entries marked ``batched`` match that forest too.
    """
    roots = graph.roots
    if not roots or not all(r.parallel and not r.ops and r.children for r in roots):
        return None
    if len({r.size for r in roots}) != 1:
        return None
    return PlusGraph(tuple(c for r in roots for c in r.children))


def full_match(pattern: PlusGraph, graph: PlusGraph) -> Binding | None:
    """The size binding when ``graph`` matches ``pattern`` exactly, else ``None``."""
    found = full_match_units(pattern, graph)
    return None if found is None else found[0]


def full_match_units(pattern: PlusGraph, graph: PlusGraph) -> tuple[Binding, int] | None:
    """The size binding of a full match and how many pattern loops it takes as unit loops.

    Of several readings the one taking the fewest unit loops wins, then the one taking the
    outer loops as unit: a one-row GEMM binds ``M`` to 1, not ``N``.
    """
    best: tuple[Binding, int] | None = None
    for b, units in _seq_full(pattern.roots, graph.roots, {}):
        if units == 0:
            return b, 0
        if best is None or units < best[1]:
            best = (b, units)
    return best


def partial_match(pattern: PlusGraph, graph: PlusGraph) -> Binding | None:
    """The size binding when ``graph`` may still grow into ``pattern`` (or matches it).

    A reading without unit loops comes first; else one taking a single pattern loop as a unit
    loop (an attention of one query row: a decode step's ``q @ k^T`` has no query loop). More
    imagined loops on a growing subgraph let a GEMV's cast prologue pass for the second half
    of a one-row attention (see the module's docstring)."""
    found = partial_match_units(pattern, graph)
    return None if found is None else found[0]


def partial_match_units(pattern: PlusGraph, graph: PlusGraph) -> tuple[Binding, int] | None:
    """:func:`partial_match`'s binding and how many pattern loops it takes as unit loops (0
    or 1)."""
    if len(pattern.roots) < len(graph.roots):
        return None
    for units in (0, 1):
        found = next(_seq_partial(pattern.roots, graph.roots, {}, units), None)
        if found is not None:
            return found, units
    return None
