"""``plus-tvm bench``: plus against TVM, torch eager, torch.compile and ONNX Runtime, each
backend in its own process with its own defaults (see :mod:`plus_tvm.bench.driver`)."""

from __future__ import annotations

from .driver import BACKENDS, Backend, Bench, BenchError, bench, state_changes
from .report import format_table, plot

__all__ = [
    "BACKENDS",
    "Backend",
    "Bench",
    "BenchError",
    "bench",
    "format_table",
    "plot",
    "state_changes",
]
