"""An in-memory Slurm behind the Backend interface, for unit tests of operations and HTTP.

It mimics the sharp edges measured on 22.05: RESUME of a node that is not drained is
refused, requeue passes through COMPLETING -> PENDING -> PENDING/BeginTime before the job
can run, requeue of a pending job is refused.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass, field

from gpuheal_bridge.api.models import JobEnd, JobState, SignalTarget
from gpuheal_bridge.backends.base import (
    ALL_CAPABILITIES,
    Capability,
    JobProbe,
    NotFound,
    Ping,
    Rejected,
    SlurmNode,
    Unavailable,
)


@dataclass
class FakeJob:
    job_id: int
    nodes: list[str]
    state: str = "RUNNING"
    reason: str | None = None
    batch: bool = True
    requeue: bool = True
    restart_count: int = 0
    excluded: list[str] = field(default_factory=list)
    # states the job goes through on successive probes (consumed one per probe)
    script: list[tuple[str, str | None, list[str]]] = field(default_factory=list)
    on_signal: str | None = None  # "requeue_self" | "exit" | "fail" | "ignore" | None
    next_node: str = "node9"
    required: list[str] = field(default_factory=list)
    ended: JobEnd | None = None
    end_time: dt.datetime | None = None
    #: probes the job stays COMPLETING after a requeue (its processes outlive SIGKILL)
    stuck_probes: int = 0

    def view(self) -> JobState:
        return JobState(
            job_id=self.job_id,
            state=self.state,
            reason=self.reason,
            nodes=list(self.nodes),
            batch_host=self.nodes[0] if self.nodes else None,
            batch=self.batch,
            requeue=self.requeue,
            restart_count=self.restart_count,
            excluded_nodes=list(self.excluded),
            required_nodes=list(self.required),
            ended=self.ended,
            end_time=self.end_time,
            exit_signal=9 if self.ended is JobEnd.FAILED else None,
        )


class FakeSlurm:
    name = "fake"

    def __init__(self) -> None:
        self.nodes: dict[str, SlurmNode] = {}
        self.jobs: dict[int, FakeJob] = {}
        self.calls: list[tuple[str, tuple[object, ...]]] = []
        self.down = False
        self.expedited: set[int] = set()
        self.reboots: dict[str, bool] = {}
        self.kill_wait_s: float | None = 2.0
        #: operations that fail as if slurmctld were down (the others work)
        self.fail_ops: set[str] = set()

    # -- setup helpers
    def add_node(
        self, name: str, state: str = "IDLE", flags: tuple[str, ...] = (), reason: str | None = None
    ) -> None:
        self.nodes[name] = SlurmNode(name, state, flags, reason, "root" if reason else None)

    def add_job(self, job: FakeJob) -> FakeJob:
        self.jobs[job.job_id] = job
        return job

    def mutating_calls(self) -> list[str]:
        reads = {
            "ping",
            "get_node",
            "jobs_on_node",
            "ended_jobs_on_node",
            "get_job",
            "probe_job",
            "kill_wait",
        }
        return [c for c, _ in self.calls if c not in reads]

    def _check(self, op: str, *args: object) -> None:
        self.calls.append((op, args))
        if self.down or op in self.fail_ops:
            raise Unavailable("Unable to contact slurm controller (connect failure)")

    def _job(self, job_id: int) -> FakeJob:
        if job_id not in self.jobs:
            raise NotFound(f"Invalid job id specified for job {job_id}")
        return self.jobs[job_id]

    # -- Backend
    def capabilities(self) -> frozenset[Capability]:
        return ALL_CAPABILITIES

    async def ping(self) -> Ping:
        self.calls.append(("ping", ()))
        if self.down:
            return Ping(False, "Slurmctld(primary) at vm is DOWN")
        return Ping(True, "Slurmctld(primary) at vm is UP", "22.05.8")

    async def get_node(self, node: str) -> SlurmNode:
        self._check("get_node", node)
        if node not in self.nodes:
            raise NotFound(f"Node {node} not found")
        return self.nodes[node]

    async def jobs_on_node(self, node: str, *, gpus: bool = False) -> list[JobState]:
        self._check("jobs_on_node", node)
        return [
            j.view()
            for j in self.jobs.values()
            if node in j.nodes and j.state in ("RUNNING", "SUSPENDED", "COMPLETING")
        ]

    async def ended_jobs_on_node(self, node: str, since: dt.datetime) -> list[JobState]:
        self._check("ended_jobs_on_node", node)
        return [
            j.view()
            for j in self.jobs.values()
            if node in j.nodes and j.ended is not None and j.end_time and j.end_time >= since
        ]

    async def kill_wait(self) -> float | None:
        self._check("kill_wait")
        return self.kill_wait_s

    async def get_job(self, job_id: int) -> JobState:
        self._check("get_job", job_id)
        return self._job(job_id).view()

    async def probe_job(self, job_id: int) -> JobProbe:
        self._check("probe_job", job_id)
        job = self._job(job_id)
        if job.script:
            job.state, job.reason, job.nodes = job.script.pop(0)
        elif job.job_id in self.expedited and job.state == "PENDING":
            job.state, job.reason, job.nodes = "RUNNING", None, [job.next_node]
        return JobProbe(job.job_id, job.state, job.reason, list(job.nodes))

    async def drain(self, node: str, reason: str) -> None:
        self._check("drain", node, reason)
        n = self.nodes[node]
        flags = n.flags if "DRAIN" in n.flags else (*n.flags, "DRAIN")
        self.nodes[node] = dataclasses.replace(n, flags=flags, reason=reason, reason_user="root")

    async def resume(self, node: str) -> None:
        self._check("resume", node)
        n = self.nodes[node]
        if "DRAIN" not in n.flags and n.state != "DOWN":
            raise Rejected("slurm_update error: Invalid node state specified")
        state = "IDLE" if n.state == "DOWN" else n.state
        self.nodes[node] = SlurmNode(node, state, tuple(f for f in n.flags if f != "DRAIN"))

    async def reboot(self, node: str, reason: str, *, asap: bool, resume: bool) -> None:
        """Request only: a test completes it with `finish_reboot`."""
        self._check("reboot", node, reason, asap, resume)
        n = self.nodes[node]
        flags = tuple(f for f in n.flags if f != "DRAIN") + (("DRAIN",) if asap or n.drain else ())
        self.nodes[node] = dataclasses.replace(
            n, flags=(*flags, "REBOOT_REQUESTED"), reason=reason, reason_user="root"
        )
        self.reboots[node] = resume

    def finish_reboot(self, node: str, boot_time: str) -> None:
        n = self.nodes[node]
        resume = self.reboots.pop(node)
        flags = tuple(f for f in n.flags if not f.startswith("REBOOT"))
        if resume:
            self.nodes[node] = SlurmNode(node, "IDLE", (), boot_time=boot_time)
        else:
            reason = f"{n.reason} : reboot issued"
            self.nodes[node] = dataclasses.replace(
                n, flags=flags, reason=reason, boot_time=boot_time
            )

    async def set_down(self, node: str, reason: str) -> None:
        self._check("set_down", node, reason)
        n = self.nodes[node]
        self.nodes[node] = dataclasses.replace(n, state="DOWN", reason=reason, reason_user="root")
        for job in self.jobs.values():  # Slurm releases what still holds a DOWN node
            if node in job.nodes and job.script and job.script[0][0] == "COMPLETING":
                job.script = [s for s in job.script if s[0] != "COMPLETING"]
            elif node in job.nodes and job.state == "RUNNING" and job.requeue and not job.script:
                # and requeues its running jobs (NODE_FAIL), held for BeginTime like a requeue
                job.restart_count += 1
                job.state, job.reason, job.nodes = "PENDING", "BeginTime", []

    async def requeue(self, job_id: int, hold: bool) -> None:
        self._check("requeue", job_id, hold)
        job = self._job(job_id)
        if job.state == "PENDING":
            raise Rejected(f"Job is pending execution for job {job_id}")
        if not job.requeue:
            raise Rejected(f"Requested operation is presently disabled for job {job_id}")
        job.restart_count += 1
        old = list(job.nodes)
        job.ended, job.end_time = None, None
        job.state, job.reason = "COMPLETING", None
        reason = "job_requeued_in_held_state" if hold else "BeginTime"
        stuck = [("COMPLETING", None, old)] * job.stuck_probes
        job.script = [
            ("COMPLETING", None, old),
            *stuck,
            ("PENDING", None, []),
            ("PENDING", reason, []),
        ]

    async def signal(self, job_id: int, signal: str, target: SignalTarget) -> None:
        self._check("signal", job_id, signal, target)
        job = self._job(job_id)
        if job.on_signal == "requeue_self":
            job.restart_count += 1
            job.script = [("COMPLETING", None, job.nodes), ("PENDING", "BeginTime", [])]
        elif job.on_signal == "exit":
            job.script = [("COMPLETING", None, job.nodes), ("COMPLETED", None, job.nodes)]
            job.ended = JobEnd.COMPLETED
        elif job.on_signal == "fail":
            job.script = [("COMPLETING", None, job.nodes), ("FAILED", None, job.nodes)]
            job.ended = JobEnd.FAILED

    async def set_excluded_nodes(
        self, job_id: int, nodes: list[str], required_nodes: list[str] | None = None
    ) -> None:
        self._check("set_excluded_nodes", job_id, tuple(nodes))
        job = self._job(job_id)
        if job.state != "PENDING":
            raise Rejected(f"Job is no longer pending execution for job {job_id}")
        job.excluded = list(nodes)
        if required_nodes is not None:
            job.required = list(required_nodes)

    async def start_now(
        self,
        job_id: int,
        excluded_nodes: list[str] | None = None,
        required_nodes: list[str] | None = None,
    ) -> None:
        self._check("start_now", job_id, tuple(excluded_nodes or ()))
        if excluded_nodes:
            self._job(job_id).excluded = list(excluded_nodes)
        if required_nodes is not None:
            self._job(job_id).required = list(required_nodes)
        self.expedited.add(job_id)

    async def aclose(self) -> None:
        return None


class FakeClock:
    """Monotonic clock advanced only by the fake sleep."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += max(seconds, 0.001)
