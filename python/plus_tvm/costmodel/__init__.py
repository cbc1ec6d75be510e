"""Cost predictions the compiler uses to choose between implementations."""

from .dispatch_cost import (
    DispatchCost,
    predict_library_us,
    predict_tir_us,
    size_value,
    work_of,
)
from .graph_cost import GraphCost

__all__ = [
    "DispatchCost",
    "GraphCost",
    "predict_library_us",
    "predict_tir_us",
    "size_value",
    "work_of",
]
