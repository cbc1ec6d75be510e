"""Python branches on a tensor's value (``if not torch.isfinite(h).all():``, ``if x.sum() > 0:``,
``if mask.any().item():``), compiled by speculation and checked at every call.

``torch.export`` captures one graph for every input, so it stops at a branch on a value
("Could not guard on data-dependent expression"). When it does, :func:`export_speculating`

1. runs the module once in torch eager on the example inputs, recording under a torch function
   mode what each ``bool(tensor)`` (``Tensor.__bool__``: ``if t``, ``not t``, ``t and u``) and
   each ``.item()`` of a boolean tensor gave, by source line and occurrence;
2. exports it again under a mode that answers each such call with the recorded value (the path
   the example inputs took) and keeps the tensor it was asked about: the condition, as a boolean
   0-d tensor, becomes an extra output of the graph (the *guard*), after the model's own;
3. where the export still stops on a data-dependent value (an ``.item()`` of a number compared
   in Python: ``if x.sum().item() > 0``), once more with every ``.item()`` answered by its
   recorded value, guarded by ``tensor == value``.

The compiled graph then computes exactly what torch computes whenever every guard has its
recorded value; :class:`Guards` checks them after each call. When one differs the call's
result is not used: the model's torch module runs the call in torch eager instead (a warning
the first time, counted in ``stats["speculation_fallbacks"]``), or, where there is no module
(``Options(host_fallback=False)``, a model loaded from disk), :class:`~plus_tvm.errors.
BranchSpeculationError` names the branch's source line. A model without such branches never
comes here: its export succeeds at the first try, and its graph has no extra output.
"""

from __future__ import annotations

import copy
import inspect
import json
import linecache
import os
import sys
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass

import torch
from torch.overrides import TorchFunctionMode

from .errors import ModelLoadError
from .torch_branch_guards import SPECULATED_ATTR, Branch

__all__ = [
    "Speculation",
    "carry_speculation",
    "export_speculating",
    "speculation_of",
    "with_branches",
]

_META = "plus_speculation"  # an exported program's graph_module.meta key: its Speculation
_BOOL = torch.Tensor.__bool__
_ITEM = torch.Tensor.item
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


@dataclass
class Speculation:
    """What an export by speculation adds to an exported program: its branches (one per guard
    output, after the model's outputs), the model's own output structure, and the torch eager
    run of the model for a call whose guards differ (flat tensor inputs -> flat outputs)."""

    branches: list[Branch]
    out_spec: object  # torch.utils._pytree.TreeSpec of the model's own outputs
    fallback: Callable | None


# ---------------------------------------------------------------------------- export
def export_speculating(
    module: torch.nn.Module,
    args: tuple,
    kwargs: dict,
    dynamic_shapes: object,
    run: Callable[[torch.nn.Module, tuple, dict], object],
    eager: Callable[[torch.nn.Module, tuple, dict], object],
) -> torch.export.ExportedProgram | None:
    """The export of ``module`` with its value branches speculated (module docstring), its
    :class:`Speculation` attached (:func:`speculation_of`); None when the example run makes no
    call to speculate on (the export failed for another reason). ``run(module, args, kwargs)``
    exports, ``eager(module, args, kwargs)`` runs torch eager, each in the caller's setting (no
    grad, the cache off); an export that still fails raises its error."""
    recorder = _Recorder()
    with recorder:
        eager(module, args, kwargs)
    if not recorder.seen:
        return None
    for items in ("bool", "all"):
        wrapper, found = _speculating(module, recorder.seen, items)
        try:
            program = run(wrapper, args, kwargs)
            break
        except Exception as err:  # noqa: BLE001 - the user's forward runs here
            if items == "all" or not recorder.numbers or not _data_dependent(err):
                raise  # (no .item() of a number to speculate on either)
    branches = found[-1]
    user_spec = program.call_spec.out_spec.children_specs[0]
    in_spec = program.call_spec.in_spec

    def fallback(flat: list) -> list:
        call_args, call_kwargs = torch.utils._pytree.tree_unflatten(list(flat), in_spec)
        out = eager(module, tuple(call_args), call_kwargs)
        return torch.utils._pytree.tree_leaves(out)

    program.graph_module.meta[_META] = Speculation(branches, user_spec, fallback)
    return program


