"""One GPU out, the node in service: the `quarantineDevice` step's options and what an
incident records of the device it quarantined (a DRA `DeviceTaintRule`, KEP-5055).

Kept apart from the node-level models so that the per-device additions stay in one place.
"""

from __future__ import annotations

import datetime as dt
import enum

from pydantic import Field

from gpuheal.api.meta import DNS_SUBDOMAIN_PATTERN, MAX_MESSAGE, MAX_NAME, Model

NVIDIA_DRA_DRIVER = "gpu.nvidia.com"
"""The driver name of NVIDIA's DRA driver (k8s-dra-driver-gpu), its ResourceSlices' spec.driver."""

DEVICE_TAINT_KEY = "gpuheal.io/xid"
"""The key of the taint gpuheal's DeviceTaintRules put on a device; the value is the XID."""


class DeviceTaintEffect(enum.StrEnum):
    NO_EXECUTE = "NoExecute"  # kube-controller-manager evicts the pods whose claims hold it
    NO_SCHEDULE = "NoSchedule"  # no new claim gets it; running pods keep it


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
