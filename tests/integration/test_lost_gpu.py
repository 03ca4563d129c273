"""A lost GPU (XID 79) under `slurmDrain.nodeDown` (the default policy's 79 rungs), end to end:
the operator and the bridge (processes), real Slurm of either release, the demo's training job.

The GPU's state is gone, so no checkpoint signal and no grace: the jobs are requeued and the
Slurm node set DOWN at once, its drain kept, so Slurm releases them whatever their processes
do (here: one stuck in D state on a FUSE wedge, as a process in the driver is). Each case
prints the time from the XID Event to the job RUNNING elsewhere (what `bench fault_to_running`
measures; the tests assert behaviour, not time).
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuheal_dev.demo_job import ModelConfig, RunConfig, read_records, write_sbatch
from gpuheal_dev.demo_job.slurm import job_info, last_checkpoint_step, submit, wait_job
from gpuheal_dev.sandbox import Sandbox
from gpuheal_dev.sandbox.faults import FakeGpus, GpuState, Wedge, WedgeUnavailable
from tests.fixtures.slurm import SLURM_RELEASES
from tests.integration.operator_harness import Xid79Scene, condition, dump, wait_for
from tests.integration.test_real_faults import (
    CKPT_EVERY,
    STEP_S,
    Scene,
    jobs_by_id,
    resumed,
    rule,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def wedge(tmp_path: Path) -> Iterator[Wedge]:
    """A FUSE wedge, mounted before the Slurm daemons start (26.05's would see a later mount
    only under the cluster's root, its shared bind: gpuheal_dev.sandbox.slurm)."""
    try:
        w = Wedge(tmp_path / "wedge").open()
    except WedgeUnavailable as exc:
        pytest.skip(f"no FUSE here to wedge a process: {exc}")
    yield w
    w.close()


@pytest.fixture
def lost_scene(
    sandbox: Sandbox, xid79_scene: Callable[..., Xid79Scene], tmp_path: Path
) -> Iterator[Scene]:
    """Three nodes in Kubernetes and Slurm (the release of ``slurm_release``), the bridge, the
    lost-GPU policy, the operator running."""
    world = xid79_scene(
        work=3,
        spares=0,
        slurm={"unkillable_step_timeout": 60},
        rules=[rule(checkpoint=False, nodeDown=True)],  # the default policy's XID 79 step
    )
    assert world.cluster is not None
    op = world.start()
    gpus = FakeGpus(world.cluster.root / "gpus")
    sc = Scene(sandbox, world.work, world.cluster, world.objects, op, gpus, tmp_path)
    yield sc
    op.stop()
    for job in sc.jobs:
        sc.cluster.run("scancel", str(job), check=False)
    for n in sc.nodes:
        sc.gpus.heal(n)


def running_again(sc: Scene, job: int, t0: float) -> float:
    """Seconds from ``t0`` (just before the XID Event) until Slurm shows the job RUNNING again
    (restarted), polled every 50 ms."""
    wait_for(
        lambda: (i := job_info(sc.cluster, job)).state == "RUNNING" and i.restarts >= 1,
        f"job {job} RUNNING again",
        timeout=60,
        every=0.05,
    )
    return time.monotonic() - t0


@pytest.mark.parametrize("slurm_release", SLURM_RELEASES, indirect=True)
def test_job_hung_on_a_lost_gpu_trains_again_elsewhere_without_waiting_for_it(
    wedge: Wedge, lost_scene: Scene, slurm_release: str
) -> None:
    """The job's process is stuck in the driver (D state: SIGKILL cannot end it). nodeDown:
    gpuheal requeues it and sets the Slurm node DOWN at once, its drain reason kept, so Slurm
    lets the job go and it trains again on another node from its last checkpoint; no signal
    reached the job; the node stays drained after its slurmd registers again, and gpuheal's
    resume brings it back."""
    sc = lost_scene
    broken = sc.broken
    sc.on_broken_only()
    job, workdir = sc.demo_job("wedged")
    sc.release_others()
    sc.gpus.set(broken, GpuState.WEDGED, wedge.path())
    wait_for(lambda: wedge.held, "the job stuck in D state")
    t0 = sc.xid()
    seconds = running_again(sc, job, t0)
    nrem = sc.incident_with_jobs()
    runs = resumed(workdir, scene=sc)
    print(f"\nSlurm {slurm_release}: XID Event -> RUNNING elsewhere in {seconds:.2f}s")
    record = jobs_by_id(nrem)[str(job)]
    print(dump(record))
    assert (record["outcome"], record["reason"]) == ("Requeued", "RunningAtFault")
    assert record["nodeDown"] is True
    assert "GPU is lost" in record["message"]
    assert any(r == "NodeDownForLostGpu" for r, _ in sc.events(nrem))
    assert runs.event("signal") == []  # no checkpoint signal: nothing to save
    assert runs.after.start["host"] != broken
    assert runs.after.resume_step == runs.last_checkpoint()
    assert job_info(sc.cluster, job).restarts == 1
    # DOWN, and drained with gpuheal's reason: when slurmd registers again (ReturnToService=2
    # lifts DOWN) the node is still drained and nothing runs there
    state = sc.slurm_node(broken)
    assert re.search(r"State=\S*DRAIN", state), state
    assert f"Reason=gpuheal: {nrem['metadata']['name']}" in state
    wedge.close()  # the "reboot": the stuck process ends
    # slurmd registers again (ReturnToService=2 lifts DOWN): the node is still drained,
    # nothing runs there; gpuheal's own resume (what return to service sends) lifts it
    sc.cluster.run("scontrol", "update", f"NodeName={broken}", "State=RESUME")
    wait_for(
        lambda: "DRAIN" not in sc.slurm_node(broken) and "DOWN" not in sc.slurm_node(broken),
        f"{broken} back in service",
        timeout=60,
    )


@pytest.mark.parametrize("slurm_release", ["26.05"], indirect=True)
def test_two_node_job_hit_on_one_node_trains_again_at_once_with_expedited_requeue(
    lost_scene: Scene, slurm_release: str
) -> None:
    """Slurm 26.05, a 2-node job submitted with ``--requeue=expedite`` (the site sets
    ``SlurmctldParameters=enable_expedited_requeue``): the XID on one of its nodes requeues it
    and sets that node DOWN; Slurm restarts it at once on its healthy node and another (no
    wait for the revoked credential's cred_expire), and it trains from its checkpoint."""
    sc = lost_scene
    broken, healthy, third = sc.nodes
    sc.cluster.run("scontrol", "update", f"NodeName={third}", "State=DRAIN", "Reason=hold")
    job, workdir = demo_job_expedite(sc, "two-nodes")
    sc.cluster.run("scontrol", "update", f"NodeName={third}", "State=RESUME")
    info = job_info(sc.cluster, job)
    assert set(sc.cluster.run("scontrol", "show", "hostnames", info.nodes).stdout.split()) == {
        broken,
        healthy,
    }
    t0 = sc.xid()
    seconds = running_again(sc, job, t0)
    nrem = sc.incident_with_jobs()
    runs = resumed(workdir, scene=sc)
    print(f"\nSlurm {slurm_release}: 2-node job, XID Event -> RUNNING again in {seconds:.2f}s")
    record = jobs_by_id(nrem)[str(job)]
    print(dump(record))
    assert record["outcome"] == "Requeued"
    assert record["nodeDown"] is True
    assert runs.after.resume_step == runs.last_checkpoint()
    info = wait_job(sc.cluster, job, lambda j: j.state == "RUNNING", what="running again")
    assert info.restarts == 1
    assert set(sc.cluster.run("scontrol", "show", "hostnames", info.nodes).stdout.split()) == {
        healthy,
        third,
    }
    # it keeps running there: slurmd on its healthy node did not refuse it (revoked credential)
    time.sleep(2)
    assert job_info(sc.cluster, job).state == "RUNNING"
    drained = condition(nrem, "SlurmDrained")
    assert drained is not None
    assert drained["status"] == "True"


def demo_job_expedite(sc: Scene, name: str) -> tuple[int, Path]:
    """The demo's training job on two nodes, ``--requeue=expedite``, RUNNING and past two
    checkpoints."""
    workdir = sc.tmp / name
    run = RunConfig(workdir=workdir, steps=1_000_000, ckpt_every=CKPT_EVERY, step_seconds=STEP_S)
    script = write_sbatch(
        workdir / "job.sh", ModelConfig(), run, python=sys.executable, env=sc.gpus.env()
    )
    job = submit(
        sc.cluster, script, f"--job-name={name}", "--requeue=expedite", "-N", "2", "-n", "2"
    )
    sc.jobs.append(job)
    wait_job(sc.cluster, job, lambda j: j.state == "RUNNING", what=f"{name} RUNNING")
    wait_for(
        lambda: last_checkpoint_step(read_records(workdir / "metrics.jsonl")) >= 2 * CKPT_EVERY,
        f"{name}: two checkpoints",
    )
    return job, workdir
