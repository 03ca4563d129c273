"""The Slurm jobs a fault hit: list them, decide (`gpuheal.policy.jobs`), requeue, record.

Part of the `slurmDrain` step, after the node is drained (by gpuheal or by anyone else: who
drained a node never decides whether its jobs move):

1. list the node's jobs through the bridge: the running ones, and those that ended there
   since ``signal - failedJobsWindow`` (a process that died with its GPU leaves its job
   FAILED before gpuheal acts);
2. `plan_jobs` decides, per job, requeue (released from a --nodelist naming the node, or held)
   or leave it, and why; the plan is written to ``status.jobs`` *before* anything is done, so
   a restart carries on with the same jobs and the same idempotency keys;
3. one bridge call per job to requeue (concurrently): checkpoint signal and grace for a
   running job, the bad node excluded, expedited; a job that ended during the grace is
   requeued like a failed one; a job whose processes outlive SIGKILL gets its node set DOWN;
4. the outcome per job in ``status.jobs``, an Event for every job left behind, and the
   ``JobsRequeued`` condition: True only when jobs were requeued (they are named), else False
   with the reason.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from gpuheal.adapters.slurm import BridgeSlurm, SlurmError, SlurmNotFound, SlurmUnavailable
from gpuheal.api.meta import parse_duration
from gpuheal.api.names import EventReason, JobOutcome, JobReason
from gpuheal.api.noderemediation import JobRecord
from gpuheal.api.remediationpolicy import RequeueMode as PolicyRequeue
from gpuheal.api.remediationpolicy import SlurmDrainOptions, StuckJobAction
from gpuheal.policy.jobs import JobPlan, listing_since, plan_jobs
from gpuheal_bridge.api.models import (
    CheckpointSignal,
    JobResult,
    RequeueMode,
    RequeueOptions,
)
from gpuheal_bridge.api.models import JobOutcome as BridgeOutcome

RecordPlan = Callable[[list[JobRecord]], Awaitable[None]]
PostEvent = Callable[[str, str, str], Awaitable[None]]  # reason, message, type

_REQUEUED = {BridgeOutcome.REQUEUED, BridgeOutcome.REQUEUED_BY_JOB}
#: Left-behind reasons that are expected (Normal Events); the others are Warnings.
_EXPECTED = frozenset(
    {JobReason.COMPLETED, JobReason.CANCELLED, JobReason.OTHER_END, JobReason.NOT_ON_NODE}
)


@dataclass(frozen=True)
class Victims:
    """What became of the node's jobs: the records for ``status.jobs``, the JobsRequeued
    condition (status, reason, message), and whether some job still waits for the bridge."""

    records: list[JobRecord]
    condition: tuple[str, str, str]
    retry: str | None = None


def base_options(opts: SlurmDrainOptions) -> RequeueOptions:
    """How the policy wants a job requeued (a job's plan may hold it or release its node)."""
    checkpoint = None
    if opts.checkpoint_signal:
        grace = min(600.0, parse_duration(opts.grace_period).total_seconds())
        checkpoint = CheckpointSignal(signal=opts.checkpoint_signal, grace_seconds=grace)
    hold = opts.requeue is PolicyRequeue.REQUEUE_HOLD
    stuck = None
    if opts.on_stuck_job is StuckJobAction.DOWN_NODE:
        stuck = min(600.0, parse_duration(opts.stuck_job_timeout).total_seconds())
    return RequeueOptions(
        mode=RequeueMode.REQUEUE_HOLD if hold else RequeueMode.REQUEUE,
        checkpoint=checkpoint,
        exclude_node=True,
        expedite=not hold,
        requeue_ended=True,
        stuck_after_seconds=stuck,
        down_node=opts.node_down,
    )


def options_for(record: JobRecord, base: RequeueOptions) -> RequeueOptions:
    """The bridge request for one planned job: the same for the same record (a restart sends
    the same body under the same idempotency key)."""
    if record.reason is JobReason.PINNED_HELD:
        return base.model_copy(
            update={"mode": RequeueMode.REQUEUE_HOLD, "exclude_node": False, "expedite": False}
        )
    return base.model_copy(update={"release_node": record.release_node})


async def requeue_victims(
    slurm: BridgeSlurm,
    node: str,
    incident: str,
    opts: SlurmDrainOptions,
    *,
    signal_at: dt.datetime,
    now: dt.datetime,
    recorded: Sequence[JobRecord],
    record_plan: RecordPlan,
    post_event: PostEvent,
) -> Victims:
    """Steps 1-4 above. Raises SlurmUnavailable when the jobs cannot be listed (retry)."""
    records = list(recorded)
    if not records:
        window = parse_duration(opts.failed_jobs_window)
        listing = await slurm.jobs(node, ended_since=listing_since(signal_at, window))
        plans = plan_jobs(
            listing.jobs,
            node=listing.slurm_node,
            signal_at=signal_at,
            window=window,
            pinned=opts.pinned_jobs,
        )
        records = [_planned(p, now) for p in plans]
        if any(r.outcome is JobOutcome.PLANNED for r in records):
            await record_plan(records)
    base = base_options(opts)
    todo = [r for r in records if r.outcome is JobOutcome.PLANNED]
    answers = await asyncio.gather(
        *(_requeue_one(slurm, node, incident, r, base, now) for r in todo)
    )
    done = [record for record, _ in answers]
    why = next((error for _, error in answers if error), None)
    by_id = {r.job_id: r for r in done}
    final = [by_id.get(r.job_id, r) for r in records]
    for before, after in zip(todo, done, strict=True):
        if after.outcome is not JobOutcome.PLANNED and after != before:
            await _announce(after, post_event, lost_gpu=opts.node_down)
    for r in records:  # left alone from the start: announced once, when planned
        if r.outcome is JobOutcome.LEFT and not recorded:
            await _announce(r, post_event)
    waiting = [r for r in final if r.outcome is JobOutcome.PLANNED]
    retry = None
    if waiting:
        retry = f"bridge unavailable for job(s) {', '.join(r.job_id for r in waiting)}"
        if why:
            retry += f": {why}"
    return Victims(final, _condition(node, final, signal_at, opts), retry)


def _planned(plan: JobPlan, now: dt.datetime) -> JobRecord:
    job = plan.job
    return JobRecord(
        job_id=str(job.job_id),
        name=job.name,
        user=job.user,
        state=job.state,
        outcome=JobOutcome.PLANNED if plan.requeue else JobOutcome.LEFT,
        reason=plan.reason,
        message=plan.message,
        at=now,
        release_node=plan.release_node,
    )


async def _requeue_one(  # noqa: PLR0917
    slurm: BridgeSlurm,
    node: str,
    incident: str,
    record: JobRecord,
    base: RequeueOptions,
    now: dt.datetime,
) -> tuple[JobRecord, str | None]:
    """The job's record after one bridge call, and why the bridge could not answer (the
    record then stays Planned: the step waits and asks again with the same key)."""
    try:
        result = await slurm.requeue_job(
            int(record.job_id),
            options_for(record, base),
            from_node=node,
            idempotency_key=f"{incident}-requeue-{record.job_id}",
        )
    except SlurmNotFound:
        gone = _update(record, JobOutcome.LEFT, JobReason.GONE, "Slurm no longer knows it", now)
        return gone, None
    except SlurmUnavailable as exc:
        return record, str(exc)
    except SlurmError as exc:
        return _update(record, JobOutcome.FAILED, JobReason.SLURM_REFUSED, str(exc), now), None
    return _from_result(record, result, now), None


def _from_result(record: JobRecord, result: JobResult, now: dt.datetime) -> JobRecord:
    notes = (result.detail or "").split("; ")
    if record.reason is JobReason.ENDED_BY_FAILURE:  # the plan said so already
        notes = [n for n in notes if not n.startswith("ended ")]
    detail = f": {'; '.join(n for n in notes if n)}" if any(notes) else ""
    if result.outcome in _REQUEUED or result.outcome is BridgeOutcome.REQUEUED_HELD:
        reason = record.reason
        if result.outcome is BridgeOutcome.REQUEUED_BY_JOB:
            reason = JobReason.REQUEUED_ITSELF
        elif record.reason is JobReason.RUNNING and result.ended_before is not None:
            reason = JobReason.ENDED_ON_SIGNAL if result.signalled else JobReason.ENDED_BY_FAILURE
        held = result.outcome is BridgeOutcome.REQUEUED_HELD
        where = ",".join(result.nodes_after or []) or "waiting to run"
        return record.model_copy(
            update={
                "outcome": JobOutcome.HELD if held else JobOutcome.REQUEUED,
                "reason": reason,
                "message": f"{record.message}; requeued"
                + (" held" if held else f": {_left(result)}; {result.state_after} ({where})")
                + detail,
                # when Slurm accepted the requeue (the bridge's clock; a replayed answer keeps
                # it), not when it is recorded: after an API server outage these differ
                "at": result.requeued_at or now,
                "nodes_after": list(result.nodes_after or []),
                "node_down": result.node_down,
                "still_on_node": not held and _still_on_node(result),
            }
        )
    reason = {
        BridgeOutcome.NOT_REQUEUEABLE: JobReason.NOT_REQUEUEABLE,
        BridgeOutcome.NOT_ON_NODE: JobReason.NOT_ON_NODE,
        BridgeOutcome.GONE: JobReason.GONE,
        BridgeOutcome.NOT_RUNNING: _not_running_reason(result),
        BridgeOutcome.ENDED_DURING_GRACE: _not_running_reason(result),
    }.get(result.outcome, JobReason.SLURM_REFUSED)
    outcome = JobOutcome.FAILED if reason is JobReason.SLURM_REFUSED else JobOutcome.LEFT
    return _update(record, outcome, reason, f"{result.outcome.value}{detail}", now)


def _not_running_reason(result: JobResult) -> JobReason:
    state = (result.state_after or result.state_before or "").upper()
    if state == "COMPLETED":
        return JobReason.COMPLETED
    if state == "CANCELLED":
        return JobReason.CANCELLED
    if state.startswith("PENDING"):
        return JobReason.NOT_ON_NODE
    return JobReason.OTHER_END


def _still_on_node(result: JobResult) -> bool:
    return result.left_node_seconds is None and not result.node_down


def _left(result: JobResult) -> str:
    if result.node_down and not result.stuck:
        return "off the node at once: its GPU is lost, gpuheal set the node DOWN"
    if result.node_down:
        return "off the node only after gpuheal set it DOWN"
    if not _still_on_node(result):
        return f"off the node {result.left_node_seconds:g}s after the requeue"
    return "still on the node"


def _update(
    record: JobRecord, outcome: JobOutcome, reason: JobReason, message: str, now: dt.datetime
) -> JobRecord:
    return record.model_copy(
        update={
            "outcome": outcome,
            "reason": reason,
            "message": f"{record.message}; {message}",
            "at": now,
        }
    )


async def _announce(record: JobRecord, post_event: PostEvent, *, lost_gpu: bool = False) -> None:
    who = f"job {record.job_id}" + (f" ({record.name})" if record.name else "")
    if record.node_down and lost_gpu:
        await post_event(
            EventReason.NODE_DOWN_FOR_LOST_GPU,
            f"{who}: its GPU is lost; the Slurm node was set DOWN at once (still drained) so "
            "that Slurm released it without waiting for its processes",
            "Normal",
        )
    elif record.node_down:
        await post_event(
            EventReason.NODE_DOWN_FOR_STUCK_JOB,
            f"{who}: its processes outlived SIGKILL; the Slurm node was set DOWN to release it",
            "Warning",
        )
    if record.still_on_node:
        await post_event(
            EventReason.JOB_STUCK_ON_NODE,
            f"{who} was requeued but still holds the node: {_STUCK_HOW}",
            "Warning",
        )
    if record.outcome is JobOutcome.HELD:
        await post_event(EventReason.JOB_HELD, f"{who}: {record.message}", "Warning")
    elif record.outcome in (JobOutcome.LEFT, JobOutcome.FAILED):
        kind = "Normal" if record.reason in _EXPECTED else "Warning"
        text = f"{who} not requeued ({record.reason.value}): {record.message}"
        await post_event(EventReason.JOB_LEFT_BEHIND, text, kind)


#: What a job requeued but still on its node waits for: onStuckJob is Report, or setting the
#: node DOWN failed (its record says so).
_STUCK_HOW = (
    "its processes outlived SIGKILL and the node was not set DOWN (onStuckJob: Report, or "
    "setting it DOWN failed: see the job's record), so it runs again only once Slurm releases "
    "it (slurmd drains the node 'Kill task failed', or an admin sets it DOWN)"
)


def _condition(
    node: str, records: Sequence[JobRecord], signal_at: dt.datetime, opts: SlurmDrainOptions
) -> tuple[str, str, str]:
    moved = [r for r in records if r.outcome in (JobOutcome.REQUEUED, JobOutcome.HELD)]
    stuck = [r for r in moved if r.still_on_node]
    others = [r for r in records if r not in moved]
    names = ", ".join(_name(r) for r in moved if r not in stuck)
    rest = "; ".join(f"{_name(r)}: {r.outcome.value} ({r.reason.value})" for r in others)
    if stuck:  # Slurm took the requeue, yet the job cannot run anywhere: not a success yet
        said = f"requeued but still on {node}: {', '.join(_name(r) for r in stuck)}: {_STUCK_HOW}"
        if names:
            said += f"; requeued {names}"
        return "False", "StuckOnNode", said + (f"; {rest}" if rest else "")
    if moved:
        return "True", "Requeued", f"requeued {names}" + (f"; {rest}" if rest else "")
    if not records:
        since = signal_at - parse_duration(opts.failed_jobs_window)
        return (
            "False",
            "NoJobs",
            f"no job on {node} at the fault (running, or ended there since "
            f"{since.isoformat(timespec='seconds')})",
        )
    if any(r.outcome is JobOutcome.PLANNED for r in records):
        return "False", "Requeueing", f"not requeued yet: {rest}"
    if any(r.outcome is JobOutcome.FAILED for r in records):
        return "False", "RequeueFailed", rest
    return "False", "NothingToRequeue", f"left alone: {rest}"


def _name(record: JobRecord) -> str:
    return record.job_id + (f" ({record.name})" if record.name else "")


__all__ = ["Victims", "base_options", "options_for", "requeue_victims"]
