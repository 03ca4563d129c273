"""The fault-trace benchmark's pure parts: the trace and the effective training time ratio."""

from __future__ import annotations

from collections import Counter

import pytest
from bench.faults import FAULT_KINDS, ettr, project, trace


def test_trace_is_one_fault_per_interval_mixing_every_kind() -> None:
    faults = trace(10, 60.0, seed=3)
    assert [f.at for f in faults] == [30.0 + 60.0 * k for k in range(10)]
    counts = Counter(f.kind for f in faults)
    assert set(counts) == set(FAULT_KINDS)
    assert max(counts.values()) - min(counts.values()) <= 1  # cycles of all three
    assert trace(10, 60.0, seed=3) == faults  # seeded


def steps(times_steps: list[tuple[float, int]]) -> list[dict[str, object]]:
    return [{"event": "step", "time": t, "step": s} for t, s in times_steps]


def test_ettr_is_one_for_a_job_that_never_stops() -> None:
    recs = steps([(t / 10, t) for t in range(0, 1001)])  # 10 steps/s for 100 s
    r = ettr(recs, 0.0, 100.0, rate=10.0)
    assert r["ettr"] == pytest.approx(1.0)
    assert r["training_at_end"]


def test_ettr_counts_lost_and_redone_steps_once() -> None:
    # 10 steps/s; at t=50 (step 500) it dies; checkpoint at 480; back at t=60 from 480
    recs = steps([(t / 10, t) for t in range(0, 501)])
    recs.append({"event": "checkpoint", "time": 48.0, "step": 480})
    recs += steps([(60 + (s - 480) / 10, s) for s in range(481, 881)])
    r = ettr(recs, 0.0, 100.0, rate=10.0)
    assert r["end_step"] == 880
    assert r["ettr"] == pytest.approx(0.88)  # 10 s down + 2 s of lost steps


def test_ettr_of_a_dead_job_counts_only_its_last_checkpoint() -> None:
    recs = steps([(t / 10, t) for t in range(0, 501)])
    recs.append({"event": "checkpoint", "time": 48.0, "step": 480})
    r = ettr(recs, 0.0, 100.0, rate=10.0)
    assert not r["training_at_end"]
    assert r["ettr"] == pytest.approx(0.48)


def test_projection_spreads_the_loss_per_fault_over_the_real_time_between_faults() -> None:
    assert project(36.0, 1.0) == pytest.approx(0.99)  # 36 s lost per hour
    assert project(900.0, 3.0) == pytest.approx(1 - 900 / 10800)
    assert project(7200.0, 1.0) == 0.0  # a loss longer than the interval: nothing kept
