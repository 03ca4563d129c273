"""RemediationPolicy: which nodes, which signals, what to do, and the safety limits."""

from __future__ import annotations

import datetime as dt
import enum
import re
import urllib.parse
from typing import Annotated, Any, Literal

from pydantic import BaseModel as PydanticModel
from pydantic import ConfigDict, Field, model_validator

from gpuheal.api.devicequarantine import QuarantineDeviceOptions
from gpuheal.api.domains import DOMAINS_DESCRIPTION, FaultDomain
from gpuheal.api.meta import (
    CONDITION_TYPE_PATTERN,
    DNS_LABEL_PATTERN,
    DNS_SUBDOMAIN_PATTERN,
    LABEL_KEY_PATTERN,
    MAX_LABEL_KEY,
    MAX_LABEL_VALUE,
    MAX_MESSAGE,
    MAX_NAME,
    Condition,
    ConditionStatus,
    CrdInfo,
    DnsLabel,
    Duration,
    DurationRange,
    IntOrPercent,
    LabelKey,
    LabelSelector,
    Model,
    ObjectRef,
    PositiveDuration,
    Resource,
    Status,
    cel,
    cel_int,
    cel_str,
    check,
    column,
    condition_column,
    conditions_field,
    duration_ok,
    list_of,
    parse_duration,
)
from gpuheal.api.names import OPT_OUT_LABEL
from gpuheal.api.policylint import SPEC_CHECKS, check_spec
from gpuheal.xid.catalogue import CATALOGUE
from gpuheal.xid.types import FirstSight, RecoveryAction, XidClass
from gpuheal_bridge.api.names import CATCHABLE_SIGNALS


class Action(enum.StrEnum):
    """One rung step. Order inside a rung is the order of execution."""

    ALERT = "alert"  # Event + condition only, nothing disruptive
    CORDON = "cordon"
    SLURM_DRAIN = "slurmDrain"
    CHECKPOINT = "checkpoint"  # ask the node's Slurm jobs to checkpoint now; they keep running
    QUARANTINE_DEVICE = "quarantineDevice"  # one GPU out through a DRA DeviceTaintRule
    DRAIN = "drain"
    RESET = "reset"
    REBOOT = "reboot"
    REPLACE = "replace"
    RETIRE = "retire"  # keep the node out for good (hardware inspection / RMA)


# A checkpoint signal leaves the node and its jobs where they are: like an alert, it takes
# no slot of the safety limits and leaves nothing to undo.
DISRUPTIVE_ACTIONS = frozenset(a for a in Action if a not in (Action.ALERT, Action.CHECKPOINT))


class RequeueMode(enum.StrEnum):
    NONE = "none"
    REQUEUE = "requeue"
    REQUEUE_HOLD = "requeueHold"


class PinnedJobs(enum.StrEnum):
    RELEASE_NODE = "ReleaseNode"  # drop the faulty node from the job's --nodelist
    HOLD = "Hold"  # requeue held, as submitted: a person decides


class StuckJobAction(enum.StrEnum):
    DOWN_NODE = "DownNode"  # State=DOWN: Slurm releases the job (requeued, runs elsewhere)
    REPORT = "Report"  # only say so (the job waits until Slurm's UnkillableStepTimeout)


class DrainTimeoutAction(enum.StrEnum):
    ALERT = "Alert"  # stop, leave the node cordoned, say why
    FORCE = "Force"  # delete the remaining pods without the Eviction API


class HookType(enum.StrEnum):
    NOOP = "Noop"
    JOB = "Job"
    WEBHOOK = "Webhook"
    SLURM = "Slurm"  # reboot only: `scontrol reboot` through the Slurm bridge


class CheckType(enum.StrEnum):
    """How a repaired node proves it is healthy before it returns (returnToService.check)."""

    NONE = "None"  # no check: healthyFor alone
    JOB = "Job"  # a Job on the node (a DCGM diagnostic, an nvidia-smi query): its exit code
    WEBHOOK = "Webhook"  # an HTTP checker: 2xx passed, 4xx failed
    NODE_CONDITION = "NodeCondition"  # a node condition an external checker sets
    NODE_LABEL = "NodeLabel"  # a node label an external checker sets


class NotifyFormat(enum.StrEnum):
    GENERIC = "Generic"  # one JSON object per message (gpuheal's fields)
    SLACK = "Slack"  # {"text": ...}: Slack incoming webhooks and compatible (Mattermost, ...)


class NotifyEvent(enum.StrEnum):
    """An incident's transitions people are told about."""

    OPENED = "Opened"
    BLOCKED = "Blocked"  # held back, with why (breaker, PDB, bridge unavailable, ...)
    APPROVAL_PENDING = "ApprovalPending"  # a person must approve the next step
    COMPLETED = "Completed"  # replaced, returned, remediated, dry run done
    FAILED = "Failed"  # a step failed for good; the node stays as it is
    DOMAIN_OPENED = "DomainOpened"  # faults on several nodes of one domain (spec.domains)


class EscalationScope(enum.StrEnum):
    GPU = "Gpu"  # count occurrences per GPU (PCI id or UUID)
    NODE = "Node"


CONDITION_STATUS_MESSAGE = (
    "say which status of the condition signals trouble (status: True, False or Unknown, "
    "e.g. Ready with status False): there is no default"
)
CONDITION_TYPE_MESSAGE = (
    "type must name a node condition such as Ready or GpuXid: letters, digits, '-', '_' "
    "or '.', starting and ending with a letter or digit"
)
# Conditions every kubelet reports, and the status that means healthy.
_HEALTHY_STATUS = {
    "Ready": "True",
    "MemoryPressure": "False",
    "DiskPressure": "False",
    "PIDPressure": "False",
    "NetworkUnavailable": "False",
}
_FOR_RANGE = DurationRange(
    "for", "24h", "a node unhealthy for a day needs a person, not a timer that fires later"
)
_CONDITION_RULES = (
    check("has(self.status)", CONDITION_STATUS_MESSAGE),
    check(
        f"self.type.matches(r'{CONDITION_TYPE_PATTERN}')",
        CONDITION_TYPE_MESSAGE,
        field_path=".type",
    ),
    check(
        f"!has(self.status) || !(self.type in {_HEALTHY_STATUS}) || "
        f"{_HEALTHY_STATUS}[self.type] != self.status",
        message_expression="self.type + ' with status ' + self.status + ' is a healthy node: "
        "watch the status that means trouble (' + (self.type == 'Ready' ? 'False or Unknown' "
        ": 'True') + ')'",
    ),
    _FOR_RANGE.cel(),
)


def _healthy_status_message(type_: str, status: str) -> str:
    trouble = "False or Unknown" if type_ == "Ready" else "True"
    return (
        f"{type_} with status {status} is a healthy node: "
        f"watch the status that means trouble ({trouble})"
    )


_CONDITION_TYPE_RE = re.compile(CONDITION_TYPE_PATTERN)


class ConditionSignal(Model):
    """A node condition that signals trouble when it holds `status` for at least `for`."""

    model_config = ConfigDict(json_schema_extra=cel(*_CONDITION_RULES))

    type: str = Field(
        max_length=316,
        description="Node condition type to watch (e.g. Ready, or a node-problem-detector "
        "condition such as GpuXidError).",
    )
    status: ConditionStatus = Field(
        default=ConditionStatus.TRUE,
        description="The condition status that signals trouble: True, False or Unknown "
        "(e.g. Ready with status False). Required: which status is trouble depends on the "
        "condition.",
    )
    for_: Duration = Field(
        default="0s",
        description="How long the condition must hold that status before the rule fires "
        "(a Go duration such as 5m, at most 24h; 0s: at once).",
    )

    @model_validator(mode="after")
    def _mirror_cel(self) -> ConditionSignal:
        if "status" not in self.model_fields_set:
            raise ValueError(CONDITION_STATUS_MESSAGE)
        if not _CONDITION_TYPE_RE.match(self.type):
            raise ValueError(CONDITION_TYPE_MESSAGE)
        if _HEALTHY_STATUS.get(self.type) == self.status.value:
            raise ValueError(_healthy_status_message(self.type, self.status.value))
        _FOR_RANGE.check(self.for_)
        return self


