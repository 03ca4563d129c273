"""The interface every backend implements, and the errors they raise.

Backends are thin: one Slurm operation per method, no policy. Ownership checks,
idempotency, the requeue sequence (signal, grace, requeue, exclude, expedite) live in
:mod:`gpuheal_bridge.operations`, written once against this interface.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

from gpuheal_bridge.api.models import JobState, SignalTarget

#: Node names for a job's ExcNodeList or ReqNodeList; None: leave that list as it is.
Nodes = list[str] | None


class BackendError(Exception):
    """Base of backend errors; ``str()`` is the Slurm message."""


class NotFound(BackendError):
    """Slurm does not know the node or job."""


class Unavailable(BackendError):
    """slurmctld unreachable or a call timed out: retry later."""

    def __init__(self, message: str, retry_after: float = 5.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Rejected(BackendError):
    """Slurm refused the operation (e.g. ``Job is pending execution``)."""


class Unsupported(BackendError):
    """The backend cannot do this against the connected Slurm (capability error)."""


def error_for(
    message: str,
    *,
    unavailable: re.Pattern[str],
    not_found: re.Pattern[str],
    text: str | None = None,
) -> BackendError:
    """Slurm's words (``text``, else ``message``) -> the error to raise: Unavailable (retry
    later) over NotFound over Rejected. Each backend brings the patterns its Slurm says."""
    said = message if text is None else text
    if unavailable.search(said):
        return Unavailable(message)
    if not_found.search(said):
        return NotFound(message)
    return Rejected(message)


class Capability(StrEnum):
    READ_NODES = "read_nodes"
    READ_JOBS = "read_jobs"
    DRAIN = "drain"
    RESUME = "resume"
    REQUEUE = "requeue"
    SIGNAL = "signal"
    UPDATE_JOB = "update_job"  # ExcNodeList / StartTime
    REBOOT = "reboot"  # scontrol reboot (RebootProgram)


ALL_CAPABILITIES = frozenset(Capability)


@dataclass(frozen=True)
class SlurmNode:
    name: str
    state: str  # base state, upper case
    flags: tuple[str, ...] = ()
    reason: str | None = None
    reason_user: str | None = None
    reason_time: str | None = None
    boot_time: str | None = None
    slurmd_start_time: str | None = None

    @property
    def drain(self) -> bool:
        return "DRAIN" in self.flags

    @property
    def unavailable(self) -> bool:
        return self.drain or self.state in ("DOWN", "FAIL") or "FAIL" in self.flags


@dataclass(frozen=True)
class JobProbe:
    """Cheap view of one job used while polling (state changes)."""

    job_id: int
    state: str
    reason: str | None = None
    nodes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Ping:
    up: bool
    detail: str
    version: str | None = None


@runtime_checkable
class Backend(Protocol):
    """One Slurm cluster. All methods are async and bounded by the backend's timeout."""

    name: str

    def capabilities(self) -> frozenset[Capability]: ...

    async def ping(self) -> Ping: ...

    async def get_node(self, node: str) -> SlurmNode:
        """Raise NotFound for an unknown node."""
        ...

    async def jobs_on_node(self, node: str, *, gpus: bool = False) -> list[JobState]:
        """Jobs allocated on ``node`` that are not finished (RUNNING, SUSPENDED, COMPLETING...);
        with ``gpus``, each with the GPU indexes it holds there (``JobState.gpus``)."""
        ...

    async def ended_jobs_on_node(self, node: str, since: dt.datetime) -> list[JobState]:
        """Finished jobs that ran on ``node`` and ended at or after ``since`` (as long as
        slurmctld remembers them: MinJobAge)."""
        ...

    async def kill_wait(self) -> float | None:
        """Slurm's KillWait in seconds (SIGTERM -> SIGKILL), None when it cannot be read."""
        ...

    async def get_job(self, job_id: int) -> JobState:
        """Full view of a job, finished ones included while Slurm remembers them."""
        ...

    async def probe_job(self, job_id: int) -> JobProbe:
        """Cheap state read for polling; NotFound when Slurm forgot the job."""
        ...

    async def drain(self, node: str, reason: str) -> None: ...

    async def resume(self, node: str) -> None: ...

    async def reboot(self, node: str, reason: str, *, asap: bool, resume: bool) -> None:
        """``scontrol reboot [ASAP] [nextstate=RESUME] reason=<reason> <node>``: the node runs
        Slurm's RebootProgram once idle (ASAP: drained until then)."""
        ...

    async def set_down(self, node: str, reason: str) -> None:
        """``State=DOWN``: Slurm ends what still holds the node (a job stuck COMPLETING)."""
        ...

    async def requeue(self, job_id: int, hold: bool) -> None: ...

    async def signal(self, job_id: int, signal: str, target: SignalTarget) -> None: ...

    async def set_excluded_nodes(
        self, job_id: int, nodes: list[str], required_nodes: Nodes = None
    ) -> None:
        """``ExcNodeList`` (and ``ReqNodeList`` when given; ``[]`` clears it)."""
        ...

    async def start_now(
        self, job_id: int, excluded_nodes: Nodes = None, required_nodes: Nodes = None
    ) -> None:
        """``StartTime=now``: lift the BeginTime hold of a requeued job (and set its excluded
        and required nodes in the same update when given)."""
        ...

    async def aclose(self) -> None: ...
