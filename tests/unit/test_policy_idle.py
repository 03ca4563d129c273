"""Is a node free of work for a reset or a reboot: Slurm jobs on it and pods a drain evicts."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from gpuheal.policy.idle import slurm_jobs_on_node, work_on_node
from gpuheal_bridge.api.models import JobEnd, JobState

ENDED = dt.datetime(2026, 11, 26, 20, 0, tzinfo=dt.UTC)


def job(job_id: int, state: str, *, ended: JobEnd | None = None) -> JobState:
    return JobState(
        job_id=job_id, state=state, nodes=["n1"], batch=True, requeue=True, ended=ended,
        end_time=ENDED if ended else None,
    )  # fmt: skip


def pod(name: str, *, phase: str = "Running", owner: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ml"}
    if owner:
        meta["ownerReferences"] = [{"kind": owner, "name": "x"}]
    return {"metadata": meta, "status": {"phase": phase}}


@pytest.mark.parametrize(
    ("state", "on_node"),
    [
        ("RUNNING", True),
        ("COMPLETING", True),  # its epilog and processes are still there
        ("SUSPENDED", True),
        ("CONFIGURING", True),
        ("PENDING", False),  # requeued: it waits to run elsewhere
        ("REQUEUE_HOLD", False),
        ("COMPLETED", False),
        ("FAILED", False),
    ],
)
def test_which_slurm_jobs_hold_the_node(state: str, on_node: bool) -> None:
    assert bool(slurm_jobs_on_node([job(7, state)])) is on_node


def test_a_job_that_ended_no_longer_holds_the_node_whatever_its_state_says() -> None:
    assert slurm_jobs_on_node([job(7, "RUNNING", ended=JobEnd.FAILED)]) == []


def test_idle_node_may_be_reset() -> None:
    pods = [pod("dp", owner="DaemonSet"), pod("done", phase="Succeeded")]
    assert work_on_node("reset", "n1", pods=pods, jobs=[job(3, "PENDING")]) is None


def test_slurm_jobs_come_first_and_name_the_jobs_and_pods() -> None:
    busy = work_on_node(
        "reset", "n1", pods=[pod("train")], jobs=[job(41, "RUNNING"), job(42, "PENDING")]
    )
    assert busy is not None
    assert busy.reason == "WaitingForSlurmJobs"
    assert busy.message == (
        "reset waits: 1 Slurm job(s) still on n1: 41 (RUNNING); 1 pod(s) too (ml/train)"
    )


def test_pods_alone_wait_for_idle() -> None:
    busy = work_on_node("reboot", "n1", pods=[pod("train"), pod("dp", owner="DaemonSet")], jobs=[])
    assert busy is not None
    assert (busy.reason, busy.message) == (
        "WaitingForIdle",
        "reboot waits: 1 pod(s) still run on n1 (ml/train)",
    )
