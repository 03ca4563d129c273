"""Request and response models of the bridge's HTTP API (``/v1``).

These models are the contract between the bridge and the operator's client
(:mod:`gpuheal_bridge.client`). They import nothing but pydantic and the standard
library, so the operator can depend on them without FastAPI or the backends
(an import-linter contract enforces it).
"""

from __future__ import annotations

import datetime as dt
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from gpuheal_bridge.api.names import (
    DRAIN_REASON_MAX,
    DRAIN_REASON_PATTERN,
    INCIDENT_PATTERN,
    NODE_NAME_MAX,
    NODE_NAME_PATTERN,
    SIGNAL_PATTERN,
    XID_MAX,
    XID_MIN,
    drain_reason_problem,
)


def _drain_reason(reason: str) -> str:
    problem = drain_reason_problem(reason)
    if problem:
        raise ValueError(problem)
    return reason


DrainReason = Annotated[
    str,
    # the pattern for the OpenAPI document; the validator says what is wrong in words
    Field(
        min_length=1,
        max_length=DRAIN_REASON_MAX,
        json_schema_extra={"pattern": DRAIN_REASON_PATTERN},
    ),
    AfterValidator(_drain_reason),
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Owner(StrEnum):
    """Who set the current drain/down reason of a node."""

    GPUHEAL = "gpuheal"  # reason starts with ``gpuheal:``
    OTHER = "other"  # an admin, Slurm itself, or another controller (e.g. ``slurm-operator:``)
    NONE = "none"  # the node is not drained/down


class NodeState(_Model):
    """A Slurm node as the bridge sees it."""

    node: str = Field(description="Node name as the caller gave it (Kubernetes name).")
    slurm_node: str = Field(description="The Slurm node name it maps to.")
    state: str = Field(description="Base state, upper case: IDLE, MIXED, ALLOCATED, DOWN, ...")
    flags: list[str] = Field(default_factory=list, description="State flags: DRAIN, FAIL, ...")
    drain: bool = Field(description="True when the DRAIN flag is set (draining or drained).")
    unavailable: bool = Field(description="DRAIN, DOWN or FAIL: Slurm schedules nothing here.")
    reason: str | None = Field(default=None, description="Reason text without `[user@time]`.")
    reason_user: str | None = None
    reason_time: str | None = Field(default=None, description="When the reason was set (ISO).")
    owner: Owner = Field(description="Owner of the drain/down reason.")
    incident: str | None = Field(default=None, description="Incident id when owner=gpuheal.")
    xid: int | None = Field(default=None, description="XID from our reason when present.")
    boot_time: str | None = Field(
        default=None,
        description="When the node last booted, as Slurm says (BootTime, the Slurm host's "
        "local time): a reboot changes it.",
    )
    slurmd_start_time: str | None = Field(
        default=None, description="When the node's slurmd last started (SlurmdStartTime)."
    )

    @property
    def rebooting(self) -> bool:
        """A reboot was asked for and has not finished (REBOOT_REQUESTED / REBOOT_ISSUED)."""
        return any(f.startswith("REBOOT") for f in self.flags)


class JobEnd(StrEnum):
    """How a finished job ended, as Slurm tells it (its final state).

    ``failed`` is a non-zero exit or a process killed by a signal that Slurm did not send
    (a CUDA process dying with its GPU ends here); ``cancelled`` is ``scancel`` by a person or
    a tool (Slurm's own requeue never leaves a job CANCELLED).
    """

    COMPLETED = "completed"  # exit 0
    FAILED = "failed"  # non-zero exit, or killed by a signal
    NODE_FAIL = "node_fail"  # its node failed (DOWN / not responding)
    CANCELLED = "cancelled"  # scancel
    TIMEOUT = "timeout"  # its time limit
    OUT_OF_MEMORY = "out_of_memory"
    PREEMPTED = "preempted"
    BOOT_FAIL = "boot_fail"
    DEADLINE = "deadline"
    OTHER = "other"


class JobState(_Model):
    """A Slurm job as the bridge sees it (subset of ``squeue --json``)."""

    job_id: int
    name: str | None = None
    user: str | None = None
    state: str = Field(description="RUNNING, PENDING, COMPLETING, CANCELLED, ...")
    reason: str | None = Field(default=None, description="Pending reason (BeginTime, ...).")
    nodes: list[str] = Field(default_factory=list, description="Allocated nodes, expanded.")
    batch_host: str | None = None
    batch: bool = Field(description="A batch job (sbatch); only those can be requeued.")
    requeue: bool = Field(description="The job's requeue flag (False after --no-requeue).")
    restart_count: int = 0
    excluded_nodes: list[str] = Field(default_factory=list)
    required_nodes: list[str] = Field(
        default_factory=list, description="Nodes the job asked for by name (--nodelist/-w)."
    )
    node_count: int | None = Field(default=None, description="Nodes the job runs on or asked for.")
    ended: JobEnd | None = Field(
        default=None, description="How it ended; None while the job is not finished."
    )
    end_time: dt.datetime | None = Field(
        default=None, description="When it ended (UTC); None while it is not finished."
    )
    exit_status: int | None = Field(
        default=None, description="Exit status of the batch script, when it exited."
    )
    exit_signal: int | None = Field(
        default=None, description="Signal that killed the batch script, when one did."
    )
    gpus: list[int] | None = Field(
        default=None,
        description="The GPUs the job holds on the node listed (GET /v1/nodes/{node}/jobs): "
        "their Slurm GRES indexes (IDX of `scontrol show job -d`, slurmrestd's gres_detail; "
        "with gres.conf File=/dev/nvidia[0-7] the index is the GPU's minor number), [] for "
        "none. None where not read (other listings) or where Slurm gave no index.",
    )


class SignalTarget(StrEnum):
    """Which processes of a job receive the checkpoint signal.

    ``full`` (default) is ``scancel --full``: the batch shell, its children and every srun
    step, so the signal reaches the training process wherever it runs. ``batch`` is
    ``scancel --batch``: only the batch shell (a script that traps the signal itself).
    ``steps`` is plain ``scancel --signal``: srun steps only, never the batch shell (what
    ``sbatch --signal=USR1@T`` does; safe for scripts that do not trap the signal).
    """

    FULL = "full"
    BATCH = "batch"
    STEPS = "steps"


class CheckpointSignal(_Model):
    """Ask the job to checkpoint before it is requeued."""

    signal: Annotated[str, Field(pattern=SIGNAL_PATTERN)] = Field(
        default="USR1",
        description="A signal the job can catch: USR1, USR2, TERM, INT, HUP, QUIT, CONT, URG, "
        "ALRM, PWR or XCPU (SIG prefix optional), or its Linux number (1, 2, 3, 10, 12, 14, "
        "15, 18, 23, 24, 30). KILL and STOP (9, 19) cannot be caught and are refused.",
    )
    target: SignalTarget = SignalTarget.FULL
    grace_seconds: float = Field(
        default=30.0,
        ge=0,
        le=600,
        description="Wait at most this long for the checkpoint; ends early if the job stops "
        "running (e.g. it requeued itself).",
    )


class RequeueMode(StrEnum):
    REQUEUE = "requeue"  # scontrol requeue: PENDING again, starts once eligible
    REQUEUE_HOLD = "requeuehold"  # scontrol requeuehold: PENDING and held until released


class RequeueOptions(_Model):
    """How to requeue a job (alone or as part of a drain)."""

    # the OpenAPI document says what the validator below refuses (down_node with a checkpoint)
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        json_schema_extra={
            "not": {
                "required": ["down_node", "checkpoint"],
                "properties": {"down_node": {"const": True}, "checkpoint": {"type": "object"}},
            }
        },
    )

    mode: RequeueMode = RequeueMode.REQUEUE
    checkpoint: CheckpointSignal | None = Field(
        default=None, description="Send this signal and wait before requeueing."
    )
    exclude_node: bool = Field(
        default=True,
        description="Add the node the job ran on to its excluded nodes (ExcNodeList) so its "
        "next allocation avoids it.",
    )
    expedite: bool = Field(
        default=False,
        description="Once the requeued job is PENDING on BeginTime, set StartTime=now so it "
        "starts at the next scheduling pass instead of after munge cred_expire (mode=requeue).",
    )
    wait_running_seconds: float = Field(
        default=0.0,
        ge=0,
        le=600,
        description="Wait up to this long for the job to run again and report the time.",
    )
    requeue_ended: bool = Field(
        default=False,
        description="Also requeue the job when it has already ended by failure (FAILED, "
        "NODE_FAIL: e.g. its process died with its GPU) or when it ended during the "
        "checkpoint grace (it stopped because of the signal). Completed jobs that ended "
        "before the call, and cancelled ones, are never revived.",
    )
    release_node: bool = Field(
        default=False,
        description="When the job requires the node it ran on by name (--nodelist/-w), drop "
        "that node from its required nodes so that it can run elsewhere (with exclude_node "
        "it would otherwise wait forever, PENDING/BadConstraints).",
    )
    stuck_after_seconds: float | None = Field(
        default=None,
        ge=0,
        le=600,
        description="After the requeue, if the job still holds the node this many seconds "
        "past Slurm's SIGKILL (slurmd sends it max(KillWait, 5 s) after SIGTERM) because its "
        "processes outlived it (hung in the driver), set the node DOWN so that Slurm releases "
        "the job (the node's drain reason is kept). None: only wait and report.",
    )
    down_node: bool = Field(
        default=False,
        description="The job's GPU is lost (e.g. XID 79): nothing can be saved and its "
        "processes may never die (stuck in the driver). Right after the requeue the node "
        "(from_node, else the job's nodes) is set DOWN, its drain and reason kept, so that "
        "Slurm releases the job at once whatever its processes do; no checkpoint signal, no "
        "wait for SIGKILL. A job Slurm already requeued because that node went DOWN (another "
        "job's call got there first) is taken as requeued. The node stays drained (DOWN+DRAIN; "
        "slurmd registering again leaves it drained) until it is resumed.",
    )

    @model_validator(mode="after")
    def _down_without_checkpoint(self) -> RequeueOptions:
        if self.down_node and self.checkpoint is not None:
            raise ValueError(
                "down_node: a job whose GPU is lost gets no checkpoint signal (the node goes "
                "DOWN at once); leave checkpoint out"
            )
        return self