_EMPTY_MESSAGE_CONTAINS = (
    "messageContains is empty, and every message contains the empty text: omit it to match "
    "every Event with this reason"
)


class EventSignal(Model):
    """A Kubernetes Event on the Node, matched by reason (and optionally a message part)."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            check(
                "!has(self.messageContains) || size(self.messageContains) > 0",
                _EMPTY_MESSAGE_CONTAINS,
                field_path=".messageContains",
            )
        )
    )

    reason: str = Field(
        max_length=128,
        min_length=1,
        description="The Event's reason, matched exactly (e.g. the reason node-problem-detector "
        "or your DCGM tooling uses for XID Events).",
    )
    message_contains: str | None = Field(
        default=None,
        max_length=256,
        description="Optional: the Event's message must also contain this text (case-sensitive).",
    )

    @model_validator(mode="after")
    def _mirror_cel(self) -> EventSignal:
        if self.message_contains == "":
            raise ValueError(_EMPTY_MESSAGE_CONTAINS)
        return self


def _twice(field: str, value: str, same: str, what: str) -> str:
    """CEL: a message for each item of list `field` listed more than once (`same(a, b)`)."""
    return (
        f"(has(self.{field}) ? self.{field}.map({value}, "
        f"self.{field}.filter(b, {same}).size() > 1, {what}) : [])"
    )


_TWICE = " + ".join(
    (
        _twice("xids", "a", "b == a", f"'xids lists XID ' + {cel_int('a')} + ' more than once'"),
        _twice("xidClasses", "a", "b == a", "'xidClasses lists ' + a + ' more than once'"),
        _twice(
            "recoveryActions", "a", "b == a", "'recoveryActions lists ' + a + ' more than once'"
        ),
        _twice(
            "conditions",
            "a",
            "b.type == a.type && has(a.status) && has(b.status) && b.status == a.status",
            "'conditions lists ' + a.type + ' with status ' + a.status + ' more than once: "
            "one rule waits once per condition and status'",
        ),
        _twice(
            "events",
            "a",
            "b.reason == a.reason && has(a.messageContains) == has(b.messageContains) && "
            "(!has(a.messageContains) || a.messageContains == b.messageContains)",
            "'events lists reason ' + a.reason + ' more than once'",
        ),
    )
)
_ONLY_154_HEAD = "recoveryActions make the rule match XID 154 with one of those actions only, so "
_ONLY_154_TAIL = " listed here would never match: move it to a rule of its own"
_SIGNAL_RULES = (
    (
        "(has(self.xids) ? size(self.xids) : 0) + "
        "(has(self.xidClasses) ? size(self.xidClasses) : 0) + "
        "(has(self.conditions) ? size(self.conditions) : 0) + "
        "(has(self.events) ? size(self.events) : 0) > 0",
        "signals must name at least one of xids, xidClasses, conditions or events",
    ),
    (
        "!has(self.recoveryActions) || size(self.recoveryActions) == 0 || "
        "(has(self.xids) && 154 in self.xids) || "
        "(has(self.xidClasses) && 'RecoveryAction' in self.xidClasses)",
        "recoveryActions only apply to XID 154: add 154 to xids",
    ),
)
_SIGNAL_CHECKS = (
    check(
        "!has(self.recoveryActions) || size(self.recoveryActions) == 0 || "
        "((!has(self.xids) || self.xids.all(x, x == 154)) && "
        "(!has(self.xidClasses) || self.xidClasses.all(c, c == 'RecoveryAction')))",
        message_expression=cel_str(_ONLY_154_HEAD)
        + " + (has(self.xids) && self.xids.exists(x, x != 154) ? "
        f"'XID ' + {cel_int('self.xids.filter(x, x != 154)[0]')} : "
        "'class ' + self.xidClasses.filter(c, c != 'RecoveryAction')[0]) + "
        + cel_str(_ONLY_154_TAIL),
    ),
    check(f"size({_TWICE}) == 0", message_expression=f"({_TWICE})[0]"),
)


class SignalSelector(Model):
    """Which signals trigger a rule. Any one matching signal triggers it."""

    model_config = ConfigDict(json_schema_extra=cel(*_SIGNAL_RULES, *_SIGNAL_CHECKS))

    xids: list[Annotated[int, Field(ge=1, le=65535)]] = list_of(
        16,
        "NVIDIA XID codes that trigger the rule (e.g. [79] for a GPU that fell off "
        "the bus); `gpuheal xid explain <code>` prints the catalogue entry of each.",
    )
    xid_classes: list[XidClass] = list_of(
        16,
        "XID classes of gpuheal's catalogue: every XID whose class is listed "
        "triggers the rule (the catalogue default; explicit xids are tried the same way).",
    )
    recovery_actions: list[RecoveryAction] = list_of(
        8,
        "For XID 154 only: the rule matches only when the driver states one of "
        "these recovery actions (needs 154 in xids or RecoveryAction in xidClasses).",
    )
    conditions: list[ConditionSignal] = list_of(
        16, "Node conditions that trigger the rule when they hold a status long enough."
    )
    events: list[EventSignal] = list_of(
        16, "Kubernetes Events on the Node that trigger the rule (matched by reason)."
    )

    @model_validator(mode="after")
    def _mirror_cel(self) -> SignalSelector:
        if not (self.xids or self.xid_classes or self.conditions or self.events):
            raise ValueError(_SIGNAL_RULES[0][1])
        if (
            self.recovery_actions
            and 154 not in self.xids
            and XidClass.RECOVERY_ACTION not in self.xid_classes
        ):
            raise ValueError(_SIGNAL_RULES[1][1])
        if self.recovery_actions:
            other = [f"XID {x}" for x in self.xids if x != 154] + [
                f"class {c.value}" for c in self.xid_classes if c is not XidClass.RECOVERY_ACTION
            ]
            if other:
                raise ValueError(_ONLY_154_HEAD + other[0] + _ONLY_154_TAIL)
        twice = self._twice()
        if twice:
            raise ValueError(twice[0])
        return self

    def _twice(self) -> list[str]:
        """The mirror of `_TWICE`, in the same order."""

        def many(items: list[Any], same: Any) -> list[Any]:
            return [a for a in items if sum(1 for b in items if same(a, b)) > 1]

        eq = lambda a, b: a == b  # noqa: E731
        return [
            *(f"xids lists XID {a} more than once" for a in many(self.xids, eq)),
            *(f"xidClasses lists {a.value} more than once" for a in many(self.xid_classes, eq)),
            *(
                f"recoveryActions lists {a.value} more than once"
                for a in many(self.recovery_actions, eq)
            ),
            *(
                f"conditions lists {a.type} with status {a.status.value} more than once: "
                "one rule waits once per condition and status"
                for a in many(
                    self.conditions, lambda a, b: (a.type, a.status) == (b.type, b.status)
                )
            ),
            *(
                f"events lists reason {a.reason} more than once"
                for a in many(
                    self.events,
                    lambda a, b: (a.reason, a.message_contains) == (b.reason, b.message_contains),
                )
            ),
        ]


# The signals the Slurm bridge sends, by name (its numbers are for callers of the bridge's
# API; a policy names them): a job can catch each of them and checkpoint. KILL and STOP
# cannot be caught. One list, the bridge's own, so the two never disagree.
CHECKPOINT_SIGNALS = CATCHABLE_SIGNALS
_UNCATCHABLE = ("KILL", "SIGKILL", "STOP", "SIGSTOP", "9", "19")
_CHECKPOINT_PATTERN = f"^(SIG)?({'|'.join(CHECKPOINT_SIGNALS)})$"
UNCATCHABLE_MESSAGE = (
    "checkpointSignal {signal}: KILL and STOP (9, 19) cannot be caught, so the job dies or "
    "freezes without a checkpoint; use USR1, USR2 or TERM"
)
CHECKPOINT_SIGNAL_MESSAGE = (
    "checkpointSignal must name a signal a job can catch: "
    + ", ".join(CHECKPOINT_SIGNALS)
    + " (SIG prefix optional; numbers differ between systems, use the name)"
)
CHECKPOINT_WITHOUT_REQUEUE = (
    "checkpointSignal is sent only before a requeue, and requeue is none: set requeue to "
    "requeue or requeueHold, or drop checkpointSignal"
)
NODE_DOWN_WITH_CHECKPOINT = (
    "nodeDown takes the jobs off at once (their GPU is lost, nothing can be saved), so no "
    "checkpointSignal is sent: drop checkpointSignal, or nodeDown for a fault the job survives"
)
NODE_DOWN_WITHOUT_REQUEUE = (
    "nodeDown requeues the node's jobs (Slurm requeues them as NODE_FAIL), and requeue is "
    "none: set requeue to requeue, or drop nodeDown"
)
_GRACE_RANGE = DurationRange(
    "gracePeriod", "10m", "the Slurm bridge waits at most 10 minutes for a checkpoint"
)
_SLURM_DRAIN_RULES = (
    check(
        f"!has(self.checkpointSignal) || !(self.checkpointSignal in {list(_UNCATCHABLE)})",
        message_expression=cel_str("checkpointSignal ")
        + " + self.checkpointSignal + "
        + cel_str(UNCATCHABLE_MESSAGE.removeprefix("checkpointSignal {signal}")),
        field_path=".checkpointSignal",
    ),
    check(
        f"!has(self.checkpointSignal) || self.checkpointSignal in {list(_UNCATCHABLE)} || "
        f"self.checkpointSignal.matches('{_CHECKPOINT_PATTERN}')",
        CHECKPOINT_SIGNAL_MESSAGE,
        field_path=".checkpointSignal",
    ),
    check(
        "!has(self.checkpointSignal) || !has(self.requeue) || self.requeue != 'none'",
        CHECKPOINT_WITHOUT_REQUEUE,
    ),
    check(
        "!has(self.nodeDown) || !self.nodeDown || !has(self.checkpointSignal)",
        NODE_DOWN_WITH_CHECKPOINT,
        field_path=".nodeDown",
    ),
    check(
        "!has(self.nodeDown) || !self.nodeDown || !has(self.requeue) || self.requeue != 'none'",
        NODE_DOWN_WITHOUT_REQUEUE,
        field_path=".nodeDown",
    ),
    _GRACE_RANGE.cel(),
)


class SlurmDrainOptions(Model):
    """How the Slurm node is drained through the bridge, and what happens to its jobs."""

    model_config = ConfigDict(json_schema_extra=cel(*_SLURM_DRAIN_RULES))

    requeue: RequeueMode = Field(
        default=RequeueMode.REQUEUE,
        description="What to do with the node's running jobs: requeue (back in the queue, "
        "excluding this node), requeueHold (requeued but held for a person), or none (leave "
        "them running).",
    )
    checkpoint_signal: str | None = Field(
        default=None,
        max_length=16,
        description="Signal sent to the jobs before the requeue so they can checkpoint "
        "(e.g. USR1; one the job can catch: USR1, USR2, TERM, INT, HUP, QUIT, CONT, URG, ALRM, "
        "PWR or XCPU, SIG prefix optional); none when omitted.",
    )
    grace_period: Duration = Field(
        default="60s",
        description="How long to wait after the checkpoint signal before the requeue "
        "(at most 10m).",
    )
    reason: str = Field(
        default="gpuheal",
        max_length=128,
        description="Not used today: the Slurm drain reason is always `gpuheal: <incident> "
        "xid=<N>`, which is how gpuheal recognises its own drains.",
    )
    failed_jobs_window: Duration = Field(
        default="3m",
        description="Batch jobs that ended on the node by failure (FAILED, NODE_FAIL: a "
        "process that died with its GPU) this long before the signal, or after it, are the "
        "fault's victims and are requeued like the running ones; completed, cancelled and "
        "timed-out jobs never are (failures up to twice as old are named in the status as "
        "too old). Slurm forgets an ended job MinJobAge after its end (300 s by default): a "
        "job that ended longer ago than that is out of reach whatever the window.",
    )
    pinned_jobs: PinnedJobs = Field(
        default=PinnedJobs.RELEASE_NODE,
        description="Jobs that name the node in their --nodelist (-w): ReleaseNode (drop it "
        "from the list; the job keeps the other nodes it named and its node count, Slurm "
        "picks the rest) or Hold (requeued held as submitted, with an Event: a person edits "
        "and releases it). Requeued with the node excluded but still required, such a job "
        "would wait forever (BadConstraints).",
    )
    stuck_job_timeout: Duration = Field(
        default="5s",
        description="After the requeue slurmd sends SIGTERM and, max(KillWait, 5s) later, "
        "SIGKILL; a job still holding the node this long after that has processes SIGKILL "
        "cannot end (stuck in the driver) and onStuckJob applies.",
    )
    on_stuck_job: StuckJobAction = Field(
        default=StuckJobAction.DOWN_NODE,
        description="DownNode: set the Slurm node DOWN (its drain reason kept), which makes "
        "Slurm release the job so it runs elsewhere; Report: only say so in status (Slurm "
        "drains the node itself after UnkillableStepTimeout).",
    )

    node_down: bool = Field(
        default=False,
        description="For faults where the GPU is lost (XID 79 fell off the bus, a driver that "
        "says only a reboot recovers it): nothing can be checkpointed and the job's processes "
        "may hang in the driver, never dying until the node reboots. The jobs are requeued and "
        "the Slurm node set DOWN at once (its drain and reason kept: it stays drained), so "
        "that Slurm releases them whatever their processes do; no checkpointSignal, no wait "
        "for KillWait and SIGKILL. Keep it false where the job can still save (XID 94).",
    )

    @model_validator(mode="after")
    def _mirror_cel(self) -> SlurmDrainOptions:
        signal = self.checkpoint_signal
        if signal is not None and signal in _UNCATCHABLE:
            raise ValueError(UNCATCHABLE_MESSAGE.format(signal=signal))
        if signal is not None and not re.match(_CHECKPOINT_PATTERN, signal):
            raise ValueError(CHECKPOINT_SIGNAL_MESSAGE)
        if signal is not None and self.requeue is RequeueMode.NONE:
            raise ValueError(CHECKPOINT_WITHOUT_REQUEUE)
        if self.node_down and signal is not None:
            raise ValueError(NODE_DOWN_WITH_CHECKPOINT)
        if self.node_down and self.requeue is RequeueMode.NONE:
            raise ValueError(NODE_DOWN_WITHOUT_REQUEUE)
        _GRACE_RANGE.check(self.grace_period)
        return self


_CHECKPOINT_RULES = (
    check(
        f"!(self.signal in {list(_UNCATCHABLE)})",
        message_expression=cel_str("signal ")
        + " + self.signal + "
        + cel_str(UNCATCHABLE_MESSAGE.removeprefix("checkpointSignal {signal}")),
        field_path=".signal",
    ),
    check(
        f"self.signal in {list(_UNCATCHABLE)} || self.signal.matches('{_CHECKPOINT_PATTERN}')",
        CHECKPOINT_SIGNAL_MESSAGE.replace("checkpointSignal", "signal", 1),
        field_path=".signal",
    ),
)


class CheckpointOptions(Model):
    """Ask the node's running Slurm jobs to checkpoint now: the signal alone, through the
    bridge (its signal scope), no requeue and no drain. Each job is signalled once per
    incident; the jobs keep running on the node."""

    model_config = ConfigDict(json_schema_extra=cel(*_CHECKPOINT_RULES))

    signal: str = Field(
        default="USR1",
        max_length=16,
        description="The signal the jobs checkpoint on (one they can catch: USR1, USR2, TERM, "
        "INT, HUP, QUIT, CONT, URG, ALRM, PWR or XCPU, SIG prefix optional). A job that does "
        "not catch it dies of it (USR1's default action ends the process): name the one your "
        "jobs trap.",
    )

    @model_validator(mode="after")
    def _mirror_cel(self) -> CheckpointOptions:
        if self.signal in _UNCATCHABLE:
            raise ValueError(
                UNCATCHABLE_MESSAGE.format(signal=self.signal).replace(
                    "checkpointSignal", "signal", 1
                )
            )
        if not re.match(_CHECKPOINT_PATTERN, self.signal):
            raise ValueError(CHECKPOINT_SIGNAL_MESSAGE.replace("checkpointSignal", "signal", 1))
        return self


_DRAIN_RANGES = (
    DurationRange("timeout", "24h", "a drain still blocked after a day needs a person"),
    DurationRange("gracePeriod", "1h", "pods that need longer to stop should say so themselves"),
)


class DrainOptions(Model):
    """Evicting the node's pods through the Eviction API (PodDisruptionBudgets honoured)."""

    model_config = ConfigDict(json_schema_extra=cel(*(r.cel() for r in _DRAIN_RANGES)))

    timeout: PositiveDuration = Field(
        default="10m",
        description="How long to keep evicting (PDBs may refuse) before onTimeout applies.",
    )
    grace_period: Duration | None = Field(
        default=None,
        description="Overrides the pods' terminationGracePeriodSeconds; the pods' own value "
        "when omitted.",
    )
    on_timeout: DrainTimeoutAction = Field(
        default=DrainTimeoutAction.ALERT,
        description="After the timeout, with pods left: Alert (stop, leave the node cordoned, "
        "say why) or Force (delete the remaining pods without the Eviction API; the chart "
        "grants that only with rbac.forceDrain=true).",
    )

    @model_validator(mode="after")
    def _mirror_cel(self) -> DrainOptions:
        _DRAIN_RANGES[0].check(self.timeout)
        _DRAIN_RANGES[1].check(self.grace_period)
        return self


