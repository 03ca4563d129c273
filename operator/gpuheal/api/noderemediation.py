"""NodeRemediation: one incident on one node, and the record of every step taken."""

from __future__ import annotations

import datetime as dt
import enum
from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from gpuheal.api.devicequarantine import QuarantinedDevice
from gpuheal.api.meta import (
    MAX_MESSAGE,
    MAX_NAME,
    Condition,
    CrdInfo,
    DnsLabel,
    ImmutableNodeName,
    Model,
    ObjectRef,
    Resource,
    Status,
    cel,
    column,
    condition_column,
    conditions_field,
    list_of,
)
from gpuheal.api.names import JobOutcome, JobReason, NremCondition
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

    source: SignalSource = Field(
        description="Where the signal came from: KernelLog, Event, Condition, DcgmExporter "
        "or Manual."
    )
    observed_at: dt.datetime = Field(description="When the signal was observed.")
    xid: int | None = Field(
        default=None, ge=1, le=65535, description="The NVIDIA XID code, for XID signals."
    )
    pci_bus_id: str | None = Field(
        default=None, max_length=32, description="PCI bus id of the GPU (e.g. 0000:3b:00)."
    )
    gpu_uuid: str | None = Field(
        default=None, max_length=64, description="UUID of the GPU, when the source names it."
    )
    recovery_action: RecoveryAction | None = Field(
        default=None, description="For XID 154: the recovery action the driver stated."
    )
    condition_type: str | None = Field(
        default=None, max_length=316, description="For Condition signals: the condition type."
    )
    condition_status: str | None = Field(
        default=None,
        max_length=16,
        description="For Condition signals: the status the condition held (True when absent).",
    )
    event_reason: str | None = Field(
        default=None, max_length=128, description="For Event signals: the Event's reason."
    )
    event_uid: str | None = Field(
        default=None,
        max_length=64,
        description="UID of the Event, so that a replayed Event is recognised and not "
        "counted twice.",
    )
    message: str = Field(
        default="", max_length=MAX_MESSAGE, description="The signal's text (e.g. the XID line)."
    )

    @model_validator(mode="after")
    def _mirror_cel(self) -> SignalRecord:
        sources_with_xid = {SignalSource.KERNEL_LOG, SignalSource.DCGM_EXPORTER}
        if self.source in sources_with_xid and self.xid is None:
            raise ValueError(_SIGNAL_RULES[0][1])
        if self.source is SignalSource.CONDITION and self.condition_type is None:
            raise ValueError(_SIGNAL_RULES[1][1])
        return self


class NodeRemediationSpec(Model):
    """The incident: which node, which policy and rule, the signals, and the plan."""

    node_name: ImmutableNodeName = Field(description="The Node this incident is about (immutable).")
    policy_ref: ObjectRef = Field(description="The RemediationPolicy that opened the incident.")
    rule: DnsLabel = Field(description="Name of the policy rule that matched.")
    signals: list[SignalRecord] = Field(
        min_length=1,
        max_length=64,
        description="The signals that opened the incident and any that escalated it.",
    )
    ladder: list[Rung] = Field(
        min_length=1,
        max_length=5,
        description="Snapshot of the rule's ladder when the incident opened: editing the "
        "policy later does not change a running incident.",
    )
    dry_run: bool = Field(
        default=False,
        description="Opened under a dry-run policy: the plan is recorded, nothing is changed.",
    )


class RequeuedJob(Model):
    """A Slurm job that gpuheal requeued for this incident."""

    job_id: str = Field(max_length=64, description="The Slurm job id.")
    name: str | None = Field(default=None, max_length=256, description="The Slurm job name.")
    requeued_at: dt.datetime | None = Field(default=None, description="When it was requeued.")


class CheckpointedJob(Model):
    """A Slurm job this incident asked to checkpoint now (a checkpoint step): signalled
    once, not requeued."""

    job_id: str = Field(max_length=64, description="The Slurm job id.")
    signal: str = Field(max_length=16, description="The signal sent (e.g. USR1).")
    signalled_at: dt.datetime | None = Field(
        default=None, description="When Slurm accepted the signal (the bridge's clock)."
    )


