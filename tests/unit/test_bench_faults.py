"""The fault-trace benchmark's pure parts: the trace, the effective training time ratio, the
policy it runs (the default's) and the Slurm release it runs on."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import yaml
from bench.faults import (
    DEFAULT_POLICY,
    FAULT_KINDS,
    LOST_GPU_DRAIN,
    TRACE_SLURM_ENV,
    default_rule_steps,
    ettr,
    project,
    trace,
    trace_release,
)

ROOT = Path(__file__).resolve().parents[2]


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


def test_the_trace_runs_the_default_policys_xid_79_rung_with_noop_hooks_only() -> None:
    doc = yaml.safe_load(DEFAULT_POLICY.read_text())
    rule = next(r for r in doc["spec"]["rules"] if 79 in r["signals"].get("xids", []))
    shipped = rule["ladder"][0]["steps"]
    steps = default_rule_steps(79)
    assert [s["action"] for s in steps] == [s["action"] for s in shipped]
    for ran, as_shipped in zip(steps, shipped, strict=True):
        if ran["action"] == "reboot":  # kwok nodes run no Jobs: the hook alone differs
            assert ran["reboot"] == {**as_shipped["reboot"], "hook": {"type": "Noop"}}
        else:
            assert ran == as_shipped
    # a lost GPU: the jobs go at once, no checkpoint grace (what fault_to_running runs too)
    assert LOST_GPU_DRAIN in steps
    assert all("checkpointSignal" not in (s.get("slurmDrain") or {}) for s in steps)


def test_the_chart_ships_the_same_xid_79_rung() -> None:
    chart = ROOT / "deploy" / "helm" / "gpuheal" / "files" / "default-policy.yaml"
    assert default_rule_steps(79, chart) == default_rule_steps(79)


def test_an_xid_no_rule_names_is_refused() -> None:
    with pytest.raises(LookupError, match="XID 4242"):
        default_rule_steps(4242)


def test_the_trace_runs_on_the_sandboxs_default_slurm_unless_told(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpuheal_dev.sandbox.slurmroot import DEFAULT_SLURM

    monkeypatch.delenv(TRACE_SLURM_ENV, raising=False)
    assert trace_release() == DEFAULT_SLURM == "26.05"
    monkeypatch.setenv(TRACE_SLURM_ENV, "22.05")
    assert trace_release() == "22.05"


@pytest.mark.parametrize("raw", ["24.11", "26.05,22.05"])
def test_the_trace_refuses_anything_but_one_known_release(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    monkeypatch.setenv(TRACE_SLURM_ENV, raw)
    with pytest.raises(ValueError, match=TRACE_SLURM_ENV):
        trace_release()
