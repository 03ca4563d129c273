"""Every name gpuheal shares with the cluster and with people, in one place: the API group,
resource names, the labels and annotations it writes or reads, condition types, decision
reasons and Event reasons.

Constants, not configuration: dashboards, alerts, `kubectl` selectors and other controllers
(Slinky, NHC) depend on these strings, so changing one is an API change.
"""

from __future__ import annotations

import enum
import hashlib
import re
from typing import Final

GROUP: Final = "gpuheal.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = "gpuheal.io/v1alpha1"

NREM_KIND: Final = "NodeRemediation"
POLICY_KIND: Final = "RemediationPolicy"
POOL_KIND: Final = "ReservePool"
HISTORY_KIND: Final = "FaultHistory"
NREM_PLURAL: Final = "noderemediations"
POLICY_PLURAL: Final = "remediationpolicies"
POOL_PLURAL: Final = "reservepools"
HISTORY_PLURAL: Final = "faulthistories"

# ---- labels and annotations people set --------------------------------------------------
OPT_OUT_LABEL: Final = "gpuheal.io/opt-out"
"""Default node label that keeps gpuheal's hands off a node (`safety.optOutLabel` overrides)."""
APPROVE_ANNOTATION: Final = "gpuheal.io/approve"
"""Set on a NodeRemediation by a person; value is a comma-separated list of approved actions."""
SLURM_CLUSTER_LABEL: Final = "gpuheal.io/slurm-cluster"
"""Default node label naming the node's Slurm cluster, so the bridge that drains it
(`gpuheal run --slurm-cluster-label` overrides the key)."""

# ---- ownership marks gpuheal writes (and the only ones it ever removes) --------------------
CORDONED_BY_ANNOTATION: Final = "gpuheal.io/cordoned-by"  # on a Node: the incident's name
CORDONED_AT_ANNOTATION: Final = "gpuheal.io/cordoned-at"
UNHEALTHY_TAINT: Final = "gpuheal.io/unhealthy"  # on a Node: value = the incident's name
CLAIMED_BY_LABEL: Final = "gpuheal.io/claimed-by"  # on a spare: the incident that claimed it
CLAIMED_AT_ANNOTATION: Final = "gpuheal.io/claimed-at"
REPLACES_ANNOTATION: Final = "gpuheal.io/replaces"  # on a promoted spare: the node it replaces
NODE_LABEL: Final = "gpuheal.io/node"  # on a NodeRemediation: the node's name (selectable)
TRIGGER_ANNOTATION: Final = "gpuheal.io/trigger"  # on a NodeRemediation: the signal's key
INITIAL_RUNG_ANNOTATION: Final = "gpuheal.io/initial-rung"  # rung the incident opened at
WHY_ANNOTATION: Final = "gpuheal.io/why"  # on a NodeRemediation: why it opened, in words
RETIRED_LABEL: Final = "gpuheal.io/retired"  # on a Node: gpuheal retired it (value: incident)
RETIRED_WHY_ANNOTATION: Final = "gpuheal.io/retired-why"  # on a retired Node: why


class NremCondition(enum.StrEnum):
    """NodeRemediation status condition types: one per step (True once done), plus the
    summary ones (`Blocked`, `Failed`, `Completed`)."""

    DETECTED = "Detected"
    CORDONED = "Cordoned"
    SLURM_DRAINED = "SlurmDrained"
    JOBS_REQUEUED = "JobsRequeued"
    CHECKPOINTED = "Checkpointed"
    DEVICE_QUARANTINED = "DeviceQuarantined"
    DRAINED = "Drained"
    RESET = "Reset"
    REBOOTED = "Rebooted"
    REPLACEMENT_CLAIMED = "ReplacementClaimed"
    RETIRED = "Retired"
    VERIFIED = "Verified"
    REPAIRED = "Repaired"
    RETURNED = "Returned"
    BLOCKED = "Blocked"
    FAILED = "Failed"
    COMPLETED = "Completed"


class PolicyCondition(enum.StrEnum):
    READY = "Ready"
    CIRCUIT_BREAKER_OPEN = "CircuitBreakerOpen"
    PAUSED = "Paused"
    OVERLAPPING = "Overlapping"
    WARNINGS = "Warnings"  # True: the policy is valid but something in it is questionable


class PoolCondition(enum.StrEnum):
    READY = "Ready"
    LOW = "Low"
    WARNINGS = "Warnings"


