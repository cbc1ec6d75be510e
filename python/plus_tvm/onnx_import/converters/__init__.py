"""plus_tvm's ONNX converters: one op per file, each a TVM ``OnnxOpConverter`` subclass.

:data:`CONVERTERS` maps an ONNX op type to its converter; the importer consults it before TVM's
own table. A converter exists here when TVM 0.27 has none for the op, or when TVM's gets a
documented form of the op wrong (each file says which).
"""

from __future__ import annotations

from .arg_extremes import ArgMax, ArgMin
from .attention import Attention
from .constant import Constant
from .contraction import Conv, ConvTranspose, Gemm, MatMul
from .expand import Expand
from .is_inf import IsInf
from .layer_normalization import LayerNormalization
from .mod import Mod
from .negative_log_likelihood_loss import NegativeLogLikelihoodLoss
from .reduce_extremes import ReduceMax, ReduceMin
from .softmax_cross_entropy_loss import SoftmaxCrossEntropyLoss
from .top_k import TopK

CONVERTERS = {
    "ArgMax": ArgMax,
    "ArgMin": ArgMin,
    "Attention": Attention,
    "Constant": Constant,
    "Conv": Conv,
    "ConvTranspose": ConvTranspose,
    "Expand": Expand,
    "Gemm": Gemm,
    "IsInf": IsInf,
    "LayerNormalization": LayerNormalization,
    "MatMul": MatMul,
    "Mod": Mod,
    "NegativeLogLikelihoodLoss": NegativeLogLikelihoodLoss,
    "ReduceMax": ReduceMax,
    "ReduceMin": ReduceMin,
    "SoftmaxCrossEntropyLoss": SoftmaxCrossEntropyLoss,
    "TopK": TopK,
}

__all__ = ["CONVERTERS"]
