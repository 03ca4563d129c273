"""The drain/resume/requeue sequence against an in-memory Slurm, with a fake clock."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest

from gpuheal_bridge.api.models import (
    CheckpointSignal,
    DrainOutcome,
    DrainRequest,
    JobEnd,
    JobOutcome,
    JobSignalOutcome,
    JobSignalRequest,
    Owner,
    RequeueMode,
    RequeueOptions,
    ResumeOutcome,
    ResumeRequest,
    SignalTarget,
)
from gpuheal_bridge.backends.base import JobProbe, NotFound, Rejected, Unavailable
from gpuheal_bridge.operations import Operations, OwnershipConflict
from tests.unit.bridge.fakes import FakeClock, FakeJob, FakeSlurm


async def test_drain_sets_our_reason(ops: Operations, slurm: FakeSlurm) -> None:
    resp = await ops.drain("node1", "node1", DrainRequest(incident="nrem-abc", xid=79))
    assert resp.outcome is DrainOutcome.DRAINED
    assert resp.previous.owner is Owner.NONE
    assert resp.current.reason == "gpuheal: nrem-abc xid=79"
    assert resp.current.owner is Owner.GPUHEAL
    assert resp.current.incident == "nrem-abc"


async def test_drain_is_idempotent_and_keeps_first_reason(
    ops: Operations, slurm: FakeSlurm
) -> None:
    await ops.drain("node1", "node1", DrainRequest(incident="nrem-abc", xid=79))
    again = await ops.drain("node1", "node1", DrainRequest(incident="nrem-def", xid=94))
    assert again.outcome is DrainOutcome.ALREADY_DRAINED
    assert again.current.incident == "nrem-abc"
    assert slurm.mutating_calls() == ["drain"]


async def test_drain_of_admin_drained_node_keeps_their_reason_and_requeues_the_jobs(
    ops: Operations, slurm: FakeSlurm
) -> None:
    slurm.add_job(FakeJob(5, ["node2"]))
    req = DrainRequest(incident="nrem-abc", requeue=RequeueOptions())
    resp = await ops.drain("node2", "node2", req)
    assert resp.outcome is DrainOutcome.DRAINED_BY_OTHER
    assert resp.owner is Owner.OTHER
    assert resp.current.reason == "admin maintenance: fan swap"
    assert slurm.nodes["node2"].reason == "admin maintenance: fan swap"
    [job] = resp.jobs
    assert job.outcome is JobOutcome.REQUEUED
    assert job.excluded_nodes == ["node2"]
    assert resp.jobs_skipped_reason is None
    assert slurm.mutating_calls() == ["requeue", "set_excluded_nodes"]  # no drain of ours


async def test_drain_of_admin_drained_node_without_requeue_touches_nothing(
    ops: Operations, slurm: FakeSlurm
) -> None:
    slurm.add_job(FakeJob(5, ["node2"]))
    resp = await ops.drain("node2", "node2", DrainRequest(incident="nrem-abc"))
    assert resp.outcome is DrainOutcome.DRAINED_BY_OTHER
    assert resp.jobs == []
    assert slurm.mutating_calls() == []


@pytest.mark.parametrize(
    ("flags", "reason"),
    [(("NOT_RESPONDING",), "Not responding"), ((), "admin: set down"), ((), None)],
)
async def test_drain_of_a_node_only_down_drains_it_with_our_reason(
    ops: Operations, slurm: FakeSlurm, flags: tuple[str, ...], reason: str | None
) -> None:
    """DOWN does not keep a node out (ReturnToService puts it back when slurmd registers):
    gpuheal drains it with its own reason, and `previous` says it was DOWN."""
    slurm.add_node("node4", "DOWN", flags, reason)
    resp = await ops.drain("node4", "node4", DrainRequest(incident="nrem-abc", xid=79))
    assert resp.outcome is DrainOutcome.DRAINED
    assert resp.owner is Owner.GPUHEAL
    was = resp.previous
    assert (was.state, was.drain, was.reason) == ("DOWN", False, reason)
    assert slurm.nodes["node4"].reason == "gpuheal: nrem-abc xid=79"
    assert "DRAIN" in slurm.nodes["node4"].flags
    again = await ops.drain("node4", "node4", DrainRequest(incident="nrem-abc", xid=79))
    assert again.outcome is DrainOutcome.ALREADY_DRAINED
    assert slurm.mutating_calls() == ["drain"]


@pytest.mark.parametrize(
    ("state", "flags"),
    [("DOWN", ("DRAIN",)), ("DOWN", ("DRAIN", "NOT_RESPONDING")), ("IDLE", ("FAIL",))],
)
async def test_drain_of_a_node_down_and_drained_or_failed_by_an_admin_keeps_theirs(
    ops: Operations, slurm: FakeSlurm, state: str, flags: tuple[str, ...]
) -> None:
    slurm.add_node("node4", state, flags, "admin: PSU")
    resp = await ops.drain("node4", "node4", DrainRequest(incident="nrem-abc", xid=79))
    assert resp.outcome is DrainOutcome.DRAINED_BY_OTHER
    assert slurm.nodes["node4"].reason == "admin: PSU"
    assert slurm.mutating_calls() == []


async def test_drain_unknown_node_raises_not_found(ops: Operations) -> None:
    with pytest.raises(NotFound):
        await ops.drain("nodeX", "nodeX", DrainRequest(incident="nrem-abc"))


async def test_resume_only_ours(ops: Operations, slurm: FakeSlurm) -> None:
    with pytest.raises(OwnershipConflict) as info:
        await ops.resume("node2", "node2", ResumeRequest())
    assert info.value.current.owner is Owner.OTHER
    assert slurm.mutating_calls() == []
    forced = await ops.resume("node2", "node2", ResumeRequest(force=True))
    assert forced.outcome is ResumeOutcome.RESUMED
    assert forced.forced
    assert forced.previous.reason == "admin maintenance: fan swap"


async def test_resume_is_idempotent(ops: Operations, slurm: FakeSlurm) -> None:
    await ops.drain("node1", "node1", DrainRequest(incident="nrem-abc"))
    first = await ops.resume("node1", "node1", ResumeRequest(incident="nrem-abc"))
    assert first.outcome is ResumeOutcome.RESUMED
    assert first.previous.owner is Owner.GPUHEAL
    assert not first.current.drain
    second = await ops.resume("node1", "node1", ResumeRequest())
    assert second.outcome is ResumeOutcome.NOT_DRAINED  # Slurm itself would refuse RESUME
    assert slurm.mutating_calls() == ["drain", "resume"]


async def test_resume_refuses_other_incident(ops: Operations) -> None:
    await ops.drain("node1", "node1", DrainRequest(incident="nrem-abc"))
    with pytest.raises(OwnershipConflict, match="nrem-abc"):
        await ops.resume("node1", "node1", ResumeRequest(incident="nrem-zzz"))


async def test_resume_of_a_spare_lifts_only_the_pools_own_drain(
    ops: Operations, slurm: FakeSlurm
) -> None:
    # node2 carries an admin's drain: a spare's resume leaves it (force would have lifted it)
    with pytest.raises(OwnershipConflict, match="fan swap") as info:
        await ops.resume("node2", "node2", ResumeRequest(reserve_reason="reserve pool"))
    assert info.value.current.reason == "admin maintenance: fan swap"
    await ops.drain("node1", "node1", DrainRequest(incident="nrem-abc"))
    with pytest.raises(OwnershipConflict, match="not waiting in the reserve pool"):
        await ops.resume("node1", "node1", ResumeRequest(reserve_reason="reserve pool"))
    assert slurm.mutating_calls() == ["drain"]
    await slurm.drain("node1", "reserve pool")  # the pool's (repair.reserve does it so)
    resp = await ops.resume("node1", "node1", ResumeRequest(reserve_reason="reserve pool"))
    assert resp.outcome is ResumeOutcome.RESUMED
    assert not resp.forced
    again = await ops.resume("node1", "node1", ResumeRequest(reserve_reason="reserve pool"))
    assert again.outcome is ResumeOutcome.NOT_DRAINED


def test_resume_takes_reserve_reason_or_force_not_both() -> None:
    with pytest.raises(ValueError, match="exclude each other"):
        ResumeRequest(force=True, reserve_reason="reserve pool")


async def test_drain_with_requeue_excludes_node(ops: Operations, slurm: FakeSlurm) -> None:
    slurm.add_job(FakeJob(7, ["node1"]))
    req = DrainRequest(incident="nrem-abc", requeue=RequeueOptions())
    resp = await ops.drain("node1", "node1", req)
    [job] = resp.jobs
    assert job.outcome is JobOutcome.REQUEUED
    assert job.excluded_nodes == ["node1"]
    assert job.restart_count == 1
    assert job.requeue_seconds is not None
    assert slurm.mutating_calls() == ["drain", "requeue", "set_excluded_nodes"]


async def test_requeue_reports_unrequeueable_jobs(ops: Operations, slurm: FakeSlurm) -> None:
    slurm.add_job(FakeJob(1, ["node1"], requeue=False))
    slurm.add_job(FakeJob(2, ["node1"], batch=False))
    slurm.add_job(FakeJob(3, ["node1"]))
    resp = await ops.drain("node1", "node1", DrainRequest(incident="i1", requeue=RequeueOptions()))
    outcomes = {j.job_id: j.outcome for j in resp.jobs}
    assert outcomes == {
        1: JobOutcome.NOT_REQUEUEABLE,
        2: JobOutcome.NOT_REQUEUEABLE,
        3: JobOutcome.REQUEUED,
    }
    details = {j.job_id: j.detail or "" for j in resp.jobs}
    assert "--no-requeue" in details[1]
    assert "batch" in details[2]


@pytest.mark.parametrize("state", ["CANCELLED", "COMPLETED", "FAILED", "PENDING"])
async def test_requeue_never_revives_finished_or_pending_jobs(
    ops: Operations, slurm: FakeSlurm, state: str
) -> None:
    slurm.add_job(FakeJob(9, ["node1"], state=state))
    result = await ops.requeue_job(9, RequeueOptions())
    assert result.outcome is JobOutcome.NOT_RUNNING
    assert slurm.mutating_calls() == []


async def test_requeue_from_node_guard(ops: Operations, slurm: FakeSlurm) -> None:
    slurm.add_job(FakeJob(9, ["node3"]))
    result = await ops.requeue_job(9, RequeueOptions(), from_node="node1")
    assert result.outcome is JobOutcome.NOT_ON_NODE
    assert slurm.mutating_calls() == []


async def test_requeue_unknown_job(ops: Operations) -> None:
    with pytest.raises(NotFound):
        await ops.requeue_job(404, RequeueOptions())


async def test_requeue_whose_first_read_is_refused_is_the_calls_error(
    ops: Operations, slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing was done: the caller gets Slurm's refusal (a 409), not a stored "failed"."""

    async def refused(job_id: int) -> None:
        raise Rejected(f"squeue: error: something else for {job_id}")

    slurm.add_job(FakeJob(9, ["node1"]))
    monkeypatch.setattr(slurm, "get_job", refused)
    with pytest.raises(Rejected):
        await ops.requeue_job(9, RequeueOptions())
    assert slurm.mutating_calls() == []