class Reason(enum.StrEnum):
    """Reasons of gpuheal's decisions and conditions: one CamelCase word each, stable (they
    become condition reasons, Event messages and metric labels)."""

    # the engine's decisions
    DETECTED = "Detected"
    NEXT_STEP = "NextStep"
    ESCALATED = "Escalated"
    HEALTHY_FOR_HYSTERESIS = "HealthyForHysteresis"
    REPLACED = "Replaced"
    ALERT_ONLY = "AlertOnly"
    NOTHING_OWNED = "NothingOwned"
    CONDITION_PENDING = "ConditionPending"
    HYSTERESIS_PENDING = "HysteresisPending"
    STILL_UNHEALTHY = "NodeStillUnhealthy"
    HEALTHY = "Healthy"
    NO_POLICY = "NoPolicy"
    OVERLAPPING = "Overlapping"
    RETURN_DISABLED = "ReturnToServiceDisabled"
    PAUSED = "Paused"
    DRY_RUN = "DryRun"
    OPTED_OUT = "OptedOut"
    BREAKER_OPEN = "CircuitBreakerOpen"
    RATE_LIMITED = "RateLimited"
    STORM_COOLDOWN = "StormCooldown"
    APPROVAL_PENDING = "ApprovalPending"
    SOURCE_BLIND = "SignalSourceBlind"
    POLICY_NOT_FOUND = "PolicyNotFound"
    STALE = "StaleSignal"
    NO_RULE = "NoRuleMatches"
    RETIRED = "Retired"
    VERIFY = "VerificationPending"
    VERIFICATION_FAILED = "VerificationFailed"
    REPAIR_FAILED = "RepairFailed"
    NO_CHECK = "NoCheck"  # returnToService.check is None: nothing verified the node
    AWAITING_REPAIR = "AwaitingRepair"
    REFUSED = "Refused"  # a NodeRemediation gpuheal could not have opened (made by hand)
    # spec.domains: a domain incident (gpuheal.policy.domains)
    DOMAIN_REPLACEMENT_HELD = "DomainReplacementHeld"
    DOMAIN_BREAKER_OPEN = "DomainBreakerOpen"
    DOMAIN_INCIDENT = "DomainIncident"
    # a step's waits that the driver also reports as Blocked=True (driver._BLOCKING_WAITS):
    # named here because the steps write them and the driver reads them
    POD_DISRUPTION_BUDGET = "PodDisruptionBudget"
    BRIDGE_UNAVAILABLE = "BridgeUnavailable"
    SLURM_CLUSTER_UNKNOWN = "SlurmClusterUnknown"
    NO_SPARE_AVAILABLE = "NoSpareAvailable"
    POOL_NOT_FOUND = "PoolNotFound"
    HOOK_UNAVAILABLE = "HookUnavailable"
    HOOK_UNREACHABLE = "HookUnreachable"
    WAITING_FOR_IDLE = "WaitingForIdle"  # pods a drain would evict (policy.idle)
    WAITING_FOR_SLURM_JOBS = "WaitingForSlurmJobs"  # Slurm jobs still on the node
    # policy and pool status
    ACTIVE = "Active"
    INVALID_SPEC = "InvalidSpec"  # stored, but the operator cannot read it: ignored
    TOO_MANY_UNHEALTHY = "TooManyUnhealthy"
    WITHIN_LIMITS = "WithinLimits"
    BREAKER_CLOSED = "BreakerClosed"
    PAUSED_BY_SPEC = "PausedBySpec"
    NOT_PAUSED = "NotPaused"
    NODES_IN_OTHER_POLICIES = "NodesInOtherPolicies"
    NO_OVERLAP = "NoOverlap"
    POLICY_WARNINGS = "PolicyWarnings"
    NO_WARNINGS = "NoWarnings"
    ENOUGH_SPARES = "EnoughSpares"
    BELOW_MIN_AVAILABLE = "BelowMinAvailable"
    NO_SPARES = "NoSpares"
    # why a spare of a ReservePool cannot be promoted (status.unavailable[].reason)
    NOT_READY = "NotReady"
    CORDONED = "Cordoned"
    HELD_BY_INCIDENT = "HeldByIncident"
    DRAINED_IN_SLURM = "DrainedInSlurm"
    DOWN_IN_SLURM = "DownInSlurm"
    DEPRECATED_FIELDS = "DeprecatedFields"


