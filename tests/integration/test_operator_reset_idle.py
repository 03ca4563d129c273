"""No GPU reset under running work: the operator on the sandbox's Kubernetes, the real Slurm
bridge process and a real Slurm whose node runs a batch job. The reset step waits, with its
reason, while the job is on the node, and asks for the reset (creates its Job) only once the
job has left it. No mocks."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpuheal.cli.simulate import simulate_xid
from gpuheal_dev.sandbox import Sandbox
from gpuheal_dev.sandbox.slurm import SlurmCluster
from tests.integration.operator_harness import (
    Objects,
    OperatorProcess,
    agent_reports_gpus,
    condition,
    dump,
    hold,
    policy,
    wait_for,
)

pytestmark = pytest.mark.integration


def _job_state(cluster: SlurmCluster, job: str) -> tuple[str, str]:
    out = cluster.run("squeue", "-h", "-j", job, "-o", "%T|%N", check=False).stdout.strip()
    state, _, nodes = out.partition("|")
    return state, nodes


def _reset_job(namespace: str) -> dict[str, Any]:
    """A reset hook Job (kwok runs its pod to completion)."""
    return {
        "type": "Job",
        "job": {
            "namespace": namespace,
            "template": {
                "backoffLimit": 0,
                "template": {"spec": {"containers": [
                    {"name": "reset", "image": "nvcr.io/nvidia/cuda:12.8.1-base-ubuntu24.04",
                     "command": ["nvidia-smi", "-r"]},
                ]}},
            },
        },
    }  # fmt: skip


def test_a_reset_waits_for_the_nodes_slurm_job_to_leave(  # noqa: PLR0917
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    namespace: str,
    make_slurm_cluster: Callable[..., SlurmCluster],
    bridge: Callable[..., tuple[str, Path, subprocess.Popen[bytes]]],
    tmp_path: Path,
) -> None:
    """XID 63 (row remap pending): the node is drained in Slurm with its job left running
    (`requeue: none`); the reset waits (Reset=False and Blocked=True, WaitingForSlurmJobs,
    naming the job) and no reset Job exists while the job runs; once the job is requeued
    off the node (it stays PENDING: its only node is drained) the reset Job runs."""
    core = sandbox.core_v1()
    (node,) = case(1)
    cid = case.case_id  # type: ignore[attr-defined]
    cluster = make_slurm_cluster([node], name="idle")
    url, token_file, _ = bridge(cluster)
    job = cluster.run(
        "sbatch", "--parsable", "--requeue", "-o", "/dev/null", "--wrap", "sleep 600"
    ).stdout.strip()
    wait_for(lambda: _job_state(cluster, job) == ("RUNNING", node), f"job {job} RUNNING")
    agent_reports_gpus(core, node, ago=3600)  # at its start: what proves the reset later
    rule = {
        "name": "row-remap-pending",
        "signals": {"xids": [63]},
        "ladder": [{"name": "reset-when-idle", "steps": [
            {"action": "cordon"},
            {"action": "slurmDrain", "slurmDrain": {"requeue": "none"}},
            {"action": "reset", "reset": {"hook": _reset_job(namespace), "timeout": "2m",
                                         "settle": "2s"}},
        ]}],
    }  # fmt: skip
    objects.apply("remediationpolicies", policy(f"p-{cid}", f"{cid}-work", [rule]))
    op = OperatorProcess(
        Path(sandbox.kubeconfig), tmp_path,
        # _reset_job is an inline template: run it, as a site with nodeJobs.inlineTemplates
        ["--bridge-url", url, "--bridge-token-file", str(token_file), "--inline-job-templates"],
    ).start()  # fmt: skip
    jobs = client.BatchV1Api(sandbox.api_client())

    def reset_jobs() -> list[str]:
        return [j.metadata.name for j in jobs.list_namespaced_job(namespace).items]

    try:
        simulate_xid(core, node, 63)
        nrem = wait_for(
            lambda: (o := objects.incident(node))
            and (c := condition(o, "Blocked")) and c["status"] == "True"
            and c["reason"] == "WaitingForSlurmJobs" and o,
            "the reset waits for the Slurm job",
        )  # fmt: skip
        assert condition(nrem, "SlurmDrained")["status"] == "True", dump(nrem["status"])
        reset = condition(nrem, "Reset")
        assert (reset["status"], reset["reason"]) == ("False", "WaitingForSlurmJobs"), reset
        assert job in reset["message"]
        assert "DRAIN" in cluster.run("scontrol", "show", "node", node, "-o").stdout
        # The job keeps running and nothing resets the GPU under it.
        hold(lambda: _job_state(cluster, job)[0] == "RUNNING" and not reset_jobs(),
             "no reset while the job runs", 4)  # fmt: skip

        cluster.run("scontrol", "requeue", job)
        wait_for(lambda: _job_state(cluster, job)[0] == "PENDING", f"job {job} requeued")
        wait_for(reset_jobs, "the reset Job once the job left", timeout=60)
        wait_for(
            lambda: (c := condition(objects.incident(node), "Reset"))
            and c["reason"] == "Verifying",
            "the reset Job done, its proof awaited", timeout=60,
        )  # fmt: skip
        # The agent, back after the reset, reports the same GPUs: the reset is proven.
        agent_reports_gpus(core, node)
        done = wait_for(
            lambda: (c := condition(o := objects.incident(node), "Reset"))
            and c["status"] == "True" and o,
            "reset verified", timeout=60,
        )  # fmt: skip
        assert reset_jobs() == [f"{done['metadata']['name']}-reset-0"], reset_jobs()
        assert _job_state(cluster, job)[0] == "PENDING", "the job never came back under it"
        steps = [e["step"] for e in done["status"]["timeline"]]
        assert steps.index("reset-when-idle/reset") > steps.index("reset-when-idle/slurmDrain")
    finally:
        op.stop()
        cluster.run("scancel", job, check=False)
