"""Where a model's GPU time goes: its kernels per inference, summed by kind, and the idle gaps.

``gpu_check --profile N`` runs N inferences of each plus variant and each torch peer under
torch.profiler (CUDA activity) and hands the kernels here as plain :class:`KernelEvent` s (name,
start and duration in microseconds), with the time window of each inference. This module knows
nothing of torch: :func:`summarize` classifies the kernels (:func:`classify`), counts and times
them per inference, and measures each inference's busy time (the union of its kernels'
intervals, overlapping kernels counted once) and its idle gaps (between its first kernel's start
and its last kernel's end, where no kernel runs). :func:`profile_table` writes the markdown.

:func:`kernel_events` is the thin glue from ``torch.profiler.profile(...).events()``
(``FunctionEvent`` s: ``name``, ``device_type``, ``time_range`` in microseconds).
"""

from __future__ import annotations

import bisect
import re
import statistics
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from ..errors import PlusError

# the kinds, in the order the table shows them
KINDS = ("gemm", "conv", "attention", "norm", "reduction", "elementwise", "copy", "tir", "other")
MARK = "plus_tvm_inference"  # the record_function range around each profiled inference

_COPY = re.compile(r"^(memcpy|memset)\b|copy|catarray|nchwtonhwc|nhwctonchw", re.I)
_ATTENTION = re.compile(r"fmha|flash|attention|attn|sdpa", re.I)
_CONV = re.compile(r"conv|fprop|dgrad|wgrad|winograd", re.I)
# cuBLAS / cuBLASLt / CUTLASS GEMMs and the helper kernels they launch beside one (split-K
# reduction, epilogue, beta scaling)
_GEMM = re.compile(
    r"gemm|gemv|xmma|cutlass|cublas|splitkreduce|scal_kernel|matmul|(?<![a-z0-9])(add|b)?mm(?![a-z0-9])",
    re.I,
)
_NORM = re.compile(r"(layer|rms|group|batch|instance)_?norm|bn_fw|welford", re.I)
_REDUCTION = re.compile(r"reduce|softmax|pool|argmax|argmin|cub::", re.I)
_ELEMENTWISE = re.compile(r"elementwise|vectorized|unrolled|pointwise", re.I)
# inductor's kernels: triton_<poi|red|per|tem>_fused_<the fused ops>_<n> (tem: a GEMM template)
_TRITON = re.compile(r"^triton_(poi|red|per|tem)_")
# a TVM-generated kernel: ``<PrimFunc name>_kernel`` or ``..._kernel_<n>`` (extern "C", so the
# plain identifier, never a demangled C++ name); the few cuBLAS kernels named that way are not
_TIR_NAME = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)_kernel(_\d+)?$")
_LIBRARY_PLAIN = re.compile(
    r"^(scal|gemmk1|dot|asum|nrm2|axpy|swap|rot|splitKreduce|splitkreduce)_kernel$"
)


class KernelEvent(NamedTuple):
    """One GPU kernel (or copy / memset) as the profiler saw it, in microseconds."""

    name: str
    start_us: float
    duration_us: float


def tir_function(name: str) -> str | None:
    """The TIR PrimFunc a TVM kernel name comes from (``fused_add_kernel_1`` ->
    ``fused_add``), or None where the name is not of that form."""
    m = _TIR_NAME.match(name)
    return m.group(1) if m else None


