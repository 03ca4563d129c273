"""Which jobs of a faulty node are requeued and why: `plan_jobs`, table-tested."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from gpuheal.api.names import JobReason
from gpuheal.api.remediationpolicy import PinnedJobs
from gpuheal.policy.jobs import JobPlan, listing_since, plan_jobs
from gpuheal_bridge.api.models import JobEnd, JobState

FAULT = dt.datetime(2026, 11, 23, 12, 0, 0, tzinfo=dt.UTC)
WINDOW = dt.timedelta(minutes=3)
NODE = "gpu-7"


def job(job_id: int = 1, **kw: Any) -> JobState:
    fields: dict[str, Any] = {
        "job_id": job_id,
        "state": "RUNNING",
        "nodes": [NODE],
        "batch": True,
        "requeue": True,
    }
    fields.update(kw)
    return JobState(**fields)


def ended(end: JobEnd, state: str, seconds: float, **kw: Any) -> JobState:
    return job(state=state, ended=end, end_time=FAULT + dt.timedelta(seconds=seconds), **kw)


def plan(j: JobState, pinned: PinnedJobs = PinnedJobs.RELEASE_NODE) -> JobPlan:
    [p] = plan_jobs([j], node=NODE, signal_at=FAULT, window=WINDOW, pinned=pinned)
    return p


CASES: list[tuple[str, JobState, bool, JobReason, str]] = [
    ("running", job(), True, JobReason.RUNNING, "RUNNING on gpu-7 at the fault"),
    ("suspended", job(state="SUSPENDED"), True, JobReason.RUNNING, "SUSPENDED"),
    ("completing", job(state="COMPLETING"), True, JobReason.RUNNING, "COMPLETING"),
    (
        "killed with its GPU just after the fault",
        ended(JobEnd.FAILED, "FAILED", 0.4, exit_signal=9),
        True,
        JobReason.ENDED_BY_FAILURE,
        "died FAILED, killed by signal 9 0.4s after the fault",
    ),
    (
        "exited non-zero a minute before the signal",
        ended(JobEnd.FAILED, "FAILED", -60, exit_status=1),
        True,
        JobReason.ENDED_BY_FAILURE,
        "exit 1 60.0s before the fault",
    ),
    (
        "node failure",
        ended(JobEnd.NODE_FAIL, "NODE_FAIL", -5),
        True,
        JobReason.ENDED_BY_FAILURE,
        "NODE_FAIL",
    ),
    (
        "failed before the window",
        ended(JobEnd.FAILED, "FAILED", -181, exit_status=1),
        False,
        JobReason.TOO_OLD,
        "before the failedJobsWindow (180s)",
    ),
    (
        "failed exactly at the window's start",
        ended(JobEnd.FAILED, "FAILED", -180),
        True,
        JobReason.ENDED_BY_FAILURE,
        "180.0s before",
    ),
    (
        "completed",
        ended(JobEnd.COMPLETED, "COMPLETED", -2, exit_status=0),
        False,
        JobReason.COMPLETED,
        "completed (exit 0) 2.0s before the fault",
    ),
    (
        "completed after the fault",
        ended(JobEnd.COMPLETED, "COMPLETED", 3),
        False,
        JobReason.COMPLETED,
        "3.0s after",
    ),
    (
        "cancelled by a person",
        ended(JobEnd.CANCELLED, "CANCELLED", -1, exit_signal=15),
        False,
        JobReason.CANCELLED,
        "cancelled (scancel)",
    ),
    (
        "time limit",
        ended(JobEnd.TIMEOUT, "TIMEOUT", -1),
        False,
        JobReason.OTHER_END,
        "hit its time limit",
    ),
    (
        "out of memory",
        ended(JobEnd.OUT_OF_MEMORY, "OUT_OF_MEMORY", -1),
        False,
        JobReason.OTHER_END,
        "ran out of memory",
    ),
    (
        "running, --no-requeue",
        job(requeue=False),
        False,
        JobReason.NOT_REQUEUEABLE,
        "--no-requeue",
    ),
    (
        "failed, --no-requeue",
        ended(JobEnd.FAILED, "FAILED", -1, requeue=False),
        False,
        JobReason.NOT_REQUEUEABLE,
        "--no-requeue",
    ),
    (
        "an srun allocation",
        job(batch=False),
        False,
        JobReason.NOT_REQUEUEABLE,
        "not a batch job",
    ),
    (
        "pending again (requeued by someone)",
        job(state="PENDING", nodes=[]),
        False,
        JobReason.NOT_ON_NODE,
        "not gpu-7",
    ),
    ("on another node", job(nodes=["gpu-8"]), False, JobReason.NOT_ON_NODE, "on gpu-8"),
]


@pytest.mark.parametrize(
    ("j", "requeue", "reason", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_victims_and_the_jobs_left_alone(
    j: JobState, requeue: bool, reason: JobReason, words: str
) -> None:
    p = plan(j)
    assert (p.requeue, p.reason) == (requeue, reason)
    assert words in p.message
    assert not p.hold
    assert not p.release_node


def test_a_two_node_job_with_one_node_on_the_fault_is_a_victim() -> None:
    p = plan(job(nodes=["gpu-6", NODE], node_count=2, batch_host="gpu-6"))
    assert p.requeue
    assert p.reason is JobReason.RUNNING


@pytest.mark.parametrize(
    ("j", "reason"),
    [
        (
            job(required_nodes=[NODE, "gpu-8"], nodes=[NODE, "gpu-8"], node_count=2),
            JobReason.RUNNING,
        ),
        (
            ended(JobEnd.FAILED, "FAILED", 0.5, required_nodes=[NODE]),
            JobReason.ENDED_BY_FAILURE,
        ),
    ],
)
def test_a_job_pinned_to_the_node_is_released_from_it_by_default(
    j: JobState, reason: JobReason
) -> None:
    p = plan(j)
    assert (p.requeue, p.reason, p.release_node, p.hold) == (True, reason, True, False)
    assert "gpu-7 dropped from its --nodelist" in p.message


def test_a_pinned_job_is_held_when_the_policy_says_so() -> None:
    p = plan(job(job_id=42, required_nodes=[NODE]), PinnedJobs.HOLD)
    assert (p.requeue, p.reason, p.hold, p.release_node) == (
        True,
        JobReason.PINNED_HELD,
        True,
        False,
    )
    assert "scontrol release 42" in p.message


def test_a_job_that_does_not_name_the_node_is_not_released() -> None:
    p = plan(job(required_nodes=["gpu-8"], nodes=[NODE, "gpu-8"]))
    assert p.requeue
    assert not p.release_node


def test_each_job_once_in_id_order() -> None:
    jobs = [job(3), job(1), job(3, state="COMPLETING")]
    plans = plan_jobs(jobs, node=NODE, signal_at=FAULT, window=WINDOW, pinned=PinnedJobs.HOLD)
    assert [p.job.job_id for p in plans] == [1, 3]
    assert plans[1].job.state == "RUNNING"  # the first listing of a job wins


def test_old_jobs_that_did_not_fail_are_none_of_this_faults_business() -> None:
    old = -WINDOW.total_seconds() - 1
    jobs = [
        ended(JobEnd.COMPLETED, "COMPLETED", old),
        ended(JobEnd.CANCELLED, "CANCELLED", old),
        ended(JobEnd.FAILED, "FAILED", old),
    ]
    jobs = [j.model_copy(update={"job_id": i}) for i, j in enumerate(jobs, 1)]
    plans = plan_jobs(jobs, node=NODE, signal_at=FAULT, window=WINDOW, pinned=PinnedJobs.HOLD)
    assert [(p.job.job_id, p.reason) for p in plans] == [(3, JobReason.TOO_OLD)]


def test_the_listing_reaches_back_past_the_window() -> None:
    assert listing_since(FAULT, WINDOW) == FAULT - 2 * WINDOW