def _ref_name(kind: str) -> Any:
    """The name of the ConfigMap or Secret a ref points at."""
    return Field(
        max_length=MAX_NAME, pattern=DNS_SUBDOMAIN_PATTERN, description=f"The {kind}'s name."
    )


def _data_key(holds: str) -> Any:
    """A key of a ConfigMap's or Secret's data (Kubernetes' own limits on one)."""
    return Field(
        max_length=253, pattern=r"^[-._a-zA-Z0-9]+$", description=f"The key whose value is {holds}."
    )


class ConfigMapKeyRef(Model):
    """A key of a ConfigMap in the Job's namespace."""

    name: str = _ref_name("ConfigMap")
    key: str = _data_key("the JobSpec (YAML)")


_JOB_RULES = (
    (
        "has(self.template) != has(self.templateFrom)",
        "a Job hook needs exactly one of template or templateFrom",
    ),
)


class JobHook(Model):
    """A Kubernetes Job on the node (a reset, a reboot, or a check)."""

    model_config = ConfigDict(json_schema_extra=cel(*_JOB_RULES))

    namespace: DnsLabel | None = Field(
        default=None,
        description="Namespace the Job is created in; omitted: the operator's "
        "--node-jobs-namespace (the chart's <release>-node-jobs, where its admission policy "
        "admits only the chart's node Jobs). The chart grants Job rights elsewhere only in "
        "rbac.jobHookNamespaces.",
    )
    template: dict[str, Any] | None = Field(
        default=None,
        description="A batch/v1 JobSpec; gpuheal adds NODE_NAME, GPUHEAL_ACTION and "
        "GPUHEAL_INCIDENT to every container's environment. Runs only where the operator "
        "allows inline templates (--inline-job-templates, chart nodeJobs.inlineTemplates, off "
        "by default): otherwise a reset or reboot with one is skipped and a check fails, "
        "no Job created.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True, "type": "object"},
    )
    template_from: ConfigMapKeyRef | None = Field(
        default=None,
        description="Read the JobSpec from a ConfigMap key in the Job's namespace instead (the "
        "chart ships gpuheal-node-jobs with gpu-reset, node-reboot and gpu-check).",
    )
    run_on_node: bool = Field(
        default=True,
        description="Pin the Job's pod to the node (spec.nodeName, tolerating every taint); "
        "false for a Job that acts from elsewhere (e.g. through the BMC).",
    )

    @model_validator(mode="after")
    def _mirror_cel(self) -> JobHook:
        if (self.template is None) == (self.template_from is None):
            raise ValueError(_JOB_RULES[0][1])
        return self


