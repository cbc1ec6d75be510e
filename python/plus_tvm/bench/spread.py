"""How far a backend's timed runs spread, and whether a reported ratio is within that spread.

A ratio of two medians says "A is X times B"; on a loaded machine the runs of either side can
spread over more than the difference between the medians, and then the ratio says nothing
(``--runs 5`` once printed 1945.00x with runs spread over three orders of magnitude). The spread
of a backend is the range of the middle 80% of its runs (:data:`PERCENTILES`, numpy's linear
interpolation: with a few runs, nearly max - min; with many, one outlier does not count). A
ratio is flagged when the spread of either side, in milliseconds, is larger than the difference
of the two medians.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

PERCENTILES = (10.0, 90.0)


def spread_ms(times_ms: Sequence[float]) -> float | None:
    """The range of the middle 80% of the runs (None with fewer than two runs)."""
    if len(times_ms) < 2:
        return None
    low, high = np.percentile(np.asarray(times_ms, dtype=np.float64), PERCENTILES)
    return float(high - low)


def within_spread(
    plus_median: float, plus_spread: float | None, peer_median: float, peer_spread: float | None
) -> bool:
    """Whether the difference of two medians is smaller than the spread of either side."""
    difference = abs(peer_median - plus_median)
    spreads = [s for s in (plus_spread, peer_spread) if s is not None]
    return bool(spreads) and max(spreads) > difference


def spread_warnings(backends: dict[str, dict]) -> list[str]:
    """One line per peer whose ratio to plus is within the runs' spread (``backends``: the
    result's entries, with ``median_ms``, ``spread_ms`` and ``runs``)."""
    plus = backends.get("plus", {})
    if not plus.get("median_ms"):
        return []
    lines = []
    for name, entry in backends.items():
        if name == "plus" or not entry.get("median_ms"):
            continue
        if not within_spread(
            plus["median_ms"], plus.get("spread_ms"), entry["median_ms"], entry.get("spread_ms")
        ):
            continue
        ratio = entry["median_ms"] / plus["median_ms"]
        lines.append(
            f"{name}: the ratio {ratio:.2f}x is within the spread of the runs (medians "
            f"{plus['median_ms']:.3f} / {entry['median_ms']:.3f} ms differ by "
            f"{abs(entry['median_ms'] - plus['median_ms']):.3f} ms; middle 80% of runs spread "
            f"over {_ms(plus.get('spread_ms'))} ms for plus ({plus.get('runs')} runs), "
            f"{_ms(entry.get('spread_ms'))} ms for {name} ({entry.get('runs')} runs)): "
            "measure again with more runs on a quieter machine"
        )
    return lines


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