async def test_checkpoint_signal_waits_the_grace_then_requeues(
    ops: Operations, slurm: FakeSlurm, clock: FakeClock
) -> None:
    slurm.add_job(FakeJob(7, ["node1"]))
    opts = RequeueOptions(checkpoint=CheckpointSignal(grace_seconds=5, target=SignalTarget.BATCH))
    t0 = clock.now
    result = await ops.requeue_job(7, opts, from_node="node1")
    assert result.outcome is JobOutcome.REQUEUED
    assert result.signalled
    assert 5 <= clock.now - t0 < 7  # waited the grace, bounded
    assert slurm.mutating_calls()[:2] == ["signal", "requeue"]
    assert slurm.calls[[c for c, _ in slurm.calls].index("signal")][1][1:] == (
        "USR1",
        SignalTarget.BATCH,
    )


async def test_job_that_requeues_itself_on_signal(ops: Operations, slurm: FakeSlurm) -> None:
    slurm.add_job(FakeJob(7, ["node1"], on_signal="requeue_self"))
    opts = RequeueOptions(checkpoint=CheckpointSignal(grace_seconds=30))
    result = await ops.requeue_job(7, opts, from_node="node1")
    assert result.outcome is JobOutcome.REQUEUED_BY_JOB
    assert "requeue" not in slurm.mutating_calls()  # no second requeue
    assert result.excluded_nodes == ["node1"]