def classify(name: str, tir_functions: Iterable[str] | None = None) -> str:
    """The kind of a kernel, one of :data:`KINDS`, from its name.

    A TVM kernel is ``tir`` whatever its name says (a TIR ``fused_matmul_add_kernel`` is plus's
    own code, not a library GEMM): a kernel of one of ``tir_functions`` (the variant's TIR
    PrimFunc names, from the bundle's kernel signatures), or any plain identifier
    ``..._kernel`` / ``..._kernel_<n>`` but cuBLAS's few (``scal_kernel``). Inductor's
    kernels by their prefix (``triton_poi_`` elementwise, ``triton_red_`` / ``triton_per_``
    reduction or norm, ``triton_tem_`` GEMM); library kernels by name: copy, attention,
    convolution, GEMM, norm, reduction, elementwise, else ``other``."""
    func = tir_function(name)
    if func is not None:
        if tir_functions is not None and func in set(tir_functions):
            return "tir"
        if not _LIBRARY_PLAIN.match(name):
            return "tir"
    triton = _TRITON.match(name)
    if triton:
        prefix = triton.group(1)
        if prefix == "tem":
            return "gemm"
        if prefix == "poi":
            return "elementwise"
        return "norm" if _NORM.search(name) else "reduction"
    for kind, pattern in (
        ("copy", _COPY),
        ("attention", _ATTENTION),
        ("conv", _CONV),
        ("gemm", _GEMM),
        ("norm", _NORM),
        ("reduction", _REDUCTION),
        ("elementwise", _ELEMENTWISE),
    ):
        if pattern.search(name):
            return kind
    return "other"


def _merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, overlapping or touching intervals merged."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def busy_and_gaps(events: Sequence[KernelEvent]) -> dict:
    """The busy time (union of the kernels' intervals), the span (first start to last end)
    and the idle gaps inside it, in microseconds."""
    merged = _merged([(e.start_us, e.start_us + max(e.duration_us, 0.0)) for e in events])
    if not merged:
        return {"busy_us": 0.0, "span_us": 0.0, "gaps_us": []}
    busy = sum(end - start for start, end in merged)
    gaps = [b[0] - a[1] for a, b in zip(merged, merged[1:])]
    return {"busy_us": busy, "span_us": merged[-1][1] - merged[0][0], "gaps_us": gaps}


def split_inferences(
    events: Sequence[KernelEvent], windows: Sequence[tuple[float, float]] | None
) -> tuple[list[list[KernelEvent]], int]:
    """The kernels of each inference, and how many fell before the first window. Kernel k
    belongs to the last window that starts at or before it (a kernel can end, or by clock
    skew start, after its window's host range); without windows all are one group."""
    if not windows:
        return [list(events)], 0
    starts = sorted(w[0] for w in windows)
    groups: list[list[KernelEvent]] = [[] for _ in starts]
    outside = 0
    for e in events:
        k = bisect.bisect_right(starts, e.start_us) - 1
        if k < 0:
            outside += 1
        else:
            groups[k].append(e)
    return groups, outside


def summarize(
    events: Sequence[KernelEvent],
    inferences: int,
    windows: Sequence[tuple[float, float]] | None = None,
    tir_functions: Iterable[str] | None = None,
) -> dict:
    """The profile of ``inferences`` inferences from their kernels (see the module doc).

    ``windows``: each inference's (start, end) in the events' clock (the host range around
    it, ending after a device synchronisation); without them the kernels are taken as one
    stretch and the gaps include the host's time between inferences. Times per inference
    are means over the inferences, in milliseconds; counts per inference may be fractional
    where inferences differ (a CUDA-graph capture)."""
    if inferences < 1:
        raise PlusError(f"a profile of {inferences} inferences: give at least one")
    tir = set(tir_functions) if tir_functions is not None else None
    groups, outside = split_inferences(events, windows)
    counted = [e for g in groups for e in g]
    per_name: dict[str, list[float]] = {}
    for e in counted:
        per_name.setdefault(e.name, []).append(e.duration_us)
    kernels = sorted(
        (
            {
                "name": name,
                "kind": classify(name, tir),
                "count": len(durs) / inferences,
                "ms": sum(durs) / inferences / 1e3,
            }
            for name, durs in per_name.items()
        ),
        key=lambda k: (-k["ms"], k["name"]),
    )
    kinds = {
        kind: {
            "count": sum(k["count"] for k in kernels if k["kind"] == kind),
            "ms": sum(k["ms"] for k in kernels if k["kind"] == kind),
        }
        for kind in KINDS
    }
    stretches = [busy_and_gaps(g) for g in groups]
    gaps = [g for s in stretches for g in s["gaps_us"]]
    return {
        "inferences": inferences,
        "windows": len(windows) if windows else 0,
        "kernels_per_inference": len(counted) / inferences,
        "kernel_ms": sum(e.duration_us for e in counted) / inferences / 1e3,
        "busy_ms": sum(s["busy_us"] for s in stretches) / inferences / 1e3,
        "span_ms": sum(s["span_us"] for s in stretches) / inferences / 1e3 if windows else None,
        "idle_ms": sum(s["span_us"] - s["busy_us"] for s in stretches) / inferences / 1e3,
        "gaps_per_inference": len(gaps) / inferences,
        "gap_median_us": statistics.median(gaps) if gaps else 0.0,
        "gap_max_us": max(gaps, default=0.0),
        "outside_windows": outside,
        "kinds": kinds,
        "kernels": kernels,
    }