WEBHOOK_URL_MESSAGE = (
    "url must be an http:// or https:// URL with a host, e.g. https://bmc-gateway.example/reboot"
)
_WEBHOOK_TIMEOUT = DurationRange(
    "timeout", "10m", "a webhook that takes longer should answer 202 at once"
)


def webhook_url_ok(url: str) -> bool:
    """The mirror of the CEL url check: http(s), a host."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


class WebhookHook(Model):
    """An HTTP endpoint (e.g. your BMC or fleet tooling) that carries out the reset or reboot."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            check(
                "isURL(self.url) && url(self.url).getScheme() in ['http', 'https'] && "
                "url(self.url).getHostname() != ''",
                WEBHOOK_URL_MESSAGE,
                field_path=".url",
            ),
            _WEBHOOK_TIMEOUT.cel(),
        )
    )

    url: str = Field(
        max_length=2048,
        description="URL gpuheal POSTs {action, node, incident, xid} to, with the header "
        "Idempotency-Key: <incident>-<action>; any 2xx is success.",
    )
    timeout: PositiveDuration = Field(
        default="30s", description="How long one call may take before it counts as failed."
    )

    @model_validator(mode="after")
    def _mirror_cel(self) -> WebhookHook:
        if not webhook_url_ok(self.url):
            raise ValueError(WEBHOOK_URL_MESSAGE)
        _WEBHOOK_TIMEOUT.check(self.timeout)
        return self


class SecretKeyRef(Model):
    """A key of a Secret in the operator's own namespace (its ``--namespace``; the chart's
    release namespace), which the operator must be allowed to ``get`` (the chart's
    ``notifications.policySecrets``)."""

    name: str = _ref_name("Secret")
    key: str = _data_key("the webhook URL")


_NOTIFY_RULES = (
    (
        "has(self.url) != has(self.secretRef)",
        "a notification webhook needs exactly one of url and secretRef",
    ),
)


