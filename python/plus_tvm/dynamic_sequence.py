"""A text model with a symbolic sequence length: one compile for every length up to a bound.

The Relax paper's point is that shapes stay symbolic end to end. For a torch text model this
means exporting with a ``torch.export.Dim`` on axis 1 of its token inputs (ids, attention
masks, token types: the integer inputs of rank 2 or more); the importer turns it into a
Relax shape variable bounded by the ``Dim``'s ``min`` and ``max`` (which memory planning and
:class:`~plus_tvm.passes.ProveSlicesInbound` use). :func:`sequence_dims` builds the
``dynamic_shapes`` argument, :func:`load_dynamic_sequence` re-imports a loaded torch model
that way, and :func:`inputs_at` makes inputs of another length from the example inputs.

    from plus_tvm.dynamic_sequence import load_dynamic_sequence, inputs_at
    loaded = load_dynamic_sequence(plus_tvm.loader.load_model("zoo:bert-base"), max_len=512)
    cm = plus_tvm.compile(loaded)
    cm(*inputs_at(loaded.example_inputs, 17))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from .errors import ModelLoadError
from .frontend import export_torch
from .loader import LoadedModel, load_model
from .sequence_axis import DIM_NAME, SEQUENCE_AXIS, is_sequence_input, sequence_dims

__all__ = [
    "DIM_NAME",
    "SEQUENCE_AXIS",
    "inputs_at",
    "is_sequence_input",
    "load_dynamic_sequence",
    "sequence_dims",
]


def load_dynamic_sequence(
    loaded: LoadedModel, max_len: int, min_len: int = 1, *, host_fallback: bool = True
) -> LoadedModel:
    """``loaded`` (a torch or zoo model) exported again with a symbolic sequence length.

    ``host_fallback`` is :class:`~plus_tvm.options.Options`' setting, as
    :func:`~plus_tvm.loader.load_model` takes it: on, a torch op without a converter runs on
    the host through torch eager; off, it is an
    :class:`~plus_tvm.errors.UnsupportedOperatorError` naming the op and the node (a static
    compile's refusal)."""
    if loaded.torch_module is None or loaded.example_inputs is None:
        raise ModelLoadError(
            f"{loaded.name}: a dynamic sequence length needs the torch module and its example "
            "inputs (a torch or zoo model)"
        )
    args = tuple(loaded.example_inputs)
    dims = sequence_dims(args, max_len, min_len)
    try:
        program = export_torch(loaded.torch_module, args, dynamic_shapes=dims)
    except ModelLoadError as err:
        raise ModelLoadError(
            f"{loaded.name}: no symbolic sequence length {min_len}..{max_len}: {err} (the model "
            "may not accept every length in that range, e.g. a position table shorter than "
            f"{max_len}: try a smaller maximum)"
        ) from err
    dynamic = load_model(program, host_fallback=host_fallback)
    return dataclasses.replace(
        dynamic,
        name=loaded.name,
        torch_module=loaded.torch_module,
        example_inputs=loaded.example_inputs,
        source=loaded.source,
        extra={**loaded.extra, "max_seq_len": max_len},
    )


def inputs_at(example_inputs: Sequence[object], length: int, seed: int = 0) -> tuple:
    """The example inputs at sequence length ``length`` (numpy arrays): sequence inputs are
    drawn from their own example values (valid token ids; a mask of ones stays ones), the other
    inputs are kept."""
    rng = np.random.default_rng(seed)
    out = []
    for x in example_inputs:
        arr = np.asarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x)
        if is_sequence_input(arr):
            shape = list(arr.shape)
            shape[SEQUENCE_AXIS] = length
            arr = rng.choice(arr.reshape(-1), size=shape).astype(arr.dtype)
        out.append(np.ascontiguousarray(arr))
    return tuple(out)