class JobOutcome(StrEnum):
    REQUEUED = "requeued"
    REQUEUED_HELD = "requeued_held"
    REQUEUED_BY_JOB = "requeued_by_job"  # the job requeued itself during the grace period
    NOT_RUNNING = "not_running"  # pending or finished: never revived (requeue would revive it)
    NOT_REQUEUEABLE = "not_requeueable"  # not a batch job, or --no-requeue
    ENDED_DURING_GRACE = "ended_during_grace"  # finished after the checkpoint signal
    NOT_ON_NODE = "not_on_node"  # the job no longer runs on the node named in the request
    GONE = "gone"  # Slurm no longer knows the job
    FAILED = "failed"  # Slurm refused or timed out; see detail


class JobResult(_Model):
    """What happened to one job."""

    job_id: int
    outcome: JobOutcome
    detail: str | None = None
    state_before: str | None = None
    state_after: str | None = None
    signalled: bool = False
    excluded_nodes: list[str] | None = Field(
        default=None, description="The job's excluded nodes after the update (None: untouched)."
    )
    expedited: bool = False
    requeue_seconds: float | None = Field(
        default=None, description="From the requeue call until Slurm shows the job PENDING."
    )
    requeue_to_running_seconds: float | None = Field(
        default=None, description="From the requeue call until RUNNING (when waited for)."
    )
    restart_count: int | None = None
    nodes_after: list[str] | None = None
    ended_before: JobEnd | None = Field(
        default=None,
        description="The job had already ended (this way) when it was requeued, or ended "
        "during the checkpoint grace.",
    )
    left_node_seconds: float | None = Field(
        default=None,
        description="From the requeue call until the job no longer held the node (its "
        "processes gone).",
    )
    stuck: bool = Field(
        default=False,
        description="The job still held the node past KillWait + stuck_after_seconds.",
    )
    node_down: bool = Field(
        default=False,
        description="The bridge set the node DOWN to release the job (stuck, or down_node), "
        "or found it DOWN already (down_node).",
    )
    released_node: bool = Field(
        default=False, description="The node was dropped from the job's required nodes."
    )
    required_nodes_after: list[str] | None = Field(
        default=None, description="The job's required nodes after the update (when changed)."
    )
    requeued_at: dt.datetime | None = Field(
        default=None,
        description="When Slurm accepted the requeue (or the job was seen requeued by "
        "itself), by the bridge's clock, UTC. A replayed answer keeps it: the caller records "
        "when Slurm acted, not when it heard.",
    )


