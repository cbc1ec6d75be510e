"""Does a CUDA graph pay? The compile-time estimate of ``cuda_graph=auto`` (PyGraph 4.3).

Without a GPU the decision is an estimate from the IR: a region's kernels and library calls
each cost a launch from the host when they run without a graph, while its replay costs one
graph launch (and the call into ``plus.cuda_graph.run_or_capture``) plus a little per node.
The staging copies that capture needed (``StageGraphInputs`` / ``StageGraphOutputs``) are paid
per call whatever the regions do, so a function keeps its graphs only when the kept regions
save more than its copies cost. On the GPU the first call measures each kept region with and
without its graph and keeps the faster (``plus_tvm.runtime.cuda_graph``).

**Where the figures come from.** A GPU measures them (``plus_tvm.gpu.calibrate_graph``, run
from a GPU bundle with ``run.sh OUT --calibrate``): one calibration per GPU model, written as a
JSON file keyed by the GPU's name (``torch.cuda.get_device_name``). The package ships the
calibrations made so far in ``data/graph_costs.json`` (:data:`DATA_FILE`; ``python -m
plus_tvm.gpu.calibrate_graph add FILE`` merges a new one in). A compile for a CUDA target uses
(``Options.cuda_graph_costs``, resolved when compilation starts,
:func:`resolve_graph_costs`):

- ``"auto"``: the calibration of the target's GPU: the entry matching the target's ``model``
  attribute where it has one, else the entries of the target's ``arch`` (the newest where
  several GPUs share it); none: the constants;
- a GPU name: that entry (an error when the file has none);
- ``"constants"``: :class:`GraphCost`'s defaults below, the launch costs the PyGraph paper
  reports (5-10 us per kernel launched from the host, section 1) and the crossing into a Python
  library kernel measured on this project's CPU (10-15 us).

``Options.cuda_graph_costs_file`` names another calibration file (the one a GPU run wrote). The
selection records which figures it used (``stats["cuda_graph"]["selection"]["costs"]``).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import re
from dataclasses import dataclass, fields

from ..errors import PlusError

#: the calibrations shipped with the package
DATA_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "graph_costs.json")
FORMAT = "plus_tvm.graph_costs/1"
CONSTANTS = "constants"
AUTO = "auto"
#: the figures every calibration entry gives (GraphCost's fields)
FIGURES = (
    "kernel_launch_us",
    "library_call_us",
    "graph_launch_us",
    "node_us",
    "copy_bytes_per_us",
)
#: figures that may be zero (a replayed node can cost nothing measurable); the rest must be > 0
_MAY_BE_ZERO = ("node_us",)
_ARCH = re.compile(r"^sm_\d+a?$")


class GraphCostError(PlusError):
    """A CUDA-graph calibration file that cannot be read, or an entry that is not there or not
    valid (the message names the file and the entry)."""


@dataclass(frozen=True)
class GraphCost:
    """Per-replay costs in microseconds (and bytes per microsecond for copies), and where they
    came from (``source``: ``"constants"`` or ``"calibration"``; ``gpu``, ``file``, ``date``
    of a calibration)."""

    kernel_launch_us: float = 5.0  # VM dispatch + cuLaunchKernel of one generated kernel
    library_call_us: float = 12.0  # VM -> Python -> torch/cuBLAS crossing of a library kernel
    graph_launch_us: float = 8.0  # cudaGraphLaunch + the plus.cuda_graph call from the VM
    node_us: float = 0.1  # per captured node on replay
    copy_bytes_per_us: float = 1.0e6  # device-to-device copy, about 1 TB/s
    source: str = CONSTANTS
    gpu: str | None = None
    file: str | None = None
    date: str | None = None

    def region_saving_us(self, kernels: int, library_calls: int) -> float:
        """Host time a replayed region saves per call (negative: the graph costs more)."""
        launched = kernels * self.kernel_launch_us + library_calls * self.library_call_us
        return launched - self.graph_launch_us - (kernels + library_calls) * self.node_us

    def staging_us(self, copied_bytes: list[int]) -> float:
        """Per call cost of the staging copies (one launch and the bytes each)."""
        return sum(self.kernel_launch_us + n / self.copy_bytes_per_us for n in copied_bytes)

    def describe(self) -> dict[str, object]:
        """The figures and their origin, for the stats (JSON)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_entry(cls, name: str, entry: dict, path: str) -> GraphCost:
        """The costs of a validated calibration entry (:func:`read_calibrations`)."""
        figures = {k: float(entry[k]) for k in FIGURES}
        return cls(**figures, source="calibration", gpu=name, file=path, date=entry["date"])