class NotifyWebhook(Model):
    """A receiver of incident notifications: its URL written here or read from a Secret."""

    model_config = ConfigDict(json_schema_extra=cel(*_NOTIFY_RULES))

    url: str | None = Field(
        default=None,
        max_length=2048,
        pattern=r"^https?://",
        description="URL gpuheal POSTs each message to (JSON). Readable by whoever can read "
        "this policy: use secretRef for URLs that carry a secret, such as Slack's.",
    )
    secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="Read the URL from this key of a Secret in the operator's namespace "
        "instead, at each send (a changed Secret counts from the next message). The URL is "
        "never logged nor written into a status or an Event.",
    )
    format: NotifyFormat = Field(
        default=NotifyFormat.GENERIC,
        description="Generic: a JSON object with the event, incident, node, reason, message; "
        "Slack: {text} as Slack incoming webhooks (and compatible ones) expect.",
    )
    events: list[NotifyEvent] = list_of(
        6,
        "Which transitions to send (Opened, Blocked, ApprovalPending, Completed, Failed, "
        "DomainOpened); empty: all of them.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )

    @model_validator(mode="after")
    def _mirror_cel(self) -> NotifyWebhook:
        if (self.url is None) == (self.secret_ref is None):
            raise ValueError(_NOTIFY_RULES[0][1])
        return self


class Notifications(Model):
    """Who is told when this policy's incidents open, block, wait for approval, end or fail.
    Sent in the background: a slow or dead receiver never holds a remediation up."""

    webhooks: list[NotifyWebhook] = Field(
        min_length=1, max_length=8, description="Receivers, each with its format and events."
    )


class HookSpec(Model):
    """How a reset or reboot is carried out: a Job, a webhook, or nothing (sandbox)."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            (
                "(self.type == 'Job') == has(self.job) && "
                "(self.type == 'Webhook') == has(self.webhook)",
                "hook.job is required exactly when type is Job, "
                "hook.webhook exactly when type is Webhook",
            )
        )
    )

    type: HookType = Field(
        description="Job (a Kubernetes Job), Webhook (an HTTP call), Slurm (reboot only: "
        "`scontrol reboot` through the Slurm bridge) or Noop (nothing: for sandboxes and "
        "tests). Success is verified, never taken from an exit code or a 2xx: a reboot "
        "must change the node's boot ID (node.status.nodeInfo.bootID) or Slurm's boot "
        "time, a reset must leave every GPU allocatable."
    )
    job: JobHook | None = Field(default=None, description="Required when type is Job.")
    webhook: WebhookHook | None = Field(default=None, description="Required when type is Webhook.")

    @model_validator(mode="after")
    def _mirror_cel(self) -> HookSpec:
        if (self.type is HookType.JOB) != (self.job is not None) or (
            self.type is HookType.WEBHOOK
        ) != (self.webhook is not None):
            raise ValueError(
                "hook.job is required exactly when type is Job, "
                "hook.webhook exactly when type is Webhook"
            )
        return self


_HOOK_TIMEOUT = DurationRange("timeout", "24h", "a hook still running after a day has failed")


class ResetOptions(Model):
    """A GPU reset (e.g. nvidia-smi -r) carried out by a hook."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            ("self.hook.type != 'Slurm'", "Slurm can reboot a node, not reset a GPU"),
            _HOOK_TIMEOUT.cel(),
        )
    )

    hook: HookSpec = Field(description="How the reset is carried out.")
    when_idle: bool = Field(
        default=True,
        description="Wait until no Slurm job and no pod a drain would evict (not a "
        "DaemonSet's, not a mirror pod) is on the node before the reset; false resets at "
        "once, under whatever runs there.",
    )
    timeout: PositiveDuration = Field(
        default="10m",
        description="How long the hook and the proof (below) may take before the step fails.",
    )
    settle: PositiveDuration = Field(
        default="1m",
        description="The proof of a reset: gpuheal agent reports every GPU again after it "
        "(same UUID at each PCI address, the count back), and no XID follows for this long.",
    )

    @model_validator(mode="after")
    def _mirror_cel(self) -> ResetOptions:
        if self.hook.type is HookType.SLURM:
            raise ValueError("Slurm can reboot a node, not reset a GPU")
        _HOOK_TIMEOUT.check(self.timeout)
        return self


class RebootOptions(Model):
    """A node reboot or power-cycle carried out by a hook."""

    model_config = ConfigDict(json_schema_extra=cel(_HOOK_TIMEOUT.cel()))

    hook: HookSpec = Field(description="How the reboot is carried out.")
    power_cycle: bool = Field(
        default=False,
        description="Ask the hook for a cold power cycle (through the node's BMC: Redfish, "
        'IPMI) instead of a warm reboot: a Webhook\'s request carries "powerCycle": true, '
        "a Job's containers get GPUHEAL_POWER_CYCLE=true. The hook must power-cycle or fail "
        "(4xx, a failed Job), never reboot warm instead; the chart's node-reboot Job cannot "
        "and fails. Ignored with a Slurm or Noop hook (neither can power-cycle; the "
        "policy's status warns), and then not recorded.",
    )
    timeout: PositiveDuration = Field(
        default="20m", description="How long the hook may take before the step fails."
    )
    when_idle: bool = Field(
        default=True,
        description="Wait until no Slurm job and no pod a drain would evict is on the node "
        "before the reboot; false reboots at once (e.g. to clear a process the driver keeps "
        "from ending).",
    )

    @model_validator(mode="after")
    def _mirror_cel(self) -> RebootOptions:
        _HOOK_TIMEOUT.check(self.timeout)
        return self

    @property
    def asks_power_cycle(self) -> bool:
        """A power cycle is asked of the hook: only a Job or Webhook can carry the ask."""
        return self.power_cycle and self.hook.type in (HookType.JOB, HookType.WEBHOOK)


class ReplaceOptions(Model):
    """Bring a spare node from a ReservePool into service in place of this one."""

    reserve_pool_ref: ObjectRef = Field(description="The ReservePool to take the spare from.")


_STEP_RULES = (
    (
        "(!has(self.cordon) || self.action == 'cordon') && "
        "(!has(self.slurmDrain) || self.action == 'slurmDrain') && "
        "(!has(self.checkpoint) || self.action == 'checkpoint') && "
        "(!has(self.quarantineDevice) || self.action == 'quarantineDevice') && "
        "(!has(self.drain) || self.action == 'drain') && "
        "(!has(self.reset) || self.action == 'reset') && "
        "(!has(self.reboot) || self.action == 'reboot') && "
        "(!has(self.replace) || self.action == 'replace')",
        "a step may only carry the options block of its own action",
    ),
    (
        "(self.action != 'reset' || has(self.reset)) && "
        "(self.action != 'reboot' || has(self.reboot)) && "
        "(self.action != 'replace' || has(self.replace))",
        "reset and reboot steps need a hook, replace steps a reservePoolRef",
    ),
)


class CordonTaint(enum.StrEnum):
    NO_SCHEDULE = "NoSchedule"
    NO_EXECUTE = "NoExecute"


class CordonOptions(Model):
    """How gpuheal cordons: the bare `spec.unschedulable`, or with a taint in the same write."""

    taint: CordonTaint | None = Field(
        default=None,
        description="Also taint the node gpuheal.io/unhealthy=<incident> with this effect, in "
        "the cordon's own write, and remove it when gpuheal uncordons. NoExecute is what "
        "taint-driven controllers react to (Kueue's node hot swap replaces a node only on an "
        "untolerated NoExecute taint); kube-controller-manager then evicts at once every pod "
        "that does not tolerate it, without PodDisruptionBudgets (a drain step evicts through "
        "the Eviction API and respects them). NoSchedule also keeps out pods that tolerate "
        "unschedulable nodes. Omitted: cordon only. A node someone else cordoned is left "
        "untainted.",
    )