class DrainRequest(_Model):
    """Drain a node for an incident; optionally requeue the jobs running on it."""

    incident: Annotated[str, Field(pattern=INCIDENT_PATTERN)] = Field(
        description="Incident id (the NodeRemediation name), e.g. nrem-abc."
    )
    xid: int | None = Field(default=None, ge=XID_MIN, le=XID_MAX, description="XID that caused it.")
    requeue: RequeueOptions | None = Field(
        default=None, description="Also requeue the node's running jobs (None: leave them)."
    )


class DrainOutcome(StrEnum):
    DRAINED = "drained"  # we set DRAIN now (also on a node only DOWN: `previous` says so)
    ALREADY_DRAINED = "already_drained"  # gpuheal had drained it already (maybe another incident)
    DRAINED_BY_OTHER = "drained_by_other"  # someone else's drain (or FAIL): reason left untouched


class DrainResponse(_Model):
    node: str
    slurm_node: str
    outcome: DrainOutcome
    owner: Owner
    previous: NodeState
    current: NodeState
    jobs: list[JobResult] = Field(default_factory=list)
    jobs_skipped_reason: str | None = Field(
        default=None, description="Why requeue was asked for but not done."
    )
    at: dt.datetime | None = Field(
        default=None,
        description="When this call drained the node (outcome drained), by the bridge's "
        "clock, UTC; a replayed answer keeps it.",
    )