def kernel_events(
    function_events: Iterable, mark: str = MARK
) -> tuple[list[KernelEvent], list[tuple[float, float]]]:
    """The GPU kernels, copies and memsets of torch.profiler's ``prof.events()`` and the
    host windows of the ``record_function(mark)`` ranges, in microseconds.

    A device event is one whose ``device_type`` is CUDA (torch's ``DeviceType`` enum, or
    its name); the GPU-side copies of user annotations (``is_user_annotation``, kineto's
    ``gpu_user_annotation``, or named ``mark``) are not kernels and are left out."""
    kernels, windows = [], []
    for e in function_events:
        device = getattr(e.device_type, "name", str(e.device_type)).rsplit(".", 1)[-1]
        start, end = float(e.time_range.start), float(e.time_range.end)
        if device == "CPU":
            if e.name == mark:
                windows.append((start, end))
            continue
        if device != "CUDA":
            continue
        annotation = getattr(e, "is_user_annotation", False) or (
            getattr(e, "activity_type", None) == "gpu_user_annotation"
        )
        if annotation or e.name == mark:
            continue
        kernels.append(KernelEvent(e.name, start, end - start))
    return kernels, sorted(windows)


def _short(name: str, width: int = 72) -> str:
    """A kernel name for a table cell: C++'s ``void``, ``(anonymous namespace)::`` and the
    trailing argument list dropped, cut to ``width``, pipes escaped."""
    name = re.sub(r"^void ", "", name).replace("(anonymous namespace)::", "")
    if name.endswith(")") and not name.startswith(("Memcpy", "Memset")):
        depth = 0
        for i in range(len(name) - 1, -1, -1):  # the '(' that the last ')' closes
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i]
                break
    if len(name) > width:
        name = name[: width - 3] + "..."
    return name.replace("|", "\\|")


def profile_table(rows: Sequence[tuple[str, dict]], top: int = 8) -> str:
    """Markdown: a summary row per (label, profile) — kernels, busy, idle and the time of
    each kind per inference — then each profile's ``top`` kernels by time."""
    head = "| run | wall ms | kernels | busy ms | idle ms | gaps | max gap us | "
    head += " | ".join(f"{k} ms" for k in KINDS) + " |"
    lines = ["## Per inference", "", head, "|---|" + "---:|" * (6 + len(KINDS))]
    for label, p in rows:
        if "error" in p:
            lines.append(f"| {label} | {p['error']} |" + " |" * (5 + len(KINDS)))
            continue
        wall = p.get("wall_ms")
        cells = [
            f"{wall:.3f}" if wall is not None else "-",
            f"{p['kernels_per_inference']:.1f}",
            f"{p['busy_ms']:.3f}",
            f"{p['idle_ms']:.3f}",
            f"{p['gaps_per_inference']:.1f}",
            f"{p['gap_max_us']:.1f}",
        ]
        cells += [f"{p['kinds'][k]['ms']:.3f}" if p["kinds"][k]["count"] else "-" for k in KINDS]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", f"## Top {top} kernels by time", ""]
    lines += ["| run | kernel | kind | per inference | ms |", "|---|---|---|---:|---:|"]
    for label, p in rows:
        for k in p.get("kernels", [])[:top]:
            lines.append(
                f"| {label} | `{_short(k['name'])}` | {k['kind']} | {k['count']:g} "
                f"| {k['ms']:.4f} |"
            )
    return "\n".join(lines)