async def test_job_that_exits_on_signal_is_not_revived(ops: Operations, slurm: FakeSlurm) -> None:
    slurm.add_job(FakeJob(7, ["node1"], on_signal="exit"))
    opts = RequeueOptions(checkpoint=CheckpointSignal(grace_seconds=30))
    result = await ops.requeue_job(7, opts)
    assert result.outcome is JobOutcome.ENDED_DURING_GRACE
    assert result.state_after == "COMPLETED"
    assert "requeue" not in slurm.mutating_calls()


async def test_expedite_sets_start_now_on_begintime(ops: Operations, slurm: FakeSlurm) -> None:
    slurm.add_job(FakeJob(7, ["node1"], next_node="node3"))
    opts = RequeueOptions(expedite=True, wait_running_seconds=30)
    result = await ops.requeue_job(7, opts, from_node="node1")
    assert result.expedited
    assert result.state_after == "RUNNING"
    assert result.nodes_after == ["node3"]
    assert result.requeue_to_running_seconds is not None
    assert slurm.mutating_calls() == ["requeue", "start_now"]  # one update: both at once
    assert result.excluded_nodes == ["node1"]


class SlowProbes(FakeSlurm):
    """Job probes wait for `gate`: slurmctld is slow to show the requeued job PENDING."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def probe_job(self, job_id: int) -> JobProbe:
        await self.gate.wait()
        return await super().probe_job(job_id)


async def test_drain_answers_once_the_requeue_is_accepted_and_expedites_after(
    clock: FakeClock,
) -> None:
    """What the operator asks (expedite, no wait for RUNNING): the drain and the requeue are
    on record in the answer; waiting for PENDING/BeginTime and the expedite come after."""
    slurm = SlowProbes()
    slurm.add_node("node1", "MIXED")
    slurm.add_job(FakeJob(7, ["node1"], next_node="node3"))
    ops = Operations(slurm, clock=clock, sleep=clock.sleep, poll_interval=0.1)
    req = DrainRequest(incident="nrem-abc", xid=79, requeue=RequeueOptions(expedite=True))
    resp = await asyncio.wait_for(ops.drain("node1", "node1", req), 5)
    assert resp.outcome is DrainOutcome.DRAINED
    [job] = resp.jobs
    assert job.outcome is JobOutcome.REQUEUED
    assert not job.expedited
    assert job.detail is not None
    assert "go on in the bridge" in job.detail
    assert slurm.mutating_calls() == ["drain", "requeue"]  # answered before any wait
    slurm.gate.set()
    await ops.settled()
    assert slurm.mutating_calls() == ["drain", "requeue", "start_now"]
    assert slurm.jobs[7].excluded == ["node1"]
    assert 7 in slurm.expedited
    # a second call on the same node repeats nothing
    again = await ops.drain("node1", "node1", req)
    assert again.outcome is DrainOutcome.ALREADY_DRAINED
    await ops.settled()
    assert slurm.mutating_calls() == ["drain", "requeue", "start_now"]


async def test_a_caller_that_waits_for_running_still_gets_the_whole_story(
    ops: Operations, slurm: FakeSlurm
) -> None:
    slurm.add_job(FakeJob(7, ["node1"], next_node="node3"))
    opts = RequeueOptions(expedite=True, wait_running_seconds=30)
    resp = await ops.drain("node1", "node1", DrainRequest(incident="nrem-abc", requeue=opts))
    [job] = resp.jobs
    assert job.expedited
    assert job.state_after == "RUNNING"
    assert job.excluded_nodes == ["node1"]


async def test_requeuehold_is_not_expedited(ops: Operations, slurm: FakeSlurm) -> None:
    slurm.add_job(FakeJob(7, ["node1"]))
    opts = RequeueOptions(mode=RequeueMode.REQUEUE_HOLD, expedite=True)
    result = await ops.requeue_job(7, opts)
    assert result.outcome is JobOutcome.REQUEUED_HELD
    assert not result.expedited
    assert "start_now" not in slurm.mutating_calls()


async def test_existing_exclusions_are_kept(ops: Operations, slurm: FakeSlurm) -> None:
    slurm.add_job(FakeJob(7, ["node1"], excluded=["node8"]))
    result = await ops.requeue_job(7, RequeueOptions(), from_node="node1")
    assert result.excluded_nodes == ["node1", "node8"]


async def test_slurmctld_down_midway_is_reported_per_job(ops: Operations, slurm: FakeSlurm) -> None:
    slurm.add_job(FakeJob(7, ["node1"]))
    await ops.drain("node1", "node1", DrainRequest(incident="i1"))
    slurm.down = True
    with pytest.raises(Unavailable):
        await ops.drain("node1", "node1", DrainRequest(incident="i1", requeue=RequeueOptions()))


async def test_slurmctld_gone_before_the_requeue_raises_and_nothing_is_done(
    ops: Operations, slurm: FakeSlurm
) -> None:
    """503 for the caller (not a stored "failed"): its retry with the same key carries on."""
    slurm.add_job(FakeJob(7, ["node1"]))
    slurm.fail_ops = {"requeue"}
    opts = RequeueOptions(checkpoint=CheckpointSignal(signal="USR1", grace_seconds=1))
    with pytest.raises(Unavailable):
        await ops.requeue_job(7, opts, from_node="node1")
    assert slurm.jobs[7].restart_count == 0


async def test_slurmctld_gone_after_the_requeue_still_answers_requeued(
    ops: Operations, slurm: FakeSlurm
) -> None:
    at = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.UTC)
    ops._wall = lambda: at
    slurm.add_job(FakeJob(7, ["node1"]))
    slurm.fail_ops = {"probe_job"}  # scontrol requeue accepted, then slurmctld gone
    result = await ops.requeue_job(7, RequeueOptions(requeue_ended=True), from_node="node1")
    assert result.outcome is JobOutcome.REQUEUED
    assert result.requeued_at == at
    assert "slurmctld unavailable" in (result.detail or "")
    assert slurm.jobs[7].restart_count == 1


async def test_answers_carry_the_time_slurm_acted(ops: Operations, slurm: FakeSlurm) -> None:
    at = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.UTC)
    ops._wall = lambda: at
    slurm.add_job(FakeJob(7, ["node1"]))
    drained = await ops.drain("node1", "node1", DrainRequest(incident="i1"))
    assert drained.at == at
    again = await ops.drain("node1", "node1", DrainRequest(incident="i1"))
    assert again.at is None  # drained before: this call did not do it
    result = await ops.requeue_job(7, RequeueOptions(requeue_ended=True), from_node="node1")
    assert result.requeued_at == at


async def test_wait_is_bounded(slurm: FakeSlurm, clock: FakeClock) -> None:
    ops = Operations(slurm, clock=clock, sleep=clock.sleep, settle_timeout=2)
    slurm.add_job(FakeJob(7, ["node1"], script=[("COMPLETING", None, ["node1"])] * 1000))
    t0 = clock.now
    probe = await ops._wait(7, lambda p: p.state == "PENDING", 2)
    assert probe.state == "COMPLETING"
    assert clock.now - t0 <= 2.2


# ---- the fault's victims: jobs that died, hung, or were pinned to the node ------------------

ENDED_AT = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.UTC)


async def test_a_requeue_reads_the_job_once_before_slurm_acts(
    ops: Operations, slurm: FakeSlurm
) -> None:
    """Between the fault and `scontrol requeue` every slurmctld round trip delays the job's
    move: one read of the job, then the requeue."""
    slurm.add_job(FakeJob(7, ["node1"]))
    await ops.requeue_job(7, RequeueOptions(requeue_ended=True), from_node="node1")
    calls = [c for c, _ in slurm.calls]
    assert calls[: calls.index("requeue") + 1] == ["get_job", "requeue"]


async def test_the_job_listing_asks_slurm_once_per_kind_all_at_once(slurm: FakeSlurm) -> None:
    """The node read and both job listings go out together (a sequential listing would wait
    here for ever: each read waits until all three have been asked)."""
    slurm.add_job(FakeJob(1, ["node1"]))
    asked: list[str] = []
    everyone = asyncio.Event()

    def together(name: str, read: Any) -> Any:
        async def call(*args: Any, **kwargs: Any) -> Any:
            asked.append(name)
            if len(asked) == 3:
                everyone.set()
            await everyone.wait()
            return await read(*args, **kwargs)

        return call

    for name in ("get_node", "jobs_on_node", "ended_jobs_on_node"):
        setattr(slurm, name, together(name, getattr(slurm, name)))
    listing = await asyncio.wait_for(
        Operations(slurm).jobs("node1", "node1", ended_since=ENDED_AT), timeout=5
    )
    assert [j.job_id for j in listing.jobs] == [1]
    assert sorted(asked) == ["ended_jobs_on_node", "get_node", "jobs_on_node"]


async def test_the_job_listing_of_an_unknown_node_is_not_found(ops: Operations) -> None:
    with pytest.raises(NotFound):
        await ops.jobs("nope", "nope", ended_since=ENDED_AT)


async def test_jobs_lists_ended_ones_since_a_time(ops: Operations, slurm: FakeSlurm) -> None:
    slurm.add_job(FakeJob(1, ["node1"]))
    slurm.add_job(FakeJob(2, ["node1"], state="FAILED", ended=JobEnd.FAILED, end_time=ENDED_AT))
    old = ENDED_AT - dt.timedelta(minutes=10)
    slurm.add_job(FakeJob(3, ["node1"], state="FAILED", ended=JobEnd.FAILED, end_time=old))
    slurm.add_job(FakeJob(4, ["node3"], state="FAILED", ended=JobEnd.FAILED, end_time=ENDED_AT))
    running = await ops.jobs("node1", "node1")
    assert [j.job_id for j in running.jobs] == [1]
    since = ENDED_AT - dt.timedelta(minutes=1)
    both = await ops.jobs("node1", "node1", ended_since=since.replace(tzinfo=None))
    assert [(j.job_id, j.ended) for j in both.jobs] == [(1, None), (2, JobEnd.FAILED)]


async def test_a_failed_job_is_requeued_only_when_asked(ops: Operations, slurm: FakeSlurm) -> None:
    slurm.add_job(FakeJob(2, ["node1"], state="FAILED", ended=JobEnd.FAILED, end_time=ENDED_AT))
    plain = await ops.requeue_job(2, RequeueOptions(), from_node="node1")
    assert plain.outcome is JobOutcome.NOT_RUNNING
    assert "signal 9" in (plain.detail or "")
    assert slurm.mutating_calls() == []
    opts = RequeueOptions(
        requeue_ended=True, expedite=True, checkpoint=CheckpointSignal(grace_seconds=30)
    )
    result = await ops.requeue_job(2, opts, from_node="node1")
    assert result.outcome is JobOutcome.REQUEUED
    assert result.ended_before is JobEnd.FAILED
    assert not result.signalled  # nothing left to signal
    assert result.expedited
    assert result.excluded_nodes == ["node1"]
    assert slurm.mutating_calls() == ["requeue", "start_now"]


@pytest.mark.parametrize(
    ("state", "ended"),
    [("COMPLETED", JobEnd.COMPLETED), ("CANCELLED", JobEnd.CANCELLED), ("TIMEOUT", JobEnd.TIMEOUT)],
)
async def test_completed_cancelled_and_timed_out_jobs_are_never_revived(
    ops: Operations, slurm: FakeSlurm, state: str, ended: JobEnd
) -> None:
    slurm.add_job(FakeJob(2, ["node1"], state=state, ended=ended, end_time=ENDED_AT))
    result = await ops.requeue_job(2, RequeueOptions(requeue_ended=True), from_node="node1")
    assert result.outcome is JobOutcome.NOT_RUNNING
    assert slurm.mutating_calls() == []


async def test_a_failed_no_requeue_job_is_reported_not_requeueable(
    ops: Operations, slurm: FakeSlurm
) -> None:
    job = FakeJob(2, ["node1"], state="FAILED", requeue=False, ended=JobEnd.FAILED)
    slurm.add_job(job)
    result = await ops.requeue_job(2, RequeueOptions(requeue_ended=True))
    assert result.outcome is JobOutcome.NOT_REQUEUEABLE
    assert "--no-requeue" in (result.detail or "")
    assert slurm.mutating_calls() == []


@pytest.mark.parametrize(
    ("on_signal", "ended"), [("fail", JobEnd.FAILED), ("exit", JobEnd.COMPLETED)]
)
async def test_a_job_that_ends_on_the_checkpoint_signal_is_requeued_when_asked(
    ops: Operations, slurm: FakeSlurm, on_signal: str, ended: JobEnd
) -> None:
    slurm.add_job(FakeJob(7, ["node1"], on_signal=on_signal))
    opts = RequeueOptions(requeue_ended=True, checkpoint=CheckpointSignal(grace_seconds=30))
    result = await ops.requeue_job(7, opts, from_node="node1")
    assert result.outcome is JobOutcome.REQUEUED
    assert result.signalled
    assert result.ended_before is ended
    assert slurm.mutating_calls() == ["signal", "requeue", "set_excluded_nodes"]


async def test_a_job_that_outlives_sigkill_gets_its_node_set_down(
    ops: Operations, slurm: FakeSlurm, clock: FakeClock
) -> None:
    await ops.drain("node1", "node1", DrainRequest(incident="nrem-abc", xid=79))
    slurm.add_job(FakeJob(7, ["node1"], stuck_probes=10_000))
    opts = RequeueOptions(expedite=True, stuck_after_seconds=3)
    t0 = clock.now
    result = await ops.requeue_job(7, opts, from_node="node1")
    assert result.outcome is JobOutcome.REQUEUED
    assert result.stuck
    assert result.node_down
    assert 5 <= clock.now - t0 < 30  # KillWait (2 s) + 3 s, then released
    assert result.left_node_seconds is not None
    assert slurm.nodes["node1"].state == "DOWN"
    assert slurm.nodes["node1"].reason == "gpuheal: nrem-abc xid=79"  # still ours
    assert "outlived SIGKILL" in (result.detail or "")
    assert slurm.mutating_calls() == ["drain", "requeue", "set_down", "start_now"]


async def test_down_node_takes_a_stuck_job_off_at_once_and_keeps_the_node_drained(
    ops: Operations, slurm: FakeSlurm, clock: FakeClock
) -> None:
    """A lost GPU: no checkpoint signal, no KillWait: the node goes DOWN right after the
    requeue (our drain reason kept) and Slurm releases the job whatever its processes do."""
    await ops.drain("node1", "node1", DrainRequest(incident="nrem-abc", xid=79))
    slurm.add_job(FakeJob(7, ["node1"], stuck_probes=10_000))
    t0 = clock.now
    result = await ops.requeue_job(
        7, RequeueOptions(expedite=True, down_node=True), from_node="node1"
    )
    assert (result.outcome, result.node_down, result.stuck) == (JobOutcome.REQUEUED, True, False)
    assert clock.now - t0 < 2  # not KillWait (2 s) + anything
    assert slurm.nodes["node1"].state == "DOWN"
    assert slurm.nodes["node1"].drain
    assert slurm.nodes["node1"].reason == "gpuheal: nrem-abc xid=79"
    assert "GPU lost" in (result.detail or "")
    assert slurm.mutating_calls() == ["drain", "requeue", "set_down", "start_now"]


async def test_down_node_sets_the_node_down_once_for_all_its_jobs(
    ops: Operations, slurm: FakeSlurm
) -> None:
    """Two jobs on the lost node, requeued at once: the first call's DOWN makes Slurm requeue
    the other (NODE_FAIL) before its own call looks; that one is taken as requeued, excluded
    from the node and expedited all the same."""
    await ops.drain("node1", "node1", DrainRequest(incident="nrem-abc", xid=79))
    slurm.add_job(FakeJob(7, ["node1"], stuck_probes=10_000))
    slurm.add_job(FakeJob(8, ["node1"]))
    opts = RequeueOptions(expedite=True, down_node=True)
    first = await ops.requeue_job(7, opts, from_node="node1")
    second = await ops.requeue_job(8, opts, from_node="node1")
    assert [first.outcome, second.outcome] == [JobOutcome.REQUEUED, JobOutcome.REQUEUED]
    assert second.node_down
    assert second.excluded_nodes == ["node1"]
    assert slurm.mutating_calls().count("set_down") == 1
    assert slurm.mutating_calls().count("start_now") == 2
    again = await ops.requeue_job(8, opts, from_node="node2")  # not where it ran: left alone
    assert again.outcome is JobOutcome.NOT_ON_NODE


def test_down_node_sends_no_checkpoint_signal() -> None:
    with pytest.raises(ValueError, match="down_node: a job whose GPU is lost"):
        RequeueOptions(down_node=True, checkpoint=CheckpointSignal(signal="USR1"))


async def test_a_stuck_job_on_an_admin_drained_node_keeps_the_admin_reason(
    ops: Operations, slurm: FakeSlurm
) -> None:
    slurm.add_job(FakeJob(7, ["node2"], stuck_probes=10_000))
    result = await ops.requeue_job(7, RequeueOptions(stuck_after_seconds=1), from_node="node2")
    assert result.node_down
    assert slurm.nodes["node2"].reason == "admin maintenance: fan swap"


async def test_a_job_that_leaves_after_killwait_is_not_escalated(
    ops: Operations, slurm: FakeSlurm
) -> None:
    slurm.add_job(FakeJob(7, ["node1"], stuck_probes=5))  # gone within KillWait
    result = await ops.requeue_job(7, RequeueOptions(stuck_after_seconds=3), from_node="node1")
    assert not result.stuck
    assert not result.node_down
    assert "set_down" not in slurm.mutating_calls()


async def test_a_job_pinned_to_the_node_is_released_from_it(
    ops: Operations, slurm: FakeSlurm
) -> None:
    slurm.add_job(FakeJob(7, ["node1", "node3"], required=["node1", "node3"]))
    opts = RequeueOptions(expedite=True, release_node=True)
    result = await ops.requeue_job(7, opts, from_node="node1")
    assert result.released_node
    assert result.required_nodes_after == ["node3"]
    assert result.excluded_nodes == ["node1"]
    assert "dropped node1 from its --nodelist" in (result.detail or "")


async def test_a_pinned_job_not_released_says_it_cannot_start(
    ops: Operations, slurm: FakeSlurm
) -> None:
    slurm.add_job(FakeJob(7, ["node1"], required=["node1"]))
    result = await ops.requeue_job(7, RequeueOptions(), from_node="node1")
    assert not result.released_node
    assert "cannot start" in (result.detail or "")


async def test_a_multi_node_job_is_not_expedited_onto_its_own_healthy_nodes(
    ops: Operations, slurm: FakeSlurm
) -> None:
    """slurmd refuses a requeued job on a node of its last allocation until the revoked
    credential expires (seen: "Killing non-startable batch JobId=1: Job credential revoked",
    the job FAILED); Slurm's BeginTime hold waits exactly that long, so it is kept."""
    slurm.add_job(FakeJob(8, ["node1", "node2"]))
    result = await ops.requeue_job(8, RequeueOptions(expedite=True), from_node="node1")
    await ops.settled()
    assert result.outcome is JobOutcome.REQUEUED
    assert "start_now" not in slurm.mutating_calls()
    single = FakeJob(9, ["node3"])
    slurm.add_job(single)
    await ops.requeue_job(9, RequeueOptions(expedite=True, requeue_ended=True), from_node="node3")
    assert "start_now" in slurm.mutating_calls()  # nothing of its last allocation is reused


