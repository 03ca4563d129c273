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
    ObjectMeta,
    ObjectRef,
    PositiveDuration,
    cel,
    conditions_field,
)
from gpuheal.api.names import API_VERSION, OPT_OUT_LABEL
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


class DrainTimeoutAction(enum.StrEnum):
    ALERT = "Alert"  # stop, leave the node cordoned, say why
    FORCE = "Force"  # delete the remaining pods without the Eviction API


class HookType(enum.StrEnum):
    NOOP = "Noop"
    JOB = "Job"
    WEBHOOK = "Webhook"


class EscalationScope(enum.StrEnum):
    GPU = "Gpu"  # count occurrences per GPU (PCI id or UUID)
    NODE = "Node"


class ConditionSignal(Model):
    """A node condition that signals trouble when it holds `status` for at least `for`."""

    type: str = Field(max_length=316)
    status: ConditionStatus = ConditionStatus.TRUE
    for_: Duration = Field(default="0s", description="How long the condition must hold.")


class EventSignal(Model):
    """A Kubernetes Event on the Node, matched by reason (and optionally a message part)."""

    reason: str = Field(max_length=128, min_length=1)
    message_contains: str | None = Field(default=None, max_length=256)


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

    xids: list[Annotated[int, Field(ge=1, le=65535)]] = Field(default_factory=list, max_length=64)
    xid_classes: list[XidClass] = Field(
        default_factory=list,
        max_length=16,
        description="Catalogue default: every XID whose catalogue class is listed.",
    )
    recovery_actions: list[RecoveryAction] = Field(
        default_factory=list,
        max_length=8,
        description="For XID 154: only these driver-stated recovery actions match.",
    )
    conditions: list[ConditionSignal] = Field(default_factory=list, max_length=16)
    events: list[EventSignal] = Field(default_factory=list, max_length=16)

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
    requeue: RequeueMode = RequeueMode.REQUEUE
    checkpoint_signal: str | None = Field(
        default=None,
        max_length=16,
        pattern=r"^(SIG)?[A-Z][A-Z0-9]*$",
        description="Signal sent to the job before requeue so it can checkpoint (e.g. USR1).",
    )
    grace_period: Duration = Field(default="60s", description="Wait after the signal.")
    reason: str = Field(default="gpuheal", max_length=128)


class DrainOptions(Model):
    timeout: PositiveDuration = "10m"
    grace_period: Duration | None = Field(
        default=None, description="Overrides the pods' terminationGracePeriodSeconds."
    )
    on_timeout: DrainTimeoutAction = Field(
        default=DrainTimeoutAction.ALERT,
        description="After timeout (PDBs still blocking): stop and alert, or force.",
    )


class JobHook(Model):
    namespace: str = Field(max_length=63, pattern=DNS_LABEL_PATTERN)
    template: dict[str, Any] = Field(
        description="batch/v1 JobSpec template; the node name is passed as NODE_NAME.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True, "type": "object"},
    )


class WebhookHook(Model):
    url: str = Field(max_length=2048, pattern=r"^https?://")
    timeout: PositiveDuration = "30s"


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

    type: HookType
    job: JobHook | None = None
    webhook: WebhookHook | None = None

    @model_validator(mode="after")
    def _mirror_cel(self) -> HookSpec:
        if (self.type is HookType.JOB) != (self.job is not None) or (
            self.type is HookType.WEBHOOK
        ) != (self.webhook is not None):
            raise ValueError("hook.job / hook.webhook must match hook.type")
        return self


class ResetOptions(Model):
    hook: HookSpec
    when_idle: bool = Field(default=True, description="Wait until no GPU job runs on the node.")
    timeout: PositiveDuration = "10m"


class RebootOptions(Model):
    hook: HookSpec
    power_cycle: bool = Field(default=False, description="Cold power-cycle (e.g. via BMC).")
    timeout: PositiveDuration = "20m"


class ReplaceOptions(Model):
    reserve_pool_ref: ObjectRef


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

    action: Action
    slurm_drain: SlurmDrainOptions | None = None
    drain: DrainOptions | None = None
    reset: ResetOptions | None = None
    reboot: RebootOptions | None = None
    replace: ReplaceOptions | None = None

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

    name: str = Field(max_length=63, pattern=DNS_LABEL_PATTERN)
    steps: list[Step] = Field(min_length=1, max_length=8)


