"""Benchmark: drain + requeue latency through the bridge against the sandbox's real Slurm.

    .venv/bin/python slurm-bridge/bench/bench_bridge.py [-n 10] [--out bench/out/bridge.json]

For each backend (``cli``; ``rest`` = slurmrestd reads + scontrol writes) it starts a 3-node
sandbox cluster and the bridge (uvicorn on loopback), then repeats: submit a batch job, wait
until it runs, ``POST /v1/nodes/{node}/drain`` with ``requeue`` (no checkpoint signal), once
without and once with ``expedite``, measuring

- ``drain_requeue_seconds``: the HTTP call (drain + requeue + wait until PENDING + exclusion),
- ``requeue_to_running_seconds``: requeue until the job runs again elsewhere (reported by the
  bridge, which waited for it),

then resumes the node. Modes: ``call`` (the call alone, not waiting for RUNNING), ``plain``,
``expedite``, ``expedite_no_exclude``. Prints and writes JSON with p50/p99 per backend and mode.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn

from gpuheal.sandbox.slurm import SlurmCluster
from gpuheal_bridge.api.models import RequeueOptions
from gpuheal_bridge.backends.base import Backend
from gpuheal_bridge.backends.cli import CliBackend
from gpuheal_bridge.backends.rest import RestBackend
from gpuheal_bridge.client import BridgeClient
from gpuheal_bridge.server.app import BridgeSettings, create_app

TOKEN = "bench-token-0123456789abcdef"  # noqa: S105 - a throwaway loopback token
NODES = ("bench-0", "bench-1", "bench-2")
#: "call": the drain+requeue call alone (returns once the job is PENDING and excluded);
#: the others wait until the job runs again and report requeue -> RUNNING.
MODES: dict[str, dict[str, Any]] = {
    "call": {},
    "plain": {"wait_running_seconds": 60},
    "expedite": {"expedite": True, "wait_running_seconds": 60},
    "expedite_no_exclude": {"expedite": True, "exclude_node": False, "wait_running_seconds": 60},
}


@contextmanager
def serve(backend: Backend, state: Path) -> Iterator[str]:
    app = create_app(BridgeSettings(backend=backend, tokens={"bench": TOKEN}, state_dir=state))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))], 3)


async def run_backend(kind: str, n: int, tmp: Path) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix=f"gh-bench-{kind}-"))
    cluster = SlurmCluster(root, NODES, restd=kind == "rest").start()
    try:
        cli = CliBackend(env=cluster.subprocess_env())
        backend: Backend = (
            cli if kind == "cli" else RestBackend(str(cluster.restd_url), fallback=cli)
        )
        results: dict[str, dict[str, list[float]]] = {}
        with serve(backend, tmp / kind) as url:
            async with BridgeClient(url, TOKEN) as client:
                for mode, kw in MODES.items():
                    calls: list[float] = []
                    to_running: list[float] = []
                    for i in range(n):
                        jid = cluster.run(
                            "sbatch",
                            "--parsable",
                            "--requeue",
                            "-o",
                            "/dev/null",
                            "--wrap",
                            "sleep 600",
                        ).stdout.strip()
                        while True:
                            out = cluster.run("squeue", "-h", "-j", jid, "-o", "%T %N").stdout
                            if out.startswith("RUNNING"):
                                node = out.split()[1]
                                break
                            await asyncio.sleep(0.05)
                        opts = RequeueOptions(**kw)
                        t0 = time.perf_counter()
                        resp = await client.drain(
                            node,
                            incident=f"bench-{mode.replace('_', '-')}-{i}",
                            xid=79,
                            requeue=opts,
                        )
                        calls.append(time.perf_counter() - t0)
                        job = resp.jobs[0]
                        if job.requeue_to_running_seconds is not None:
                            to_running.append(job.requeue_to_running_seconds)
                        await client.resume(node)
                        cluster.run("scancel", jid)
                    results[mode] = {"drain_requeue_seconds": calls, "to_running": to_running}
        await backend.aclose()
    finally:
        cluster.stop()
    summary: dict[str, Any] = {}
    for mode, r in results.items():
        summary[mode] = {
            "n": len(r["drain_requeue_seconds"]),
            "drain_requeue_seconds_p50": pct(r["drain_requeue_seconds"], 0.5),
            "drain_requeue_seconds_p99": pct(r["drain_requeue_seconds"], 0.99),
            "requeue_to_running_seconds_p50": pct(r["to_running"], 0.5),
            "requeue_to_running_seconds_p99": pct(r["to_running"], 0.99),
            "requeue_to_running_seconds_mean": round(statistics.fmean(r["to_running"]), 3)
            if r["to_running"]
            else None,
        }
    return summary


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("-n", type=int, default=10)
    p.add_argument("--backends", default="cli,rest")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = {
            "slurm": "Debian 22.05.8 sandbox, cred_expire=5, sched_interval=2, bf_interval=1",
            "backends": {
                kind: await run_backend(kind, args.n, Path(tmp))
                for kind in args.backends.split(",")
            },
        }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    asyncio.run(main())