class JobRecord(Model):
    """A Slurm job of the faulty node: what gpuheal did with it, and why."""

    job_id: str = Field(max_length=64, description="The Slurm job id.")
    name: str | None = Field(default=None, max_length=256, description="The Slurm job name.")
    user: str | None = Field(default=None, max_length=128, description="Its owner.")
    state: str = Field(
        default="", max_length=32, description="Its Slurm state when gpuheal looked at it."
    )
    outcome: JobOutcome = Field(
        description="Planned (decided, not done yet), Requeued, RequeuedHeld, LeftAlone, "
        "Failed (Slurm or the bridge refused; see message)."
    )
    reason: JobReason = Field(description="Why (one CamelCase word).")
    message: str = Field(default="", max_length=MAX_MESSAGE, description="What happened.")
    at: dt.datetime | None = Field(default=None, description="When the outcome was recorded.")
    nodes_after: list[str] = list_of(64, "Where it runs after the requeue, when it already runs.")
    release_node: bool = Field(
        default=False,
        description="It named the node in its --nodelist: gpuheal drops the node from that "
        "list (pinnedJobs: ReleaseNode) so the job can run elsewhere.",
    )
    node_down: bool = Field(
        default=False,
        description="gpuheal set the Slurm node DOWN to release it: at once where its GPU is "
        "lost (slurmDrain.nodeDown), or because it still held the node past KillWait + "
        "stuckJobTimeout.",
    )
    still_on_node: bool = Field(
        default=False,
        description="Slurm accepted the requeue but the job still held the node when the "
        "bridge last looked (its processes outlived SIGKILL and the node was not set DOWN: "
        "onStuckJob is Report, or setting it DOWN failed): it runs again only once Slurm "
        "releases it.",
    )


class Ownership(Model):
    """What gpuheal itself did, so it only ever undoes its own work."""

    cordoned: bool = Field(
        default=False,
        description="gpuheal cordoned the node (so it may uncordon it on return to service).",
    )
    slurm_drained: bool = Field(
        default=False,
        description="gpuheal drained the Slurm node (so it may resume it on return to service).",
    )


class RepairRecord(Model):
    """A reset or reboot this incident asked for, and how gpuheal knows it happened: never
    from a hook's exit code or 2xx alone, but from the node (boot ID, Slurm's boot time, the
    GPUs allocatable again)."""

    action: str = Field(max_length=16, description="reset or reboot.")
    rung: int = Field(ge=0, le=16, description="The rung it belongs to (a later rung repeats it).")
    via: str = Field(max_length=16, description="Noop, Job, Webhook or Slurm.")
    requested_at: dt.datetime = Field(description="When gpuheal asked for it.")
    boot_id_before: str | None = Field(
        default=None,
        max_length=64,
        description="node.status.nodeInfo.bootID when it was asked for, recorded before the "
        "hook runs: a reboot is verified only when the node reports another.",
    )
    gpus_before: dict[str, str] = Field(
        default_factory=dict,
        max_length=256,
        description="A reset: the node's GPUs (PCI address -> UUID, from gpuheal agent's "
        "gpuheal.io/gpus) when it was asked for: after it, the agent must report them again.",
    )
    power_cycle: bool = Field(
        default=False,
        description="A reboot for which the hook was asked for a cold power cycle (the "
        "request's powerCycle); the proof is the same new boot ID.",
    )
    slurm_boot_time_before: str | None = Field(
        default=None,
        max_length=32,
        description="Slurm's BootTime of the node when it was asked for (Slurm reboots).",
    )
    hook_done_at: dt.datetime | None = Field(
        default=None, description="When the hook reported success (then verification)."
    )
    verified_at: dt.datetime | None = Field(
        default=None, description="When gpuheal saw that it happened."
    )
    failed_at: dt.datetime | None = Field(
        default=None, description="When it failed (the ladder climbs from here)."
    )
    message: str = Field(default="", max_length=MAX_MESSAGE, description="What was seen.")


