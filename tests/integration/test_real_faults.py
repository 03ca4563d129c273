"""Real faults, end to end: the operator (a process), the real Slurm bridge (a process, CLI
backend) and a real Slurm sandbox (proctrack/cgroup where this machine allows it), with the
demo's training job as the workload. No mocks.

The fault is what a lost GPU does to the job (`gpuheal_dev.sandbox.faults`): its process
dies at once (the job is FAILED before gpuheal acts), hangs ignoring every signal but
SIGKILL, or sleeps uninterruptibly so that not even SIGKILL ends it. Then the XID Event.
Each case checks where the job runs again, that it resumed from its newest checkpoint (and
how many steps were lost), what Slurm shows, and what the NodeRemediation says per job.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpuheal.cli.simulate import simulate_xid
from gpuheal_dev.demo_job import ModelConfig, Run, RunConfig, read_records, split_runs, write_sbatch
from gpuheal_dev.demo_job.slurm import job_info, last_checkpoint_step, submit, wait_job
from gpuheal_dev.sandbox import Sandbox
from gpuheal_dev.sandbox.faults import FakeGpus, GpuState, Wedge, WedgeUnavailable, job_processes
from gpuheal_dev.sandbox.slurm import SlurmCluster
from gpuheal_dev.sandbox.slurmroot import HOST_SLURM
from tests.fixtures.slurm import on_every_release
from tests.integration.operator_harness import (
    Objects,
    OperatorProcess,
    Xid79Scene,
    condition,
    dump,
    node_events,
    wait_for,
)

pytestmark = pytest.mark.integration

CKPT_EVERY, STEP_S = 10, 0.05
GRACE = "2s"


def rule(*, checkpoint: bool = True, **slurm_drain: Any) -> dict[str, Any]:
    """The XID 79 rule: cordon, then slurmDrain with ``slurm_drain`` over a plain requeue
    (with the USR1 checkpoint grace unless ``checkpoint`` is false: the lost-GPU policy)."""
    opts: dict[str, Any] = {"requeue": "requeue"}
    if checkpoint:
        opts |= {"checkpointSignal": "USR1", "gracePeriod": GRACE}
    return {
        "name": "fell-off-bus",
        "signals": {"xids": [79]},
        "ladder": [
            {
                "name": "requeue",
                "steps": [
                    {"action": "cordon"},
                    {"action": "slurmDrain", "slurmDrain": {**opts, **slurm_drain}},
                ],
            }
        ],
    }


@dataclass
class Scene:
    """Three nodes (Kubernetes and Slurm, same names), the bridge, a policy, the operator."""

    sandbox: Sandbox
    nodes: list[str]
    cluster: SlurmCluster
    objects: Objects
    op: OperatorProcess
    gpus: FakeGpus
    tmp: Path
    jobs: list[int] = field(default_factory=list)

    @property
    def broken(self) -> str:
        return self.nodes[0]

    def demo_job(self, name: str, *sbatch: str) -> tuple[int, Path]:
        """The demo's training job (never finishing here), RUNNING and past 2 checkpoints."""
        workdir = self.tmp / name
        run = RunConfig(
            workdir=workdir, steps=1_000_000, ckpt_every=CKPT_EVERY, step_seconds=STEP_S
        )
        script = write_sbatch(
            workdir / "job.sh", ModelConfig(), run, python=sys.executable, env=self.gpus.env()
        )
        job = submit(self.cluster, script, f"--job-name={name}", *sbatch)
        self.jobs.append(job)
        wait_job(self.cluster, job, lambda j: j.state == "RUNNING", what=f"{name} RUNNING")
        wait_for(
            lambda: last_checkpoint_step(read_records(workdir / "metrics.jsonl")) >= 2 * CKPT_EVERY,
            f"{name}: two checkpoints",
        )
        return job, workdir

    def on_broken_only(self) -> None:
        """Hold the other nodes so that the next job lands on the broken one (unpinned)."""
        for n in self.nodes[1:]:
            self.cluster.run("scontrol", "update", f"NodeName={n}", "State=DRAIN", "Reason=hold")

    def release_others(self) -> None:
        for n in self.nodes[1:]:
            self.cluster.run("scontrol", "update", f"NodeName={n}", "State=RESUME", check=False)

    def xid(self) -> float:
        t0 = time.monotonic()
        simulate_xid(self.sandbox.core_v1(), self.broken, 79)
        return t0

    def incident_with_jobs(self, timeout: float = 90) -> dict[str, Any]:
        """The incident once its Slurm step is done (SlurmDrained=True)."""

        def done() -> dict[str, Any] | None:
            nrem = self.objects.incident(self.broken)
            c = condition(nrem, "SlurmDrained")
            return nrem if c and c["status"] == "True" else None

        nrem: dict[str, Any] = wait_for(done, "SlurmDrained=True", timeout=timeout)
        return nrem

    def slurm_node(self, node: str) -> str:
        return self.cluster.run("scontrol", "show", "node", "-o", node).stdout

    def events(self, nrem: dict[str, Any]) -> list[tuple[str, str]]:
        name = nrem["metadata"]["name"]
        evs = node_events(self.sandbox.core_v1(), name, kind="NodeRemediation")
        return [(e.reason, e.message) for e in evs]


