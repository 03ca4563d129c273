"""What the bridge does, written once against the :class:`~gpuheal_bridge.backends.base.Backend`
interface: ownership-checked drain and resume, and the requeue sequence

    check state -> [checkpoint signal -> bounded grace] -> requeue/requeuehold
    -> wait PENDING -> exclude the bad node -> [expedite: StartTime=now on BeginTime]
    -> [wait RUNNING]

With ``expedite`` and no ``wait_running_seconds`` (what the operator asks for), the answer
comes as soon as Slurm accepted the requeue: the drain and the requeue are on record then,
and the wait for PENDING/BeginTime (seconds on a busy slurmctld), the exclusion and the
expedite go on in the background under the job's lock.

Each step looks at Slurm first, so repeating a call repeats nothing harmful: a drained node
is not drained again, a job that is not running is never requeued (``scontrol requeue``
of a CANCELLED/COMPLETED job exits 0 and revives it), resume of a node that is not
drained is a no-op. Calls on one node (and on one job) are serialised by asyncio locks.
The clock and sleep are injectable so the sequence is unit-tested without waiting.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable

from gpuheal_bridge.api.models import (
    DrainOutcome,
    DrainRequest,
    DrainResponse,
    JobOutcome,
    JobResult,
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
from gpuheal_bridge.backends.base import (
    Backend,
    BackendError,
    JobProbe,
    NotFound,
    Rejected,
    SlurmNode,
    Unavailable,
)
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
    ) -> None:
        self.backend = backend
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

    async def jobs(self, k8s_name: str, slurm_name: str) -> JobsResponse:
        await self.backend.get_node(slurm_name)  # 404 for an unknown node, not an empty list
        jobs = await self.backend.jobs_on_node(slurm_name)
        return JobsResponse(node=k8s_name, slurm_node=slurm_name, jobs=jobs)

    # ---- drain / resume ------------------------------------------------------------------
    async def drain(self, k8s_name: str, slurm_name: str, req: DrainRequest) -> DrainResponse:
        async with self.lock(f"node:{slurm_name}"):
            previous = node_state(k8s_name, await self.backend.get_node(slurm_name))
            current, skipped = previous, None
            results: list[JobResult] = []
            if previous.owner is Owner.OTHER:
                outcome = DrainOutcome.DRAINED_BY_OTHER
                if req.requeue:
                    skipped = "node drained/down by someone else: left untouched"
            else:
                if previous.owner is Owner.GPUHEAL:
                    outcome = DrainOutcome.ALREADY_DRAINED
                else:
                    await self.backend.drain(slurm_name, build_reason(req.incident, req.xid))
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
                jobs_skipped_reason=skipped,
            )

    async def _requeue_all(self, slurm_name: str, opts: RequeueOptions) -> list[JobResult]:
        """Requeue every unfinished job on the node, concurrently (each under its job lock)."""
        running = await self.backend.jobs_on_node(slurm_name)
        return list(
            await asyncio.gather(
                *(self._requeue_locked(j.job_id, opts, slurm_name) for j in running)
            )
        )

    async def resume(self, k8s_name: str, slurm_name: str, req: ResumeRequest) -> ResumeResponse:
        async with self.lock(f"node:{slurm_name}"):
            previous = node_state(k8s_name, await self.backend.get_node(slurm_name))
            if not previous.unavailable:
                return ResumeResponse(
                    node=k8s_name,
                    slurm_node=slurm_name,
                    outcome=ResumeOutcome.NOT_DRAINED,
                    previous=previous,
                    current=previous,
                )
            if not req.force:
                if previous.owner is not Owner.GPUHEAL:
                    raise OwnershipConflict(
                        f"{slurm_name} was drained by someone else "
                        f"({previous.reason_user or 'unknown'}: {previous.reason!r}); "
                        "not resuming without force",
                        previous,
                    )
                if req.incident is not None and previous.incident != req.incident:
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
            return ResumeResponse(
                node=k8s_name,
                slurm_node=slurm_name,
                outcome=ResumeOutcome.RESUMED,
                forced=req.force and previous.owner is not Owner.GPUHEAL,
                previous=previous,
                current=current,
            )

    # ---- requeue -------------------------------------------------------------------------
    async def requeue_job(
        self, job_id: int, opts: RequeueOptions, from_node: str | None = None
    ) -> JobResult:
        """Requeue one job (raises NotFound/Unavailable only before anything was done)."""
        await self.backend.get_job(job_id)  # NotFound/Unavailable -> 404/503 before acting
        return await self._requeue_locked(job_id, opts, from_node)

    async def _requeue_locked(
        self, job_id: int, opts: RequeueOptions, from_node: str | None
    ) -> JobResult:
        async with self.lock(f"job:{job_id}"):
            try:
                return await self._requeue(job_id, opts, from_node)
            except NotFound as exc:
                return JobResult(job_id=job_id, outcome=JobOutcome.GONE, detail=str(exc))
            except BackendError as exc:
                kind = "slurmctld unavailable" if isinstance(exc, Unavailable) else "slurm"
                return JobResult(job_id=job_id, outcome=JobOutcome.FAILED, detail=f"{kind}: {exc}")

    async def _requeue(  # noqa: PLR0911 - one return per outcome
        self, job_id: int, opts: RequeueOptions, from_node: str | None
    ) -> JobResult:
        job = await self.backend.get_job(job_id)
        base = {"job_id": job_id, "state_before": job.state}
        if from_node is not None and from_node not in job.nodes:
            return JobResult(
                **base,
                outcome=JobOutcome.NOT_ON_NODE,
                detail=f"job runs on {','.join(job.nodes) or 'no node'}, not {from_node}",
            )
        if job.state not in REQUEUEABLE_STATES:
            return JobResult(
                **base,
                outcome=JobOutcome.NOT_RUNNING,
                detail=f"job is {job.state}; requeue would revive or fail, left alone",
            )
        problem = _not_requeueable(job)
        if problem:
            return JobResult(**base, outcome=JobOutcome.NOT_REQUEUEABLE, detail=problem)

        signalled = False
        if opts.checkpoint is not None:
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
                    return await self._after_requeue(
                        job,
                        opts,
                        from_node,
                        JobOutcome.REQUEUED_BY_JOB,
                        signalled,
                        t0=self._clock(),
                        already_pending=True,
                    )
                return JobResult(
                    **base,
                    outcome=JobOutcome.ENDED_DURING_GRACE,
                    state_after=after.state,
                    signalled=True,
                    detail="job left RUNNING after the checkpoint signal and did not requeue "
                    "itself; not revived",
                )

        t0 = self._clock()
        hold = opts.mode is RequeueMode.REQUEUE_HOLD
        try:
            await self.backend.requeue(job_id, hold=hold)
        except Rejected as exc:
            return JobResult(
                **base, outcome=JobOutcome.FAILED, signalled=signalled, detail=f"slurm: {exc}"
            )
        outcome = JobOutcome.REQUEUED_HELD if hold else JobOutcome.REQUEUED
        return await self._after_requeue(job, opts, from_node, outcome, signalled, t0=t0)

    async def _after_requeue(
        self,
        job: JobState,
        opts: RequeueOptions,
        from_node: str | None,
        outcome: JobOutcome,
        signalled: bool,
        *,
        t0: float,
        already_pending: bool = False,
    ) -> JobResult:
        if opts.expedite and not opts.wait_running_seconds and outcome is JobOutcome.REQUEUED:
            settle = self._settle(job, opts, from_node, outcome, signalled, t0=t0)
            self._in_background(job.job_id, settle)
            return JobResult(
                job_id=job.job_id,
                outcome=outcome,
                state_before=job.state,
                signalled=signalled,
                detail="requeue accepted; the wait for PENDING, the exclusion and the "
                "expedite go on in the bridge",
            )
        return await self._settle(
            job, opts, from_node, outcome, signalled, t0=t0, already_pending=already_pending
        )

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

    async def _settle(
        self,
        job: JobState,
        opts: RequeueOptions,
        from_node: str | None,
        outcome: JobOutcome,
        signalled: bool,
        *,
        t0: float,
        already_pending: bool = False,
    ) -> JobResult:
        job_id = job.job_id
        notes: list[str] = []
        probe = await self._wait(
            job_id, lambda p: p.state not in TRANSIENT_STATES, self.settle_timeout
        )
        requeue_seconds = None if already_pending else round(self._clock() - t0, 3)
        if probe.state not in PENDING_STATES:
            notes.append(f"after requeue the job is {probe.state}")

        bad = [from_node] if from_node else list(job.nodes)
        wanted: list[str] | None = None
        if opts.exclude_node and bad:
            wanted = sorted(set(job.excluded_nodes) | set(bad))

        expedited, excluded = await self._expedite_and_exclude(
            job_id, opts=opts, outcome=outcome, probe=probe, bad=bad, wanted=wanted, notes=notes
        )

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
        return JobResult(
            job_id=job_id,
            outcome=outcome,
            state_before=job.state,
            state_after=final.state,
            signalled=signalled,
            excluded_nodes=excluded,
            expedited=expedited,
            requeue_seconds=requeue_seconds,
            requeue_to_running_seconds=to_running,
            restart_count=final.restart_count,
            nodes_after=final.nodes,
            detail="; ".join(notes) or None,
        )

    async def _expedite_and_exclude(
        self,
        job_id: int,
        *,
        opts: RequeueOptions,
        outcome: JobOutcome,
        probe: JobProbe,
        bad: list[str],
        wanted: list[str] | None,
        notes: list[str],
    ) -> tuple[bool, list[str] | None]:
        """Returns (expedited, excluded nodes after the update or None)."""
        # Expedite: once Slurm shows PENDING/BeginTime, one `scontrol update` sets StartTime=now
        # and ExcNodeList together. Measured: updating ExcNodeList first, while the job is still
        # PENDING/None, pushes BeginTime back and costs ~1 s (0.7 s vs 1.7 s to RUNNING).
        expedited = False
        excluded_done = False
        if opts.expedite and outcome is not JobOutcome.REQUEUED_HELD:
            probe = await self._wait(
                job_id,
                lambda p: p.state not in PENDING_STATES or p.reason == "BeginTime",
                self.expedite_timeout,
            )
            if probe.state in PENDING_STATES and probe.reason == "BeginTime":
                try:
                    await self.backend.start_now(job_id, excluded_nodes=wanted)
                    expedited = excluded_done = True
                except Rejected as exc:
                    notes.append(f"expedite failed: {exc}")
            elif probe.state in PENDING_STATES:
                notes.append(f"expedite: no BeginTime hold seen (reason {probe.reason})")

        excluded: list[str] | None = None
        if wanted is not None and probe.state in PENDING_STATES and not excluded_done:
            try:
                await self.backend.set_excluded_nodes(job_id, wanted)
                excluded_done = True
            except Rejected as exc:
                notes.append(f"exclude failed: {exc}")
        if wanted is not None and excluded_done:
            excluded = (await self.backend.get_job(job_id)).excluded_nodes
            if not set(bad) <= set(excluded):
                notes.append("exclusion did not stick")

        return expedited, excluded

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


def _not_requeueable(job: JobState) -> str | None:
    if not job.batch:
        return "not a batch job (srun/salloc allocation): Slurm cannot requeue it"
    if not job.requeue:
        return "job was submitted with --no-requeue (or JobRequeue=0): Slurm refuses to requeue"
    return None
