"""Positional and keyword inputs bound to a compiled model's inputs, as Python binds a call.

A compiled model behaves like ``def model(name0, name1, ...)`` over its input names (the torch
module's argument and keyword names as ``torch.export`` flattened them, or the ONNX graph's input
names): positions fill the first names, keywords any name, and a name given twice, a name the
model does not have, an input left out or too many positions is an :class:`InputError` that
names it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .errors import InputError


def bind(names: Sequence[str], args: Sequence, kwargs: Mapping[str, object]) -> tuple:
    """``args`` and ``kwargs`` as one tuple in the order of ``names``."""
    if not kwargs:
        return tuple(args)  # (the count is checked with the shapes, naming every input)
    listed = ", ".join(names)
    if len(args) > len(names):
        raise InputError(
            f"model takes {len(names)} input(s) ({listed}), got {len(args)} positional and "
            f"{len(kwargs)} keyword"
        )
    bound: dict[str, object] = dict(zip(names, args))
    for key, value in kwargs.items():
        if key not in names:
            raise InputError(f"model has no input named {key!r}; its inputs are {listed}")
        if key in bound:
            raise InputError(f"input {key!r} given twice (by position and by keyword)")
        bound[key] = value
    missing = [n for n in names if n not in bound]
    if missing:
        raise InputError(
            f"missing input(s) {', '.join(repr(n) for n in missing)}; the model's inputs are "
            f"{listed}"
        )
    return tuple(bound[n] for n in names)
