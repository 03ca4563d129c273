"""The slurmDrain step's jobs: `steps.slurm_drain` through the bridge's real HTTP app (ASGI,
no network) in front of the in-memory Slurm with a fake clock. What is asserted: which jobs
are requeued and why, the plan recorded before acting, Events for the jobs left behind, and
a JobsRequeued condition that claims nothing that did not happen."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpuheal.adapters.slurm import BridgeSlurm
from gpuheal.api.meta import rfc3339
from gpuheal.api.names import JobOutcome, JobReason
from gpuheal.api.noderemediation import JobRecord, NodeRemediation
from gpuheal.api.remediationpolicy import SlurmDrainOptions
from gpuheal.remediation import steps
from gpuheal.remediation.record import Recorder
from gpuheal_bridge.api.models import JobEnd
from gpuheal_bridge.client import BridgeClient
from gpuheal_bridge.operations import Operations
from gpuheal_bridge.server.app import BridgeSettings, create_app
from tests.unit.bridge.fakes import FakeClock, FakeJob, FakeSlurm

TOKEN = "t0ken-for-the-operator-0123456789"
FAULT = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.UTC)
NOW = FAULT + dt.timedelta(seconds=1)
ACTED = FAULT + dt.timedelta(seconds=0.5)  # the bridge's clock when Slurm acted
NODE = "gpu-7"


class World:
    def __init__(self, tmp_path: Path) -> None:
        self.slurm = FakeSlurm()
        self.slurm.add_node(NODE, "MIXED")
        self.slurm.add_node("gpu-8", "MIXED")
        clock = FakeClock()
        app = create_app(
            BridgeSettings(
                backend=self.slurm,
                tokens={"operator": TOKEN},
                state_dir=tmp_path / "state",
                audit_log=tmp_path / "audit.jsonl",
                operations=Operations(
                    self.slurm, clock=clock, sleep=clock.sleep, wall_clock=lambda: ACTED
                ),
            )
        )
        transport = httpx.ASGITransport(app=app)
        self.bridge = BridgeSlurm(
            BridgeClient("http://bridge", TOKEN, retries=0, transport=transport)
        )
        self.plans: list[list[JobRecord]] = []
        self.events: list[tuple[str, str, str]] = []

    def ended(self, job_id: int, end: JobEnd, seconds: float, **kw: Any) -> None:
        state = end.value.upper()
        at = FAULT + dt.timedelta(seconds=seconds)
        self.slurm.add_job(FakeJob(job_id, [NODE], state=state, ended=end, end_time=at, **kw))

    async def step(
        self, recorded: list[JobRecord] | None = None, now: dt.datetime = NOW, **opts: Any
    ) -> steps.StepResult:
        async def record_plan(records: list[JobRecord]) -> None:
            self.plans.append(records)

        async def post_event(reason: str, message: str, type_: str) -> None:
            self.events.append((reason, message, type_))

        return await steps.slurm_drain(
            self.bridge,
            NODE,
            "nrem-1",
            79,
            SlurmDrainOptions(**opts),
            now=now,
            attempt=0,
            signal_at=FAULT,
            recorded=recorded or [],
            record_plan=record_plan,
            post_event=post_event,
        )


def jobs_of(result: steps.StepResult) -> dict[str, dict[str, Any]]:
    return {j["jobId"]: j for j in result.status["jobs"]}


def jobs_requeued(result: steps.StepResult) -> tuple[str, str, str]:
    [cond] = [c for c in result.extra_conditions if c[0] == "JobsRequeued"]
    return cond[1], cond[2], cond[3]


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


async def test_the_dead_and_the_running_are_requeued_the_rest_named(world: World) -> None:
    world.slurm.add_job(FakeJob(1, [NODE]))
    world.ended(2, JobEnd.FAILED, 0.3)  # died with its GPU
    world.ended(3, JobEnd.COMPLETED, -20)
    world.ended(4, JobEnd.CANCELLED, -10)
    world.ended(5, JobEnd.FAILED, -200)  # failed before the 3 min window
    world.ended(6, JobEnd.FAILED, -30, requeue=False)
    result = await world.step(checkpoint_signal="USR1", grace_period="2s")
    assert (result.kind, result.reason) == ("done", "Drained")
    jobs = jobs_of(result)
    summary = {k: (j["outcome"], j["reason"]) for k, j in jobs.items()}
    assert summary == {
        "1": ("Requeued", "RunningAtFault"),
        "2": ("Requeued", "EndedByFailure"),
        "3": ("LeftAlone", "EndedOk"),
        "4": ("LeftAlone", "CancelledByUser"),
        "5": ("LeftAlone", "EndedBeforeWindow"),
        "6": ("LeftAlone", "NotRequeueable"),
    }
    assert "killed by signal 9 0.3s after the fault" in jobs["2"]["message"]
    assert [j["jobId"] for j in result.status["requeuedJobs"]] == ["1", "2"]
    status, reason, message = jobs_requeued(result)
    assert (status, reason) == ("True", "Requeued")
    assert message.startswith("requeued 1, 2;")
    # the plan was recorded before anything was requeued
    [plan] = world.plans
    assert [(r.job_id, r.outcome) for r in plan if r.outcome is JobOutcome.PLANNED] == [
        ("1", JobOutcome.PLANNED),
        ("2", JobOutcome.PLANNED),
    ]
    assert sorted(m.split()[1] for _, m, _ in world.events) == ["3", "4", "5", "6"]
    kinds = {m.split()[1]: t for _, m, t in world.events}
    assert kinds == {"3": "Normal", "4": "Normal", "5": "Warning", "6": "Warning"}
    assert world.slurm.jobs[2].restart_count == 1
    assert world.slurm.jobs[3].restart_count == 0  # never revived


async def test_no_jobs_is_not_a_success(world: World) -> None:
    result = await world.step()
    status, reason, message = jobs_requeued(result)
    assert (status, reason) == ("False", "NoJobs")
    assert "no job on gpu-7 at the fault" in message
    assert result.status["jobs"] == []
    assert world.plans == []


async def test_only_jobs_left_alone_is_not_a_success(world: World) -> None:
    world.ended(3, JobEnd.COMPLETED, -1)
    result = await world.step()
    assert jobs_requeued(result)[:2] == ("False", "NothingToRequeue")


async def test_drained_by_someone_else_still_requeues_and_keeps_their_drain(world: World) -> None:
    world.slurm.add_node(NODE, "MIXED", ("DRAIN",), "admin: replace fan")
    world.slurm.add_job(FakeJob(1, [NODE]))
    result = await world.step()
    assert result.reason == "DrainedByOther"
    assert result.status["ownership"] == {"slurmDrained": False}
    assert jobs_requeued(result)[:2] == ("True", "Requeued")
    assert world.slurm.nodes[NODE].reason == "admin: replace fan"


async def test_a_pinned_job_is_released_or_held(world: World) -> None:
    world.slurm.add_job(FakeJob(1, [NODE], required=[NODE]))
    released = await world.step()
    assert jobs_of(released)["1"]["releaseNode"] is True
    assert world.slurm.jobs[1].required == []
    assert world.slurm.jobs[1].excluded == [NODE]


async def test_a_pinned_job_is_held_with_an_event(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.slurm.add_job(FakeJob(1, [NODE], required=[NODE]))
    held = await world.step(pinned_jobs="Hold")
    record = jobs_of(held)["1"]
    assert (record["outcome"], record["reason"]) == ("RequeuedHeld", "PinnedToNodeHeld")
    assert world.slurm.jobs[1].required == [NODE]  # as submitted
    assert world.slurm.jobs[1].excluded == []
    assert [r for r, _, _ in world.events] == ["JobHeld"]
    assert jobs_requeued(held)[:2] == ("True", "Requeued")


async def test_a_stuck_job_sets_the_node_down_and_says_so(world: World) -> None:
    world.slurm.add_job(FakeJob(1, [NODE], stuck_probes=10_000))
    result = await world.step(stuck_job_timeout="3s")
    record = jobs_of(result)["1"]
    assert record["outcome"] == "Requeued"
    assert record["nodeDown"] is True
    assert "set it DOWN" in record["message"]
    assert world.slurm.nodes[NODE].state == "DOWN"
    assert [r for r, _, _ in world.events] == ["NodeDownForStuckJob"]


async def test_report_only_leaves_a_stuck_node_up_and_claims_no_requeue(world: World) -> None:
    """Slurm took the requeue, but the job still holds the node (its processes outlived
    SIGKILL) and onStuckJob: Report leaves it there: JobsRequeued is not a success, the record
    and a Warning say why; a job that did leave is still named as requeued."""
    world.slurm.add_job(FakeJob(1, [NODE], stuck_probes=10_000))
    world.slurm.add_job(FakeJob(2, [NODE]))
    result = await world.step(on_stuck_job="Report")
    record = jobs_of(result)["1"]
    assert (record["nodeDown"], record["stillOnNode"]) == (False, True)
    assert "still on the node" in record["message"]
    assert jobs_of(result)["2"]["stillOnNode"] is False
    assert world.slurm.nodes[NODE].state == "MIXED"
    status, reason, message = jobs_requeued(result)
    assert (status, reason) == ("False", "StuckOnNode")
    assert message.startswith(f"requeued but still on {NODE}: 1: its processes outlived")
    assert message.endswith("; requeued 2")
    assert [(r, t) for r, _, t in world.events] == [("JobStuckOnNode", "Warning")]


async def test_a_restart_carries_on_with_the_recorded_plan(world: World) -> None:
    world.slurm.add_job(FakeJob(1, [NODE]))
    world.slurm.add_job(FakeJob(2, [NODE]))
    plan = [
        JobRecord(job_id="2", outcome=JobOutcome.PLANNED, reason=JobReason.RUNNING, state="RUNNING")
    ]
    result = await world.step(recorded=plan)
    assert list(jobs_of(result)) == ["2"]  # the recorded plan, not a new listing
    assert world.slurm.jobs[1].restart_count == 0
    assert world.plans == []


async def test_requeue_none_leaves_jobs_and_says_so(world: World) -> None:
    world.slurm.add_job(FakeJob(1, [NODE]))
    result = await world.step(requeue="none")
    assert jobs_requeued(result)[:2] == ("False", "NotRequested")
    assert world.slurm.jobs[1].restart_count == 0


async def test_slurmctld_down_while_requeueing_waits_with_the_plan_kept(world: World) -> None:
    world.slurm.add_job(FakeJob(1, [NODE]))
    world.slurm.fail_ops = {"get_job"}  # the drain and the listing work, the requeue does not
    result = await world.step()
    assert (result.kind, result.reason) == ("wait", "BridgeUnavailable")
    assert "bridge unavailable for job(s) 1" in result.message
    assert jobs_of(result)["1"]["outcome"] == "Planned"
    assert jobs_requeued(result)[:2] == ("False", "Requeueing")
    [plan] = world.plans
    world.slurm.fail_ops = set()
    again = await world.step(recorded=plan)
    assert again.kind == "done"
    assert jobs_of(again)["1"]["outcome"] == "Requeued"
    assert world.slurm.jobs[1].restart_count == 1


async def test_slurmctld_gone_in_the_grace_waits_then_requeues_once_at_slurms_time(
    world: World,
) -> None:
    """slurmctld goes away after the checkpoint signal, before `scontrol requeue`: the bridge
    answers 503 (not "failed", which it would store under the key for good), the step waits
    with the plan kept; once Slurm is back the same key requeues the job, once. The step's
    time and requeuedAt are the bridge's (when Slurm acted), not the recording's."""
    world.slurm.add_job(FakeJob(1, [NODE]))
    world.slurm.fail_ops = {"requeue"}
    result = await world.step(checkpoint_signal="USR1", grace_period="2s")
    assert (result.kind, result.reason) == ("wait", "BridgeUnavailable")
    assert jobs_of(result)["1"]["outcome"] == "Planned"
    assert world.slurm.jobs[1].restart_count == 0
    [plan] = world.plans
    world.slurm.fail_ops = set()
    again = await world.step(recorded=plan, checkpoint_signal="USR1", grace_period="2s")
    assert (again.kind, jobs_of(again)["1"]["outcome"]) == ("done", "Requeued")
    assert world.slurm.jobs[1].restart_count == 1
    assert again.at == ACTED
    assert again.status["requeuedJobs"][0]["requeuedAt"] == rfc3339(ACTED)


async def test_the_step_is_dated_when_slurm_requeued_the_job_not_when_it_answered(
    world: World,
) -> None:
    """The bridge answers once the job is off its node and PENDING (Slurm's SIGTERM, KillWait
    and epilog: ~1.8 s on a quiet cluster), after the pass that began before Slurm acted:
    the step carries the time Slurm accepted the requeue."""
    world.slurm.add_job(FakeJob(1, [NODE]))
    result = await world.step(now=FAULT)
    assert result.kind == "done"
    assert result.at == ACTED
    assert result.status["requeuedJobs"][0]["requeuedAt"] == rfc3339(ACTED)


def _nrem() -> NodeRemediation:
    return NodeRemediation.model_validate(
        {
            "metadata": {"name": "nrem-1"},
            "spec": {
                "nodeName": NODE,
                "policyRef": {"name": "p"},
                "rule": "xid",
                "signals": [{"source": "Manual", "observedAt": "2026-11-23T12:00:00Z"}],
                "ladder": [{"name": "isolate", "steps": [{"action": "slurmDrain"}]}],
            },
        }
    )


def test_a_bridge_clock_ahead_of_ours_never_dates_a_step_in_the_future() -> None:
    rec = Recorder(_nrem(), FAULT)
    ahead = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    rec.condition("SlurmDrained", "True", "Drained", "ok", at=ahead)
    rec.event("remediate/slurmDrain", "ok", at=ahead)
    rec.event("remediate/drain", "ok", at=ACTED)
    [cond] = rec.status.conditions
    by_step = {e.step: e for e in rec.status.timeline}
    assert cond.last_transition_time < ahead
    assert by_step["remediate/slurmDrain"].time < ahead
    assert by_step["remediate/drain"].time == ACTED  # a time in the past is kept as said


def test_a_step_dated_when_slurm_acted_takes_its_place_in_the_timeline() -> None:
    """The spare is claimed (and recorded) while the bridge still waits for the job's verdict;
    the Slurm step, recorded after it, happened before it: the timeline stays in time order
    (`gpuheal status -o wide` shows no negative step)."""
    rec = Recorder(_nrem(), FAULT)
    rec.event("Detected", "XID 79", at=FAULT)
    rec.event("spareClaimed", "gpu-spare-0", at=FAULT + dt.timedelta(seconds=0.8))
    rec.event("replace/slurmDrain", "requeued 1 job(s)", at=ACTED)
    assert [e.step for e in rec.status.timeline] == [
        "Detected",
        "replace/slurmDrain",
        "spareClaimed",
    ]


async def test_a_node_only_down_in_slurm_is_drained_by_gpuheal_and_the_status_says_so(
    world: World,
) -> None:
    """DOWN does not keep a node out of Slurm (ReturnToService returns it when slurmd
    answers): gpuheal drains it with its own reason, owns that drain, and says so."""
    world.slurm.add_node(NODE, "DOWN", ("NOT_RESPONDING",), "Not responding")
    result = await world.step(requeue="none")
    assert (result.kind, result.reason) == ("done", "DrainedWasDown")
    assert result.status["ownership"] == {"slurmDrained": True}
    assert "was DOWN+NOT_RESPONDING, reason 'Not responding'" in result.message
    assert "drained by gpuheal (reason 'gpuheal: nrem-1 xid=79')" in result.message
    assert world.slurm.nodes[NODE].reason == "gpuheal: nrem-1 xid=79"


async def test_a_node_slurm_does_not_know_is_skipped_not_drained(world: World) -> None:
    result = await steps.slurm_drain(world.bridge, "gpu-x", "nrem-1", 79, SlurmDrainOptions(),
                                     now=NOW, attempt=0)  # fmt: skip
    assert (result.kind, result.reason) == ("skipped", "NotASlurmNode")
    assert "ownership" not in result.status


async def _resume(world: World, incident: str = "nrem-1") -> steps.StepResult:
    return await steps.resume_in_slurm(
        world.bridge, NODE, incident, "ReturnedToService", ["gpu-7 uncordoned"], retry=5.0
    )


async def test_the_return_resumes_only_this_incidents_drain(world: World) -> None:
    await world.step(requeue="none")
    back = await _resume(world)
    assert (back.kind, back.reason) == ("done", "ReturnedToService")
    assert back.message == "gpu-7 uncordoned; Slurm gpu-7: resumed (MIXED)"
    # Another incident's return (its own idempotency key) finds the node in service: back.
    again = await _resume(world, "nrem-2")
    assert (again.kind, again.reason) == ("done", "ReturnedToService")
    assert again.message == "gpu-7 uncordoned; Slurm gpu-7: back in service already (MIXED)"


async def test_a_refused_resume_is_no_return(world: World) -> None:
    await world.step(requeue="none")
    world.slurm.add_node(NODE, "MIXED", ("DRAIN",), "admin: memtest")  # took the drain over
    refused = await _resume(world)
    assert (refused.kind, refused.reason) == ("skipped", "SlurmResumeRefused")
    assert "drained by someone else" in refused.message
    assert world.slurm.nodes[NODE].reason == "admin: memtest"


async def test_a_resume_while_slurm_is_down_waits(world: World) -> None:
    await world.step(requeue="none")
    world.slurm.down = True
    later = await _resume(world)
    assert (later.kind, later.reason) == ("wait", "BridgeUnavailable")
    assert later.message.startswith("gpu-7 uncordoned; ")
    world.slurm.down = False
    back = await _resume(world)
    assert (back.kind, back.reason) == ("done", "ReturnedToService")
