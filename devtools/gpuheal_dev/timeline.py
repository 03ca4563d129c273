"""Incident timeline: from named timestamps and the job's metrics to a printed table and a PNG.

The demo (and the end-to-end test, and the benchmarks) collect ``(name, unix_time)`` pairs as
they see each step happen (the injected fault, the cordon seen in a watch, the Slurm drain, the
requeue, ...), optionally with a detail string. The training job's own metrics file
(:mod:`gpuheal_dev.demo_job.metrics`) adds what only the job knows: its last checkpoint before the
fault, when it restarted from a checkpoint and where, its first step after that, its end.

    events = [("fault", t0, "XID 79 on gpu-node-1"), ("cordoned", t1), ...]
    tl = incident_report(events, workdir / "metrics.jsonl", Path("incident.png"))

prints the timeline (each step with its offset from the fault) and writes the PNG: the steps on
a time axis (top) and the loss curve across the interruption (bottom). Pure parts
(``build_timeline``, ``missing_steps``, ``job_events``, ``job_summary``, ``format_timeline``)
take plain values; only ``render_png`` imports matplotlib (Agg backend, no display needed).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gpuheal_dev.demo_job.metrics import Record, Run, read_records, split_runs, steps_lost

#: The steps of the remediation story, in the order they should happen.
STORY: tuple[str, ...] = (
    "fault",
    "detected",
    "cordoned",
    "slurm drained",
    "requeued",
    "pods evicted",
    "spare claimed",
    "job running again",
    "resumed from checkpoint",
)
#: Names ``job_events`` derives from the metrics file.
LAST_CHECKPOINT = "last checkpoint"
RESUMED = "resumed from checkpoint"
TRAINING_AGAIN = "training again"
JOB_FINISHED = "job finished"

if TYPE_CHECKING:
    from matplotlib.axes import Axes

EventLike = tuple[str, float] | tuple[str, float, str]


@dataclass(frozen=True)
class Step:
    name: str
    at: float  # Unix seconds
    offset: float  # seconds since the fault (negative: before it)
    detail: str = ""


@dataclass(frozen=True)
class Timeline:
    fault_at: float
    steps: list[Step]  # by time; the first occurrence of each name
    missing: list[str] = field(default_factory=list)  # expected, never seen

    def offset(self, name: str) -> float | None:
        for s in self.steps:
            if s.name == name:
                return s.offset
        return None


@dataclass(frozen=True)
class JobSummary:
    """What the metrics say about the interruption."""

    restarts: int
    hosts: list[str]
    resume_step: int | None  # step the first restart resumed from
    steps_lost: int | None  # steps done before the fault and redone after it
    first_loss: float | None
    final_loss: float | None  # on the whole dataset when the job finished
    finished: bool


def _norm(events: Iterable[EventLike]) -> list[tuple[str, float, str]]:
    out = []
    for ev in events:
        name, at = ev[0], float(ev[1])
        detail = ev[2] if len(ev) > 2 else ""
        out.append((name, at, str(detail)))
    return out


def missing_steps(events: Iterable[EventLike], expected: Sequence[str] = STORY) -> list[str]:
    """Expected step names that no event carries, in story order."""
    seen = {name for name, _, _ in _norm(events)}
    return [name for name in expected if name not in seen]


def build_timeline(
    events: Iterable[EventLike],
    *,
    fault: str = "fault",
    expected: Sequence[str] = STORY,
) -> Timeline:
    """Steps sorted by time with offsets from the ``fault`` event (the first if repeated).

    A repeated name keeps its first occurrence. Without a fault event the earliest event is
    time zero (and ``fault`` is reported missing when expected).
    """
    evs = _norm(events)
    if not evs:
        return Timeline(fault_at=0.0, steps=[], missing=list(expected))
    faults = [at for name, at, _ in evs if name == fault]
    t0 = min(faults) if faults else min(at for _, at, _ in evs)
    first: dict[str, tuple[float, str]] = {}
    for name, at, detail in sorted(evs, key=lambda e: e[1]):
        first.setdefault(name, (at, detail))
    steps = [Step(n, at, at - t0, d) for n, (at, d) in first.items()]
    steps.sort(key=lambda s: (s.at, s.name != fault))
    return Timeline(fault_at=t0, steps=steps, missing=missing_steps(evs, expected))


def _runs_around(records: list[Record], fault_at: float) -> tuple[Run | None, Run | None]:
    """The run that was going at the fault, and the first run started after it."""
    runs = split_runs(records)
    before = [r for r in runs if float(r.start["time"]) <= fault_at]
    after = [r for r in runs if float(r.start["time"]) > fault_at]
    return (before[-1] if before else None), (after[0] if after else None)


def job_events(records: list[Record], fault_at: float) -> list[tuple[str, float, str]]:
    """Events only the job knows: last checkpoint before the fault, restart from checkpoint,
    first step after it, job finished."""
    out: list[tuple[str, float, str]] = []
    hit, nxt = _runs_around(records, fault_at)
    if hit is not None:
        cks = [c for c in hit.checkpoints if float(c["time"]) <= fault_at]
        if cks:
            c = cks[-1]
            out.append((LAST_CHECKPOINT, float(c["time"]), f"step {c['step']} on {hit.host}"))
    if nxt is not None:
        where = f"step {nxt.resume_step} on {nxt.host} (restart {nxt.restart})"
        out.append((RESUMED, float(nxt.start["time"]), where))
        if nxt.steps:
            s = nxt.steps[0]
            out.append((TRAINING_AGAIN, float(s["time"]), f"step {s['step']}"))
        if nxt.end is not None and nxt.end["event"] == "done":
            loss = nxt.end.get("loss")
            detail = f"step {nxt.end['step']}" + (f", loss {loss:.3f}" if loss is not None else "")
            out.append((JOB_FINISHED, float(nxt.end["time"]), detail))
    return out


def job_summary(records: list[Record]) -> JobSummary:
    runs = split_runs(records)
    lost = steps_lost(runs)
    steps = [s for r in runs for s in r.steps]
    end = runs[-1].end if runs else None
    finished = end is not None and end["event"] == "done"
    return JobSummary(
        restarts=max((r.restart for r in runs), default=0),
        hosts=[r.host for r in runs],
        resume_step=runs[1].resume_step if len(runs) > 1 else None,
        steps_lost=lost[0] if lost else None,
        first_loss=float(steps[0]["loss"]) if steps else None,
        final_loss=float(end["loss"]) if finished and end and "loss" in end else None,
        finished=finished,
    )


def _clock(at: float) -> str:
    return dt.datetime.fromtimestamp(at, tz=dt.UTC).strftime("%H:%M:%S.%f")[:-3]


def format_offset(seconds: float) -> str:
    return f"{seconds:+.3f} s"


def format_timeline(
    tl: Timeline, *, title: str = "Incident timeline", job: JobSummary | None = None
) -> str:
    """The timeline as aligned text lines (each step with its time from the fault)."""
    lines = [f"{title} (t = 0 at the fault, {_clock(tl.fault_at)} UTC)"]
    width = max((len(s.name) for s in tl.steps), default=10)
    for s in tl.steps:
        lines.append(f"  {format_offset(s.offset):>11}  {s.name:<{width}}  {s.detail}".rstrip())
    if tl.missing:
        lines.append(f"  not seen: {', '.join(tl.missing)}")
    if job is not None:
        parts = [f"{job.restarts} restart(s)", "hosts " + " -> ".join(job.hosts)]
        if job.resume_step is not None:
            parts.append(f"resumed at step {job.resume_step}")
        if job.steps_lost is not None:
            parts.append(f"{job.steps_lost} step(s) lost")
        if job.first_loss is not None and job.final_loss is not None:
            parts.append(f"loss {job.first_loss:.3f} -> {job.final_loss:.3f}")
        parts.append("finished" if job.finished else "not finished")
        lines.append("  job: " + ", ".join(parts))
    return "\n".join(lines)


@dataclass(frozen=True)
class LossSegment:
    """One run's loss curve, time relative to the fault."""

    run_index: int
    label: str
    xs: list[float]
    losses: list[float]
    #: mean of the last 10 steps, continued across a restart from the steps the resume kept
    smooth: list[float]
    #: per step: done after the last checkpoint before the fault, hence redone after it
    lost: list[bool]


