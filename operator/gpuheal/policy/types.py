"""Inputs and outputs of the decision engine: plain frozen values, no I/O."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
from collections.abc import Mapping, Sequence

from gpuheal.api.names import Reason
from gpuheal.api.remediationpolicy import Action, Rule, Rung, Step
from gpuheal.xid.identity import NO_GPUS, GpuMap
from gpuheal.xid.types import RecoveryAction, XidEvent


class Move(enum.StrEnum):
    """What an `Act` does to the incident itself (a step's `Act` carries its `Action`)."""

    OPEN = "open"  # record a NodeRemediation for a new trigger
    ESCALATE = "escalate"  # record the incident's climb to a higher rung
    VERIFY = "verify"  # run (or look at) the policy's check before return to service
    RETURN_TO_SERVICE = "returnToService"  # uncordon / resume in Slurm what gpuheal did
    CLOSE = "close"  # incident over without returning the node (replaced, alert only)


Operation = Action | Move
"""What an `Act` asks for: a ladder action (cordon, slurmDrain...) or a `Move`."""


@dataclasses.dataclass(frozen=True, slots=True)
class Observation:
    """One signal seen on a node, whatever its source: an XID, an Event, or a watched node
    condition that turned bad (then `time` is its lastTransitionTime)."""

    time: dt.datetime
    xid: int | None = None
    gpu: str | None = None  # UUID or normalised PCI id: what "the same GPU" means
    recovery_action: RecoveryAction | None = None
    event_reason: str | None = None
    condition_type: str | None = None
    condition_status: str | None = None
    message: str = ""
    source: str = ""  # events | conditions | dcgm | record | history (read back from the API)
    key: str = ""  # dedupe key: the same signal seen again has the same key
    event_uid: str | None = None
    reporter: str = ""  # who told us (see inputs.reporter_of): two reporters, one fault
    gpu_uuid: str | None = None  # the GPU's UUID when known (`gpu` is its PCI address then)

    @classmethod
    def from_xid(cls, event: XidEvent, seen_at: dt.datetime) -> Observation:
        return cls(
            time=event.timestamp or seen_at,
            xid=event.xid,
            gpu=event.gpu_key,
            recovery_action=event.recovery_action,
            message=event.message,
            gpu_uuid=event.gpu_uuid,
        )

    @property
    def what(self) -> str:
        """A few words for messages: `XID 79 on GPU 0000:3b:00`, `condition GpuDegraded=True`."""
        if self.xid is not None:
            return f"XID {self.xid}" + (f" on GPU {self.gpu}" if self.gpu else "")
        if self.condition_type is not None:
            return f"condition {self.condition_type}={self.condition_status}"
        return f"event {self.event_reason}"

    @property
    def identity(self) -> tuple[object, ...]:
        """Two records of one signal (in memory and on the incident) compare equal here;
        two Events in the same second (Event times have whole seconds) do not."""
        return (self.time, self.xid, self.gpu, self.event_reason, self.condition_type,
                self.event_uid)  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True)
class NodeCondition:
    type: str
    status: str  # "True" / "False" / "Unknown"
    last_transition_time: dt.datetime | None
    reason: str = ""


ALWAYS = dt.datetime.min.replace(tzinfo=dt.UTC)
"""`sources_readable_since` for a node whose sources were never blind."""


@dataclasses.dataclass(frozen=True, slots=True)
class NodeView:
    """What gpuheal keeps of a Node: a few hundred bytes instead of a 15-40 KiB body."""

    name: str
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    conditions: Sequence[NodeCondition] = ()
    uid: str = ""
    unschedulable: bool = False
    cordoned_by: str | None = None  # the incident whose cordon this is (our annotation)
    claimed_by: str | None = None  # the incident that claimed this node as a spare
    taints: tuple[str, ...] = ()
    gpus: GpuMap = NO_GPUS  # PCI <-> UUID (the agent's annotation)
    sources_readable_since: dt.datetime | None = ALWAYS
    """Since when every signal source for this node has been readable; None = blind now.
    A blind source never starts nor ends an incident, and blind time is not healthy time."""

    def condition(self, type_: str) -> NodeCondition | None:
        return next((c for c in self.conditions if c.type == type_), None)

    @property
    def ready(self) -> bool:
        cond = self.condition("Ready")
        return cond is not None and cond.status == "True"

    @property
    def kept_out_by(self) -> str | None:
        """The incident that keeps this node out of service (cordoned by gpuheal), if any."""
        return self.cordoned_by if self.unschedulable and self.cordoned_by else None


