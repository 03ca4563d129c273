"""RemediationPolicy: which nodes, which signals, what to do, and the safety limits."""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from gpuheal.api.meta import (
    DNS_LABEL_PATTERN,
    LABEL_KEY_PATTERN,
    MAX_LABEL_KEY,
    MAX_MESSAGE,
    Condition,
    ConditionStatus,
    CrdInfo,
    Duration,
    IntOrPercent,
    LabelSelector,
    Model,
    ObjectRef,
    PositiveDuration,
    Resource,
    cel,
    column,
    condition_column,
    conditions_field,
    list_of,
)
from gpuheal.api.names import OPT_OUT_LABEL
from gpuheal.xid.types import RecoveryAction, XidClass


class Action(enum.StrEnum):
    """One rung step. Order inside a rung is the order of execution."""

    ALERT = "alert"  # Event + condition only, nothing disruptive
    CORDON = "cordon"
    SLURM_DRAIN = "slurmDrain"
    DRAIN = "drain"
    RESET = "reset"
    REBOOT = "reboot"
    REPLACE = "replace"


DISRUPTIVE_ACTIONS = frozenset(a for a in Action if a is not Action.ALERT)


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


class EscalationScope(enum.StrEnum):
    GPU = "Gpu"  # count occurrences per GPU (PCI id or UUID)
    NODE = "Node"


class ConditionSignal(Model):
    """A node condition that signals trouble when it holds `status` for at least `for`."""

    type: str = Field(
        max_length=316,
        description="Node condition type to watch (e.g. Ready, or a node-problem-detector "
        "condition such as GpuXidError).",
    )
    status: ConditionStatus = Field(
        default=ConditionStatus.TRUE,
        description="The condition status that signals trouble: True, False or Unknown "
        "(e.g. Ready with status False).",
    )
    for_: Duration = Field(
        default="0s",
        description="How long the condition must hold that status before the rule fires "
        "(a Go duration such as 5m; 0s: at once).",
    )


class EventSignal(Model):
    """A Kubernetes Event on the Node, matched by reason (and optionally a message part)."""

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


