"""Which inputs of a text model have a sequence axis, and the ``torch.export`` dims that make it
symbolic: the piece :mod:`plus_tvm.zoo` (ONNX export with a dynamic sequence) and
:mod:`plus_tvm.dynamic_sequence` (re-import with one) share.

A module of its own so that the imports go one way: ``dynamic_sequence`` imports the loader,
which imports the zoo, which imports this (and not ``dynamic_sequence``).
"""

from __future__ import annotations

from collections.abc import Sequence

from .errors import ModelLoadError

SEQUENCE_AXIS = 1
DIM_NAME = "seq"


def is_sequence_input(x: object) -> bool:
    """An integer tensor of rank 2 or more: token ids, an attention mask, token types."""
    shape = getattr(x, "shape", ())
    dtype = str(getattr(x, "dtype", ""))
    return len(shape) > SEQUENCE_AXIS and ("int" in dtype or "bool" in dtype)


def sequence_dims(example_inputs: Sequence[object], max_len: int, min_len: int = 1) -> tuple:
    """``dynamic_shapes`` for ``torch.export``: one ``Dim`` on axis 1 of every sequence input
    (the same ``Dim`` for all of them), ``None`` for the others."""
    import torch

    if not 1 <= min_len <= max_len:
        raise ModelLoadError(f"sequence lengths {min_len}..{max_len}: need 1 <= min <= max")
    seq = torch.export.Dim(DIM_NAME, min=min_len, max=max_len)
    dims = tuple({SEQUENCE_AXIS: seq} if is_sequence_input(x) else None for x in example_inputs)
    if not any(d is not None for d in dims):
        raise ModelLoadError(
            "no sequence input: a dynamic sequence length needs an integer input of rank 2 or "
            f"more (token ids); the inputs are {[tuple(x.shape) for x in example_inputs]}"
        )
    return dims
