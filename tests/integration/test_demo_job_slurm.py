"""The demo training job on a real Slurm: fault on its node, requeue, resume elsewhere, finish.

Two ways to do the Slurm side: by hand with scontrol (the baseline an admin would type) and
through the real bridge (uvicorn on a free loopback port, CLI backend), as the operator will.
Either way the job must lose at most one checkpoint interval, restart exactly once, end with a
model bit-identical to an uninterrupted run with the same seed, and have learned something.
Timings are printed (``-s``), never asserted; ``bench/`` measures them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from gpuheal_dev.demo_job import ModelConfig, RunConfig, read_records, split_runs, steps_lost
from gpuheal_dev.demo_job.sbatch import job_argv, write_sbatch
from gpuheal_dev.demo_job.slurm import (
    JobInfo,
    job_info,
    last_checkpoint_step,
    scontrol_recover,
    serve_bridge,
    submit,
    wait_job,
    wait_records,
)
from gpuheal_dev.sandbox.slurm import SlurmCluster

pytestmark = pytest.mark.integration

NODES = ("gpu-node-0", "gpu-node-1", "gpu-node-2")
CFG = ModelConfig(seed=7)
STEPS, CKPT_EVERY, STEP_S = 150, 10, 0.04


def reference_model(tmp_path: Path) -> dict[str, np.ndarray]:
    """The same job run uninterrupted, outside Slurm, in a subprocess like the real one."""
    run = RunConfig(workdir=tmp_path / "reference", steps=STEPS, ckpt_every=CKPT_EVERY)
    env = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    subprocess.run(
        job_argv(CFG, run), check=True, env={**_base_env(), **env}, timeout=120, capture_output=True
    )
    return load_params(run.workdir / "model.npz")


def _base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}


def load_params(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k].copy() for k in z.files if k != "meta"}


def assert_checkpointed_on_usr1(recs: list[dict[str, object]]) -> None:
    """The job got SIGUSR1 and a checkpoint of that very step exists (written for the signal,
    or by the interval checkpoint just before it)."""
    [sig] = [r for r in recs if r["event"] == "signal" and r["signal"] == "SIGUSR1"]
    saved = {r["step"] for r in recs if r["event"] == "checkpoint"}
    assert sig["step"] in saved


def submit_demo_job(cluster: SlurmCluster, workdir: Path) -> tuple[int, JobInfo]:
    run = RunConfig(workdir=workdir, steps=STEPS, ckpt_every=CKPT_EVERY, step_seconds=STEP_S)
    script = write_sbatch(workdir / "job.sh", CFG, run, python=sys.executable)
    job_id = submit(cluster, script)
    info = wait_job(cluster, job_id, lambda j: j.state == "RUNNING", what="job RUNNING")
    # let it pass two interval checkpoints so that the resume has something to resume from
    wait_records(
        workdir / "metrics.jsonl",
        lambda recs: last_checkpoint_step(recs) >= 2 * CKPT_EVERY,
        what="two checkpoints",
        timeout=60,
    )
    return job_id, info


def check_resumed_run(
    cluster: SlurmCluster, job_id: int, workdir: Path, bad_node: str, tmp_path: Path
) -> None:
    done = wait_job(
        cluster,
        job_id,
        lambda j: j.state not in ("RUNNING", "PENDING", "COMPLETING", "CONFIGURING"),
        what="job to finish",
        timeout=120,
        poll=0.2,
    )
    out = "\n".join(p.read_text() for p in workdir.glob("slurm-*.out"))
    assert done.state == "COMPLETED", out
    assert done.restarts == 1

    runs = split_runs(read_records(workdir / "metrics.jsonl"))
    assert [r.restart for r in runs] == [0, 1], out
    assert runs[0].host == bad_node
    assert runs[1].host != bad_node
    assert runs[1].resume_step > 0  # resumed from a checkpoint, not from scratch
    [lost] = steps_lost(runs)
    assert lost <= CKPT_EVERY
    assert runs[1].end is not None
    assert runs[1].end["event"] == "done"
    assert "restart_count=1" in out
    assert f"resume_step={runs[1].resume_step}" in out

    first, last = runs[0].steps[0]["loss"], runs[1].end["loss"]
    assert last < first, (first, last)

    got = load_params(workdir / "model.npz")
    want = reference_model(tmp_path)
    assert sorted(got) == sorted(want)
    for name, arr in want.items():
        assert np.array_equal(got[name], arr), f"{name} differs from the uninterrupted run"
    print(
        f"\nresumed at step {runs[1].resume_step} on {runs[1].host} (lost {lost} steps), "
        f"loss {first:.3f} -> {last:.3f}; model bit-identical to the reference"
    )


@pytest.mark.parametrize("expedite", [True, False], ids=["expedite", "cred-expire"])
def test_drain_requeue_by_scontrol_resumes_bit_identical(
    make_slurm_cluster: Callable[..., SlurmCluster], tmp_path: Path, expedite: bool
) -> None:
    cluster = make_slurm_cluster(NODES, name="demojob")
    workdir = tmp_path / "job"
    job_id, info = submit_demo_job(cluster, workdir)
    times = scontrol_recover(
        cluster,
        job_id,
        reason="gpuheal: it-demo xid=79",
        expedite=expedite,
        checkpoint_signal="USR1",
        metrics=workdir / "metrics.jsonl",
    )
    assert times.node_before == info.batch_host
    assert times.node_after != info.batch_host
    node = cluster.run("scontrol", "show", "node", "-o", info.batch_host).stdout
    assert "Reason=gpuheal: it-demo xid=79" in node
    assert "DRAIN" in node
    recs = read_records(workdir / "metrics.jsonl")
    assert_checkpointed_on_usr1(recs)
    print(
        f"\nfault -> RUNNING again {times.running - times.fault:.2f}s "
        f"({'expedited' if expedite else 'cred_expire hold'})"
    )
    check_resumed_run(cluster, job_id, workdir, info.batch_host, tmp_path)


# ---- through the real bridge --------------------------------------------------------------

TOKEN = "demo-job-token-0123456789abcdef"


async def test_drain_requeue_through_bridge_resumes_bit_identical(
    make_slurm_cluster: Callable[..., SlurmCluster], tmp_path: Path
) -> None:
    from gpuheal_bridge.api.models import CheckpointSignal, RequeueOptions
    from gpuheal_bridge.client import BridgeClient

    cluster = make_slurm_cluster(NODES, name="demobr")
    workdir = tmp_path / "job"
    job_id, info = submit_demo_job(cluster, workdir)
    opts = RequeueOptions(
        checkpoint=CheckpointSignal(signal="USR1", grace_seconds=0.5),
        expedite=True,
        wait_running_seconds=60,
    )
    with serve_bridge(
        cluster.subprocess_env(), tmp_path / "bridge", TOKEN, bin_dir=cluster.bin_dir
    ) as url:
        t0 = time.time()
        async with BridgeClient(url, TOKEN, retries=1) as client:
            resp = await client.drain(info.batch_host, incident="nrem-demo", xid=79, requeue=opts)
        elapsed = time.time() - t0
    assert resp.outcome == "drained"
    assert resp.current.reason == "gpuheal: nrem-demo xid=79"
    [job] = resp.jobs
    assert job.job_id == job_id
    assert job.outcome == "requeued", job
    assert job.signalled
    assert job.expedited
    assert job.state_after == "RUNNING"
    assert job.restart_count == 1
    assert info.batch_host not in (job.nodes_after or [])
    assert job_info(cluster, job_id).restarts == 1
    recs = read_records(workdir / "metrics.jsonl")
    assert_checkpointed_on_usr1(recs)
    print(
        f"\nbridge drain+requeue call {elapsed:.2f}s (grace 0.5s), requeue -> RUNNING "
        f"{job.requeue_to_running_seconds}s"
    )
    check_resumed_run(cluster, job_id, workdir, info.batch_host, tmp_path)
