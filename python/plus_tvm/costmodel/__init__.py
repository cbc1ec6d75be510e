"""Cost predictions the compiler uses to choose between implementations.

Paper map: :mod:`.dispatch_cost` prices a matched subgraph as a library call or as generated
TIR (PluS, paper 000: dispatch by cost); :mod:`.graph_cost` estimates whether a captured region
pays for its CUDA graph (PyGraph, paper 001, section 4.3). The fusion plan's cost (paper 004,
eq. 6-8) lives with its search in :mod:`plus_tvm.fusion.cost`, the GIR model (paper 002) in
:mod:`plus_tvm.gir.model`.
"""

from .dispatch_cost import (
    DispatchCost,
    LearnedDispatchCost,
    predict_library_us,
    predict_tir_us,
    size_value,
    work_of,
)
from .graph_cost import GraphCost

__all__ = [
    "DispatchCost",
    "GraphCost",
    "LearnedDispatchCost",
    "predict_library_us",
    "predict_tir_us",
    "size_value",
    "work_of",
]
