"""Readable renderings of the stats dict: a text table for terminals, HTML for notebooks."""

from __future__ import annotations

import html
from collections import Counter

_SUMMARY_KEYS = (
    "model",
    "target",
    "pipeline",
    "ops",
    "kernels",
    "fusion_ratio",
    "library_calls",
    "compile_s",
)


def stats_text(stats: dict) -> str:
    """The summary fields as aligned ``key  value`` lines."""
    width = max(len(k) for k in _SUMMARY_KEYS)
    lines = [f"{k:<{width}}  {_fmt(stats.get(k))}" for k in _SUMMARY_KEYS if k in stats]
    if stats.get("patterns"):
        pats = ", ".join(f"{k}={v}" for k, v in sorted(stats["patterns"].items()))
        lines.append(f"{'patterns':<{width}}  {pats}")
    for node in stats.get("host_nodes") or ():
        lines.append(f"{'on the host':<{width}}  {node}")
    for b in stats.get("speculated_branches") or ():  # (torch_branch_guards)
        taken = "its value on the example inputs" if b.get("kind") == "item" else b["taken"]
        lines.append(f"{'speculated':<{width}}  {b['site']} (`{b['code']}`): {taken}")
    if stats.get("speculated_branches"):
        lines.append(f"{'fallbacks':<{width}}  {stats.get('speculation_fallbacks', 0)} calls")
    graph = stats.get("cuda_graph")
    if graph and not graph.get("enabled", True):
        lines.append(f"{'cuda_graph':<{width}}  off in this build (cuda_graph=off)")
    elif graph and "error" not in graph:
        why = Counter(o["reason"] for o in graph["outside"])
        outside = ", ".join(f"{n} {reason}" for reason, n in why.most_common()) or "none"
        mode = graph["mode"]
        lines.append(
            f"{'cuda_graph':<{width}}  {graph['kernels_captured']}/{graph['kernels']} kernels in "
            f"{graph['regions']} region(s) ({mode});"
            f" outside: {outside}; {graph.get('staging_copies', 0)} staging copies, "
            f"{graph.get('bytes_staged_per_replay', 0)} bytes per replay"
        )
    elif graph:
        lines.append(f"{'cuda_graph':<{width}}  {graph['error']}")
    schedule = stats.get("schedule") or {}
    if schedule.get("scheduled"):
        done = ", ".join(f"{r}={n}" for r, n in sorted(schedule["scheduled"].items()))
        lines.append(f"{'scheduled':<{width}}  {done}")
    for rule, reasons in sorted((schedule.get("declined_because") or {}).items()):
        why = "; ".join(f"{n} {reason}" for reason, n in Counter(reasons).most_common())
        lines.append(f"{'declined':<{width}}  {rule}: {why}")
    for failure in schedule.get("failed") or ():
        lines.append(
            f"{'rule failed':<{width}}  {failure['rule']} on {failure['kernel']}: "
            f"{failure['error']}"
        )
    lines += _plan_lines(schedule.get("notes") or {}, width)
    lines += _decision_lines((stats.get("dispatch") or {}).get("decisions") or (), width)
    fusion = stats.get("fusion_cost")
    if fusion:
        lines.append(
            f"{'fusion cost':<{width}}  TIR kernels predicted {fusion['predicted_us']:g} us "
            f"(eq. 8's plan: {fusion['eq8_plan_us']:g} us) over {fusion['blocks']} block(s)"
            + (f", {fusion['eq8_blocks']} priced by eq. 8" if fusion.get("eq8_blocks") else "")
        )
    inputs = _inputs_text(stats.get("options") or {})
    if inputs:
        lines.append(f"{'inputs':<{width}}  {inputs}")
    return "\n".join(lines)


