"""plus_tvm's ONNX frontend layer over TVM 0.27's importer (see :mod:`.importer`)."""

from .converters import CONVERTERS
from .importer import PlusONNXImporter, import_model, supported_ops

__all__ = ["CONVERTERS", "PlusONNXImporter", "import_model", "supported_ops"]
