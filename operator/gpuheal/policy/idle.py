"""Is the node free of work, so that a GPU reset or a node reboot may run now?

A reset or a reboot kills whatever uses the node's GPUs: a Slurm job still running there (the
ladder's slurmDrain drains the node, but a job it left running, `requeue: none`, or one that
takes its time to end is still there) or a pod a drain would evict (not a DaemonSet's, not a
mirror pod, not finished). The step waits while either remains, and says which.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from gpuheal.api.names import Reason
from gpuheal.policy.select import pods_to_evict
from gpuheal_bridge.api.models import JobState

#: Slurm states of a job that is not (or no longer) on the node: waiting to run (a requeued
#: job is PENDING again) or finished.
_OFF_NODE = frozenset(
    {
        "PENDING",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
    }
)


@dataclasses.dataclass(frozen=True, slots=True)
class Busy:
    """Work still on the node: the step waits, with this reason and message."""

    reason: Reason  # WaitingForSlurmJobs or WaitingForIdle (the step's condition, Blocked=True)
    message: str


def slurm_jobs_on_node(jobs: Sequence[JobState]) -> list[JobState]:
    """The jobs that still hold the node: not finished, not waiting to run (COMPLETING
    counts: its epilog and processes are still there)."""
    return [j for j in jobs if j.ended is None and j.state.upper() not in _OFF_NODE]


def pod_names(pods: Sequence[Mapping[str, Any]]) -> list[str]:
    """The pods a reset or reboot would disturb (what a drain evicts), as namespace/name."""
    return [
        f"{(p.get('metadata') or {}).get('namespace')}/{(p.get('metadata') or {}).get('name')}"
        for p in pods_to_evict(pods)
    ]


def work_on_node(
    action: str, node: str, *, pods: Sequence[Mapping[str, Any]], jobs: Sequence[JobState]
) -> Busy | None:
    """None when ``node`` is idle (no Slurm job on it, no pod a drain would evict), else why
    ``action`` (reset, reboot) must wait: Slurm jobs first (a drained node's jobs leave by
    requeue or by ending), then pods."""
    running = slurm_jobs_on_node(jobs)
    busy_pods = pod_names(pods)
    pods_too = f"; {len(busy_pods)} pod(s) too ({', '.join(busy_pods[:3])})" if busy_pods else ""
    if running:
        ids = ", ".join(f"{j.job_id} ({j.state})" for j in running[:5])
        return Busy(
            Reason.WAITING_FOR_SLURM_JOBS,
            f"{action} waits: {len(running)} Slurm job(s) still on {node}: {ids}{pods_too}",
        )
    if busy_pods:
        return Busy(
            Reason.WAITING_FOR_IDLE,
            f"{action} waits: {len(busy_pods)} pod(s) still run on {node} "
            f"({', '.join(busy_pods[:3])})",
        )
    return None
