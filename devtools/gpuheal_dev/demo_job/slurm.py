"""Drive the demo job on a Slurm cluster: submit, watch, and the baseline fault recovery.

Used by the integration tests, the recovery benchmarks and the demo. ``slurm`` is anything
with ``run(*args, check=..., timeout=...)`` returning a ``CompletedProcess[str]``, e.g. the
sandbox's :class:`~gpuheal_dev.sandbox.slurm.SlurmCluster`.

``scontrol_recover`` is the baseline without the operator or the bridge, the commands an admin
would type: ``scontrol update NodeName=X State=DRAIN Reason=...``, optionally a checkpoint signal
(``scancel --signal=USR1 --batch``, waiting until the job reports the checkpoint),
``scontrol requeue``, and with ``expedite`` ``scontrol update JobId=J StartTime=now`` once the
job shows PENDING/BeginTime (earlier, while COMPLETING, it has no effect). Without it Slurm holds
a requeued job for munge's ``cred_expire`` (120 s by default, 5 s in the sandbox).
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from gpuheal_dev.demo_job.metrics import Record, read_records

T = TypeVar("T")


class SlurmRunner(Protocol):
    def run(
        self, *args: str, check: bool = True, timeout: float = 30.0
    ) -> subprocess.CompletedProcess[str]: ...


class WaitTimeout(AssertionError):
    """A wait ran out of time; the message says for what and the last thing seen."""


@dataclass(frozen=True)
class JobInfo:
    job_id: int
    state: str
    reason: str
    nodes: str  # NodeList as Slurm prints it ("(null)" when none)
    batch_host: str
    restarts: int
    excluded: str


_FIELD_RE = {
    key: re.compile(rf"(?:^|\s){key}=(\S*)")
    for key in ("JobState", "Reason", "NodeList", "BatchHost", "Restarts", "ExcNodeList")
}


def parse_job(job_id: int, text: str) -> JobInfo:
    """Parse ``scontrol show job -o ID`` (one line of Key=Value pairs)."""

    def get(key: str) -> str:
        m = _FIELD_RE[key].search(text)
        return m.group(1) if m else ""

    return JobInfo(
        job_id=job_id,
        state=get("JobState"),
        reason=get("Reason"),
        nodes=get("NodeList"),
        batch_host=get("BatchHost"),
        restarts=int(get("Restarts") or 0),
        excluded=get("ExcNodeList"),
    )


def job_info(slurm: SlurmRunner, job_id: int) -> JobInfo:
    return parse_job(job_id, slurm.run("scontrol", "show", "job", "-o", str(job_id)).stdout)


def submit(slurm: SlurmRunner, script: Path, *sbatch_args: str) -> int:
    out = slurm.run("sbatch", "--parsable", *sbatch_args, str(script)).stdout.strip()
    return int(out.split(";")[0])


def wait_until(
    probe: Callable[[], T],
    done: Callable[[T], bool],
    *,
    what: str,
    timeout: float,
    poll: float = 0.05,
) -> T:
    """Call ``probe`` every ``poll`` s until ``done(value)``; WaitTimeout after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise WaitTimeout(f"timed out after {timeout:g}s waiting for {what}; last: {value!r}")
        time.sleep(poll)


def wait_job(
    slurm: SlurmRunner,
    job_id: int,
    done: Callable[[JobInfo], bool],
    *,
    what: str,
    timeout: float = 60.0,
    poll: float = 0.05,
) -> JobInfo:
    return wait_until(lambda: job_info(slurm, job_id), done, what=what, timeout=timeout, poll=poll)


def wait_records(
    metrics: Path,
    done: Callable[[list[Record]], bool],
    *,
    what: str,
    timeout: float = 60.0,
    poll: float = 0.05,
) -> list[Record]:
    return wait_until(lambda: read_records(metrics), done, what=what, timeout=timeout, poll=poll)


def last_checkpoint_step(records: list[Record]) -> int:
    steps = [int(r["step"]) for r in records if r["event"] == "checkpoint"]
    return max(steps, default=0)


def drain(slurm: SlurmRunner, node: str, reason: str) -> None:
    slurm.run("scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")


