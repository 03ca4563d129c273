"""FaultHistory: one node's memory of GPU faults, kept in the API (not in the operator).

One object per node (named after it), written by gpuheal only: every signal it saw, every
incident it opened, every step it took and how each incident ended, plus one record per GPU
(UUID, serial where a source names it, PCI address as the fallback). Escalation windows read
it, so a restart or an upgrade of the operator forgets nothing; `gpuheal history` and
`kubectl get faulthistories` list the repeat offenders.

Bounded on purpose: entries older than the retention of the node's policy
(`spec.history.retention`, 30 days by default) are dropped at every write, and the schema
caps the lists, so an object cannot grow without limit (etcd's 1.5 MiB per object).
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Literal

from pydantic import ConfigDict, Field

from gpuheal.api.meta import (
    MAX_NAME,
    Condition,
    CrdInfo,
    Duration,
    ImmutableNodeName,
    Model,
    Resource,
    Status,
    cel,
    column,
    conditions_field,
)
from gpuheal.xid.types import RecoveryAction

MAX_ENTRIES = 512
"""Entries kept per node (the oldest go first when a write would exceed it)."""
MAX_GPUS = 64
MAX_ENTRY_MESSAGE = 256


class EntryKind(enum.StrEnum):
    SIGNAL = "Signal"  # a fault signal seen on the node (XID, Event, condition)
    INCIDENT = "Incident"  # an incident opened (or climbed a rung)
    ACTION = "Action"  # a step an incident took (cordon, reboot, check...)
    OUTCOME = "Outcome"  # how an incident ended (Returned, Replaced, Retired, Failed...)


_ENTRY_RULES = (
    ("self.kind != 'Action' || has(self.action)", "an Action entry names its action"),
    ("self.kind != 'Outcome' || has(self.outcome)", "an Outcome entry names its outcome"),
    (
        "self.kind == 'Signal' || has(self.incident)",
        "Incident, Action and Outcome entries name their incident",
    ),
)


class HistoryEntry(Model):
    """One thing that happened on the node, in time order."""

    model_config = ConfigDict(json_schema_extra=cel(*_ENTRY_RULES))

    time: dt.datetime = Field(description="When it happened (a signal: when it was observed).")
    kind: EntryKind = Field(description="Signal, Incident, Action or Outcome.")
    incident: str | None = Field(
        default=None,
        max_length=MAX_NAME,
        description="The NodeRemediation it belongs to (a signal: the incident it opened or "
        "was attached to, if any).",
    )
    source: str | None = Field(
        default=None,
        max_length=32,
        description="Signals: where it came from (events, conditions, dcgm).",
    )
    xid: int | None = Field(default=None, ge=1, le=65535, description="Signals: the XID.")
    gpu: str | None = Field(
        default=None,
        max_length=64,
        description="Signals: the GPU as repeat counting keys it on this node (its PCI "
        "address; its UUID when nothing else is known).",
    )
    gpu_uuid: str | None = Field(
        default=None,
        max_length=64,
        description="Signals: the GPU's UUID, where a source (or the node's GPU map) named it; "
        "a GPU moved to another node is found by it.",
    )
    recovery_action: RecoveryAction | None = Field(
        default=None, description="Signals, XID 154: the recovery action the driver stated."
    )
    event_reason: str | None = Field(
        default=None, max_length=128, description="Signals from Events: the Event's reason."
    )
    event_uid: str | None = Field(
        default=None,
        max_length=64,
        description="Signals from Events: the Event's UID (a replay is the same signal).",
    )
    condition_type: str | None = Field(
        default=None, max_length=316, description="Signals from conditions: the type."
    )
    condition_status: str | None = Field(
        default=None, max_length=16, description="Signals from conditions: the bad status."
    )
    key: str | None = Field(
        default=None,
        max_length=256,
        description="Signals: gpuheal's dedupe key (the same signal seen again has it).",
    )
    reporter: str | None = Field(
        default=None,
        max_length=128,
        description="Signals: who reported it (two reporters of one fault count once).",
    )
    rule: str | None = Field(
        default=None, max_length=63, description="Incidents: the policy rule that matched."
    )
    rung: int | None = Field(
        default=None, ge=0, le=16, description="Incidents and Actions: the ladder rung."
    )
    action: str | None = Field(
        default=None,
        max_length=32,
        description="Actions: the step (cordon, slurmDrain, drain, reset, reboot, replace, "
        "retire, check).",
    )
    outcome: str | None = Field(
        default=None,
        max_length=32,
        description="Outcomes: Returned, ReturnedToPool, ReturnedInKubernetesOnly, Replaced, "
        "Retired, Failed, Remediated, NothingToUndo, DryRun.",
    )
    message: str = Field(
        default="",
        max_length=MAX_ENTRY_MESSAGE,
        description="A few words for people (shortened to 256 characters).",
    )


class GpuRecord(Model):
    """One GPU of the node and its faults within the retention."""

    id: str = Field(
        max_length=64,
        description="The GPU's key: its UUID when a source named it, else its serial, else "
        "its PCI address.",
    )
    uuid: str | None = Field(default=None, max_length=64, description="GPU UUID (GPU-...).")
    serial: str | None = Field(
        default=None,
        max_length=64,
        description="Board serial number, where a source gives it (NVML does; the kernel log "
        "and dcgm-exporter's XID metrics do not).",
    )
    pci_bus_id: str | None = Field(
        default=None, max_length=32, description="PCI address (e.g. 0000:3b:00)."
    )
    faults: int = Field(default=0, ge=0, description="Fault signals within the retention.")
    first_fault_at: dt.datetime | None = Field(
        default=None, description="The oldest fault still within the retention."
    )
    last_fault_at: dt.datetime | None = Field(default=None, description="The newest fault.")
    last_xid: int | None = Field(default=None, ge=1, le=65535, description="The newest XID.")
    xids: list[int] = Field(
        default_factory=list,
        max_length=16,
        description="Distinct XIDs within the retention, newest first.",
    )


class FaultHistorySpec(Model):
    """Which node this history is about."""

    node_name: ImmutableNodeName = Field(
        description="The Node (immutable; the object is named after it)."
    )


class FaultHistoryStatus(Status):
    """The record (written by gpuheal only): entries in time order and one line per GPU."""

    retention: Duration | None = Field(
        default=None,
        description="The retention applied at the last write (the node's policy's "
        "spec.history.retention): older entries were dropped.",
    )
    faults: int = Field(default=0, ge=0, description="Fault signals within the retention.")
    incidents: int = Field(default=0, ge=0, description="Incidents within the retention.")
    last_fault_at: dt.datetime | None = Field(default=None, description="The newest fault.")
    last_outcome: str | None = Field(
        default=None, max_length=32, description="How the newest finished incident ended."
    )
    worst_gpu: str | None = Field(
        default=None, max_length=64, description="The GPU with the most faults (its id)."
    )
    worst_gpu_faults: int = Field(default=0, ge=0, description="Faults of that GPU.")
    summary: str = Field(
        default="",
        max_length=MAX_ENTRY_MESSAGE,
        description="One line for people, e.g. '3 x XID 94 on GPU-8f6c... in 30d'.",
    )
    gpus: list[GpuRecord] = Field(
        default_factory=list,
        max_length=MAX_GPUS,
        description="One record per GPU that had a fault within the retention.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["id"]},
    )
    entries: list[HistoryEntry] = Field(
        default_factory=list,
        max_length=MAX_ENTRIES,
        description="What happened, oldest first, within the retention (at most 512).",
    )
    conditions: list[Condition] = conditions_field(
        "RepeatOffender: a GPU of the node had more than one fault within the retention."
    )


class FaultHistory(Resource[FaultHistorySpec, FaultHistoryStatus]):
    """One node's GPU faults, incidents, actions and outcomes, kept for the policy's
    retention: what escalation windows and repeat-offender lists read."""

    kind: Literal["FaultHistory"] = Field(default="FaultHistory", description="FaultHistory")


CRD = CrdInfo.of(
    FaultHistory,
    ("fh",),
    column("Faults", "integer", ".status.faults"),
    column("Incidents", "integer", ".status.incidents"),
    column("Worst-GPU", "string", ".status.worstGpu"),
    column("GPU-Faults", "integer", ".status.worstGpuFaults"),
    column("Last-Fault", "date", ".status.lastFaultAt"),
    column("Last-Outcome", "string", ".status.lastOutcome"),
    column("Summary", "string", ".status.summary", priority=1),
)
