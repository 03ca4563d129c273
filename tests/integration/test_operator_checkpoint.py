"""Checkpoint now (issue 21, item 5): a rung whose checkpoint step asks the node's running
Slurm jobs to checkpoint through the bridge's signal alone. The operator on the sandbox's
Kubernetes, the real bridge process (CLI backend) and a real Slurm 22.05 cluster: the job
writes its checkpoint and keeps running on its node, not requeued; the node is neither
drained in Slurm nor cordoned. No mocks."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuheal.cli.simulate import simulate_xid
from gpuheal_dev.sandbox.slurm import SlurmCluster
from tests.integration.operator_harness import (
    Xid79Scene,
    completed,
    condition,
    dump,
    hold,
    wait_for,
)

pytestmark = pytest.mark.integration

# A job that checkpoints when it gets USR1 (its step to `$1.saved`) and goes on running.
CHECKPOINT_ON_USR1 = """\
#!/bin/bash
#SBATCH --requeue
ck=${1:?checkpoint file}
step=0
trap 'echo "$step" > "$ck.tmp" && mv "$ck.tmp" "$ck.saved"; echo "CHECKPOINT step=$step"' USR1
echo "START host=$SLURMD_NODENAME restart_count=${SLURM_RESTART_COUNT:-0}"
while true; do
  step=$((step+1))
  sleep 0.2 &
  wait $!
done
"""

# XID 13 (a graphics engine exception) the first time is an application's fault: it only
# warns (the catalogue's first-sight guard keeps every disruptive step back), and the jobs
# may as well save their work.
WARNS = {
    "name": "warns",
    "signals": {"xids": [13]},
    "ladder": [
        {
            "name": "checkpoint-now",
            "steps": [{"action": "checkpoint", "checkpoint": {"signal": "USR1"}}],
        }
    ],
}


def _job(cluster: SlurmCluster, job: str) -> str:
    return cluster.run("scontrol", "show", "job", job, "-o").stdout


def test_a_checkpoint_rung_makes_the_job_checkpoint_without_leaving_its_node(
    xid79_scene: Callable[..., Xid79Scene], tmp_path: Path
) -> None:
    scene = xid79_scene(work=1, spares=0, slurm=True, rules=[WARNS])
    node, objects, cluster = scene.broken, scene.objects, scene.cluster
    assert cluster is not None
    script = tmp_path / "ckpt_on_usr1.sh"
    script.write_text(CHECKPOINT_ON_USR1)
    script.chmod(0o755)
    ckpt, out = tmp_path / "ckpt", tmp_path / "ckpt.out"
    job = cluster.run("sbatch", "--parsable", "-o", str(out), str(script), str(ckpt)).stdout
    job = job.strip()
    wait_for(lambda: "JobState=RUNNING" in _job(cluster, job), f"job {job} RUNNING")
    wait_for(lambda: out.exists() and "START" in out.read_text(), "the job's START line")

    op = scene.start()
    try:
        simulate_xid(scene.core, node, 13)
        done: dict[str, Any] = scene.completed()
        name = done["metadata"]["name"]
        assert completed(done) == "AlertOnly", dump(done["status"])
        ended = condition(done, "Completed") or {}
        assert "jobs asked to checkpoint; nothing to undo" in ended.get("message", "")
        checkpointed = condition(done, "Checkpointed")
        assert checkpointed is not None, dump(done["status"])
        assert (checkpointed["status"], checkpointed["reason"]) == ("True", "CheckpointRequested")
        assert [j["jobId"] for j in done["status"]["checkpointedJobs"]] == [job]
        assert done["status"]["checkpointedJobs"][0]["signal"] == "USR1"
        assert "checkpoint-now/checkpoint" in [e["step"] for e in done["status"]["timeline"]]

        # The job wrote its checkpoint and is still RUNNING on its node, never requeued.
        saved = wait_for(lambda: Path(f"{ckpt}.saved").exists(), "the job's checkpoint")
        assert saved
        assert out.read_text().count("CHECKPOINT step=") == 1
        shown = _job(cluster, job)
        assert "JobState=RUNNING" in shown, shown
        assert re.search(rf"\bNodeList={node}\b", shown), shown
        assert "Restarts=0" in shown, shown
        assert out.read_text().count("START") == 1
        # Neither drained in Slurm nor cordoned: the node keeps its work.
        slurm_node = cluster.run("scontrol", "show", "node", node, "-o").stdout
        assert "DRAIN" not in slurm_node, slurm_node
        spec = objects.node(node).spec
        assert spec is None or not spec.unschedulable
        assert condition(done, "SlurmDrained") is None
        assert condition(done, "Cordoned") is None

        # The node's fault history has the step.
        history = wait_for(
            lambda: [
                e
                for e in (objects.get("faulthistories", node) or {})
                .get("status", {})
                .get("entries", [])
                if e.get("action") == "checkpoint" and e.get("incident") == name
            ],
            "the checkpoint in the FaultHistory",
        )
        assert job in history[0]["message"]

        # A restarted operator signals nobody again: one checkpoint per job per incident. The
        # dead process's Lease deleted rather than waited out: `start` returns once it leads.
        op.kill()
        op.delete_dead_lease()
        op.start()
        hold(lambda: out.read_text().count("CHECKPOINT step=") == 1, "one checkpoint", 3)
        assert "JobState=RUNNING" in _job(cluster, job)
        assert completed(scene.incident())
    finally:
        op.stop()
        cluster.run("scancel", job, check=False)
