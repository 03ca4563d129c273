"""One GPU out, the node in service: the `quarantineDevice` step's options and what an
incident records of the device it quarantined (a DRA `DeviceTaintRule`, KEP-5055).

Kept apart from the node-level models so that the per-device additions stay in one place.
"""

from __future__ import annotations

import datetime as dt
import enum

from pydantic import ConfigDict, Field, model_validator

from gpuheal.api.meta import (
    DNS_SUBDOMAIN_PATTERN,
    MAX_MESSAGE,
    MAX_NAME,
    Duration,
    DurationRange,
    Model,
    cel,
)
from gpuheal_bridge.api.names import CATCHABLE_SIGNALS

NVIDIA_DRA_DRIVER = "gpu.nvidia.com"
"""The driver name of NVIDIA's DRA driver (k8s-dra-driver-gpu), its ResourceSlices' spec.driver."""

DEVICE_TAINT_KEY = "gpuheal.io/xid"
"""The key of the taint gpuheal's DeviceTaintRules put on a device; the value is the XID."""


class DeviceTaintEffect(enum.StrEnum):
    NO_EXECUTE = "NoExecute"  # kube-controller-manager evicts the pods whose claims hold it
    NO_SCHEDULE = "NoSchedule"  # no new claim gets it; running pods keep it


_GRACE = DurationRange("gracePeriod", "10m", "the Slurm bridge waits at most 10 minutes")


class DeviceSlurmJobs(Model):
    """The Slurm jobs that hold the GPU (its GRES index on the node) are requeued through the
    bridge, the node's other jobs keep running, and the Slurm node stays in service: Slurm
    cannot take one GRES index out of a running node (`scontrol update gres=gpu:7` is
    refused with File= GPUs, and a count names no index), so a site that wants no new job
    on the node's GPUs adds a slurmDrain step (requeue none) to the rung."""

    model_config = ConfigDict(json_schema_extra=cel(_GRACE.cel()))

    requeue: bool = Field(
        default=True,
        description="Requeue the running jobs whose GRES indexes on the node include the "
        "GPU's (the N of its DRA device gpu-N); false: leave Slurm alone.",
    )
    checkpoint_signal: str | None = Field(
        default=None,
        max_length=16,
        pattern=f"^(SIG)?({'|'.join(CATCHABLE_SIGNALS)})$",
        description="Signal sent to those jobs before the requeue so they can checkpoint "
        "(e.g. USR1); none when omitted.",
    )
    grace_period: Duration = Field(
        default="60s", description="How long to wait after the checkpoint signal (at most 10m)."
    )
    exclude_node: bool = Field(
        default=True,
        description="Keep the requeued job off the node (ExcNodeList). Slurm still hands out "
        "the bad GPU's index (it gives the lowest free ones first), so a job back on the "
        "node would likely get the same GPU; false lets it return to the node.",
    )

    @model_validator(mode="after")
    def _mirror_cel(self) -> DeviceSlurmJobs:
        _GRACE.check(self.grace_period)
        return self


class QuarantineDeviceOptions(Model):
    """Take the one GPU the XID names out of service through a DRA DeviceTaintRule; the node
    and its other GPUs stay in service."""

    effect: DeviceTaintEffect = Field(
        default=DeviceTaintEffect.NO_EXECUTE,
        description="NoExecute (default): no new claim is allocated the GPU and kube-"
        "controller-manager evicts the pods whose ResourceClaims hold it (tolerations and "
        "their tolerationSeconds honoured; no PodDisruptionBudget). NoSchedule: no new claim "
        "gets it; running pods keep it.",
    )
    driver: str = Field(
        default=NVIDIA_DRA_DRIVER,
        max_length=MAX_NAME,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="The DRA driver whose ResourceSlice lists the node's GPUs (its devices' "
        "pcieBusID and uuid attributes name them).",
    )
    slurm: DeviceSlurmJobs | None = Field(
        default=None,
        description="Where the node is a Slurm node (a bridge configured): the jobs holding "
        "the GPU are requeued, the others keep running (requeue, no checkpoint signal, node "
        "excluded for the requeued job, when omitted).",
    )

    def slurm_options(self) -> DeviceSlurmJobs:
        return self.slurm or DeviceSlurmJobs()


class QuarantinedDevice(Model):
    """The GPU this incident took out of service, the DeviceTaintRule that does it, and
    when gpuheal lifted it (only after a verified reset of that GPU)."""

    driver: str = Field(max_length=MAX_NAME, description="The DRA driver (slice spec.driver).")
    pool: str = Field(max_length=MAX_NAME, description="The ResourceSlice pool (the node's).")
    device: str = Field(max_length=MAX_NAME, description="The device's name (e.g. gpu-3).")
    pci_bus_id: str | None = Field(
        default=None, max_length=32, description="Its PCI address, as the XID named it."
    )
    gpu_uuid: str | None = Field(default=None, max_length=64, description="Its UUID.")
    rule: str = Field(
        max_length=MAX_NAME, description="The DeviceTaintRule gpuheal wrote (it removes only it)."
    )
    effect: DeviceTaintEffect = Field(description="The taint's effect.")
    tainted_at: dt.datetime = Field(description="When gpuheal wrote the rule.")
    released_at: dt.datetime | None = Field(
        default=None, description="When gpuheal deleted the rule after a verified reset."
    )
    message: str = Field(default="", max_length=MAX_MESSAGE, description="What was seen last.")
    slurm_gpu_index: int | None = Field(
        default=None, ge=0, description="The GPU's Slurm GRES index on the node (gpu-N: N)."
    )
    requeued_jobs: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="The Slurm jobs that held the GPU, requeued by gpuheal.",
    )
    slurm: str | None = Field(
        default=None,
        max_length=MAX_MESSAGE,
        description="What Slurm was told (absent: not asked yet).",
    )
