"""The bridge with slurmrestd alone on Slurm 26.05: no scontrol, squeue or sbatch in its PATH,
no CLI fallback (what the chart's in-cluster bridge is). Over slurmrestd v0.0.45 (checkpoint
signal, requeue, ExcNodeList, StartTime) it drains a node and moves the job that runs there,
or requeues the job that died there with its GPU, and the job resumes from its checkpoint on
another node (real bridge process, real 26.05 sandbox with JWT)."""

from __future__ import annotations

import json
import re
import shutil
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuheal_dev.sandbox.slurm import SlurmCluster
from tests.integration.bridge_harness import BridgeProcess
from tests.integration.test_bridge_slurm import JOB, kill_job

pytestmark = pytest.mark.integration

TOKEN = "rest-only-token-0123456789abcdef"
NODES = ("gpu-node-0", "gpu-node-1")


def post(bridge: BridgeProcess, path: str, body: dict[str, object]) -> dict[str, object]:
    request = urllib.request.Request(
        f"{bridge.url}{path}",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=60) as resp:
        answer: dict[str, object] = json.loads(resp.read())
    return answer


def wait_for(pred: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def job_field(cluster: SlurmCluster, job_id: int, fmt: str) -> str:
    return cluster.run("squeue", "-h", "-t", "all", "-j", str(job_id), "-o", fmt).stdout.strip()


def rest_only_bridge(
    make_slurm_cluster: Callable[..., SlurmCluster],
    run_bridge: Callable[..., BridgeProcess],
    tmp_path: Path,
) -> tuple[SlurmCluster, BridgeProcess]:
    cluster = make_slurm_cluster(NODES, name="restonly", restd=True, slurm="26.05")
    assert cluster.restd_url is not None
    assert cluster.restd_token_file is not None
    no_slurm = tmp_path / "no-slurm-bin"  # the bridge's whole PATH: Slurm's clients are not there
    no_slurm.mkdir()
    assert shutil.which("scontrol", path=str(no_slurm)) is None
    bridge = run_bridge(
        cluster,
        "--backend", "rest", "--rest-url", cluster.restd_url,
        "--rest-token-file", str(cluster.restd_token_file),
        token=TOKEN, path=str(no_slurm),
    )  # fmt: skip
    return cluster, bridge


def start_job(cluster: SlurmCluster, tmp_path: Path) -> tuple[int, str, Path]:
    """test_bridge_slurm's checkpointing job (a checkpoint every 10 steps and on USR1), running
    and checkpointed once: (job id, its node, its output file)."""
    script, ckpt, out = tmp_path / "ckpt.sh", tmp_path / "job.state", tmp_path / "job.out"
    script.write_text(JOB)
    script.chmod(0o755)
    submitted = cluster.run("sbatch", "--parsable", "-o", str(out), str(script), str(ckpt), "0.2")
    jid = int(submitted.stdout.strip().split(";")[0])
    wait_for(lambda: job_field(cluster, jid, "%T") == "RUNNING", f"job {jid} running")
    wait_for(lambda: ckpt.exists() and int(ckpt.read_text()) >= 10, "its first checkpoint")
    return jid, job_field(cluster, jid, "%N"), out


def test_a_rest_only_bridge_on_26_05_drains_and_moves_the_job_off_the_node(
    make_slurm_cluster: Callable[..., SlurmCluster],
    run_bridge: Callable[..., BridgeProcess],
    tmp_path: Path,
) -> None:
    cluster, bridge = rest_only_bridge(make_slurm_cluster, run_bridge, tmp_path)
    jid, node, out = start_job(cluster, tmp_path)

    requeue = {
        "checkpoint": {"signal": "USR1", "grace_seconds": 1.5},
        "expedite": True,
        "wait_running_seconds": 30,
    }
    body = {"incident": "nrem-rest1", "xid": 79, "requeue": requeue}
    answer = post(bridge, f"/v1/nodes/{node}/drain", body)
    assert answer["outcome"] == "drained", answer
    [job] = answer["jobs"]  # type: ignore[misc]
    assert job["job_id"] == jid
    assert job["outcome"] == "requeued", job
    assert job["signalled"] is True, job
    assert job["excluded_nodes"] == [node], job
    assert job["expedited"] is True, job
    assert job["state_after"] == "RUNNING", job
    assert node not in job["nodes_after"], job
    assert job["restart_count"] == 1, job

    shown = cluster.run("scontrol", "show", "node", "-o", node).stdout
    assert "DRAIN" in shown, shown
    assert "Reason=gpuheal: nrem-rest1 xid=79" in shown, shown
    assert re.search(
        rf"\bExcNodeList={node}\b", cluster.run("scontrol", "show", "job", str(jid)).stdout
    )
    wait_for(lambda: out.read_text().count("START") == 2, "the job's second start")
    text = out.read_text()
    usr1 = [int(x) for x in re.findall(rf"USR1 checkpoint step=(\d+) host={node}", text)]
    starts = re.findall(r"START host=(\S+) restart=(\d+) resume_step=(\d+)", text)
    assert usr1, text  # the checkpoint signal came over slurmrestd before the requeue
    assert starts[0][0] == node
    assert starts[1][0] != node
    assert starts[1][1] == "1"
    assert int(starts[1][2]) >= usr1[0]  # resumed from the signal's checkpoint
    cluster.run("scancel", str(jid))


def test_a_rest_only_bridge_on_26_05_requeues_a_job_that_died_with_its_gpu(
    make_slurm_cluster: Callable[..., SlurmCluster],
    run_bridge: Callable[..., BridgeProcess],
    tmp_path: Path,
) -> None:
    """The job killed on the node (as by a lost GPU) is FAILED: the bridge lists it among the
    node's ended jobs and requeues it when asked (requeue_ended), excluded from the drained
    node; it resumes from its last checkpoint on the other node."""
    cluster, bridge = rest_only_bridge(make_slurm_cluster, run_bridge, tmp_path)
    jid, node, out = start_job(cluster, tmp_path)
    since = time.time() - 5
    kill_job(cluster, jid)
    wait_for(lambda: job_field(cluster, jid, "%T") == "FAILED", "job FAILED")

    assert (
        post(bridge, f"/v1/nodes/{node}/drain", {"incident": "nrem-rest2", "xid": 79})["outcome"]
        == "drained"
    )
    request = urllib.request.Request(
        f"{bridge.url}/v1/nodes/{node}/jobs?ended_since={since}",
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        listed = json.loads(resp.read())
    assert [(j["job_id"], j["ended"]) for j in listed["jobs"]] == [(jid, "failed")], listed
    body = {
        "from_node": node,
        "requeue_ended": True,
        "expedite": True,
        "wait_running_seconds": 30,
    }
    answer = post(bridge, f"/v1/jobs/{jid}/requeue", body)
    assert answer["outcome"] == "requeued", answer
    assert answer["ended_before"] == "failed", answer
    assert answer["excluded_nodes"] == [node], answer
    assert answer["state_after"] == "RUNNING", answer
    assert node not in answer["nodes_after"], answer

    wait_for(lambda: out.read_text().count("START") == 2, "the job's second start")
    starts = re.findall(r"START host=(\S+) restart=(\d+) resume_step=(\d+)", out.read_text())
    assert starts[1][0] != node
    assert starts[1][1] == "1"
    assert int(starts[1][2]) >= 10  # from its last checkpoint, not from step 0
    cluster.run("scancel", str(jid))