class ResumeRequest(_Model):
    # The document says what the server enforces: not force together with a reserve_reason.
    model_config = ConfigDict(
        json_schema_extra={
            "not": {
                "required": ["force", "reserve_reason"],
                "properties": {"force": {"const": True}, "reserve_reason": {"type": "string"}},
            }
        }
    )

    force: bool = Field(default=False, description="Resume even if the drain is not ours.")
    incident: Annotated[str | None, Field(pattern=INCIDENT_PATTERN)] = Field(
        default=None,
        description="Only resume if our drain reason names this incident (409 otherwise).",
    )
    reserve_reason: DrainReason | None = Field(
        default=None,
        description="Resume a spare of a reserve pool: only if its drain reason is exactly "
        "this (the ReservePool's promotion.slurm.reserveReason) or it is not drained; any "
        "other drain or DOWN (an admin's, another tool's, Slurm's own) is refused (409) and "
        "left as it is. Not with force.",
    )

    @model_validator(mode="after")
    def _reserve_or_force(self) -> ResumeRequest:
        if self.force and self.reserve_reason is not None:
            raise ValueError(
                "force and reserve_reason exclude each other: reserve_reason resumes only "
                "the pool's own drain"
            )
        return self


class ResumeOutcome(StrEnum):
    RESUMED = "resumed"
    NOT_DRAINED = "not_drained"  # nothing to do (idempotent)


class ResumeResponse(_Model):
    node: str
    slurm_node: str
    outcome: ResumeOutcome
    forced: bool = False
    previous: NodeState
    current: NodeState
    exclusion_lifted_from: list[int] = Field(
        default_factory=list,
        description="Pending jobs the bridge had excluded this node from (a requeue after its "
        "fault), whose ExcNodeList no longer holds it. Running jobs lose it at their next "
        "requeue; exclusions the job had already are never lifted.",
    )


class JobsResponse(_Model):
    node: str
    slurm_node: str
    jobs: list[JobState]


class JobRequeueRequest(RequeueOptions):
    """Requeue one job. ``from_node``: only if it still runs there; that node is excluded."""

    # Required: a token acts on the jobs of the nodes it may name (the bridge's allowed
    # nodes), not on any job of the Slurm cluster by its id.
    from_node: Annotated[
        str, Field(min_length=1, max_length=NODE_NAME_MAX, pattern=NODE_NAME_PATTERN)
    ] = Field(
        description="Node (Kubernetes name) the job must still run on (required: the job is "
        "requeued, held or signalled only if it runs there)."
    )


class JobSignalRequest(_Model):
    """Send one running job a signal it can catch (ask it to checkpoint now), and nothing
    else: the job is neither requeued nor held and keeps running on its node."""

    # Required, as for a requeue: a token acts on the jobs of the nodes it may name.
    from_node: Annotated[
        str, Field(min_length=1, max_length=NODE_NAME_MAX, pattern=NODE_NAME_PATTERN)
    ] = Field(
        description="Node (Kubernetes name) the job must still run on (required: the job is "
        "signalled only if it runs there)."
    )
    signal: Annotated[str, Field(pattern=SIGNAL_PATTERN)] = Field(
        default="USR1",
        description="A signal the job can catch, as for a checkpoint before a requeue "
        "(KILL and STOP are refused).",
    )
    target: SignalTarget = SignalTarget.FULL


class JobSignalOutcome(StrEnum):
    SIGNALLED = "signalled"
    NOT_RUNNING = "not_running"  # pending or finished: nothing to checkpoint
    NOT_ON_NODE = "not_on_node"  # the job no longer runs on the node named in the request
    GONE = "gone"  # Slurm no longer knows the job


class JobSignalResult(_Model):
    """What a signal-only call did to one job."""

    job_id: int
    outcome: JobSignalOutcome
    state: str | None = Field(default=None, description="The job's state when it was looked at.")
    detail: str | None = None
    signalled_at: dt.datetime | None = Field(
        default=None,
        description="When Slurm accepted the signal, by the bridge's clock, UTC (a replayed "
        "answer keeps it).",
    )


