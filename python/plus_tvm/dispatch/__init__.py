"""Library dispatch: +Graph identification against the pattern warehouse and the binders that
turn a matched subgraph into ``R.call_dps_packed`` of a library kernel (PluS, paper 000)."""

from __future__ import annotations

from .binders import BINDERS


def known_implementations() -> frozenset[str]:
    """Implementation names a warehouse entry may use."""
    return frozenset(BINDERS)


__all__ = ["BINDERS", "known_implementations"]
