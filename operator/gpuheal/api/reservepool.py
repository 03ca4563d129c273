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
    ObjectMeta,
    cel,
    conditions_field,
)
from gpuheal.api.names import API_VERSION

_LabelKey = Annotated[str, Field(max_length=MAX_LABEL_KEY, pattern=LABEL_KEY_PATTERN)]


class TaintEffect(enum.StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class TaintRef(Model):
    key: _LabelKey
    effect: TaintEffect | None = Field(default=None, description="Any effect when omitted.")


class SlurmPromotion(Model):
    partition: str | None = Field(default=None, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    resume: bool = Field(default=True, description="scontrol update state=RESUME the spare.")


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

    set_labels: dict[_LabelKey, Annotated[str, Field(max_length=MAX_LABEL_VALUE)]] = Field(
        default_factory=dict, max_length=32
    )
    remove_labels: list[_LabelKey] = Field(default_factory=list, max_length=32)
    remove_taints: list[TaintRef] = Field(default_factory=list, max_length=16)
    slurm: SlurmPromotion | None = None

    @model_validator(mode="after")
    def _mirror_cel(self) -> Promotion:
        if set(self.remove_labels) & set(self.set_labels):
            raise ValueError(_PROMOTION_RULES[0][1])
        return self


class RefillProvider(enum.StrEnum):
    """Extension point: `None` today; Cluster API / cloud webhook providers plug in here."""

    NONE = "None"


class Refill(Model):
    provider: RefillProvider = RefillProvider.NONE


_POOL_RULES = (
    (
        "(has(self.nodeSelector.matchLabels) && size(self.nodeSelector.matchLabels) > 0) || "
        "(has(self.nodeSelector.matchExpressions) && "
        "size(self.nodeSelector.matchExpressions) > 0)",
        "nodeSelector must not be empty: an empty selector would make every node a spare",
    ),
)


class ReservePoolSpec(Model):
    model_config = ConfigDict(json_schema_extra=cel(*_POOL_RULES))

    node_selector: LabelSelector = Field(description="Nodes that are spares of this pool.")
    min_available: int = Field(default=1, ge=0, le=10000, description="Below it: Low=True.")
    promotion: Promotion = Field(default_factory=Promotion)
    refill: Refill = Field(default_factory=Refill)

    @model_validator(mode="after")
    def _mirror_cel(self) -> ReservePoolSpec:
        if self.node_selector.is_empty():
            raise ValueError(_POOL_RULES[0][1])
        return self


class Claim(Model):
    node: str = Field(max_length=MAX_NAME)
    claimed_by: str = Field(max_length=MAX_NAME, description="NodeRemediation name.")
    claimed_at: dt.datetime


class ReservePoolStatus(Model):
    observed_generation: int | None = Field(default=None, ge=0)
    available: int = 0
    claimed: int = 0
    total: int = 0
    claims: list[Claim] = Field(default_factory=list, max_length=256)
    conditions: list[Condition] = conditions_field("Ready, Low.")


class ReservePool(Model):
    """Spare nodes and how to promote one."""

    api_version: Literal["gpuheal.io/v1alpha1"] = API_VERSION
    kind: Literal["ReservePool"] = "ReservePool"
    metadata: ObjectMeta
    spec: ReservePoolSpec
    status: ReservePoolStatus = Field(default_factory=ReservePoolStatus)


CRD = CrdInfo(
    kind="ReservePool",
    singular="reservepool",
    plural="reservepools",
    short_names=("rsvp",),
    spec_model=ReservePoolSpec,
    status_model=ReservePoolStatus,
    description=ReservePool.__doc__ or "",
    printer_columns=(
        {"name": "Available", "type": "integer", "jsonPath": ".status.available"},
        {"name": "Claimed", "type": "integer", "jsonPath": ".status.claimed"},
        {"name": "Total", "type": "integer", "jsonPath": ".status.total"},
        {"name": "Min", "type": "integer", "jsonPath": ".spec.minAvailable"},
        {
            "name": "Low",
            "type": "string",
            "jsonPath": '.status.conditions[?(@.type=="Low")].status',
        },
    ),
)