class RebootNextState(StrEnum):
    """What the node is after the reboot (measured on Slurm 22.05, see docs/slurm-bridge.md)."""

    DRAIN = "drain"  # `scontrol reboot reason=...` on the drained node: it stays DRAINED
    RESUME = "resume"  # `scontrol reboot ASAP nextstate=RESUME`: Slurm returns it by itself


class RebootRequest(_Model):
    """Reboot a node through Slurm (its RebootProgram) for an incident."""

    incident: Annotated[str, Field(pattern=INCIDENT_PATTERN)] = Field(
        description="Incident id (the NodeRemediation name)."
    )
    xid: int | None = Field(default=None, ge=XID_MIN, le=XID_MAX, description="XID that caused it.")
    next_state: RebootNextState = Field(
        default=RebootNextState.DRAIN,
        description="drain (default): the node is drained with gpuheal's reason first (if it "
        "is not already) and stays drained after the reboot, so nothing runs on it before "
        "gpuheal's check passes and it resumes it; resume: `ASAP nextstate=RESUME`, Slurm "
        "undrains it as soon as it is back.",
    )


class RebootOutcome(StrEnum):
    REQUESTED = "requested"  # the reboot was asked for now
    ALREADY_REQUESTED = "already_requested"  # a reboot of ours is pending or in progress


class RebootResponse(_Model):
    node: str
    slurm_node: str
    outcome: RebootOutcome
    previous: NodeState = Field(description="Before: keep previous.boot_time to verify.")
    current: NodeState


class ReserveRequest(_Model):
    """Hand a node gpuheal drained to the reserve pool: DRAIN with the pool's reason."""

    incident: Annotated[str, Field(pattern=INCIDENT_PATTERN)] = Field(
        description="The incident whose drain this is (someone else's drain is refused)."
    )
    reason: DrainReason = Field(
        default="reserve pool",
        description="The reserve pool's drain reason (the ReservePool's "
        "promotion.slurm.reserveReason); promotion resumes the node only while it is "
        "still the node's reason.",
    )


class ReserveOutcome(StrEnum):
    RESERVED = "reserved"  # drained with the pool's reason now
    ALREADY_RESERVED = "already_reserved"  # it carries the pool's reason already


class ReserveResponse(_Model):
    node: str
    slurm_node: str
    outcome: ReserveOutcome
    previous: NodeState
    current: NodeState


class ErrorCode(StrEnum):
    UNAUTHORIZED = "unauthorized"
    INSECURE_TRANSPORT = "insecure_transport"  # plain HTTP from a peer not on loopback
    FORBIDDEN = "forbidden"  # the token lacks a scope, or the node is outside the allowlist
    INVALID = "invalid"
    NOT_FOUND = "not_found"
    CONFLICT = "conflict"  # e.g. resume of someone else's drain
    IDEMPOTENCY_MISMATCH = "idempotency_mismatch"
    IN_PROGRESS = "in_progress"
    UNAVAILABLE = "unavailable"  # slurmctld down / timeout: retry
    UNSUPPORTED = "unsupported"  # the backend cannot do this against the connected Slurm
    SLURM_ERROR = "slurm_error"


class ErrorResponse(_Model):
    error: ErrorCode
    message: str
    owner: Owner | None = None
    current: NodeState | None = None
    retry_after_seconds: float | None = None


class Health(_Model):
    status: Literal["ok"] = "ok"


class BackendCapabilities(_Model):
    """What the bridge's backend can do on the Slurm it is connected to (``/v1/capabilities``)."""

    backend: str = Field(description="The configured backend: cli or rest.")
    slurm_version: str | None = Field(
        None, description="Slurm's release as the backend read it (None: Slurm not reached)."
    )
    rest_api_version: str | None = Field(
        None, description="slurmrestd's API the rest backend uses, e.g. v0.0.45."
    )
    slurmctld: str = Field(description="The ping's answer (UP, DOWN or an error text).")
    capabilities: list[str] = Field(description="Operations the bridge can do there.")
    missing: list[str] = Field(description="Operations it cannot (answered 501).")
    backends: dict[str, list[str]] = Field(
        description="What each backend in use does (rest, and cli as its write fallback)."
    )


class Readiness(_Model):
    ready: bool
    backend: str
    slurmctld: str = Field(description="UP, DOWN or an error text.")
    slurm_version: str | None = None
    capabilities: list[str] = Field(default_factory=list)