class Escalation(Model):
    """Every `occurrences` matching signals within `window` climb one rung."""

    occurrences: int = Field(default=3, ge=2, le=100)
    window: PositiveDuration = "24h"
    scope: EscalationScope = EscalationScope.GPU


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

    name: str = Field(max_length=63, pattern=DNS_LABEL_PATTERN)
    signals: SignalSelector
    ladder: list[Rung] = Field(min_length=1, max_length=5)
    escalation: Escalation | None = None

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
    remediations: int = Field(ge=1, le=10000, description="Incidents started per window.")
    window: PositiveDuration = "1h"


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
    rate_limit: RateLimit | None = None
    storm_cooldown: Duration = Field(
        default="15m",
        description="After the breaker closes, wait this long before starting new incidents.",
    )
    dry_run: bool = Field(default=False, description="Record the plan, change nothing.")
    paused: bool = Field(default=False, description="Start and continue nothing.")
    opt_out_label: str = Field(
        default=OPT_OUT_LABEL, max_length=MAX_LABEL_KEY, pattern=LABEL_KEY_PATTERN
    )
    require_approval: list[Action] = Field(
        default_factory=list,
        max_length=8,
        description="Actions that wait for the gpuheal.io/approve annotation on the "
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

    enabled: bool = True
    healthy_for: PositiveDuration = Field(default="10m", description="Hysteresis window.")
    resume_slurm: bool = True


class RemediationPolicySpec(Model):
    node_selector: LabelSelector = Field(description="Nodes this policy governs.")
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
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    safety: Safety
    return_to_service: ReturnToService = Field(default_factory=ReturnToService)

    @model_validator(mode="after")
    def _unique_rule_names(self) -> RemediationPolicySpec:
        # The API server enforces this through the list-map key; mirrored for local files.
        names = [rule.name for rule in self.rules]
        if len(names) != len(set(names)):
            raise ValueError("rule names must be unique")
        return self


class RemediationPolicyStatus(Model):
    observed_generation: int | None = Field(default=None, ge=0)
    selected_nodes: int = 0
    unhealthy_nodes: int = 0
    remediating_nodes: int = 0
    allowed_unhealthy: int = Field(default=0, description="maxUnhealthy resolved to a count.")
    unhealthy_node_names: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="Unhealthy nodes, shown also (especially) while the breaker is open.",
    )
    message: str = Field(default="", max_length=MAX_MESSAGE)
    conditions: list[Condition] = conditions_field(
        "Ready, CircuitBreakerOpen, Paused, Overlapping."
    )


class RemediationPolicy(Model):
    """How gpuheal remediates GPU faults on a set of nodes."""

    api_version: Literal["gpuheal.io/v1alpha1"] = API_VERSION
    kind: Literal["RemediationPolicy"] = "RemediationPolicy"
    metadata: ObjectMeta
    spec: RemediationPolicySpec
    status: RemediationPolicyStatus = Field(default_factory=RemediationPolicyStatus)


CRD = CrdInfo(
    kind="RemediationPolicy",
    singular="remediationpolicy",
    plural="remediationpolicies",
    short_names=("rp",),
    spec_model=RemediationPolicySpec,
    status_model=RemediationPolicyStatus,
    description=RemediationPolicy.__doc__ or "",
    printer_columns=(
        {"name": "Selected", "type": "integer", "jsonPath": ".status.selectedNodes"},
        {"name": "Unhealthy", "type": "integer", "jsonPath": ".status.unhealthyNodes"},
        {"name": "Remediating", "type": "integer", "jsonPath": ".status.remediatingNodes"},
        {
            "name": "Breaker",
            "type": "string",
            "jsonPath": '.status.conditions[?(@.type=="CircuitBreakerOpen")].status',
        },
        {"name": "Paused", "type": "boolean", "jsonPath": ".spec.safety.paused"},
        {"name": "DryRun", "type": "boolean", "jsonPath": ".spec.safety.dryRun"},
    ),
)