async def test_a_signal_alone_reaches_the_running_job_and_requeues_nothing(
    ops: Operations, slurm: FakeSlurm
) -> None:
    slurm.add_job(FakeJob(7, ["node1"]))
    req = JobSignalRequest(from_node="node1", signal="USR2", target=SignalTarget.BATCH)
    result = await ops.signal_job(7, req, "node1")
    assert result.outcome is JobSignalOutcome.SIGNALLED
    assert result.signalled_at is not None
    assert slurm.mutating_calls() == ["signal"]  # no requeue, no exclusion, no hold
    assert slurm.calls[[c for c, _ in slurm.calls].index("signal")][1][1:] == (
        "USR2",
        SignalTarget.BATCH,
    )
    assert (await slurm.get_job(7)).state == "RUNNING"


@pytest.mark.parametrize(
    ("nodes", "state", "outcome"),
    [
        (["node3"], "RUNNING", JobSignalOutcome.NOT_ON_NODE),
        (["node1"], "PENDING", JobSignalOutcome.NOT_RUNNING),
        (["node1"], "COMPLETED", JobSignalOutcome.NOT_RUNNING),
    ],
)
async def test_a_signal_alone_only_for_a_job_running_on_the_node(
    ops: Operations, slurm: FakeSlurm, nodes: list[str], state: str, outcome: JobSignalOutcome
) -> None:
    slurm.add_job(FakeJob(9, nodes, state=state))
    result = await ops.signal_job(9, JobSignalRequest(from_node="node1"), "node1")
    assert result.outcome is outcome
    assert slurm.mutating_calls() == []


async def test_a_signal_alone_to_an_unknown_job_is_not_found(ops: Operations) -> None:
    with pytest.raises(NotFound):
        await ops.signal_job(404, JobSignalRequest(from_node="node1"), "node1")
