"""Incident timeline: pure parts with plain values, plus one rendered PNG."""

from __future__ import annotations

import struct
from pathlib import Path

from gpuheal_dev.demo_job.metrics import Record
from gpuheal_dev.timeline import (
    JOB_FINISHED,
    LAST_CHECKPOINT,
    RESUMED,
    STORY,
    TRAINING_AGAIN,
    build_timeline,
    format_timeline,
    incident_report,
    job_events,
    job_summary,
    loss_segments,
    missing_steps,
    render_png,
)

T0 = 1_800_000_000.0


def metrics(fault: float = T0, lost: int = 3) -> list[Record]:
    """Run 0 on gpu-node-1: steps 1..40 (checkpoint every 10), the fault after step 40 + lost;
    run 1 on gpu-node-2 resumes from step 40 and finishes at 80."""
    recs: list[Record] = [
        {"event": "start", "time": fault - 5, "host": "gpu-node-1", "restart": 0, "resume_step": 0},
    ]
    last = 40 + lost
    for step in range(1, last + 1):
        at = fault - 5 + step * (5 / (last + 1))
        recs.append({"event": "step", "time": at, "step": step, "loss": 2.0 - step / 100})
        if step % 10 == 0:
            recs.append({"event": "checkpoint", "time": at, "step": step, "reason": "interval"})
    recs.append(
        {
            "event": "start",
            "time": fault + 1.5,
            "host": "gpu-node-2",
            "restart": 1,
            "resume_step": 40,
        }
    )
    for step in range(41, 81):
        at = fault + 1.5 + (step - 40) * 0.05
        recs.append({"event": "step", "time": at, "step": step, "loss": 2.0 - step / 100})
    recs.append({"event": "done", "time": fault + 4, "step": 80, "loss": 1.2})
    return recs


EVENTS = [
    ("cordoned", T0 + 0.12),
    ("fault", T0, "XID 79 on gpu-node-1"),
    ("detected", T0 + 0.05),
    ("slurm drained", T0 + 0.3),
    ("requeued", T0 + 0.31),
    ("job running again", T0 + 1.1),
    ("cordoned", T0 + 0.9),  # seen again later: the first one counts
]


def test_offsets_from_the_fault_in_time_order() -> None:
    tl = build_timeline(EVENTS)
    assert tl.fault_at == T0
    assert [(s.name, round(s.offset, 3)) for s in tl.steps] == [
        ("fault", 0.0),
        ("detected", 0.05),
        ("cordoned", 0.12),
        ("slurm drained", 0.3),
        ("requeued", 0.31),
        ("job running again", 1.1),
    ]
    assert tl.steps[0].detail == "XID 79 on gpu-node-1"


def test_missing_steps_in_story_order() -> None:
    assert missing_steps(EVENTS) == ["pods evicted", "spare claimed", "resumed from checkpoint"]
    assert missing_steps(EVENTS, expected=("fault", "cordoned")) == []
    assert missing_steps([]) == list(STORY)
    assert build_timeline(EVENTS).missing == missing_steps(EVENTS)


def test_without_a_fault_the_first_event_is_zero() -> None:
    tl = build_timeline([("cordoned", T0 + 2), ("detected", T0 + 1)])
    assert [s.offset for s in tl.steps] == [0.0, 1.0]
    assert "fault" in tl.missing
    assert build_timeline([]).steps == []


def test_job_events_from_metrics() -> None:
    evs = {name: (round(at - T0, 3), detail) for name, at, detail in job_events(metrics(), T0)}
    assert evs[LAST_CHECKPOINT][1] == "step 40 on gpu-node-1"
    assert evs[LAST_CHECKPOINT][0] < 0
    assert evs[RESUMED] == (1.5, "step 40 on gpu-node-2 (restart 1)")
    assert evs[TRAINING_AGAIN] == (1.55, "step 41")
    assert evs[JOB_FINISHED] == (4.0, "step 80, loss 1.200")
    assert job_events(metrics(), T0 + 100) == []  # nothing restarted after that "fault"


def test_job_summary_counts_lost_steps() -> None:
    s = job_summary(metrics(lost=3))
    assert (s.restarts, s.hosts, s.resume_step, s.steps_lost) == (
        1,
        ["gpu-node-1", "gpu-node-2"],
        40,
        3,
    )
    assert s.finished
    assert s.first_loss == 1.99
    assert s.final_loss == 1.2
    assert job_summary([]).steps_lost is None


def test_text_timeline() -> None:
    tl = build_timeline([*EVENTS, *job_events(metrics(), T0)])
    text = format_timeline(tl, title="XID 79", job=job_summary(metrics()))
    lines = text.splitlines()
    assert lines[0].startswith("XID 79 (t = 0 at the fault, ")
    assert lines[1].split() == [
        "-0.455",
        "s",
        "last",
        "checkpoint",
        "step",
        "40",
        "on",
        "gpu-node-1",
    ]
    assert "+0.000 s  fault" in lines[2]
    assert lines[2].endswith("XID 79 on gpu-node-1")
    assert any("+1.500 s  resumed from checkpoint" in line for line in lines)
    assert "  not seen: pods evicted, spare claimed" in lines
    assert lines[-1] == (
        "  job: 1 restart(s), hosts gpu-node-1 -> gpu-node-2, resumed at step 40, "
        "3 step(s) lost, loss 1.990 -> 1.200, finished"
    )


def test_loss_segments_mark_redone_steps_and_smooth_across_the_restart() -> None:
    first, second = loss_segments(metrics(lost=3), T0)
    assert [i for i, lost in enumerate(first.lost) if lost] == [40, 41, 42]  # steps 41..43
    assert not any(second.lost)
    assert second.label == "run 1 on gpu-node-2 (restart 1)"
    # the resumed run's window starts with steps 32..40 of the first run, not from nothing
    want = (sum(2.0 - s / 100 for s in range(32, 41)) + second.losses[0]) / 10
    assert abs(second.smooth[0] - want) < 1e-12
    assert first.xs[-1] < 0 < second.xs[0]


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_renders_a_png(tmp_path: Path) -> None:
    tl = build_timeline([*EVENTS, *job_events(metrics(), T0)])
    path = render_png(tl, metrics(), tmp_path / "out" / "incident.png", title="test")
    width, height = png_size(path)
    assert 800 <= width <= 2000
    assert 600 <= height <= 1500
    assert 20_000 < path.stat().st_size < 2_000_000


def test_incident_report_prints_and_writes(tmp_path: Path) -> None:
    lines: list[str] = []
    png = tmp_path / "r.png"
    tl = incident_report(EVENTS, metrics(), png, title="r", out=lines.append)
    assert tl.offset(RESUMED) == 1.5
    assert "resumed from checkpoint" in lines[0]
    assert lines[-1] == f"timeline PNG: {png}"
    png_size(png)
