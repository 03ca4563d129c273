"""Plots for benchmark documents (the JSON the harness writes), matplotlib with Agg."""

from __future__ import annotations

import statistics
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