def _rolling(values: list[float], k: int) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= k:
            acc -= values[i - k]
        out.append(acc / min(i + 1, k))
    return out


def loss_segments(records: list[Record], fault_at: float, window: int = 10) -> list[LossSegment]:
    runs = split_runs(records)
    hit, nxt = _runs_around(records, fault_at)
    redo_from = nxt.resume_step if nxt is not None else None
    segments = []
    for i, run in enumerate(runs):
        if not run.steps:
            continue
        is_hit = hit is not None and run.start is hit.start
        is_next = nxt is not None and run.start is nxt.start
        losses = [float(s["loss"]) for s in run.steps]
        prefix: list[float] = []
        if is_next and hit is not None:
            kept = [float(s["loss"]) for s in hit.steps if int(s["step"]) <= run.resume_step]
            prefix = kept[-(window - 1) :]
        segments.append(
            LossSegment(
                run_index=i,
                label=f"run {i} on {run.host} (restart {run.restart})",
                xs=[float(s["time"]) - fault_at for s in run.steps],
                losses=losses,
                smooth=_rolling(prefix + losses, window)[len(prefix) :],
                lost=[
                    is_hit and redo_from is not None and int(s["step"]) > redo_from
                    for s in run.steps
                ],
            )
        )
    return segments


# ---- PNG ----------------------------------------------------------------------------------