class Step(Model):
    """One action of a rung, with the options of that action only."""

    model_config = ConfigDict(json_schema_extra=cel(*_STEP_RULES))

    action: Action = Field(
        description="alert (Event and condition only), cordon, slurmDrain (drain the Slurm "
        "node and requeue its jobs through the bridge), checkpoint (signal the node's running "
        "Slurm jobs to checkpoint now, through the bridge: no requeue, no drain, the jobs "
        "keep running), quarantineDevice (taint the one GPU the XID names through a DRA "
        "DeviceTaintRule: the node and its other GPUs stay in service), drain (evict the "
        "pods), reset (GPU "
        "reset), reboot, replace (take a spare from a ReservePool), or retire (keep the "
        "node out for good: label gpuheal.io/retired, never returned or put in a pool)."
    )
    cordon: CordonOptions | None = Field(
        default=None, description="Options of a cordon step (cordon only when omitted)."
    )
    slurm_drain: SlurmDrainOptions | None = Field(
        default=None, description="Options of a slurmDrain step (defaults when omitted)."
    )
    checkpoint: CheckpointOptions | None = Field(
        default=None, description="Options of a checkpoint step (USR1 when omitted)."
    )
    quarantine_device: QuarantineDeviceOptions | None = Field(
        default=None,
        description="Options of a quarantineDevice step (NoExecute, driver gpu.nvidia.com "
        "when omitted).",
    )
    drain: DrainOptions | None = Field(
        default=None, description="Options of a drain step (defaults when omitted)."
    )
    reset: ResetOptions | None = Field(
        default=None, description="Options of a reset step (required: its hook)."
    )
    reboot: RebootOptions | None = Field(
        default=None, description="Options of a reboot step (required: its hook)."
    )
    replace: ReplaceOptions | None = Field(
        default=None, description="Options of a replace step (required: reservePoolRef)."
    )

    @model_validator(mode="after")
    def _mirror_cel(self) -> Step:
        blocks = {
            Action.CORDON: self.cordon,
            Action.SLURM_DRAIN: self.slurm_drain,
            Action.CHECKPOINT: self.checkpoint,
            Action.QUARANTINE_DEVICE: self.quarantine_device,
            Action.DRAIN: self.drain,
            Action.RESET: self.reset,
            Action.REBOOT: self.reboot,
            Action.REPLACE: self.replace,
        }
        for action, block in blocks.items():
            if block is not None and action is not self.action:
                raise ValueError(_STEP_RULES[0][1])
        needs_options = {Action.RESET, Action.REBOOT, Action.REPLACE}
        if self.action in needs_options and blocks[self.action] is None:
            raise ValueError(_STEP_RULES[1][1])
        return self

    def slurm_drain_options(self) -> SlurmDrainOptions:
        return self.slurm_drain or SlurmDrainOptions()

    def drain_options(self) -> DrainOptions:
        return self.drain or DrainOptions()

    def checkpoint_options(self) -> CheckpointOptions:
        return self.checkpoint or CheckpointOptions()

    def quarantine_device_options(self) -> QuarantineDeviceOptions:
        return self.quarantine_device or QuarantineDeviceOptions()


_ACTION_TWICE = (
    "self.steps.map(s, self.steps.filter(t, t.action == s.action).size() > 1, "
    "'rung ' + self.name + ' lists ' + s.action + ' more than once: an incident runs "
    "each action once, so the second would never run')"
)


class Rung(Model):
    """One level of the ladder: the steps run, in order, when the rule is at this level."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            check(f"size({_ACTION_TWICE}) == 0", message_expression=f"{_ACTION_TWICE}[0]")
        )
    )

    name: DnsLabel = Field(
        description="Name of the rung (shown in incidents and Events), e.g. power-cycle.",
    )
    steps: list[Step] = Field(
        min_length=1, max_length=8, description="The steps of this rung, run in this order."
    )

    @model_validator(mode="after")
    def _mirror_cel(self) -> Rung:
        actions = [s.action for s in self.steps]
        twice = [a for a in actions if actions.count(a) > 1]
        if twice:
            raise ValueError(
                f"rung {self.name} lists {twice[0].value} more than once: an incident runs "
                "each action once, so the second would never run"
            )
        return self


_WINDOW_RANGE = DurationRange("window", "720h", "gpuheal counts repeats over at most 30 days")


class Escalation(Model):
    """Every `occurrences` matching signals within `window` climb one rung."""

    model_config = ConfigDict(json_schema_extra=cel(_WINDOW_RANGE.cel()))

    occurrences: int = Field(
        default=3,
        ge=2,
        le=100,
        description="How many matching signals within the window climb one rung.",
    )
    window: PositiveDuration = Field(
        default="24h", description="The sliding window the occurrences are counted in."
    )
    scope: EscalationScope = Field(
        default=EscalationScope.GPU,
        description="Count occurrences per GPU (Gpu: the same PCI bus id or UUID) or per "
        "node (Node).",
    )

    @model_validator(mode="after")
    def _mirror_cel(self) -> Escalation:
        _WINDOW_RANGE.check(self.window)
        return self


# The catalogue's "never replace on first sight" XIDs (94, contained ECC) and the classes
# made of them only: a rule that names one must not replace on its first rung.
NO_REPLACE_XIDS = sorted(c for c, e in CATALOGUE.items() if e.first_sight is FirstSight.NO_REPLACE)
NO_REPLACE_CLASSES = sorted(
    c.value
    for c in XidClass
    if any(e.action_class is c for e in CATALOGUE.values())
    and all(
        e.first_sight is FirstSight.NO_REPLACE for e in CATALOGUE.values() if e.action_class is c
    )
)
_NO_REPLACE_MESSAGE = (
    "XID 94 (contained ECC error) must never replace on first sight: "
    "move replace (and retire) to a later rung"
)
_SAME_RUNGS = (
    "self.ladder.transformList(i, a, self.ladder.exists(j, b, j < i && b.steps == a.steps), "
    "'rungs ' + self.ladder.transformList(j, b, j < i && b.steps == a.steps, b.name)[0] + ' and ' "
    "+ a.name + ' of rule ' + self.name + ' have the same steps: climbing to ' + a.name + "
    "' would change nothing')"
)
_RUNG_TWICE = (
    "self.ladder.map(a, self.ladder.filter(b, b.name == a.name).size() > 1, "
    "'rule ' + self.name + ' has two rungs named ' + a.name + ': incidents record the rung by "
    "name, so names must be unique within a ladder')"
)
_RULE_RULES = (
    (
        f"!((has(self.signals.xids) && self.signals.xids.exists(x, x in {NO_REPLACE_XIDS})) || "
        f"(has(self.signals.xidClasses) && "
        f"self.signals.xidClasses.exists(c, c in {NO_REPLACE_CLASSES}))) || "
        "!self.ladder[0].steps.exists(s, s.action == 'replace' || s.action == 'retire')",
        _NO_REPLACE_MESSAGE,
    ),
    (
        "size(self.ladder) == 1 || has(self.escalation)",
        "a ladder with more than one rung needs escalation "
        "(occurrences within a window) to climb it",
    ),
)


def _as_written(step: Step) -> dict[str, Any]:
    """A step as its author wrote it (what CEL compares: defaults not filled in)."""
    return PydanticModel.model_dump(step, by_alias=True, exclude_unset=True, mode="json")


class Rule(Model):
    """Signals -> ladder. Rules are tried in order; the first rule a signal matches wins."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            *_RULE_RULES,
            check(f"size({_RUNG_TWICE}) == 0", message_expression=f"{_RUNG_TWICE}[0]"),
            check(f"size({_SAME_RUNGS}) == 0", message_expression=f"{_SAME_RUNGS}[0]"),
        )
    )

    name: DnsLabel = Field(
        description="Name of the rule, unique in the policy (recorded in each incident).",
    )
    signals: SignalSelector = Field(description="Which signals trigger this rule.")
    ladder: list[Rung] = Field(
        min_length=1,
        max_length=5,
        description="Rungs, least to most drastic: a first signal runs the first rung; "
        "escalation climbs to the next.",
    )
    escalation: Escalation | None = Field(
        default=None,
        description="When to climb the ladder; required when the ladder has more than one rung.",
    )

    @model_validator(mode="after")
    def _mirror_cel(self) -> Rule:
        no_replace = any(x in NO_REPLACE_XIDS for x in self.signals.xids) or any(
            c.value in NO_REPLACE_CLASSES for c in self.signals.xid_classes
        )
        if no_replace and any(
            s.action in (Action.REPLACE, Action.RETIRE) for s in self.ladder[0].steps
        ):
            raise ValueError(_RULE_RULES[0][1])
        if len(self.ladder) > 1 and self.escalation is None:
            raise ValueError(_RULE_RULES[1][1])
        names = [r.name for r in self.ladder]
        twice = [n for n in names if names.count(n) > 1]
        if twice:
            raise ValueError(
                f"rule {self.name} has two rungs named {twice[0]}: incidents record the rung "
                "by name, so names must be unique within a ladder"
            )
        written = [[_as_written(s) for s in r.steps] for r in self.ladder]
        for i, rung in enumerate(self.ladder):
            same = [self.ladder[j].name for j in range(i) if written[j] == written[i]]
            if same:
                raise ValueError(
                    f"rungs {same[0]} and {rung.name} of rule {self.name} have the same steps: "
                    f"climbing to {rung.name} would change nothing"
                )
        return self

    def escalation_or_default(self) -> Escalation:
        return self.escalation or Escalation()


