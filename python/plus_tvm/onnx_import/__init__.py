"""plus_tvm's ONNX frontend layer over TVM 0.27's importer (see :mod:`.importer`).

No paper's part: the frontend that brings ONNX models (and ONNX's node tests,
:mod:`plus_tvm.conformance`) into Relax for every paper's passes."""

from .converters import CONVERTERS
from .importer import PlusONNXImporter, import_model, supported_ops

__all__ = ["CONVERTERS", "PlusONNXImporter", "import_model", "supported_ops"]