def jobs_by_id(nrem: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {j["jobId"]: j for j in nrem["status"].get("jobs") or []}


@dataclass(frozen=True)
class Runs:
    """The job's metrics records before the fault's restart, and the run after it."""

    before: list[dict[str, Any]]
    after: Run

    def last_checkpoint(self) -> int:
        return last_checkpoint_step(self.before)

    def event(self, name: str) -> list[dict[str, Any]]:
        return [r for r in self.before if r["event"] == name]


def resumed(workdir: Path, timeout: float = 90, scene: Scene | None = None) -> Runs:
    """Wait until the job trains again after a restart; split its records there. On a
    timeout the message carries what Slurm and the incident said (``scene``)."""

    def second() -> Runs | None:
        recs = read_records(workdir / "metrics.jsonl")
        runs = split_runs(recs)
        if len(runs) < 2 or not runs[1].steps:
            return None
        cut = recs.index(runs[1].start)
        return Runs(recs[:cut], runs[1])

    try:
        found: Runs = wait_for(second, f"{workdir.name} training again", timeout=timeout)
    except AssertionError as exc:
        if scene is None:
            raise
        jobs = scene.cluster.run("squeue", "-h", "-t", "all", "-o", "%i %T %r %N", check=False)
        shown = [
            scene.cluster.run("scontrol", "show", "job", "-o", str(j), check=False).stdout
            for j in scene.jobs
        ]
        nrem = scene.objects.incident(scene.broken)
        raise AssertionError(
            f"{exc}\nsqueue: {jobs.stdout}\n{''.join(shown)}\nincident: "
            f"{dump((nrem or {}).get('status'))}"
        ) from exc
    return found


MakeScene = Callable[..., Scene]


@pytest.fixture
def make_scene(
    sandbox: Sandbox, xid79_scene: Callable[..., Xid79Scene], tmp_path: Path
) -> Iterator[MakeScene]:
    """``make_scene(unkillable=60, **slurmDrain options)``: one scene per test, the operator
    running (the XID 79 scene with three nodes in Slurm, no spares, the requeue ladder)."""
    made: list[Scene] = []

    def make(unkillable: int = 60, **slurm_drain: Any) -> Scene:
        world = xid79_scene(
            work=3,
            spares=0,
            slurm={"unkillable_step_timeout": unkillable},
            rules=[rule(**slurm_drain)],
        )
        cluster = world.cluster
        assert cluster is not None
        print(f"\nSlurm sandbox: proctrack/{cluster.proctrack} ({cluster.proctrack_reason})")
        op = world.start()
        gpus = FakeGpus(cluster.root / "gpus")
        sc = Scene(sandbox, world.work, cluster, world.objects, op, gpus, tmp_path)
        made.append(sc)
        return sc

    yield make
    for sc in made:  # the nodes and the incidents go with the XID 79 scene
        sc.op.stop()
        for job in sc.jobs:
            sc.cluster.run("scancel", str(job), check=False)
        for n in sc.nodes:
            sc.gpus.heal(n)


@pytest.fixture
def scene(make_scene: MakeScene) -> Scene:
    return make_scene()


@on_every_release
def test_job_killed_with_its_gpu_is_requeued_and_resumes_from_its_checkpoint(
    scene: Scene,
) -> None:
    """The common case: the process dies at once, the job is FAILED before gpuheal acts.
    A job that completed and one its user cancelled on the same node stay as they are and
    are named in the status."""
    sc, broken = scene, scene.broken
    done = int(sc.cluster.run("sbatch", "--parsable", "-w", broken, "--wrap", "true").stdout)
    wait_job(sc.cluster, done, lambda j: j.state == "COMPLETED", what="a job completed")
    user = int(sc.cluster.run("sbatch", "--parsable", "-w", broken, "--wrap", "sleep 600").stdout)
    wait_job(sc.cluster, user, lambda j: j.state == "RUNNING", what="a user's job running")
    sc.cluster.run("scancel", str(user))
    wait_job(sc.cluster, user, lambda j: j.state == "CANCELLED", what="the user cancelled it")
    sc.on_broken_only()
    job, workdir = sc.demo_job("train")
    sc.release_others()

    sc.gpus.set(broken, GpuState.LOST)
    wait_job(sc.cluster, job, lambda j: j.state == "FAILED", what="job FAILED with its GPU")
    t0 = sc.xid()
    nrem = sc.incident_with_jobs()
    runs = resumed(workdir, scene=sc)
    print(f"XID -> training again in {time.monotonic() - t0:.2f}s (includes polling)")
    print(dump(nrem["status"]))

    jobs = jobs_by_id(nrem)
    assert (jobs[str(job)]["outcome"], jobs[str(job)]["reason"]) == ("Requeued", "EndedByFailure")
    assert "exit 1" in jobs[str(job)]["message"]
    assert (jobs[str(done)]["outcome"], jobs[str(done)]["reason"]) == ("LeftAlone", "EndedOk")
    assert (jobs[str(user)]["outcome"], jobs[str(user)]["reason"]) == (
        "LeftAlone",
        "CancelledByUser",
    )
    assert [j["jobId"] for j in nrem["status"]["requeuedJobs"]] == [str(job)]
    requeued = condition(nrem, "JobsRequeued")
    assert requeued is not None
    assert (requeued["status"], requeued["reason"]) == ("True", "Requeued")
    assert str(job) in requeued["message"]
    left = [m for r, m in sc.events(nrem) if r == "JobNotRequeued"]
    assert sorted(m.split()[1] for m in left) == sorted([str(done), str(user)])

    # it runs elsewhere, from its newest checkpoint; the steps since then are lost
    [error] = runs.event("gpu_error")
    assert runs.after.start["host"] != broken
    assert runs.after.resume_step == runs.last_checkpoint()
    assert int(error["step"]) - 1 >= runs.last_checkpoint()  # the steps since then: lost
    info = job_info(sc.cluster, job)
    assert info.restarts == 1
    assert broken in info.excluded
    for other in (done, user):  # never revived
        assert job_info(sc.cluster, other).restarts == 0


@on_every_release
def test_hung_job_is_killed_off_the_node_and_resumes(scene: Scene) -> None:
    """The process stops making progress and ignores the checkpoint signal and SIGTERM:
    Slurm's SIGKILL (max(KillWait, 5 s) after the requeue) gets it off the node."""
    sc, broken = scene, scene.broken
    sc.on_broken_only()
    job, workdir = sc.demo_job("hung")
    sc.release_others()
    sc.gpus.set(broken, GpuState.HUNG)
    wait_for(
        lambda: any(r["event"] == "gpu_hang" for r in read_records(workdir / "metrics.jsonl")),
        "the job hung",
    )
    t0 = sc.xid()
    nrem = sc.incident_with_jobs()
    runs = resumed(workdir, scene=sc)
    print(f"XID -> training again in {time.monotonic() - t0:.2f}s (includes polling)")
    record = jobs_by_id(nrem)[str(job)]
    print(dump(record))
    assert (record["outcome"], record["reason"]) == ("Requeued", "RunningAtFault")
    assert record["nodeDown"] is False
    assert re.search(r"off the node [\d.]+s after the requeue", record["message"])
    assert runs.event("signal") == []  # USR1 and SIGTERM never got through
    assert runs.after.start["host"] != broken
    assert runs.after.resume_step == runs.last_checkpoint()
    assert job_processes(sc.cluster.conf_path, broken, job) == []


def tracks_with_cgroup(sc: Scene) -> bool:
    """Whether this machine has cgroup tracking for the sandbox's Slurm; where it has (CI's
    machines do), the scene's Slurm must be using it: a fallback to linuxproc fails."""
    if not sc.cluster.cgroup_support().ok:
        return False
    assert sc.cluster.proctrack == "cgroup", sc.cluster.proctrack_reason
    return True


# the wedge is under the cluster's root: on 26.05 a mount made there reaches the daemons'
# namespaces (a shared mount, gpuheal_dev.sandbox.slurm), as a mount on a node reaches slurmd
@on_every_release
def test_job_that_outlives_sigkill_gets_its_node_set_down_and_resumes(
    make_scene: MakeScene,
) -> None:
    """Stuck in uninterruptible sleep: SIGKILL cannot end it. With cgroup tracking the job
    stays COMPLETING on the node; gpuheal sets the node DOWN (its reason kept) so that Slurm
    releases the job, which resumes elsewhere; later slurmd drains the node itself ("Kill
    task failed") and that drain is Slurm's, not gpuheal's."""
    sc = make_scene(unkillable=20, stuckJobTimeout="2s")
    broken = sc.broken
    cgroup = tracks_with_cgroup(sc)
    try:
        wedge = Wedge(sc.cluster.root / "wedge").open()
    except WedgeUnavailable as exc:
        pytest.skip(f"no FUSE here to wedge a process: {exc}")
    try:
        sc.on_broken_only()
        job, workdir = sc.demo_job("wedged")
        sc.release_others()
        sc.gpus.set(broken, GpuState.WEDGED, wedge.path())
        wait_for(lambda: wedge.held, "the job stuck in D state")
        t0 = sc.xid()
        nrem = sc.incident_with_jobs()
        runs = resumed(workdir, scene=sc)
        print(f"XID -> training again in {time.monotonic() - t0:.2f}s (includes polling)")
        record = jobs_by_id(nrem)[str(job)]
        print(dump(record))
        assert record["outcome"] == "Requeued"
        assert runs.after.start["host"] != broken
        assert runs.after.resume_step == runs.last_checkpoint()
        stuck = job_processes(sc.cluster.conf_path, broken, job)
        if not cgroup:
            # linuxproc loses track of the stuck process: the job left at once, the process
            # lives on unseen (what production's cgroup tracking prevents)
            assert stuck
            assert record["nodeDown"] is False
            return
        assert record["nodeDown"] is True
        assert "outlived SIGKILL" in record["message"]
        assert any(r == "NodeDownForStuckJob" for r, _ in sc.events(nrem))
        assert stuck  # still there, in D state: only a reboot (here: the wedge) ends it
        assert f"Reason=gpuheal: {nrem['metadata']['name']}" in sc.slurm_node(broken)
        if sc.cluster.release != HOST_SLURM:
            # 26.05.5 here (cgroup/v1): a stuck process that is the batch step's task itself
            # keeps slurmstepd waiting for it, and "Kill task failed" never comes (seen 40 s
            # past UnkillableStepTimeout; a stuck child of a batch shell that died does get
            # it: test_slurm_sandbox), so the node keeps gpuheal's reason
            return
        wait_for(
            lambda: "Reason=Kill task failed" in sc.slurm_node(broken),
            "slurmd drains the node itself",
            timeout=60,
        )
    finally:
        wedge.close()


@on_every_release
def test_report_leaves_a_job_that_cannot_be_killed_to_slurm_and_says_where_it_is(
    make_scene: MakeScene,
) -> None:
    """onStuckJob: Report: gpuheal does not set the node DOWN and the requeued job waits
    COMPLETING. On 22.05 slurmd drains the node at UnkillableStepTimeout ("Kill task failed",
    replacing gpuheal's reason), Slurm lets the job go and it resumes elsewhere. 26.05.5 here
    never does that for a stuck batch task: the job stays on the node, and the incident says
    so (JobsRequeued False, StuckOnNode; a JobStuckOnNode Warning), claiming no requeue."""
    sc = make_scene(unkillable=10, onStuckJob="Report")
    broken = sc.broken
    if not tracks_with_cgroup(sc):
        pytest.skip(f"needs proctrack/cgroup ({sc.cluster.cgroup_support().reason})")
    try:
        wedge = Wedge(sc.cluster.root / "wedge").open()
    except WedgeUnavailable as exc:
        pytest.skip(f"no FUSE here to wedge a process: {exc}")
    try:
        sc.on_broken_only()
        job, workdir = sc.demo_job("wedged")
        sc.release_others()
        sc.gpus.set(broken, GpuState.WEDGED, wedge.path())
        wait_for(lambda: wedge.held, "the job stuck in D state")
        sc.xid()
        nrem = sc.incident_with_jobs(timeout=120)
        record = jobs_by_id(nrem)[str(job)]
        print(dump(record))
        requeued = condition(nrem, "JobsRequeued") or {}
        assert record["outcome"] == "Requeued"
        assert record["nodeDown"] is False
        if sc.cluster.release != HOST_SLURM:
            assert record["stillOnNode"] is True
            assert "still on the node" in record["message"]
            assert (requeued.get("status"), requeued.get("reason")) == ("False", "StuckOnNode")
            assert f"requeued but still on {broken}: {job}" in requeued["message"]
            name = nrem["metadata"]["name"]
            wait_for(
                lambda: [
                    e
                    for e in node_events(sc.sandbox.core_v1(), name, kind="NodeRemediation")
                    if (e.reason, e.type) == ("JobStuckOnNode", "Warning")
                ],
                "the JobStuckOnNode Warning",
            )
            info = job_info(sc.cluster, job)
            assert (info.state, info.batch_host) == ("COMPLETING", broken), info
            return
        runs = resumed(workdir, scene=sc)
        assert record["stillOnNode"] is False  # it left within the bridge's settle wait
        assert (requeued.get("status"), requeued.get("reason")) == ("True", "Requeued")
        assert runs.after.start["host"] != broken
        assert "Reason=Kill task failed" in sc.slurm_node(broken)
    finally:
        wedge.close()


@on_every_release
def test_node_drained_by_an_admin_first_keeps_its_drain_and_the_jobs_still_move(
    scene: Scene,
) -> None:
    """An admin drained the node before the XID; the job (pinned to that node with -w)
    dies with its GPU. gpuheal requeues it all the same, releasing it from its --nodelist,
    and leaves the admin's drain (and the right to resume the node) to the admin."""
    sc, broken = scene, scene.broken
    job, workdir = sc.demo_job("pinned", "-w", broken)
    admin = "admin: fan swap, ticket OPS-7"
    sc.cluster.run("scontrol", "update", f"NodeName={broken}", "State=DRAIN", f"Reason={admin}")
    sc.gpus.set(broken, GpuState.LOST)
    wait_job(sc.cluster, job, lambda j: j.state == "FAILED", what="job FAILED with its GPU")
    sc.xid()
    nrem = sc.incident_with_jobs()
    runs = resumed(workdir, scene=sc)
    print(dump(nrem["status"]))
    drained = condition(nrem, "SlurmDrained")
    assert drained is not None
    assert drained["reason"] == "DrainedByOther"
    assert nrem["status"]["ownership"]["slurmDrained"] is False
    requeued = condition(nrem, "JobsRequeued")
    assert requeued is not None
    assert (requeued["status"], requeued["reason"]) == ("True", "Requeued")
    record = jobs_by_id(nrem)[str(job)]
    assert record["releaseNode"] is True
    assert f"{broken} dropped from its --nodelist" in record["message"]
    assert f"Reason={admin} [" in sc.slurm_node(broken)
    assert runs.after.start["host"] != broken
    text = sc.cluster.run("scontrol", "show", "job", "-o", str(job)).stdout
    assert "ReqNodeList=(null)" in text
    assert f"ExcNodeList={broken}" in text


@on_every_release
def test_two_node_job_with_one_faulty_node_is_requeued_whole(scene: Scene) -> None:
    """A 2-node job (named nodes: the broken one and a healthy one) with the fault on its
    second node: requeued whole, the broken node dropped and excluded, Slurm picks another."""
    sc = scene
    healthy, broken, third = sc.nodes[1], sc.nodes[0], sc.nodes[2]
    job, workdir = sc.demo_job("two-nodes", "-N", "2", "-n", "2", "-w", f"{healthy},{broken}")
    info = job_info(sc.cluster, job)
    assert sorted(sc.cluster.run("scontrol", "show", "hostnames", info.nodes).stdout.split()) == (
        sorted([healthy, broken])
    )
    sc.xid()
    nrem = sc.incident_with_jobs()
    runs = resumed(workdir, scene=sc)
    record = jobs_by_id(nrem)[str(job)]
    print(dump(record))
    assert (record["outcome"], record["reason"]) == ("Requeued", "RunningAtFault")
    assert record["releaseNode"] is True
    assert runs.after.resume_step == runs.last_checkpoint()  # checkpointed on USR1/SIGTERM
    info = wait_job(sc.cluster, job, lambda j: j.state == "RUNNING", what="running again")
    assert info.restarts == 1
    assert broken in info.excluded
    assert sorted(sc.cluster.run("scontrol", "show", "hostnames", info.nodes).stdout.split()) == (
        sorted([healthy, third])
    )