_RATE_WINDOW = DurationRange("window", "168h", "gpuheal counts incident starts over at most 7 days")


class RateLimit(Model):
    """At most `remediations` incidents started per `window` under this policy."""

    model_config = ConfigDict(json_schema_extra=cel(_RATE_WINDOW.cel()))

    remediations: int = Field(
        ge=1, le=10000, description="Most incidents started per window under this policy."
    )
    window: PositiveDuration = Field(
        default="1h", description="The sliding window the limit is counted in."
    )

    @model_validator(mode="after")
    def _mirror_cel(self) -> RateLimit:
        _RATE_WINDOW.check(self.window)
        return self


_COOLDOWN_RANGE = DurationRange(
    "stormCooldown", "24h", "after a day, a storm's nodes are a person's job"
)
_SAFETY_RULES = (
    (
        "has(self.maxUnhealthy) != has(self.minHealthy)",
        "set exactly one of maxUnhealthy or minHealthy",
    ),
    _COOLDOWN_RANGE.cel(),
)


class Safety(Model):
    """Limits that hold whatever the signals say."""

    model_config = ConfigDict(json_schema_extra=cel(*_SAFETY_RULES))

    max_unhealthy: IntOrPercent | None = Field(
        default=None,
        description="Most selected nodes that may be unhealthy/remediated at once "
        "(count or percent, rounded down but at least 1 for a non-zero percent); beyond it "
        "the circuit breaker opens.",
    )
    min_healthy: IntOrPercent | None = Field(
        default=None,
        description="Fewest selected nodes that must stay healthy (count or percent, rounded "
        "up); the alternative to maxUnhealthy.",
    )
    rate_limit: RateLimit | None = Field(
        default=None,
        description="Most incidents started per window (none when omitted); more wait with "
        "Blocked=True, reason RateLimited.",
    )
    storm_cooldown: Duration = Field(
        default="15m",
        description="After the breaker closes, wait this long before starting new incidents.",
    )
    dry_run: bool = Field(
        default=False,
        description="Record the plan (NodeRemediations with Blocked=True, reason DryRun) and "
        "change nothing: start a new policy this way.",
    )
    paused: bool = Field(
        default=False, description="Start no new incident and continue none (a kill switch)."
    )
    opt_out_label: LabelKey = Field(
        default=OPT_OUT_LABEL,
        description="Nodes carrying this label (any value) are left alone by this policy.",
    )
    require_approval: list[Action] = list_of(
        8,
        "Actions that wait for the gpuheal.io/approve annotation on the "
        "NodeRemediation (typically [replace]).",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )

    @model_validator(mode="after")
    def _mirror_cel(self) -> Safety:
        if (self.max_unhealthy is None) == (self.min_healthy is None):
            raise ValueError(_SAFETY_RULES[0][1])
        _COOLDOWN_RANGE.check(self.storm_cooldown)
        return self


class NodeConditionCheck(Model):
    """A node condition an external checker (NHC, a DCGM health DaemonSet) sets."""

    type: str = Field(
        max_length=316,
        pattern=CONDITION_TYPE_PATTERN,
        description="The condition type, e.g. GpuHealthy.",
    )
    status: ConditionStatus = Field(
        default=ConditionStatus.TRUE,
        description="The status that means healthy; the opposite status (reported after the "
        "check started) means the check failed.",
    )


class NodeLabelCheck(Model):
    """A node label an external checker sets; gpuheal removes it when the check starts, so
    only a verdict given after that counts."""

    key: str = Field(
        max_length=MAX_LABEL_KEY, pattern=LABEL_KEY_PATTERN, description="The label key."
    )
    pass_value: str = Field(
        default="true", max_length=MAX_LABEL_VALUE, description="The value that means healthy."
    )
    fail_value: str = Field(
        default="false", max_length=MAX_LABEL_VALUE, description="The value that means not."
    )


_CHECK_RULES = (
    (
        "(self.type == 'Job') == has(self.job) && "
        "(self.type == 'Webhook') == has(self.webhook) && "
        "(self.type == 'NodeCondition') == has(self.nodeCondition) && "
        "(self.type == 'NodeLabel') == has(self.nodeLabel)",
        "check.job, check.webhook, check.nodeCondition and check.nodeLabel are required "
        "exactly when check.type names them",
    ),
)


class VerificationCheck(Model):
    """What a repaired node must pass before it returns to service (or to its pool).

    Runs once the ladder's steps are done (after the reset or reboot); a failure climbs the
    ladder (on the last rung: the incident fails and the node stays out). A Job reports
    through its exit code: run a DCGM diagnostic (`dcgmi diag -r 2`) or an nvidia-smi query
    on the node (the chart's gpuheal-node-jobs ConfigMap has one, key gpu-check).
    """

    model_config = ConfigDict(json_schema_extra=cel(*_CHECK_RULES))

    type: CheckType = Field(
        default=CheckType.NONE,
        description="None (healthyFor alone), Job, Webhook, NodeCondition or NodeLabel.",
    )
    job: JobHook | None = Field(
        default=None,
        description="Required when type is Job: runs on the node; exit code 0 passes "
        "(the Job's Complete condition), a Failed Job fails the check.",
    )
    webhook: WebhookHook | None = Field(
        default=None,
        description="Required when type is Webhook: POST {check, node, incident}; 2xx "
        "passes, 4xx fails, 5xx/429/unreachable are retried until the timeout.",
    )
    node_condition: NodeConditionCheck | None = Field(
        default=None, description="Required when type is NodeCondition."
    )
    node_label: NodeLabelCheck | None = Field(
        default=None, description="Required when type is NodeLabel."
    )
    timeout: PositiveDuration = Field(
        default="30m", description="No verdict within this long fails the check."
    )

    @model_validator(mode="after")
    def _mirror_cel(self) -> VerificationCheck:
        blocks = {
            CheckType.JOB: self.job,
            CheckType.WEBHOOK: self.webhook,
            CheckType.NODE_CONDITION: self.node_condition,
            CheckType.NODE_LABEL: self.node_label,
        }
        for kind, block in blocks.items():
            if (self.type is kind) != (block is not None):
                raise ValueError(_CHECK_RULES[0][1])
        return self