@dataclasses.dataclass(frozen=True, slots=True)
class VerificationState:
    """The current rung's run of the policy's check (NodeRemediation status.verification)."""

    started_at: dt.datetime
    passed_at: dt.datetime | None = None
    failed_at: dt.datetime | None = None
    message: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class IncidentView:
    """The open NodeRemediation of the node, as far as decisions go."""

    rule: str
    ladder: Sequence[Rung]  # spec.ladder: the snapshot taken when the incident opened
    rung: int
    started_at: dt.datetime
    done: frozenset[Action] = frozenset()
    # Resets/reboots of this rung in `done` that repaired nothing (a Noop hook: skipped)
    repairs_skipped: frozenset[Action] = frozenset()
    last_step_at: dt.datetime | None = None
    approved: frozenset[Action] = frozenset()
    cordoned_by_us: bool = False
    slurm_drained_by_us: bool = False
    trigger_xid: int | None = None
    trigger_gpu: str | None = None
    trigger_gpu_uuid: str | None = None
    holds_slot: bool = False  # counts against maxUnhealthy already (took a disruptive step)
    dry_run: bool = False  # the incident's own snapshot: editing the policy does not flip it
    name: str = ""
    replaced_by: str | None = None  # the spare that took over (the node is handed to repair)
    repair_failed: str | None = None  # the current rung's reset/reboot failed: why
    verification: VerificationState | None = None  # the current rung's check, if it ran
    # the DeviceTaintRule of a quarantineDevice step not lifted yet (gpuheal's to undo)
    quarantined_device: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class IncidentSummary:
    """What the operator keeps of every NodeRemediation, open or closed (cluster counts)."""

    name: str
    node: str
    policy: str
    active: bool
    holds_slot: bool
    trigger_keys: frozenset[str] = frozenset()
    recorded: frozenset[tuple[object, ...]] = frozenset()  # identities of its signals
    replacement: str | None = None  # a spare took over: the node is handed to repair
    slot_taken_at: dt.datetime | None = None
    started_at: dt.datetime | None = None
    completed_at: dt.datetime | None = None
    started: bool = False  # passed its first look (`policy.vet`): Detected is recorded
    # when its first signal was seen: the order of a fault domain's members (`policy.domains`)
    first_signal_at: dt.datetime | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class History:
    """What the engine knows of the node's past: its signals (this process's, the open
    incident's record and the node's FaultHistory, merged), the open incident, and when the
    last one ended. `elsewhere` holds signals of the same GPUs (by UUID) seen on other nodes:
    a GPU that moved keeps its record, counted only where a rule counts per GPU."""

    observations: Sequence[Observation] = ()
    incident: IncidentView | None = None
    last_resolved_at: dt.datetime | None = None
    """When the node's previous incident ended: older signals were dealt with (a replayed
    Event from before it must not open a new incident)."""
    elsewhere: Sequence[Observation] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class PoolCounts:
    """A ReservePool as far as a return decision goes."""

    available: int
    min_available: int

    @property
    def low(self) -> bool:
        return self.available < self.min_available


@dataclasses.dataclass(frozen=True, slots=True)
class ClusterCounts:
    """Counts over the nodes the policy selects, and its breaker, as the operator sees them."""

    selected: int
    unhealthy: int  # nodes with an open incident or kept out of service by gpuheal
    remediating: int  # nodes that hold a maxUnhealthy slot (took or keep a disruptive step)
    recent_starts: Sequence[dt.datetime] = ()  # when slots were taken (rate limit)
    breaker_open: bool = False
    breaker_changed_at: dt.datetime | None = None  # last open/close transition
    pools: Mapping[str, PoolCounts] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class Trigger:
    """A rule that fires now, at which rung, and why."""

    rule_index: int
    rule: Rule
    rung: int
    steps: tuple[Step, ...]  # the rung's steps after the catalogue's first-sight guards
    count: int  # occurrences counted for escalation
    signal: Observation
    why: str
    repeat: str = ""  # in words, from the history: "3rd XID 94 on GPU-8f6c... in 7d"


@dataclasses.dataclass(frozen=True, slots=True)
class Act:
    """Do `operation` now."""

    operation: Operation
    reason: Reason
    message: str
    rule: str | None = None
    rung: int | None = None
    step_index: int | None = None
    step: Step | None = None
    trigger: Trigger | None = None  # OPEN and ALERT of a new signal
    takes_slot: bool = False  # this step counts the node against maxUnhealthy from now on
    breaker: bool | None = None  # the policy's breaker opens (True) / closes (False) now
    uncordon: bool = False  # RETURN_TO_SERVICE only
    resume_slurm: bool = False  # RETURN_TO_SERVICE only
    to_pool: str | None = None  # RETURN_TO_SERVICE: back to this ReservePool as a spare
    restart: bool = False  # VERIFY: start a new run of the check (none yet, or a stale one)
    # RETURN_TO_SERVICE / CLOSE: no check vouches for the node (returnToService.check is
    # None): why, recorded as Verified=Unknown (NoCheck), never as verified
    unchecked: str | None = None
    # A replace step later in this rung whose spare is claimed now, beside this step, so
    # that the requeued job finds it ready (`engine.spare_to_claim`).
    reserve: Step | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Wait:
    """Nothing to do now; decide again at `until`."""

    until: dt.datetime
    reason: Reason
    message: str


@dataclasses.dataclass(frozen=True, slots=True)
class Blocked:
    """Something should happen but a safety rule says no. `would` is what would happen."""

    reason: Reason
    message: str
    retry_at: dt.datetime | None = None
    would: Act | None = None
    breaker: bool | None = None  # the policy's breaker opens (True) / closes (False) now


@dataclasses.dataclass(frozen=True, slots=True)
class Idle:
    """Nothing to do and nothing to wait for."""

    reason: Reason
    message: str


Decision = Act | Wait | Blocked | Idle
