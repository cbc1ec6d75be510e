"""Implementation binders: warehouse implementation name -> function building the library
call for a matched subgraph (``None``: this implementation cannot express it)."""

from __future__ import annotations

from .attention import bind_attention
from .common import Ctx, LibraryCall
from .conv2d import bind_conv2d
from .linear import bind_linear, bind_linear_layernorm
from .matmul import bind_matmul
from .norms import bind_layer_norm, bind_rms_norm, bind_softmax

BINDERS = {
    "torch.linear": bind_linear,
    "torch.linear_layernorm": bind_linear_layernorm,
    "torch.matmul": bind_matmul,
    "torch.sdpa": bind_attention,
    "torch.sdpa_flash": bind_attention,
    "torch.layer_norm": bind_layer_norm,
    "torch.rms_norm": bind_rms_norm,
    "torch.softmax": bind_softmax,
    "torch.conv2d": bind_conv2d,
}

__all__ = ["BINDERS", "Ctx", "LibraryCall"]
