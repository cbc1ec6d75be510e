"""A compiled model's speculated branches at run time (:mod:`plus_tvm.torch_branch_speculation`
compiles them): the guard outputs that end each call's results are split off and compared with
the values the compiled path assumes; a call where one differs runs in torch eager (counted in
``stats["speculation_fallbacks"]``, a warning the first time) or, without a torch module, is a
:class:`~plus_tvm.errors.BranchSpeculationError` naming the branch's line. Torch is imported
only to run such a call."""

from __future__ import annotations

import json
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass

from .errors import BranchSpeculationError

__all__ = ["SPECULATED_ATTR", "Branch", "Guards", "speculated_branches"]

# the speculated branches of an imported module (a JSON list of Branch dicts, in the order of
# the guard outputs that end ``main``'s outputs); ``stats["speculated_branches"]`` after compile
SPECULATED_ATTR = "plus.speculated_branches"


@dataclass(frozen=True)
class Branch:
    """One speculated call: where (``path:line in function``), its source line, and the value
    of its guard (the condition tensor) that the compiled path assumes."""

    site: str
    code: str
    taken: bool
    kind: str = "bool"  # "bool": bool(tensor) gave ``taken``; "item": tensor.item() its value

    def describe(self) -> str:
        return f"{self.site} (`{self.code}`)"

    def differs(self) -> str:
        """What a call where its guard differs did differently."""
        if self.kind == "item":
            return "a tensor's .item() gave another value than on the example inputs"
        return (
            f"bool() of the tensor it tests gave {not self.taken}, {self.taken} on the example "
            "inputs the model was compiled with"
        )


def speculated_branches(mod: object) -> list[dict]:
    """The speculated branches of an imported Relax module (``[]``: none)."""
    text = mod.attrs.get(SPECULATED_ATTR) if mod.attrs is not None else None
    return json.loads(str(text)) if text is not None else []


class Guards:
    """A compiled model's speculated branches at run time: the guard outputs split off each
    call's results and checked (module docstring)."""

    def __init__(self, branches: list[dict], stats: dict, fallback: Callable | None) -> None:
        self.branches = [Branch(**b) for b in branches]
        self.stats = stats
        self.fallback = fallback
        self._lock = threading.Lock()
        self._warned = False
        stats.setdefault("speculation_fallbacks", 0)

    @classmethod
    def of(cls, stats: object, source: object, host_fallback: bool) -> Guards | None:
        """The guards of a compiled model (None: it speculated on no branch)."""
        branches = stats.get("speculated_branches") if isinstance(stats, dict) else None
        if not branches:
            return None
        found = (getattr(source, "extra", None) or {}).get("speculation")
        fallback = found.fallback if found is not None and host_fallback else None
        return cls(branches, stats, fallback)

    def split(self, leaves: list) -> tuple[list, list[Branch]]:
        """The model's own outputs, and the branches whose guard differs from its speculation."""
        n = len(self.branches)
        own, guards = leaves[: len(leaves) - n], leaves[len(leaves) - n :]
        missed = [b for b, g in zip(self.branches, guards) if _truth(g) != b.taken]
        return own, missed

    def rerun(self, missed: list[Branch], inputs: list, own: list) -> list:
        """The call's outputs from torch eager (torch tensors, in the dtypes of the compiled
        outputs ``own``: a model compiled in reduced precision), or the error naming the
        branch."""
        first = missed[0]
        what = f"the branch at {first.describe()} went another way: {first.differs()}"
        if self.fallback is None:
            raise BranchSpeculationError(
                f"{what}; the compiled path does not hold for these inputs, and there is no torch "
                "module to run them (Options(host_fallback=False), or a model loaded from disk)"
            )
        with self._lock:
            self.stats["speculation_fallbacks"] = int(self.stats["speculation_fallbacks"]) + 1
            warn, self._warned = not self._warned, True
        if warn:
            warnings.warn(
                f"{what}: this call runs in torch eager (counted in "
                "stats['speculation_fallbacks'])",
                RuntimeWarning,
                stacklevel=4,
            )
        import torch

        tensors = [torch.as_tensor(x) if not isinstance(x, torch.Tensor) else x for x in inputs]
        with torch.no_grad():
            eager = self.fallback(tensors)
        if len(eager) != len(own):
            raise BranchSpeculationError(
                f"{what}; torch eager returned {len(eager)} outputs for the compiled model's "
                f"{len(own)}"
            )
        return [_like(t, o) for t, o in zip(eager, own)]


def _truth(leaf: object) -> bool:
    value = leaf.numpy() if hasattr(leaf, "numpy") else leaf
    return bool(value)


def _like(tensor: object, compiled: object) -> object:
    """``tensor`` (torch eager's) in the dtype of the compiled output it stands for."""
    import torch

    dtype = getattr(torch, str(getattr(compiled, "dtype", "")), None)
    if isinstance(tensor, torch.Tensor) and isinstance(dtype, torch.dtype):
        return tensor.to(dtype)
    return tensor
