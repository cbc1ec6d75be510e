"""Subgraphs whose TIR alternative no schedule reaches: the library call is taken unpriced.

On the CPU, GIR declines a reduction over half-precision buffers (``gir.search.plan_for_rule``:
TVM 0.27's LLVM code for its vectorized half reductions was wrong), so such a kernel runs as
TVM's unscheduled loop nest -- a bfloat16 GEMV of VGG-16's classifier took over a second where
the library takes milliseconds. Neither the analytic prices (a GEMM's TIR at untuned but
compiled throughput) nor a learned model's (its vector says GIR schedules the kernel) describe
that loop nest, so the dispatcher does not let them choose it.
"""

from __future__ import annotations

from ..gir.search import reduces_half


def tir_unscheduled(members: tuple[int, ...], graph, kind: str) -> bool:  # noqa: ANN001
    """Whether the TIR of the subgraph ``members`` of ``graph`` (an ``OpGraph``) would run
    unscheduled on a ``kind`` target: on ``llvm``, an operator reducing over half-precision
    buffers (the library call then pays whatever the cost model predicts)."""
    if kind != "llvm":
        return False
    funcs = (graph.nodes[i].func for i in members)
    return any(func is not None and reduces_half(func) for func in funcs)
