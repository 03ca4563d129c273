"""Drain + requeue latency through the Slurm bridge against the sandbox's real Slurm
(ported from ``slurm-bridge/bench/bench_bridge.py``, written with the bridge).

For each backend (``cli``; ``rest`` = slurmrestd reads + scontrol writes) a 3-node sandbox
Slurm cluster and the bridge (uvicorn on loopback, in this process); per run: submit a batch
job, wait until it runs, ``POST /v1/nodes/{node}/drain`` with ``requeue`` (no checkpoint
signal), then resume the node and cancel the job. Modes:

- ``call``: the drain + requeue call alone (returns once the job is PENDING and excluded);
- ``plain``, ``expedite``, ``expedite_no_exclude``: the bridge also waits until the job runs
  again elsewhere and reports requeue -> RUNNING (``requeue_to_running_seconds``).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.harness import Context, Result, benchmark

TOKEN = "bench-token-0123456789abcdef"
NODES = ("bench-0", "bench-1", "bench-2")
MODES: dict[str, dict[str, Any]] = {
    "call": {},
    "plain": {"wait_running_seconds": 60},
    "expedite": {"expedite": True, "wait_running_seconds": 60},
    "expedite_no_exclude": {"expedite": True, "exclude_node": False, "wait_running_seconds": 60},
}
BACKENDS = ("cli", "rest")


@contextmanager
def serve(backend: Any, state: Path) -> Iterator[str]:
    import uvicorn

    from gpuheal_bridge.server.app import BridgeSettings, create_app

    app = create_app(BridgeSettings(backend=backend, tokens={"bench": TOKEN}, state_dir=state))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("bridge did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


async def run_backend(ctx: Context, kind: str, n: int) -> list[dict[str, Any]]:
    from gpuheal_bridge.api.models import RequeueOptions
    from gpuheal_bridge.backends.base import Backend
    from gpuheal_bridge.backends.cli import CliBackend
    from gpuheal_bridge.backends.rest import RestBackend
    from gpuheal_bridge.client import BridgeClient
    from gpuheal_dev.sandbox.slurm import SlurmCluster

    cluster = SlurmCluster(ctx.tmpdir(f"br{kind}"), NODES, restd=kind == "rest").start()
    rows: list[dict[str, Any]] = []
    try:
        cli = CliBackend(env=cluster.subprocess_env())
        backend: Backend = (
            cli if kind == "cli" else RestBackend(str(cluster.restd_url), fallback=cli)
        )
        with serve(backend, ctx.tmpdir(f"state-{kind}")) as url:
            async with BridgeClient(url, TOKEN) as client:
                for mode, kw in MODES.items():
                    for i in range(n):
                        jid = cluster.run("sbatch", "--parsable", "--requeue", "-o", "/dev/null",
                                          "--wrap", "sleep 600").stdout.strip()  # fmt: skip
                        deadline = time.monotonic() + 60
                        node = ""
                        while time.monotonic() < deadline:
                            out = cluster.run("squeue", "-h", "-j", jid, "-o", "%T %N").stdout
                            if out.startswith("RUNNING"):
                                node = out.split()[1]
                                break
                            await asyncio.sleep(0.05)
                        if not node:
                            raise RuntimeError(f"job {jid} did not start")
                        t0 = time.perf_counter()
                        resp = await client.drain(
                            node,
                            incident=f"bench-{kind}-{mode.replace('_', '-')}-{i}",
                            xid=79,
                            requeue=RequeueOptions(**kw),
                        )
                        call = time.perf_counter() - t0
                        job = resp.jobs[0]
                        rows.append(
                            {
                                "backend": kind,
                                "mode": mode,
                                "run": i,
                                "drain_requeue_seconds": round(call, 4),
                                "requeue_to_running_seconds": job.requeue_to_running_seconds,
                                "outcome": job.outcome.value,
                            }
                        )
                        ctx.sample(f"{kind} {mode}", i, n, call,
                                   f"(to RUNNING {job.requeue_to_running_seconds})")  # fmt: skip
                        await client.resume(node)
                        cluster.run("scancel", jid)
        await backend.aclose()
    finally:
        cluster.stop()
    return rows


@benchmark(
    "bridge_drain_requeue",
    title="Slurm bridge: drain + requeue call, and requeue -> RUNNING (3-node sandbox Slurm)",
    budget_s=100,
    needs=("slurm",),
)
def bridge_drain_requeue(ctx: Context) -> Result:
    """POST /v1/nodes/{node}/drain with requeue through the bridge's HTTP API (uvicorn in
    this process) against the sandbox's real Slurm, per backend (cli, rest) and mode (call
    alone; plain / expedite / expedite without node exclusion, waiting until RUNNING again).
    Main series: the HTTP call; extra: requeue -> RUNNING as the bridge reports it."""
    n = ctx.runs(4)
    rows: list[dict[str, Any]] = []
    for kind in BACKENDS:
        ctx.progress(f"backend {kind}: 3-node Slurm sandbox + bridge")
        rows += asyncio.run(run_backend(ctx, kind, n))
    series: dict[str, list[float]] = {}
    to_running: dict[str, list[float]] = {}
    for r in rows:
        key = f"{r['backend']} {r['mode']}"
        series.setdefault(key, []).append(float(r["drain_requeue_seconds"]))
        if r["requeue_to_running_seconds"] is not None:
            to_running.setdefault(key, []).append(float(r["requeue_to_running_seconds"]))
    return Result(
        series=series,
        unit="s",
        params={
            "runs_per_mode": n,
            "backends": list(BACKENDS),
            "modes": MODES,
            "slurm": "Debian 22.05 sandbox, cred_expire=5, sched_interval=2, bf_interval=1",
            "ported_from": "slurm-bridge/bench/bench_bridge.py (results-sandbox.json: cli call "
            "p50 0.256 s, expedite p50 0.883 s; n=8)",
        },
        extra_series={"requeue_to_running": to_running},
        runs=rows,
        notes=[
            "`call`: the drain + requeue call returns once the job is PENDING and excluded from "
            "the node; the other modes wait in the bridge until the job RUNS again.",
            "rest backend: slurmrestd 22.05 reads, scontrol writes (it cannot drain/requeue).",
        ],
    )
