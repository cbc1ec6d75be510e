"""Implementation binders: warehouse implementation name -> function building the library
call for a matched subgraph (``None``: this implementation cannot express it)."""

from __future__ import annotations

import importlib
import pkgutil

from .common import CallSettings, Ctx, LibraryCall


def _collect() -> dict:
    """The ``BINDS`` tables (implementation name -> binder) of every module of this package."""
    binders: dict = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for name, fn in getattr(module, "BINDS", {}).items():
            if name in binders:
                raise RuntimeError(f"two binders for the implementation {name}")
            binders[name] = fn
    return binders


BINDERS = _collect()

__all__ = ["BINDERS", "CallSettings", "Ctx", "LibraryCall"]
