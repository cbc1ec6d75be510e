"""Weights held once by several compiled models of one torch module (the prefill and decode
steps of a :class:`plus_tvm.lm.CompiledLM`).

Each :func:`plus_tvm.compile` copies the weights it imports, and a compiled model passes them to
its executable as run-time parameters. Two compiles of one module therefore hold every weight
twice; :func:`share_weights` makes them hold one buffer per weight, which both executables take
as their parameter. A library's packed form of a weight (oneDNN's blocked layout, cached by the
buffer's address, ``plus_tvm.runtime``) is then shared as well where the layout is the same.

Two weights are the same weight when they came from the same torch tensor (storage, shape,
strides, dtype, device) at the same version, or, for a weight without a torch tensor behind it,
when their values are equal (dtype, shape and bytes).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from .compiled_model import CompiledModel, WeightSource, place, storage_key
from .signature import as_numpy


def share_weights(models: Sequence[CompiledModel]) -> None:
    """Make ``models`` hold each weight they have in common once: one object for all of them,
    on a device present here placed there now (on the CPU the host copy is not kept beside it),
    on one that is not (a compile-only CUDA model) the host array. Tied weights of one model
    stay one buffer; each model still follows in-place updates of its torch tensors."""
    pool: dict[tuple, object] = {}
    for model in models:
        device = model.device
        present = bool(device.exist)
        where = (device.dlpack_device_type(), device.index, present)
        shared = []
        for weight, source, version in model.weight_entries():
            key = (where, _identity(weight, source, version))
            if key not in pool:
                pool[key] = place(weight, device) if present else weight
            shared.append(pool[key])
        model.use_weights(shared)


def _identity(weight: object, source: WeightSource | None, version: int) -> tuple:
    """What makes two weights the same: their torch tensor at a version, else their values."""
    tensor = getattr(source, "tensor", None)
    if tensor is not None and hasattr(tensor, "data_ptr"):
        return ("tensor", storage_key(tensor), version)
    value = np.ascontiguousarray(as_numpy(weight))
    digest = hashlib.blake2b(value.view(np.uint8).reshape(-1), digest_size=32).hexdigest()
    return ("value", str(value.dtype), tuple(value.shape), digest)


def held_weights(models: Sequence[CompiledModel]) -> dict[str, int]:
    """The weight buffers ``models`` hold together (host arrays and device copies), each
    buffer counted once however many weights and models use it: ``{"tensors", "bytes"}``."""
    buffers: dict[tuple, int] = {}
    for model in models:
        buffers.update(model.weight_buffers())
    return {"tensors": len(buffers), "bytes": sum(buffers.values())}