def _plan_lines(notes: dict, width: int, most: int = 8) -> list[str]:
    """GIR plans a learned ranker picked (``schedule.notes``): how many kernels, and those
    where it departs from the performance model's best, with both predictions."""
    ranked = {k: n for k, n in notes.items() if n.get("ranked_by") == "learned"}
    if not ranked:
        return []
    moved = {k: n for k, n in ranked.items() if n["gir_plan"] != n["plans"][0]["params"]}
    lines = [
        f"{'GIR plans':<{width}}  {len(ranked)} kernel(s) ranked by the learned model, "
        f"{len(moved)} away from the performance model's best"
    ]
    for kernel, n in sorted(moved.items())[:most]:
        first = n["plans"][0]
        pick = next(e for e in n["plans"] if e["params"] == n["gir_plan"])
        lines.append(
            f"{'GIR plan':<{width}}  {kernel}: {pick['params']} predicted "
            f"{pick['predicted_us']:g} us, not {first['params']} ({first['predicted_us']:g} us)"
        )
    if len(moved) > most:
        lines.append(f"{'GIR plan':<{width}}  ... {len(moved) - most} more (stats['schedule'])")
    return lines


def _decision_lines(decisions: object, width: int, most: int = 12) -> list[str]:
    """The dispatcher's priced choices, alike ones counted once: predicted library and TIR
    microseconds and what was chosen."""
    alike = Counter(
        (d["entry"], d["kernel"], d["library_us"], d["tir_us"], d["chosen"], d["model"])
        for d in decisions
    )
    lines = []
    for (entry, kernel, lib, tir, chosen, model), n in alike.most_common(most):
        times = f"library {lib:g} us, TIR {tir:g} us ({model})"
        lines.append(f"{'priced':<{width}}  {entry} -> {kernel}: {times} -> {chosen} x{n}")
    if len(alike) > most:
        lines.append(f"{'priced':<{width}}  ... {len(alike) - most} more (stats['dispatch'])")
    return lines


def _inputs_text(options: dict) -> str:
    """The compile inputs read from the machine and the environment (``resolve_inputs``)."""
    parts = []
    if options.get("threads"):
        parts.append(f"threads={options['threads']}")
    if options.get("gir_global_gbps"):
        parts.append(
            f"GIR bandwidth {options['gir_global_gbps']:.1f} / "
            f"{options.get('gir_cache_gbps', 0.0):.1f} GB/s"
            + (
                f", pool launch {options['gir_launch_us']:g} us"
                if options.get("gir_launch_us")
                else ""
            )
        )
    if options.get("cost_model_id"):
        parts.append(f"cost model {options['cost_model_id']} ({options.get('cost_model_file')})")
    if options.get("warehouse_env"):
        parts.append("PLUS_TVM_WAREHOUSE=" + ",".join(options["warehouse_env"]))
    return ", ".join(parts)


def stats_html(stats: dict, max_groups: int = 50) -> str:
    """A summary table and the fused groups (first ``max_groups``) as an HTML fragment."""
    rows = "".join(
        f"<tr><th style='text-align:left'>{html.escape(k)}</th>"
        f"<td>{html.escape(_fmt(stats[k]))}</td></tr>"
        for k in _SUMMARY_KEYS
        if k in stats
    )
    parts = [f"<table>{rows}</table>"]
    if stats.get("patterns"):
        prow = "".join(
            f"<tr><td>{html.escape(k)}</td><td>{v}</td></tr>"
            for k, v in sorted(stats["patterns"].items())
        )
        parts.append(f"<b>warehouse patterns</b><table>{prow}</table>")
    groups = stats.get("groups") or []
    if groups:
        grows = "".join(
            f"<tr><td>{html.escape(g['name'])}</td><td>{len(g['ops'])}</td>"
            f"<td>{html.escape(' -> '.join(g['ops']))}</td></tr>"
            for g in groups[:max_groups]
        )
        more = f"<p>... {len(groups) - max_groups} more</p>" if len(groups) > max_groups else ""
        parts.append(
            f"<b>fused groups ({len(groups)})</b><table><tr><th>group</th><th>ops</th>"
            f"<th>members</th></tr>{grows}</table>{more}"
        )
    return "<div class='plus-tvm-stats'>" + "".join(parts) + "</div>"


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)
