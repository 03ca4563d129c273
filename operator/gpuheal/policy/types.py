"""Inputs and outputs of the decision engine: plain frozen values, no I/O."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
from collections.abc import Mapping, Sequence

from gpuheal.api.remediationpolicy import Action, Rung, Step
from gpuheal.xid.types import RecoveryAction, XidEvent


class Operation(enum.StrEnum):
    """What an `Act` asks the operator to do: a ladder action, or one of two closing moves."""

    ALERT = "alert"
    CORDON = "cordon"
    SLURM_DRAIN = "slurmDrain"
    DRAIN = "drain"
    RESET = "reset"
    REBOOT = "reboot"
    REPLACE = "replace"
    RETURN_TO_SERVICE = "returnToService"  # uncordon / resume in Slurm what gpuheal did
    CLOSE = "close"  # incident over without returning the node (replaced, alert only)

    @classmethod
    def of(cls, action: Action) -> Operation:
        return cls(action.value)


# Decision reasons: CamelCase, stable (they become condition reasons and Event reasons).
REASON_DETECTED = "Detected"
REASON_NEXT_STEP = "NextStep"
REASON_ESCALATED = "Escalated"
REASON_HEALTHY_FOR_HYSTERESIS = "HealthyForHysteresis"
REASON_REPLACED = "Replaced"
REASON_ALERT_ONLY = "AlertOnly"
REASON_NOTHING_OWNED = "NothingOwned"
REASON_CONDITION_PENDING = "ConditionPending"
REASON_HYSTERESIS_PENDING = "HysteresisPending"
REASON_STILL_UNHEALTHY = "NodeStillUnhealthy"
REASON_HEALTHY = "Healthy"
REASON_RETURN_DISABLED = "ReturnToServiceDisabled"
REASON_PAUSED = "Paused"
REASON_DRY_RUN = "DryRun"
REASON_OPTED_OUT = "OptedOut"
REASON_BREAKER_OPEN = "CircuitBreakerOpen"
REASON_MAX_UNHEALTHY = "MaxUnhealthyReached"
REASON_RATE_LIMITED = "RateLimited"
REASON_STORM_COOLDOWN = "StormCooldown"
REASON_APPROVAL_PENDING = "ApprovalPending"
REASON_SOURCE_BLIND = "SignalSourceBlind"


@dataclasses.dataclass(frozen=True, slots=True)
class Observation:
    """One signal seen on the node: an XID (any source) or a non-XID Event."""

    time: dt.datetime
    xid: int | None = None
    gpu: str | None = None  # UUID or normalised PCI id: what "the same GPU" means
    recovery_action: RecoveryAction | None = None
    event_reason: str | None = None
    message: str = ""

    @classmethod
    def from_xid(cls, event: XidEvent, seen_at: dt.datetime) -> Observation:
        return cls(
            time=event.timestamp or seen_at,
            xid=event.xid,
            gpu=event.gpu_key,
            recovery_action=event.recovery_action,
            message=event.message,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class NodeCondition:
    type: str
    status: str  # "True" / "False" / "Unknown"
    last_transition_time: dt.datetime


ALWAYS = dt.datetime.min.replace(tzinfo=dt.UTC)
"""`sources_readable_since` for a node whose sources were never blind."""


@dataclasses.dataclass(frozen=True, slots=True)
class NodeView:
    """The compact view of a Node the engine needs (not the Node body)."""

    name: str
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    conditions: Sequence[NodeCondition] = ()
    sources_readable_since: dt.datetime | None = ALWAYS
    """Since when every signal source for this node has been readable; None = blind now.
    A blind source never starts nor ends an incident, and blind time is not healthy time."""


@dataclasses.dataclass(frozen=True, slots=True)
class IncidentView:
    """The open NodeRemediation of the node, as far as decisions go."""

    rule: str
    ladder: Sequence[Rung]  # spec.ladder: the snapshot taken when the incident opened
    rung: int
    started_at: dt.datetime
    done: frozenset[Action] = frozenset()
    last_step_at: dt.datetime | None = None
    approved: frozenset[Action] = frozenset()
    cordoned_by_us: bool = False
    slurm_drained_by_us: bool = False
    trigger_xid: int | None = None
    trigger_gpu: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class History:
    observations: Sequence[Observation] = ()
    incident: IncidentView | None = None
    last_resolved_at: dt.datetime | None = None
    """When the node's previous incident ended: older signals were dealt with (a replayed
    Event from before it must not open a new incident)."""


@dataclasses.dataclass(frozen=True, slots=True)
class ClusterCounts:
    """Counts over the nodes the policy selects, computed by the operator."""

    selected: int
    unhealthy: int  # nodes with a trigger or an open incident (this node included if so)
    remediating: int  # open incidents that took or will take disruptive steps
    recent_starts: Sequence[dt.datetime] = ()  # incident start times (rate limit)
    breaker_closed_at: dt.datetime | None = None  # CircuitBreakerOpen -> False transition


@dataclasses.dataclass(frozen=True, slots=True)
class Act:
    """Do `operation` now."""

    operation: Operation
    reason: str
    message: str
    rule: str | None = None
    rung: int | None = None
    step_index: int | None = None
    step: Step | None = None
    uncordon: bool = False  # RETURN_TO_SERVICE only
    resume_slurm: bool = False  # RETURN_TO_SERVICE only


@dataclasses.dataclass(frozen=True, slots=True)
class Wait:
    """Nothing to do now; decide again at `until`."""

    until: dt.datetime
    reason: str
    message: str


@dataclasses.dataclass(frozen=True, slots=True)
class Blocked:
    """Something should happen but a safety rule says no. `would` is what would happen."""

    reason: str
    message: str
    retry_at: dt.datetime | None = None
    would: Act | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Idle:
    """Nothing to do and nothing to wait for."""

    reason: str
    message: str


Decision = Act | Wait | Blocked | Idle
