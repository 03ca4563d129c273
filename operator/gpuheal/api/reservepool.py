"""ReservePool: spare GPU nodes that replace broken ones."""

from __future__ import annotations

import datetime as dt
import enum
from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from gpuheal.api.meta import (
    MAX_NAME,
    Condition,
    CrdInfo,
    LabelKey,
    LabelSelector,
    LabelValue,
    Model,
    PositiveDuration,
    Resource,
    Status,
    cel,
    cel_str,
    column,
    condition_column,
    conditions_field,
    label_map_keys_check,
    list_of,
    map_of,
)
from gpuheal_bridge.api.names import (
    DRAIN_REASON_MAX,
    DRAIN_REASON_PATTERN,
    OWN_REASON_PATTERN,
    REASON_PREFIX,
    drain_reason_problem,
)


class TaintEffect(enum.StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class TaintRef(Model):
    """A taint to remove, by key and (optionally) effect."""

    key: LabelKey = Field(description="The taint's key.")
    effect: TaintEffect | None = Field(
        default=None, description="The taint's effect; any effect when omitted."
    )


#: The API version in which the deprecated fields below are removed (README, Deprecations).
REMOVED_IN = "gpuheal.io/v1beta1"
PARTITION_DEPRECATION = (
    "accepted and ignored (gpuheal never changed a node's partitions); a spare should "
    "already be in the partitions it will serve (PartitionName ... Nodes= in slurm.conf). "
    f"Remove the field: it goes in {REMOVED_IN}."
)


class SlurmPromotion(Model):
    """What happens to the spare in Slurm when it is promoted (and when a repaired node
    goes back to the pool). Partitions are Slurm's configuration (slurm.conf), not gpuheal's:
    a spare should already be in the partitions it will serve."""

    resume: bool = Field(
        default=True,
        description="Resume the spare in Slurm (scontrol update state=RESUME) so jobs can run: "
        "only while its drain reason is reserveReason (or it is not drained); a spare someone "
        "else drained or Slurm set DOWN is never resumed, and not chosen.",
    )
    partition: str | None = Field(
        default=None,
        max_length=64,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description=f"Deprecated: {PARTITION_DEPRECATION}",
    )
    reserve_reason: str = Field(
        default="reserve pool",
        min_length=1,
        max_length=DRAIN_REASON_MAX,
        description="The Slurm drain reason of a spare waiting in the pool: a repaired node "
        "that goes back to the pool is drained with it (promotion resumes it). One line, "
        f"no '[' or ']', not starting with '{REASON_PREFIX}' (gpuheal's own drains).",
        json_schema_extra=cel(
            (
                f"self.matches({cel_str(DRAIN_REASON_PATTERN)})",
                "reserveReason must be one line without control characters, '[' or ']' "
                "(Slurm appends [user@time] to a reason)",
            ),
            (
                f"!self.matches({cel_str(OWN_REASON_PATTERN)})",
                f"reserveReason must not start with '{REASON_PREFIX}': that prefix marks "
                "gpuheal's own drains, and the pool's would be taken for an incident's",
            ),
        ),
    )

    @field_validator("reserve_reason")
    @classmethod
    def _one_line_not_ours(cls, reason: str) -> str:
        problem = drain_reason_problem(reason)
        if problem:
            raise ValueError(f"reserveReason {problem}")
        return reason


_PROMOTION_RULES = (
    (
        "!has(self.removeLabels) || !has(self.setLabels) || "
        "!self.removeLabels.exists(k, k in self.setLabels)",
        "a label cannot be both set and removed on promotion",
    ),
    label_map_keys_check("setLabels"),
)


class Promotion(Model):
    """What turns a spare into a worker."""

    model_config = ConfigDict(json_schema_extra=cel(*_PROMOTION_RULES))

    set_labels: dict[LabelKey, LabelValue] = map_of(
        32, "Labels set on the spare (e.g. the pool label of the workers it joins)."
    )
    remove_labels: list[LabelKey] = list_of(
        32, "Label keys removed from the spare (e.g. the label that made it a spare)."
    )
    remove_taints: list[TaintRef] = list_of(
        16, "Taints removed from the spare (e.g. the one that kept workloads off it)."
    )
    slurm: SlurmPromotion | None = Field(
        default=None, description="Slurm side of the promotion (nothing in Slurm when omitted)."
    )

    @model_validator(mode="after")
    def _mirror_cel(self) -> Promotion:
        if set(self.remove_labels) & set(self.set_labels):
            raise ValueError(_PROMOTION_RULES[0][1])
        return self


class RefillProvider(enum.StrEnum):
    """Where new spares come from when the pool is below minAvailable."""

    NONE = "None"  # by hand: label nodes into the pool; repaired nodes come back by themselves
    WEBHOOK = "Webhook"  # ask a site's provisioning system (Cluster API, a cloud, a BMC script)


class RefillWebhook(Model):
    """The provisioning system's endpoint. gpuheal POSTs {pool, available, minAvailable,
    wanted, nodeSelector} with header Idempotency-Key: <pool>-<shortfall start>; any 2xx
    means "accepted" (the new nodes join the pool by carrying its labels); 4xx is recorded
    and not retried until the shortfall changes; 5xx, 429 or no answer are retried."""

    url: str = Field(
        max_length=2048,
        pattern=r"^https?://",
        description="URL gpuheal POSTs the refill request to.",
    )
    timeout: PositiveDuration = Field(
        default="30s", description="How long one call may take before it counts as failed."
    )
    interval: PositiveDuration = Field(
        default="10m",
        description="While the pool stays below minAvailable, ask again after this long.",
    )


_REFILL_RULES = (
    (
        "(self.provider == 'Webhook') == has(self.webhook)",
        "refill.webhook is required exactly when refill.provider is Webhook",
    ),
)


class Refill(Model):
    """How the pool gets new spares when it runs low."""

    model_config = ConfigDict(json_schema_extra=cel(*_REFILL_RULES))

    provider: RefillProvider = Field(
        default=RefillProvider.NONE,
        description="None: spares are added by labelling nodes (and repaired nodes come "
        "back); Webhook: gpuheal asks a provisioning system for more.",
    )
    webhook: RefillWebhook | None = Field(
        default=None, description="Required when provider is Webhook."
    )

    @model_validator(mode="after")
    def _mirror_cel(self) -> Refill:
        if (self.provider is RefillProvider.WEBHOOK) != (self.webhook is not None):
            raise ValueError(_REFILL_RULES[0][1])
        return self


_POOL_RULES = (
    (
        "(has(self.nodeSelector.matchLabels) && size(self.nodeSelector.matchLabels) > 0) || "
        "(has(self.nodeSelector.matchExpressions) && "
        "size(self.nodeSelector.matchExpressions) > 0)",
        "nodeSelector must not be empty: an empty selector would make every node a spare",
    ),
)


def deprecations(spec: ReservePoolSpec) -> list[str]:
    """The deprecated fields the pool sets, each with what to do instead (its status says it)."""
    slurm = spec.promotion.slurm
    if slurm is not None and slurm.partition is not None:
        return [f"spec.promotion.slurm.partition is deprecated: {PARTITION_DEPRECATION}"]
    return []


class ReservePoolSpec(Model):
    """Which nodes are spares, how many should stay ready, and how one is promoted."""

    model_config = ConfigDict(json_schema_extra=cel(*_POOL_RULES))

    node_selector: LabelSelector = Field(description="Nodes that are spares of this pool.")
    min_available: int = Field(
        default=1,
        ge=0,
        le=10000,
        description="Spares that should stay available; below it the pool reports Low=True.",
    )
    promotion: Promotion = Field(
        default_factory=Promotion, description="What turns a spare into a worker."
    )
    refill: Refill = Field(default_factory=Refill, description="How the pool gets new spares.")

    @model_validator(mode="after")
    def _mirror_cel(self) -> ReservePoolSpec:
        if self.node_selector.is_empty():
            raise ValueError(_POOL_RULES[0][1])
        return self


class Claim(Model):
    """A spare taken by an incident."""

    node: str = Field(max_length=MAX_NAME, description="The spare node.")
    claimed_by: str = Field(max_length=MAX_NAME, description="The NodeRemediation that claimed it.")
    claimed_at: dt.datetime = Field(description="When it was claimed.")


class RefillStatus(Model):
    """The last refill request gpuheal made for the pool."""

    requested_at: dt.datetime = Field(description="When gpuheal asked the provider.")
    wanted: int = Field(ge=0, description="Spares asked for (minAvailable - available).")
    since: dt.datetime = Field(description="When the current shortfall began.")
    result: str = Field(max_length=32, description="Accepted, Refused, Unavailable or Unreachable.")
    message: str = Field(default="", max_length=1024, description="The provider's answer.")


class UnavailableSpare(Model):
    """A node of the pool that cannot be promoted now, and why."""

    node: str = Field(max_length=MAX_NAME, description="The node.")
    reason: str = Field(
        max_length=64,
        description="NotReady, Cordoned (not by gpuheal), HeldByIncident (gpuheal keeps it "
        "out for an incident), DrainedInSlurm or DownInSlurm (not the pool's reserveReason: "
        "an admin's or another tool's; never resumed by gpuheal).",
    )
    message: str = Field(default="", max_length=512, description="Who and why, in words.")


class ReservePoolStatus(Status):
    """Spares counted by the operator (written by gpuheal only)."""

    available: int = Field(default=0, description="Spares ready to be claimed.")
    claimed: int = Field(default=0, description="Spares claimed by incidents.")
    total: int = Field(default=0, description="Nodes the nodeSelector selects.")
    claims: list[Claim] = list_of(256, "Which incident claimed which spare.")
    unavailable: list[UnavailableSpare] = list_of(
        256,
        "Unclaimed nodes of the pool that cannot be promoted now, and why (an admin's "
        "cordon or Slurm drain is never lifted by a promotion).",
    )
    refill: RefillStatus | None = Field(
        default=None, description="The last refill request (refill.provider Webhook)."
    )
    conditions: list[Condition] = conditions_field(
        "Ready, Low, Warnings (deprecated fields the spec sets, and what to do instead)."
    )


class ReservePool(Resource[ReservePoolSpec, ReservePoolStatus]):
    """Spare nodes and how to promote one."""

    kind: Literal["ReservePool"] = Field(default="ReservePool", description="ReservePool")


CRD = CrdInfo.of(
    ReservePool,
    ("rsvp",),
    condition_column("Ready", "Ready"),
    column("Available", "integer", ".status.available"),
    column("Claimed", "integer", ".status.claimed"),
    column("Total", "integer", ".status.total"),
    column("Min", "integer", ".spec.minAvailable"),
    condition_column("Low", "Low"),
    column("Unavailable", "string", ".status.unavailable[*].node"),
)
