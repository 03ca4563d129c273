"""Fault -> job training again from its checkpoint, on the Slurm sandbox, without the operator.

What is timed, per run: a fresh demo job (``gpuheal_dev.demo_job``: checkpoints every 10 steps,
a step every 50 ms) runs on the sandbox's real Slurm; once it has checkpointed, a "fault" on its
node is handled the way gpuheal's Slurm side does it: drain the node with our reason, requeue the
job (Slurm sends SIGTERM; the job checkpoints at once and exits), optionally expedite
(``StartTime=now`` once the job is PENDING on BeginTime). Timestamps, all ``time.time()`` on this
machine, from the moment the drain is issued:

- **RUNNING**: ``scontrol show job`` reports it RUNNING again (polled every 50 ms);
- **resumed**: the job's process loaded its checkpoint (its ``start`` metrics record);
- **training again**: its first step after the resume (first ``step`` record of the new run).

Variants: by hand with ``scontrol`` (the baseline) and through the Slurm bridge's HTTP API (the
bridge app served by uvicorn in this process, CLI backend, as the operator will call it), each
with and without expedite.

Two more variants have the operator in the loop and a job that did not leave gently
(``bench.faults.operator_runs``): its process died with its GPU (the job is FAILED before the
XID Event is posted) or hangs in the driver (deaf to the checkpoint signal and SIGTERM); timed
from the XID Event's POST, with the sandbox's Slurm settings (KillWait=2: slurmd's SIGKILL
comes max(KillWait, 5 s) after the requeue) and the policy's 2 s checkpoint grace.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from bench.harness import Context, Result, benchmark
from bench.plots import recovery_plot
from gpuheal_dev.demo_job import ModelConfig, RunConfig, write_sbatch
from gpuheal_dev.demo_job.metrics import split_runs, steps_lost
from gpuheal_dev.demo_job.slurm import (
    job_info,
    last_checkpoint_step,
    resume_node,
    scontrol_recover,
    serve_bridge,
    submit,
    wait_job,
    wait_records,
    wait_until,
)
from gpuheal_dev.sandbox.slurm import SlurmCluster

NODES = ("gpu-node-0", "gpu-node-1", "gpu-node-2")
TOKEN = "bench-token-0123456789abcdef0123"
CKPT_EVERY, STEP_SECONDS = 10, 0.05
VARIANTS: tuple[tuple[str, bool], ...] = (
    ("scontrol", False),
    ("scontrol", True),
    ("bridge", False),
    ("bridge", True),
)


def variant_name(via: str, expedite: bool) -> str:
    return f"{via}, {'expedite' if expedite else 'no expedite'}"


def _start_job(cluster: SlurmCluster, workdir: Path) -> tuple[int, str]:
    run = RunConfig(
        workdir=workdir, steps=1_000_000, ckpt_every=CKPT_EVERY, step_seconds=STEP_SECONDS
    )
    jid = submit(cluster, write_sbatch(workdir / "job.sh", ModelConfig(), run))
    info = wait_job(cluster, jid, lambda j: j.state == "RUNNING", what="job RUNNING", timeout=60)
    wait_records(
        workdir / "metrics.jsonl",
        lambda recs: last_checkpoint_step(recs) >= CKPT_EVERY,
        what="first checkpoint",
        timeout=60,
    )
    return jid, info.batch_host


def _bridge_drain(url: str, node: str, incident: str, expedite: bool) -> dict[str, Any]:
    from gpuheal_bridge.api.models import RequeueOptions
    from gpuheal_bridge.client import BridgeClient

    async def call() -> dict[str, Any]:
        async with BridgeClient(url, TOKEN, retries=1) as client:
            resp = await client.drain(
                node, incident=incident, xid=79, requeue=RequeueOptions(expedite=expedite)
            )
        [job] = resp.jobs
        if job.outcome != "requeued":
            raise RuntimeError(f"bridge did not requeue: {job}")
        return {"expedited": job.expedited, "requeue_seconds": job.requeue_seconds}

    return asyncio.run(call())


def _cleanup(cluster: SlurmCluster, jid: int, drained: str) -> None:
    cluster.run("scancel", str(jid), check=False)
    wait_job(
        cluster,
        jid,
        lambda j: j.state in ("CANCELLED", "COMPLETED", "FAILED"),
        what="job cancelled",
        timeout=60,
        poll=0.1,
    )
    resume_node(cluster, drained)
    wait_until(
        cluster.node_states,
        lambda states: all(s == "idle" for s in states.values()),
        what="all nodes idle",
        timeout=60,
        poll=0.1,
    )


def one_run(
    cluster: SlurmCluster, *, url: str | None, via: str, expedite: bool, workdir: Path, i: int
) -> dict[str, Any]:
    """Start a job, let it checkpoint, fault its node, time the recovery, clean up."""
    jid, node = _start_job(cluster, workdir)
    metrics = workdir / "metrics.jsonl"
    incident = f"bench-{via}-{int(expedite)}-{i}"
    detail: dict[str, Any] = {}
    fault = time.time()
    if via == "scontrol":
        times = scontrol_recover(
            cluster, jid, reason=f"gpuheal: {incident} xid=79", expedite=expedite
        )
        running = times.running
        detail = {
            "to_requeued": round(times.requeued - fault, 3),
            "to_pending_begintime": None
            if times.pending_begintime is None
            else round(times.pending_begintime - fault, 3),
        }
    else:
        assert url is not None
        detail = _bridge_drain(url, node, incident, expedite)
        detail["call_seconds"] = round(time.time() - fault, 3)
        wait_job(
            cluster,
            jid,
            lambda j: j.state == "RUNNING" and j.restarts > 0,
            what="job RUNNING again",
            timeout=180,
        )
        running = time.time()
    recs = wait_records(
        metrics,
        lambda rs: any(r["event"] == "step" and r.get("restart", 0) > 0 for r in rs),
        what="first step after the resume",
        timeout=60,
        poll=0.02,
    )
    runs = split_runs(recs)
    after = runs[-1]
    after_node = job_info(cluster, jid).batch_host
    _cleanup(cluster, jid, node)
    return {
        "variant": variant_name(via, expedite),
        "run": i,
        "node_before": node,
        "node_after": after_node,
        "to_running": round(running - fault, 3),
        "to_resumed": round(float(after.start["time"]) - fault, 3),
        "to_training": round(float(after.steps[0]["time"]) - fault, 3),
        "resume_step": after.resume_step,
        "steps_lost": steps_lost(runs)[0],
        **detail,
    }


@benchmark(
    "fault_to_running",
    title="Fault -> job training again from its checkpoint (Slurm sandbox, no provisioning)",
    budget_s=600,
    plot=recovery_plot,
    needs=("slurm",),
)
def fault_to_running(ctx: Context) -> Result:
    """Drain + requeue (+ expedite) by scontrol and through the bridge; from the drain to the
    job RUNNING again, to its checkpoint loaded, and to its first training step after that.
    Sandbox Slurm 22.05 with munge cred_expire=5 s (the minimum; Slurm's default is 120 s,
    see requeue_default_hold), sched_interval=2, bf_interval=1."""
    n = ctx.runs(10)
    rows: list[dict[str, Any]] = []
    root = ctx.tmpdir("slurm")
    with SlurmCluster(root, NODES, cred_expire=5) as cluster:
        ctx.progress(f"Slurm sandbox up ({len(NODES)} nodes, cred_expire=5)")
        with serve_bridge(cluster.subprocess_env(), ctx.tmpdir("bridge"), TOKEN) as url:
            ctx.progress(f"bridge serving on {url}")
            for via, expedite in VARIANTS:
                name = variant_name(via, expedite)
                for i in range(n):
                    row = one_run(
                        cluster, url=url, via=via, expedite=expedite, workdir=ctx.tmpdir("job"), i=i
                    )
                    rows.append(row)
                    ctx.sample(
                        name,
                        i,
                        n,
                        row["to_training"],
                        f"(RUNNING {row['to_running']:.2f} s, "
                        f"{row['node_before']} -> {row['node_after']}, "
                        f"{row['steps_lost']} steps lost)",
                    )
    from bench.faults import CKPT_EVERY as OP_CKPT_EVERY
    from bench.faults import RELEASES, operator_runs, operator_variants, release_variant
    from bench.faults import STEP_SECONDS as OP_STEP_S
    from bench.opkit import loadavg

    op_rows: list[dict[str, Any]] = []
    op_names: list[str] = []
    loads: dict[str, list[float]] = {}
    for release in RELEASES:
        ctx.progress(f"with the operator on Slurm {release}: died / hung / 2-node, from the XID")
        loads[f"before Slurm {release}"] = loadavg()
        op_rows += operator_runs(ctx, n, release)
        op_names += [release_variant(release, v) for v in operator_variants(release)]
    loads["after"] = loadavg()
    names = [variant_name(v, e) for v, e in VARIANTS]
    lost = [r["steps_lost"] for r in rows]
    rows += op_rows
    names += op_names

    def series(key: str) -> dict[str, list[float]]:
        return {nm: [float(r[key]) for r in rows if r["variant"] == nm] for nm in names}

    op_lost = [r["steps_lost"] for r in op_rows if r["steps_lost"] is not None]
    return Result(
        series=series("to_training"),
        unit="s",
        params={
            "runs_per_variant": n,
            "nodes": list(NODES),
            "cred_expire": 5,
            "ckpt_every_steps": CKPT_EVERY,
            "step_seconds": STEP_SECONDS,
            "poll_seconds": 0.05,
            "metric": "drain issued -> first training step after the resume (operator "
            "variants: XID Event POST -> first training step after the resume)",
            "operator_policy": "cordon, slurmDrain (requeue, nodeDown: the default policy's "
            "XID 79 step)",
            "operator_releases": list(RELEASES),
            "load_average_1_5_15": loads,
        },
        extra_series={
            "to_running": series("to_running"),
            "to_resumed": series("to_resumed"),
            "to_slurm_step_done": {
                nm: [float(r["to_slurm_step_done"]) for r in op_rows if r["variant"] == nm]
                for nm in op_names
            },
        },
        runs=rows,
        notes=[
            f"steps lost per run: max {max(lost)} (the job checkpoints on Slurm's SIGTERM)",
            f"operator variants: steps lost max {max(op_lost, default=0)} (no checkpoint on the "
            f"way out: at most one interval, {OP_CKPT_EVERY} steps of {OP_STEP_S} s there)",
            "operator variants: no checkpoint grace and no SIGKILL wait (nodeDown: the node "
            "DOWN at once); the 2-node job (26.05 only) runs again on its healthy node and "
            "another at once (expedited requeue), from its last periodic checkpoint.",
            _load_note(loads),
            "RUNNING is polled every 50 ms (scontrol show job), so it carries up to 50 ms of "
            "polling delay; resumed/training come from the job's own timestamps.",
            "resumed - RUNNING is process start: Python + NumPy import + checkpoint load.",
        ],
    )


@benchmark(
    "requeue_default_hold",
    title="Slurm's default requeue hold (cred_expire=120 s) vs expedite",
    budget_s=300,
    plot=recovery_plot,
    needs=("slurm",),
)
def requeue_default_hold(ctx: Context) -> Result:
    """The same drain + requeue by scontrol on a Slurm whose munge cred_expire is the default
    120 s: without expedite the requeued job waits for it; with StartTime=now it does not."""
    n = min(ctx.runs(2), 3)  # each run without expedite costs ~2 min
    rows: list[dict[str, Any]] = []
    with SlurmCluster(ctx.tmpdir("slurm"), NODES, cred_expire=120) as cluster:
        ctx.progress(f"Slurm sandbox up ({len(NODES)} nodes, cred_expire=120)")
        for expedite in (True, False):
            name = variant_name("scontrol", expedite)
            for i in range(n):
                if not expedite:
                    ctx.progress(f"{name}: run {i + 1}/{n}: waiting ~2 min for the hold")
                row = one_run(
                    cluster,
                    url=None,
                    via="scontrol",
                    expedite=expedite,
                    workdir=ctx.tmpdir("job"),
                    i=i,
                )
                rows.append(row)
                ctx.sample(name, i, n, row["to_training"], f"(RUNNING {row['to_running']:.2f} s)")
    names = [variant_name("scontrol", e) for e in (False, True)]

    def series(key: str) -> dict[str, list[float]]:
        return {nm: [float(r[key]) for r in rows if r["variant"] == nm] for nm in names}

    return Result(
        series=series("to_training"),
        unit="s",
        params={"runs_per_variant": n, "cred_expire": 120, "nodes": list(NODES)},
        extra_series={"to_running": series("to_running"), "to_resumed": series("to_resumed")},
        runs=rows,
        notes=["Few runs: each one without expedite costs ~2 minutes by design."],
    )


def _load_note(loads: dict[str, list[float]]) -> str:
    """What the load averages recorded around the runs say of the figures: quiet where no
    1-minute average passed the machine's CPUs, else a figure to re-run."""
    busiest = max((v[0] for v in loads.values() if v), default=0.0)
    if busiest <= (os.cpu_count() or 1):
        return f"quiet: 1-minute load average at most {busiest:g} (load averages {loads})."
    return (
        f"the machine was loaded (1-minute load average up to {busiest:g}; load averages "
        f"{loads}): a quiet re-run gives the figures to quote."
    )
