"""Plots for benchmark documents (the JSON the harness writes), matplotlib with Agg."""

from __future__ import annotations

import re
import statistics
import textwrap
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")


def _machine_line(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    slurm = m["versions"].get("slurm")
    return (
        f"{m['nproc']} CPUs ({m.get('cpu_model') or '?'}), {m.get('memory_total_mib')} MiB, "
        f"load {m.get('load_avg_at_start')}"
        + (f", Slurm {slurm}" if slurm else "")
        + f"; {doc['started_at']}, commit {str(m.get('gpuheal_commit'))[:10]}"
    )


def _titles(fig: Figure, ax: Axes, doc: dict[str, Any]) -> None:
    ax.set_title(doc["title"], fontsize=11.5, loc="left", fontweight="bold", pad=22)
    ax.text(
        0,
        1.015,
        _machine_line(doc),
        transform=ax.transAxes,
        fontsize=7.5,
        color="#555555",
        va="bottom",
    )


def _strip(
    ax: Axes,
    x: float,
    values: list[float],
    color: str,
    label: str | None,
    *,
    half: float = 0.12,
    text_left: bool = False,
) -> None:
    """Samples as dots spread over [x-half, x+half], the median as a bar with its value."""
    n = len(values)
    xs = [x + (i - (n - 1) / 2) * (2 * half / max(n, 1)) for i in range(n)]
    ax.scatter(xs, values, s=20, color=color, alpha=0.7, label=label, zorder=3)
    if values:
        med = statistics.median(values)
        ax.hlines(med, x - half, x + half, color=color, lw=2.5, zorder=4)
        ax.annotate(
            f"{med:.2f}",
            (x - half - 0.01, med) if text_left else (x + half + 0.01, med),
            va="center",
            ha="right" if text_left else "left",
            fontsize=8.5,
            color=color,
            fontweight="bold",
        )


def default_plot(doc: dict[str, Any], path: Path) -> None:
    """Every sample per variant (dots) with its median (bar and number)."""
    series = doc["series"]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.9 * len(series) + 2), 5), layout="constrained")
    for i, (_name, s) in enumerate(series.items()):
        _strip(ax, i, s.get("samples", []), COLORS[i % len(COLORS)], None)
    ax.set_xticks(range(len(series)), list(series), fontsize=9)
    ax.set_ylabel(doc["unit"])
    ax.grid(axis="y", alpha=0.3)
    _titles(fig, ax, doc)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def recovery_plot(doc: dict[str, Any], path: Path) -> None:
    """Per variant: when Slurm reports the job RUNNING, and when it trains again (log scale)."""
    series = doc["series"]
    extra = doc.get("extra_series", {})
    layers = [
        ("Slurm reports the job RUNNING again", extra.get("to_running", {}), "#1f77b4", -0.17),
        ("job training again (first step after loading its checkpoint)", series, "#2ca02c", 0.17),
    ]
    names = list(series)
    fig, ax = plt.subplots(figsize=(max(9.0, 2.6 * len(names) + 1.5), 5.8), layout="constrained")
    for label, data, color, dx in layers:
        for i, name in enumerate(names):
            vals = data.get(name, {}).get("samples", [])
            _strip(ax, i + dx, vals, color, label if i == 0 else None, text_left=dx < 0)
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(FixedLocator([0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200]))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.axhline(10, color="#d62728", ls=":", lw=1.2)
    ax.text(
        -0.55,
        10.3,
        "target: training again <= 10 s after the fault",
        color="#d62728",
        fontsize=8,
        va="bottom",
    )
    labels = [
        f"{n}\n(n={series[n]['n']}, max {series[n].get('max', float('nan')):.2f} s)" for n in names
    ]
    ax.set_xticks(range(len(names)), labels, fontsize=9)
    ax.set_xlim(-0.6, len(names) - 0.4)
    lows = [
        v
        for d in (series, extra.get("to_running", {}))
        for s in d.values()
        for v in s.get("samples", [])
    ]
    ax.set_ylim(min([*lows, 1.0]) * 0.7, max([*lows, 10.0]) * 1.4)
    ax.set_ylabel("seconds after the drain was issued (log scale)")
    ax.grid(axis="y", alpha=0.3, which="both")
    ax.legend(fontsize=8.5, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    _titles(fig, ax, doc)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _target(ax: Axes, y: float, text: str, x: float = -0.45) -> None:
    ax.axhline(y, color="#d62728", ls=":", lw=1.2)
    ax.text(x, y * 1.06, text, color="#d62728", fontsize=8, va="bottom")


def latency_plot(doc: dict[str, Any], path: Path) -> None:
    """Each latency series as dots (log scale) with p50 bar, p99 marked, and the targets."""
    series = doc["series"]
    names = list(series)
    # one column per series: xid_latency has 8 per Slurm release
    fig, ax = plt.subplots(figsize=(max(13.0, 1.15 * len(names)), 6.2), layout="constrained")
    for i, name in enumerate(names):
        vals = series[name].get("samples", [])
        _strip(ax, i, vals, COLORS[i % len(COLORS)], None, half=0.3)
        if vals:
            p99 = series[name]["p99"]
            ax.hlines(p99, i - 0.3, i + 0.3, color="black", lw=1, ls="--", zorder=5)
            ax.annotate(f"p99 {p99:.2f}", (i - 0.31, p99), va="bottom", ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(
        FixedLocator([0.02, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 60, 120, 300])
    )
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    _target(ax, 0.1, "isolated targets: cordon p99 <= 0.1 s")
    _target(ax, 0.5, "Slurm drain + requeue issued p99 <= 0.5 s")
    _target(ax, 1.0, "paced (burst) targets: cordon p99 <= 1 s")
    _target(ax, 2.0, "Slurm drain + requeue issued p99 <= 2 s")
    labels = [
        "\n".join(textwrap.fill(part, 18) for part in re.split(r": |, ", n))
        + f"\n(n={series[n]['n']}, p50 {series[n].get('median', 0):.2f} s)"
        for n in names
    ]
    ax.set_xticks(range(len(names)), labels, fontsize=8.5)
    ax.set_xlim(-0.6, len(names) - 0.4)
    ax.set_ylabel("seconds from the XID Event (log scale)")
    ax.grid(axis="y", alpha=0.3, which="both")
    _titles(fig, ax, doc)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def scale_plot(doc: dict[str, Any], path: Path) -> None:
    """Left: RSS steady/peak of gpuheal (with the fitted line out to 100,000 nodes) and of the
    plain kopf baseline against the node count. Middle: rack-storm cordon latency per node
    count. Right: p99 node-event lag against the achieved churn rate."""
    results = doc["params"]["results"]
    models = doc["params"].get("memory_model", {})
    targets = doc["params"].get("targets", {})
    fig, (ax, ax_s, ax2) = plt.subplots(1, 3, figsize=(18.0, 6.2))
    fig.subplots_adjust(top=0.84, bottom=0.12, left=0.05, right=0.98, wspace=0.25)
    xs = [int(r["nodes"]) for r in results]
    for key, label, color in (
        ("rss_steady_mib", "gpuheal steady", "#1f77b4"),
        ("rss_peak_mib", "gpuheal peak", "#aec7e8"),
        ("baseline_rss_steady_mib", "kopf baseline steady", "#ff7f0e"),
        ("baseline_rss_peak_mib", "kopf baseline peak", "#ffbb78"),
    ):
        pts = [(int(r["nodes"]), r[key]) for r in results if r.get(key) is not None]
        ax.plot([x for x, _ in pts], [y for _, y in pts], "o-" if "gpuheal" in label else "s--",
                color=color, label=label)  # fmt: skip
        for x, y in pts:
            if "gpuheal" in label:
                ax.annotate(f"{y:.0f}", (x, y), textcoords="offset points", xytext=(4, -10),
                            fontsize=7.5, color=color)  # fmt: skip
    m = models.get("rss_steady_mib") or {}
    if "predicted_mib" in m:
        top = m["predict_at"]
        lo = min(xs)
        grid = [lo * (top / lo) ** (k / 40) for k in range(41)]
        slope = (m["predicted_mib"] - m["a_mib"]) / top
        ax.plot(grid, [m["a_mib"] + slope * x for x in grid], ":", color="#1f77b4", lw=1.2,
                label=f"fit: {m['a_mib']:.0f} MiB + {m['b_kib_per_node']:.2f} KiB/node "
                f"-> {m['predicted_mib']:.0f} MiB at {top:,}")  # fmt: skip
        ax.plot([top], [m["predicted_mib"]], "D", color="#1f77b4")
    if targets.get("rss_steady_20000_mib"):
        ax.plot([20000], [targets["rss_steady_20000_mib"]], "v", color="#d62728", ms=9,
                label="targets: <= 300 MiB at 20,000, <= 1.5 GiB predicted at 100,000")  # fmt: skip
    if targets.get("rss_predicted_100000_mib"):
        ax.plot([100000], [targets["rss_predicted_100000_mib"]], "v", color="#d62728", ms=9)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("kwok GPU nodes (log)")
    ax.set_ylabel("RSS (MiB, log)")
    ax.legend(fontsize=7.5, loc="upper left")
    ax.grid(alpha=0.3, which="both")
    ax.set_title("operator RSS vs a plain kopf handler", fontsize=10, loc="left")
    for j, r in enumerate(results):
        lat = (r.get("rack_storm") or {}).get("cordon_s") or []
        _strip(ax_s, j, lat, COLORS[j % len(COLORS)], None, half=0.25)
        p99 = (r.get("rack_storm") or {}).get("cordon_p99_s")
        if p99 is not None:
            ax_s.hlines(p99, j - 0.3, j + 0.3, color="#555555", ls="--", lw=1)
            ax_s.annotate(f"p99 {p99:.2f}", (j + 0.3, p99), fontsize=7.5, va="bottom")
    ax_s.axhline(1.0, color="#d62728", ls=":", lw=1.2, label="target: p99 <= 1 s")
    ax_s.set_xticks(range(len(results)), [f"{x:,} nodes" for x in xs], fontsize=8.5)
    ax_s.set_ylabel("XID Event POST -> cordon seen in a watch (s)")
    ax_s.set_ylim(bottom=0)
    ax_s.legend(fontsize=8, loc="upper left")
    ax_s.grid(axis="y", alpha=0.3)
    ax_s.set_title("rack storm: 72 XIDs at once, cordon latency", fontsize=10, loc="left")
    fig.suptitle(doc["title"], fontsize=11.5, fontweight="bold", x=0.01, ha="left")
    fig.text(0.01, 0.925, _machine_line(doc), fontsize=7.5, color="#555555", ha="left")
    for j, r in enumerate(results):
        lv = r.get("churn_levels", [])
        cx = [x["achieved_rate"] for x in lv]
        ax2.plot(cx, [x["lag_p99"] for x in lv], "o-", color=COLORS[j % len(COLORS)],
                 label=f"{r['nodes']} p99")  # fmt: skip
        ax2.plot(cx, [x["lag_p50"] for x in lv], "o--", color=COLORS[j % len(COLORS)],
                 alpha=0.5, label=f"{r['nodes']} p50")  # fmt: skip
    ax2.axhline(1.0, color="#d62728", ls=":", lw=1.2)
    ax2.set_yscale("log")
    ax2.set_xlabel("node events/s (churn patches achieved)")
    ax2.set_ylabel("lag: node change -> operator's view (s, log)")
    ax2.set_title("event lag under node churn", fontsize=10, loc="left")
    ax2.legend(fontsize=7.5, ncol=2)
    ax2.grid(alpha=0.3, which="both")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def storm_plot(doc: dict[str, Any], path: Path) -> None:
    """Cumulative nodes cordoned after the first XID, the limit, the breaker opening."""
    p = doc["params"]
    times = doc["series"]["cordon times after the first XID"].get("samples", [])
    fig, ax = plt.subplots(figsize=(10.0, 5.4), layout="constrained")
    ax.axvspan(0, p["send_seconds"], color="#dddddd", alpha=0.5,
               label=f"{p['xids_sent']} XIDs being sent")  # fmt: skip
    if times:
        ax.step([0, *times], range(len(times) + 1), where="post", color="#1f77b4",
                label=f"nodes cordoned ({len(times)})")  # fmt: skip
    limit = int(str(p["max_unhealthy"]).split("=")[-1])
    ax.axhline(limit, color="#d62728", ls=":", lw=1.2, label=f"maxUnhealthy {p['max_unhealthy']}")
    if p.get("breaker_open_after_s") is not None:
        after = p.get("breaker_open_after_limit_hit_s")
        note = f" ({after:.2f} s after the limit was hit)" if after is not None else ""
        ax.axvline(p["breaker_open_after_s"], color="#2ca02c", ls="--",
                   label=f"breaker open at {p['breaker_open_after_s']:.2f} s{note}")  # fmt: skip
    if p.get("every_signal_taken_in_after_last_xid_s") is not None:
        at = p["send_seconds"] + p["every_signal_taken_in_after_last_xid_s"]
        ax.axvline(at, color="#9467bd", ls=":",
                   label=f"every signal taken in ({p['every_signal_taken_in_after_last_xid_s']:.2f}"
                   " s after the last XID)")  # fmt: skip
    if p.get("operator_intake_seconds"):
        ax.set_xlim(-1, float(p["operator_intake_seconds"]) + 12)
        ax.text(float(p["operator_intake_seconds"]), limit * 0.5,
                f"{p.get('signals_taken_in', 0):.0f} of {p['xids_sent']} signals taken in\n"
                f"{p.get('blocked_circuit_breaker')} incidents waiting (breaker)",
                ha="right", fontsize=8.5)  # fmt: skip
    ax.set_xlabel("seconds after the first XID")
    ax.set_ylabel("nodes cordoned")
    ax.set_ylim(0, max(limit, len(times)) * 1.3 + 1)
    ax.legend(fontsize=8.5, loc="lower right")
    ax.grid(alpha=0.3)
    _titles(fig, ax, doc)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def pairs_plot(doc: dict[str, Any], path: Path) -> None:
    """Paired runs (`storm_pairs`): each pair a line from the base's value to this tree's,
    the cordon p99 on the left, the API requests in the storm's window on the right."""
    names = list(doc["series"])
    requests = next(iter(doc.get("extra_series", {}).values()), {})
    fig, axes = plt.subplots(1, 2, figsize=(10, 5), layout="constrained")
    panels = (
        (axes[0], [doc["series"][n]["samples"] for n in names], "cordon p99 (s)"),
        (axes[1], [s["samples"] for s in requests.values()], "API requests in the storm"),
    )
    for ax, (a, b), label in ((ax, cols, label) for ax, cols, label in panels if len(cols) == 2):
        half = 0.08
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            shift = (i - (len(a) - 1) / 2) * (2 * half / max(len(a), 1))  # as `_strip` spreads
            ax.plot([shift, 1 + shift], [x, y], color="#888888", alpha=0.6, zorder=2)
        _strip(ax, 0, a, COLORS[0], None, half=half, text_left=True)
        _strip(ax, 1, b, COLORS[1], None, half=half)
        ax.set_xlim(-0.6, 1.6)
        ax.set_xticks([0, 1], names, fontsize=9)
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(textwrap.fill(doc["title"], 90), fontsize=11, fontweight="bold", x=0.02,
                 ha="left")  # fmt: skip
    axes[0].set_title(_machine_line(doc), fontsize=7, loc="left")
    fig.savefig(path, dpi=110)
    plt.close(fig)