def read_calibrations(path: str | None = None) -> dict[str, dict]:
    """The entries of a calibration file (default :data:`DATA_FILE`) by GPU name, validated:
    every entry has an ``arch`` (``sm_NN``), a ``date`` (``YYYY-MM-DD``) and the
    :data:`FIGURES` as finite numbers, positive (``node_us`` may be 0). Raises
    :class:`GraphCostError` naming the file, the entry and the field."""
    path = path or DATA_FILE
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as err:
        raise GraphCostError(f"{path}: cannot read the CUDA-graph calibration: {err}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise GraphCostError(f"{path}: not a JSON CUDA-graph calibration: {err}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise GraphCostError(
            f"{path}: not a CUDA-graph calibration of format {FORMAT!r} (found {found!r})"
        )
    if data.get("dry"):
        raise GraphCostError(
            f"{path}: a dry run's output (measured on the CPU, no CUDA graphs): not a "
            "calibration; run `run.sh OUT --calibrate` on the GPU machine"
        )
    gpus = data.get("gpus")
    if not isinstance(gpus, dict):
        raise GraphCostError(f"{path}: 'gpus' must map GPU names to entries, got {gpus!r}")
    for name, entry in gpus.items():
        problem = _entry_problem(entry)
        if problem:
            raise GraphCostError(f"{path}: entry {name!r}: {problem}")
    return gpus


def _entry_problem(entry: object) -> str | None:
    if not isinstance(entry, dict):
        return f"must be an object, got {type(entry).__name__}"
    for key in FIGURES:
        if key not in entry:
            return f"missing {key!r}"
        value = entry[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{key} must be a number, got {value!r}"
        low_ok = key in _MAY_BE_ZERO
        if not math.isfinite(value) or value < 0 or (value == 0 and not low_ok):
            need = "non-negative" if low_ok else "positive"
            return f"{key} must be a finite {need} number, got {value!r}"
    arch = entry.get("arch")
    if not isinstance(arch, str) or not _ARCH.match(arch):
        return f"arch must be a CUDA architecture such as 'sm_90', got {arch!r}"
    date = entry.get("date")
    try:
        datetime.date.fromisoformat(date)
    except (TypeError, ValueError):
        return f"date must be YYYY-MM-DD, got {date!r}"
    return None


def _norm(text: str) -> str:
    return re.sub(r"[^0-9a-z]", "", text.lower())


def match_gpu(entries: dict[str, dict], arch: str | None, model: str | None) -> str | None:
    """The entry for a target: with ``model`` (the target's ``model`` attribute), the entries
    whose name contains it (letters and digits, any case: ``h200`` matches ``NVIDIA H200``),
    else the entries of ``arch``; the newest of those (by date, then name); None if none."""
    if model:
        found = [n for n, e in entries.items() if _norm(model) and _norm(model) in _norm(n)]
        found = [n for n in found if not arch or entries[n]["arch"] == arch]
    else:
        found = [n for n, e in entries.items() if arch and e["arch"] == arch]
    if not found:
        return None
    return max(found, key=lambda n: (entries[n]["date"], n))


def target_gpu(target: object) -> tuple[str | None, str | None]:
    """(``arch``, ``model``) of a ``tvm.target.Target`` (None where it has none)."""
    attrs = getattr(target, "attrs", None) or {}
    arch, model = attrs.get("arch"), attrs.get("model")
    return (str(arch) if arch else None, str(model) if model else None)


def resolve_graph_costs(target: object, choice: str, path: str | None) -> str:
    """``Options.cuda_graph_costs`` resolved for a CUDA ``target``: ``"constants"``, or the
    name of the calibration entry the compile uses (``"auto"``: :func:`match_gpu`, the
    constants where nothing matches; a name: checked to be in the file)."""
    if choice == CONSTANTS:
        return CONSTANTS
    entries = read_calibrations(path)
    if choice == AUTO:
        return match_gpu(entries, *target_gpu(target)) or CONSTANTS
    _check_named(choice, entries, path)
    return choice


def _check_named(choice: str, entries: dict[str, dict], path: str | None) -> None:
    if choice not in entries:
        raise GraphCostError(
            f"{path or DATA_FILE}: no CUDA-graph calibration for GPU {choice!r} "
            f"(calibrated: {sorted(entries) or 'none'}); cuda_graph_costs takes 'auto', "
            "'constants' or one of those names"
        )


def graph_cost(choice: str, path: str | None = None) -> GraphCost:
    """The costs a resolved ``Options.cuda_graph_costs`` names (``"auto"`` unresolved, as on a
    target that is not CUDA: the constants)."""
    if choice in (CONSTANTS, AUTO):
        return GraphCost()
    entries = read_calibrations(path)
    _check_named(choice, entries, path)
    return GraphCost.from_entry(choice, entries[choice], path or DATA_FILE)


def add_calibration(source: str, into: str | None = None) -> list[str]:
    """Merge the entries of the calibration file ``source`` (a GPU run's ``graph_costs.json``)
    into ``into`` (default :data:`DATA_FILE`), replacing entries of the same GPU; both are
    validated first. Returns the names added."""
    into = into or DATA_FILE
    new = read_calibrations(source)
    old = read_calibrations(into) if os.path.exists(into) else {}
    from ..output_files import write_bytes

    merged = {"format": FORMAT, "gpus": dict(sorted({**old, **new}.items()))}
    write_bytes(into, (json.dumps(merged, indent=1) + "\n").encode())  # whole or not at all
    return sorted(new)
