"""A node the bridge excluded from a job (its requeue after a fault) stops being excluded once
the bridge resumes it: at once for a pending job, at the next requeue for a running one; an
exclusion the job had on its own is never lifted."""

from __future__ import annotations

from pathlib import Path

from gpuheal_bridge.api.models import DrainRequest, RequeueOptions, ResumeRequest
from gpuheal_bridge.exclusions import ExclusionLedger
from gpuheal_bridge.operations import Operations
from tests.unit.bridge.fakes import FakeClock, FakeJob, FakeSlurm


def test_the_ledger_remembers_across_a_restart_and_expires(tmp_path: Path) -> None:
    now = [1000.0]
    path = tmp_path / "exclusions.sqlite3"
    ledger = ExclusionLedger(path, ttl=100, clock=lambda: now[0])
    ledger.added(7, ["node1", "node2"])
    ledger.added(8, ["node1"])
    ledger.close()
    again = ExclusionLedger(path, ttl=100, clock=lambda: now[0])
    assert again.returned_for(7) == set()
    assert again.node_returned("node1") == [7, 8]
    assert again.returned_for(7) == {"node1"}
    again.added(7, ["node1"])  # out again: no longer returned
    assert again.returned_for(7) == set()
    again.forget(8, ["node1"])
    now[0] += 101
    assert again.purge() == 2
    assert again.node_returned("node1") == []


async def _fault(ops: Operations, node: str, incident: str) -> None:
    """The operator's slurmDrain: drain with the incident, requeue the node's jobs."""
    await ops.drain(node, node, DrainRequest(incident=incident, requeue=RequeueOptions()))
    await ops.settled()


async def test_a_pending_job_loses_the_exclusion_when_the_node_is_resumed(
    ops: Operations, slurm: FakeSlurm
) -> None:
    job = slurm.add_job(FakeJob(7, ["node1"], excluded=["node5"]))  # node5: the user's own
    await _fault(ops, "node1", "nrem-a")
    assert job.state == "PENDING"
    assert sorted(job.excluded) == ["node1", "node5"]
    resp = await ops.resume("node1", "node1", ResumeRequest(incident="nrem-a"))
    assert resp.exclusion_lifted_from == [7]
    assert job.excluded == ["node5"]
    again = await ops.resume("node1", "node1", ResumeRequest(incident="nrem-a"))
    assert again.exclusion_lifted_from == []  # nothing left to lift


async def test_a_running_job_loses_it_at_its_next_requeue(
    ops: Operations, slurm: FakeSlurm
) -> None:
    job = slurm.add_job(FakeJob(7, ["node1"], excluded=["node5"], next_node="node3"))
    opts = RequeueOptions(expedite=True, wait_running_seconds=30)
    await ops.drain("node1", "node1", DrainRequest(incident="nrem-a", requeue=opts))
    assert (job.state, job.nodes) == ("RUNNING", ["node3"])
    resp = await ops.resume("node1", "node1", ResumeRequest(incident="nrem-a"))
    assert resp.exclusion_lifted_from == []  # Slurm takes ExcNodeList only while pending
    assert "node1" in job.excluded
    await _fault(ops, "node3", "nrem-b")  # a second fault, under the same job
    assert sorted(job.excluded) == ["node3", "node5"]  # node1 is back: lifted


async def test_a_job_that_excluded_the_node_itself_keeps_it(
    ops: Operations, slurm: FakeSlurm
) -> None:
    job = slurm.add_job(FakeJob(7, ["node1"], excluded=["node1"]))
    await _fault(ops, "node1", "nrem-a")
    resp = await ops.resume("node1", "node1", ResumeRequest(incident="nrem-a"))
    assert resp.exclusion_lifted_from == []
    assert job.excluded == ["node1"]


async def test_a_resume_of_a_node_in_service_lifts_too(slurm: FakeSlurm, clock: FakeClock) -> None:
    """Slurm's own `nextstate=RESUME` (or a person) put it back before gpuheal's resume."""
    ledger = ExclusionLedger()
    ledger.added(7, ["node3"])
    ops = Operations(slurm, clock=clock, sleep=clock.sleep, exclusions=ledger)
    job = slurm.add_job(FakeJob(7, [], state="PENDING", excluded=["node3"]))
    resp = await ops.resume("node3", "node3", ResumeRequest(incident="nrem-a"))
    assert (resp.outcome.value, resp.exclusion_lifted_from) == ("not_drained", [7])
    assert job.excluded == []