class JobReason(enum.StrEnum):
    """Why a Slurm job on the faulty node was requeued or left as it is (the `reason` of a
    job in a NodeRemediation's `status.jobs`; one CamelCase word each)."""

    # requeued: the fault's victims
    RUNNING = "RunningAtFault"  # running on the node at the fault
    ENDED_BY_FAILURE = "EndedByFailure"  # died there (FAILED, NODE_FAIL) within the window
    ENDED_ON_SIGNAL = "EndedOnCheckpointSignal"  # stopped on the checkpoint signal
    REQUEUED_ITSELF = "RequeuedItself"  # requeued itself during the grace
    # left behind
    COMPLETED = "EndedOk"  # finished with exit 0 before the fault
    CANCELLED = "CancelledByUser"  # scancel
    OTHER_END = "EndedForAnotherReason"  # time limit, out of memory, preempted...
    TOO_OLD = "EndedBeforeWindow"  # failed, but before the policy's window
    NOT_REQUEUEABLE = "NotRequeueable"  # --no-requeue, or not a batch job
    NOT_ON_NODE = "NotOnNode"  # moved on meanwhile (pending again, elsewhere)
    GONE = "GoneFromSlurm"  # slurmctld forgot it (past MinJobAge)
    PINNED_HELD = "PinnedToNodeHeld"  # requires the node by name: held for a person
    SLURM_REFUSED = "SlurmRefused"  # Slurm or the bridge said no; see the message


class JobOutcome(enum.StrEnum):
    """What happened to a job of the faulty node (`status.jobs[].outcome`)."""

    PLANNED = "Planned"  # decided, not done yet (a restart carries on from here)
    REQUEUED = "Requeued"
    HELD = "RequeuedHeld"
    LEFT = "LeftAlone"
    FAILED = "Failed"


class EventReason(enum.StrEnum):
    """Reasons of the Kubernetes Events gpuheal posts (constants, one CamelCase word): one
    per step outcome, so `kubectl get events --field-selector reason=SlurmDrained` finds
    every Slurm drain."""

    DETECTED = "DetectedUnhealthy"
    REMEDIATION_CREATED = "RemediationCreated"
    SIGNAL_ATTACHED = "SignalAttached"
    # a step done: named as the step's condition
    CORDONED = NremCondition.CORDONED.value
    SLURM_DRAINED = NremCondition.SLURM_DRAINED.value
    CHECKPOINTED = NremCondition.CHECKPOINTED.value
    DEVICE_QUARANTINED = NremCondition.DEVICE_QUARANTINED.value
    DRAINED = NremCondition.DRAINED.value
    RESET = NremCondition.RESET.value
    REBOOTED = NremCondition.REBOOTED.value
    REPLACEMENT_CLAIMED = NremCondition.REPLACEMENT_CLAIMED.value
    STEP_SKIPPED = "RemediationStepSkipped"  # a step that did nothing, and why
    STEP_BLOCKED = "RemediationBlocked"
    STEP_FAILED = "RemediationStepFailed"
    BREAKER_OPEN = "CircuitBreakerOpen"
    # how an incident ended
    RETURNED = "ReturnedToService"
    REPLACED = "Replaced"
    REMEDIATED = "Remediated"
    DRY_RUN_COMPLETED = "DryRunCompleted"
    COMPLETED = "RemediationCompleted"
    RETIRED = "Retired"
    REFUSED = "RemediationRefused"
    SOURCE_BLIND = "SourceUnavailable"
    UNTRUSTED_SIGNAL = "UntrustedSignal"  # an Event from a reporter not trusted: nothing done
    RETURNED_TO_POOL = "ReturnedToPool"
    VERIFICATION_FAILED = "VerificationFailed"
    REFILL_REQUESTED = "RefillRequested"
    DEPRECATED_FIELDS = "DeprecatedFields"  # a pool sets a deprecated field: what to do instead
    JOB_LEFT_BEHIND = "JobNotRequeued"  # a job of the faulty node gpuheal did not requeue
    JOB_HELD = "JobHeld"  # requeued held: it names the faulty node in its --nodelist
    NODE_DOWN_FOR_STUCK_JOB = "NodeDownForStuckJob"  # its processes outlived SIGKILL
    JOB_STUCK_ON_NODE = "JobStuckOnNode"  # requeued, but it still holds the node (Report)
    NODE_DOWN_FOR_LOST_GPU = "NodeDownForLostGpu"  # slurmDrain.nodeDown: no wait for the job
    # on the operator's own Pod: a misconfiguration that keeps it not ready (/readyz says why)
    BRIDGE_AUTH_REFUSED = "BridgeTokenRefused"
    BRIDGE_UNREACHABLE = "BridgeUnreachable"
    FORBIDDEN = "Forbidden"  # the API server refused a list/watch: RBAC lacks a verb


_DNS_BAD = re.compile(r"[^a-z0-9-]+")


def incident_name(node: str, trigger_key: str) -> str:
    """Deterministic NodeRemediation name for a signal: a replayed signal maps to the same
    name, so creating it twice is a 409, never a second incident."""
    digest = hashlib.sha256(f"{node}\0{trigger_key}".encode()).hexdigest()[:8]
    base = _DNS_BAD.sub("-", node.lower()).strip("-")[:49].strip("-") or "node"
    return f"nrem-{base}-{digest}"