class SignalSelector(Model):
    """Which signals trigger a rule. Any one matching signal triggers it."""

    model_config = ConfigDict(json_schema_extra=cel(*_SIGNAL_RULES))

    xids: list[Annotated[int, Field(ge=1, le=65535)]] = list_of(
        64,
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
        return self


class SlurmDrainOptions(Model):
    """How the Slurm node is drained through the bridge, and what happens to its jobs."""

    requeue: RequeueMode = Field(
        default=RequeueMode.REQUEUE,
        description="What to do with the node's running jobs: requeue (back in the queue, "
        "excluding this node), requeueHold (requeued but held for a person), or none (leave "
        "them running).",
    )
    checkpoint_signal: str | None = Field(
        default=None,
        max_length=16,
        pattern=r"^(SIG)?[A-Z][A-Z0-9]*$",
        description="Signal sent to the jobs before the requeue so they can checkpoint "
        "(e.g. USR1); none when omitted.",
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


class DrainOptions(Model):
    """Evicting the node's pods through the Eviction API (PodDisruptionBudgets honoured)."""

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


class JobHook(Model):
    """A Kubernetes Job that carries out the reset or reboot."""

    namespace: str = Field(
        max_length=63,
        pattern=DNS_LABEL_PATTERN,
        description="Namespace the Job is created in (the chart grants Job rights only in "
        "rbac.jobHookNamespaces).",
    )
    template: dict[str, Any] = Field(
        description="A batch/v1 JobSpec; gpuheal adds NODE_NAME, GPUHEAL_ACTION and "
        "GPUHEAL_INCIDENT to every container's environment.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True, "type": "object"},
    )


class WebhookHook(Model):
    """An HTTP endpoint (e.g. your BMC or fleet tooling) that carries out the reset or reboot."""

    url: str = Field(
        max_length=2048,
        pattern=r"^https?://",
        description="URL gpuheal POSTs {action, node, incident, xid} to, with the header "
        "Idempotency-Key: <incident>-<action>; any 2xx is success.",
    )
    timeout: PositiveDuration = Field(
        default="30s", description="How long one call may take before it counts as failed."
    )


class NotifyWebhook(Model):
    """A receiver of incident notifications."""

    url: str = Field(
        max_length=2048,
        pattern=r"^https?://",
        description="URL gpuheal POSTs each message to (JSON). Readable by whoever can read "
        "this policy: prefer the operator's --notify-webhooks (from a Secret) for URLs that "
        "carry a secret, such as Slack's.",
    )
    format: NotifyFormat = Field(
        default=NotifyFormat.GENERIC,
        description="Generic: a JSON object with the event, incident, node, reason, message; "
        "Slack: {text} as Slack incoming webhooks (and compatible ones) expect.",
    )
    events: list[NotifyEvent] = list_of(
        5,
        "Which transitions to send (Opened, Blocked, ApprovalPending, Completed, Failed); "
        "empty: all of them.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )


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
        description="Job (a Kubernetes Job), Webhook (an HTTP call) or Noop (nothing: for "
        "sandboxes and tests)."
    )
    job: JobHook | None = Field(default=None, description="Required when type is Job.")
    webhook: WebhookHook | None = Field(default=None, description="Required when type is Webhook.")

    @model_validator(mode="after")
    def _mirror_cel(self) -> HookSpec:
        if (self.type is HookType.JOB) != (self.job is not None) or (
            self.type is HookType.WEBHOOK
        ) != (self.webhook is not None):
            raise ValueError("hook.job / hook.webhook must match hook.type")
        return self


class ResetOptions(Model):
    """A GPU reset (e.g. nvidia-smi -r) carried out by a hook."""

    hook: HookSpec = Field(description="How the reset is carried out.")
    when_idle: bool = Field(
        default=True, description="Wait until no GPU job runs on the node before the reset."
    )
    timeout: PositiveDuration = Field(
        default="10m", description="How long the hook may take before the step fails."
    )


class RebootOptions(Model):
    """A node reboot or power-cycle carried out by a hook."""

    hook: HookSpec = Field(description="How the reboot is carried out.")
    power_cycle: bool = Field(
        default=False,
        description="Marks the reboot as a cold power-cycle (e.g. through the BMC) in the "
        "plan; the hook itself decides how to reboot.",
    )
    timeout: PositiveDuration = Field(
        default="20m", description="How long the hook may take before the step fails."
    )


class ReplaceOptions(Model):
    """Bring a spare node from a ReservePool into service in place of this one."""

    reserve_pool_ref: ObjectRef = Field(description="The ReservePool to take the spare from.")


_STEP_RULES = (
    (
        "(!has(self.slurmDrain) || self.action == 'slurmDrain') && "
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


class Step(Model):
    """One action of a rung, with the options of that action only."""

    model_config = ConfigDict(json_schema_extra=cel(*_STEP_RULES))

    action: Action = Field(
        description="alert (Event and condition only), cordon, slurmDrain (drain the Slurm "
        "node and requeue its jobs through the bridge), drain (evict the pods), reset (GPU "
        "reset), reboot, or replace (take a spare from a ReservePool)."
    )
    slurm_drain: SlurmDrainOptions | None = Field(
        default=None, description="Options of a slurmDrain step (defaults when omitted)."
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
            Action.SLURM_DRAIN: self.slurm_drain,
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


class Rung(Model):
    """One level of the ladder: the steps run, in order, when the rule is at this level."""

    name: str = Field(
        max_length=63,
        pattern=DNS_LABEL_PATTERN,
        description="Name of the rung (shown in incidents and Events), e.g. power-cycle.",
    )
    steps: list[Step] = Field(
        min_length=1, max_length=8, description="The steps of this rung, run in this order."
    )


class Escalation(Model):
    """Every `occurrences` matching signals within `window` climb one rung."""

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


_RULE_RULES = (
    (
        "!has(self.signals.xids) || !(94 in self.signals.xids) || "
        "!self.ladder[0].steps.exists(s, s.action == 'replace')",
        "XID 94 (contained ECC error) must never replace on first sight: "
        "move replace to a later rung",
    ),
    (
        "size(self.ladder) == 1 || has(self.escalation)",
        "a ladder with more than one rung needs escalation "
        "(occurrences within a window) to climb it",
    ),
)


class Rule(Model):
    """Signals -> ladder. Rules are tried in order; the first rule a signal matches wins."""

    model_config = ConfigDict(json_schema_extra=cel(*_RULE_RULES))

    name: str = Field(
        max_length=63,
        pattern=DNS_LABEL_PATTERN,
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
        if 94 in self.signals.xids and any(
            s.action is Action.REPLACE for s in self.ladder[0].steps
        ):
            raise ValueError(_RULE_RULES[0][1])
        if len(self.ladder) > 1 and self.escalation is None:
            raise ValueError(_RULE_RULES[1][1])
        return self

    def escalation_or_default(self) -> Escalation:
        return self.escalation or Escalation()


class RateLimit(Model):
    """At most `remediations` incidents started per `window` under this policy."""

    remediations: int = Field(
        ge=1, le=10000, description="Most incidents started per window under this policy."
    )
    window: PositiveDuration = Field(
        default="1h", description="The sliding window the limit is counted in."
    )


_SAFETY_RULES = (
    (
        "has(self.maxUnhealthy) != has(self.minHealthy)",
        "set exactly one of maxUnhealthy or minHealthy",
    ),
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
    opt_out_label: str = Field(
        default=OPT_OUT_LABEL,
        max_length=MAX_LABEL_KEY,
        pattern=LABEL_KEY_PATTERN,
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
        return self


class ReturnToService(Model):
    """Uncordon/resume nodes that stayed healthy long enough; only what gpuheal itself did."""

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


class RemediationPolicySpec(Model):
    """Which nodes, which signals, what to do, and the limits that always hold."""

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

    @model_validator(mode="after")
    def _unique_rule_names(self) -> RemediationPolicySpec:
        # The API server enforces this through the list-map key; mirrored for local files.
        names = [rule.name for rule in self.rules]
        if len(names) != len(set(names)):
            raise ValueError("rule names must be unique")
        return self


class RemediationPolicyStatus(Model):
    """What the operator last saw for this policy (written by gpuheal only)."""

    observed_generation: int | None = Field(
        default=None, ge=0, description="The metadata.generation this status describes."
    )
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
        "Ready, CircuitBreakerOpen, Paused, Overlapping."
    )


class RemediationPolicy(Resource):
    """How gpuheal remediates GPU faults on a set of nodes."""

    kind: Literal["RemediationPolicy"] = Field(
        default="RemediationPolicy", description="RemediationPolicy"
    )
    spec: RemediationPolicySpec = Field(description="The desired behaviour.")
    status: RemediationPolicyStatus = Field(
        default_factory=RemediationPolicyStatus, description="Observed state (gpuheal writes it)."
    )


CRD = CrdInfo.of(
    RemediationPolicy,
    ("rp",),
    column("Selected", "integer", ".status.selectedNodes"),
    column("Unhealthy", "integer", ".status.unhealthyNodes"),
    column("Remediating", "integer", ".status.remediatingNodes"),
    condition_column("Breaker", "CircuitBreakerOpen"),
    column("Paused", "boolean", ".spec.safety.paused"),
    column("DryRun", "boolean", ".spec.safety.dryRun"),
)
