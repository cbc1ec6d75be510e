"""ONNX conformance: ONNX's node tests through the plus pipeline and TVM's (scripts/conformance).

``python -m plus_tvm.conformance [--subset ci|all] [--json F]`` generates the tests once into
the cache (:mod:`.cases`), runs each under both pipelines in worker processes (:mod:`.runner`),
classifies them (both pass, both fail, plus-only failure, TVM-only failure) and prints a summary.
"""

from .cases import NodeCase, first_of_each_operator, load_cases
from .runner import CLASSES, Report, classify, run, summary, write_json

__all__ = [
    "CLASSES",
    "NodeCase",
    "Report",
    "classify",
    "first_of_each_operator",
    "load_cases",
    "run",
    "summary",
    "write_json",
]