class VerificationRecord(Model):
    """The check a repaired node must pass before it returns (returnToService.check)."""

    rung: int = Field(ge=0, le=16, description="The rung whose repair it verifies.")
    attempt: int = Field(default=1, ge=1, le=1000, description="1 for the first run.")
    started_at: dt.datetime = Field(description="When the check started.")
    passed_at: dt.datetime | None = Field(default=None, description="When it passed.")
    failed_at: dt.datetime | None = Field(default=None, description="When it failed.")
    message: str = Field(default="", max_length=MAX_MESSAGE, description="The verdict.")


class TimelineEntry(Model):
    """One event of the incident's story, in order."""

    time: dt.datetime = Field(description="When it happened.")
    step: str = Field(max_length=64, description="The step or event (e.g. Cordoned, Blocked).")
    message: str = Field(default="", max_length=MAX_MESSAGE, description="What happened.")


class NodeRemediationStatus(Status):
    """Progress of the incident (written by gpuheal only)."""

    rung: int = Field(default=0, ge=0, description="Index into spec.ladder being executed.")
    next_step: int = Field(default=0, ge=0, description="Index of the next step in the rung.")
    requeued_jobs: list[RequeuedJob] = list_of(1024, "Slurm jobs requeued by this incident.")
    checkpointed_jobs: list[CheckpointedJob] = list_of(
        256, "Slurm jobs a checkpoint step signalled (each once), left running on the node."
    )
    jobs: list[JobRecord] = list_of(
        256,
        "Every Slurm job of the node at the fault (running, or ended there within the "
        "policy's failedJobsWindow), with what gpuheal did and why.",
    )
    replacement_node: str | None = Field(
        default=None,
        max_length=MAX_NAME,
        description="The spare node claimed from a ReservePool in place of this one.",
    )
    slot_taken_at: dt.datetime | None = Field(
        default=None,
        description="When the incident took its first disruptive step and began to count "
        "against the policy's maxUnhealthy (also what the rate limit counts).",
    )
    ownership: Ownership = Field(
        default_factory=Ownership,
        description="What gpuheal itself did, so it only ever undoes its own work.",
    )
    why: str = Field(
        default="",
        max_length=256,
        description="Why the incident opened or last climbed a rung, from the node's fault "
        "history (e.g. '3rd XID 94 on GPU GPU-8f6c... in 7d').",
    )
    repair: RepairRecord | None = Field(
        default=None, description="The reset or reboot of the current rung, and its proof."
    )
    quarantined_device: QuarantinedDevice | None = Field(
        default=None,
        description="The one GPU a quarantineDevice step took out through a DRA "
        "DeviceTaintRule (the node stays in service), and when the rule was lifted.",
    )
    verification: VerificationRecord | None = Field(
        default=None, description="The check before return to service (the current rung's)."
    )
    returned_to: str | None = Field(
        default=None,
        max_length=MAX_NAME + 16,
        description="Where the node went at the end: Service, or ReservePool/<name>.",
    )
    timeline: list[TimelineEntry] = list_of(
        200, "The incident's story in order (the conditions, as a list of events)."
    )
    conditions: list[Condition] = conditions_field(
        "One per step (Detected, Cordoned, SlurmDrained, JobsRequeued, DeviceQuarantined, "
        "Drained, Reset, "
        "Rebooted, ReplacementClaimed, Retired, Verified, Repaired, Returned), plus Blocked, "
        "Failed, Completed."
    )


class NodeRemediation(Resource[NodeRemediationSpec, NodeRemediationStatus]):
    """One incident on one node: what triggered it, the plan, and each step taken."""

    kind: Literal["NodeRemediation"] = Field(
        default="NodeRemediation", description="NodeRemediation"
    )


CRD = CrdInfo.of(
    NodeRemediation,
    ("nrem",),
    column("Node", "string", ".spec.nodeName"),
    column("Rule", "string", ".spec.rule"),
    column("XID", "integer", ".spec.signals[0].xid"),
    column("Rung", "integer", ".status.rung"),
    condition_column("Completed", "Completed", "reason"),
    condition_column("Blocked", "Blocked", "reason"),
    column("Replacement", "string", ".status.replacementNode"),
    column("Why", "string", ".status.why"),
    column("DryRun", "boolean", ".spec.dryRun", priority=1),
)