_HEALTHY_FOR_RANGE = DurationRange(
    "healthyFor", "168h", "a node healthy for a week has earned its way back"
)


class ReturnToService(Model):
    """Uncordon/resume nodes that stayed healthy long enough; only what gpuheal itself did."""

    model_config = ConfigDict(json_schema_extra=cel(_HEALTHY_FOR_RANGE.cel()))

    enabled: bool = Field(
        default=True,
        description="Return nodes to service at all (false: they stay cordoned for a person).",
    )
    healthy_for: PositiveDuration = Field(
        default="10m",
        description="How long a node must stay healthy (no new signal, every source readable) "
        "before it is returned (hysteresis).",
    )
    resume_slurm: bool = Field(
        default=True,
        description="Also resume the Slurm node, if gpuheal drained it (never someone "
        "else's drain).",
    )
    check: VerificationCheck = Field(
        default_factory=VerificationCheck,
        description="The check a repaired node must pass before healthyFor starts (none "
        "when omitted); a failure climbs the ladder.",
    )

    @model_validator(mode="after")
    def _mirror_cel(self) -> ReturnToService:
        _HEALTHY_FOR_RANGE.check(self.healthy_for)
        return self


class HistorySettings(Model):
    """How long the node's FaultHistory keeps signals, incidents, actions and outcomes."""

    # On the model, not the field: a field's own x-kubernetes-validations would replace the
    # duration format rules of PositiveDuration (then `7d` was stored, and the operator
    # could not read the policy).
    model_config = ConfigDict(
        json_schema_extra=cel(
            check(
                f"!has(self.retention) || !{duration_ok('self.retention')} || "
                "duration(self.retention) >= duration('24h')",
                "history.retention must be at least 24h (the default escalation window)",
                field_path=".retention",
            )
        )
    )

    retention: PositiveDuration = Field(
        default="720h",
        description="Entries older than this are dropped (default 720h = 30 days; at least "
        "24h, the default escalation window); it must cover every escalation window of the "
        "policy.",
    )

    @model_validator(mode="after")
    def _mirror_cel(self) -> HistorySettings:
        if parse_duration(self.retention) < dt.timedelta(hours=24):
            raise ValueError(
                "history.retention must be at least 24h (the default escalation window)"
            )
        return self


_POLICY_RULES = (
    (
        # Each duration() guarded by its format (duration_ok): a malformed window or
        # retention (`7d`) gets its field's own readable message, not CEL's "type conversion
        # error from 'string' to 'google.protobuf.Duration'" on the whole spec.
        "self.rules.all(r, !has(r.escalation) || !has(r.escalation.window) || "
        f"!{duration_ok('r.escalation.window')} || "
        "(has(self.history) && has(self.history.retention) ? "
        f"(!{duration_ok('self.history.retention')} || "
        "duration(r.escalation.window) <= duration(self.history.retention)) : "
        "duration(r.escalation.window) <= duration('720h')))",
        "history.retention (default 720h) must cover every rule's escalation window",
    ),
)


class RemediationPolicySpec(Model):
    """Which nodes, which signals, what to do, and the limits that always hold."""

    model_config = ConfigDict(
        json_schema_extra=cel(*_POLICY_RULES, *(c.cel() for c in SPEC_CHECKS))
    )

    node_selector: LabelSelector = Field(
        description="Nodes this policy governs (an empty selector selects every node)."
    )
    priority: int = Field(
        default=0,
        ge=0,
        le=1000,
        description="When several policies select a node, the highest priority wins; a tie "
        "means neither acts on that node and both report an Overlapping condition.",
    )
    rules: list[Rule] = Field(
        min_length=1,
        max_length=32,
        description="Signals and what to do about them; tried in order, the first rule a "
        "signal matches decides (put the most severe first).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    safety: Safety = Field(
        description="Limits that hold whatever the signals say: circuit breaker, rate limit, "
        "dry run, pause, opt-out, approvals."
    )
    return_to_service: ReturnToService = Field(
        default_factory=ReturnToService,
        description="When and how nodes gpuheal took out come back.",
    )
    notifications: Notifications | None = Field(
        default=None,
        description="Webhooks told about this policy's incidents (on top of the operator's "
        "--notify-webhooks).",
    )
    slurm_cluster: str | None = Field(
        default=None,
        max_length=63,
        pattern=DNS_LABEL_PATTERN,
        description="The Slurm cluster of these nodes, so the bridge that drains them: a "
        "cluster named in the operator's --bridges-file (or its --bridge-cluster). A node's "
        "gpuheal.io/slurm-cluster label wins; with neither, the operator's --bridge-url.",
    )
    domains: list[FaultDomain] = list_of(
        4,
        DOMAINS_DESCRIPTION,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["key"]},
    )
    history: HistorySettings = Field(
        default_factory=HistorySettings,
        description="How long the nodes' FaultHistory keeps what happened (escalation "
        "windows are counted in it).",
    )

    @model_validator(mode="after")
    def _unique_rule_names(self) -> RemediationPolicySpec:
        # The API server enforces this through the list-map key; mirrored for local files.
        names = [rule.name for rule in self.rules]
        if len(names) != len(set(names)):
            raise ValueError("rule names must be unique")
        keys = [d.key for d in self.domains]
        if len(keys) != len(set(keys)):
            raise ValueError("domains: each key at most once")
        retention = parse_duration(self.history.retention)
        if any(
            r.escalation is not None and parse_duration(r.escalation.window) > retention
            for r in self.rules
        ):
            raise ValueError(_POLICY_RULES[0][1])
        check_spec(self)
        return self


class RemediationPolicyStatus(Status):
    """What the operator last saw for this policy (written by gpuheal only)."""

    selected_nodes: int = Field(default=0, description="Nodes the nodeSelector selects.")
    unhealthy_nodes: int = Field(
        default=0, description="Selected nodes with an open incident or a signal."
    )
    remediating_nodes: int = Field(
        default=0, description="Selected nodes with an incident in progress."
    )
    allowed_unhealthy: int = Field(
        default=0,
        description="maxUnhealthy (or minHealthy) resolved to a count of nodes.",
    )
    unhealthy_node_names: list[str] = list_of(
        256, "Unhealthy nodes, shown also (especially) while the breaker is open."
    )
    message: str = Field(
        default="", max_length=MAX_MESSAGE, description="A one-line summary for people."
    )
    conditions: list[Condition] = conditions_field(
        "Ready, CircuitBreakerOpen, Paused, Overlapping, Warnings (the policy is valid but "
        "something in it is questionable: a ReservePool that does not exist, a limit that "
        "lets no node out...)."
    )


class RemediationPolicy(Resource[RemediationPolicySpec, RemediationPolicyStatus]):
    """How gpuheal remediates GPU faults on a set of nodes."""

    kind: Literal["RemediationPolicy"] = Field(
        default="RemediationPolicy", description="RemediationPolicy"
    )


CRD = CrdInfo.of(
    RemediationPolicy,
    ("rp",),
    condition_column("Ready", "Ready"),
    column("Selected", "integer", ".status.selectedNodes"),
    column("Unhealthy", "integer", ".status.unhealthyNodes"),
    column("Remediating", "integer", ".status.remediatingNodes"),
    condition_column("Breaker", "CircuitBreakerOpen"),
    column("Paused", "boolean", ".spec.safety.paused"),
    column("DryRun", "boolean", ".spec.safety.dryRun"),
)
