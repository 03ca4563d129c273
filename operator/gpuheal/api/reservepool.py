"""ReservePool: spare GPU nodes that replace broken ones."""

from __future__ import annotations

import datetime as dt
import enum
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from gpuheal.api.meta import (
    LABEL_KEY_PATTERN,
    MAX_LABEL_KEY,
    MAX_LABEL_VALUE,
    MAX_NAME,
    Condition,
    CrdInfo,
    LabelSelector,
    Model,
    Resource,
    cel,
    column,
    condition_column,
    conditions_field,
    list_of,
    map_of,
)

_LabelKey = Annotated[str, Field(max_length=MAX_LABEL_KEY, pattern=LABEL_KEY_PATTERN)]


class TaintEffect(enum.StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class TaintRef(Model):
    """A taint to remove, by key and (optionally) effect."""

    key: _LabelKey = Field(description="The taint's key.")
    effect: TaintEffect | None = Field(
        default=None, description="The taint's effect; any effect when omitted."
    )


class SlurmPromotion(Model):
    """What happens to the spare in Slurm when it is promoted."""

    partition: str | None = Field(
        default=None,
        max_length=64,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="Slurm partition the spare joins; unchanged when omitted.",
    )
    resume: bool = Field(
        default=True,
        description="Resume the spare in Slurm (scontrol update state=RESUME) so jobs can run.",
    )


_PROMOTION_RULES = (
    (
        "!has(self.removeLabels) || !has(self.setLabels) || "
        "!self.removeLabels.exists(k, k in self.setLabels)",
        "a label cannot be both set and removed on promotion",
    ),
)


class Promotion(Model):
    """What turns a spare into a worker."""

    model_config = ConfigDict(json_schema_extra=cel(*_PROMOTION_RULES))

    set_labels: dict[_LabelKey, Annotated[str, Field(max_length=MAX_LABEL_VALUE)]] = map_of(
        32, "Labels set on the spare (e.g. the pool label of the workers it joins)."
    )
    remove_labels: list[_LabelKey] = list_of(
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
    """Extension point: `None` today; Cluster API / cloud webhook providers plug in here."""

    NONE = "None"


class Refill(Model):
    """How the pool gets new spares (only by hand today)."""

    provider: RefillProvider = Field(
        default=RefillProvider.NONE,
        description="None: spares are added by labelling nodes; providers may come later.",
    )


_POOL_RULES = (
    (
        "(has(self.nodeSelector.matchLabels) && size(self.nodeSelector.matchLabels) > 0) || "
        "(has(self.nodeSelector.matchExpressions) && "
        "size(self.nodeSelector.matchExpressions) > 0)",
        "nodeSelector must not be empty: an empty selector would make every node a spare",
    ),
)


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


class ReservePoolStatus(Model):
    """Spares counted by the operator (written by gpuheal only)."""

    observed_generation: int | None = Field(
        default=None, ge=0, description="The metadata.generation this status describes."
    )
    available: int = Field(default=0, description="Spares ready to be claimed.")
    claimed: int = Field(default=0, description="Spares claimed by incidents.")
    total: int = Field(default=0, description="Nodes the nodeSelector selects.")
    claims: list[Claim] = list_of(256, "Which incident claimed which spare.")
    conditions: list[Condition] = conditions_field("Ready, Low.")


class ReservePool(Resource):
    """Spare nodes and how to promote one."""

    kind: Literal["ReservePool"] = Field(default="ReservePool", description="ReservePool")
    spec: ReservePoolSpec = Field(description="The spares and how to promote one.")
    status: ReservePoolStatus = Field(
        default_factory=ReservePoolStatus, description="Observed state (gpuheal writes it)."
    )


CRD = CrdInfo.of(
    ReservePool,
    ("rsvp",),
    column("Available", "integer", ".status.available"),
    column("Claimed", "integer", ".status.claimed"),
    column("Total", "integer", ".status.total"),
    column("Min", "integer", ".spec.minAvailable"),
    condition_column("Low", "Low"),
)