_COLORS = {
    "fault": "#d62728",
    LAST_CHECKPOINT: "#7f7f7f",
    RESUMED: "#2ca02c",
    TRAINING_AGAIN: "#2ca02c",
    JOB_FINISHED: "#2ca02c",
}
_RUN_COLORS = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b")


def render_png(
    tl: Timeline,
    records: list[Record],
    path: Path,
    *,
    title: str = "gpuheal incident",
    dpi: int = 110,
) -> Path:
    """Two panels: steps on a time axis (top), the loss across the interruption (bottom)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_l) = plt.subplots(
        2, 1, figsize=(11, 8.2), gridspec_kw={"height_ratios": [1.15, 1]}, layout="constrained"
    )
    fig.suptitle(title, fontsize=13, fontweight="bold")
    _draw_steps(ax_t, tl)
    _draw_loss(ax_l, tl, records)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def _draw_steps(ax: Axes, tl: Timeline) -> None:
    """One row per step, a dot at its offset. The axis covers the incident (up to the job
    training again); later steps (the job finishing) sit at the right edge with their time."""
    steps = tl.steps
    n = max(len(steps), 1)
    offsets = [s.offset for s in steps if s.name != JOB_FINISHED] or [0.0]
    lo, hi = min(0.0, *offsets), max(0.0, *offsets)
    span = max(hi - lo, 0.05)
    right = hi + 0.06 * span
    ax.set_xlim(lo - 0.04 * span, hi + 0.6 * span)  # room for labels on the right
    ax.set_ylim(n - 0.4, -0.8)
    ax.axvline(0, color=_COLORS["fault"], lw=1.5, ls="--", zorder=1)
    for i, s in enumerate(steps):
        color = _COLORS.get(s.name, "#1f77b4")
        x = min(s.offset, right)
        clipped = s.offset > right
        ax.hlines(i, min(0.0, x), max(0.0, x), color=color, lw=3, alpha=0.35)
        ax.plot([x], [i], ">" if clipped else "o", color=color, ms=8, zorder=3)
        bold = "bold" if s.name in ("fault", RESUMED) else "normal"
        label = f"  {s.name}  {format_offset(s.offset)}" + ("  (off the axis)" if clipped else "")
        ax.text(x + 0.012 * span, i, label, va="center", fontsize=9.5, fontweight=bold)
        if s.detail:
            ax.text(
                x + 0.012 * span,
                i + 0.36,
                f"   {s.detail}",
                va="center",
                fontsize=7.5,
                color="#555555",
            )
    ax.set_yticks([])
    ax.set_xlabel("seconds since the fault")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title("Remediation steps (first time each was seen)", fontsize=10.5, loc="left")
    if tl.missing:
        ax.set_title(
            "not seen: " + ", ".join(tl.missing), fontsize=8.5, loc="right", color="#d62728"
        )
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)


def _draw_loss(ax: Axes, tl: Timeline, records: list[Record]) -> None:
    t0 = tl.fault_at
    _, nxt = _runs_around(records, t0)
    for seg in loss_segments(records, t0):
        color = _RUN_COLORS[seg.run_index % len(_RUN_COLORS)]
        ax.plot(seg.xs, seg.losses, ".", color=color, ms=2.5, alpha=0.35)
        kept = [j for j, lost in enumerate(seg.lost) if not lost]
        redone = [j for j, lost in enumerate(seg.lost) if lost]
        ax.plot(
            [seg.xs[j] for j in kept],
            [seg.smooth[j] for j in kept],
            "-",
            color=color,
            lw=2,
            label=seg.label,
        )
        if redone:
            ax.plot(
                [seg.xs[j] for j in redone],
                [seg.smooth[j] for j in redone],
                "-",
                color="#ff7f0e",
                lw=2,
                label=f"steps after its last checkpoint: lost, redone ({len(redone)})",
            )
    ax.axvline(0, color=_COLORS["fault"], lw=1.5, ls="--", label="fault")
    resumed = tl.offset(RESUMED)
    if resumed is None and nxt is not None:
        resumed = float(nxt.start["time"]) - t0
    if resumed is not None:
        ax.axvline(
            resumed,
            color=_COLORS[RESUMED],
            lw=1.5,
            ls="--",
            label=f"resumed from checkpoint (+{resumed:.2f} s)",
        )
        ax.axvspan(0, resumed, color="#d62728", alpha=0.07)
    ax.set_xlabel("seconds since the fault")
    ax.set_ylabel("training loss (minibatch; line: mean of 10)")
    summary = job_summary(records)
    note = []
    if summary.resume_step is not None:
        note.append(f"resumed at step {summary.resume_step}")
    if summary.steps_lost is not None:
        note.append(f"{summary.steps_lost} step(s) lost")
    if summary.final_loss is not None:
        note.append(f"final loss {summary.final_loss:.3f}")
    ax.set_title(
        "Loss across the interruption" + (f": {', '.join(note)}" if note else ""),
        fontsize=10.5,
        loc="left",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8.5, loc="upper right")


def incident_report(
    events: Iterable[EventLike],
    metrics: Path | list[Record],
    png: Path | None,
    *,
    title: str = "gpuheal incident",
    expected: Sequence[str] = STORY,
    out: Callable[[str], None] = print,
) -> Timeline:
    """Merge ``events`` with the job's own, print the timeline, write the PNG (if ``png``)."""
    records = read_records(metrics) if isinstance(metrics, Path) else metrics
    evs = _norm(events)
    base = build_timeline(evs, expected=expected)
    tl = build_timeline([*evs, *job_events(records, base.fault_at)], expected=expected)
    out(format_timeline(tl, title=title, job=job_summary(records) if records else None))
    if png is not None:
        render_png(tl, records, png, title=title)
        out(f"timeline PNG: {png}")
    return tl
