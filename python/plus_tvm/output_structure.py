"""The structure of a model's outputs, and their names: what ``CompiledModel`` rebuilds around
the flat tensors the compiled code returns.

A compiled model returns a flat list of tensors; torch eager returns them in the structure the
model's ``forward`` built (a transformers ``ModelOutput``, a dict, a nested tuple). The structure
is kept as plain JSON (it travels in an exported model's ``.json`` and needs no torch to read):

- ``{"kind": "leaf"}``: one output;
- ``{"kind": "tuple" | "list", "items": [...]}``;
- ``{"kind": "dict", "keys": [...], "items": [...]}``;
- ``{"kind": "record", "class": "module:QualName", "keys": [...], "items": [...]}``: a dataclass
  (``ModelOutput``) or a namedtuple, rebuilt as that class where its module is already imported,
  else as :class:`NamedOutputs` (same keys, attribute and index access).

Each output also has a name (:func:`leaf_names`): the key path (``logits``, ``b.0``) or, for
positions at the top, ``output0``, ``output1``...
"""

from __future__ import annotations

import dataclasses
import sys
from collections import OrderedDict

LEAF = {"kind": "leaf"}


class NamedOutputs(OrderedDict):
    """Outputs by name, as a transformers ``ModelOutput`` gives them: ``out.logits``,
    ``out["logits"]``, ``out[0]`` (by position) and ``out.to_tuple()``."""

    def __getattr__(self, name: str) -> object:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"the model has no output {name!r}; it has {list(self)}") from None

    def __getitem__(self, key: object) -> object:
        if isinstance(key, (int, slice)):
            return self.to_tuple()[key]
        return super().__getitem__(key)

    def to_tuple(self) -> tuple:
        return tuple(self.values())


def from_treespec(spec: object) -> dict | None:
    """The structure of ``spec`` (a ``torch.utils._pytree.TreeSpec``, as an exported program's
    ``call_spec.out_spec``); None where a node is of a kind this module cannot rebuild."""
    if spec.is_leaf():
        return dict(LEAF)
    kind = spec.type
    children = [from_treespec(c) for c in spec.children_specs]
    if any(c is None for c in children):
        return None
    if kind in (tuple, list):
        return {"kind": kind.__name__, "items": children}
    keys = spec.context
    if isinstance(kind, type) and issubclass(kind, dict) and _string_keys(keys, children):
        if kind in (dict, OrderedDict):
            return {"kind": "dict", "keys": list(keys), "items": children}
        return _record(kind, list(keys), children)  # a ModelOutput (an OrderedDict subclass)
    if isinstance(keys, type) and issubclass(keys, tuple) and hasattr(keys, "_fields"):
        return _record(keys, list(keys._fields), children)  # a namedtuple: the class
    if dataclasses.is_dataclass(kind) and _string_keys(keys, children):
        return _record(kind, list(keys), children)
    return None


def _string_keys(keys: object, children: list) -> bool:
    return (
        isinstance(keys, (list, tuple))
        and len(keys) == len(children)
        and all(isinstance(k, str) for k in keys)
    )


def _record(cls: type, keys: list[str], children: list) -> dict:
    name = f"{cls.__module__}:{cls.__qualname__}"
    return {"kind": "record", "class": name, "keys": keys, "items": children}


def flat(count: int) -> dict:
    """The structure of ``count`` outputs returned as they are: one tensor, or a tuple."""
    return dict(LEAF) if count == 1 else {"kind": "tuple", "items": [dict(LEAF)] * count}


def leaf_count(struct: dict) -> int:
    if struct["kind"] == "leaf":
        return 1
    return sum(leaf_count(c) for c in struct["items"])


def leaf_names(struct: dict) -> list[str]:
    """The name of each output, in the flat order: key paths joined by ``.``; a position at the
    top is ``output{i}`` (one tensor alone: ``output0``)."""
    names: list[str] = []

    def visit(node: dict, path: str) -> None:
        if node["kind"] == "leaf":
            names.append(path or "output0")
            return
        keys = node.get("keys") or [str(i) for i in range(len(node["items"]))]
        for key, child in zip(keys, node["items"]):
            top = f"output{key}" if "keys" not in node else key
            visit(child, f"{path}.{key}" if path else top)

    visit(struct, "")
    return names


def check(struct: object) -> dict:
    """``struct`` read from a file, checked (ValueError / KeyError / TypeError if malformed)."""
    if not isinstance(struct, dict):
        raise TypeError(f"an output structure is a dict, got {type(struct).__name__}")
    kind = struct["kind"]
    if kind == "leaf":
        return dict(LEAF)
    if kind not in ("tuple", "list", "dict", "record"):
        raise ValueError(f"unknown output kind {kind!r}")
    items = [check(c) for c in struct["items"]]
    out: dict = {"kind": kind, "items": items}
    if kind in ("dict", "record"):
        keys = [str(k) for k in struct["keys"]]
        if len(keys) != len(items):
            raise ValueError(f"{len(keys)} keys for {len(items)} outputs")
        out["keys"] = keys
    if kind == "record":
        out["class"] = str(struct["class"])
    return out


def rebuild(struct: dict, leaves: list) -> object:
    """``leaves`` (the flat outputs, :func:`leaf_count` of them) in the structure ``struct``."""
    it = iter(leaves)

    def build(node: dict) -> object:
        kind = node["kind"]
        if kind == "leaf":
            return next(it)
        items = [build(c) for c in node["items"]]
        if kind == "tuple":
            return tuple(items)
        if kind == "list":
            return items
        pairs = dict(zip(node["keys"], items))
        if kind == "dict":
            return pairs
        return _instance(node["class"], pairs)

    return build(struct)


def _instance(name: str, pairs: dict) -> object:
    """The record class ``name`` built from ``pairs`` where its module is imported already (a
    deployed model imports nothing for it), else :class:`NamedOutputs`."""
    module, _, qualname = name.partition(":")
    cls = sys.modules.get(module)
    for part in qualname.split("."):
        cls = getattr(cls, part, None)
    if isinstance(cls, type):
        try:
            if issubclass(cls, tuple) and hasattr(cls, "_fields"):
                return cls(**pairs)
            if dataclasses.is_dataclass(cls):
                return cls(**pairs)
        except (TypeError, ValueError):  # a class changed since: the names still hold
            pass
    return NamedOutputs(pairs)
