"""The drain/resume/requeue sequence against an in-memory Slurm, with a fake clock."""

from __future__ import annotations

import asyncio

import pytest

from gpuheal_bridge.api.models import (
    CheckpointSignal,
    DrainOutcome,
    DrainRequest,
    JobOutcome,
    Owner,
    RequeueMode,
    RequeueOptions,
    ResumeOutcome,
    ResumeRequest,
    SignalTarget,
)
from gpuheal_bridge.backends.base import JobProbe, NotFound, Unavailable
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


async def test_drain_of_admin_drained_node_touches_nothing(
    ops: Operations, slurm: FakeSlurm
) -> None:
    slurm.add_job(FakeJob(5, ["node2"]))
    req = DrainRequest(incident="nrem-abc", requeue=RequeueOptions())
    resp = await ops.drain("node2", "node2", req)
    assert resp.outcome is DrainOutcome.DRAINED_BY_OTHER
    assert resp.owner is Owner.OTHER
    assert resp.current.reason == "admin maintenance: fan swap"
    assert resp.jobs == []
    assert resp.jobs_skipped_reason
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


async def test_wait_is_bounded(slurm: FakeSlurm, clock: FakeClock) -> None:
    ops = Operations(slurm, clock=clock, sleep=clock.sleep, settle_timeout=2)
    slurm.add_job(FakeJob(7, ["node1"], script=[("COMPLETING", None, ["node1"])] * 1000))
    t0 = clock.now
    probe = await ops._wait(7, lambda p: p.state == "PENDING", 2)
    assert probe.state == "COMPLETING"
    assert clock.now - t0 <= 2.2
