"""What the bridge does, written once against the :class:`~gpuheal_bridge.backends.base.Backend`
interface: ownership-checked drain and resume, and the requeue sequence

    check state -> [checkpoint signal -> bounded grace] -> requeue/requeuehold
    -> wait until the job left the node [-> still there past KillWait: node DOWN]
    -> exclude the bad node [, drop it from a --nodelist] -> [expedite: StartTime=now
    on BeginTime] -> [wait RUNNING]

With ``expedite`` and no ``wait_running_seconds`` (what the operator asks for), the answer
comes as soon as Slurm accepted the requeue: the drain and the requeue are on record then,
and the wait for PENDING/BeginTime (seconds on a busy slurmctld), the exclusion and the
expedite go on in the background under the job's lock.

Each step looks at Slurm first, so repeating a call repeats nothing harmful: a drained node
is not drained again, a job that is not running is never requeued unless the caller asks for
victims that ended by failure (``requeue_ended``: ``scontrol requeue`` of a CANCELLED or
COMPLETED job exits 0 and revives it, so those are never touched), resume of a node that is
not drained is a no-op. Who drained a node decides who may resume it, never whether its jobs
are requeued. Calls on one node (and on one job) are serialised by asyncio locks. The clock
and sleep are injectable so the sequence is unit-tested without waiting.
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime as dt
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from gpuheal_bridge.api.models import (
    DrainOutcome,
    DrainRequest,
    DrainResponse,
    JobEnd,
    JobOutcome,
    JobResult,
    JobSignalOutcome,
    JobSignalRequest,
    JobSignalResult,
    JobsResponse,
    JobState,
    NodeState,
    Owner,
    RequeueMode,
    RequeueOptions,
    ResumeOutcome,
    ResumeRequest,
    ResumeResponse,
)
from gpuheal_bridge.api.names import REASON_PREFIX
from gpuheal_bridge.backends.base import (
    Backend,
    BackendError,
    JobProbe,
    NotFound,
    Rejected,
    SlurmNode,
    Unavailable,
)
from gpuheal_bridge.exclusions import ExclusionLedger
from gpuheal_bridge.ownership import build_reason, classify

log = logging.getLogger("gpuheal_bridge.operations")
#: Poll interval of a requeue finishing in the background (set in its task): no one waits for
#: its answer, and a burst of them polling every 0.1 s is what crowds out the calls that do.
_BACKGROUND_POLL: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "background_poll", default=None
)

#: States from which a job can be requeued. PENDING cannot ("Job is pending execution") and
#: finished states must not be (Slurm would revive a job someone cancelled).
REQUEUEABLE_STATES = frozenset({"RUNNING", "SUSPENDED", "CONFIGURING"})
#: Transitional states we wait through before deciding what happened.
TRANSIENT_STATES = frozenset({"COMPLETING", "SIGNALING", "STAGE_OUT", "CONFIGURING"})
PENDING_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})
#: Ended before the call: requeued only with ``requeue_ended`` (victims of the fault).
FAILED_ENDS = frozenset({JobEnd.FAILED, JobEnd.NODE_FAIL})
#: Ended during the checkpoint grace: it stopped because of our signal (not a person's scancel).
GRACE_ENDS = frozenset({JobEnd.FAILED, JobEnd.NODE_FAIL, JobEnd.COMPLETED})
#: Slurm's default KillWait, used when the configuration cannot be read.
DEFAULT_KILL_WAIT = 30.0
#: slurmd sends SIGKILL to a job it terminates max(KillWait, 5 s) after SIGTERM: measured on
#: 22.05 with KillWait=2, a job that ignores SIGTERM is killed ~4.7 s after the requeue.
SLURMD_MIN_KILL_DELAY = 5.0
_KILL_WAIT_TTL = 600.0


#: The drain reasons of reserve pools' spares the bridge resumes without ``force``
#: (``--reserve-reasons``): the ReservePool's default ``promotion.slurm.reserveReason``.
DEFAULT_RESERVE_REASONS = frozenset({"reserve pool"})


class ReasonNotAllowed(Exception):
    """A ``reserve_reason`` that is not one of the bridge's reserve pool reasons: resuming by
    it would let a token lift any drain whose reason text it knows (an admin's)."""


class OwnershipConflict(Exception):
    """Resume refused: the drain belongs to someone else (or another incident)."""

    def __init__(self, message: str, current: NodeState) -> None:
        super().__init__(message)
        self.current = current


def node_state(k8s_name: str, node: SlurmNode) -> NodeState:
    info = classify(node.reason, node.unavailable)
    return NodeState(
        node=k8s_name,
        slurm_node=node.name,
        state=node.state,
        flags=list(node.flags),
        drain=node.drain,
        unavailable=node.unavailable,
        reason=node.reason,
        reason_user=node.reason_user,
        reason_time=node.reason_time,
        owner=info.owner,
        incident=info.incident,
        xid=info.xid,
        boot_time=node.boot_time,
        slurmd_start_time=node.slurmd_start_time,
    )


def held_out(state: NodeState) -> bool:
    """Slurm keeps the node out of service until someone resumes it: a DRAIN or FAIL flag.
    DOWN alone does not: with ``ReturnToService=2`` (1 for a node DOWN as not responding)
    slurmctld puts a DOWN node back in service as soon as its slurmd registers again
    (measured on 22.05: a node set DOWN whose slurmd still answered ran a job again ~20 s
    later). DOWN+DRAIN stays out: the registration clears DOWN, not DRAIN."""
    return state.drain or state.state == "FAIL" or "FAIL" in state.flags


class Operations:
    def __init__(
        self,
        backend: Backend,
        *,
        poll_interval: float = 0.1,
        settle_timeout: float = 30.0,
        expedite_timeout: float = 15.0,
        background: int = 4,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        wall_clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        exclusions: ExclusionLedger | None = None,
        reserve_reasons: frozenset[str] = DEFAULT_RESERVE_REASONS,
    ) -> None:
        self.backend = backend
        self.reserve_reasons = reserve_reasons
        self.exclusions = exclusions or ExclusionLedger()
        self._wall = wall_clock  # the times an answer reports (requeued_at, at)
        self.poll_interval = poll_interval
        self.settle_timeout = settle_timeout
        self.expedite_timeout = expedite_timeout
        self._clock = clock
        self._sleep = sleep
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._background: set[asyncio.Task[JobResult | None]] = set()
        # Requeues finishing in the background poll Slurm every `poll_interval`: a burst of
        # them must not crowd out the calls that are waiting for an answer (measured: 160
        # at once, 200 slurmds, a loaded 2-core host: every call timed out for ~30 s).
        self._background_slots = asyncio.Semaphore(background)
        self._kill_wait_value: float | None = None
        self._kill_wait_at = 0.0

    def lock(self, key: str) -> asyncio.Lock:
        """Per-node (``node:NAME``) or per-job (``job:ID``) lock; one event loop only."""
        return self._locks[key]

    async def settled(self, within: float | None = None) -> None:
        """Wait for the requeues still finishing in the background (tests, shutdown)."""
        if self._background:
            await asyncio.wait(set(self._background), timeout=within)

    # ---- reads ---------------------------------------------------------------------------
    async def get_node(self, k8s_name: str, slurm_name: str) -> NodeState:
        return node_state(k8s_name, await self.backend.get_node(slurm_name))

    async def jobs(
        self,
        k8s_name: str,
        slurm_name: str,
        ended_since: dt.datetime | None = None,
        *,
        gpus: bool = False,
    ) -> JobsResponse:
        """The node's unfinished jobs, and with ``ended_since`` the jobs that ended there
        since then (``ended`` says how), as long as slurmctld remembers them; with ``gpus``
        the unfinished ones carry the GPU indexes they hold there (a read more per job on
        the CLI backend: asked for only where a single GPU matters).

        The three reads go out together: this listing sits between the drain and the first
        requeue of a fault, where every round trip to slurmctld delays the job's move."""
        if ended_since is not None and ended_since.tzinfo is None:
            ended_since = ended_since.replace(tzinfo=dt.UTC)

        async def ended() -> list[JobState]:
            if ended_since is None:
                return []
            return await self.backend.ended_jobs_on_node(slurm_name, ended_since)

        # get_node: a 404 for an unknown node, not an empty list
        _, running, gone = await asyncio.gather(
            self.backend.get_node(slurm_name),
            self.backend.jobs_on_node(slurm_name, gpus=gpus),
            ended(),
        )
        return JobsResponse(node=k8s_name, slurm_node=slurm_name, jobs=running + gone)

    # ---- drain / resume ------------------------------------------------------------------
    async def drain(self, k8s_name: str, slurm_name: str, req: DrainRequest) -> DrainResponse:
        async with self.lock(f"node:{slurm_name}"):
            previous = node_state(k8s_name, await self.backend.get_node(slurm_name))
            current = previous
            at = None
            results: list[JobResult] = []
            if held_out(previous) and previous.owner is Owner.OTHER:
                # Someone else's drain: their reason stays (and so does the right to resume
                # the node); the jobs are the fault's victims all the same.
                outcome = DrainOutcome.DRAINED_BY_OTHER
            elif held_out(previous) and previous.owner is Owner.GPUHEAL:
                outcome = DrainOutcome.ALREADY_DRAINED
            else:
                # In service, or only DOWN (not responding, or set DOWN): DOWN does not keep
                # a node out, so it is drained with our reason all the same (`previous`
                # says it was DOWN, and why).
                await self.backend.drain(slurm_name, build_reason(req.incident, req.xid))
                at = self._wall()
                current = node_state(k8s_name, await self.backend.get_node(slurm_name))
                outcome = DrainOutcome.DRAINED
            if req.requeue is not None:
                results = await self._requeue_all(slurm_name, req.requeue)
            return DrainResponse(
                node=k8s_name,
                slurm_node=slurm_name,
                outcome=outcome,
                owner=current.owner,
                previous=previous,
                current=current,
                jobs=results,
                at=at,
            )

    async def _requeue_all(self, slurm_name: str, opts: RequeueOptions) -> list[JobResult]:
        """Requeue every unfinished job on the node, concurrently (each under its job lock)."""
        running = await self.backend.jobs_on_node(slurm_name)
        return list(
            await asyncio.gather(
                *(self._requeue_locked(j.job_id, opts, slurm_name) for j in running)
            )
        )

    def check_reserve_reason(self, reason: str | None) -> None:
        """A reserve pool's reason must be one the bridge was given (``--reserve-reasons``):
        the caller names the reason it lifts, so any text would do, an admin's included."""
        if reason is not None and reason not in self.reserve_reasons:
            known = ", ".join(repr(r) for r in sorted(self.reserve_reasons))
            raise ReasonNotAllowed(
                f"{reason!r} is not one of the bridge's reserve pool reasons ({known}; "
                "--reserve-reasons): nothing was done"
            )

    async def resume(self, k8s_name: str, slurm_name: str, req: ResumeRequest) -> ResumeResponse:
        self.check_reserve_reason(req.reserve_reason)
        async with self.lock(f"node:{slurm_name}"):
            previous = node_state(k8s_name, await self.backend.get_node(slurm_name))
            if not previous.unavailable:  # in service already (resumed by Slurm or a person)
                return ResumeResponse(
                    node=k8s_name,
                    slurm_node=slurm_name,
                    outcome=ResumeOutcome.NOT_DRAINED,
                    previous=previous,
                    current=previous,
                    exclusion_lifted_from=await self._lift_exclusions(slurm_name),
                )
            if req.reserve_reason is not None:
                # A spare of a reserve pool: its drain is the pool's, or someone drained
                # (or Slurm set DOWN) a spare for a reason of their own, which force would
                # have lifted. Checked here, under the node's lock, so that a drain an admin
                # puts on between the operator's look and this call is never lifted.
                if not (previous.drain and previous.reason == req.reserve_reason):
                    raise OwnershipConflict(
                        f"{slurm_name} is not waiting in the reserve pool "
                        f"({previous.state.lower()}{' drain' if previous.drain else ''}, "
                        f"{previous.reason_user or 'unknown'}: {previous.reason!r}, not "
                        f"{req.reserve_reason!r}); left as it is",
                        previous,
                    )
            elif not req.force:
                if previous.owner is not Owner.GPUHEAL:
                    raise OwnershipConflict(
                        f"{slurm_name} was drained by someone else "
                        f"({previous.reason_user or 'unknown'}: {previous.reason!r}); "
                        "not resuming without force",
                        previous,
                    )
                if req.incident is None:
                    # A gpuheal drain belongs to one incident: lifting it takes that
                    # incident's name (or force), not just a valid token.
                    raise OwnershipConflict(
                        f"{slurm_name} is drained for incident {previous.incident!r}: name "
                        "that incident to resume it, or force",
                        previous,
                    )
                if previous.incident != req.incident:
                    raise OwnershipConflict(
                        f"{slurm_name} is drained for incident {previous.incident!r}, "
                        f"not {req.incident!r}",
                        previous,
                    )
            try:
                await self.backend.resume(slurm_name)
            except Rejected:
                # "Invalid node state specified": someone resumed it meanwhile -> idempotent.
                again = node_state(k8s_name, await self.backend.get_node(slurm_name))
                if again.unavailable:
                    raise
            current = node_state(k8s_name, await self.backend.get_node(slurm_name))
        lifted = await self._lift_exclusions(slurm_name)
        return ResumeResponse(
            node=k8s_name,
            slurm_node=slurm_name,
            outcome=ResumeOutcome.RESUMED,
            forced=req.force and previous.owner is not Owner.GPUHEAL,
            previous=previous,
            current=current,
            exclusion_lifted_from=lifted,
        )

    async def _lift_exclusions(self, slurm_name: str) -> list[int]:
        """The node is back in service: take it out of the ExcNodeList of the pending jobs
        the bridge excluded it from (the others: at their next requeue). Best effort: a job
        Slurm will not update now keeps its record. Returns the jobs it was lifted from."""
        lifted = []
        for job_id in self.exclusions.node_returned(slurm_name):
            async with self.lock(f"job:{job_id}"):
                try:
                    job = await self.backend.get_job(job_id)
                except NotFound:
                    self.exclusions.forget(job_id, [slurm_name])
                    continue
                except BackendError as exc:
                    log.warning("job %s: exclusion of %s kept: %s", job_id, slurm_name, exc)
                    continue
                if slurm_name not in job.excluded_nodes or job.ended is not None:
                    self.exclusions.forget(job_id, [slurm_name])  # changed meanwhile, or over
                    continue
                if job.state not in PENDING_STATES:
                    continue  # Slurm takes ExcNodeList only while pending: at its requeue
                keep = [n for n in job.excluded_nodes if n != slurm_name]
                try:
                    await self.backend.set_excluded_nodes(job_id, keep)
                except BackendError as exc:
                    log.warning("job %s: exclusion of %s kept: %s", job_id, slurm_name, exc)
                    continue
                self.exclusions.forget(job_id, [slurm_name])
                lifted.append(job_id)
        if lifted:
            log.info("%s back in service: no longer excluded from jobs %s", slurm_name, lifted)
        return lifted

    # ---- signal only ---------------------------------------------------------------------
    async def signal_job(
        self, job_id: int, req: JobSignalRequest, from_node: str
    ) -> JobSignalResult:
        """Send a job running on ``from_node`` the signal, and nothing more: no requeue, no
        hold, no grace to wait out (the job checkpoints and keeps running). Raises NotFound
        (404) and Unavailable (503) before anything was sent, so a retry with the same
        idempotency key sends it then; once sent, the answer says so."""
        async with self.lock(f"job:{job_id}"):  # not beside a requeue of the same job
            job = await self.backend.get_job(job_id)
            base = {"job_id": job_id, "state": job.state}
            if from_node not in job.nodes:
                return JobSignalResult(
                    **base,
                    outcome=JobSignalOutcome.NOT_ON_NODE,
                    detail=f"job runs on {','.join(job.nodes) or 'no node'}, not {from_node}",
                )
            if job.state != "RUNNING":
                return JobSignalResult(
                    **base,
                    outcome=JobSignalOutcome.NOT_RUNNING,
                    detail=f"job is {job.state}: nothing to checkpoint, not signalled",
                )
            await self.backend.signal(job_id, req.signal, req.target)
            return JobSignalResult(
                **base, outcome=JobSignalOutcome.SIGNALLED, signalled_at=self._wall()
            )

    # ---- requeue -------------------------------------------------------------------------
    async def requeue_job(
        self, job_id: int, opts: RequeueOptions, from_node: str | None = None
    ) -> JobResult:
        """Requeue one job. Raises NotFound before anything was done, and Unavailable
        (slurmctld gone, e.g. in the checkpoint grace) whenever the job was not requeued yet:
        a 503, not stored under the idempotency key, so the caller's retry with the same key
        carries on (a second signal and grace) instead of being answered "failed" for good.
        Once Slurm accepted the requeue, the answer says requeued whatever comes after."""
        return await self._requeue_locked(job_id, opts, from_node, unavailable_raises=True)

    async def _requeue_locked(
        self,
        job_id: int,
        opts: RequeueOptions,
        from_node: str | None,
        *,
        unavailable_raises: bool = False,
    ) -> JobResult:
        """``unavailable_raises``: one job's own call, where a first read that fails is the
        call's error (nothing was done: a job Slurm does not know is a 404, slurmctld gone a
        503, another refusal a 409; the node's sweep reports the job GONE or FAILED instead),
        and slurmctld gone before the requeue a 503."""
        async with self.lock(f"job:{job_id}"):
            job: JobState | None = None
            try:
                job = await self.backend.get_job(job_id)  # under the lock: fresh after a peer
                return await self._requeue(job, opts, from_node)
            except BackendError as exc:
                if unavailable_raises and (job is None or isinstance(exc, Unavailable)):
                    raise
                if isinstance(exc, NotFound):
                    return JobResult(job_id=job_id, outcome=JobOutcome.GONE, detail=str(exc))
                kind = "slurmctld unavailable" if isinstance(exc, Unavailable) else "slurm"
                return JobResult(job_id=job_id, outcome=JobOutcome.FAILED, detail=f"{kind}: {exc}")

    async def _requeue(  # noqa: PLR0911 - one return per outcome
        self, job: JobState, opts: RequeueOptions, from_node: str | None
    ) -> JobResult:
        job_id = job.job_id
        if opts.requeue_ended and job.state in TRANSIENT_STATES - REQUEUEABLE_STATES:
            # Ending right now (COMPLETING): see how it ends before deciding.
            await self._wait(job_id, lambda p: p.state not in TRANSIENT_STATES, self.settle_timeout)
            job = await self.backend.get_job(job_id)
        base = {"job_id": job_id, "state_before": job.state}
        if await self._requeued_by_node_down(job, opts, from_node):
            requeued = _Requeued(job, opts, from_node, JobOutcome.REQUEUED, False, self._clock())
            return await self._after_requeue(replace(requeued, already_pending=True), self._wall())
        if from_node is not None and from_node not in job.nodes:
            return JobResult(
                **base,
                outcome=JobOutcome.NOT_ON_NODE,
                detail=f"job runs on {','.join(job.nodes) or 'no node'}, not {from_node}",
            )
        problem = _not_requeueable(job)
        victim = opts.requeue_ended and job.ended in FAILED_ENDS
        if job.state not in REQUEUEABLE_STATES and not victim:
            return JobResult(
                **base,
                outcome=JobOutcome.NOT_RUNNING,
                detail=f"job is {job.state}{_exit_text(job)}; requeue would revive or fail, "
                "left alone",
            )
        if problem:
            return JobResult(**base, outcome=JobOutcome.NOT_REQUEUEABLE, detail=problem)
        if victim:  # ended by failure before the call: nothing to signal, requeue it now
            return await self._requeue_now(job, opts, from_node, signalled=False)

        signalled = False
        if opts.checkpoint is not None and not opts.down_node:
            await self.backend.signal(job_id, opts.checkpoint.signal, opts.checkpoint.target)
            signalled = True
            probe = await self._wait(
                job_id,
                lambda p: p.state not in ("RUNNING", "CONFIGURING"),
                opts.checkpoint.grace_seconds,
                interval=max(self.poll_interval, 0.25),
            )
            if probe.state != "RUNNING":
                probe = await self._wait(
                    job_id, lambda p: p.state not in TRANSIENT_STATES, self.settle_timeout
                )
                after = await self.backend.get_job(job_id)
                if after.state in PENDING_STATES and after.restart_count > job.restart_count:
                    by_job = JobOutcome.REQUEUED_BY_JOB
                    requeued = _Requeued(job, opts, from_node, by_job, signalled, self._clock())
                    return await self._after_requeue(
                        replace(requeued, already_pending=True), self._wall()
                    )
                if opts.requeue_ended and after.ended in GRACE_ENDS:
                    # It stopped because of the checkpoint signal: requeue it like a failed job.
                    return await self._requeue_now(after, opts, from_node, signalled=True)
                return JobResult(
                    **base,
                    outcome=JobOutcome.ENDED_DURING_GRACE,
                    state_after=after.state,
                    signalled=True,
                    ended_before=after.ended,
                    detail="job left RUNNING after the checkpoint signal and did not requeue "
                    "itself; not revived",
                )
        return await self._requeue_now(job, opts, from_node, signalled=signalled)

    async def _requeue_now(
        self, job: JobState, opts: RequeueOptions, from_node: str | None, *, signalled: bool
    ) -> JobResult:
        """``scontrol requeue`` (or requeuehold) now, then the rest of the sequence."""
        hold = opts.mode is RequeueMode.REQUEUE_HOLD
        outcome = JobOutcome.REQUEUED_HELD if hold else JobOutcome.REQUEUED
        requeued = _Requeued(job, opts, from_node, outcome, signalled, self._clock())
        try:
            await self.backend.requeue(job.job_id, hold=hold)
        except Rejected as exc:
            failed = JobOutcome.FAILED
            return requeued.answer(outcome=failed, ended_before=job.ended, detail=f"slurm: {exc}")
        return await self._after_requeue(requeued, self._wall())

    async def _after_requeue(self, requeued: _Requeued, requeued_at: dt.datetime) -> JobResult:
        opts = requeued.opts
        # A plain requeue of a running job, where the caller asked for nothing the answer must
        # carry (no wait for RUNNING, no verdict on a job that may outlive SIGKILL, no ended
        # job or --nodelist release to report): answer now, finish in the background.
        answer_now = not (
            opts.wait_running_seconds
            or opts.stuck_after_seconds is not None
            or opts.down_node
            or opts.requeue_ended
            or opts.release_node
        )
        if opts.expedite and answer_now and requeued.outcome is JobOutcome.REQUEUED:
            self._in_background(requeued.job.job_id, self._settle(requeued))
            return requeued.answer(
                requeued_at=requeued_at,
                detail="requeue accepted; the wait for PENDING, the exclusion and the "
                "expedite go on in the bridge",
            )
        try:
            result = await self._settle(requeued)
        except Unavailable as exc:
            # Requeued: that is the answer (a retry must not find a PENDING job and say
            # "left alone"); what followed is missing and said so.
            return requeued.answer(
                ended_before=requeued.job.ended,
                requeued_at=requeued_at,
                detail=f"requeued; then slurmctld unavailable, the exclusion/expedite may be "
                f"missing: {exc}",
            )
        return result.model_copy(update={"requeued_at": requeued_at})

    def _in_background(self, job_id: int, settle: Awaitable[JobResult]) -> None:
        async def run() -> JobResult | None:
            _BACKGROUND_POLL.set(max(self.poll_interval, 0.25))
            async with self._background_slots, self.lock(f"job:{job_id}"):
                try:
                    result = await settle
                except Exception:
                    log.exception("job %s: finishing its requeue failed", job_id)
                    return None
            log.info("job %s requeued: %s", job_id, result.model_dump(exclude_none=True))
            return result

        task = asyncio.create_task(run(), name=f"requeue:{job_id}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _settle(self, requeued: _Requeued) -> JobResult:
        job, opts, from_node, t0 = requeued.job, requeued.opts, requeued.from_node, requeued.t0
        outcome, job_id = requeued.outcome, job.job_id
        notes: list[str] = []
        if job.ended is not None:
            notes.append(f"ended {job.state}{_exit_text(job)} before the requeue")
        bad = [from_node] if from_node else list(job.nodes)
        left = await self._leave_node(job, opts, bad, t0=t0, notes=notes)
        probe = left.probe
        requeue_seconds = None if requeued.already_pending else left.seconds
        if probe.state not in PENDING_STATES:
            notes.append(f"after requeue the job is {probe.state}")

        wanted: list[str] | None = None
        returned = self.exclusions.returned_for(job_id) - set(bad)
        if opts.exclude_node and bad:
            # the nodes this bridge excluded earlier and resumed since are not out any more
            wanted = sorted((set(job.excluded_nodes) - returned) | set(bad))
        elif returned & set(job.excluded_nodes):
            wanted = sorted(set(job.excluded_nodes) - returned)
        required: list[str] | None = None
        pinned = [n for n in bad if n in job.required_nodes]
        if pinned and opts.release_node:
            required = [n for n in job.required_nodes if n not in pinned]
        elif pinned and wanted is not None:
            notes.append(
                f"it requires {','.join(pinned)} (--nodelist) and now excludes it: it cannot "
                "start until its node list is changed"
            )

        expedited, excluded, required_after = await self._expedite_and_exclude(
            job_id,
            opts=opts,
            outcome=outcome,
            probe=probe,
            bad=bad,
            wanted=wanted,
            required=required,
            reused=[n for n in job.nodes if n not in bad],
            notes=notes,
        )

        if excluded is not None:
            if opts.exclude_node:
                self.exclusions.added(job_id, [n for n in bad if n not in job.excluded_nodes])
            self.exclusions.forget(job_id, returned - set(excluded))

        to_running: float | None = None
        if opts.wait_running_seconds > 0 and outcome is not JobOutcome.REQUEUED_HELD:
            probe = await self._wait(
                job_id, lambda p: p.state == "RUNNING", opts.wait_running_seconds
            )
            if probe.state == "RUNNING":
                to_running = round(self._clock() - t0, 3)
            else:
                notes.append(f"not running within {opts.wait_running_seconds:g}s")

        final = await self.backend.get_job(job_id)
        return requeued.answer(
            state_after=final.state,
            excluded_nodes=excluded,
            expedited=expedited,
            requeue_seconds=requeue_seconds,
            requeue_to_running_seconds=to_running,
            restart_count=final.restart_count,
            nodes_after=final.nodes,
            ended_before=job.ended,
            left_node_seconds=left.seconds,
            stuck=left.stuck,
            node_down=left.node_down,
            released_node=required_after is not None,
            required_nodes_after=required_after,
            detail="; ".join(notes) or None,
        )

    async def _leave_node(
        self,
        job: JobState,
        opts: RequeueOptions,
        bad: list[str],
        *,
        t0: float,
        notes: list[str],
    ) -> _Left:
        """Wait until the requeued job no longer holds its node (Slurm: SIGTERM, KillWait,
        SIGKILL). With ``stuck_after_seconds``, a job still there past KillWait plus that much
        has processes SIGKILL cannot end (hung in the driver): the node is set DOWN, which
        makes Slurm release the job, and the wait goes on."""
        job_id = job.job_id
        if opts.down_node:
            return await self._leave_down_node(job, bad, t0=t0, notes=notes)
        if opts.stuck_after_seconds is None:
            limit = self.settle_timeout
        else:
            kill_after = max(await self._kill_wait(), SLURMD_MIN_KILL_DELAY)
            limit = kill_after + opts.stuck_after_seconds
        probe = await self._wait(job_id, lambda p: p.state not in TRANSIENT_STATES, limit)
        stuck = node_down = False
        if probe.state in TRANSIENT_STATES and opts.stuck_after_seconds is not None:
            stuck = True
            node = next((n for n in bad if n in probe.nodes), None) or next(iter(bad), None)
            still = (
                f"still {probe.state} {limit:g}s after the requeue (SIGKILL after "
                f"max(KillWait, 5s) + {opts.stuck_after_seconds:g}s): its processes outlived "
                "SIGKILL"
            )
            if node is None:
                notes.append(still)
            probe, node_down = await self._down_then_wait(
                job_id, node, notes, why=f"{still}; ", how="to release it"
            )
        seconds = self._seconds_to_leave(probe, t0)
        if seconds is None and not stuck:
            notes.append(f"still {probe.state} after {limit:g}s")
        return _Left(probe, seconds, stuck, node_down)

    async def _down_then_wait(
        self, job_id: int, node: str | None, notes: list[str], *, why: str, how: str
    ) -> tuple[JobProbe, bool]:
        """Set ``node`` DOWN, so that Slurm releases the job whatever its processes do, and
        wait for the job to leave: the last probe, and whether the node went DOWN. The note
        says ``why``, then "set <node> DOWN (reason ...)" and ``how``, or that it failed.
        No node (none known): only the wait."""
        node_down = False
        if node is not None:
            try:
                reason = await self._set_down(node, job_id)
                node_down = True
                notes.append(f"{why}set {node} DOWN (reason {reason!r}) {how}")
            except BackendError as exc:
                notes.append(f"{why}setting {node} DOWN failed: {exc}")
        probe = await self._wait(
            job_id, lambda p: p.state not in TRANSIENT_STATES, self.settle_timeout
        )
        return probe, node_down

    def _seconds_to_leave(self, probe: JobProbe, t0: float) -> float | None:
        """Seconds from the requeue (``t0``) until the job left its node; None: it has not."""
        if probe.state in TRANSIENT_STATES:
            return None
        return round(self._clock() - t0, 3)

    async def _set_down(self, node: str, job_id: int) -> str:
        """DOWN with the node's current reason (its drain keeps its owner), under its lock;
        a node DOWN already is left as it is (one DOWN for all the jobs of a lost GPU)."""
        async with self.lock(f"node:{node}"):
            current = await self.backend.get_node(node)
            reason = current.reason or f"{REASON_PREFIX} job {job_id} stuck after requeue"
            if current.state != "DOWN":
                await self.backend.set_down(node, reason)
            return reason

    async def _requeued_by_node_down(
        self, job: JobState, opts: RequeueOptions, from_node: str | None
    ) -> bool:
        """down_node: the job is PENDING again because ``from_node`` went DOWN for another job
        of that node (Slurm requeued it, NODE_FAIL) before this call looked at it."""
        if not (opts.down_node and from_node and job.state in PENDING_STATES):
            return False
        if job.restart_count < 1 or job.nodes:
            return False
        return (await self.backend.get_node(from_node)).state == "DOWN"

    async def _leave_down_node(
        self, job: JobState, bad: list[str], *, t0: float, notes: list[str]
    ) -> _Left:
        """down_node: the GPU is lost, its processes may never die: the node goes DOWN now
        (drain and reason kept), Slurm releases the job whatever they do."""
        node = bad[0] if len(bad) == 1 else None
        if len(bad) > 1:
            notes.append(
                f"GPU lost on one of {','.join(bad)} (no from_node): none set DOWN, the job "
                "waits for its processes"
            )
        probe, node_down = await self._down_then_wait(
            job.job_id, node, notes, why="GPU lost: ", how="at once, no wait"
        )
        seconds = self._seconds_to_leave(probe, t0)
        if seconds is None:
            notes.append(f"still {probe.state} after {self.settle_timeout:g}s")
        return _Left(probe, seconds, stuck=False, node_down=node_down)

    async def _kill_wait(self) -> float:
        now = self._clock()
        if self._kill_wait_value is None or now - self._kill_wait_at > _KILL_WAIT_TTL:
            try:
                value = await self.backend.kill_wait()
            except BackendError:
                value = None
            self._kill_wait_value = DEFAULT_KILL_WAIT if value is None else value
            self._kill_wait_at = now
        return self._kill_wait_value

    async def _expedite_and_exclude(
        self,
        job_id: int,
        *,
        opts: RequeueOptions,
        outcome: JobOutcome,
        probe: JobProbe,
        bad: list[str],
        wanted: list[str] | None,
        required: list[str] | None,
        reused: list[str],
        notes: list[str],
    ) -> tuple[bool, list[str] | None, list[str] | None]:
        """Returns (expedited, excluded nodes after the update or None, required nodes after
        the update or None).

        ``reused``: nodes of the job's last allocation it may run on again (a multi-node job's
        healthy nodes). On those slurmd refuses the job until the credential revoked by the
        requeue expires ("Job credential revoked": the job ends FAILED, not requeued), which
        is what Slurm's own BeginTime hold (munge's cred_expire) waits for: such a job is not
        expedited."""
        # Expedite: once Slurm shows PENDING/BeginTime, one `scontrol update` sets StartTime=now
        # and ExcNodeList together. Measured: updating ExcNodeList first, while the job is still
        # PENDING/None, pushes BeginTime back and costs ~1 s (0.7 s vs 1.7 s to RUNNING).
        expedited = False
        updated = False
        if opts.expedite and outcome is not JobOutcome.REQUEUED_HELD and reused:
            notes.append(
                f"not expedited: it may run on {','.join(reused)} again, where slurmd refuses "
                "it until the credential the requeue revoked expires (cred_expire)"
            )
        elif opts.expedite and outcome is not JobOutcome.REQUEUED_HELD:
            probe = await self._wait(
                job_id,
                lambda p: p.state not in PENDING_STATES or p.reason == "BeginTime",
                self.expedite_timeout,
            )
            if probe.state in PENDING_STATES and probe.reason == "BeginTime":
                try:
                    await self.backend.start_now(
                        job_id, excluded_nodes=wanted, required_nodes=required
                    )
                    expedited = updated = True
                except Rejected as exc:
                    notes.append(f"expedite failed: {exc}")
            elif probe.state in PENDING_STATES:
                notes.append(f"expedite: no BeginTime hold seen (reason {probe.reason})")

        changes = wanted is not None or required is not None
        if changes and probe.state in PENDING_STATES and not updated:
            try:
                await self.backend.set_excluded_nodes(
                    job_id, wanted if wanted is not None else [], required_nodes=required
                )
                updated = True
            except Rejected as exc:
                notes.append(f"exclude failed: {exc}")
        excluded: list[str] | None = None
        required_after: list[str] | None = None
        if changes and updated:
            after = await self.backend.get_job(job_id)
            if wanted is not None:
                excluded = after.excluded_nodes
                if opts.exclude_node and not set(bad) <= set(excluded):
                    notes.append("exclusion did not stick")
            if required is not None:
                required_after = after.required_nodes
                notes.append(
                    f"dropped {','.join(n for n in bad if n not in required)} from its "
                    f"--nodelist (now {','.join(required_after) or 'any node'})"
                )
        return expedited, excluded, required_after

    async def _wait(
        self,
        job_id: int,
        done: Callable[[JobProbe], bool],
        within: float,
        interval: float | None = None,
    ) -> JobProbe:
        """Poll the job until ``done(probe)`` or ``within`` seconds; return the last probe."""
        deadline = self._clock() + within
        step = interval or _BACKGROUND_POLL.get() or self.poll_interval
        while True:
            probe = await self.backend.probe_job(job_id)
            if done(probe) or self._clock() >= deadline:
                return probe
            await self._sleep(min(step, max(0.0, deadline - self._clock())))


@dataclass(frozen=True)
class _Requeued:
    """A job whose requeue Slurm accepted (or was asked for), and how: what the rest of the
    sequence works from. ``t0``: the clock at the requeue; ``already_pending``: the job
    requeued itself (after the checkpoint signal), no requeue of ours to time."""

    job: JobState
    opts: RequeueOptions
    from_node: str | None
    outcome: JobOutcome
    signalled: bool
    t0: float
    already_pending: bool = False

    def answer(self, **fields: Any) -> JobResult:
        """The job's result: its id, outcome, state before and signal, with ``fields``."""
        base = {
            "job_id": self.job.job_id,
            "outcome": self.outcome,
            "state_before": self.job.state,
            "signalled": self.signalled,
        }
        return JobResult.model_validate({**base, **fields})


@dataclass(frozen=True)
class _Left:
    """How a requeued job left its node: the last probe, seconds from the requeue until it
    no longer held the node (None: it still did), stuck past KillWait, node set DOWN."""

    probe: JobProbe
    seconds: float | None
    stuck: bool
    node_down: bool


def _exit_text(job: JobState) -> str:
    if job.exit_signal:
        return f" (killed by signal {job.exit_signal})"
    if job.exit_status:
        return f" (exit {job.exit_status})"
    return ""


def _not_requeueable(job: JobState) -> str | None:
    if not job.batch:
        return "not a batch job (srun/salloc allocation): Slurm cannot requeue it"
    if not job.requeue:
        return "job was submitted with --no-requeue (or JobRequeue=0): Slurm refuses to requeue"
    return None
