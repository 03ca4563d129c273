"""Which Slurm jobs of a faulty node are the fault's victims, and what becomes of each.

The bridge says what Slurm can tell about a job (its state, how and when it ended, its exit,
the nodes it named); this decides, as a pure function of those facts, the time of the signal
and the policy: requeue it (and how), or leave it as it is, with the reason either way.

A GPU that falls off the bus kills its CUDA process at once, so by the time gpuheal acts the
job is often already FAILED: jobs that *ended by failure* on the node shortly before the
signal are victims just like the ones still running there. A job that completed, one a person
cancelled, one that hit its time limit is not, and is never revived.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence

from gpuheal.api.names import JobReason
from gpuheal.api.remediationpolicy import PinnedJobs
from gpuheal_bridge.api.models import JobEnd, JobState

#: How a job ended that makes it a victim of the fault (when it ended within the window).
FAILURE_ENDS = frozenset({JobEnd.FAILED, JobEnd.NODE_FAIL})
#: States of a job that is waiting to run again (someone requeued it already).
_PENDING = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})
_OTHER_END_WORDS = {
    JobEnd.TIMEOUT: "hit its time limit",
    JobEnd.OUT_OF_MEMORY: "ran out of memory",
    JobEnd.PREEMPTED: "was preempted",
    JobEnd.BOOT_FAIL: "failed to boot its node",
    JobEnd.DEADLINE: "missed its deadline",
    JobEnd.OTHER: "ended",
}


@dataclasses.dataclass(frozen=True, slots=True)
class JobPlan:
    """One job's fate: ``requeue`` it (``hold``: requeued held; ``release_node``: the node is
    dropped from its --nodelist) or leave it, and why."""

    job: JobState
    requeue: bool
    reason: JobReason
    message: str
    hold: bool = False
    release_node: bool = False


def plan_jobs(
    jobs: Sequence[JobState],
    *,
    node: str,
    signal_at: dt.datetime,
    window: dt.timedelta,
    pinned: PinnedJobs,
) -> list[JobPlan]:
    """A plan per job of ``node`` (its Slurm name), in job id order, each job once.

    ``jobs``: the node's unfinished jobs and those that ended there lately (what the bridge
    lists since `listing_since`); ``signal_at``: when the fault was signalled. A job that
    ended before the window is this fault's business only if it failed (reported as too old);
    one that completed or was cancelled then is left out.
    """
    seen: dict[int, JobState] = {}
    for job in jobs:
        seen.setdefault(job.job_id, job)
    start = signal_at - window
    return [
        _plan(job, node=node, signal_at=signal_at, window=window, pinned=pinned)
        for _, job in sorted(seen.items())
        if job.ended is None
        or job.ended in FAILURE_ENDS
        or (job.end_time is not None and job.end_time >= start)
    ]


def listing_since(signal_at: dt.datetime, window: dt.timedelta) -> dt.datetime:
    """Ask the bridge for jobs that ended since then: the window, and as long again before it
    so that a failure just too old to count is still named (as too old) in the status."""
    return signal_at - 2 * window


def _plan(  # noqa: PLR0911 - one return per case of the table
    job: JobState,
    *,
    node: str,
    signal_at: dt.datetime,
    window: dt.timedelta,
    pinned: PinnedJobs,
) -> JobPlan:
    if node not in job.nodes or job.state in _PENDING:
        where = ",".join(job.nodes) or "no node"
        return JobPlan(job, False, JobReason.NOT_ON_NODE, f"{job.state} on {where}, not {node}")
    if job.ended is None:
        return _victim(job, JobReason.RUNNING, f"{job.state} on {node} at the fault", node, pinned)
    when = _relative(job.end_time, signal_at)
    if job.ended is JobEnd.COMPLETED:
        return JobPlan(job, False, JobReason.COMPLETED, f"completed (exit 0) {when}")
    if job.ended is JobEnd.CANCELLED:
        return JobPlan(job, False, JobReason.CANCELLED, f"cancelled (scancel) {when}")
    if job.ended not in FAILURE_ENDS:
        words = _OTHER_END_WORDS.get(job.ended, "ended")
        return JobPlan(job, False, JobReason.OTHER_END, f"{words} ({job.state}) {when}")
    how = f"{job.state}{_exit(job)} {when}"
    if job.end_time is None or job.end_time < signal_at - window:
        return JobPlan(
            job,
            False,
            JobReason.TOO_OLD,
            f"{how}: before the failedJobsWindow ({_seconds(window)}), not this fault's",
        )
    return _victim(job, JobReason.ENDED_BY_FAILURE, f"died {how}", node, pinned)


def _victim(job: JobState, reason: JobReason, what: str, node: str, pinned: PinnedJobs) -> JobPlan:
    if not job.batch:
        return JobPlan(
            job, False, JobReason.NOT_REQUEUEABLE, f"{what}; not a batch job: Slurm cannot requeue"
        )
    if not job.requeue:
        return JobPlan(
            job, False, JobReason.NOT_REQUEUEABLE, f"{what}; submitted with --no-requeue"
        )
    if node in job.required_nodes:
        if pinned is PinnedJobs.HOLD:
            return JobPlan(
                job,
                True,
                JobReason.PINNED_HELD,
                f"{what}; it names {node} in its --nodelist: requeued held as submitted "
                f"(pinnedJobs: Hold); edit its node list and `scontrol release {job.job_id}`",
                hold=True,
            )
        rest = [n for n in job.required_nodes if n != node]
        return JobPlan(
            job,
            True,
            reason,
            f"{what}; {node} dropped from its --nodelist (now {','.join(rest) or 'any node'}, "
            f"{job.node_count or 1} node(s))",
            release_node=True,
        )
    return JobPlan(job, True, reason, what)


def _exit(job: JobState) -> str:
    if job.exit_signal:
        return f", killed by signal {job.exit_signal}"
    if job.exit_status:
        return f", exit {job.exit_status}"
    return ""


def _seconds(delta: dt.timedelta) -> str:
    return f"{delta.total_seconds():g}s"


def _relative(at: dt.datetime | None, signal_at: dt.datetime) -> str:
    if at is None:
        return "at an unknown time"
    delta = (at - signal_at).total_seconds()
    if delta < 0:
        return f"{-delta:.1f}s before the fault"
    return f"{delta:.1f}s after the fault"
