"""The benchmark result as text and as a chart."""

from __future__ import annotations


def format_table(result: dict) -> str:
    """The result as an aligned text table (one row per backend; one table per sequence
    length for a result of ``seq_lengths``)."""
    if "lengths" in result:
        parts = [
            f"sequence length {length} (one compile of plus for every length)\n"
            + _one_table(summary)
            for length, summary in result["lengths"].items()
        ]
        return "\n\n".join(parts)
    return _one_table(result)


def _one_table(result: dict) -> str:
    header = (
        f"{'backend':<14}{'median ms':>12}{'runs':>6}{'spread ms':>11}{'plus speedup':>14}"
        f"{'max abs err':>13}"
        f"{'kernels':>9}{'peak MB':>9}{'model MB':>10}  status"
    )
    env = result.get("environment", {})
    lines = [
        f"model {result['model']} on {result['target']} (reference: {result['reference']})",
        f"every backend in its own process, on CPUs {env.get('affinity')} with its own thread "
        "defaults; 'spread ms' = range of the middle 80% of the runs; 'model MB' = peak "
        "resident minus the resident size after importing its libraries",
        header,
        "-" * len(header),
    ]

    def num(value: object, spec: str) -> str:
        return format(value, spec) if isinstance(value, (int, float)) else "-"

    for name, e in result["backends"].items():
        sp = result["speedup"].get(name) if name != "plus" else 1.0
        sp_text = num(sp, ".2f") + ("x" if isinstance(sp, (int, float)) else "")
        lines.append(
            f"{name:<14}{num(e['median_ms'], '.3f'):>12}{e['runs']:>6}"
            f"{num(e.get('spread_ms'), '.3f'):>11}{sp_text:>14}"
            f"{num(e['max_abs_err'], '.2e'):>13}{str(e.get('kernels', '-')):>9}"
            f"{num(e.get('peak_rss_mb'), '.0f'):>9}"
            f"{num(e.get('peak_above_libraries_mb'), '.0f'):>10}"
            f"  {e['status']}"
        )
    s = result.get("stats", {})
    if s:
        lines.append(
            f"plus: ops {s.get('ops')}, kernels {s.get('kernels')}, fusion ratio "
            f"{s.get('fusion_ratio')}, library calls {s.get('library_calls')}"
        )
    threads = {n: e["threads"] for n, e in result["backends"].items() if e.get("threads")}
    if threads:
        lines.append("threads: " + "; ".join(f"{n} {t}" for n, t in threads.items()))
    for problem in result.get("invalid", []):
        lines.append(f"INVALID: {problem}")
    for warning in result.get("warnings", []):
        lines.append(f"WARNING: {warning}")
    return "\n".join(lines)


def plot(result: dict, path: str) -> str:
    """Bar chart of the medians (log scale) with plus's speedup over each peer; for a result of
    ``seq_lengths``, each backend's median against the sequence length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if "lengths" in result:
        return _plot_lengths(result, path, plt)

    names = [n for n, e in result["backends"].items() if e["median_ms"] is not None]
    values = [result["backends"][n]["median_ms"] for n in names]
    fig, ax = plt.subplots(figsize=(1.6 * max(3, len(names)), 3.6))
    bars = ax.bar(names, values, color=["#d62728" if n == "plus" else "#1f77b4" for n in names])
    ax.set_yscale("log")
    ax.set_ylabel("median latency (ms, log)")
    ax.set_title(f"{result['model']} on {result['target']}")
    for bar_, name in zip(bars, names):
        sp = result["speedup"].get(name)
        label = "plus" if name == "plus" else (f"{sp:.2f}x" if isinstance(sp, (int, float)) else "")
        ax.annotate(
            label,
            (bar_.get_x() + bar_.get_width() / 2, bar_.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_lengths(result: dict, path: str, plt) -> str:
    lengths = [int(n) for n in result["lengths"]]
    names = list(next(iter(result["lengths"].values()))["backends"])
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for name in names:
        values = [result["lengths"][str(n)]["backends"][name]["median_ms"] for n in lengths]
        points = [(n, v) for n, v in zip(lengths, values) if v is not None]
        if points:
            ax.plot(*zip(*points), marker="o", label=name, lw=2.5 if name == "plus" else 1.2)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("sequence length")
    ax.set_ylabel("median latency (ms, log)")
    ax.set_title(f"{result['model']} on {result['target']}, one plus compile")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
