"""The demo's pure parts: what counts as each step of the story, from plain snapshots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuheal_dev.demo import (
    MILESTONES,
    OPTIONAL,
    DemoSettings,
    NodeFacts,
    PodFacts,
    Scene,
    SlurmNode,
    Snapshot,
    demo_root,
    job_milestone,
    trainer_manifests,
)
from gpuheal_dev.demo_job.slurm import JobInfo
from gpuheal_dev.timeline import STORY

SCENE = Scene(broken="gpu-node-0", spare="gpu-spare-0", job_id=1, pods_on_broken=frozenset({"p0"}))
NREM = "nrem-gpu-node-0-abc"


def node(**kw: Any) -> NodeFacts:
    base: dict[str, Any] = {
        "unschedulable": False,
        "labels": {"gpuheal.io/pool": "training"},
        "annotations": {},
        "taints": [],
    }
    return NodeFacts(**{**base, **kw})


def job(state: str = "RUNNING", restarts: int = 0, host: str = "gpu-node-0") -> JobInfo:
    return JobInfo(1, state, "None", host, host, restarts, "(null)")


def snap(**kw: Any) -> Snapshot:
    base: dict[str, Any] = {
        "at": dict.fromkeys(("nodes", "incidents", "pods", "slurm", "job"), 0.0),
        "nodes": {
            "gpu-node-0": node(),
            "gpu-spare-0": node(labels={"gpuheal.io/pool": "reserve"}, taints=["gpuheal.io/spare"]),
        },
        "incidents": [],
        "pods": [PodFacts("p0", "gpu-node-0", "Running", False)],
        "slurm": {
            "gpu-node-0": SlurmNode("allocated", "none"),
            "gpu-spare-0": SlurmNode("drained", "reserve pool"),
        },
        "job": job(),
    }
    return Snapshot(**{**base, **kw})


def seen(s: Snapshot) -> list[str]:
    return [name for name, check, _ in MILESTONES if check(s, SCENE) is not None]


def test_nothing_is_seen_before_the_fault() -> None:
    assert seen(snap()) == []


def test_after_the_story_every_milestone_is_seen() -> None:
    incident = {
        "metadata": {"name": NREM},
        "spec": {"nodeName": "gpu-node-0", "rule": "fell-off-bus", "ladder": [{"name": "r"}]},
        "status": {
            "conditions": [{"type": "Completed", "status": "True", "reason": "Replaced"}],
            "replacementNode": "gpu-spare-0",
        },
    }
    s = snap(
        nodes={
            "gpu-node-0": node(
                unschedulable=True, annotations={"gpuheal.io/cordoned-by": NREM}
            ),
            "gpu-spare-0": node(
                labels={"gpuheal.io/pool": "training", "gpuheal.io/claimed-by": NREM}
            ),
        },
        incidents=[incident],
        pods=[
            PodFacts("p0", "gpu-node-0", "Running", True),
            PodFacts("p1", "gpu-spare-0", "Running", False),
        ],
        slurm={
            "gpu-node-0": SlurmNode("drained", f"gpuheal: {NREM} xid=79"),
            "gpu-spare-0": SlurmNode("allocated", "none"),
        },
        job=job(restarts=1, host="gpu-spare-0"),
    )  # fmt: skip
    assert seen(s) == [name for name, _, _ in MILESTONES]
    # the demo sees (or the job's metrics give) every step the timeline expects
    assert set(STORY) - {n for n, _, _ in MILESTONES} == {"fault", "resumed from checkpoint"}


def test_someone_elses_cordon_or_drain_is_not_ours() -> None:
    s = snap(
        nodes={"gpu-node-0": node(unschedulable=True)},
        slurm={"gpu-node-0": SlurmNode("drained", "admin: memtest")},
    )
    assert "cordoned" not in seen(s)
    assert "slurm drained" not in seen(s)


def test_job_records_that_belong_to_the_story() -> None:
    usr1 = {"event": "checkpoint", "time": 11.0, "step": 45, "reason": "SIGUSR1"}
    interval = {"event": "checkpoint", "time": 11.0, "step": 40, "reason": "interval"}
    stop = {"event": "exit", "time": 12.0, "step": 60, "reason": "SIGTERM"}
    assert job_milestone(usr1, 10.0) == (
        "checkpoint on signal",
        "step 45 saved on SIGUSR1 from the bridge",
    )
    assert job_milestone(interval, 10.0) is None
    assert job_milestone(stop, 10.0) is not None
    assert job_milestone(stop, 13.0) is None  # before the fault: not part of the incident


def test_trainer_pods_stay_off_spares_and_one_per_node() -> None:
    deployment, pdb = trainer_manifests(4)
    spec = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 4
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["training"]
    assert pdb["spec"]["maxUnavailable"] == 1


def test_a_root_too_deep_for_slurm_sockets_falls_back_to_a_short_one(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 90)
    short = demo_root(deep)
    assert short != deep.resolve()
    assert len(str(short)) < 40
    short.rmdir()
    ok = Path("/tmp/gh-demo-ok")
    assert demo_root(ok) == ok


def test_the_jobs_own_fault_records_belong_to_the_story() -> None:
    died = {"event": "gpu_error", "time": 10.0, "step": 47, "error": "CUDA error: x"}
    hung = {"event": "gpu_hang", "time": 10.0, "step": 47, "state": "hung"}
    assert job_milestone(died, 9.9) == ("job died with its GPU", "step 47: CUDA error: x; exit 1")
    named = job_milestone(hung, 9.9)
    assert named is not None
    assert named[0] == "job hung in the driver"
    assert job_milestone(died, 10.5) is None  # before the fault: not part of the story


def test_a_job_failed_before_gpuheal_acted_is_seen() -> None:
    [(_, check, _)] = [o for o in OPTIONAL if o[0] == "job FAILED"]
    assert check(snap(job=job("FAILED")), SCENE) is not None
    assert check(snap(job=job("FAILED", restarts=1)), SCENE) is None
    assert check(snap(job=job("RUNNING")), SCENE) is None


def test_demo_settings_refuse_an_unknown_fault() -> None:
    assert DemoSettings().fault == "dies"
    with pytest.raises(ValueError, match="fault must be one of"):
        DemoSettings(fault="explodes")