def resume_node(slurm: SlurmRunner, node: str) -> None:
    """RESUME a drained node (Slurm refuses it for a node that is not drained: not an error)."""
    slurm.run("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)


@dataclass(frozen=True)
class RecoveryTimes:
    """``time.time()`` of each step of a baseline recovery (None: step not taken)."""

    fault: float
    drained: float
    signalled: float | None
    checkpointed: float | None
    requeued: float
    pending_begintime: float | None
    expedited: float | None
    running: float
    node_before: str
    node_after: str

    def events(self) -> list[tuple[str, float]]:
        """(name, time) pairs for :func:`gpuheal_dev.timeline.build_timeline`."""
        named = [
            ("fault", self.fault),
            ("slurm drained", self.drained),
            ("checkpoint signal", self.signalled),
            ("checkpoint written", self.checkpointed),
            ("requeued", self.requeued),
            ("pending (BeginTime)", self.pending_begintime),
            ("expedited (StartTime=now)", self.expedited),
            ("job running again", self.running),
        ]
        return [(n, t) for n, t in named if t is not None]


def scontrol_recover(
    slurm: SlurmRunner,
    job_id: int,
    *,
    reason: str,
    expedite: bool,
    checkpoint_signal: str | None = None,
    metrics: Path | None = None,
    timeout: float = 180.0,
    poll: float = 0.05,
) -> RecoveryTimes:
    """Drain the job's node and requeue the job by hand; return when it RUNS elsewhere."""
    before = job_info(slurm, job_id)
    if before.state != "RUNNING":
        raise ValueError(f"job {job_id} is {before.state}, not RUNNING")
    node = before.batch_host or before.nodes
    fault = time.time()
    drain(slurm, node, reason)
    drained = time.time()
    signalled = checkpointed = None
    if checkpoint_signal is not None:
        seen = len(read_records(metrics)) if metrics else 0
        slurm.run("scancel", f"--signal={checkpoint_signal}", "--batch", str(job_id))
        signalled = time.time()
        if metrics is not None:
            wait_records(
                metrics,
                lambda recs: any(r["event"] in ("checkpoint", "signal") for r in recs[seen:]),
                what=f"job {job_id} to react to {checkpoint_signal}",
                timeout=30,
                poll=0.01,
            )
            checkpointed = time.time()
    slurm.run("scontrol", "requeue", str(job_id))
    requeued = time.time()
    pending_at = expedited = None
    if expedite:
        wait_job(
            slurm,
            job_id,
            lambda j: j.state == "RUNNING" or (j.state == "PENDING" and j.reason == "BeginTime"),
            what=f"job {job_id} PENDING/BeginTime",
            timeout=timeout,
            poll=poll,
        )
        pending_at = time.time()
        if job_info(slurm, job_id).state == "PENDING":
            slurm.run("scontrol", "update", f"JobId={job_id}", "StartTime=now")
            expedited = time.time()
    after = wait_job(
        slurm,
        job_id,
        lambda j: j.state == "RUNNING" and j.restarts > before.restarts,
        what=f"job {job_id} RUNNING again",
        timeout=timeout,
        poll=poll,
    )
    running = time.time()
    return RecoveryTimes(
        fault=fault,
        drained=drained,
        signalled=signalled,
        checkpointed=checkpointed,
        requeued=requeued,
        pending_begintime=pending_at,
        expedited=expedited,
        running=running,
        node_before=node,
        node_after=after.batch_host or after.nodes,
    )


@contextlib.contextmanager
def serve_bridge(
    slurm_env: dict[str, str],
    state_dir: Path,
    token: str,
    *,
    slurm_timeout: float = 15.0,
    bin_dir: Path | None = None,
) -> Iterator[str]:
    """The Slurm bridge (CLI backend, the production app) served by uvicorn on a free loopback
    port in a daemon thread; yields its base URL. ``slurm_env``: environment for the Slurm
    commands (``SlurmCluster.subprocess_env()``); ``bin_dir``: where that Slurm's own clients
    are (``SlurmCluster.bin_dir``: a release in a root of its own), else the PATH's. For tests
    and benchmarks."""
    import uvicorn

    from gpuheal_bridge.backends.cli import CliBackend
    from gpuheal_bridge.server.app import BridgeSettings, create_app
    from gpuheal_dev.sandbox._proc import free_tcp_ports

    state_dir.mkdir(parents=True, exist_ok=True)
    app = create_app(
        BridgeSettings(
            backend=CliBackend(
                env=slurm_env,
                bin_dir=str(bin_dir) if bin_dir is not None else None,
                timeout=slurm_timeout,
            ),
            tokens={"operator": token},
            state_dir=state_dir,
            audit_log=state_dir / "audit.jsonl",
        )
    )
    [port] = free_tcp_ports(1)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, name=f"bridge-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the bridge did not start on 127.0.0.1:{port}")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
