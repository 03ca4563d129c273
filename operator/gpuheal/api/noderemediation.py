"""NodeRemediation: one incident on one node, and the record of every step taken."""

from __future__ import annotations

import datetime as dt
import enum
from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from gpuheal.api.meta import (
    DNS_SUBDOMAIN_PATTERN,
    MAX_MESSAGE,
    MAX_NAME,
    Condition,
    CrdInfo,
    Model,
    ObjectMeta,
    ObjectRef,
    cel,
    conditions_field,
)
from gpuheal.api.names import API_VERSION, NremCondition
from gpuheal.api.remediationpolicy import Rung
from gpuheal.xid.types import RecoveryAction

STEP_CONDITION_TYPES = tuple(NremCondition)


class SignalSource(enum.StrEnum):
    KERNEL_LOG = "KernelLog"
    EVENT = "Event"
    CONDITION = "Condition"
    DCGM_EXPORTER = "DcgmExporter"
    MANUAL = "Manual"


_SIGNAL_RULES = (
    (
        "!(self.source in ['KernelLog', 'DcgmExporter']) || has(self.xid)",
        "kernel log and dcgm-exporter signals must carry an xid",
    ),
    (
        "self.source != 'Condition' || has(self.conditionType)",
        "a Condition signal must name its conditionType",
    ),
)


class SignalRecord(Model):
    """What triggered (or escalated) the incident."""

    model_config = ConfigDict(json_schema_extra=cel(*_SIGNAL_RULES))

    source: SignalSource
    observed_at: dt.datetime
    xid: int | None = Field(default=None, ge=1, le=65535)
    pci_bus_id: str | None = Field(default=None, max_length=32)
    gpu_uuid: str | None = Field(default=None, max_length=64)
    recovery_action: RecoveryAction | None = None
    condition_type: str | None = Field(default=None, max_length=316)
    condition_status: str | None = Field(
        default=None,
        max_length=16,
        description="The status the condition held (True when absent).",
    )
    event_reason: str | None = Field(default=None, max_length=128)
    event_uid: str | None = Field(default=None, max_length=64, description="For dedupe.")
    message: str = Field(default="", max_length=MAX_MESSAGE)

    @model_validator(mode="after")
    def _mirror_cel(self) -> SignalRecord:
        sources_with_xid = {SignalSource.KERNEL_LOG, SignalSource.DCGM_EXPORTER}
        if self.source in sources_with_xid and self.xid is None:
            raise ValueError(_SIGNAL_RULES[0][1])
        if self.source is SignalSource.CONDITION and self.condition_type is None:
            raise ValueError(_SIGNAL_RULES[1][1])
        return self


class NodeRemediationSpec(Model):
    node_name: str = Field(
        max_length=MAX_NAME,
        pattern=DNS_SUBDOMAIN_PATTERN,
        json_schema_extra=cel(("self == oldSelf", "nodeName is immutable")),
    )
    policy_ref: ObjectRef
    rule: str = Field(max_length=63, description="Name of the policy rule that matched.")
    signals: list[SignalRecord] = Field(min_length=1, max_length=64)
    ladder: list[Rung] = Field(
        min_length=1,
        max_length=5,
        description="Snapshot of the rule's ladder when the incident opened: editing the "
        "policy later does not change a running incident.",
    )
    dry_run: bool = False


class RequeuedJob(Model):
    job_id: str = Field(max_length=64)
    name: str | None = Field(default=None, max_length=256)
    requeued_at: dt.datetime | None = None


class Ownership(Model):
    """What gpuheal itself did, so it only ever undoes its own work."""

    cordoned: bool = False
    slurm_drained: bool = False


class TimelineEntry(Model):
    time: dt.datetime
    step: str = Field(max_length=64)
    message: str = Field(default="", max_length=MAX_MESSAGE)


class NodeRemediationStatus(Model):
    observed_generation: int | None = Field(default=None, ge=0)
    rung: int = Field(default=0, ge=0, description="Index into spec.ladder being executed.")
    next_step: int = Field(default=0, ge=0, description="Index of the next step in the rung.")
    requeued_jobs: list[RequeuedJob] = Field(default_factory=list, max_length=1024)
    replacement_node: str | None = Field(default=None, max_length=MAX_NAME)
    slot_taken_at: dt.datetime | None = Field(
        default=None,
        description="When the incident took its first disruptive step and began to count "
        "against the policy's maxUnhealthy (also what the rate limit counts).",
    )
    ownership: Ownership = Field(default_factory=Ownership)
    timeline: list[TimelineEntry] = Field(default_factory=list, max_length=200)
    conditions: list[Condition] = conditions_field(
        "One per step (Detected, Cordoned, SlurmDrained, JobsRequeued, Drained, Reset, "
        "Rebooted, ReplacementClaimed, Repaired, Returned), plus Blocked, Failed, Completed."
    )


class NodeRemediation(Model):
    """One incident on one node: what triggered it, the plan, and each step taken."""

    api_version: Literal["gpuheal.io/v1alpha1"] = API_VERSION
    kind: Literal["NodeRemediation"] = "NodeRemediation"
    metadata: ObjectMeta
    spec: NodeRemediationSpec
    status: NodeRemediationStatus = Field(default_factory=NodeRemediationStatus)


CRD = CrdInfo(
    kind="NodeRemediation",
    singular="noderemediation",
    plural="noderemediations",
    short_names=("nrem",),
    spec_model=NodeRemediationSpec,
    status_model=NodeRemediationStatus,
    description=NodeRemediation.__doc__ or "",
    printer_columns=(
        {"name": "Node", "type": "string", "jsonPath": ".spec.nodeName"},
        {"name": "Rule", "type": "string", "jsonPath": ".spec.rule"},
        {"name": "XID", "type": "integer", "jsonPath": ".spec.signals[0].xid"},
        {"name": "Rung", "type": "integer", "jsonPath": ".status.rung"},
        {
            "name": "Completed",
            "type": "string",
            "jsonPath": '.status.conditions[?(@.type=="Completed")].reason',
        },
        {
            "name": "Blocked",
            "type": "string",
            "jsonPath": '.status.conditions[?(@.type=="Blocked")].reason',
        },
        {"name": "Replacement", "type": "string", "jsonPath": ".status.replacementNode"},
        {"name": "DryRun", "type": "boolean", "jsonPath": ".spec.dryRun", "priority": 1},
    ),
)