def speculation_of(program: object) -> Speculation | None:
    """The :class:`Speculation` of an exported program (None: it has none)."""
    return getattr(program, "graph_module", None) and program.graph_module.meta.get(_META)


def carry_speculation(source: object, program: object) -> object:
    """``program`` (a decomposition of ``source``) with ``source``'s speculation, if any."""
    found = speculation_of(source)
    if found is not None:
        program.graph_module.meta[_META] = found
    return program


def with_branches(mod: object, speculation: Speculation | None) -> object:
    """``mod`` carrying its speculated branches (:data:`SPECULATED_ATTR`)."""
    if speculation is None:
        return mod
    return mod.with_attr(SPECULATED_ATTR, json.dumps([asdict(b) for b in speculation.branches]))


def _data_dependent(err: BaseException) -> bool:
    from .torch_export_errors import is_data_dependent

    return is_data_dependent(err)


def _speculating(
    module: torch.nn.Module, seen: Mapping, items: str
) -> tuple[torch.nn.Module, list[list[Branch]]]:
    """A shallow copy of ``module`` (the same submodules and weights; ``module`` itself is not
    changed) whose forward, under :class:`_Speculator`, returns ``(outputs, guards)``; and the
    list each forward appends its branches to."""
    forward = module.forward
    found: list[list[Branch]] = []

    def speculated(*args, **kwargs):
        mode = _Speculator(seen, items)
        with mode:
            out = forward(*args, **kwargs)
        found.append([b for b, _ in mode.guards])
        return out, tuple(g for _, g in mode.guards)

    speculated.__signature__ = inspect.signature(forward)
    wrapper = copy.copy(module)
    wrapper.forward = speculated
    return wrapper, found


def _site() -> tuple[str, str]:
    """``(path:line in function, source line)`` of the innermost frame outside torch and this
    file: the model's line that asked for the value."""
    frame = sys._getframe(1)
    while frame is not None and (
        frame.f_code.co_filename == __file__ or frame.f_code.co_filename.startswith(_TORCH_DIR)
    ):
        frame = frame.f_back
    if frame is None:  # pragma: no cover - a call from torch alone
        return "<torch>", ""
    path = frame.f_code.co_filename
    code = linecache.getline(path, frame.f_lineno).strip()
    shown = path.split(f"site-packages{os.sep}")[-1]
    return f"{shown}:{frame.f_lineno} in {frame.f_code.co_name}", code


def _asks_value(func: object, args: tuple, items: str) -> bool:
    if func is _BOOL:
        return True
    if func is _ITEM and args and isinstance(args[0], torch.Tensor):
        return items == "all" or args[0].dtype == torch.bool
    return False


class _Recorder(TorchFunctionMode):
    """Torch eager on the example inputs: the value each speculated call gives, by site."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[tuple[str, str], list] = {}
        self.numbers = False  # whether an .item() of a non-boolean tensor was asked

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if _asks_value(func, args, "all"):
            self.seen.setdefault(_site(), []).append(out)
            self.numbers = self.numbers or not _asks_value(func, args, "bool")
        return out


class _Speculator(TorchFunctionMode):
    """The export's mode: a speculated call gives its recorded value and keeps its guard."""

    def __init__(self, seen: Mapping, items: str) -> None:
        super().__init__()
        self.seen = seen
        self.items = items
        self.count: Counter = Counter()
        self.guards: list[tuple[Branch, torch.Tensor]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if not _asks_value(func, args, self.items):
            return func(*args, **(kwargs or {}))
        site = _site()
        k = self.count[site]
        self.count[site] += 1
        values = self.seen.get(site, [])
        if k >= len(values):
            raise ModelLoadError(
                f"the model branches on the value of a tensor at {site[0]} (`{site[1]}`), a line "
                "its torch eager run on the example inputs did not reach that often: the branch "
                "cannot be speculated"
            )
        value = values[k]
        tensor = args[0].reshape(())
        if func is _BOOL:
            guard, kind = tensor != 0, "bool"
        elif isinstance(value, float) and value != value:  # NaN: equal to no value
            guard, kind = tensor.isnan(), "item"
        else:
            guard, kind = tensor == value, "item"
        taken = bool(value) if kind == "bool" else True
        self.guards.append((Branch(site[0], site[1], taken, kind), guard))
        return value
